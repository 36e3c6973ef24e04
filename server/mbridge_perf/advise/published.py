"""The skills' published layouts for a plan's case: which one applies, read from the card.

Why: the long-context skill publishes layout families (DeepSeek-V3 128K and 256K on H100,
Qwen3-235B 128K on GB200) that were picked on runs for throughput; the planner ranks by memory
and the skills' layout rules, without timing a step, and the two can disagree. When a plan's
model, GPU and sequence match a published row, the plan prices that layout and says where it
lands and what ranks above it, so the assistant reconciles the two instead of quoting one and
ignoring the other. The rows come from the skill's card.yaml (``measured_results`` id
``long-context-layouts``), the same source the SKILL.md renders: no second copy to drift.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, Field

from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.model import ModelSection
from mbridge_perf.config.presets import load_presets

SKILL = "nemo-mbridge-perf-moe-long-context"
RESULT_ID = "long-context-layouts"
# the fields that tell one architecture from another (a preset's value where it sets one)
SHAPE = ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
         "ffn_hidden_size", "num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk")


class PublishedLayout(BaseModel):
    """A layout the skill publishes for this case, priced and placed in the plan's ranking."""

    source: str = Field(description="the skill card and row it comes from")
    model: str
    tensor_model_parallel_size: int
    context_parallel_size: int
    expert_model_parallel_size: int
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    fit: Literal["as_set", "with_rung", "no", "not_offered"] = Field(
        description="as priced with the config's settings; not_offered: the sizes are not "
                    "among the layouts enumerated here (rules, constraints or GPU count)")
    rank: int | None = Field(description="where its (TP, CP, EP, ETP, PP) family ranks among "
                                         "every enumerated layout that fits and passes "
                                         "validate_config: by predicted speed among the "
                                         "returned layouts, by the plan's keys below them")
    ranked_vpp: int | None = Field(description="the VPP its family ranks with (its best)")
    peak_allocated_gib: float | None
    headroom_gib: float | None
    config_changes: dict[str, Any] = Field(description="dotted Bridge keys for this layout, as "
                                                       "priced (empty when not offered)")
    overrides: list[str]
    reason: str = Field(description="why it ranks there: #1's predicted speed and the term "
                                    "that places it ahead, or the first key on which #1 beats "
                                    "it")
    predicted_step_time_s: float | None = Field(None, description="estimate_step_time of the "
                                                                  "layout as ranked")
    predicted_tokens_per_s_per_gpu: float | None = None


@dataclass(frozen=True, slots=True)
class PublishedRow:
    model: str
    preset: str
    gpu: str
    seq_length: int
    tp: int
    cp: int
    ep: int
    pp: int
    vpp: int | None

    @property
    def source(self) -> str:
        return (f"skills/{SKILL}/card.yaml measured_results {RESULT_ID}: {self.model} "
                f"{self.seq_length // 1024}K on {self.gpu}")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _preset_for(model: str) -> str | None:
    """The preset a card's model name stands for: the shortest preset name it starts."""
    key = _norm(model)
    hits = [p for p in load_presets() if key and _norm(p).startswith(key)]
    return min(hits, key=len) if hits else None


def _row(raw: Any) -> PublishedRow | None:
    if not isinstance(raw, dict):
        return None
    try:
        model, gpu = str(raw["model"]), str(raw["gpu"])
        sizes = [int(raw[k]) for k in ("seq_length", "tp", "cp", "ep", "pp")]
        vpp = int(raw["vpp"]) if raw.get("vpp") else None
    except (KeyError, TypeError, ValueError):
        return None
    preset = _preset_for(model)
    return None if preset is None else PublishedRow(model, preset, gpu, *sizes, vpp)


@cache
def published_rows() -> tuple[PublishedRow, ...]:
    """The card's published rows; none when the skill pack is not installed or unreadable."""
    from mbridge_perf.skillpack.pack import CARD_FILE, PackError, find_pack_root, load_yaml

    try:
        card = load_yaml(find_pack_root() / "skills" / SKILL / CARD_FILE)
    except (PackError, OSError):
        return ()
    results = card.get("measured_results") if isinstance(card, dict) else None
    for res in results if isinstance(results, list) else []:
        if isinstance(res, dict) and res.get("id") == RESULT_ID:
            rows = (_row(r) for r in res.get("rows") or [])
            return tuple(r for r in rows if r is not None)
    return ()


def matching(m: ModelSection, gpu: str, seq_length: int) -> list[PublishedRow]:
    """The published rows for this model (by architecture, not by name), GPU and sequence."""
    out = []
    presets = load_presets()
    for row in published_rows():
        shape = presets[row.preset].model
        if row.seq_length != seq_length or _gpu_name(row.gpu) != gpu:
            continue
        if all(getattr(m, f, None) == shape[f] for f in SHAPE if f in shape):
            out.append(row)
    return out


def _gpu_name(name: str) -> str | None:
    try:
        return lookup_gpu(name).name
    except ValueError:
        return None
