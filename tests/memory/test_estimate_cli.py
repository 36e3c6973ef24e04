"""`mbridge-perf estimate`: the CLI door over estimate_memory (table, JSON, stage, exit codes)."""

from __future__ import annotations

import json
import subprocess

from helpers import REPO, tool

SEED = ["examples/llama3_70b_sft_h100.yaml", "--preset", "llama3-70b"]


def estimate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("mbridge-perf"), "estimate", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_json_carries_per_stage_peak_and_static() -> None:
    proc = estimate(*SEED, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert [s["stage"] for s in report["per_stage"]] == [0, 1, 2, 3]
    for s in report["per_stage"]:
        assert 0 < s["static_gib"] < s["peak_allocated_gib"]
    assert report["peak_allocated_gib"] == max(s["peak_allocated_gib"]
                                               for s in report["per_stage"])


def test_stage_last_shows_the_last_stage_in_full() -> None:
    proc = estimate(*SEED, "--stage", "last")
    assert proc.returncode == 0, proc.stderr
    assert "stage 3" in proc.stdout and "logits" in proc.stdout


def test_does_not_fit_exits_1_and_bad_input_exits_2() -> None:
    no_distopt = estimate(*SEED, "--set", "optimizer.use_distributed_optimizer=false",
                          "--set", "ddp.use_distributed_optimizer=false", "--set",
                          "mixed_precision.grad_reduce_in_fp32=true")
    assert no_distopt.returncode == 1, no_distopt.stdout
    assert "DOES NOT FIT" in no_distopt.stdout
    bad = estimate(*SEED, "--gpu", "h900")
    assert bad.returncode == 2 and bad.stderr.startswith("error: gpu: unknown GPU")
    stage = estimate(*SEED, "--stage", "first")
    assert stage.returncode == 2 and "--stage" in stage.stderr
