"""Benchmarks through a REAL single-node Slurm (scripts/dev-slurm.sh: slurmctld, slurmd, munge
from Debian packages): a Megatron-Core GPT training run on CPU end to end, and the faults a user
meets — a job that exits non-zero, one that is cancelled, one that hits its time limit, a NaN
loss in the measured window, a truncated log, the controller going away while a run is polled,
and the server restarting between submit and result.

The module starts a private cluster (own directory and ports) and removes it afterwards.
Skipped only where Slurm cannot start AND MBRIDGE_PERF_REQUIRE_SLURM is not "1" (CI sets it, so
there a cluster that does not start is a failure). Time: the time-limit job is submitted first
and checked last (Slurm's limit is at least a minute and is enforced on a ~30 s tick); every
other test runs while it waits.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mbridge_perf.bench.executors import (
    CancelRefused,
    SlurmBinaries,
    SlurmExecutor,
    SubmitError,
    cancel_run,
    refresh_run,
    submit_run,
    wait_run,
)
from mbridge_perf.bench.logparse import parse_log
from mbridge_perf.bench.profile import ClusterProfile, load_profile
from mbridge_perf.bench.registry import Registry, RunRecord
from mbridge_perf.bench.result import evaluate
from mbridge_perf.config.load import load_config

from helpers import REPO, require_megatron

SCRIPT = REPO / "scripts" / "dev-slurm.sh"
ITER = re.compile(r"^ \[[\d\- :]+\] iteration\s+(\d+)/\s*(\d+) \|(.*)$")
TP2 = {"model": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
       "train": {"micro_batch_size": 2}}
DP2 = {"train": {"micro_batch_size": 1}}
FINISHED = frozenset({"completed", "failed", "cancelled", "timeout"})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _dev_slurm(env: dict[str, str], *args: str, timeout: float = 900
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout, check=False, env=env)


@pytest.fixture(scope="module")
def slurm() -> Iterator[dict[str, Any]]:
    """A private cluster for this module (its own directory and ports, config not copied to
    /etc), so test sessions running side by side, or a developer's own cluster, do not meet;
    stopped and removed afterwards."""
    base = tempfile.mkdtemp(prefix="mbridge-slurm-test-", dir="/tmp")
    os.chmod(base, 0o755)  # munged wants every directory above its socket searchable
    env = {**os.environ, "MBRIDGE_SLURM_DIR": base, "MBRIDGE_SLURM_WRITE_ETC": "0",
           "MBRIDGE_SLURM_CTLD_PORT": str(_free_port()),
           "MBRIDGE_SLURM_SLURMD_PORT": str(_free_port())}
    t0 = time.monotonic()
    res = _dev_slurm(env, "start")
    if res.returncode != 0:
        _dev_slurm(env, "stop", "--purge")
        shutil.rmtree(base, ignore_errors=True)
        why = f"scripts/dev-slurm.sh start failed (exit {res.returncode}):\n{res.stderr[-3000:]}"
        if os.environ.get("MBRIDGE_PERF_REQUIRE_SLURM") == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    info = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    assert info["NODE_STATE"] == "idle", res.stdout
    info["start_s"] = f"{time.monotonic() - t0:.2f}"
    yield {**info, "env": env}
    _dev_slurm(env, "stop", "--purge")
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm_env(slurm: dict[str, Any]) -> dict[str, Any]:
    require_megatron()
    return {"executor": SlurmExecutor(slurm_conf=slurm["SLURM_CONF"])}


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory, slurm: dict[str, Any]) -> Iterator[Registry]:
    registry = Registry(tmp_path_factory.mktemp("registry") / "runs.sqlite3")
    yield registry
    executor = SlurmExecutor(slurm_conf=slurm["SLURM_CONF"])
    for run in registry.list(state=["pending", "running", "unknown"], limit=1000):
        with contextlib.suppress(Exception):  # leave no job of ours behind
            cancel_run(registry, run.id, executor=executor)


def cpu_profile(reg: Registry, **update: Any) -> ClusterProfile:
    base = load_profile("cpu-test")
    return base.model_copy(update={"executor": "slurm", "log_dir": str(reg.runs_dir),
                                   "time_limit": "00:05:00", **update})


def submit(reg: Registry, env: dict[str, Any], data: dict, steps: int = 50,
           **profile: Any) -> RunRecord:
    return submit_run(reg, load_config(data=data), cpu_profile(reg, **profile), steps=steps,
                      executor=env["executor"])


def wait(reg: Registry, env: dict[str, Any], run: RunRecord, timeout_s: float = 180,
         until: frozenset[str] = FINISHED) -> RunRecord:
    return wait_run(reg, run.id, timeout_s=timeout_s, poll_s=0.5, executor=env["executor"],
                    until=until)


def wait_for_log(run: RunRecord, pattern: str, timeout_s: float = 120) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = Path(run.log_path or "").read_text() if Path(run.log_path or "").exists() else ""
        if re.search(pattern, text, re.M):
            return text
        time.sleep(0.25)
    raise AssertionError(f"{pattern!r} never appeared in {run.log_path}")


def explain(run: RunRecord) -> str:
    """A failure message: the run's state and message and the end of its log."""
    log = Path(run.log_path or "")
    tail = log.read_text()[-2500:] if log.is_file() else "(no log)"
    return f"{run.state}: {run.message}\n--- log tail ---\n{tail}"


def iterations(text: str) -> dict[int, str]:
    """Iteration number → the rest of its line (complete lines only)."""
    out = {}
    for line in text.splitlines(keepends=True):
        m = ITER.match(line.rstrip("\n"))
        if m and line.endswith("\n"):
            out[int(m.group(1))] = m.group(3)
    return out


def window_problems(text: str, window: tuple[int, int] = (41, 50)) -> list[str]:
    """What would make the steady window invalid, read from the raw lines, independently of
    the project's parser."""
    its = iterations(text)
    problems = [f"iteration {i} missing" for i in range(window[0], window[1] + 1)
                if i not in its]
    for i in range(window[0], window[1] + 1):
        rest = its.get(i)
        if rest is None:
            continue
        loss = re.search(r"lm loss: (\S+) \|", rest)
        if loss is None or not math.isfinite(float(loss.group(1))):
            problems.append(f"iteration {i}: no finite lm loss")
        counts = re.search(r"skipped iterations:\s+(\d+) \| number of nan iterations:\s+(\d+)",
                           rest)
        if counts is None or counts.groups() != ("0", "0"):
            problems.append(f"iteration {i}: skipped/nan {counts and counts.groups()}")
    return problems


# ------------------------------------------------------------------ tests, in run order

@pytest.fixture(scope="module")
def timeout_run(reg: Registry, slurm_env: dict[str, Any]) -> RunRecord:
    """A run that cannot finish inside its 1-minute limit (250 s of steps)."""
    return submit(reg, slurm_env, DP2, steps=50, time_limit="1",
                  launcher_args=["--sleep-per-step", "5"])


def test_time_limit_job_is_queued(timeout_run: RunRecord, reg: Registry,
                                  slurm_env: dict[str, Any]) -> None:
    assert timeout_run.executor == "slurm" and timeout_run.external_id
    assert refresh_run(reg, timeout_run.id, executor=slurm_env["executor"]).state in (
        "pending", "running")


@pytest.fixture(scope="module")
def trained(reg: Registry, slurm_env: dict[str, Any]) -> RunRecord:
    t0 = time.monotonic()
    run = submit(reg, slurm_env, TP2, steps=50)
    run = wait(reg, slurm_env, run)
    run.message += f" [{time.monotonic() - t0:.1f}s]"
    return run


def test_training_run_end_to_end(trained: RunRecord) -> None:
    """sbatch → srun → torchrun (2 ranks, TP2+SP over gloo) → 50 Megatron-format steps."""
    text = Path(trained.log_path or "").read_text()
    assert trained.state == "completed", explain(trained)
    assert trained.exit_code == 0 and "COMPLETED" in trained.message
    its = iterations(text)
    assert sorted(its) == list(range(1, 51))
    assert window_problems(text) == []
    assert re.search(r"^ \[.*\] iteration       50/      50 \| consumed samples:\s+100 \| "
                     r"elapsed time per iteration \(ms\): \d+\.\d \| throughput per GPU "
                     r"\(TFLOP/s/GPU\): \d+\.\d \| learning rate: \d\.\d{6}E[+-]\d\d \| "
                     r"global batch size:\s+2 \| lm loss: \d\.\d{6}E\+00 \| loss scale: 1\.0 \| "
                     r"grad norm: \d+\.\d{3} \| number of skipped iterations:\s+0 \| "
                     r"number of nan iterations:\s+0 \|$", text, re.M)
    assert len(re.findall(r"^Step Time : [\d.]+s GPU utilization: [\d.]+MODEL_TFLOP/s/GPU$",
                          text, re.M)) == 50
    assert len(re.findall(r"^\[Rank [01]\] \(after [12] iterations\) memory \(GB\)", text,
                          re.M)) == 4
    assert "srun" in text and "--nproc_per_node=2" in text  # the launch line
    parsed = parse_log(trained.log_path or "")
    assert (parsed.iteration_lines, parsed.max_iteration, parsed.malformed) == (50, 50, 0)
    assert parsed.completed and parsed.step_time_lines == 50 and len(parsed.memory) == 4
    assert parsed.skipped_iterations == 0 and parsed.nan_iterations == 0
    window = parsed.window(41, 50)
    assert [r.iteration for r in window] == list(range(41, 51))
    assert all(r.finite and "lm loss" in r.losses for r in window)
    assert parsed.get(50).losses["lm loss"] < parsed.get(1).losses["lm loss"]  # it trained
    # the result gates and steady-window metrics (window 41-50)
    result = evaluate(parsed, window=(41, 50), seq_length=64, global_batch_size=2, num_gpus=2,
                      exit_code=trained.exit_code)
    assert result.valid and result.outcome == "pass", [g for g in result.gates if not g.passed]
    m = result.metrics
    assert m.step_time_ms is not None and m.step_time_ms.n == 10 and m.step_time_ms.median > 0
    assert m.tokens_per_sec_per_gpu is not None and m.tokens_per_sec_per_gpu.median > 0
    assert math.isfinite(m.losses_last["lm loss"]) and m.nan_iterations == 0
    assert result.memory is not None and result.memory.ranks_reporting == 2


def test_truncated_log(trained: RunRecord, tmp_path: Path) -> None:
    """The log of a run cut off mid-line in iteration 45 (node lost, disk full)."""
    text = Path(trained.log_path or "").read_text()
    cut = text.index(" iteration       45/") + 40
    partial = tmp_path / "truncated.log"
    partial.write_text(text[:cut])
    its = iterations(partial.read_text())
    assert max(its) == 44 and 45 not in its  # the partial line is not taken as a step
    assert "iteration 45 missing" in window_problems(partial.read_text())
    parsed = parse_log(partial)
    assert parsed.max_iteration == 44 and not parsed.completed
    assert parsed.truncated_tail and "iteration       45/" in parsed.truncated_tail
    assert len(parsed.window(41, 50)) == 4
    result = evaluate(parsed, window=(41, 50))
    assert not result.valid
    failed = {g.name for g in result.gates if not g.passed}
    assert {"completed", "steps"} <= failed


def test_forgotten_job_falls_back_to_sacct_completion(trained: RunRecord, reg: Registry,
                                                     slurm: dict[str, Any],
                                                     tmp_path: Path) -> None:
    """When the controller no longer knows a job (purged), its end comes from accounting —
    here `sacct --completion` (no slurmdbd) reading the job-completion log; a job in neither
    is 'lost'. The squeue binary is swapped for one that has forgotten everything."""
    forgetful = tmp_path / "squeue"
    forgetful.write_text("#!/bin/sh\necho 'slurm_load_jobs error: Invalid job id specified' >&2"
                         "\nexit 1\n")
    forgetful.chmod(0o755)
    ex = SlurmExecutor(binaries=SlurmBinaries(squeue=str(forgetful)),
                       slurm_conf=slurm["SLURM_CONF"])
    status = ex.status(trained)
    assert (status.state, status.exit_code, status.external_state) == (
        "completed", 0, "COMPLETED"), status.message
    ghost = reg.create(executor="slurm", state="running", external_id="987654")
    status = ex.status(ghost)
    assert status.state == "lost"
    assert "Slurm has no record of job 987654" in status.message
    assert "sacct --completion: no record" in status.message


def test_job_that_exits_3(reg: Registry, slurm_env: dict[str, Any]) -> None:
    """A batch script that exits 3 → failed with exit code 3; a training worker that exits 3
    → torchrun exits 1, and the message names the worker's code from torchrun's summary."""
    fake = submit(reg, slurm_env, {}, steps=1, launcher="cpu-gpt",
                  torchrun=[sys.executable, "-c", "import sys; sys.exit(3)"])
    worker = submit(reg, slurm_env, DP2, steps=6, launcher_args=["--exit-code", "3",
                                                                 "--exit-after", "3"])
    fake = wait(reg, slurm_env, fake)
    assert (fake.state, fake.exit_code) == ("failed", 3), explain(fake)
    assert "FAILED: exit code 3:0" in fake.message and "NonZeroExitCode" in fake.message
    worker = wait(reg, slurm_env, worker)
    log = Path(worker.log_path or "").read_text()
    assert (worker.state, worker.exit_code) == ("failed", 1), explain(worker)
    assert re.search(r"torchrun root cause: rank [01] exited with code 3$", worker.message)
    assert sorted(iterations(log)) == [1, 2, 3]


def test_cancel(reg: Registry, slurm_env: dict[str, Any]) -> None:
    run = submit(reg, slurm_env, DP2, steps=50, launcher_args=["--sleep-per-step", "2"])
    wait_for_log(run, r"iteration\s+1/")
    run = cancel_run(reg, run.id, executor=slurm_env["executor"])
    assert run.state == "cancelled" and "scancel" in run.message
    status = slurm_env["executor"].status(run)
    deadline = time.monotonic() + 30
    while status.external_state != "CANCELLED" and time.monotonic() < deadline:
        time.sleep(0.5)
        status = slurm_env["executor"].status(run)
    assert (status.state, status.external_state, status.signal) == ("cancelled", "CANCELLED", 15)
    assert refresh_run(reg, run.id, executor=slurm_env["executor"]).state == "cancelled"


def test_cancel_refuses_foreign_jobs(reg: Registry, slurm: dict[str, Any],
                                     slurm_env: dict[str, Any], tmp_path: Path) -> None:
    ex: SlurmExecutor = slurm_env["executor"]
    with pytest.raises(CancelRefused, match="not submitted through the registry"):
        ex.cancel("999999", reg)
    job = tmp_path / "foreign.sh"
    job.write_text("#!/bin/bash\nsleep 30\n")
    res = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/f.out", str(job)],
                         capture_output=True, text=True, cwd=tmp_path, check=True,
                         env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]})
    foreign = res.stdout.strip().split(";")[0]
    try:
        with pytest.raises(CancelRefused):
            ex.cancel(foreign, reg)
        # a run whose job id Slurm has since given to another job (state reset): not ours
        stale = reg.create(executor="slurm", state="running", external_id=foreign)
        status = ex.status(stale)
        assert status.state == "lost" and "id was reused" in status.message
        with pytest.raises(CancelRefused, match="id was reused"):
            ex.cancel(foreign, reg)
        reg.update_state(stale.id, "lost", message=status.message)
        state = subprocess.run(["squeue", "-h", "-t", "all", "-j", foreign, "-o", "%T"],
                               capture_output=True, text=True, check=True,
                               env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]})
        assert state.stdout.strip() in ("PENDING", "RUNNING")
    finally:  # our own test job
        subprocess.run(["scancel", foreign], check=False,
                       env={**os.environ, "SLURM_CONF": slurm["SLURM_CONF"]})


def test_rejected_submission_is_recorded(reg: Registry, slurm_env: dict[str, Any]) -> None:
    with pytest.raises(SubmitError, match=r"sbatch rejected the job: .*invalid partition"):
        submit(reg, slurm_env, DP2, partition="nosuchpart")
    failed = reg.list(state="failed", limit=1)[0]
    assert "invalid partition" in failed.message and failed.external_id is None
    assert failed.script and "#SBATCH --partition=nosuchpart" in failed.script


def test_nan_loss_inside_the_window(reg: Registry, slurm_env: dict[str, Any]) -> None:
    run = wait(reg, slurm_env, submit(reg, slurm_env, TP2, steps=50,
                                      launcher_args=["--inject-nan-at", "45"]))
    text = Path(run.log_path or "").read_text()
    assert run.state == "completed", run.message  # the job ran fine; the measurement did not
    its = iterations(text)
    assert sorted(its) == list(range(1, 51))
    assert "lm loss" not in its[45] and "number of nan iterations:   1 |" in its[45]
    assert "number of skipped iterations:   1 |" in its[45]
    assert window_problems(text) == ["iteration 45: no finite lm loss",
                                     "iteration 45: skipped/nan ('1', '1')"]
    parsed = parse_log(run.log_path or "")
    row = parsed.get(45)
    assert row is not None and "lm loss" not in row.losses
    assert (row.skipped_iterations, row.nan_iterations, parsed.nan_iterations) == (1, 1, 1)
    result = evaluate(parsed, window=(41, 50))
    assert not result.valid
    failed = {g.name for g in result.gates if not g.passed}
    assert {"no_skipped_iterations", "no_nan_iterations"} <= failed, failed
    assert result.metrics.nan_iterations == 1


def test_controller_down_while_polling(reg: Registry, slurm: dict[str, Any],
                                       slurm_env: dict[str, Any]) -> None:
    """slurmctld stops while a run is polled: state 'unknown' with a clear message, the record
    intact; once the controller is back (same saved state) the run is followed to the end."""
    ex: SlurmExecutor = slurm_env["executor"]
    run = submit(reg, slurm_env, DP2, steps=8, launcher_args=["--sleep-per-step", "1"])
    run = wait(reg, slurm_env, run, until=frozenset({"running"}) | FINISHED)
    assert run.state == "running"
    # the job is running once its batch script starts; its srun step needs the controller to
    # confirm the allocation, so stop the controller only once the step itself is training
    wait_for_log(run, r"iteration\s+1/")
    before = reg.get(run.id)
    pid_file = Path(slurm["SLURM_LOCAL_DIR"]) / "run" / "slurmctld.pid"
    pid = int(pid_file.read_text().strip())
    assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld"
    os.kill(pid, signal.SIGTERM)  # the controller this module's fixture started
    try:
        deadline = time.monotonic() + 15
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        polled = refresh_run(reg, run.id, executor=ex)
        assert polled.state == "unknown"
        assert "slurmctld is unreachable" in polled.message
        assert "run record is intact" in polled.message
        after = reg.get(run.id)
        for field in ("external_id", "script", "script_path", "log_path", "config", "profile",
                      "created_at"):
            assert getattr(after, field) == getattr(before, field), field
        assert run.id in {r.id for r in reg.list(limit=1000)}
    finally:
        res = _dev_slurm(slurm["env"], "start")
        assert res.returncode == 0, res.stderr
    assert "restarting it alone" in res.stderr
    run = wait(reg, slurm_env, run)
    assert run.state == "completed", explain(run)
    assert sorted(iterations(Path(run.log_path or "").read_text())) == list(range(1, 9))


def test_server_restart_picks_up_the_run(reg: Registry, slurm: dict[str, Any],
                                         slurm_env: dict[str, Any]) -> None:
    """A run submitted by one Python process is followed to its end by another."""
    res = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from mbridge_perf.bench.executors import submit_run
        from mbridge_perf.bench.profile import load_profile
        from mbridge_perf.bench.registry import Registry
        from mbridge_perf.config.load import load_config
        reg = Registry(sys.argv[1])
        prof = load_profile("cpu-test").model_copy(update={
            "executor": "slurm", "log_dir": str(reg.runs_dir), "time_limit": "00:05:00",
            "slurm_conf": sys.argv[2]})
        run = submit_run(reg, load_config(data={"train": {"micro_batch_size": 1}}), prof,
                         steps=5)
        print(run.id, run.external_id)
    """), str(reg.path), slurm["SLURM_CONF"]], capture_output=True, text=True,
        stdin=subprocess.DEVNULL, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    run_id, job_id = res.stdout.split()
    fresh = Registry(reg.path)  # the restarted server: its executor comes from the record
    run = wait_run(fresh, run_id, timeout_s=180, poll_s=0.5)
    assert (run.state, run.external_id) == ("completed", job_id), explain(run)
    assert sorted(iterations(Path(run.log_path or "").read_text())) == [1, 2, 3, 4, 5]


def test_env_cannot_move_the_rendezvous(reg: Registry, slurm: dict[str, Any]) -> None:
    """Issue 23: `env.SLURM_JOB_NODELIST=attacker.example.com env.SLURM_JOB_NUM_NODES=2` once
    rendered `--rdzv-endpoint=attacker.example.com:29500` on this cluster. A config's env is
    refused before anything reaches Slurm; the same names in the user's own profile env are
    exported only after the job read Slurm's values, so torchrun meets where Slurm says."""
    ex = SlurmExecutor(slurm_conf=slurm["SLURM_CONF"])
    echo = [sys.executable, "-c",
            "import json, sys; print('ECHO ' + json.dumps(sys.argv[1:]), flush=True)"]
    attack = ["env.SLURM_JOB_NODELIST=attacker.example.com", "env.SLURM_JOB_NUM_NODES=2"]
    for overrides in (attack, ["env.SLURM_TASK_PROLOG=/tmp/x.sh"], ["env.SLURM_PROLOG=/x"],
                      ["env.SLURM_EPILOG=/x"], ["env.SLURM_TASK_EPILOG=/x"]):
        with pytest.raises(ValueError, match=r"env\.SLURM_\w+: .*only the launcher"):
            submit_run(reg, load_config(data=DP2, overrides=overrides),
                       cpu_profile(reg, torchrun=echo), steps=1, executor=ex)
    assert all(r.external_id is None for r in reg.list(limit=1000)
               if r.state == "failed" and "rendered" in r.message)
    prof = cpu_profile(reg, torchrun=echo, env={"SLURM_JOB_NODELIST": "attacker.example.com",
                                                "SLURM_JOB_NUM_NODES": "2"})
    run = wait(reg, {"executor": ex}, submit_run(reg, load_config(data=DP2), prof, steps=1,
                                                 executor=ex), timeout_s=120)
    log = Path(run.log_path or "").read_text()
    assert run.state == "completed", explain(run)
    argv = json.loads(next(line for line in log.splitlines() if line.startswith("ECHO "))[5:])
    assert argv[0] == "--standalone", argv  # one node: the real allocation, not the profile's
    assert "attacker" not in " ".join(argv)


def test_time_limit_hit(timeout_run: RunRecord, reg: Registry,
                        slurm_env: dict[str, Any]) -> None:
    run = wait(reg, slurm_env, timeout_run, timeout_s=200)
    assert run.state == "timeout", explain(run)
    assert "TIMEOUT" in run.message
    text = Path(run.log_path or "").read_text()
    assert "DUE TO TIME LIMIT" in text  # what slurmstepd writes, as on a real cluster
    assert 1 <= len(iterations(text)) < 50
