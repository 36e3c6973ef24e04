#!/usr/bin/env python3
"""Start the mbridge-perf MCP server (stdio) from a plain clone or an installed plugin, with only
python3 (>= 3.11) on the machine.

First start: create a venv in the data folder, install the package from the folder this script
sits in (the plugin root), then exec `mbridge-perf serve`. Later starts find the install stamp
and exec at once, so they cost what the console script itself costs.

What it reads: its own location (the plugin root) and the user's environment, nothing else —
no tool arguments, no config content. Data folder, first that is set:
  $MBRIDGE_PERF_DATA, $CLAUDE_PLUGIN_DATA (Claude Code plugins),
  $XDG_DATA_HOME/mbridge-perf, ~/.local/share/mbridge-perf (%LOCALAPPDATA% on Windows).
`--prepare` installs and exits without serving (for a SessionStart hook or a manual first run).
Progress and errors go to stderr only; stdout belongs to the MCP protocol.
"""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

MIN_PYTHON = (3, 11)
ROOT = Path(__file__).resolve().parent.parent
STAMP = ".mbridge-perf-install"
# pip gives up on an unreachable index after retries x timeout; the whole install is bounded too
PIP_NETWORK = ["--retries", "2", "--timeout", "20"]
TIMEOUT_VAR = "MBRIDGE_PERF_INSTALL_TIMEOUT"
DEFAULT_INSTALL_TIMEOUT_S = 900.0
# What the installed package is built from, hashed by content so a `git pull` that changes any
# of it reinstalls: the package source, the skill pack setup.py bundles into the wheel, and the
# build files.
SOURCE_DIRS = ("server", "skills")
BUILD_FILES = ("pyproject.toml", "setup.py", "card.yaml")
_SKIP_DIRS = ("__pycache__", "build", "dist")


def say(message: str) -> None:
    print(f"mbridge-perf: {message}", file=sys.stderr, flush=True)


def fail(message: str) -> None:
    """One clear line (plus where the log is), exit 1: the client shows it as a failed server."""
    say(f"error: {message}")
    sys.exit(1)


def data_dir() -> Path:
    for var in ("MBRIDGE_PERF_DATA", "CLAUDE_PLUGIN_DATA"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    if os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "mbridge-perf"


def venv_bin(venv: Path, name: str) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin") / (
        f"{name}.exe" if os.name == "nt" else name)


def install_timeout() -> float:
    """The install's time limit in seconds from $MBRIDGE_PERF_INSTALL_TIMEOUT (default 900); a
    value that is not a positive number is one error line."""
    raw = os.environ.get(TIMEOUT_VAR, "").strip()
    if not raw:
        return DEFAULT_INSTALL_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < float("inf"):
        fail(f"{TIMEOUT_VAR}={raw[:40]!r} is not a number of seconds above 0; unset it (default "
             f"{DEFAULT_INSTALL_TIMEOUT_S:.0f}) or set e.g. {TIMEOUT_VAR}=1800")
    return value


def _source_files(top: Path) -> list[Path]:
    """The package's source files, in a fixed order (no caches, build output or egg-info)."""
    found = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")
                         and not d.startswith("."))
        found += [Path(folder, f) for f in sorted(files) if not f.endswith((".pyc", ".pyo"))]
    return found


def install_key() -> str:
    """What the install depends on: the content of the package's source, the skill pack and
    the build files, where the plugin root is, and the interpreter. Any change to a module or a
    skill (a `git pull`, a new plugin version) reinstalls; an unchanged tree starts at once."""
    h = hashlib.sha256()
    h.update(str(ROOT).encode() + b"\0" + sys.version.encode() + b"\0")
    for name in BUILD_FILES:
        try:
            h.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
        except OSError:
            fail(f"{ROOT / name} is missing; this script must stay in the scripts/ folder of "
                 "an mbridge-perf checkout or plugin")
    for path in (p for top in SOURCE_DIRS for p in _source_files(ROOT / top)):
        try:
            data = path.read_bytes()
        except OSError as exc:  # an unreadable file still changes the key, never crashes
            data = f"<unreadable: {exc.strerror}>".encode()
        h.update(path.relative_to(ROOT).as_posix().encode() + b"\0"
                 + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def installed(venv: Path, key: str) -> bool:
    try:
        return (venv / STAMP).read_text().strip() == key and venv_bin(venv, "mbridge-perf").exists()
    except OSError:
        return False


@contextmanager
def install_lock(folder: Path):
    """Two clients starting at once must not install into the same venv together."""
    with open(folder / "install.lock", "w") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no advisory lock; a clash only means a failed first start
            yield
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say("another start is installing the server; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _stop_group(proc) -> None:
    """Kill the step and everything it started (its own process group), then reap it."""
    import signal
    import subprocess
    with suppress(ProcessLookupError, PermissionError):
        if os.name == "nt":
            proc.kill()
        else:  # the group outlives its leader: pip's build helpers are killed too
            os.killpg(proc.pid, signal.SIGKILL)
    with suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def run_logged(cmd: list[str], log: IO[str], deadline: float, what: str,
               timeout_s: float) -> None:
    """Run one install step in its own process group, its output to the log and the headline
    lines to stderr. The deadline holds while the step prints nothing too: at the deadline the
    whole group is killed and the start fails with one line (the install lock is released as
    this process exits)."""
    import re
    import subprocess
    import threading
    import time
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    group = {"start_new_session": True} if os.name != "nt" else {
        "creationflags": getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", **group)
    assert proc.stdout
    tail: list[str] = []

    def pump() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            log.write(line)
            tail[:] = [*tail[-4:], line.rstrip()]
            if re.match(r"(Collecting|Building|Successfully|ERROR)", line):
                say(f"  {line.rstrip()[:120]}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        _stop_group(proc)
        reader.join(5)
        fail(f"{what} took longer than {timeout_s:.0f} s ({TIMEOUT_VAR}) and was stopped; "
             f"full log: {log.name}")
    except BaseException:
        _stop_group(proc)
        raise
    reader.join(5)
    if reader.is_alive():  # something the step left behind still holds its output open
        _stop_group(proc)
        reader.join(5)
    log.flush()
    if code != 0:
        last = " | ".join(t for t in tail if t.strip())[-400:]
        fail(f"{what} failed (exit {code}): {last}; full log: {log.name}. "
             "Fix the cause (network to PyPI, disk space) and start the server again.")


def install(venv: Path, key: str, timeout_s: float) -> None:
    import time  # install-path imports stay out of the warm start

    folder = venv.parent
    started = time.monotonic()
    deadline = started + timeout_s
    say(f"first start: installing the server into {venv} (one time, about a minute)")
    with open(folder / "install.log", "w") as log:
        py = venv_bin(venv, "python")
        if not py.exists():
            say(f"  creating a virtual environment with {sys.executable}")
            run_logged([sys.executable, "-m", "venv", str(venv)], log, deadline,
                       "creating the virtual environment (on Debian/Ubuntu: apt install "
                       "python3-venv)", timeout_s)
        (venv / STAMP).unlink(missing_ok=True)
        say(f"  installing mbridge-perf from {ROOT}")
        run_logged([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                    "--progress-bar", "off", *PIP_NETWORK, "--upgrade", str(ROOT)],
                   log, deadline, "pip install", timeout_s)
        run_logged([str(venv_bin(venv, "mbridge-perf")), "--version"], log, deadline,
                   "checking the installed command", timeout_s)
    (venv / STAMP).write_text(key + "\n")
    say(f"installed in {time.monotonic() - started:.0f} s; later starts skip this step")


def main(argv: list[str]) -> None:
    if sys.version_info < MIN_PYTHON:
        fail(f"Python {'.'.join(map(str, MIN_PYTHON))} or newer is needed, this is "
             f"{sys.version.split()[0]} ({sys.executable})")
    prepare = argv[:1] == ["--prepare"]
    folder = data_dir()
    venv = folder / "venv"
    timeout_s = install_timeout()
    key = install_key()
    if not installed(venv, key):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(f"cannot create the data folder {folder}: {exc.strerror}; set "
                 "MBRIDGE_PERF_DATA to a writable folder")
        try:
            with install_lock(folder):
                if not installed(venv, key):  # another start may have finished meanwhile
                    install(venv, key, timeout_s)
        except OSError as exc:  # the lock, the log or the stamp cannot be written
            fail(f"cannot write in the data folder {folder}: "
                 f"{exc.filename or ''}: {exc.strerror or type(exc).__name__}; set "
                 "MBRIDGE_PERF_DATA to a writable folder")
    if prepare:
        return
    server = venv_bin(venv, "mbridge-perf")
    os.execv(server, [str(server), "serve", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
