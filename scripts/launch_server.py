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
from contextlib import contextmanager
from pathlib import Path
from typing import IO

MIN_PYTHON = (3, 11)
ROOT = Path(__file__).resolve().parent.parent
STAMP = ".mbridge-perf-install"
# pip gives up on an unreachable index after retries x timeout; the whole install is bounded too
PIP_NETWORK = ["--retries", "2", "--timeout", "20"]
INSTALL_TIMEOUT_S = float(os.environ.get("MBRIDGE_PERF_INSTALL_TIMEOUT", "900"))


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


def install_key() -> str:
    """What the install depends on: the package version and build files, where the plugin root
    is, and the interpreter. A new plugin version (a new root or pyproject) reinstalls."""
    h = hashlib.sha256()
    h.update(str(ROOT).encode())
    h.update(sys.version.encode())
    for name in ("pyproject.toml", "setup.py"):
        try:
            h.update((ROOT / name).read_bytes())
        except OSError:
            fail(f"{ROOT / name} is missing; this script must stay in the scripts/ folder of "
                 "an mbridge-perf checkout or plugin")
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


def run_logged(cmd: list[str], log: IO[str], deadline: float, what: str) -> None:
    """Run one install step, its output to the log and the headline lines to stderr."""
    import re
    import subprocess
    import time
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout
    tail: list[str] = []
    for line in proc.stdout:
        log.write(line)
        tail = [*tail[-4:], line.rstrip()]
        if re.match(r"(Collecting|Building|Successfully|ERROR)", line):
            say(f"  {line.rstrip()[:120]}")
        if time.monotonic() > deadline:
            proc.kill()
            break
    code = proc.wait()
    if time.monotonic() > deadline:
        fail(f"{what} took longer than {INSTALL_TIMEOUT_S:.0f} s "
             f"(MBRIDGE_PERF_INSTALL_TIMEOUT); full log: {log.name}")
    if code != 0:
        last = " | ".join(t for t in tail if t.strip())[-400:]
        fail(f"{what} failed (exit {code}): {last}; full log: {log.name}. "
             "Fix the cause (network to PyPI, disk space) and start the server again.")


def install(venv: Path, key: str) -> None:
    import time  # install-path imports stay out of the warm start

    folder = venv.parent
    started = time.monotonic()
    deadline = started + INSTALL_TIMEOUT_S
    say(f"first start: installing the server into {venv} (one time, about a minute)")
    with open(folder / "install.log", "w") as log:
        py = venv_bin(venv, "python")
        if not py.exists():
            say(f"  creating a virtual environment with {sys.executable}")
            run_logged([sys.executable, "-m", "venv", str(venv)], log, deadline,
                       "creating the virtual environment (on Debian/Ubuntu: apt install "
                       "python3-venv)")
        (venv / STAMP).unlink(missing_ok=True)
        say(f"  installing mbridge-perf from {ROOT}")
        run_logged([str(py), "-m", "pip", "install", "--disable-pip-version-check", "--no-input",
                    "--progress-bar", "off", *PIP_NETWORK, "--upgrade", str(ROOT)],
                   log, deadline, "pip install")
        run_logged([str(venv_bin(venv, "mbridge-perf")), "--version"], log, deadline,
                   "checking the installed command")
    (venv / STAMP).write_text(key + "\n")
    say(f"installed in {time.monotonic() - started:.0f} s; later starts skip this step")


def main(argv: list[str]) -> None:
    if sys.version_info < MIN_PYTHON:
        fail(f"Python {'.'.join(map(str, MIN_PYTHON))} or newer is needed, this is "
             f"{sys.version.split()[0]} ({sys.executable})")
    prepare = argv[:1] == ["--prepare"]
    folder = data_dir()
    venv = folder / "venv"
    key = install_key()
    if not installed(venv, key):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            fail(f"cannot create the data folder {folder}: {exc.strerror}; set "
                 "MBRIDGE_PERF_DATA to a writable folder")
        with install_lock(folder):
            if not installed(venv, key):  # another start may have finished meanwhile
                install(venv, key)
    if prepare:
        return
    server = venv_bin(venv, "mbridge-perf")
    os.execv(server, [str(server), "serve", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
