"""The one error type for unusable input: it names the field and says what to do."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
