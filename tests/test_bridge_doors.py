"""Real Megatron Bridge dumps through both doors: the installed `mbridge-perf` command and the
MCP tools over the protocol (a handful of calls; the corpus itself is tested in-process)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from bridge_corpus import dump_texts
from mbridge_perf.server import build_server

from helpers import REPO, tool

DENSE = "llama3_70b_sft_32gpu_h100_fp8cs_config"
MOE_FULL_ITERATION = "qwen3_235b_a22b_pretrain_64gpu_gb300_nvfp4_full_iteration_config"
MLA = "deepseek_v3_pretrain_256gpu_b200_bf16_config"
WAN = "wan_14b_pretrain_8gpu_h100_bf16_config"


def cli(tmp_path: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"{name}.yaml"
    path.write_text(dump_texts()[name])
    return subprocess.run([tool("mbridge-perf"), *args[:1], str(path), *args[1:]], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_validate_a_real_dump_as_bridge_wrote_it(tmp_path: Path) -> None:
    proc = cli(tmp_path, MLA, "validate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("OK: 0 error(s)") and "data_parallel_size=32" in proc.stdout


def test_cli_estimate_a_real_dump(tmp_path: Path) -> None:
    proc = cli(tmp_path, DENSE, "estimate", "--gpu", "H100")
    assert proc.returncode in (0, 1), proc.stderr  # 1 = does not fit; both are estimates
    assert "error" not in proc.stderr and "stage" in proc.stdout.lower()


def test_cli_mcore_version_follows_the_older_release(tmp_path: Path) -> None:
    proc = cli(tmp_path, MOE_FULL_ITERATION, "validate", "--mcore-version", "0.16.1")
    assert proc.returncode == 1 and "cudagraph.impl-valid" in proc.stdout
    bad = cli(tmp_path, MOE_FULL_ITERATION, "validate", "--mcore-version", "9.9")
    assert bad.returncode == 2 and bad.stderr.startswith("error: mcore_version:")


def test_cli_a_diffusion_dump_is_refused_in_one_line(tmp_path: Path) -> None:
    proc = cli(tmp_path, WAN, "validate")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "WanModelProvider" in proc.stderr


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


@pytest.mark.anyio
async def test_mcp_tools_on_real_dumps(client: Client) -> None:
    r = await client.call_tool("validate_config",
                               {"config": {"bridge_config": dump_texts()[MOE_FULL_ITERATION]}})
    assert not r.is_error and r.structured_content["ok"] is True
    warned = {f["rule_id"] for f in r.structured_content["findings"]}
    assert "world.edp-divisible" in warned  # the dump's 64 GPUs cannot hold EP32 x PP4
    old = await client.call_tool("validate_config", {
        "config": {"bridge_config": dump_texts()[MOE_FULL_ITERATION]}, "mcore_version": "0.16.1"})
    assert old.structured_content["ok"] is False
    est = await client.call_tool("estimate_memory", {
        "config": {"bridge_config": dump_texts()[MLA]}, "gpu": "B200"})
    assert not est.is_error and len(est.structured_content["per_stage"]) == 8
    wan = await client.call_tool("validate_config",
                                 {"config": {"bridge_config": dump_texts()[WAN]}})
    assert wan.is_error and "WanModelProvider" in wan.content[0].text


def test_the_example_dump_is_bridges_own_and_is_ok() -> None:
    example = REPO / "examples" / f"{DENSE.removesuffix('_config')}_bridge_dump.yaml"
    assert example.read_text() == dump_texts()[DENSE]  # as Bridge wrote it
    proc = subprocess.run([tool("mbridge-perf"), "validate", str(example), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and '"ok": true' in proc.stdout
