"""Every door reads a config the same way (the resolved view, config.semantics): over the real
Bridge dumps, the presets and the seed examples, validate_config, estimate_memory's answer,
recommend_recompute, the planner's rescue and the prompts name the same first selective modules
and the same recompute modules in effect, and agree on fused attention and the CUDA-graph scope.
The two contradictions users saw before there was one view are pinned through the MCP protocol.
"""

from __future__ import annotations

import copy
import re
from functools import cache
from typing import Any

import pytest
from mcp import Client

from bridge_corpus import dumps, is_diffusion
from mbridge_perf.advise.ladder import rescue_rungs
from mbridge_perf.advise.pricing import describe
from mbridge_perf.advise.recompute import recommend_recompute
from mbridge_perf.config.derived import Derived, resolved_lines
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.presets import load_presets
from mbridge_perf.memory.answer import estimate_with_answer
from mbridge_perf.rules.validate import validate
from mbridge_perf.server import build_server

from helpers import REPO


@cache
def _configs() -> dict[str, TrainingConfig]:
    """Every language-model dump that loads, every preset (as written, FP32, and BF16) and the
    seed examples."""
    out: dict[str, TrainingConfig] = {}
    for name, data in sorted(dumps().items()):
        if is_diffusion(name):
            continue
        try:
            out[f"dump:{name}"] = load_config(data=copy.deepcopy(data))
        except ConfigError:
            continue
    for name in load_presets():
        out[f"preset:{name}"] = load_config(preset=name)
        out[f"preset-fp32:{name}"] = load_config(preset=name, overrides=["model.bf16=false"])
    for path in sorted((REPO / "examples").glob("*.yaml")):
        out[f"example:{path.name}"] = load_config(file=path)
    return out


def test_the_view_covers_the_corpus() -> None:
    names = _configs()
    assert sum(k.startswith("dump:") for k in names) >= 390
    assert sum(k.startswith("preset") for k in names) == 2 * len(load_presets())
    assert {k for k in names if k.startswith("example:")} == {
        "example:llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml",
        "example:llama3_70b_sft_h100.yaml"}


def _modules_in(text: str) -> list[list[str]]:
    return [[x.strip() for x in m.split(",") if x.strip()]
            for m in re.findall(r"recompute_modules=\[([^\]]*)\]", text)]


def _validate_agrees(cfg: TrainingConfig, d: Derived) -> None:
    findings = {f.rule_id: f for f in validate(cfg).findings}
    wasted = "core_attn" in d.recompute.selective and d.fused_attention
    assert ("recompute.core-attn-fused" in findings) == wasted
    if wasted:
        assert f"[{', '.join(d.first_selective_modules())}]" in \
            findings["recompute.core-attn-fused"].fix


def _estimate_agrees(cfg: TrainingConfig, d: Derived) -> None:
    answer = estimate_with_answer(cfg).answer_markdown or ""
    kept = [x for x in d.recompute.selective if not (d.fused_attention and x == "core_attn")]
    named = _modules_in(answer)
    assert named, answer
    assert named[0] == list(dict.fromkeys([*kept, *d.first_selective_modules()])) or \
        named[0] == list(d.recompute.selective)
    if "If it still OOMs" in answer:
        assert ("frees about 0 under Transformer Engine fused" in answer) == d.fused_attention


def _recommend_agrees(cfg: TrainingConfig, d: Derived) -> None:
    plan = recommend_recompute(cfg, target_gib=1.0, gpu=None if cfg.cluster.gpu else "H100")
    assert any("Attention is fused / flash" in n for n in plan.notes) == d.fused_attention
    order = d.selective_order(long_context=d.long_context)
    firsts = set(d.first_selective_modules(long_context=d.long_context)) - {"layernorm"}
    added = []
    for step in plan.steps:
        if step.rung == "selective":
            mods = step.config_changes["model.recompute_modules"]
            added.append(mods[-1])
    # in the ladder's order, the architecture's cheap modules first (their order by measured
    # saving per cost), never a module already on, never core_attn under fused attention
    ranks = [0 if x in firsts else order.index(x) for x in added]
    assert ranks == sorted(ranks), (added, order)
    assert not set(added) & set(d.recompute.selective)
    assert not (d.fused_attention and "core_attn" in added)


def _rescue_agrees(cfg: TrainingConfig, d: Derived) -> None:
    rungs = rescue_rungs(cfg, d, long_context=d.long_context)
    offered = [r.changes["model.recompute_modules"][0] for r in rungs if r.name == "selective"]
    if cfg.model.recompute_granularity != "full":
        assert offered == [x for x in d.selective_order(long_context=d.long_context)
                           if x not in d.recompute.selective]
    for mod in offered[:1]:
        text = describe(cfg, {"model.recompute_granularity": "selective",
                              "model.recompute_modules": [*d.recompute.selective, mod]})
        assert text == f"selective recompute_modules += {[mod]}"


def _prompt_agrees(cfg: TrainingConfig, d: Derived) -> None:
    text = "\n".join(resolved_lines(d))
    assert f"recompute_modules=[{', '.join(d.first_selective_modules())}]" in text
    assert ("fused / flash" in text) == d.fused_attention
    graphs = d.graphs
    if graphs.te_scopes is not None:
        scope = list(graphs.te_scopes) or "whole layers"
        assert f"per-layer Transformer Engine graphs of {scope}" in text
    elif not graphs.on:
        assert "CUDA graphs: none" in text


@pytest.mark.parametrize("part", ["validate", "estimate", "recommend", "rescue", "prompt"])
def test_every_door_reads_recompute_attention_and_graphs_the_same_way(part: str) -> None:
    check = {"validate": _validate_agrees, "estimate": _estimate_agrees,
             "recommend": _recommend_agrees, "rescue": _rescue_agrees,
             "prompt": _prompt_agrees}[part]
    failed: dict[str, str] = {}
    checked = 0
    for name, cfg in _configs().items():
        d = Derived(cfg)
        try:
            check(cfg, d)
            checked += 1
        except ConfigError:
            continue  # the estimator refuses this config (the bad-input tests cover why)
        except AssertionError as exc:
            failed[name] = str(exc)[:300]
    assert not failed, f"{len(failed)} configs disagree, e.g. {next(iter(failed.items()))}"
    assert checked >= 300


def test_an_fp32_config_is_unfused_and_a_bf16_one_fused() -> None:
    fp32 = Derived(load_config(preset="llama3-8b", overrides=["model.bf16=false"]))
    bf16 = Derived(load_config(preset="llama3-8b", overrides=["mixed_precision=bf16_mixed"]))
    unset = Derived(load_config(preset="llama3-8b"))
    assert not fp32.fused_attention and fp32.first_selective_modules() == ["core_attn"]
    assert bf16.fused_attention and bf16.first_selective_modules() == ["layernorm"]
    # a preset naming no precision trains as Bridge's recipes do: bf16_mixed
    assert unset.precision.assumed and unset.precision.bf16 and unset.fused_attention


def test_recompute_modules_have_one_default_rule() -> None:
    unset = Derived(load_config(preset="llama3-8b", overrides=[
        "model.recompute_granularity=selective"]))
    empty = Derived(load_config(preset="llama3-8b", overrides=[
        "model.recompute_granularity=selective", "model.recompute_modules=[]"]))
    folded = Derived(load_config(preset="qwen3-30b-a3b", overrides=[
        "model.moe_layer_recompute=true"]))
    assert unset.recompute.selective == ("core_attn",)
    assert empty.recompute.selective == ()
    # Megatron-Core: the default ["core_attn"] first, then moe_layer_recompute appends moe
    assert folded.recompute.granularity == "selective"
    assert folded.recompute.selective == ("core_attn", "moe")


# ------------------------------------------------------------------ through MCP


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


async def _call(client: Client, name: str, args: dict[str, Any]) -> dict[str, Any]:
    r = await client.call_tool(name, args)
    assert not r.is_error, r.content[0].text if r.content else r
    return r.structured_content


FP32 = {"preset": "llama3-8b", "overrides": [
    "model.bf16=false", "model.tensor_model_parallel_size=2", "cluster.num_gpus=8",
    "cluster.gpu=H100", "train.global_batch_size=64"]}


@pytest.mark.anyio
async def test_fp32_estimate_and_recommend_name_core_attn_first(client: Client) -> None:
    """Regression: estimate_memory's answer said [layernorm] first ("core_attn frees about 0")
    while recommend_recompute on the same FP32 config started with core_attn. In FP32 Transformer
    Engine runs unfused attention, so core_attn is the first module in both."""
    est = await _call(client, "estimate_memory", {"config": FP32})
    assert "`recompute_modules=[core_attn]`" in est["answer_markdown"]
    assert "frees about 0" not in est["answer_markdown"]
    rec = await _call(client, "recommend_recompute", {"config": FP32, "target_gib": 1.0})
    first = next(s for s in rec["steps"] if s["rung"] == "selective")
    assert first["config_changes"]["model.recompute_modules"] == ["core_attn"]
    bf16 = {**FP32, "overrides": [*FP32["overrides"], "mixed_precision=bf16_mixed"]}
    est = await _call(client, "estimate_memory", {"config": bf16})
    assert "`recompute_modules=[layernorm]` (core_attn frees about 0" in est["answer_markdown"]
    rec = await _call(client, "recommend_recompute", {"config": bf16, "target_gib": 1.0})
    first = next(s for s in rec["steps"] if s["rung"] == "selective")
    assert first["config_changes"]["model.recompute_modules"] == ["layernorm"]


UNFUSED = ["mixed_precision=bf16_mixed", "model.attention_backend=unfused",
           "model.recompute_granularity=selective", "optimizer.use_distributed_optimizer=true"]


def _rungs(plan: dict[str, Any]) -> list[str]:
    return [lay["rung"] for lay in plan["layouts"] if lay["rung"]]


@pytest.mark.anyio
async def test_plan_rescue_reads_the_modules_in_effect(client: Client) -> None:
    """Regression: the planner's rescue claimed to add core_attn when it was already on by
    default (recompute_modules unset), and read an explicit [] as core_attn, so it never
    offered it."""
    unset = await _call(client, "plan_parallelism", {
        "config": {"preset": "llama3-8b", "overrides": UNFUSED}, "num_gpus": 2, "gpu": "H100",
        "seq_length": 4096, "global_batch_size": 64, "top_k": 5})
    selective = [r for r in _rungs(unset) if "selective recompute_modules +=" in r]
    assert selective and not any("core_attn" in r for r in selective)
    empty = await _call(client, "plan_parallelism", {
        "config": {"preset": "llama3-8b", "overrides": [*UNFUSED, "model.recompute_modules=[]"]},
        "num_gpus": 4, "gpu": "H100", "seq_length": 16384, "global_batch_size": 64,
        "top_k": 5})
    assert "selective recompute_modules += ['core_attn']" in " | ".join(_rungs(empty))


@pytest.mark.anyio
async def test_a_prompt_with_a_config_carries_the_tools_reading(client: Client) -> None:
    """The checklist prompts hand the assistant the same reading the tools make: first
    selective modules, attention and graph scope of the seed's real Bridge dump."""
    dump = (REPO / "examples" / "llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml").read_text()
    d = Derived(load_config(text=dump))
    r = await client.get_prompt("recompute_plan", {"situation": "OOM at step 1",
                                                   "config": dump})
    text = r.messages[0].content.text
    assert "How the tools read this config:" in text
    for line in resolved_lines(d):
        assert line in text
    assert "fused / flash" in text and "per-layer Transformer Engine graphs of ['mlp']" in text
