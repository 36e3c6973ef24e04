"""The `recipe` config source and the recipes resource over the MCP protocol."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client, StdioServerParameters

from mbridge_perf.config.recipes import recipe_index
from mbridge_perf.server import build_server

from helpers import REPO, tool

pytestmark = pytest.mark.anyio

QWEN = "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


async def test_recipe_source_estimates_the_recipe_with_overrides_on_top(client: Client) -> None:
    r = await client.call_tool("estimate_memory", {"config": {"recipe": QWEN}})
    assert not r.is_error, r.content
    base = r.structured_content
    assert base["parallelism"]["expert"] == 8 and base["parallelism"]["world_size"] == 8
    r = await client.call_tool("estimate_memory", {"config": {
        "recipe": QWEN, "overrides": ["train.micro_batch_size=1"], "perf_flags": ["-g", "b300"]}})
    assert not r.is_error, r.content
    assert r.structured_content["peak_allocated_gib"] < base["peak_allocated_gib"]
    assert r.structured_content["gpu"] == "B300"


async def test_perf_flags_resolve_to_the_recipe_and_say_so(client: Client) -> None:
    flags = ["-m", "deepseek", "-mr", "deepseek_v3", "-g", "b200", "-c", "fp8_mx", "-ng", "256"]
    r = await client.call_tool("estimate_memory", {"config": {"perf_flags": flags}})
    assert not r.is_error, r.content
    out = r.structured_content
    assert out["peak_allocated_gib"] < 200
    assert "deepseek_v3_pretrain_256gpu_b200_fp8mx_config" in out["assumptions"][0]


@pytest.mark.parametrize("name", ["qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx", "../x.yaml",
                                  "no_such_recipe_config"])
async def test_unknown_or_path_like_recipe_is_a_clear_tool_error(client: Client,
                                                                 name: str) -> None:
    r = await client.call_tool("validate_config", {"config": {"recipe": name}})
    if name.startswith("qwen3"):  # the suffix is optional
        assert not r.is_error
        return
    text = r.content[0].text
    assert r.is_error and "validate_config: recipe: " in text and "closest: " in text
    assert "Traceback" not in text and len(text.splitlines()) == 1


async def test_recipe_name_length_is_bounded_by_the_schema(client: Client) -> None:
    r = await client.call_tool("validate_config", {"config": {"recipe": "a" * 10_000}})
    assert r.is_error and "config.recipe" in r.content[0].text


async def test_recipes_resource_lists_every_shipped_recipe(client: Client) -> None:
    rows = json.loads((await client.read_resource("mbridge-perf://recipes")).contents[0].text)
    assert {r["name"] for r in rows} == set(recipe_index())
    assert all({"model", "num_gpus", "gpu", "precision", "layout"} <= set(r) for r in rows)


async def test_recipe_source_over_stdio(tmp_path) -> None:
    params = StdioServerParameters(command=tool("mbridge-perf"), args=["serve"],
                                   cwd=str(tmp_path))
    async with Client(params) as c:
        r = await c.call_tool("validate_config", {"config": {"recipe": QWEN}})
    assert not r.is_error, r.content
    assert "findings" in r.structured_content
