"""The calibration script reproduces the shipped data file from ../shared/data/steptime."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers import SHARED_DATA, requires_shared_data

ROOT = Path(__file__).resolve().parents[2]
DATA = SHARED_DATA


@requires_shared_data
def test_fit_reproduces_the_shipped_calibration() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_steptime.py"), "--check",
                          "--data", str(DATA)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr + out.stdout


def test_shipped_calibration_records_its_rows() -> None:
    import json

    from mbridge_perf.steptime.calibration import CALIBRATION_FILE
    data = json.loads(CALIBRATION_FILE.read_text("utf-8"))
    assert data["rows"] and all({"recipe_dump", "release"} <= r.keys() for r in data["rows"])
    assert data["fitted"]
