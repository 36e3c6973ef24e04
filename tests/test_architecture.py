"""The house rules, read from the source: memory/ imports nothing from rules/, no import cycle
in the package (imports inside functions count), no function longer than 80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

import mbridge_perf

ROOT = Path(mbridge_perf.__file__).parent
MAX_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            out |= {c for c in [mod, *(f"{mod}.{a.name}" for a in node.names)] if c in known}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
    return out - {name}


def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_memory_imports_nothing_from_rules() -> None:
    bad = [(a, b) for a, deps in _graph().items() for b in deps
           if a.startswith("mbridge_perf.memory") and b.startswith("mbridge_perf.rules")]
    assert not bad


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles[:5]


def test_no_function_longer_than_80_lines() -> None:
    long = []
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n})")
    assert not long, long
