"""recommend_recompute's typed result: the ladder's steps and the baseline they start from
(apart from the ladder that fills them and the markdown that renders them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mbridge_perf.advise.costs import ThroughputCost
from mbridge_perf.memory.verdict import Verdict


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
    est_need_gib: float = Field(description="allocated + graph pools + overheads + the high end "
                                            "of the allocator's reserved band, GiB (the "
                                            "largest over the run's phases)")
    est_saving_gib: float = Field(description="peak allocated saved vs the step it builds on")
    throughput_cost: ThroughputCost
    verdict: Verdict = Field(description="fits / tight / does_not_fit against the budget "
                                         "(memory.verdict)")
    verdict_term: str
    fits: bool = Field(description="verdict is fits or tight: the ladder can stop here")
    optional: bool = Field(False, description="after the first step that fits or is tight: "
                                              "more margin, not needed")
    rationale: str
    skill: str


class Baseline(BaseModel):
    est_peak_gib: float
    est_need_gib: float
    reserved_band_gib: tuple[float, float]
    overheads_gib: float
    verdict: Verdict
    verdict_term: str
    fits: bool = Field(description="verdict == 'fits': nothing is proposed")
    expandable_segments: bool
    findings: list[str] = Field(description="validator errors of the user's config")


class RecomputePlan(BaseModel):
    """The ordered ladder for one config and a memory budget."""

    scenario: Literal["fragmentation", "capacity", "tight", "fits"] = Field(
        description="fragmentation: the need fits at the low end of the reserved band, not at "
                    "its high end; capacity: not even at the low end; tight: it fits with the "
                    "band but inside the estimator's margin; fits: already fits with margin "
                    "(nothing is proposed)")
    budget_gib: float
    budget_source: str
    baseline: Baseline
    steps: list[RecomputeStep]
    first_fitting_step: int | None = Field(description="index of the first step whose verdict "
                                                       "is fits or tight (None: nothing on the "
                                                       "ladder does)")
    notes: list[str]
    skipped: list[str] = Field(description="rungs that do not apply here, and why")
    answer_markdown: str
