"""Generate ``server/mbridge_perf/config/known_fields.json``: every field name each Megatron
Bridge ``ConfigContainer`` section accepts, read from the real packages.

Two sources, unioned per section:

* the Megatron-Core installed in this environment (imported; ``dataclasses.fields()``);
* pinned newer wheels (Megatron-Core and Megatron Bridge, which need Python >= 3.12), fetched
  with ``pip download`` into a temporary directory and read with ``ast`` -- never imported,
  never copied into the repository.

A section's accepted names are the dataclass fields (``InitVar`` pseudo-fields included,
``ClassVar`` excluded) of every class its ``ConfigContainer`` annotation names, of every
subclass of those, and -- for ``model`` -- of every model provider class in Megatron Bridge.
Only field names are written.

Run from the repository root::

    .venv/bin/python scripts/gen_known_fields.py           # regenerate the JSON
    .venv/bin/python scripts/gen_known_fields.py --check   # exit 1 if the JSON is stale

Both need network access to PyPI (unless ``--wheel-dir`` holds the pinned wheels).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.metadata
import inspect
import json
import subprocess
import sys
import tempfile
import warnings
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "server" / "mbridge_perf" / "config" / "known_fields.json"
GENERATED_BY = "scripts/gen_known_fields.py"

MCORE_NEW = "0.19.2"
BRIDGE = "0.6.2"
WHEEL_PYTHON = "3.12"
WHEELS = {"megatron-core": MCORE_NEW, "megatron-bridge": BRIDGE}

ClassKey = tuple[str, str]  # (module, class name)

CONTAINER: ClassKey = ("megatron.bridge.training.config", "ConfigContainer")
TRANSFORMER_CONFIG: ClassKey = ("megatron.core.transformer.transformer_config", "TransformerConfig")
PROVIDER_MIXIN: ClassKey = ("megatron.bridge.models.model_provider", "ModelProviderMixin")

# Megatron-Core dataclasses read from both Megatron-Core versions, per section.
MCORE_CLASSES: dict[str, tuple[ClassKey, ...]] = {
    "model": (
        TRANSFORMER_CONFIG,
        ("megatron.core.transformer.transformer_config", "MLATransformerConfig"),
        ("megatron.core.model_parallel_config", "ModelParallelConfig"),
    ),
    "optimizer": (("megatron.core.optimizer.optimizer_config", "OptimizerConfig"),),
    "ddp": (
        (
            "megatron.core.distributed.distributed_data_parallel_config",
            "DistributedDataParallelConfig",
        ),
    ),
}

# Bases from outside the parsed packages that contribute no dataclass fields.
PLAIN_BASES = frozenset(
    {"ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol", "typing.Protocol", "object"}
)

# Sections this project models come first in the JSON; the rest follow ConfigContainer order.
MODELLED = ("model", "train", "optimizer", "ddp", "mixed_precision", "comm_overlap")


# ---------------------------------------------------------------- source index (ast) ----


@dataclasses.dataclass
class ClassInfo:
    """One top-level class found in the parsed sources."""

    key: ClassKey
    bases: list[ast.expr]
    scope: dict[str, tuple[str, ...]]  # module namespace when the class was defined
    is_dataclass: bool
    fields: dict[str, ast.expr]  # own fields -> annotation; InitVar in, ClassVar out
    initvars: list[str]


@dataclasses.dataclass
class ModuleInfo:
    """Top-level names a module binds (imports, classes, simple aliases)."""

    name: str
    is_package: bool
    names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    star: list[str] = dataclasses.field(default_factory=list)


def _ann_head(node: ast.expr) -> str:
    """The leading dotted name of an annotation (``ClassVar[int]`` -> ``ClassVar``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            node = ast.parse(node.value, mode="eval").body
        except SyntaxError:
            return ""
    if isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_dataclass_decorator(node: ast.expr) -> bool:
    """True for ``@dataclass``, ``@dataclass(...)``, ``@dataclasses.dataclass(...)``."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Name) and node.id == "dataclass") or (
        isinstance(node, ast.Attribute) and node.attr == "dataclass"
    )


def _own_fields(cls: ast.ClassDef) -> tuple[dict[str, ast.expr], list[str]]:
    """Annotated class-level names that a dataclass turns into (pseudo-)fields."""
    names: dict[str, ast.expr] = {}
    initvars: list[str] = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        head = _ann_head(stmt.annotation)
        if head in ("ClassVar", "KW_ONLY"):
            continue
        names[stmt.target.id] = stmt.annotation
        if head == "InitVar":
            initvars.append(stmt.target.id)
    return names, initvars


class SourceIndex:
    """Classes and import bindings of a set of Python packages, read with ``ast`` only."""

    def __init__(self) -> None:
        self.modules: dict[str, ModuleInfo] = {}
        self.classes: dict[ClassKey, ClassInfo] = {}
        self._parents: dict[ClassKey, list[ClassKey]] = {}
        self.unresolved: dict[ClassKey, list[str]] = {}

    # -- loading

    def add_source(self, relpath: str, text: str) -> None:
        """Index one ``.py`` file given its path inside a wheel or site-packages."""
        parts = relpath[: -len(".py")].split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts = parts[:-1]
        module = ModuleInfo(".".join(parts), is_package)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        self.modules[module.name] = module
        self._walk(module, tree.body, overwrite=True)

    def add_wheel(self, wheel: Path, prefix: str = "megatron/") -> None:
        """Index every ``.py`` file under ``prefix`` in a wheel (read from the zip)."""
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(prefix) and name.endswith(".py"):
                    self.add_source(name, zf.read(name).decode("utf-8", "replace"))

    def add_tree(self, root: Path, package: str) -> None:
        """Index every ``.py`` file of an installed package directory ``root/package``."""
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            self.add_source(rel, path.read_text(encoding="utf-8", errors="replace"))

    def _absolute(self, module: ModuleInfo, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = module.name.split(".")
        drop = node.level - 1 if module.is_package else node.level
        base = base[: len(base) - drop] if drop else base
        return ".".join([*base, *([node.module] if node.module else [])])

    def _walk(self, module: ModuleInfo, body: list[ast.stmt], overwrite: bool) -> None:
        names = module.names

        def bind(name: str, value: tuple[str, ...]) -> None:
            if overwrite or name not in names:
                names[name] = value

        for stmt in body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.asname:
                        bind(alias.asname, ("module", alias.name))
                    else:
                        head = alias.name.split(".")[0]
                        bind(head, ("module", head))
            elif isinstance(stmt, ast.ImportFrom):
                source = self._absolute(module, stmt)
                for alias in stmt.names:
                    if alias.name == "*":
                        module.star.append(source)
                    else:
                        bind(alias.asname or alias.name, ("from", source, alias.name))
            elif isinstance(stmt, ast.ClassDef):
                key = (module.name, stmt.name)
                bind(stmt.name, ("class", *key))
                fields, initvars = _own_fields(stmt)
                self.classes[key] = ClassInfo(
                    key=key,
                    bases=list(stmt.bases),
                    scope=dict(names),
                    is_dataclass=any(_is_dataclass_decorator(d) for d in stmt.decorator_list),
                    fields=fields,
                    initvars=initvars,
                )
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                target = stmt.targets[0]
                if isinstance(target, ast.Name) and isinstance(
                    stmt.value, ast.Name | ast.Attribute
                ):
                    bind(target.id, ("alias", ast.unparse(stmt.value)))
            elif isinstance(stmt, ast.If):
                self._walk(module, stmt.body, overwrite)
                self._walk(module, stmt.orelse, overwrite=False)
            elif isinstance(stmt, ast.Try):
                self._walk(module, stmt.body, overwrite)
                for handler in stmt.handlers:
                    self._walk(module, handler.body, overwrite=False)
                self._walk(module, stmt.orelse, overwrite)

    # -- name resolution

    def _lookup(self, module: str, name: str, depth: int = 0) -> tuple[str, ...] | None:
        """What ``module.name`` refers to: ("class", mod, cls) or ("module", mod)."""
        if depth > 50:
            return None
        if f"{module}.{name}" in self.modules:
            return ("module", f"{module}.{name}")
        info = self.modules.get(module)
        if info is None:
            return None
        binding = info.names.get(name)
        if binding is not None:
            return self._follow(binding, info.names, module, depth + 1)
        for star in info.star:
            found = self._lookup(star, name, depth + 1)
            if found is not None:
                return found
        return None

    def _follow(
        self, binding: tuple[str, ...], scope: dict[str, tuple[str, ...]], module: str, depth: int
    ) -> tuple[str, ...] | None:
        kind = binding[0]
        if kind in ("class", "module"):
            return binding
        if kind == "from":
            return self._lookup(binding[1], binding[2], depth)
        if kind == "alias":
            expr = ast.parse(binding[1], mode="eval").body
            return self._resolve_expr(expr, scope, module, depth)
        return None

    def _resolve_expr(
        self, node: ast.expr, scope: dict[str, tuple[str, ...]], module: str, depth: int = 0
    ) -> tuple[str, ...] | None:
        if depth > 50:
            return None
        if isinstance(node, ast.Subscript):  # Generic[T], ModelProviderMixin[GPTModel]
            return self._resolve_expr(node.value, scope, module, depth + 1)
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
            return self._resolve_expr(node, scope, module, depth + 1)
        if isinstance(node, ast.Name):
            binding = scope.get(node.id)
            if binding is None:
                return self._lookup(module, node.id, depth + 1)
            return self._follow(binding, scope, module, depth + 1)
        if isinstance(node, ast.Attribute):
            owner = self._resolve_expr(node.value, scope, module, depth + 1)
            if owner and owner[0] == "module":
                return self._lookup(owner[1], node.attr, depth + 1)
        return None

    def resolve(self, node: ast.expr, info: ClassInfo) -> ClassKey | None:
        """The indexed class an expression (a base or annotation part) names, if any."""
        found = self._resolve_expr(node, info.scope, info.key[0])
        if found and found[0] == "class":
            key = (found[1], found[2])
            return key if key in self.classes else None
        return None

    def annotation_classes(self, node: ast.expr, info: ClassInfo) -> list[ClassKey]:
        """Every indexed class named anywhere in an annotation (unions, Optional, ...)."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return []
        out: list[ClassKey] = []
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name | ast.Attribute | ast.Constant):
                key = self.resolve(sub, info)
                if key is not None and key not in out:
                    out.append(key)
        return out

    # -- class graph

    def parents(self, key: ClassKey) -> list[ClassKey]:
        """Direct base classes that are in the index (others recorded as unresolved)."""
        if key not in self._parents:
            info = self.classes[key]
            found: list[ClassKey] = []
            for base in info.bases:
                parent = self.resolve(base, info)
                if parent is not None:
                    found.append(parent)
                elif (text := ast.unparse(base)).split("[")[0] not in PLAIN_BASES:
                    self.unresolved.setdefault(key, []).append(text)
            self._parents[key] = found
        return self._parents[key]

    def ancestors(self, key: ClassKey) -> list[ClassKey]:
        """The class and all its indexed ancestors."""
        seen: list[ClassKey] = []
        stack = [key]
        while stack:
            cur = stack.pop()
            if cur in seen:
                continue
            seen.append(cur)
            stack.extend(self.parents(cur))
        return seen

    def derives_from(self, key: ClassKey, base: ClassKey) -> bool:
        """True if ``base`` is ``key`` or one of its ancestors."""
        return base in self.ancestors(key)

    def subclasses(self, roots: Iterable[ClassKey]) -> list[ClassKey]:
        """The roots and every indexed class deriving from one of them."""
        roots = list(roots)
        return [k for k in self.classes if any(self.derives_from(k, r) for r in roots)]

    def field_names(self, key: ClassKey) -> set[str]:
        """Dataclass fields (and InitVars) of a class, inherited ones included."""
        names: set[str] = set()
        for anc in self.ancestors(key):
            info = self.classes[anc]
            if info.is_dataclass:
                names.update(info.fields)
        return names


# ---------------------------------------------------------------- installed mcore ----


def runtime_fields(key: ClassKey) -> set[str]:
    """Fields of an installed dataclass: ``dataclasses.fields()`` plus InitVars."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls = getattr(importlib.import_module(key[0]), key[1])
    names = {f.name for f in dataclasses.fields(cls)}
    params = inspect.signature(cls).parameters.values()
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names.update(p.name for p in params if p.kind in plain)
    return names


def installed_mcore() -> tuple[str, Path]:
    """Version and site-packages root of the installed Megatron-Core."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        core = importlib.import_module("megatron.core")
    root = Path(core.__file__).resolve().parent.parent.parent
    return importlib.metadata.version("megatron-core"), root


# ---------------------------------------------------------------- wheels ----


def download_wheels(dest: Path) -> dict[str, Path]:
    """``pip download`` the pinned wheels (no deps, Python 3.12 binaries) into ``dest``."""
    specs = [f"{name}=={version}" for name, version in WHEELS.items()]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        WHEEL_PYTHON,
        "-d",
        str(dest),
        *specs,
    ]
    subprocess.run(cmd, check=True)
    return find_wheels(dest)


def find_wheels(folder: Path) -> dict[str, Path]:
    """The pinned wheels in ``folder``, by distribution name."""
    out: dict[str, Path] = {}
    for name, version in WHEELS.items():
        stem = f"{name.replace('-', '_')}-{version}-"
        matches = sorted(p for p in folder.glob("*.whl") if p.name.startswith(stem))
        if not matches:
            raise SystemExit(f"no {name} {version} wheel in {folder}")
        out[name] = matches[0]
    return out


# ---------------------------------------------------------------- generation ----


@dataclasses.dataclass
class Result:
    """The generated field lists plus facts for the summary."""

    mcore_versions: tuple[str, str]  # (installed, parsed wheel)
    sections: dict[str, list[str]]
    top_level: list[str]
    section_classes: dict[str, list[ClassKey]]
    old_only: dict[str, list[str]]
    new_only: dict[str, list[str]]
    self_check: list[str]
    unresolved: dict[ClassKey, list[str]]

    def doc(self) -> dict[str, object]:
        """The JSON document."""
        return {
            "generated_by": GENERATED_BY,
            "sources": {"megatron-core": list(self.mcore_versions), "megatron-bridge": BRIDGE},
            "sections": self.sections,
            "top_level": self.top_level,
        }


def _is_model_provider(index: SourceIndex, key: ClassKey) -> bool:
    """A Bridge class named ``*Provider`` that builds a model."""
    return (
        key[0].startswith("megatron.bridge.")
        and key[1].endswith("Provider")
        and any(index.derives_from(key, b) for b in (PROVIDER_MIXIN, TRANSFORMER_CONFIG))
    )


def _self_check(old_version: str, root: Path) -> list[str]:
    """Compare the ast reader with ``dataclasses.fields()`` on the installed Megatron-Core."""
    index = SourceIndex()
    index.add_tree(root, "megatron")
    problems = []
    for keys in MCORE_CLASSES.values():
        for key in keys:
            by_ast, by_import = index.field_names(key), runtime_fields(key)
            if by_ast != by_import:
                problems.append(
                    f"{key[1]} ({old_version}): ast-only {sorted(by_ast - by_import)}, "
                    f"import-only {sorted(by_import - by_ast)}"
                )
    return problems


def generate(wheels: dict[str, Path]) -> Result:
    """Build the known-fields document from the installed mcore and the pinned wheels."""
    old_version, root = installed_mcore()
    index = SourceIndex()
    for wheel in wheels.values():
        index.add_wheel(wheel)
    if CONTAINER not in index.classes:
        raise SystemExit(f"{'.'.join(CONTAINER)} not found in megatron-bridge {BRIDGE}")
    for keys in MCORE_CLASSES.values():
        for key in keys:
            if key not in index.classes:
                raise SystemExit(f"{'.'.join(key)} not found in megatron-core {MCORE_NEW}")

    # ConfigContainer fields (own and inherited) and the classes each annotation names.
    top_level: set[str] = set()
    roots: dict[str, list[ClassKey]] = {}
    for anc in reversed(index.ancestors(CONTAINER)):
        info = index.classes[anc]
        if not info.is_dataclass:
            continue
        top_level.update(info.fields)
        for name, annotation in info.fields.items():
            found = [
                k
                for k in index.annotation_classes(annotation, info)
                if index.field_names(k) or index.classes[k].is_dataclass
            ]
            if found:
                roots[name] = found

    section_classes: dict[str, list[ClassKey]] = {}
    sections: dict[str, set[str]] = {}
    for name, keys in roots.items():
        classes = index.subclasses(keys)
        if name == "model":
            classes += [
                k for k in index.classes if k not in classes and _is_model_provider(index, k)
            ]
        classes += [k for k in MCORE_CLASSES.get(name, ()) if k not in classes]
        section_classes[name] = classes
        sections[name] = set().union(*(index.field_names(k) for k in classes))

    old_only: dict[str, list[str]] = {}
    new_only: dict[str, list[str]] = {}
    for name, keys in MCORE_CLASSES.items():
        old = set().union(*(runtime_fields(k) for k in keys))
        new = set().union(*(index.field_names(k) for k in keys))
        sections[name] |= old
        old_only[name], new_only[name] = sorted(old - new), sorted(new - old)

    order = [s for s in MODELLED if s in sections] + [s for s in roots if s not in MODELLED]
    relevant = {a for ks in section_classes.values() for k in ks for a in index.ancestors(k)}
    return Result(
        mcore_versions=(old_version, MCORE_NEW),
        sections={s: sorted(sections[s]) for s in order},
        top_level=sorted(top_level),
        section_classes=section_classes,
        old_only=old_only,
        new_only=new_only,
        self_check=_self_check(old_version, root),
        unresolved={k: v for k, v in index.unresolved.items() if k in relevant},
    )


def render(doc: dict[str, object]) -> str:
    """The JSON text written to disk."""
    return json.dumps(doc, indent=1) + "\n"


def summary(result: Result) -> Iterator[str]:
    """Human-readable lines: versions, counts, version differences, diagnostics."""
    old, new = result.mcore_versions
    yield f"megatron-core {old} (imported) + {new} (wheel, ast); megatron-bridge {BRIDGE} (ast)"
    width = max(len(name) for name in result.sections)
    for name, names in result.sections.items():
        n_cls = len(result.section_classes.get(name, []))
        yield f"  {name:{width}s} {len(names):5d} fields ({n_cls} classes)"
    yield f"  {'(top level)':{width}s} {len(result.top_level):5d} names"
    for name in MCORE_CLASSES:
        if result.old_only[name]:
            yield f"{name}: only in megatron-core {old}: {', '.join(result.old_only[name])}"
        yield f"{name}: {len(result.new_only[name])} fields new in megatron-core {new}"
    if result.self_check:
        yield "WARNING ast reader disagrees with dataclasses.fields():"
        yield from (f"  {p}" for p in result.self_check)
    else:
        yield f"self-check: ast reader matches dataclasses.fields() on megatron-core {old}"
    for key, bases in sorted(result.unresolved.items()):
        yield f"note: unparsed bases of {'.'.join(key)}: {', '.join(bases)}"


def main(argv: list[str] | None = None) -> int:
    """Regenerate (or with ``--check`` verify) the known-fields JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs")
    parser.add_argument("--wheel-dir", type=Path, help="use pinned wheels already in this folder")
    parser.add_argument("--output", type=Path, default=OUTPUT, help="JSON path to write/check")
    args = parser.parse_args(argv)

    if args.wheel_dir:
        result = generate(find_wheels(args.wheel_dir))
    else:
        with tempfile.TemporaryDirectory(prefix="known-fields-") as tmp:
            result = generate(download_wheels(Path(tmp)))
    for line in summary(result):
        print(line)
    text = render(result.doc())
    if args.check:
        current = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        if current != text:
            print(f"{args.output} is out of date; rerun {GENERATED_BY}", file=sys.stderr)
            return 1
        print(f"{args.output} is up to date")
        return 0
    args.output.write_text(text, encoding="utf-8")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
