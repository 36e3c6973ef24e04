"""The field names each Megatron Bridge ConfigContainer section accepts: the generated
``known_fields.json`` plus the fields we model. Shared by the loader (name checks) and the
override parser (whole-section keys)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources

from mbridge_perf.config.model import CARRIED_SECTIONS, Section, TrainingConfig


@cache
def known_fields() -> dict[str, frozenset[str]]:
    """Field names the real ConfigContainer sections accept (generated from Megatron-Core and
    Megatron Bridge by scripts/gen_known_fields.py), plus the ones we model."""
    text = resources.files("mbridge_perf.config").joinpath("known_fields.json").read_text()
    data = json.loads(text)
    sections = {k: frozenset(v) for k, v in data["sections"].items()}
    for name, info in TrainingConfig.model_fields.items():
        sub = info.annotation
        for cls in getattr(sub, "__args__", (sub,)):
            if isinstance(cls, type) and issubclass(cls, Section):
                sections[name] = sections.get(name, frozenset()) | frozenset(cls.model_fields)
    sections["top_level"] = frozenset(data.get("top_level", ())) | frozenset(
        TrainingConfig.model_fields) | frozenset(CARRIED_SECTIONS)
    return sections
