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
    failure_mode: FailureMode | None
    plan: RecomputePlan | None = Field(None, description="recommend_recompute's plan, when a "
                                                             "config was given")
    answer_markdown: str
