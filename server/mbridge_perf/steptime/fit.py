"""Fitting the step-time model's few parameters on measured steps: the one search that both
scripts/fit_steptime.py (Bridge's published tables) and ``mbridge-perf calibrate`` (the user's
own completed runs) use.

Method: coordinate search over multiplicative steps (no scipy) minimising the mean
pseudo-Huber loss of log(pred/measured) (quadratic below HUBER_DELTA, linear above, so one
outlying row cannot drag the rest) plus PRIOR_WEIGHT x the squared log distance of each
parameter from its starting value (the seeds' public figures, or the calibration in use for a
user's refit). Without that pull the earlier median objective let parameters trade against
each other: fitted on the MoE families alone, Hopper's FP8 GEMM efficiency fell to 0.17-0.35
and the per-layer overhead rose to 950 us. A parameter no row exercises keeps its starting
value.
"""

from __future__ import annotations

import math
import statistics
from typing import Protocol

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.gpus import GPUSpec
from mbridge_perf.steptime.calibration import SEED, Calibration, GenParams
from mbridge_perf.steptime.model import generation, predict_step_time_s


class Sample(Protocol):
    """One measured step: the resolved config, its GPU and the measured seconds."""

    derived: Derived
    spec: GPUSpec
    measured_s: float


# (path, seed) of every fitted parameter; generation fields as "gen.<arch>.<field>"
FITTED = ("gen.hopper.gemm_eff_fp8", "gen.blackwell.gemm_eff_fp8", "gen.blackwell.gemm_eff_fp4",
          "gen.blackwell_ultra.gemm_eff_fp8", "gen.blackwell_ultra.gemm_eff_fp4",
          "grouped_gemm_factor", "ssm_eff", "ep_exposed", "cp_exposed",
          "layer_overhead_us")
# the host launch floor: fitted apart, on the rows where it binds (fit_steptime: vTrain's small
# GPTs; calibrate: the user's own runs, with the rest)
HOST = ("layer_host_us",)
BOUNDS = {"grouped_gemm_factor": (0.1, 1.5), "ep_exposed": (0.0, 1.0), "ssm_eff": (0.002, 1.0),
          "cp_exposed": (0.0, 1.0),
          "layer_overhead_us": (0.0, 5000.0), "layer_host_us": (0.0, 20000.0)}


def get(cal: Calibration, name: str) -> float:
    if name.startswith("gen."):
        _, arch, fld = name.split(".")
        return float(getattr(cal.generations[arch], fld))
    return float(getattr(cal, name))


def put(cal: Calibration, name: str, value: float) -> Calibration:
    if name.startswith("gen."):
        _, arch, fld = name.split(".")
        gens = dict(cal.generations)
        gens[arch] = GenParams(**(gens[arch].model_dump() | {fld: value}))
        return cal.model_copy(update={"generations": gens})
    return cal.model_copy(update={name: value})


def log_errors(cal: Calibration, rows: list[Sample]) -> list[float]:
    return [math.log(predict_step_time_s(r.derived, gpu=r.spec, calibration=cal)
                     / r.measured_s) for r in rows]


HUBER_DELTA = 0.1  # log error at which the loss turns from quadratic to linear
PRIOR_WEIGHT = 0.03
# parameters that may sit at or near zero: their prior distance is taken after this offset
_PRIOR_OFFSET = {"layer_overhead_us": 20.0, "layer_host_us": 100.0, "ep_exposed": 0.1,
                 "cp_exposed": 0.1}


def prior(cal: Calibration, start: Calibration, names: tuple[str, ...]) -> float:
    """Squared log distance of the fitted parameters from where the fit started."""
    total = 0.0
    for n in names:
        off = _PRIOR_OFFSET.get(n, 0.0)
        total += math.log((get(cal, n) + off) / (get(start, n) + off)) ** 2
    return total


def robust_loss(errors: list[float]) -> float:
    """Mean pseudo-Huber loss of log errors (quadratic below HUBER_DELTA, linear above)."""
    d = HUBER_DELTA
    return statistics.fmean(d * (math.sqrt(1 + (e / d) ** 2) - 1) for e in errors)


def objective(cal: Calibration, rows: list[Sample], start: Calibration = SEED,
              names: tuple[str, ...] = FITTED) -> float:
    return robust_loss(log_errors(cal, rows)) + PRIOR_WEIGHT * prior(cal, start, names)


def relevant(name: str, rows: list[Sample]) -> bool:
    """A parameter no training row exercises keeps its seed."""
    if name.startswith("gen."):
        _, arch, fld = name.split(".")
        prec = fld.rsplit("_", 1)[1]
        return any(generation(r.spec) == arch and _prec(r) == prec for r in rows)
    if name in ("grouped_gemm_factor", "ep_exposed"):
        return any(r.derived.is_moe for r in rows)
    if name == "cp_exposed":
        return any(r.derived.cp > 1 for r in rows)
    if name == "ssm_eff":
        return any(k.mixer in ("mamba", "gdn") for r in rows for k in r.derived.layer_kinds)
    return True


def _prec(r: Sample) -> str:
    p = r.derived.precision
    return "fp4" if p.fp4 else "fp8" if p.fp8 else "bf16"


def fit(rows: list[Sample], start: Calibration = SEED,
        names: tuple[str, ...] = FITTED) -> Calibration:
    """The calibration from ``start`` that best predicts ``rows`` (see the module docstring)."""
    cal = start
    names = tuple(n for n in names if relevant(n, rows))
    best = objective(cal, rows, start, names)
    for step in (0.4, 0.15, 0.05, 0.02):
        improved = True
        while improved:
            improved = False
            for name in names:
                x = get(cal, name)
                lo, hi = BOUNDS.get(name, (0.05, 1.0))
                for k in (-3, -2, -1, 1, 2, 3):
                    y = x * (1 + step) ** k if x > 0 else step * 100 * max(k, 0)
                    y = round(min(hi, max(lo, y)), 4)
                    if y == x or (name.startswith("gen.") and y <= 0):
                        continue
                    trial = put(cal, name, y)
                    val = objective(trial, rows, start, names)
                    if val < best - 1e-12:
                        cal, best, x, improved = trial, val, y, True
    return cal


