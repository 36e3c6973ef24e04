"""plan_parallelism through its doors: the MCP protocol (in memory) and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from mcp import Client

from mbridge_perf.server import build_server

from helpers import REPO

pytestmark = pytest.mark.anyio

QWEN = {"preset": "qwen3-235b-a22b", "overrides": [
    "mixed_precision.bf16=true", "mixed_precision.grad_reduce_in_fp32=false",
    "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
    "model.recompute_granularity=selective", "model.recompute_modules=[moe_act,layernorm]",
    "model.moe_grouped_gemm=true", "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]}
ARGS = {"config": QWEN, "num_gpus": 128, "gpu": "GB200", "seq_length": 4096,
        "global_batch_size": 128, "top_k": 3,
        "constraints": {"expert_tensor_parallel_size": [1]}}


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


async def test_plan_parallelism_over_mcp(client: Client) -> None:
    r = await client.call_tool("plan_parallelism", ARGS)
    assert not r.is_error, r.content[0].text
    out = r.structured_content
    assert 1 <= len(out["layouts"]) <= 3
    best = out["layouts"][0]
    assert best["rank"] == 1 and best["fit"] == "as_set"
    assert best["attention_mesh"].endswith("= 128") and best["expert_mesh"].endswith("= 128")
    assert best["per_stage"] and best["reasons"]
    assert out["answer_markdown"].startswith("**Best layout on 128")
    assert out["counts"]["priced"] > 0


@pytest.mark.parametrize(("change", "field"), [
    ({"num_gpus": 0}, "num_gpus"), ({"num_gpus": 10**9}, "num_gpus"),
    ({"top_k": 500}, "top_k"), ({"gpu": "TPU"}, "gpu"),
    ({"constraints": {"tp": [1]}}, "tp"),
    ({"constraints": {"context_parallel_size": list(range(1, 1000))}}, "context_parallel_size"),
    ({"config": {"preset": "nope"}}, "preset"),
])
async def test_bad_arguments_are_a_tool_error_naming_the_field(
        client: Client, change: dict, field: str) -> None:
    r = await client.call_tool("plan_parallelism", {**ARGS, **change})
    assert r.is_error and field in r.content[0].text and "Traceback" not in r.content[0].text


async def test_long_context_prompt_calls_plan_parallelism(client: Client) -> None:
    p = await client.get_prompt("long_context_moe_plan", {"situation": "DeepSeek-V3 at 128K"})
    assert "plan_parallelism" in p.messages[0].content.text


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mbridge_perf", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=120)


def test_cli_plan() -> None:
    sets = [x for o in QWEN["overrides"] for x in ("--set", o)]
    r = _cli("plan", "--preset", "qwen3-235b-a22b", *sets, "--gpus", "128", "--gpu", "GB200",
             "--seq", "4096", "--gbs", "128", "--top", "2", "--fix",
             "expert_tensor_parallel_size=1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert len(out["layouts"]) == 2 and out["layouts"][0]["context_parallel_size"] == 1
    r = _cli("plan", "--preset", "qwen3-235b-a22b", *sets, "--gpus", "128", "--gpu", "GB200",
             "--seq", "4096", "--gbs", "128", "--top", "1")
    assert r.returncode == 0 and "**Ranked layouts**" in r.stdout
    r = _cli("plan", "--preset", "qwen3-235b-a22b", "--gpus", "128", "--gpu", "GB200",
             "--seq", "4096", "--gbs", "128", "--fix", "tp=1")
    assert r.returncode == 2 and "constraints.tp" in r.stderr and "Traceback" not in r.stderr
    r = _cli("plan", "--preset", "qwen3-235b-a22b", "--gpus", "0", "--gpu", "GB200",
             "--seq", "4096", "--gbs", "128")
    assert r.returncode == 2 and "--gpus" in r.stderr


def test_cli_plan_deepseek_128k_preset_lists_the_seed_family() -> None:
    """The long-context seed's family (TP·CP = 32, PP 8, EP 32) on 256 H100 at 128K from the
    bare preset: priced in Bridge's bf16_mixed (the preset names no precision), and rescued by
    the memory ladder's distributed optimizer, the long-context module set and optimizer
    offload instead of being rejected for memory."""
    r = _cli("plan", "--preset", "deepseek-v3", "--gpus", "256", "--gpu", "h100", "--seq",
             "131072", "--gbs", "128", "--json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    seed = [lay for lay in plan["layouts"]
            if lay["tensor_model_parallel_size"] * lay["context_parallel_size"] == 32
            and lay["pipeline_model_parallel_size"] == 8
            and lay["expert_model_parallel_size"] == 32]
    assert seed and seed[0]["fit"] in ("as_set", "with_rung")
    if seed[0]["fit"] == "with_rung":
        assert "optimizer CPU offload" in seed[0]["rung"]
        assert "mla_up_proj" in seed[0]["rung"]
    assert not [f for f in plan["rejected"]
                if f["family"].startswith("TP1 PP8 CP32 EP32") and "memory" in f["reason"]]
