"""The shape of Megatron Bridge's estimate next to ours (filled by memory.bridge_compare)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class BridgeTerm(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    ours_gib: float | None = Field(description="ours, GiB; None: we have no such term")
    bridge_gib: float | None = Field(description="Bridge's, GiB; None: Bridge has no such term")
    note: str = Field(description="what the difference is made of")


class BridgeComparison(BaseModel):
    """Bridge's estimate_training_memory lined up with ours, or one line saying why not."""

    model_config = ConfigDict(frozen=True)

    source: Literal["live", "recorded", "unavailable"] = Field(
        description="live: Bridge called on your ConfigContainer; recorded: Bridge 0.6.2's "
                    "result for this unmodified recipe; unavailable: see message")
    message: str = Field(description="one line: where Bridge's numbers come from, or why none")
    bridge_total_gib: float | None = None
    ours_peak_allocated_gib: float | None = None
    ours_launch_gib: float | None = Field(
        None, description="ours with what the process also holds (the largest phase's need at "
                          "the low end of the reserved band): graph pools, CUDA context, NCCL")
    terms: list[BridgeTerm] = Field(default_factory=list)
    bridge_leaves_out: list[str] = Field(
        default_factory=list, description="what Bridge's formula does not price for this config")
