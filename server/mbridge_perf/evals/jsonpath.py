"""The JSONPath subset the checks use: $.a.b, [N], [*], .* and [?(@.key=='value')]."""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\.\*|\[(\d+)\]|\[\*\]"
                    r"|\[\?\(@\.([A-Za-z_][A-Za-z0-9_]{0,63})\s{0,8}==\s{0,8}(['\"])"
                    r"(.{0,256}?)\4\)\]")


class PathError(ValueError):
    """A path outside the supported subset."""


def parse(path: str) -> list[tuple[str, Any]]:
    if not path.startswith("$"):
        raise PathError(f"JSONPath {path!r} must start with '$'")
    steps: list[tuple[str, Any]] = []
    pos = 1
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise PathError(f"JSONPath {path!r}: cannot read {path[pos:]!r} (supported: .key, "
                            "[N], [*], .*, [?(@.key=='value')])")
        if m.group(1):
            steps.append(("key", m.group(1)))
        elif m.group(2):
            steps.append(("index", int(m.group(2))))
        elif m.group(3):
            steps.append(("filter", (m.group(3), m.group(5))))
        else:
            steps.append(("all", None))
        pos = m.end()
    return steps


def _selects(kind: str, node: Any, arg: Any) -> bool:
    if kind == "key":
        return isinstance(node, dict) and arg in node
    return kind == "index" and isinstance(node, list) and -len(node) <= arg < len(node)


def query(data: Any, path: str) -> list[Any]:
    """Every value the path selects (empty when nothing matches)."""
    nodes = [data]
    for kind, arg in parse(path):
        nxt: list[Any] = []
        for n in nodes:
            if _selects(kind, n, arg):
                nxt.append(n[arg])
            elif kind == "all":
                nxt.extend(n.values() if isinstance(n, dict) else n if isinstance(n, list) else [])
            elif kind == "filter" and isinstance(n, list):
                key, want = arg
                nxt.extend(x for x in n if isinstance(x, dict) and str(x.get(key)) == want)
        nodes = nxt
    return nodes
