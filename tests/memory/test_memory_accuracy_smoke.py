"""Smoke run of benchmarks/memory_accuracy.py on a few rows of the measured data (copied into
tests/memory/fixtures from the Megatron-LM CI goldens and Bridge skill cards): it must model
or explicitly list every row and print the per-family summary. The full run's figures are in
the issue note; accuracy targets are not asserted here."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from helpers import REPO

FIXTURES = Path(__file__).parent / "fixtures"
CI = FIXTURES / "megatron-ci-goldens-sample.csv"
CARDS = FIXTURES / "bridge-skill-cards-sample.csv"


def test_accuracy_benchmark_accounts_for_every_row() -> None:
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "memory_accuracy.py"),
                           str(CI), str(CARDS)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for family in ("dense", "MoE", "MLA", "recompute", "FP8", "offload"):
        assert f"family: {family}" in out
    modelled = int(out.split("modelled rows: ")[1].split(";")[0])
    listed = int(out.split("listed, not modelled: ")[1].split()[0])
    with CI.open() as f:
        ci_rows = sum(1 for _ in csv.DictReader(f))
    assert listed >= 1 and modelled >= ci_rows - listed  # card rows add more modelled ones
    # the seeds' row: estimate within 15 % of the measured 58.8 GB (54.8 GiB) on rank 0
    seed = next(line for line in out.splitlines()
                if line.startswith("llama70b_sft_baseline_no_expseg"))
    error = float(seed.split("%")[0].split()[-1])
    assert abs(error) < 15
