"""The run registry: what a user relies on when they come back to a run — from another process,
after a server restart, while another process writes."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mbridge_perf.bench.registry import TERMINAL_STATES, Registry, RunNotFound, default_path

PY = sys.executable


def run_py(code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run code in a fresh interpreter (a "restarted server")."""
    return subprocess.run([PY, "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=timeout, check=False)


@pytest.fixture
def reg(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "runs.sqlite3")


def test_create_get_roundtrip(reg: Registry) -> None:
    run = reg.create(executor="slurm", script="#!/bin/bash\n", log_path="/x/train.log",
                     contract={"tp": 2}, config={"model": {"num_layers": 2}},
                     profile={"name": "eos"})
    assert re.fullmatch(r"[0-9a-f]{32}", run.id)  # opaque uuid4 hex
    assert run.state == "pending" and run.created_at == run.updated_at
    got = reg.get(run.id)
    assert got == run
    assert got.contract == {"tp": 2} and got.config == {"model": {"num_layers": 2}}
    assert reg.create(executor="slurm").id != run.id


def test_unknown_id_is_a_clear_key_error(reg: Registry) -> None:
    with pytest.raises(KeyError) as exc:
        reg.get("0" * 32)
    assert isinstance(exc.value, RunNotFound)
    assert "no run '0000" in str(exc.value) and str(reg.path) in str(exc.value)
    with pytest.raises(KeyError):
        reg.update_state("nope", "running")


def test_state_updates_and_terminal_states_stick(reg: Registry) -> None:
    run = reg.create(executor="local")
    run = reg.update_state(run.id, "running", external_id="123", message="started")
    assert (run.state, run.external_id, run.message) == ("running", "123", "started")
    run = reg.update_state(run.id, "cancelled", message="by user")
    late = reg.update_state(run.id, "failed", message="exit 143", exit_code=143)
    assert late.state == "cancelled" and late.message == "by user"  # a late poll
    forced = reg.update_state(run.id, "failed", force=True, exit_code=1)
    assert forced.state == "failed" and forced.exit_code == 1
    with pytest.raises(ValueError, match="not one of"):
        reg.update_state(run.id, "exploded")  # type: ignore[arg-type]
    assert {"completed", "failed", "cancelled", "timeout"} == TERMINAL_STATES


def test_store_evaluation_and_list_filters(reg: Registry) -> None:
    a = reg.create(executor="slurm")
    time.sleep(0.002)
    b = reg.create(executor="local", state="running")
    reg.set_result(a.id, {"valid": True, "step_time_ms": {"median": 20.1}})
    assert reg.get(a.id).result == {"valid": True, "step_time_ms": {"median": 20.1}}
    assert [r.id for r in reg.list()] == [b.id, a.id]  # newest first
    assert [r.id for r in reg.list(state="running")] == [b.id]
    assert [r.id for r in reg.list(state=["pending", "running"], executor="slurm")] == [a.id]
    assert [r.id for r in reg.list(limit=1)] == [b.id]
    assert reg.list(since=b.created_at)[0].id == b.id
    assert reg.find_external("local", "42") is None


def test_wal_mode_on_disk(reg: Registry) -> None:
    reg.create(executor="local")
    with sqlite3.connect(reg.path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_default_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("MBRIDGE_PERF_REGISTRY", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "mbridge-perf" / "runs.sqlite3"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local/share/mbridge-perf/runs.sqlite3"
    monkeypatch.setenv("MBRIDGE_PERF_REGISTRY", str(tmp_path / "chosen.db"))
    reg = Registry()
    assert reg.path == tmp_path / "chosen.db" and reg.path.exists()


def test_a_restarted_process_reads_and_updates_runs(reg: Registry) -> None:
    """The server restarts: a new process sees the run the old one created, and the old one
    sees the new one's update."""
    res = run_py("""
        import sys
        from mbridge_perf.bench.registry import Registry
        run = Registry(sys.argv[1]).create(executor="slurm", external_id="77",
                                           contract={"gbs": 8})
        print(run.id)
    """, str(reg.path))
    assert res.returncode == 0, res.stderr
    run_id = res.stdout.strip()
    run = Registry(reg.path).get(run_id)
    assert (run.executor, run.external_id, run.contract) == ("slurm", "77", {"gbs": 8})
    res = run_py("""
        import sys
        from mbridge_perf.bench.registry import Registry
        r = Registry(sys.argv[1])
        r.update_state(sys.argv[2], "completed", exit_code=0, message="done")
        print(r.get(sys.argv[2]).model_dump_json())
    """, str(reg.path), run_id)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["state"] == "completed"
    assert reg.get(run_id).state == "completed" and reg.get(run_id).exit_code == 0


def test_readers_are_not_blocked_by_a_writer(reg: Registry) -> None:
    """WAL: while another process holds a write transaction open, this one still reads (the
    committed snapshot) at once; after the commit it sees the new row."""
    old = reg.create(executor="local")
    holder = subprocess.Popen([PY, "-c", textwrap.dedent("""
        import sqlite3, sys, time
        db = sqlite3.connect(sys.argv[1], isolation_level=None)
        db.execute("BEGIN IMMEDIATE")
        db.execute("INSERT INTO runs (id, created_at, updated_at, state, executor) "
                   "VALUES ('held', '2000', '2000', 'pending', 'local')")
        print("locked", flush=True)
        time.sleep(3)
        db.execute("COMMIT")
    """), str(reg.path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        ids = {r.id for r in reg.list()}
        assert reg.get(old.id).id == old.id
        assert time.monotonic() - t0 < 1.0
        assert ids == {old.id}  # the uncommitted row is not visible
        # a writer waits for the lock (busy timeout) instead of failing
        t0 = time.monotonic()
        new = reg.create(executor="local")
        assert time.monotonic() - t0 > 0.5
    finally:
        assert holder.wait(timeout=30) == 0
    assert {r.id for r in reg.list()} == {old.id, new.id, "held"}


def test_concurrent_writers_lose_nothing(reg: Registry) -> None:
    code = """
        import sys
        from mbridge_perf.bench.registry import Registry
        r = Registry(sys.argv[1])
        for i in range(40):
            run = r.create(executor="local", message=sys.argv[2])
            r.update_state(run.id, "running")
    """
    procs = [subprocess.Popen([PY, "-c", textwrap.dedent(code), str(reg.path), f"w{i}"],
                              stderr=subprocess.PIPE, text=True) for i in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    runs = reg.list(limit=1000)
    assert len(runs) == 120 and all(r.state == "running" for r in runs)
    assert {r.message for r in runs} == {"w0", "w1", "w2"}
