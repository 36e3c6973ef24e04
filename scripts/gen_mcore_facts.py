"""Generate ``server/mbridge_perf/config/mcore_facts.json``: what each supported Megatron-Core
release defaults and accepts, read from its wheel with ``ast`` (never imported, never copied).

Per release it records, for the ``TransformerConfig`` / ``MLATransformerConfig`` /
``ModelParallelConfig`` fields this project models:

* ``defaults``: the literal default of each field (``None`` included);
* ``choices``: the values of a ``Literal[...]`` annotation;

and, from the config code itself:

* ``recompute_modules``: the labels ``__post_init__`` allows (the ``allowed_modules`` set);
* ``cuda_graph_modules``: the members of ``CudaGraphModule`` (``CudaGraphScope`` before it);
* ``cuda_graph_deprecated_modules``: deprecated ``cuda_graph_modules`` spellings;
* ``fields``: whether the release has ``cuda_graph_modules`` at all.

Only facts (names and literal values) are written. Run from the repository root::

    .venv/bin/python scripts/gen_mcore_facts.py           # download the wheels, write the JSON
    .venv/bin/python scripts/gen_mcore_facts.py --check   # exit 1 if the JSON is stale
    .venv/bin/python scripts/gen_mcore_facts.py --wheel-dir DIR   # wheels already downloaded
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "server" / "mbridge_perf" / "config" / "mcore_facts.json"
RELEASES = ("0.16.1", "0.19.2")
CONFIG_FILES = {
    "megatron/core/transformer/transformer_config.py": ("TransformerConfig",
                                                         "MLATransformerConfig"),
    "megatron/core/model_parallel_config.py": ("ModelParallelConfig",),
}
ENUMS = "megatron/core/transformer/enums.py"
GRAPH_CONFIG = "megatron/core/transformer/cuda_graph_config.py"


def _modelled_fields() -> set[str]:
    sys.path.insert(0, str(REPO / "server"))
    from mbridge_perf.config.model import ModelSection

    return set(ModelSection.model_fields)


def _literal(node: ast.expr | None) -> tuple[bool, Any]:
    if node is None:
        return False, None
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _choices(ann: ast.expr) -> list[Any] | None:
    """Values of the first ``Literal[...]`` inside an annotation (Optional / Union included)."""
    for node in ast.walk(ann):
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", getattr(
                node.value, "attr", None)) == "Literal":
            ok, value = _literal(node.slice)
            if ok:
                return list(value) if isinstance(value, tuple) else [value]
    return None


def _class_fields(tree: ast.Module, names: tuple[str, ...], wanted: set[str]
                  ) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    defaults: dict[str, Any] = {}
    choices: dict[str, list[Any]] = {}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names}
    for cls in (classes[n] for n in names if n in classes):  # the first class named wins
        for stmt in cls.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            if name not in wanted or name in defaults or name in choices:
                continue
            ok, value = _literal(stmt.value)
            if ok:
                defaults[name] = value
            found = _choices(stmt.annotation)
            if found is not None:
                choices[name] = found
    return defaults, choices


def _allowed_recompute(tree: ast.Module) -> list[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "allowed_modules" for t in node.targets):
            ok, value = _literal(node.value)
            if ok and "layernorm" in value:  # the recompute set, not the offload one
                return sorted(value)
    raise SystemExit("recompute allowed_modules set not found in transformer_config.py")


def _enum_members(tree: ast.Module, name: str) -> list[str]:
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name):
        return [t.id for s in cls.body if isinstance(s, ast.Assign) for t in s.targets
                if isinstance(t, ast.Name)]
    return []


def _deprecated_modules(tree: ast.Module | None) -> list[str]:
    if tree is None:
        return []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) ==
                                                "CUDA_GRAPH_MODULES_DEPRECATIONS"
                                                for t in node.targets):
            return sorted(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return []


def release_facts(wheel: Path, wanted: set[str]) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())

        def tree(path: str) -> ast.Module | None:
            return ast.parse(zf.read(path).decode()) if path in names else None

        defaults: dict[str, Any] = {}
        choices: dict[str, list[Any]] = {}
        for path, classes in CONFIG_FILES.items():
            d, c = _class_fields(tree(path), classes, wanted)
            defaults |= {k: v for k, v in d.items() if k not in defaults}
            choices |= {k: v for k, v in c.items() if k not in choices}
        enums = tree(ENUMS)
        members = _enum_members(enums, "CudaGraphModule") or _enum_members(enums,
                                                                            "CudaGraphScope")
        return {
            "defaults": dict(sorted(defaults.items())),
            "choices": dict(sorted(choices.items())),
            "recompute_modules": _allowed_recompute(tree(next(iter(CONFIG_FILES)))),
            "cuda_graph_modules": [m for m in members if m != "full_iteration"],
            "cuda_graph_deprecated_modules": _deprecated_modules(tree(GRAPH_CONFIG)),
            "has_cuda_graph_modules_field": "cuda_graph_modules" in _class_fields(
                tree(next(iter(CONFIG_FILES))), ("TransformerConfig",),
                {"cuda_graph_modules"})[0],
        }


def download(dest: Path) -> dict[str, Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "-d", str(dest),
           *[f"megatron-core=={v}" for v in RELEASES]]
    subprocess.run(cmd, check=True)
    return find(dest)


def find(folder: Path) -> dict[str, Path]:
    out = {}
    for v in RELEASES:
        hits = sorted(folder.glob(f"megatron_core-{v}-*.whl"))
        if not hits:
            raise SystemExit(f"no megatron_core-{v} wheel in {folder}")
        out[v] = hits[0]
    return out


def generate(wheels: dict[str, Path]) -> str:
    wanted = _modelled_fields()
    data = {"generated_by": "scripts/gen_mcore_facts.py",
            "releases": {v: release_facts(w, wanted) for v, w in wheels.items()}}
    return json.dumps(data, indent=1, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--wheel-dir", type=Path)
    args = parser.parse_args(argv)
    if args.wheel_dir:
        text = generate(find(args.wheel_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="mcore-facts-") as tmp:
            text = generate(download(Path(tmp)))
    if args.check:
        stale = not OUTPUT.exists() or OUTPUT.read_text() != text
        print(f"{OUTPUT.relative_to(REPO)} is {'stale' if stale else 'up to date'}")
        return int(stale)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
