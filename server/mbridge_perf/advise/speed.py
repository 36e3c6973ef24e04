"""Layouts ordered by predicted throughput, with ties where the model cannot tell them apart.

Why: users pick a layout for speed; memory only decides what is allowed. The step-time model
(steptime/) predicts each fitting layout's tokens/s/GPU. Two layouts of the same model whose
predictions differ by less than the calibration's ``pair_band_frac`` (the model's typical error
on a measured A/B ratio) are a tie: the model cannot order them, so the planner keeps the
skills' rule-of-thumb keys between them and suggests an A/B run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.steptime import Calibration, estimate_step_time, load_calibration


@dataclass(frozen=True, slots=True)
class Predicted:
    """One layout's predicted step, in the units Bridge's tables use."""

    step_time_s: float
    tokens_per_s_per_gpu: float
    band_s: float
    largest_term: str
    terms: tuple[tuple[str, float], ...]


def predict(cfg: TrainingConfig, cal: Calibration | None = None) -> Predicted | None:
    """The layout's predicted step; None when the model cannot time it (it says why)."""
    try:
        r = estimate_step_time(cfg, calibration=cal)
    except (ConfigError, ValueError, ZeroDivisionError):
        return None
    top = max(r.breakdown, key=lambda t: t.seconds)
    return Predicted(step_time_s=r.step_time_s, tokens_per_s_per_gpu=r.tokens_per_s_per_gpu,
                     band_s=r.band_s, largest_term=f"{top.name} {top.share:.0%}",
                     terms=tuple((t.name, t.seconds) for t in r.breakdown))


def widest_gap(ahead: Predicted, behind: Predicted) -> str:
    """The term that costs ``behind`` most over ``ahead`` (what places the other ahead)."""
    a = dict(ahead.terms)
    name, extra = max(((n, s - a.get(n, 0.0)) for n, s in behind.terms), key=lambda x: x[1])
    if extra <= 0:
        return "no term predicted slower"
    return f"{name} +{extra:.2f} s per step"


def pair_band(cal: Calibration | None = None) -> float:
    """The relative difference below which two predictions are a tie."""
    return (cal or load_calibration()).pair_band_frac


def order_by_speed(preds: Sequence[Predicted | None], keys: Sequence[tuple],
                   buckets: Sequence[int], band: float) -> tuple[list[int], list[int]]:
    """Indices in rank order and a tie-group number per rank position.

    Within a bucket (fit class), faster first; a run of layouts each within ``band`` of the
    run's fastest is one tie group, ordered among itself by ``keys``. Unpredicted layouts go
    after the predicted ones of their bucket, by ``keys``."""
    idx = sorted(range(len(preds)), key=lambda i: (
        buckets[i], preds[i] is None,
        -(preds[i].tokens_per_s_per_gpu if preds[i] else 0.0)))  # type: ignore[union-attr]
    order: list[int] = []
    groups: list[int] = []
    run: list[int] = []
    lead: float | None = None

    def close() -> None:
        run.sort(key=lambda i: keys[i])
        groups.extend([len(order)] * len(run))  # a group's id: its first rank position
        order.extend(run)
        run.clear()

    for i in idx:
        p = preds[i]
        same = run and buckets[run[0]] == buckets[i] and p is not None and lead is not None \
            and p.tokens_per_s_per_gpu >= lead * (1 - band)
        if not same and run:
            close()
        if not run:
            lead = p.tokens_per_s_per_gpu if p is not None else None
        run.append(i)
        if p is None:
            close()
    if run:
        close()
    return order, groups
