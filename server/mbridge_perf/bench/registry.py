"""The run registry: one SQLite file holding every benchmark run, so a run submitted by one
server process can be polled, evaluated or cancelled by the next (after a restart, from the CLI
while the MCP server runs, …).

WAL mode lets readers work while a writer writes; every operation opens its own short-lived
connection with a busy timeout, so several processes share the file safely. Writes use
``BEGIN IMMEDIATE`` so two writers queue instead of failing halfway.

Location: the ``path`` argument, else ``$MBRIDGE_PERF_REGISTRY``, else
``$XDG_DATA_HOME/mbridge-perf/runs.sqlite3`` (``~/.local/share/…`` without XDG_DATA_HOME).
Run ids are opaque uuid4 hex strings (not guessable, not sequential).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import uuid
from collections.abc import Collection, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, Field, ValidationError

RunState = Literal["pending", "running", "completed", "failed", "cancelled", "timeout", "lost",
                   "unknown"]
STATES: tuple[str, ...] = get_args(RunState)
TERMINAL_STATES = frozenset({"completed", "failed", "cancelled", "timeout"})
ENV_VAR = "MBRIDGE_PERF_REGISTRY"
SCHEMA_VERSION = 1
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    state TEXT NOT NULL,
    executor TEXT NOT NULL,
    external_id TEXT,
    script TEXT,
    script_path TEXT,
    log_path TEXT,
    exit_code INTEGER,
    contract TEXT,
    config TEXT,
    profile TEXT,
    result TEXT,
    message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE INDEX IF NOT EXISTS runs_external ON runs(executor, external_id);
"""
_JSON_COLUMNS = ("contract", "config", "profile", "result")


class RunNotFound(KeyError):
    """No run with this id in the registry (KeyError, with a readable message)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "run not found"


class RegistryError(ValueError):
    """The registry file cannot be used; the message says where and what to do."""


class RunRecord(BaseModel):
    """One row of the registry, JSON columns decoded."""

    id: str
    created_at: str
    updated_at: str
    state: RunState
    executor: str
    external_id: str | None = Field(None, description="Slurm job id or local pid")
    script: str | None = Field(None, description="the rendered batch script")
    script_path: str | None = None
    log_path: str | None = None
    exit_code: int | None = None
    contract: dict[str, Any] | None = None
    config: dict[str, Any] | None = None
    profile: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    message: str = ""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def default_path() -> Path:
    """$MBRIDGE_PERF_REGISTRY, else the user's data directory."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base).expanduser() / "mbridge-perf" / "runs.sqlite3"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _dump(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return json.dumps(value, sort_keys=True, default=str)


def _bad_row(path: Path, row: sqlite3.Row, exc: Exception) -> str:
    """One line naming an unreadable row, what is wrong, and how to remove it."""
    rid = str(row["id"])[:64]
    remove = (f"remove it with: sqlite3 {path} \"DELETE FROM runs WHERE id = '{rid}'\""
              if re.fullmatch(r"[A-Za-z0-9_\-]+", rid) else "remove it with the sqlite3 tool")
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, ValidationError) and exc.errors():
        err = exc.errors()[0]
        first = f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return (f"registry: run {rid!r} in {path} cannot be read ({first[:160]}); it is skipped — "
            f"{remove}")


def _check_state(state: str) -> None:
    if state not in STATES:
        raise ValueError(f"state {state!r} is not one of {', '.join(STATES)}")


class Registry:
    """The SQLite run registry at `path` (created on first use)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path).expanduser() if path is not None else default_path()
        try:
            self._open()
        except (OSError, sqlite3.Error, RegistryError) as exc:
            if isinstance(exc, RegistryError) and not hasattr(exc, "sqlite_error"):
                raise  # WAL refused, a newer schema: already says what to do
            why = getattr(exc, "sqlite_error", exc)
            raise RegistryError(f"registry: cannot open {self.path} ({why}); point --registry "
                                f"or {ENV_VAR} at a writable file") from None

    def _open(self) -> None:
        """Create the file and schema on first use; check WAL mode and the schema version."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RegistryError(f"{self.path}: SQLite refused WAL mode ({mode}); put the "
                                    f"registry on a local filesystem (set {ENV_VAR})")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise RegistryError(f"{self.path} was written by a newer mbridge-perf (schema "
                                    f"{version} > {SCHEMA_VERSION}); upgrade mbridge-perf")
            if version < SCHEMA_VERSION:  # write only when needed: readers never queue here
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"Registry({str(self.path)!r})"

    @property
    def runs_dir(self) -> Path:
        """Default home of run scripts and logs: next to the database."""
        return self.path.parent / "runs"

    def _disk_error(self, exc: sqlite3.Error) -> RegistryError:
        """SQLite's error (disk full, read-only, I/O, locked too long) as one line."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        err = RegistryError(f"registry: {self.path}: SQLite cannot read or write it ({text}); "
                            "free disk space or make the file writable, or point --registry "
                            f"or {ENV_VAR} at another file")
        err.sqlite_error = text  # type: ignore[attr-defined]
        return err

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise self._disk_error(exc) from None
        try:
            db.row_factory = sqlite3.Row
            db.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            yield db
        except sqlite3.Error as exc:
            raise self._disk_error(exc) from None
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One transaction that holds the write lock from its first read (BEGIN IMMEDIATE): a
        read-then-write inside it is a compare-and-set no other writer can interleave with."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @staticmethod
    def _record(row: sqlite3.Row) -> RunRecord:
        data = dict(row)
        for col in _JSON_COLUMNS:
            if data[col] is not None:
                data[col] = json.loads(data[col])
        return RunRecord.model_validate(data)

    def _checked(self, row: sqlite3.Row) -> RunRecord:
        """A row as a record, or RegistryError naming the row and what is wrong with it."""
        try:
            return self._record(row)
        except (ValueError, TypeError) as exc:  # bad JSON, an unknown state, a wrong type
            raise RegistryError(_bad_row(self.path, row, exc)) from None

    # ------------------------------------------------------------ API

    def create(self, *, executor: str, state: RunState = "pending",
               external_id: str | None = None, script: str | None = None,
               script_path: str | None = None, log_path: str | None = None,
               contract: Any = None, config: Any = None, profile: Any = None,
               message: str = "", run_id: str | None = None) -> RunRecord:
        """A new run; returns its record (the id is a fresh uuid4 hex unless given)."""
        _check_state(state)
        rid = run_id or uuid.uuid4().hex
        now = _now()
        with self._write() as db:
            db.execute(
                "INSERT INTO runs (id, created_at, updated_at, state, executor, external_id, "
                "script, script_path, log_path, contract, config, profile, message) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (rid, now, now, state, executor, external_id, script, script_path, log_path,
                 _dump(contract), _dump(config), _dump(profile), message))
        return self.get(rid)

    def get(self, run_id: str) -> RunRecord:
        """The run with this id; RunNotFound (a KeyError) names the registry if there is none."""
        with self._connect() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (str(run_id),)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in the registry {self.path}; list the runs "
                              "with `mbridge-perf bench list`")
        return self._checked(row)

    def update(self, run_id: str, **fields: Any) -> RunRecord:
        """Set columns of a run (JSON columns take mappings or pydantic models)."""
        allowed = {"state", "external_id", "script", "script_path", "log_path", "exit_code",
                   "message", *_JSON_COLUMNS}
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"cannot update {', '.join(sorted(unknown))}")
        if "state" in fields:
            _check_state(fields["state"])
        values = {k: _dump(v) if k in _JSON_COLUMNS else v for k, v in fields.items()}
        values["updated_at"] = _now()
        sets = ", ".join(f"{k} = ?" for k in values)
        with self._write() as db:
            cur = db.execute(f"UPDATE runs SET {sets} WHERE id = ?",
                             (*values.values(), str(run_id)))
            if cur.rowcount == 0:
                raise RunNotFound(f"no run {run_id!r} in the registry {self.path}")
        return self.get(run_id)

    def update_state(self, run_id: str, state: RunState, *, message: str | None = None,
                     exit_code: int | None = None, external_id: str | None = None,
                     force: bool = False, expect: Collection[str] | None = None) -> RunRecord:
        """Move a run to `state`, as a compare-and-set in one transaction: the state is read
        and written under the same write lock, so a late status poll cannot turn "cancelled"
        into "failed" between its read and its write. A finished run (completed, failed,
        cancelled, timeout) keeps its state unless `force`; with `expect`, the run moves only
        from one of those states. Returns the record as it is afterwards (unchanged when the
        compare failed)."""
        _check_state(state)
        fields: dict[str, Any] = {"state": state}
        if message is not None:
            fields["message"] = message
        if exit_code is not None:
            fields["exit_code"] = exit_code
        if external_id is not None:
            fields["external_id"] = external_id
        fields["updated_at"] = _now()
        with self._write() as db:
            row = db.execute("SELECT * FROM runs WHERE id = ?", (str(run_id),)).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in the registry {self.path}")
            current = row["state"]
            moves = force or current == state or current not in TERMINAL_STATES
            if moves and (expect is None or current in expect):
                sets = ", ".join(f"{k} = ?" for k in fields)
                db.execute(f"UPDATE runs SET {sets} WHERE id = ? AND state = ?",
                           (*fields.values(), str(run_id), current))
                row = db.execute("SELECT * FROM runs WHERE id = ?", (str(run_id),)).fetchone()
        return self._checked(row)

    def set_result(self, run_id: str, result: Any) -> RunRecord:
        """Store the evaluated result (a BenchmarkResult or its JSON mapping)."""
        return self.update(run_id, result=result)

    def list(self, *, state: RunState | list[RunState] | None = None,
             executor: str | None = None, external_id: str | None = None,
             since: str | None = None, limit: int = 100,
             skipped: list[tuple[str, str]] | None = None) -> list[RunRecord]:
        """Runs, newest first, filtered by state(s), executor, external id and creation time
        (ISO 8601, inclusive). A row that cannot be read (hand-edited, written by a broken
        version) is left out; pass `skipped` to get (id, why) for each one."""
        where, params = [], []
        if state is not None:
            states = [state] if isinstance(state, str) else list(state)
            for s in states:
                _check_state(s)
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            params += states
        if executor is not None:
            where.append("executor = ?")
            params.append(executor)
        if external_id is not None:
            where.append("external_id = ?")
            params.append(str(external_id))
        if since is not None:
            where.append("created_at >= ?")
            params.append(since)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, id LIMIT ?"
        params.append(max(1, min(int(limit), 100_000)))
        with self._connect() as db:
            rows = db.execute(sql, params).fetchall()
        records = []
        for row in rows:
            try:
                records.append(self._record(row))
            except (ValueError, TypeError) as exc:  # one bad row never hides the others
                if skipped is not None:
                    skipped.append((str(row["id"]), _bad_row(self.path, row, exc)))
        return records

    def find_external(self, executor: str, external_id: str) -> RunRecord | None:
        """The newest run this registry made for an executor's job/process id, if any."""
        runs = self.list(executor=executor, external_id=external_id, limit=1)
        return runs[0] if runs else None
