"""Which Megatron-Core release the rules follow, and what that release accepts.

Megatron Bridge 0.6.2 ships with Megatron-Core 0.19.2, so a Bridge dump is judged by 0.19.2
unless the user names another release. The per-release facts (defaults, accepted values,
recompute labels, CUDA-graph modules) are read from each wheel by scripts/gen_mcore_facts.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from mbridge_perf.config.errors import ConfigError

DEFAULT_MCORE_VERSION = "0.19.2"
# bounded parts: unbounded digit runs next to \w* backtrack quadratically on a long number
_VERSION = re.compile(r"^\s{0,8}v?(\d{1,4})\.(\d{1,4})(?:\.(\d{1,6}))?"
                      r"(?:[.+-]?(?:rc|dev|post)?\w{0,32})?\s{0,8}$")


@dataclass(frozen=True)
class McoreFacts:
    """What one Megatron-Core release defaults and accepts (see scripts/gen_mcore_facts.py)."""

    version: str
    defaults: dict[str, Any]
    choices: dict[str, list[Any]]
    recompute_modules: tuple[str, ...]
    cuda_graph_modules: tuple[str, ...]
    cuda_graph_deprecated_modules: tuple[str, ...]
    has_cuda_graph_modules_field: bool

    @property
    def key(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.version.split("."))

    def accepts(self, field: str, value: object) -> bool:
        """Whether a Literal-typed field of this release takes the value (True if untyped)."""
        allowed = self.choices.get(field)
        return allowed is None or value in allowed


@cache
def _releases() -> dict[str, dict[str, Any]]:
    text = resources.files("mbridge_perf.config").joinpath("mcore_facts.json").read_text()
    return json.loads(text)["releases"]


def supported_versions() -> tuple[str, ...]:
    return tuple(_releases())


@cache
def mcore_facts(version: str | None = None) -> McoreFacts:
    """The facts of the release a version string names: a release we read, or another patch
    of its minor line (0.19.0 → 0.19.2's rules). Anything else is one ConfigError."""
    text = DEFAULT_MCORE_VERSION if version is None else str(version)
    match = _VERSION.match(text)
    if match is None:
        raise ConfigError("mcore_version", f"{text!r} is not a Megatron-Core version; give "
                          f"one like {DEFAULT_MCORE_VERSION}")
    line = (int(match[1]), int(match[2]))
    known = {tuple(int(p) for p in v.split(".")[:2]): v for v in _releases()}
    if line not in known:
        raise ConfigError("mcore_version", f"rules exist for Megatron-Core "
                          f"{' and '.join(_releases())} (and other patches of those lines), "
                          f"not {text}; pick the closer release")
    name = known[line]
    raw = _releases()[name]
    return McoreFacts(name, raw["defaults"], raw["choices"], tuple(raw["recompute_modules"]),
                      tuple(raw["cuda_graph_modules"]),
                      tuple(raw["cuda_graph_deprecated_modules"]),
                      bool(raw["has_cuda_graph_modules_field"]))
