"""The step-time model's expected change for an A/B, next to the measured one.

Why: a measured A/B says what changed; it cannot say whether that was the change to expect. The
registry keeps each run's config, so the model prices both sides on the run's own GPU and the
comparison shows the predicted step-time change beside the measured one. A gap wider than the
model's pair band (the calibration's ``pair_band_frac``: its p80 error on measured pairs) is
named: either the run did something the config does not say (check the contract), or the model
is off for this cluster (``mbridge-perf calibrate`` refits it on the user's runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, Field

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.steptime import Calibration, load_calibration, predict_step_time_s


class PredictedChange(BaseModel):
    a_step_time_s: float | None = Field(description="estimate_step_time of run a's config")
    b_step_time_s: float | None
    predicted_change_pct: float | None = Field(description="step time, b vs a, predicted")
    measured_change_pct: float | None = Field(description="median step time, b vs a, measured")
    band_pct: float = Field(description="the model's pair band: differences within it agree")
    verdict: Literal["as_expected", "differs", "not_predicted"]
    note: str


def _predict(cfg: Mapping[str, Any] | None, gpu: str | None,
             cal: Calibration) -> tuple[float | None, str]:
    if not cfg:
        return None, "the registry holds no config for it"
    try:
        tc = load_config(data=dict(cfg))
        return predict_step_time_s(tc, gpu=gpu or None, calibration=cal), ""
    except (ConfigError, ValueError) as exc:
        return None, str(exc).splitlines()[0][:200]


def predicted_change(cfg_a: Mapping[str, Any] | None, cfg_b: Mapping[str, Any] | None,
                     gpu_a: str | None, gpu_b: str | None, measured_change_pct: float | None,
                     calibration: Calibration | None = None) -> PredictedChange:
    """Both sides priced on their run's GPU; the verdict compares the two changes as ratios."""
    cal = calibration or load_calibration()
    band = cal.pair_band_frac * 100.0
    a, why_a = _predict(cfg_a, gpu_a, cal)
    b, why_b = _predict(cfg_b, gpu_b, cal)
    if a is None or b is None:
        why = why_a or why_b
        return PredictedChange(a_step_time_s=a, b_step_time_s=b, predicted_change_pct=None,
                               measured_change_pct=measured_change_pct, band_pct=band,
                               verdict="not_predicted",
                               note=f"no prediction for run {'a' if a is None else 'b'}: {why}")
    pred = (b / a - 1.0) * 100.0
    out = {"a_step_time_s": round(a, 4), "b_step_time_s": round(b, 4),
           "predicted_change_pct": round(pred, 2), "measured_change_pct": measured_change_pct,
           "band_pct": band}
    if measured_change_pct is None:
        return PredictedChange(**out, verdict="not_predicted",
                               note=f"predicted {pred:+.1f} % step time; nothing measured to "
                                    "compare with")
    gap = (1 + measured_change_pct / 100) / (1 + pred / 100) - 1
    if abs(gap) * 100 <= band:
        return PredictedChange(**out, verdict="as_expected",
                               note=f"measured {measured_change_pct:+.1f} %, predicted "
                                    f"{pred:+.1f} %: within the model's pair band (±{band:.0f} %)")
    return PredictedChange(**out, verdict="differs",
                           note=f"measured {measured_change_pct:+.1f} %, predicted {pred:+.1f} %: "
                                f"{abs(gap):.0%} apart, beyond the model's pair band "
                                f"(±{band:.0f} %) - check that the runs did what their configs "
                                "say (the contract), or refit the model on this cluster's runs "
                                "with `mbridge-perf calibrate`")
