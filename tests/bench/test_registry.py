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

from mbridge_perf.bench.registry import (
    TERMINAL_STATES,
    Registry,
    RegistryError,
    RunNotFound,
    RunRecord,
    default_path,
)

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


# ------------------------------------------------------------------ issue 23: races, bad rows,
# failed submits, disk errors

def test_a_late_poll_cannot_overwrite_cancelled(reg: Registry) -> None:
    """A status poll reads the run, asks Slurm (slow), and meanwhile the user cancels: the
    poll's "failed" must not land over "cancelled"."""
    from mbridge_perf.bench import executors

    run = reg.create(executor="slurm", state="running", external_id="42")

    class SlowSlurm:
        name = "slurm"

        def status(self, record: RunRecord) -> executors.JobStatus:
            assert record.state == "running"  # what the poll read
            Registry(reg.path).update_state(run.id, "cancelled", message="scancel by the user")
            return executors.JobStatus(state="failed", message="FAILED: exit code 0:15")

    polled = executors.refresh_run(reg, run.id, executor=SlowSlurm())  # type: ignore[arg-type]
    assert (polled.state, polled.message) == ("cancelled", "scancel by the user")
    assert reg.get(run.id).state == "cancelled"


def _overwrites(reg: Registry) -> list[tuple[str, str, str]]:
    with sqlite3.connect(reg.path) as db:
        return db.execute("SELECT id, old, new FROM overwrites").fetchall()


def test_a_cancel_racing_many_polls_sticks(reg: Registry) -> None:
    """Processes polling "failed" / "timeout" and one cancelling, all at once: a trigger in
    the file records every change away from a finished state; there must be none."""
    with sqlite3.connect(reg.path) as db:
        db.executescript("""
            CREATE TABLE overwrites (id TEXT, old TEXT, new TEXT);
            CREATE TRIGGER keep_finished AFTER UPDATE OF state ON runs
            WHEN OLD.state IN ('completed', 'failed', 'cancelled', 'timeout')
                 AND NEW.state != OLD.state
            BEGIN INSERT INTO overwrites VALUES (OLD.id, OLD.state, NEW.state); END;
        """)
    runs = [reg.create(executor="slurm", state="running", external_id=str(i)) for i in range(30)]
    code = """
        import sys
        from mbridge_perf.bench.registry import Registry
        reg = Registry(sys.argv[1])
        for rid in sys.argv[3:]:
            reg.update_state(rid, sys.argv[2], message=sys.argv[2])
    """
    ids = [r.id for r in runs]
    procs = [subprocess.Popen([PY, "-c", textwrap.dedent(code), str(reg.path), state, *ids])
             for state in ("failed", "cancelled", "failed", "timeout")]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    assert _overwrites(reg) == []
    for rid in ids:
        run = reg.get(rid)
        assert run.state in TERMINAL_STATES and run.message == run.state, run


def test_compare_and_set_moves_only_from_the_expected_state(reg: Registry) -> None:
    run = reg.create(executor="slurm")
    same = reg.update_state(run.id, "failed", expect=("running",), message="no")
    assert (same.state, same.message) == ("pending", "")
    moved = reg.update_state(run.id, "failed", expect=("pending",), message="yes")
    assert (moved.state, moved.message) == ("failed", "yes")


def _bad_rows(reg: Registry) -> dict[str, str]:
    """Rows a hand edit or a broken version could leave: bad JSON, an unknown state, a wrong
    type — each written straight into the file."""
    rows = {"badjson": ("completed", "{not json", 0), "badstate": ("exploded", None, 0),
            "badexit": ("failed", None, "three")}
    with sqlite3.connect(reg.path) as db:
        for rid, (state, contract, exit_code) in rows.items():
            db.execute("INSERT INTO runs (id, created_at, updated_at, state, executor, contract, "
                       "exit_code) VALUES (?, '2026-01-01T00:00:00.000+00:00', "
                       "'2026-01-01T00:00:00.000+00:00', ?, 'slurm', ?, ?)",
                       (rid, state, contract, exit_code))
    return {rid: state for rid, (state, _, _) in rows.items()}


def test_a_bad_row_is_skipped_and_named(reg: Registry) -> None:
    good = reg.create(executor="local")
    bad = _bad_rows(reg)
    skipped: list[tuple[str, str]] = []
    assert [r.id for r in reg.list(skipped=skipped)] == [good.id]
    assert sorted(rid for rid, _ in skipped) == sorted(bad)
    for rid, why in skipped:
        assert f"run {rid!r}" in why and "skipped" in why and "DELETE FROM runs" in why
    assert "contract" in dict(skipped)["badjson"] or "Expecting" in dict(skipped)["badjson"]
    assert "state" in dict(skipped)["badstate"] and "exit_code" in dict(skipped)["badexit"]
    with pytest.raises(RegistryError, match=r"run 'badjson' .* cannot be read"):
        reg.get("badjson")
    assert reg.find_external("slurm", "x") is None  # lookups skip them too


def test_cli_list_keeps_working_past_a_bad_row(reg: Registry) -> None:
    good = reg.create(executor="local", state="completed")
    _bad_rows(reg)
    p = subprocess.run([str(Path(PY).with_name("mbridge-perf")), "bench", "list", "--registry",
                        str(reg.path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert good.id in p.stdout
    for rid in ("badjson", "badstate", "badexit"):
        assert f"run '{rid}'" in p.stdout and "cannot be read" in p.stdout
    status = subprocess.run([str(Path(PY).with_name("mbridge-perf")), "bench", "status",
                             "badjson", "--registry", str(reg.path)], capture_output=True,
                            text=True, timeout=60)
    assert status.returncode == 2 and "Traceback" not in status.stderr
    assert status.stderr.count("\n") == 1 and "run 'badjson'" in status.stderr


class _FullDisk:
    """A connection whose writes fail as SQLite's do on a full disk."""

    def __init__(self, db: sqlite3.Connection) -> None:
        object.__setattr__(self, "_db", db)

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
            raise sqlite3.OperationalError("database or disk is full")
        return self._db.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._db, name)

    def __setattr__(self, name: str, value: object) -> None:
        setattr(self._db, name, value)


def test_disk_errors_say_so_in_one_line(reg: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    run = reg.create(executor="local")
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: _FullDisk(real(*a, **k)))
    for write in (lambda: reg.create(executor="local"),
                  lambda: reg.update_state(run.id, "running"),
                  lambda: reg.update(run.id, message="x")):
        with pytest.raises(RegistryError) as info:
            write()
        text = str(info.value)
        assert text.startswith(f"registry: {reg.path}: SQLite cannot read or write it "
                               "(database or disk is full)") and "\n" not in text
    assert reg.get(run.id).state == "pending"  # reads still work


def test_a_failed_submit_ends_failed_with_the_reason(reg: Registry, tmp_path: Path) -> None:
    from mbridge_perf.bench.executors import SubmitError, submit_run
    from mbridge_perf.bench.profile import load_profile
    from mbridge_perf.config.load import load_config

    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    prof = load_profile("cpu-test").model_copy(update={"log_dir": str(blocker)})
    cfg = load_config(data={"train": {"micro_batch_size": 1}})
    with pytest.raises(SubmitError, match="cannot write the job's files"):
        submit_run(reg, cfg, prof, steps=1)
    failed = reg.list(limit=1)[0]
    assert failed.state == "failed" and "cannot write the job's files" in failed.message

    class Exploding:
        name = "local"

        def submit(self, run: RunRecord, workdir: str | None = None) -> str:
            raise RuntimeError("the executor broke")

    with pytest.raises(RuntimeError, match="the executor broke"):
        submit_run(reg, cfg, load_profile("cpu-test").model_copy(
            update={"log_dir": str(tmp_path / "runs")}), steps=1,
            executor=Exploding())  # type: ignore[arg-type]
    broke = reg.list(limit=1)[0]
    assert broke.state == "failed" and "RuntimeError: the executor broke" in broke.message
    assert not [r for r in reg.list() if r.state == "pending"]


def test_a_submit_that_never_recorded_a_job_id_ends_failed(reg: Registry) -> None:
    from mbridge_perf.bench import executors

    stale = reg.create(executor="slurm", message="")
    with sqlite3.connect(reg.path) as db:  # created long ago, never given a job id
        db.execute("UPDATE runs SET created_at = '2020-01-01T00:00:00.000+00:00' WHERE id = ?",
                   (stale.id,))
    fresh = reg.create(executor="slurm")
    run = executors.refresh_run(reg, stale.id)
    assert run.state == "failed" and "the submit never finished" in run.message
    assert executors.refresh_run(reg, fresh.id).state == "pending"  # still submitting
