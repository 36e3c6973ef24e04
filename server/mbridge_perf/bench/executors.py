"""Executors: run a rendered batch script and report on it later, from any process.

- ``LocalExecutor`` runs ``bash <script>`` detached on this machine (its own session, output to
  the log file) and records the pid; the script writes its exit status to ``<log>.exitcode``
  from an EXIT trap, so a later process (a restarted server) still learns how it ended.
- ``SlurmExecutor`` submits with ``sbatch --parsable`` and polls ``squeue -h -t all``, then
  ``scontrol show job -o`` for the exit code, then ``sacct`` (or ``sacct --completion`` where
  there is no accounting database) for jobs the controller has forgotten.

Every command is an argument list (never a shell string); binaries are configurable. Cancelling
is refused for any job or process this registry did not create, and for a job id that Slurm has
since given to another job (the job name carries the run id and is checked first).

The run-level helpers at the bottom (``submit_run``, ``refresh_run``, ``cancel_run``,
``wait_run``) tie the registry, the launch script and an executor together; the CLI and the MCP
tools call these.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from mbridge_perf.bench.launch import exit_file, render_script, slurm_job_name
from mbridge_perf.bench.logparse import read_tail
from mbridge_perf.bench.profile import ClusterProfile, load_profile
from mbridge_perf.bench.registry import Registry, RunRecord, RunState
from mbridge_perf.config.model import TrainingConfig

COMMAND_TIMEOUT_S = 30.0


# A run still without a job id this long after it was created was never submitted.
SUBMIT_GRACE_S = 600


class SubmitError(RuntimeError):
    """The executor refused the job (sbatch rejected it, bash could not start); the run is
    recorded as failed with the same message."""


class CancelRefused(PermissionError):
    """Cancelling would touch a job or process this registry did not create."""


class JobStatus(BaseModel):
    """What an executor knows about a run right now."""

    state: RunState
    external_state: str | None = Field(
        None, description="the executor's own word: Slurm's JobState, or running/exited")
    exit_code: int | None = Field(None, description="exit status of the batch script")
    signal: int | None = Field(None, description="signal that ended it, if any")
    reason: str | None = Field(None, description="Slurm's Reason field")
    message: str = ""


class Executor(Protocol):
    name: str

    def submit(self, run: RunRecord, *, workdir: str | Path | None = None,
               job_name: str | None = None) -> str: ...

    def status(self, run: RunRecord) -> JobStatus: ...

    def cancel(self, external_id: str, registry: Registry) -> JobStatus: ...


# ---------------------------------------------------------------- torchrun failure summary

_ROOT_CAUSE_HEAD = "Root Cause (first observed failure):"
# .match()ed only after the last head (found with rfind), its spans bounded
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.{0,400}?rank[ \t]{0,8}:[ \t]{0,8}(\d{1,9})"
    r".{0,400}?exitcode[ \t]{0,8}:[ \t]{0,8}(-?\d{1,9})", re.S)


def torchrun_root_cause(log_path: str | Path | None, tail_bytes: int = 65_536
                        ) -> tuple[int, int] | None:
    """(rank, exit code) from torchrun's failure summary at the end of a log: torchrun itself
    exits 1 whatever its workers exited with, so the job's exit code hides the real one."""
    tail = read_tail(log_path, tail_bytes)
    if tail is None:
        return None
    text = tail.decode("utf-8", "replace")
    m = _ROOT_CAUSE.match(text, max(text.rfind(_ROOT_CAUSE_HEAD), 0))
    return (int(m[1]), int(m[2])) if m else None


def _with_root_cause(message: str, log_path: str | None) -> str:
    cause = torchrun_root_cause(log_path)
    if cause is None:
        return message
    return f"{message}; torchrun root cause: rank {cause[0]} exited with code {cause[1]}"


# ---------------------------------------------------------------- local

_children: dict[int, subprocess.Popen[bytes]] = {}  # reaped by status() while we live


def _proc_alive(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _proc_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun puts its workers in sessions of their own, so a
    process-group signal alone would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().decode("ascii", "replace").rsplit(")", 1)[-1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _tagged(run_id: str) -> list[int]:
    """Every live process of ours whose environment carries this run's MBRIDGE_PERF_RUN_ID
    (set on the job's bash, inherited by torchrun and its workers): finds a worker that was
    spawned after the process tree was listed, or orphaned when torchrun died first."""
    tag = f"MBRIDGE_PERF_RUN_ID={run_id}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read(1 << 20)
        except OSError:
            continue
        if tag in env.split(b"\0"):
            out.append(int(entry))
    return out


@dataclass
class LocalExecutor:
    """Runs the script with bash on this machine, detached from the caller."""

    bash: str = "bash"
    grace_s: float = 15.0  # SIGTERM → SIGKILL when cancelling
    name: str = field(default="local", init=False)

    def submit(self, run: RunRecord, *, workdir: str | Path | None = None,
               job_name: str | None = None) -> str:
        if not run.script_path or not run.log_path:
            raise SubmitError(f"run {run.id} has no script or log path")
        log = Path(run.log_path)
        log.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(exit_file(run.log_path))
        env = {**os.environ, "MBRIDGE_PERF_RUN_ID": run.id}
        try:
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    [self.bash, run.script_path], stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, cwd=str(workdir or log.parent), env=env,
                    start_new_session=True, close_fds=True)
        except OSError as exc:
            raise SubmitError(f"cannot start {self.bash}: {exc.strerror}") from None
        _children[proc.pid] = proc
        return str(proc.pid)

    def _ours(self, pid: int, run: RunRecord) -> bool:
        """The live process `pid` is this run's bash (not a reused pid)."""
        cmd = _proc_cmdline(pid)
        return bool(run.script_path) and run.script_path in cmd

    def status(self, run: RunRecord) -> JobStatus:
        if not run.external_id:
            return JobStatus(state="pending", message="not started yet")
        pid = int(run.external_id)
        popen_rc = None
        proc = _children.get(pid)
        if proc is not None:
            popen_rc = proc.poll()
            if popen_rc is None:
                return JobStatus(state="running", external_state="running",
                                 message=f"running as pid {pid}")
            _children.pop(pid, None)
        elif _proc_alive(pid) and self._ours(pid, run):
            return JobStatus(state="running", external_state="running",
                             message=f"running as pid {pid}")
        code = _read_exit_file(run.log_path)
        if code is None and popen_rc is not None:
            code = popen_rc if popen_rc >= 0 else 128 - popen_rc
        if code is None:
            return JobStatus(
                state="lost", external_state="gone",
                message=f"process {pid} is gone and left no exit status (killed with SIGKILL, "
                        "or the machine restarted); the run record is kept")
        sig = code - 128 if code > 128 else None
        if code == 0:
            return JobStatus(state="completed", external_state="exited", exit_code=0,
                             message="the script exited with code 0")
        msg = f"the script exited with code {code}" + (
            f" (signal {sig}, {signal.Signals(sig).name})" if sig and sig < 65 and sig in
            signal.valid_signals() else "")
        return JobStatus(state="failed", external_state="exited", exit_code=code, signal=sig,
                         message=_with_root_cause(msg, run.log_path))

    def cancel(self, external_id: str, registry: Registry) -> JobStatus:
        run = registry.find_external(self.name, str(external_id))
        if run is None:
            raise CancelRefused(f"process {external_id} was not started through the registry "
                                f"{registry.path}; mbridge-perf only stops its own runs")
        pid = int(external_id)
        if not _proc_alive(pid) or not self._ours(pid, run):
            return self.status(run)
        victims = list(dict.fromkeys([pid, *_descendants(pid), *_tagged(run.id)]))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        for v in victims[1:]:  # workers in their own sessions
            with contextlib.suppress(ProcessLookupError):
                os.kill(v, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and any(_proc_alive(v) for v in victims):
            if pid in _children:
                _children[pid].poll()
            time.sleep(0.1)
        for v in dict.fromkeys([*victims, *_tagged(run.id)]):  # and any spawned meanwhile
            if _proc_alive(v):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(v, signal.SIGKILL)
        if pid in _children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                _children.pop(pid).wait(timeout=5)
        return JobStatus(state="cancelled", external_state="killed", signal=signal.SIGTERM,
                         message=f"stopped process {pid} and its {len(victims) - 1} "
                                 "descendants (SIGTERM)")


def _read_exit_file(log_path: str | None) -> int | None:
    if not log_path:
        return None
    try:
        return int(Path(exit_file(log_path)).read_text().strip())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- slurm

SLURM_STATES: dict[str, RunState] = {
    "PENDING": "pending", "CONFIGURING": "pending", "REQUEUED": "pending",
    "REQUEUE_HOLD": "pending", "REQUEUE_FED": "pending", "RESV_DEL_HOLD": "pending",
    "RUNNING": "running", "COMPLETING": "running", "STAGE_OUT": "running",
    "SIGNALING": "running", "SUSPENDED": "running", "RESIZING": "running",
    "STOPPED": "running",
    "COMPLETED": "completed",
    "FAILED": "failed", "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed",
    "BOOT_FAIL": "failed", "DEADLINE": "failed", "PREEMPTED": "failed",
    "SPECIAL_EXIT": "failed", "REVOKED": "failed",
    "CANCELLED": "cancelled",
    "TIMEOUT": "timeout",
}
_UNREACHABLE = ("unable to contact slurm controller", "connect failure", "connection refused",
                "socket timed out", "zero bytes were transmitted", "communication connection "
                "failure", "slurm_receive_msg", "unable to establish")
_INVALID_ID = "invalid job id"


@dataclass(frozen=True)
class SlurmBinaries:
    """Paths of the Slurm client commands (names are looked up on PATH)."""

    sbatch: str = "sbatch"
    squeue: str = "squeue"
    scontrol: str = "scontrol"
    sacct: str = "sacct"
    scancel: str = "scancel"


def map_slurm_state(word: str) -> RunState:
    """Slurm JobState (e.g. 'CANCELLED by 0', 'COMPLETING') → our state."""
    base = word.strip().split()[0].rstrip("+").upper() if word.strip() else ""
    return SLURM_STATES.get(base, "unknown")


def _scontrol_fields(line: str) -> dict[str, str]:
    """`scontrol show job -o` output → {key: value}; values may contain spaces, so each
    value runs up to the next ` Key=`."""
    out: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9:_/]*)=(.*?)(?=\s+[A-Za-z][A-Za-z0-9:_/]*="
                         r"|\s*$)", line.strip()):
        out.setdefault(m.group(1), m.group(2))
    return out


def _exit_pair(text: str | None) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"(\d+):(\d+)", (text or "").strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


@dataclass
class SlurmExecutor:
    """Submits through sbatch and reads state back from squeue / scontrol / sacct."""

    binaries: SlurmBinaries = field(default_factory=SlurmBinaries)
    slurm_conf: str | None = None  # exported as SLURM_CONF for every command
    timeout_s: float = COMMAND_TIMEOUT_S
    name: str = field(default="slurm", init=False)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def _run(self, argv: list[str], cwd: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run a client command; a missing binary or a hang becomes rc 127 / 124 with the
        reason on stderr (callers report it, nothing is raised)."""
        try:
            return subprocess.run(argv, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, env=self._env(), cwd=cwd,
                                  timeout=self.timeout_s, check=False)
        except FileNotFoundError:
            return subprocess.CompletedProcess(
                argv, 127, "", f"{argv[0]}: command not found; install the Slurm client or "
                               "point SlurmBinaries at it")
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(
                argv, 124, "", f"{argv[0]} did not answer within {self.timeout_s:.0f} s "
                               "(controller busy or unreachable)")

    @staticmethod
    def _unreachable(stderr: str) -> bool:
        low = stderr.lower()
        return any(s in low for s in _UNREACHABLE)

    def submit(self, run: RunRecord, *, workdir: str | Path | None = None,
               job_name: str | None = None) -> str:
        if not run.script_path or not run.log_path:
            raise SubmitError(f"run {run.id} has no script or log path")
        Path(run.log_path).parent.mkdir(parents=True, exist_ok=True)
        cwd = str(workdir or Path(run.log_path).parent)
        name = job_name or slurm_job_name(run.id)
        argv = [self.binaries.sbatch, "--parsable", f"--job-name={name}",
                f"--output={run.log_path}", f"--chdir={cwd}", run.script_path]
        res = self._run(argv, cwd=cwd)
        if res.returncode != 0:
            detail = (res.stderr.strip() or res.stdout.strip() or f"exit {res.returncode}")
            raise SubmitError(f"sbatch rejected the job: {detail}")
        job_id = res.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise SubmitError(f"sbatch printed {res.stdout.strip()!r}, not a job id")
        return job_id

    def _details(self, job_id: str) -> dict[str, str]:
        res = self._run([self.binaries.scontrol, "show", "job", "-o", job_id])
        return _scontrol_fields(res.stdout.splitlines()[0]) if res.returncode == 0 and \
            res.stdout.strip() else {}

    def _accounting(self, job_id: str) -> tuple[dict[str, str] | None, str]:
        """The job's record from accounting (slurmdbd) or, without one, from the
        job-completion log (`sacct --completion`); (None, why) when neither has it."""
        cols = ["JobID", "JobName", "State", "ExitCode", "DerivedExitCode"]
        tried = []
        for extra in ([], ["--completion"]):
            res = self._run([self.binaries.sacct, *extra, "-P", "-n", "-j", job_id, "-o",
                             ",".join(cols)])
            tried.append(f"sacct {' '.join(extra)}".strip() + ": " + (
                res.stderr.strip().splitlines()[0] if res.stderr.strip() else
                ("no record" if res.returncode == 0 else f"exit {res.returncode}")))
            if res.returncode != 0:
                continue
            for line in res.stdout.splitlines():
                parts = line.split("|")
                if len(parts) >= len(cols) and parts[0] == job_id:
                    return dict(zip(cols, parts, strict=False)), ""
        return None, "; ".join(tried)

    def status(self, run: RunRecord) -> JobStatus:
        if not run.external_id:
            return JobStatus(state="pending", message="not submitted yet")
        jid = run.external_id
        want = slurm_job_name(run.id)
        res = self._run([self.binaries.squeue, "-h", "-t", "all", "-j", jid, "-o", "%T|%j|%r"])
        err = res.stderr.strip()
        if res.returncode != 0 and _INVALID_ID not in err.lower():
            why = err.splitlines()[0] if err else f"exit {res.returncode}"
            if self._unreachable(err) or res.returncode == 124:
                return JobStatus(
                    state="unknown", message=f"slurmctld is unreachable ({why}); job {jid} "
                    "may still be running. The run record is intact: ask again when the "
                    "controller is back")
            return JobStatus(state="unknown", message=f"squeue failed for job {jid}: {why}")
        line = res.stdout.strip().splitlines()[0] if res.stdout.strip() else ""
        if line:
            word, name, reason = [*line.split("|"), "", ""][:3]
            if name and name != want:
                return JobStatus(
                    state="lost", external_state=word,
                    message=f"Slurm job {jid} is now {name!r}, not this run's {want!r}: the "
                    "id was reused (the cluster's job state was reset); the run record is kept")
            state = map_slurm_state(word)
            status = JobStatus(state=state, external_state=word, reason=reason or None)
            if state in ("pending", "running"):
                status.message = f"{word}" + (f" ({reason})" if reason and reason != "None"
                                              else "")
                return status
            return self._finished(run, status, self._details(jid))
        record, why = self._accounting(jid)
        if record is None:
            return JobStatus(
                state="lost", message=f"Slurm has no record of job {jid} any more (squeue: "
                f"{err.splitlines()[0] if err else 'nothing'}; {why}): it was purged or the "
                "controller's state was reset. The run record is kept"
                + (f"; the log may still be at {run.log_path}" if run.log_path else ""))
        if record.get("JobName") and record["JobName"] != want:
            return JobStatus(state="lost", external_state=record.get("State"),
                             message=f"Slurm's record of job {jid} is {record['JobName']!r}, "
                                     f"not this run's {want!r}")
        word = record.get("State", "")
        status = JobStatus(state=map_slurm_state(word), external_state=word)
        return self._finished(run, status, {"ExitCode": record.get("ExitCode", "")})

    def _finished(self, run: RunRecord, status: JobStatus, details: dict[str, str]
                  ) -> JobStatus:
        code, sig = _exit_pair(details.get("ExitCode"))
        status.exit_code, status.signal = code, (sig or None)
        reason = details.get("Reason")
        if reason and reason != "None":
            status.reason = reason
        word = status.external_state or ""
        exit_text = f"exit code {code}:{sig}" if code is not None else "no exit code"
        if status.state == "completed":
            status.message = f"COMPLETED ({exit_text})"
        elif status.state == "timeout":
            status.message = (f"TIMEOUT: the job hit its time limit "
                              f"{details.get('TimeLimit', '')}".rstrip() + f" ({exit_text})")
        elif status.state == "cancelled":
            status.message = f"{word} ({exit_text})"
        elif status.state == "failed":
            status.message = _with_root_cause(
                f"{word.split()[0] if word else 'FAILED'}: {exit_text}"
                + (f", Reason={status.reason}" if status.reason else ""), run.log_path)
        else:
            status.message = f"Slurm reports {word!r}, which mbridge-perf does not know"
        return status

    def cancel(self, external_id: str, registry: Registry) -> JobStatus:
        jid = str(external_id)
        run = registry.find_external(self.name, jid)
        if run is None:
            raise CancelRefused(f"Slurm job {jid} was not submitted through the registry "
                                f"{registry.path}; mbridge-perf only cancels its own jobs")
        current = self.status(run)
        if current.state == "lost":
            raise CancelRefused(f"not cancelling Slurm job {jid}: {current.message}")
        if current.state not in ("pending", "running"):
            return current
        res = self._run([self.binaries.scancel, jid])
        if res.returncode != 0:
            raise RuntimeError(f"scancel {jid} failed: "
                               f"{res.stderr.strip() or f'exit {res.returncode}'}")
        return JobStatus(state="cancelled", external_state="CANCELLED",
                         message=f"scancel sent to Slurm job {jid}")


def make_executor(profile: ClusterProfile, **kwargs: Any) -> LocalExecutor | SlurmExecutor:
    """The executor a profile names (kwargs go to its constructor)."""
    if profile.executor == "slurm":
        kwargs.setdefault("slurm_conf", profile.slurm_conf)
        return SlurmExecutor(**kwargs)
    return LocalExecutor(**kwargs)


# ---------------------------------------------------------------- run-level helpers

def submit_run(registry: Registry, cfg: TrainingConfig, profile: ClusterProfile | str, *,
               recipe: str | None = None, steps: int = 50, contract: Any = None,
               executor: LocalExecutor | SlurmExecutor | None = None) -> RunRecord:
    """Record a run, render and write its script, hand it to the executor. Raises ValueError
    for a config the launcher cannot take (nothing recorded) and SubmitError when the executor
    refuses (the run stays in the registry as failed, with the reason)."""
    profile = load_profile(profile)
    executor = executor or make_executor(profile)
    run = registry.create(executor=executor.name, contract=contract, profile=profile,
                          config=cfg.model_dump(mode="json", exclude_unset=True, fallback=str))
    run_dir = Path(profile.log_dir) / run.id if profile.log_dir else registry.runs_dir / run.id
    log_path = str(run_dir / "train.log")
    try:
        script = render_script(cfg, profile, run_id=run.id, log_path=log_path, recipe=recipe,
                               steps=steps)
    except ValueError as exc:
        _fail_run(registry, run.id, f"the launch script could not be rendered: {exc}")
        raise
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        script_path = run_dir / "job.sh"
        script_path.write_text(script, encoding="utf-8")
        script_path.chmod(0o755)
        run = registry.update(run.id, script=script, script_path=str(script_path),
                              log_path=log_path)
        external = executor.submit(run, workdir=profile.workdir)
    except SubmitError as exc:
        _fail_run(registry, run.id, str(exc))
        raise SubmitError(f"run {run.id}: {exc}") from None
    except OSError as exc:  # the run folder or script cannot be written (disk full, perms)
        reason = (f"cannot write the job's files in {run_dir}: "
                  f"{exc.strerror or type(exc).__name__}")
        _fail_run(registry, run.id, reason)
        raise SubmitError(f"run {run.id}: {reason}") from None
    except BaseException as exc:  # a registry error, an interrupt: never left "pending"
        _fail_run(registry, run.id, f"submit stopped before the job started: "
                                    f"{type(exc).__name__}: {exc}")
        raise
    state: RunState = "pending" if executor.name == "slurm" else "running"
    try:
        return registry.update(run.id, external_id=external, state=state,
                               message=f"submitted as {executor.name} {external}")
    except ValueError as exc:  # RegistryError: the job runs, the record could not say so
        raise SubmitError(f"run {run.id}: submitted as {executor.name} {external}, but the "
                          f"registry could not record it: {exc}") from None


def _fail_run(registry: Registry, run_id: str, reason: str) -> None:
    """End a run that never started in "failed" with the reason (best effort: the registry
    itself may be what failed; a cancel that landed first is kept)."""
    with contextlib.suppress(Exception):
        registry.update_state(run_id, "failed", message=" ".join(reason.split())[:1000])


def executor_for(run: RunRecord, **kwargs: Any) -> LocalExecutor | SlurmExecutor:
    """The executor that made a run, rebuilt from its record (a restarted server)."""
    if run.executor == "slurm":
        kwargs.setdefault("slurm_conf", (run.profile or {}).get("slurm_conf"))
        return SlurmExecutor(**kwargs)
    return LocalExecutor(**kwargs)


def refresh_run(registry: Registry, run_id: str, *,
                executor: LocalExecutor | SlurmExecutor | None = None) -> RunRecord:
    """Ask the executor about a run and store what it says; finished runs are not asked
    again. An unreachable controller gives state "unknown" and leaves everything else as it
    was."""
    run = registry.get(run_id)
    if run.terminal:
        return run
    if _submit_never_finished(run):
        return registry.update_state(
            run.id, "failed", expect=("pending",),
            message=f"the submit never finished: no job id was recorded within "
                    f"{SUBMIT_GRACE_S // 60} minutes (the registry or the disk failed while "
                    f"submitting: {run.message or 'no reason recorded'}); submit it again")
    status = (executor or executor_for(run)).status(run)
    return registry.update_state(run.id, status.state, message=status.message,
                                 exit_code=status.exit_code)


def _submit_never_finished(run: RunRecord) -> bool:
    """A pending run that never got a job id long after it was created: the process that
    submitted it stopped before it could record the outcome."""
    if run.state != "pending" or run.external_id:
        return False
    try:
        created = datetime.fromisoformat(run.created_at)
    except ValueError:
        return False
    return (datetime.now(UTC) - created).total_seconds() > SUBMIT_GRACE_S


def cancel_run(registry: Registry, run_id: str, *,
               executor: LocalExecutor | SlurmExecutor | None = None) -> RunRecord:
    """Cancel a run this registry made (finished runs are left as they are)."""
    run = registry.get(run_id)
    if run.terminal:
        return run
    if not run.external_id:
        return registry.update_state(run.id, "cancelled", message="cancelled before it started")
    status = (executor or executor_for(run)).cancel(run.external_id, registry)
    return registry.update_state(run.id, status.state, message=status.message,
                                 exit_code=status.exit_code)


def wait_run(registry: Registry, run_id: str, *, timeout_s: float, poll_s: float = 1.0,
             executor: LocalExecutor | SlurmExecutor | None = None,
             until: frozenset[str] | None = None) -> RunRecord:
    """Poll until the run reaches one of `until` (default: a finished state) or the timeout."""
    targets = until or frozenset({"completed", "failed", "cancelled", "timeout"})
    deadline = time.monotonic() + timeout_s
    while True:
        run = refresh_run(registry, run_id, executor=executor)
        if run.state in targets or time.monotonic() >= deadline:
            return run
        time.sleep(poll_s)
