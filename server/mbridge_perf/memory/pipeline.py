"""Micro-batches in flight per pipeline stage: how many micro-batches' activations a stage holds
at its peak under the 1F1B and interleaved (VPP) schedules.

Why it matters: activations are not divided by PP. Stage r of a 1F1B pipeline runs PP - r
forward passes before its first backward, so it holds min(PP - r, M) micro-batches of its own
layers; the interleaved schedule warms up (PP - r - 1) * 2 + (VPP - 1) * G virtual micro-batches
(G = microbatch_group_size_per_vp_stage, default PP) and cycles through its chunks in groups of
G, which is why interleaving adds memory (Megatron-Core ``get_pp_rank_microbatches``; measured on
CPU in cpu-ground-truth.md §6: 3.97 / 2.99 / 2.00 / 1.01 at PP4, first stage 2.50 / 2.25 / 5.47
of 2.5 / 2.25 / 5.5 interleaved).
"""

from __future__ import annotations


def in_flight(pp: int, vpp: int, rank: int, microbatches: int | None,
              group: int | None = None) -> list[int]:
    """Micro-batches each chunk of pipeline rank ``rank`` holds at the end of its warm-up (the
    peak). ``microbatches`` None means "enough to fill the pipeline"."""
    if vpp <= 1:
        full = pp - rank
        return [full if microbatches is None else min(full, microbatches)]
    g = group or pp
    units = (pp - rank - 1) * 2 + (vpp - 1) * g + 1
    if microbatches is not None:
        units = min(units, microbatches * vpp)
    cycle = g * vpp
    whole, rem = divmod(units, cycle)
    return [whole * g + min(max(rem - c * g, 0), g) for c in range(vpp)]
