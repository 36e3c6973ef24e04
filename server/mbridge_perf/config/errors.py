"""The one error type for unusable input: it names the field and says what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any


class ConfigError(ValueError):
    """Bad input (malformed YAML, unknown field, wrong type, absurd size, unknown preset).

    ``field`` is the dotted name at fault (or the input that could not be read); the message
    is one line a user or an assistant can act on.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """" (did you mean x?)" or "" — difflib on the names people actually type."""
    pool = list(choices)
    close = difflib.get_close_matches(name, pool, n=n, cutoff=0.6)
    if not close and len(name) >= 3:  # a prefix or fragment of a longer name: bf16 → bf16_mixed
        close = sorted((c for c in pool if name.lower() in c.lower()), key=len)[:n]
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"


def type_problem(err: Mapping[str, Any]) -> str:
    """One pydantic error as a sentence a user acts on (never pydantic's own dump)."""
    kind, ctx, got = err["type"], err.get("ctx", {}), _Short(err.get("input"))
    if kind == "missing":
        return "required: give a value"
    if kind == "greater_than_equal":
        return f"must be ≥ {ctx.get('ge')}, got {got!r}"
    if kind == "greater_than":
        return f"must be > {ctx.get('gt')}, got {got!r}"
    if kind in ("less_than_equal", "less_than"):
        return (f"{got!r} is beyond any real training run (limit "
                f"{ctx.get('le', ctx.get('lt'))}); check the value")
    if kind == "literal_error":
        return f"got {got!r}; expected one of {ctx.get('expected')}"
    if kind.endswith("_parsing") or kind.endswith("_type"):
        want = kind.split("_")[0]
        return f"expected {'a whole number' if want == 'int' else want}, got {got!r}"
    if kind == "extra_forbidden":
        return "unknown field"
    return f"{err['msg']} (got {got!r})"


class _Short:
    """A value's repr cut to one readable line: error messages never echo a huge input."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def __repr__(self) -> str:
        text = " ".join(repr(self.value).split())
        return text if len(text) <= 80 else text[:77] + "..."
