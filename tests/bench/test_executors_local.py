"""The local executor: the same batch script run with bash on this machine — a real Megatron-Core
training run end to end, exit codes, cancel, and a restarted process picking a run up."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mbridge_perf.bench.executors import (
    CancelRefused,
    LocalExecutor,
    cancel_run,
    refresh_run,
    submit_run,
    wait_run,
)
from mbridge_perf.bench.launch import exit_file
from mbridge_perf.bench.logparse import parse_log
from mbridge_perf.bench.profile import load_profile
from mbridge_perf.bench.registry import Registry
from mbridge_perf.bench.result import evaluate
from mbridge_perf.config.load import load_config

from helpers import require_megatron

ITER = re.compile(r"^ \[[\d\- :]+\] iteration\s+(\d+)/\s*(\d+) \|.*")


def fake_profile(tmp_path: Path, code: str, **extra: object):
    """A local profile whose "torchrun" is a Python snippet: fast executor tests."""
    return load_profile({"name": "fake", "executor": "local", "log_dir": str(tmp_path / "runs"),
                         "torchrun": [sys.executable, "-c", code], **extra})


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "runs.sqlite3")


def iteration_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if ITER.match(line)]


def test_cpu_workload_end_to_end(reg: Registry) -> None:
    """TP2 + SP over gloo, 50 steps, through the built-in cpu-test profile."""
    require_megatron()
    cfg = load_config(data={"model": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
                            "train": {"micro_batch_size": 2}})
    t0 = time.monotonic()
    run = submit_run(reg, cfg, "cpu-test", steps=50)
    assert run.state == "running" and run.external_id and run.external_id.isdigit()
    run = wait_run(reg, run.id, timeout_s=240, poll_s=0.5)
    log = Path(run.log_path or "").read_text()
    assert run.state == "completed", (run.message, log[-3000:])
    assert run.exit_code == 0 and Path(exit_file(run.log_path or "")).read_text().strip() == "0"
    lines = iteration_lines(log)
    assert [int(ITER.match(x).group(1)) for x in lines] == list(range(1, 51))  # type: ignore
    window = lines[40:50]
    losses = [float(re.search(r"lm loss: (\S+) \|", x).group(1)) for x in window]  # type: ignore
    assert all(math.isfinite(v) and v > 0 for v in losses)
    assert all("number of skipped iterations:   0 | number of nan iterations:   0 |" in x
               for x in window)
    assert len(re.findall(r"^Step Time : \d+\.\d\ds GPU utilization: \d+\.\dMODEL_TFLOP/s/GPU$",
                          log, re.M)) == 50
    # TP2: both ranks are data-parallel rank 0 → two memory lines per report
    assert len(re.findall(r"^\[Rank [01]\] \(after [12] iterations\) memory \(GB\) \| "
                          r"mem-allocated-gigabytes: [\d.]+ \|", log, re.M)) == 4
    assert "memory lines are synthetic CPU figures" in log
    parsed = parse_log(run.log_path or "")
    assert (parsed.iteration_lines, parsed.malformed, parsed.nan_iterations) == (50, 0, 0)
    assert parsed.completed and len(parsed.memory) == 4 and parsed.step_time_lines == 50
    assert all(r.finite for r in parsed.window(41, 50))
    result = evaluate(parsed, window=(41, 50), seq_length=64, global_batch_size=2, num_gpus=2,
                      exit_code=run.exit_code)
    assert result.valid, [g for g in result.gates if not g.passed]
    assert result.metrics.step_time_ms is not None and result.metrics.step_time_ms.n == 10
    assert "world 2, TP 2, SP True, DP 1" in log
    print(f"local cpu workload: {time.monotonic() - t0:.1f}s")


def test_exit_code_and_a_new_process_picks_the_run_up(reg: Registry, tmp_path: Path) -> None:
    """A run started by one process is read back by another (the server restarted), exit
    code included, from the file the script's EXIT trap writes."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from mbridge_perf.bench.executors import submit_run
        from mbridge_perf.bench.profile import load_profile
        from mbridge_perf.bench.registry import Registry
        from mbridge_perf.config.load import load_config
        prof = load_profile({"name": "fake", "executor": "local", "log_dir": sys.argv[2],
                             "torchrun": [sys.executable, "-c",
                                          "import sys, time; time.sleep(1); sys.exit(3)"]})
        run = submit_run(Registry(sys.argv[1]), load_config(data={}), prof, recipe="r")
        print(run.id)
    """), str(reg.path), str(tmp_path / "runs")], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    assert reg.get(run_id).state == "running"
    run = wait_run(Registry(reg.path), run_id, timeout_s=60, poll_s=0.2)
    assert (run.state, run.exit_code) == ("failed", 3)
    assert "exited with code 3" in run.message


def test_cancel_stops_the_whole_process_tree(reg: Registry, tmp_path: Path) -> None:
    prof = fake_profile(tmp_path, "import subprocess, sys, time; subprocess.Popen([sys.executable,"
                        " '-c', 'import time; time.sleep(120)'], start_new_session=True); "
                        "print('READY' + '-TO-CANCEL', flush=True); time.sleep(120)")
    run = submit_run(reg, load_config(data={}), prof, recipe="r")
    deadline = time.monotonic() + 30  # (the launch line echoes the code, hence the '+')
    while "READY-TO-CANCEL" not in Path(run.log_path or "").read_text() and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    pid = int(run.external_id or 0)
    tree = [pid, *_children_of(pid)]
    assert len(tree) >= 3  # bash, the fake torchrun, its worker in another session
    t0 = time.monotonic()
    run = cancel_run(reg, run.id)
    assert run.state == "cancelled" and time.monotonic() - t0 < 20
    assert not [p for p in tree if _alive(p)]
    assert refresh_run(reg, run.id).state == "cancelled"  # a late poll keeps it


def test_cancel_also_stops_a_worker_that_left_the_process_tree(
        reg: Registry, tmp_path: Path) -> None:
    """The fake torchrun starts its worker through a helper that exits at once, so the worker
    is not below the job's bash when cancel lists the tree (as a worker spawned after the
    listing, or orphaned when torchrun dies first: a cancel right after submit left two cpu_gpt
    workers training for an hour). The run's MBRIDGE_PERF_RUN_ID in its environment finds it."""
    worker = tmp_path / "worker.py"
    worker.write_text("import time\nprint('WORKER' + '-UP', flush=True)\ntime.sleep(120)\n")
    spawner = tmp_path / "spawner.py"
    spawner.write_text(f"import subprocess, sys\nsubprocess.Popen([sys.executable, "
                       f"{str(worker)!r}], start_new_session=True)\n")
    prof = fake_profile(tmp_path, f"import subprocess, sys, time; subprocess.run("
                                  f"[sys.executable, {str(spawner)!r}]); time.sleep(120)")
    run = submit_run(reg, load_config(data={}), prof, recipe="r")
    deadline = time.monotonic() + 30
    while "WORKER-UP" not in Path(run.log_path or "").read_text() and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    from mbridge_perf.bench.executors import _tagged

    pid = int(run.external_id or 0)
    orphans = [p for p in _tagged(run.id) if p not in [pid, *_children_of(pid)]]
    assert orphans, "the worker should have left the job's tree"
    assert cancel_run(reg, run.id).state == "cancelled"
    assert not [p for p in orphans if _alive(p)]


def test_cancel_refuses_what_the_registry_did_not_start(reg: Registry) -> None:
    with pytest.raises(CancelRefused, match="not started through the registry"):
        LocalExecutor().cancel(str(os.getpid()), reg)


def test_a_vanished_process_is_lost_not_failed(reg: Registry, tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text("exit 0\n")
    run = reg.create(executor="local", state="running", external_id="999999999",
                     script_path=str(script), log_path=str(tmp_path / "train.log"))
    run = refresh_run(reg, run.id)
    assert run.state == "lost" and "left no exit status" in run.message
    assert reg.get(run.id).script_path == str(script)


def _children_of(pid: int) -> list[int]:
    from mbridge_perf.bench.executors import _descendants

    return _descendants(pid)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
