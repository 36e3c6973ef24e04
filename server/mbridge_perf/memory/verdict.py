"""The three-way memory verdict: ``fits``, ``tight`` or ``does_not_fit``, and the term that
decides it.

Why three: a yes/no on an estimate hides how sure it is. The estimate carries two stated
uncertainties: the allocator's reserved-but-unallocated band (its width depends on the allocator
settings in use: memory.overheads.RESERVED_BAND) and the estimator's own error on measured runs.
``tight`` says the decision flips inside them, so the user knows a borderline config is
borderline (the seeds' Llama3 70B SFT ran at ~59 GB with expandable segments and went OOM
without them; with [core_attn, layernorm] at 59.6 GB it went OOM too).
"""

from __future__ import annotations

from typing import Literal

Verdict = Literal["fits", "tight", "does_not_fit"]

MARGIN_FRACTION = 0.08
MARGIN_SOURCE = ("the estimator's median |error| on the Megatron Bridge skill-card runs, 8.1 % "
                 "(benchmarks/memory_accuracy.py, n=24, ../shared/data/memory/"
                 "bridge-skill-cards.csv)")


def judge(need_low: float, need_high: float, budget: float) -> tuple[Verdict, str]:
    """``need_low`` / ``need_high``: what the process needs (allocated + private pools +
    outside the allocator) at the low and high end of the reserved band, GiB; ``budget``: the
    GPU's capacity or the user's target. fits: the high end fits and the central estimate
    leaves at least the margin; does_not_fit: even the low end is over by more than the
    margin; tight: in between, with the term that decides it."""
    margin = MARGIN_FRACTION * budget
    if need_high <= budget and need_low <= budget - margin:
        return "fits", (f"fits at the high end of the reserved band ({need_high:.1f} of "
                        f"{budget:.1f} GiB) with {budget - need_low:.1f} GiB headroom")
    if need_low > budget + margin:
        return "does_not_fit", (f"needs {need_low:.1f} GiB at the low end of the reserved "
                                f"band, {need_low - budget:.1f} GiB over {budget:.1f} GiB: more "
                                f"than the estimator's {MARGIN_FRACTION:.0%} margin")
    if need_low <= budget < need_high:
        return "tight", (f"the reserved band (fragmentation) decides: {need_low:.1f} GiB fits, "
                         f"{need_high:.1f} GiB at its high end does not ({budget:.1f} GiB)")
    if need_low > budget:
        return "tight", (f"{need_low - budget:.1f} GiB over {budget:.1f} GiB, inside the "
                         f"estimator's {MARGIN_FRACTION:.0%} margin ({margin:.1f} GiB)")
    return "tight", (f"{budget - need_low:.1f} GiB headroom is inside the estimator's "
                     f"{MARGIN_FRACTION:.0%} margin ({margin:.1f} GiB)")
