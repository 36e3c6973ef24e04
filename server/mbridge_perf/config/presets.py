"""Model architecture presets (presets.yaml): a preset name stands in for a `model` section.

Why a file of facts: every tool accepts "llama3-70b" instead of forty fields, and the test
suite checks each preset's parameter count against the published figure, so a typo in a
preset cannot slip into memory estimates unnoticed.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from mbridge_perf.config.model import ModelSection

PRESETS_FILE = "presets.yaml"

Part = Literal["mtp", "input_embedding", "output_layer"]


class Preset(BaseModel):
    """One architecture: Bridge model-section fields plus where the numbers come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str
    published_params_b: float = Field(gt=0)
    published_params_source: str
    published_params_excludes: tuple[Part, ...] = ()
    active_params_b: float | None = Field(None, gt=0)
    active_params_source: str | None = None
    active_params_excludes: tuple[Part, ...] = ()
    notes: str | None = None
    model: dict[str, Any]
    """Plain model-section fields; the config loader turns them into a TrainingConfig."""
    defaults: dict[str, Any] = Field(default_factory=dict)

    @field_validator("model")
    @classmethod
    def _model_section_accepts(cls, value: dict[str, Any]) -> dict[str, Any]:
        """Fail at load, not in a tool, when a preset has a bad value (kept as a plain dict)."""
        ModelSection.model_validate(value)
        return value


@cache
def load_presets() -> dict[str, Preset]:
    """Every preset by its canonical (lower-case) name. Read once; YAML via safe_load."""
    text = Path(__file__).with_name(PRESETS_FILE).read_text("utf-8")
    raw = yaml.safe_load(text) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{PRESETS_FILE}: expected a mapping of preset names")
    return {str(name).lower(): Preset(name=str(name).lower(), **body)
            for name, body in raw.items()}


def get_preset(name: str) -> Preset:
    """A preset by name, case-insensitively; an unknown name suggests the closest ones."""
    presets = load_presets()
    key = name.strip().lower()
    if key in presets:
        return presets[key]
    close = difflib.get_close_matches(key, presets, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(f"unknown model preset {name!r}.{hint} "
                     f"Known presets: {', '.join(sorted(presets))}")
