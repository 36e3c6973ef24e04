"""Per-layout step-time model (model.py) and its calibration (calibration.py)."""

from mbridge_perf.steptime.calibration import Calibration, GenParams, load_calibration
from mbridge_perf.steptime.model import (
    StepTimeReport,
    Term,
    estimate_step_time,
    predict_step_time_s,
)

__all__ = ["Calibration", "GenParams", "StepTimeReport", "Term", "estimate_step_time",
           "load_calibration", "predict_step_time_s"]
