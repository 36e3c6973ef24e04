"""Cold start of the MCP server: spawn → first tools/list response, against the floor of
`python -c "import mcp"` measured in the same run. Goal: ratio ≤ 1.5.

Speaks newline-delimited JSON-RPC over the server's stdio directly, so nothing but the
server's own start-up is timed. Prints the figures; asserts nothing (not a test).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "cold-start", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
LIST = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}


def server_command() -> list[str]:
    script = shutil.which("mbridge-perf", path=str(Path(sys.executable).parent))
    return [script, "serve"] if script else [sys.executable, "-m", "mbridge_perf", "serve"]


def time_tools_list(cmd: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, bufsize=1)
    assert proc.stdin and proc.stdout
    try:
        for msg in (INIT, INITIALIZED, LIST):
            proc.stdin.write(json.dumps(msg) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            if json.loads(line).get("id") == 2:
                return time.perf_counter() - start
        raise RuntimeError("server closed stdout before answering tools/list")
    finally:
        proc.kill()
        proc.wait()


def time_import_mcp() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import mcp"], check=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    cmd = server_command()
    time_tools_list(cmd)  # warm the OS file cache once; not counted
    time_import_mcp()
    server = [time_tools_list(cmd) for _ in range(args.repeats)]
    floor = [time_import_mcp() for _ in range(args.repeats)]
    s, f = statistics.median(server), statistics.median(floor)
    print(f"server: {' '.join(cmd)}")
    print(f"spawn -> first tools/list: median {s * 1e3:.0f} ms (min {min(server) * 1e3:.0f}, "
          f"max {max(server) * 1e3:.0f}) over {args.repeats} runs")
    print(f'python -c "import mcp":    median {f * 1e3:.0f} ms (min {min(floor) * 1e3:.0f}, '
          f"max {max(floor) * 1e3:.0f})")
    print(f"ratio: {s / f:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
