"""recommend_recompute and diagnose_oom through the MCP protocol (in memory) and the CLI."""

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

SEED = {"preset": "llama3-70b",
        "bridge_config": (REPO / "examples" / "llama3_70b_sft_h100.yaml").read_text()}
OOM = ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 "
       "has a total capacity of 79.11 GiB of which 245.06 MiB is free. Including non-PyTorch "
       "memory, this process has 78.86 GiB memory in use. Of the allocated memory 54.76 GiB is "
       "allocated by PyTorch, and 22.61 GiB is reserved by PyTorch but unallocated.")


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


async def test_recommend_recompute_over_mcp(client: Client) -> None:
    r = await client.call_tool("recommend_recompute", {"config": SEED})
    assert not r.is_error
    out = r.structured_content
    assert out["steps"][0]["rung"] == "allocator" and out["first_fitting_step"] == 0
    assert out["answer_markdown"].startswith("## Memory plan")


@pytest.mark.parametrize(("args", "field"), [
    ({"config": {"preset": "llama3-8b", "overrides": ["model.seq_length=4096"]}}, "target_gib"),
    ({"config": {"preset": "llama3-70b", "overrides": ["model.num_layers=-1"]}},
     "model.num_layers"),
    ({"config": SEED, "target_gib": -1}, "target_gib"),
])
async def test_recommend_recompute_bad_input_is_a_tool_error_naming_the_field(
        client: Client, args: dict, field: str) -> None:
    r = await client.call_tool("recommend_recompute", args)
    assert r.is_error and field in r.content[0].text


async def test_diagnose_oom_over_mcp_with_and_without_config(client: Client) -> None:
    r = await client.call_tool("diagnose_oom", {"text": OOM})
    assert not r.is_error and r.structured_content["classification"] == "fragmentation"
    assert r.structured_content["plan"] is None
    r = await client.call_tool("diagnose_oom", {"text": OOM, "config": SEED})
    assert r.structured_content["plan"]["steps"][0]["rung"] == "allocator"
    r = await client.call_tool("diagnose_oom", {"text": "x" * 3_000_000})
    assert not r.is_error and r.structured_content["classification"] == "none"


async def test_oom_prompts_point_at_the_new_tools(client: Client) -> None:
    for name in ("oom_triage", "recompute_plan"):
        p = await client.get_prompt(name, {"situation": "OOM at 58.8 GB", "config": "a: 1"})
        text = p.messages[0].content.text
        assert "diagnose_oom" in text and "recommend_recompute" in text


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mbridge_perf", *args], input=stdin,
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def test_cli_recommend_and_diagnose() -> None:
    seed = str(REPO / "examples" / "llama3_70b_sft_h100.yaml")
    r = _cli("recommend", seed, "--preset", "llama3-70b", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["steps"][0]["rung"] == "allocator"
    r = _cli("recommend", seed, "--preset", "llama3-70b", "--target-gib", "5")
    assert r.returncode == 1 and "Nothing on this ladder fits" in r.stdout
    r = _cli("diagnose", "-", "--json", stdin=OOM)
    assert r.returncode == 0 and json.loads(r.stdout)["classification"] == "fragmentation"
    r = _cli("diagnose", "-", "--config", seed, "--preset", "llama3-70b", stdin=OOM)
    assert r.returncode == 0 and "## Memory plan" in r.stdout
    r = _cli("recommend", "--preset", "llama3-8b", "--set", "model.seq_length=4096")
    assert r.returncode == 2 and "target_gib" in r.stderr and "Traceback" not in r.stderr


async def test_every_tool_the_skills_name_is_registered(client: Client) -> None:
    import re

    names = {t.name for t in (await client.list_tools()).tools}
    wanted: set[str] = set()
    for skill in (REPO / "skills").iterdir():
        for doc in [skill / "SKILL.md", *sorted((skill / "references").glob("*.md"))]:
            if doc.exists():
                text = doc.read_text()
                wanted |= {n for n in re.findall(r"`([a-z]+(?:_[a-z]+)+)`", text)
                           if n.endswith(("_config", "_memory", "_recompute", "_oom",
                                          "_parallelism", "_benchmark", "_benchmarks",
                                          "_presets"))
                           or n.startswith("benchmark_")}
    assert {"recommend_recompute", "diagnose_oom", "plan_parallelism"} <= wanted
    # estimate_training_memory is Megatron Bridge's own estimator API, which the skills
    # compare with ours
    assert wanted - names <= {"estimate_training_memory"}, wanted - names
