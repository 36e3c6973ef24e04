"""estimate_step_time through its doors: the CLI (`mbridge-perf steptime`) and MCP, on the
seeds' real Bridge dump."""

from __future__ import annotations

import json
import subprocess

import pytest
from mcp import Client

from mbridge_perf.server import build_server

from helpers import REPO, tool

DUMP = REPO / "examples" / "llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml"


def test_cli_prints_the_prediction_and_its_breakdown() -> None:
    r = subprocess.run([tool("mbridge-perf"), "steptime", str(DUMP), "--gpu", "H100", "--json"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["num_gpus"] == 32 and out["precision"] == "fp8"
    seconds = sum(t["seconds"] for t in out["breakdown"])
    assert seconds == pytest.approx(out["step_time_s"], rel=1e-6)
    tokens = out["tokens_per_s_per_gpu"] * out["num_gpus"] * out["step_time_s"]
    assert tokens == pytest.approx(out["tokens_per_step"], rel=1e-6)
    r = subprocess.run([tool("mbridge-perf"), "steptime", str(DUMP)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: cluster.gpu")
    assert "Traceback" not in r.stderr
    r = subprocess.run([tool("mbridge-perf"), "steptime", str(DUMP), "--gpu", "H900"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: gpu: unknown GPU")


@pytest.mark.anyio
async def test_mcp_estimate_step_time() -> None:
    async with Client(build_server(REPO)) as c:
        r = await c.call_tool("estimate_step_time", {
            "config": {"bridge_config": DUMP.read_text(), "overrides": ["cluster.gpu=H100"]}})
        assert not r.is_error
        out = r.structured_content
        assert out["step_time_s"] > 0 and 0 < out["mfu"] < 1 and out["band_s"] > 0
        bad = await c.call_tool("estimate_step_time", {
            "config": {"bridge_config": DUMP.read_text()}, "gpu": "H900"})
        assert bad.is_error and "gpu" in bad.content[0].text.lower()
