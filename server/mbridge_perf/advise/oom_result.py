"""diagnose_oom's typed result: what the OOM text says and which failure it is (apart from
the readers that fill it and the markdown that renders it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mbridge_perf.advise.recommend_result import RecomputePlan


class OOMNumbers(BaseModel):
    """What the message says, in GiB (2^30 bytes)."""

    requested_gib: float | None = None
    total_capacity_gib: float | None = None
    free_gib: float | None = None
    in_use_gib: float | None = None
    allocated_gib: float | None = None
    reserved_gib: float | None = None
    reserved_unallocated_gib: float | None = None
    gpu_index: int | None = None
    rank: int | None = Field(None, description="the rank the failure line names, if any")


class RankMemory(BaseModel):
    """A Megatron / Bridge per-rank memory line (GiB)."""

    rank: int
    iteration: int
    allocated_gib: float | None
    max_allocated_gib: float | None
    reserved_gib: float | None
    max_reserved_gib: float | None
    alloc_retries: int | None


class FailureMode(BaseModel):
    """The matching row of a skill's failure table."""

    skill: str
    name: str
    symptom: str
    fix: str


class Reconciliation(BaseModel):
    """One term of the memory the OOM message measured next to what the estimate says for the
    same term (GiB). difference_gib = measured - estimated_gib; where the estimate is a range,
    estimated_gib is its end nearest the measurement (the difference is 0 inside it)."""

    term: Literal["allocated", "reserved_unallocated", "outside_pytorch", "in_use", "capacity"]
    measured_gib: float
    estimated_gib: float
    estimated_range_gib: tuple[float, float] | None = Field(
        None, description="the estimate's low and high end where it is a range (the reserved "
                          "band)")
    difference_gib: float
    note: str = Field(description="where each side comes from")


class PlanBudget(BaseModel):
    """The budget the recommend plan was priced against when the message measured the memory
    outside PyTorch: target = capacity - measured outside + the estimate's outside term (each
    step's need counts the estimate's outside term once, so a step fits when its allocated +
    private pools + reserved band fit in capacity - measured outside)."""

    target_gib: float
    capacity_gib: float
    measured_outside_gib: float
    estimated_outside_gib: float
    pytorch_budget_gib: float = Field(description="capacity - measured outside: what PyTorch "
                                                  "can hold")


class OOMDiagnosis(BaseModel):
    classification: Literal["fragmentation", "capacity", "none"]
    reason: str
    message_format: Literal["pytorch>=2.1", "pytorch-2.0/1.x", "cuda-driver", "nccl",
                            "memory-lines", "none"]
    numbers: OOMNumbers
    ranks: list[RankMemory] = Field(description="per-rank memory lines, the last per rank "
                                                "(the 256 fullest ranks at most)")
    allocator_set: bool | None = Field(description="expandable_segments:True seen in the text "
                                                   "or the config (None: not known)")
    allocator_in_effect: bool | None = Field(
        None, description="False when expandable_segments:True is set but the measured "
                          "reserved-but-unallocated band is wider than the estimate explains "
                          "(graph pools + the expandable-segments band): the failing processes "
                          "ran without it. None: not judged")
    failure_mode: FailureMode | None
    reconciliation: list[Reconciliation] = Field(
        default_factory=list, description="with a config: each term the message measured "
                                          "(allocated, reserved but unallocated, outside "
                                          "PyTorch, in use, capacity) next to the estimate")
    estimate_phase: str | None = Field(
        None, description="the estimated phase the measurement is compared with (the one whose "
                          "allocated is nearest allocated + requested)")
    plan_budget: PlanBudget | None = Field(
        None, description="how the plan's target_gib was set from the measured state")
    plan: RecomputePlan | None = Field(None, description="recommend_recompute's plan, when a "
                                                             "config was given")
    answer_markdown: str
