"""``mbridge-perf calibrate``: the step-time model refitted on the user's own completed runs.

Why: the shipped calibration is fitted on NVIDIA's published tables (their containers, their
clusters). A user's GPUs, network and container differ; their own completed benchmark runs in
the registry are the measurements that say by how much. The fit is the one
scripts/fit_steptime.py uses (steptime/fit.py), started from the calibration in use; with few
runs only the GEMM efficiency of the generations and precisions present and the per-layer
overhead move (the rest keep their values). The file goes to the user's config directory,
where every tool reads it from then on, and the report shows each run's error before and after.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, Field

from mbridge_perf.bench.registry import Registry, RunRecord
from mbridge_perf.config.derived import Derived, derive
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import GPUSpec, lookup_gpu
from mbridge_perf.config.load import load_config
from mbridge_perf.steptime import load_calibration, predict_step_time_s
from mbridge_perf.steptime.calibration import user_calibration_path
from mbridge_perf.steptime.fit import FITTED, HOST, fit, get

MIN_RUNS = 2
FEW_RUNS = 8  # below this many runs only GEMM efficiencies, the layer overhead and host floor move
RUN_LIMIT = 500


class CalibratedRun(BaseModel):
    run_id: str
    gpu: str
    measured_s: float = Field(description="median step time of the run's steady window")
    before_s: float = Field(description="predicted with the calibration in use before")
    after_s: float = Field(description="predicted with the refitted calibration")


class CalibrationResult(BaseModel):
    runs: list[CalibratedRun]
    skipped: list[str] = Field(description="completed runs left out, and why")
    fitted: list[str] = Field(description="the parameters the fit moved")
    before_median_error_pct: float
    after_median_error_pct: float
    path: str
    written: bool


class CalibrateError(ValueError):
    """Too few usable runs; the message says what to run."""


@dataclass(frozen=True, slots=True)
class _Sample:
    run_id: str
    derived: Derived
    spec: GPUSpec
    measured_s: float


def _measured_s(run: RunRecord) -> float | None:
    """The judged median step time of a valid run (judged by benchmark_result)."""
    res = run.result or {}
    if not res.get("valid"):
        return None
    med = ((res.get("metrics") or {}).get("step_time_ms") or {}).get("median")
    return float(med) / 1000.0 if isinstance(med, int | float) and med > 0 else None


def _sample(run: RunRecord) -> _Sample | str:
    """A run as a fit row, or why it cannot be one."""
    if not run.config:
        return "no config recorded"
    measured = _measured_s(run)
    if measured is None:
        return "no valid judged result (ask benchmark_result for it first)"
    gpu = ((run.contract or {}).get("hardware") or {}).get("gpu") \
        or (run.config.get("cluster") or {}).get("gpu")
    try:
        spec = lookup_gpu(str(gpu)) if gpu else None
        if spec is None:
            return "no GPU recorded"
        derived = derive(load_config(data=run.config))
        predict_step_time_s(derived, gpu=spec)
    except (ConfigError, ValueError) as exc:
        return str(exc).splitlines()[0][:160]
    return _Sample(run.id, derived, spec, measured)


def _median_error(ratios: list[float]) -> float:
    """Median |predicted / measured - 1|, in percent."""
    return statistics.median(abs(x - 1) for x in ratios) * 100.0


def calibrate(registry: Registry | None = None, out: Path | None = None,
              write: bool = True) -> CalibrationResult:
    """Refit on every completed, judged run with a config and a catalogued GPU."""
    reg = registry or Registry()
    rows: list[_Sample] = []
    skipped: list[str] = []
    for run in reg.list(state="completed", limit=RUN_LIMIT):
        got = _sample(run)
        if isinstance(got, _Sample):
            rows.append(got)
        else:
            skipped.append(f"{run.id}: {got}")
    if len(rows) < MIN_RUNS:
        raise CalibrateError(f"runs: {len(rows)} usable completed run(s) in {reg.path}, "
                             f"{MIN_RUNS} needed - run benchmarks with submit_benchmark, judge "
                             "them with benchmark_result, then calibrate")
    start = load_calibration()
    every = (*FITTED, *HOST)
    names = every if len(rows) >= FEW_RUNS else tuple(
        n for n in every if n.startswith("gen.") or n in ("layer_overhead_us", *HOST))
    after = fit(rows, start, names)  # type: ignore[arg-type]
    moved = [n for n in names if get(after, n) != get(start, n)]
    path = out or user_calibration_path()
    after = after.model_copy(update={
        "rows": [{"run_id": r.run_id, "gpu": r.spec.name, "measured_s": f"{r.measured_s:.4f}"}
                 for r in rows],
        "source": f"mbridge-perf calibrate on {len(rows)} completed runs of {reg.path}, "
                  f"from: {start.source[:120]}"})
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(json.loads(after.model_dump_json()), indent=1,
                                   sort_keys=True) + "\n", "utf-8")
    runs = [CalibratedRun(run_id=r.run_id, gpu=r.spec.name, measured_s=r.measured_s,
                          before_s=predict_step_time_s(r.derived, gpu=r.spec, calibration=start),
                          after_s=predict_step_time_s(r.derived, gpu=r.spec, calibration=after))
            for r in rows]
    return CalibrationResult(
        runs=runs, skipped=skipped, fitted=moved,
        before_median_error_pct=_median_error([r.before_s / r.measured_s for r in runs]),
        after_median_error_pct=_median_error([r.after_s / r.measured_s for r in runs]),
        path=str(path), written=write)
