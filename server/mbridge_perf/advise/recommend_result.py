"""recommend_recompute's typed result: the ladder's steps and the baseline they start from
(apart from the ladder that fills them and the markdown that renders them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mbridge_perf.advise.costs import ThroughputCost


class RecomputeStep(BaseModel):
    """One rung: the change, what it leaves on the most-loaded stage, what it costs."""

    index: int
    rung: Literal["allocator", "distributed_optimizer", "selective", "full", "optimizer_offload",
                  "activation_offload"]
    action: str
    config_changes: dict[str, Any] = Field(description="dotted Bridge keys -> values, on top "
                                                       "of the steps before (unless "
                                                       "builds_on says otherwise)")
    overrides: list[str] = Field(description="the same changes as dotted overrides")
    builds_on: int | None = Field(description="index of the step this one is applied on "
                                               "top of (None: the user's config)")
    est_peak_gib: float = Field(description="peak allocated on the most-loaded stage, GiB")
    est_need_gib: float = Field(description="peak + overheads + the high end of the "
                                            "allocator's reserved band, GiB")
    est_saving_gib: float = Field(description="peak allocated saved vs the step it builds on")
    throughput_cost: ThroughputCost
    fits: bool = Field(description="est_need_gib <= the budget")
    rationale: str
    skill: str


class Baseline(BaseModel):
    est_peak_gib: float
    est_need_gib: float
    reserved_band_gib: tuple[float, float]
    overheads_gib: float
    fits: bool
    expandable_segments: bool
    findings: list[str] = Field(description="validator errors of the user's config")


class RecomputePlan(BaseModel):
    """The ordered ladder for one config and a memory budget."""

    scenario: Literal["fragmentation", "capacity", "fits"] = Field(
        description="fragmentation: the peak fits but not with the reserved band; capacity: "
                    "the peak itself does not fit; fits: already fits with margin")
    budget_gib: float
    budget_source: str
    baseline: Baseline
    steps: list[RecomputeStep]
    first_fitting_step: int | None = Field(description="index of the first step that fits "
                                                       "(None: nothing on the ladder fits)")
    notes: list[str]
    skipped: list[str] = Field(description="rungs that do not apply here, and why")
    answer_markdown: str
