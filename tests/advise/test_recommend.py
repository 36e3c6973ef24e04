"""recommend_recompute: the skills' ladder on real configs - allocator first for the seeds'
fragmentation case, the selective module the architecture calls for, full recompute with both
fields, FP8 + TE graphs handled, every step valid, never TP up or a VPP change."""

from __future__ import annotations

import re

import pytest
import yaml

from mbridge_perf.advise.changes import apply_changes
from mbridge_perf.advise.recompute import RecomputePlan, recommend_recompute
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.rules.validate import validate

from helpers import REPO

SEED = REPO / "examples" / "llama3_70b_sft_h100.yaml"
CLUSTER = ["cluster.num_gpus=8", "cluster.gpu=H100", "train.micro_batch_size=1",
           "mixed_precision.bf16=true"]


def seed(*overrides: str):
    return load_config(preset="llama3-70b", file=SEED, overrides=overrides)


def selective_modules(plan: RecomputePlan) -> list[str]:
    """Modules the selective steps add, in order (each step appends one)."""
    return [s.config_changes["model.recompute_modules"][-1] for s in plan.steps
            if s.rung == "selective"]


def step_configs(cfg, plan: RecomputePlan):
    """Each step's whole config (its changes on top of the step it builds on)."""
    out = []
    for s in plan.steps:
        base = cfg if s.builds_on is None else out[s.builds_on]
        out.append(apply_changes(base, s.config_changes))
    return out


# --------------------------------------------------------------------------- the seed case

def test_seed_case_gets_the_allocator_fix_first_and_it_fits() -> None:
    plan = recommend_recompute(seed())
    assert plan.scenario == "fragmentation"
    first = plan.steps[0]
    assert first.rung == "allocator"
    assert first.config_changes == {"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert first.throughput_cost.pct == 0.0 and first.fits
    assert plan.first_fitting_step == 0


def test_seed_case_never_raises_tp_or_changes_vpp() -> None:
    plan = recommend_recompute(seed(), target_gib=40)  # nothing fits: the whole ladder runs
    for s in plan.steps:
        keys = set(s.config_changes)
        assert not keys & {"model.tensor_model_parallel_size",
                           "model.virtual_pipeline_model_parallel_size",
                           "model.pipeline_model_parallel_size"}, s
    assert "tensor_model_parallel_size=8" not in plan.answer_markdown


def test_seed_case_says_core_attn_frees_about_nothing_under_fused_attention() -> None:
    plan = recommend_recompute(seed())
    assert any("core_attn" in n and "≈ 0" in n for n in plan.notes)
    assert "core_attn" not in selective_modules(plan)


def test_seed_selective_steps_drop_core_attn_under_fused_attention_and_say_why() -> None:
    """The seed recomputes [core_attn] under fused attention: the selective steps write lists
    without it (frees ≈ 0, costs step time; mlp alone beat mlp + core_attn, 593.6 vs 586.8)."""
    plan = recommend_recompute(seed(), target_gib=40)
    steps = [s for s in plan.steps if s.rung == "selective"]
    assert steps and all("core_attn" not in s.config_changes["model.recompute_modules"]
                         for s in steps)
    assert "drops core_attn" in steps[0].rationale and "costs step time" in steps[0].rationale


def test_unfused_attention_keeps_core_attn_in_the_selective_lists() -> None:
    plan = recommend_recompute(seed("model.attention_backend=unfused"), target_gib=40)
    lists = [s.config_changes["model.recompute_modules"] for s in plan.steps
             if s.rung == "selective"]
    assert lists and all("core_attn" in mods for mods in lists)


def test_seed_mlp_step_quotes_the_measured_16_percent_with_its_source() -> None:
    plan = recommend_recompute(seed())
    mlp = next(s for s in plan.steps if s.rung == "selective"
               and "mlp" in s.config_changes["model.recompute_modules"])
    assert mlp.throughput_cost.basis == "measured" and mlp.throughput_cost.pct == 16.4
    assert "activation-recompute" in mlp.throughput_cost.source
    # layernorm (near-free) comes before mlp (the last selective resort)
    assert selective_modules(plan).index("layernorm") < selective_modules(plan).index("mlp")


def _first(text: str, needles: list[str]) -> int:
    low = text.lower()
    hits = [low.find(n.lower()) for n in needles]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else -1


@pytest.mark.parametrize("skill", ["nemo-mbridge-perf-memory-tuning",
                                   "nemo-mbridge-perf-activation-recompute"])
def test_seed_answer_follows_the_skill_checklist_in_order(skill: str) -> None:
    card = yaml.safe_load((REPO / "skills" / skill / "card.yaml").read_text())
    text = recommend_recompute(seed()).answer_markdown
    last = -1
    for item in card["answer_checklist"]:
        pos = _first(text, item["match"])
        assert pos >= 0, f"{item['id']} not said"
        if item["kind"] == "recommend":
            assert pos > last, f"{item['id']} out of order"
            last = pos


def test_every_seed_step_config_passes_validate() -> None:
    cfg = seed()
    plan = recommend_recompute(cfg, target_gib=40)
    for s, c in zip(plan.steps, step_configs(cfg, plan), strict=True):
        assert validate(c).ok, (s.action, [f.rule_id for f in validate(c).findings
                                           if f.severity == "error"])


def test_full_recompute_steps_carry_method_and_num_layers() -> None:
    plan = recommend_recompute(seed(), target_gib=40)
    full = [s for s in plan.steps if s.rung == "full"]
    assert full
    for s in full:
        assert s.config_changes["model.recompute_granularity"] == "full"
        assert s.config_changes["model.recompute_method"] in ("uniform", "block")
        assert s.config_changes["model.recompute_num_layers"] >= 1
        assert "uniform" in s.rationale or "block" in s.rationale


def test_nothing_fits_names_a_parallelism_change_not_tp() -> None:
    plan = recommend_recompute(seed(), target_gib=10)
    assert plan.first_fitting_step is None and plan.scenario == "capacity"
    note = next(n for n in plan.notes if "Nothing on this ladder fits" in n)
    assert "pipeline stages" in note and "not a TP increase" in note


# --------------------------------------------------------------------------- architectures

def test_fp8_with_te_scoped_graphs_never_gets_full_recompute_without_a_valid_graph_setting(
        ) -> None:
    cfg = seed("model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[mlp]",
               "env.NCCL_GRAPH_REGISTER=0")
    plan = recommend_recompute(cfg, target_gib=40)
    full = [s for s in plan.steps if s.rung == "full"]
    assert full and all(s.config_changes.get("model.cuda_graph_impl") == "none" for s in full)
    for s, c in zip(plan.steps, step_configs(cfg, plan), strict=True):
        assert not [f for f in validate(c).findings if f.severity == "error"
                    and f.rule_id.startswith("recompute.full")], s.action
    assert "full_iteration" in plan.answer_markdown


def test_grouped_gemm_moe_gets_moe_act_first() -> None:
    cfg = load_config(preset="qwen3-30b-a3b", overrides=[
        *CLUSTER,
        "model.moe_grouped_gemm=true",
        "model.expert_model_parallel_size=8",
        "model.seq_length=4096",
        "train.global_batch_size=64"])
    plan = recommend_recompute(cfg, target_gib=30)
    assert selective_modules(plan)[0] == "moe_act"


def test_mla_gets_mla_up_proj_first() -> None:
    cfg = load_config(preset="moonlight-16b-a3b", overrides=[
        *CLUSTER,
        "model.moe_grouped_gemm=false",
        "model.expert_model_parallel_size=8",
        "model.tensor_model_parallel_size=1",
        "model.seq_length=4096",
        "train.global_batch_size=64"])
    plan = recommend_recompute(cfg, target_gib=20)
    assert selective_modules(plan)[0] == "mla_up_proj"


def test_mla_with_grouped_gemm_moe_starts_with_one_of_the_two() -> None:
    cfg = load_config(preset="moonlight-16b-a3b", overrides=[
        *CLUSTER,
        "model.moe_grouped_gemm=true",
        "model.expert_model_parallel_size=8",
        "model.tensor_model_parallel_size=1",
        "model.seq_length=4096",
        "train.global_batch_size=64"])
    plan = recommend_recompute(cfg, target_gib=20)
    assert selective_modules(plan)[0] in ("mla_up_proj", "moe_act")
    assert {"mla_up_proj", "moe_act"} <= set(selective_modules(plan))


def test_unfused_attention_gets_core_attn_first() -> None:
    cfg = load_config(preset="llama3-8b", overrides=[
        *CLUSTER,
        "model.attention_backend=unfused",
        "model.seq_length=8192",
        "train.global_batch_size=8",
        "mixed_precision.bf16=true"])
    plan = recommend_recompute(cfg, target_gib=40)
    assert selective_modules(plan)[0] == "core_attn"


def test_fused_dense_is_told_core_attn_saves_about_nothing() -> None:
    cfg = load_config(preset="llama3-8b", overrides=[
        *CLUSTER,
        "model.seq_length=8192",
        "train.global_batch_size=8",
        "mixed_precision.bf16=true"])
    plan = recommend_recompute(cfg, target_gib=40)
    assert any("core_attn recompute frees ≈ 0" in n for n in plan.notes)
    assert "core_attn" not in selective_modules(plan)


def test_pp1_offers_activation_offload_as_an_alternative_without_recompute() -> None:
    cfg = load_config(preset="llama3-8b", overrides=[
        *CLUSTER,
        "model.seq_length=8192",
        "train.global_batch_size=8",
        "mixed_precision.bf16=true",
        "optimizer.use_distributed_optimizer=true",
        "ddp.use_distributed_optimizer=true"])
    plan = recommend_recompute(cfg, target_gib=20)
    off = [s for s in plan.steps if s.rung == "activation_offload"]
    assert off and off[0].config_changes["model.recompute_granularity"] is None
    assert any(s.rung == "optimizer_offload" for s in plan.steps)
    for s, c in zip(plan.steps, step_configs(cfg, plan), strict=True):
        assert validate(c).ok, s.action


def test_allocator_with_graphs_also_sets_nccl_graph_register() -> None:
    plan = recommend_recompute(seed("model.cuda_graph_impl=transformer_engine",
                                    "model.cuda_graph_modules=[mlp]"))
    assert plan.steps[0].config_changes["env.NCCL_GRAPH_REGISTER"] == "0"


def test_no_allocator_step_with_nccl_user_buffers() -> None:
    plan = recommend_recompute(seed("ddp.nccl_ub=true"))
    assert all(s.rung != "allocator" for s in plan.steps)
    assert any("nccl_ub" in s for s in plan.skipped)


# --------------------------------------------------------------------------- input

def test_no_budget_is_one_error_naming_target_gib() -> None:
    cfg = load_config(preset="llama3-8b", overrides=["model.seq_length=4096"])
    with pytest.raises(ConfigError, match="target_gib"):
        recommend_recompute(cfg)
    with pytest.raises(ConfigError, match="target_gib"):
        recommend_recompute(seed(), target_gib=-3)


def test_overrides_are_pasteable() -> None:
    plan = recommend_recompute(seed(), target_gib=40)
    cfg = seed()
    for s in plan.steps:
        if s.builds_on is None:
            again = load_config(preset="llama3-70b", file=SEED, overrides=s.overrides)
            assert again == apply_changes(cfg, s.config_changes) or all(
                re.match(r"^[a-z_]+\.[\w.]+=", o) for o in s.overrides)


def test_distributed_optimizer_comes_before_recompute_when_dp_is_above_one() -> None:
    cfg = load_config(preset="moonlight-16b-a3b", overrides=[
        *CLUSTER, "model.moe_grouped_gemm=true", "model.expert_model_parallel_size=8",
        "model.tensor_model_parallel_size=1", "model.seq_length=4096",
        "train.global_batch_size=64"])
    plan = recommend_recompute(cfg, target_gib=20)
    rungs = [s.rung for s in plan.steps]
    assert rungs[:2] == ["allocator", "distributed_optimizer"]
    assert plan.steps[1].est_saving_gib > 5
    full = next(s for s in plan.steps if s.rung == "full")
    assert full.builds_on == 1  # on the sharded optimizer, not on the selective steps
    for s, c in zip(plan.steps, step_configs(cfg, plan), strict=True):
        assert validate(c).ok, s.action


@pytest.mark.parametrize(("preset", "extra", "target"), [
    ("qwen3-30b-a3b", ["model.moe_grouped_gemm=true", "model.expert_model_parallel_size=8",
                       "model.seq_length=4096", "train.global_batch_size=64"], 30),
    ("moonlight-16b-a3b", ["model.moe_grouped_gemm=true", "model.expert_model_parallel_size=8",
                           "model.tensor_model_parallel_size=1", "model.seq_length=4096",
                           "train.global_batch_size=64"], 20),
    ("llama3-8b", ["model.attention_backend=unfused", "model.seq_length=8192",
                   "train.global_batch_size=8"], 30),
], ids=["grouped-gemm-moe", "mla-moe", "unfused-dense"])
def test_every_step_config_passes_validate_on_other_architectures(
        preset: str, extra: list[str], target: float) -> None:
    cfg = load_config(preset=preset, overrides=[*CLUSTER, *extra])
    plan = recommend_recompute(cfg, target_gib=target)
    assert plan.steps
    for s, c in zip(plan.steps, step_configs(cfg, plan), strict=True):
        errors = [f.rule_id for f in validate(c).findings if f.severity == "error"]
        assert not errors, (s.action, errors)
        if s.rung == "full":
            assert {"model.recompute_method", "model.recompute_num_layers"} <= set(
                s.config_changes)


# --------------------------------------------------------------------------- verdicts

DUMP = REPO / "examples" / "llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml"


def test_the_ladder_stops_at_the_allocator_on_the_seed_dump_without_it() -> None:
    """The real Bridge dump of the seeds' recipe without its allocator variable: tight (the
    reserved band decides), the first step is expandable_segments and it fits; mlp and the
    rest are optional margin, never needed, and no step touches TP."""
    cfg = load_config(file=DUMP, overrides=["env.PYTORCH_CUDA_ALLOC_CONF="])
    plan = recommend_recompute(cfg, gpu="H100")
    assert plan.baseline.verdict == "tight" and plan.scenario == "fragmentation"
    first = plan.steps[0]
    assert first.rung == "allocator" and first.verdict in ("fits", "tight")
    assert plan.first_fitting_step == 0
    assert all(s.optional for s in plan.steps[1:])
    assert not any("tensor_model_parallel_size" in k for s in plan.steps
                   for k in s.config_changes)
    assert "stop at the first that fits or is tight (step 1: " in plan.answer_markdown
    assert "optional margin" in plan.answer_markdown


def test_a_config_that_fits_gets_no_steps_cli_and_mcp(tmp_path) -> None:
    import subprocess

    from helpers import tool

    plan = recommend_recompute(load_config(file=DUMP), gpu="H100")
    assert plan.baseline.verdict == "fits" and plan.scenario == "fits"
    assert plan.steps == [] and plan.first_fitting_step is None
    assert "already fits" in plan.answer_markdown
    proc = subprocess.run([tool("mbridge-perf"), "recommend", str(DUMP), "--gpu", "H100",
                           "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert yaml.safe_load(proc.stdout)["steps"] == []


@pytest.mark.anyio
async def test_a_config_that_fits_gets_no_steps_over_mcp() -> None:
    from mcp import Client

    from mbridge_perf.server import build_server

    async with Client(build_server(REPO)) as c:
        r = await c.call_tool("recommend_recompute", {"config": {
            "bridge_config": DUMP.read_text(), "overrides": ["cluster.gpu=H100"]}})
    assert not r.is_error
    assert r.structured_content["steps"] == []
    assert r.structured_content["baseline"]["verdict"] == "fits"


def test_a_rung_without_a_measured_cost_gets_the_step_time_models_prediction() -> None:
    """Qwen3-30B-A3B at 16K on 8 GB200 (Bridge's MXFP8 recipe): no skill measured moe_act or
    layernorm recompute on it, so their cost is estimate_step_time before and after the rung,
    labelled "model"; without a GPU to time a step it falls back to the FLOPs ratio."""
    from mbridge_perf.steptime import predict_step_time_s

    cfg = load_config(recipe="qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx",
                      overrides=["cluster.num_gpus=8", "cluster.gpu=GB200",
                                 "model.seq_length=16384"])
    plan = recommend_recompute(cfg)
    first = plan.steps[0]
    cost = first.throughput_cost
    assert cost.basis == "model" and "estimate_step_time" in cost.source
    before = predict_step_time_s(cfg)
    after = predict_step_time_s(apply_changes(cfg, first.config_changes))
    assert cost.pct == pytest.approx(round((after / before - 1) * 100, 1))
    assert cost.pct > 0  # recompute repeats work: never predicted free
    no_gpu = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gpu": None})})
    assert recommend_recompute(no_gpu, gpu="GB200").steps[0].throughput_cost == cost
    no_batch = no_gpu.model_copy(update={"cluster": no_gpu.cluster.model_copy(
        update={"num_gpus": None})})
    flops = recommend_recompute(no_batch, gpu="GB200").steps[0].throughput_cost
    assert flops.basis == "estimate" and "FLOPs" in flops.source
