"""plan_parallelism: enumeration rules, min_gpus, uneven pipeline splits, the ranking, the
rescue ladder, every returned layout validated and priced exactly as estimate_memory prices it,
and answer_markdown in the long-context skill's checklist order."""

from __future__ import annotations

import copy
import itertools
import math
import re
from functools import cache

import pytest
import yaml

from bridge_corpus import dumps
from mbridge_perf.advise.changes import apply_changes
from mbridge_perf.advise.layouts import cp_start, min_gpus, min_gpus_for, pipeline_splits
from mbridge_perf.advise.parallelism import (
    ParallelismPlan,
    PlannedLayout,
    layout_config,
    plan_parallelism,
)
from mbridge_perf.advise.pricing import fits_central
from mbridge_perf.config.derived import derive
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import estimate_memory
from mbridge_perf.memory.placement import placement
from mbridge_perf.rules.validate import validate

from helpers import REPO

ETP1 = {"expert_tensor_parallel_size": [1]}
# Qwen3-235B-A22B as Bridge's GB200 BF16 recipe dump sets it (HybridEP, TE graphs of attn /
# moe_router / moe_preprocess, distributed optimizer, BF16 grads), with the long-context
# seed's recompute
QWEN_DUMP = "qwen3_235b_a22b_pretrain_64gpu_gb200_bf16_config"
QWEN_SEED = {"model.recompute_granularity": "selective",
             "model.recompute_modules": ["moe_act", "layernorm"]}


def dump_config(name: str, changes: dict) -> TrainingConfig:
    return apply_changes(load_config(data=copy.deepcopy(dumps()[name])), changes)


@cache
def qwen() -> TrainingConfig:
    return dump_config(QWEN_DUMP, QWEN_SEED)


@cache
def qwen_plan(seq: int) -> ParallelismPlan:
    return plan_parallelism(qwen(), 128, "GB200", seq, 128, top_k=8, constraints=ETP1)


# ------------------------------------------------------------------ min_gpus


def test_min_gpus_is_pp_times_lcm_not_the_product() -> None:
    assert min_gpus(tp=2, pp=8, cp=8, ep=32) == 512  # ETP unset = TP: expert mesh 64 x PP
    assert min_gpus(tp=2, pp=8, cp=8, ep=32, etp=1) == 256
    assert 2 * 8 * 8 * 32 * 2 == 8192  # the product TP·PP·CP·EP·ETP a naive count gives
    assert min_gpus(tp=1, pp=8, cp=32, ep=32, etp=1) == 256  # DeepSeek-V3 128K seed
    assert min_gpus(tp=1, pp=8, cp=64, ep=32, etp=1) == 512  # 256K seed
    assert min_gpus(tp=4, pp=4, cp=4, ep=32, etp=1) == 128  # Qwen3-235B seed
    assert min_gpus(tp=4, pp=4, cp=4, ep=32) == 512  # ... with ETP left unset


def test_min_gpus_for_a_sequence_sizes_cp_from_seq_over_4096() -> None:
    ds = load_config(preset="deepseek-v3").model
    assert min_gpus_for(ds, 262144, pp=8, ep=32, etp=1) == 512  # CP 64: the 256K seed
    assert min_gpus_for(ds, 131072, pp=8, ep=32, etp=1) == 256  # CP 32: the 128K seed
    assert min_gpus_for(qwen().model, 131072, tp=4, pp=4, ep=32, etp=1, cp=4) == 128
    with pytest.raises(ConfigError, match="expert_model_parallel_size"):
        min_gpus_for(ds, 131072, ep=48)


def test_min_gpus_agrees_with_the_validators_derived_value() -> None:
    cfg = load_config(preset="deepseek-v3", overrides=[
        "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=8",
        "model.context_parallel_size=8", "model.expert_model_parallel_size=32"])
    assert derive(cfg).min_gpus == min_gpus(tp=2, pp=8, cp=8, ep=32) == 512


@pytest.mark.parametrize("bad", [{"tp": 0}, {"ep": -1}, {"pp": True}, {"cp": 2.5}])
def test_min_gpus_bad_input_names_the_field(bad: dict) -> None:
    with pytest.raises(ConfigError, match="_size"):
        min_gpus(**bad)


# ------------------------------------------------------------------ enumeration


def test_uneven_layers_get_bridges_split_not_a_rejection() -> None:
    ds = load_config(preset="deepseek-v3").model
    splits = {s.vpp: s for s in pipeline_splits(ds, 8)}
    # DeepSeek-V3 61 layers + MTP at PP8 VPP4: the layout Bridge's H100 recipe dumps carry
    assert splits[4].layout == "Et|(tt|)*30mL"
    assert splits[1].layout == "Etttttttt|(tttttttt|)*6tttttmL"
    q = qwen().model
    qs = {s.vpp: s for s in pipeline_splits(q, 4)}
    assert qs[12].kind == "account"  # (94 + 2) / 48 = 2 per chunk, as Bridge's Qwen recipes
    for m, split in ((ds, splits[4]), (q, qs[12])):
        chunks = placement(m.model_copy(update={
            k.split(".")[1]: v for k, v in split.changes().items()}))
        assert sum(c.num_layers for stage in chunks for c in stage) == m.num_layers


def test_cp_starts_at_seq_over_4096() -> None:
    assert [cp_start(s) for s in (4096, 32768, 131072, 262144)] == [1, 8, 32, 64]


def test_the_seq_over_4096_rule_applies_where_its_start_rounds_to_cp_8() -> None:
    """One predicate decides both the tie-break key (7) and the plan answer's wording."""
    from mbridge_perf.advise.layouts import cp_rule_applies

    assert [cp_rule_applies(cp_start(s)) for s in (8192, 16384, 24576, 32768, 131072)] == [
        False, False, True, True, True]


def test_rejected_families_name_the_rule() -> None:
    plan = qwen_plan(131072)
    nvl = [r for r in plan.rejected if "tp.crosses-nvlink-domain" in r.reason]
    assert [r.family for r in nvl] == ["TP128"]  # NVL72: TP 64 is inside the domain
    ds = plan_parallelism(load_config(preset="deepseek-v3", overrides=[
        "mixed_precision=bf16_mixed"]), 256, "H100", 131072, 128, top_k=3, constraints=ETP1)
    reasons = {r.reason.split(": ")[0] for r in ds.rejected} | {
        r.reason for r in ds.rejected}
    assert any("tp.crosses-nvlink-domain" in r for r in reasons)  # TP16 on an 8-GPU board
    assert any(r.startswith("memory") for r in reasons)


# ------------------------------------------------------------------ results are real


def test_every_returned_layout_validates_and_is_priced_as_estimate_memory_prices_it() -> None:
    for plan in (qwen_plan(131072), qwen_plan(4096)):
        assert plan.layouts
        for lay in plan.layouts:
            cfg = layout_config(qwen(), plan, lay)
            assert validate(cfg).ok, lay
            rep = estimate_memory(cfg)
            assert [round(s.peak_allocated_gib, 3) for s in rep.per_stage] == [
                s.peak_allocated_gib for s in lay.per_stage]
            assert rep.most_loaded_stage == lay.most_loaded_stage
            assert round(rep.headroom_gib, 2) == lay.headroom_gib
            d = derive(cfg)
            assert (d.dp, d.edp, d.min_gpus) == (lay.data_parallel_size,
                                                 lay.expert_data_parallel_size, lay.min_gpus)
            assert d.num_microbatches == lay.num_microbatches


def test_meshes_are_spelt_out_and_multiply_to_the_world() -> None:
    for lay in qwen_plan(131072).layouts:
        for mesh in (lay.attention_mesh, lay.expert_mesh):
            assert mesh is not None
            left, right = mesh.split(" = ")
            prod = 1
            for n in re.findall(r"\d+", left):
                prod *= int(n)
            assert prod == int(right) == 128


def _key(x: PlannedLayout, d: float, nvlink: int) -> tuple:
    """The skills' keys, from the result alone (module docstring of advise/parallelism.py)."""
    fit_rank = {"as_set": 0, "with_rung": 1, "no": 2}
    return (fit_rank[x.fit], not x.fits_with_fragmentation, max(0.0, d),
            x.tensor_model_parallel_size, x.expert_tensor_parallel_size,
            math.ceil(x.expert_model_parallel_size * x.expert_tensor_parallel_size / nvlink),
            -x.data_parallel_size, abs(d), x.pipeline_model_parallel_size, x.bubble_fraction)


def _tie_runs(lays: list[PlannedLayout]) -> list[list[PlannedLayout]]:
    runs: list[list[PlannedLayout]] = []
    for x in lays:
        if runs and runs[-1][0].rank in x.tied_with:
            runs[-1].append(x)
        else:
            runs.append([x])
    return runs


def test_ranking_is_by_predicted_speed_with_ties_in_key_order() -> None:
    plan = qwen_plan(131072)
    lays = plan.layouts
    assert all(x.predicted_tokens_per_s_per_gpu for x in lays)
    runs = _tie_runs(lays)
    # tie groups are consecutive and symmetric
    for run in runs:
        ranks = {x.rank for x in run}
        assert all(set(x.tied_with) == ranks - {x.rank} for x in run)
    # between groups of the same fit class: every layout of a group is predicted faster than
    # every layout of the next; within a group: the skills' keys, in order
    for a, b in itertools.pairwise(runs):
        if a[0].fit == b[0].fit:
            assert min(x.predicted_tokens_per_s_per_gpu for x in a) > \
                max(x.predicted_tokens_per_s_per_gpu for x in b)
    for run in runs:
        keys = [_key(x, math.log2(x.context_parallel_size / plan.cp_start), plan.nvlink_domain)
                for x in run]
        assert keys == sorted(keys)
    assert all(x.fit != "no" for x in lays)  # misses are listed only when nothing fits
    why = lays[1].reasons[0]
    assert why.startswith("tie with #1 by predicted speed") if lays[1].tied_with and \
        1 in lays[1].tied_with else why.startswith("below #1: predicted ")
    assert any("predicted step" in r for r in lays[0].reasons)


def test_ranking_by_keys_alone_follows_the_keys_in_order() -> None:
    plan = plan_parallelism(qwen(), 128, "GB200", 131072, 128, top_k=8, constraints=ETP1,
                            rank_by="keys")
    lays = plan.layouts
    keys = [_key(x, math.log2(x.context_parallel_size / plan.cp_start), plan.nvlink_domain)
            for x in lays]
    assert keys == sorted(keys)
    assert len({k[:4] for k in keys}) > 1  # the order is decided by the keys, not by ties
    assert lays[1].reasons[0].startswith("below #1 on: ")
    assert all(x.tied_with == [] for x in lays)


def test_speed_order_groups_within_the_band() -> None:
    from mbridge_perf.advise.speed import Predicted, order_by_speed

    def p(tps: float) -> Predicted:
        return Predicted(step_time_s=1 / tps, tokens_per_s_per_gpu=tps, band_s=0.0,
                         largest_term="compute", terms=(("compute", 1 / tps),))

    # 100 and 95 tie (5 % < 10 %); 80 is its own group; None goes last in its bucket;
    # bucket 1 (a rung) after bucket 0 however fast
    preds = [p(95), p(100), None, p(80), p(500)]
    keys = [(0,), (1,), (2,), (3,), (4,)]
    order, groups = order_by_speed(preds, keys, [0, 0, 0, 0, 1], 0.10)
    assert order == [0, 1, 3, 2, 4]  # the tie is ordered by keys: 95's key comes first
    assert groups[0] == groups[1] and len(set(groups)) == 4


def test_a_4k_run_gets_cp1_first() -> None:
    plan = qwen_plan(4096)
    assert plan.cp_start == 1
    assert plan.layouts[0].context_parallel_size == 1 and plan.layouts[0].fit == "as_set"


def test_256k_is_never_offered_full_recompute_as_the_way_to_fit() -> None:
    # no recompute set: at 256K the rescue ladder may add selective modules and offload,
    # never full recompute (it repeats attention, which dominates the step at long sequence)
    bare = dump_config(QWEN_DUMP, {"model.recompute_granularity": None})
    plan = plan_parallelism(bare, 128, "GB200", 262144, 128, top_k=10, constraints=ETP1)
    assert plan.layouts and all(lay.fit != "no" for lay in plan.layouts)
    for lay in plan.layouts:
        assert "full" not in (lay.rung or "") and "core_attn" not in (lay.rung or "")
        assert lay.config_changes.get("model.recompute_granularity") != "full"
    assert {lay.fit for lay in plan.layouts} >= {"as_set"}
    assert any("Full recompute is not offered" in n for n in plan.notes)


def test_a_layout_that_fits_only_with_a_rung_says_which() -> None:
    cfg = dump_config("llama3_8b_pretrain_2gpu_h100_bf16_config", {})
    plan = plan_parallelism(cfg, 1, "H100", 16384, 64, top_k=3)
    lay = plan.layouts[0]
    assert lay.fit == "with_rung"
    # the memory ladder's order (advise.ladder, shared with recommend_recompute): full recompute
    # before optimizer offload below 32K, offload on top of it when full alone does not fit
    assert "full recompute" in lay.rung and "optimizer CPU offload" in lay.rung
    assert lay.rung.index("full recompute") < lay.rung.index("optimizer CPU offload")
    fixed = layout_config(cfg, plan, lay)
    assert validate(fixed).ok and fits_central(estimate_memory(fixed))
    assert fixed.optimizer.optimizer_cpu_offload and fixed.optimizer.decoupled_weight_decay
    assert "fits only with" in plan.answer_markdown


def test_constraints_pin_sizes() -> None:
    plan = plan_parallelism(qwen(), 128, "GB200", 131072, 128, top_k=5, constraints={
        **ETP1, "pipeline_model_parallel_size": [4], "expert_model_parallel_size": [32]})
    assert {(x.pipeline_model_parallel_size, x.expert_model_parallel_size,
             x.expert_tensor_parallel_size) for x in plan.layouts} == {(4, 32, 1)}


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"num_gpus": 0}, "num_gpus"), ({"top_k": 51}, "top_k"), ({"gpu": "A100"}, "gpu"),
    ({"global_batch_size": -4}, "global_batch_size"),
    ({"constraints": {"tp": [1]}}, "constraints.tp"),
    ({"constraints": {"context_parallel_size": list(range(1, 100))}},
     "constraints.context_parallel_size"),
])
def test_bad_input_is_one_error_naming_the_field(kwargs: dict, field: str) -> None:
    args = {"num_gpus": 128, "gpu": "GB200", "seq_length": 4096, "global_batch_size": 128,
            **kwargs}
    with pytest.raises(ConfigError) as exc:
        plan_parallelism(qwen(), **args)
    assert exc.value.field.startswith(field)


# ------------------------------------------------------------------ answer_markdown


def test_answer_markdown_follows_the_long_context_checklist_order() -> None:
    card = yaml.safe_load((REPO / "skills" / "nemo-mbridge-perf-moe-long-context" /
                           "card.yaml").read_text())
    text = qwen_plan(131072).answer_markdown
    body = text.split("**Ranked layouts**")[0]
    positions = []
    for item in card["answer_checklist"]:
        hits = [body.find(m) for m in item["match"] if m in body]
        assert hits, item["id"]
        positions.append(min(hits))
    assert positions == sorted(positions)
    assert '"min_gpus"' in text.split("```json")[1]


def _item(text: str, number: int) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"{number}. "))


@cache
def qwen30b_h100_plan() -> ParallelismPlan:
    """The long-context skill's eval case: Qwen3 30B-A3B on 64 H100 at 64K (BF16)."""
    cfg = load_config(preset="qwen3-30b-a3b", overrides=[
        "model.moe_grouped_gemm=true", "optimizer.use_distributed_optimizer=true",
        "mixed_precision=bf16_mixed"])
    return plan_parallelism(cfg, 64, "H100", 65536, 64, top_k=3)


@pytest.mark.parametrize("which", ["h100", "gb200"])
def test_precision_and_dispatcher_follow_the_moe_workflow_not_the_gpu_name(which: str) -> None:
    """MoE optimization workflow: bring up in BF16 on alltoall without CUDA graphs; flex
    backends are measured against it, never looked up from the hardware; FP8 and graphs come
    later. No more "FP8 with flex + DeepEP on H100" for every MoE."""
    plan = qwen30b_h100_plan() if which == "h100" else qwen_plan(131072)
    item = _item(plan.answer_markdown, 7)
    assert "**Precision and dispatcher:**" in item
    assert item.index("BF16 on moe_token_dispatcher_type='alltoall'") < item.index("A/B")
    assert "without CUDA graphs" in item and "not looked up from the GPU name" in item
    assert item.index("A/B") < item.index("Low precision") < item.index("come later")
    assert "skill's pick" not in item and "with flex + DeepEP on H100" not in item
    # the candidates are the backends Bridge runs on this GPU (rules/moe.py)
    if which == "h100":
        assert "'deepep' / 'hybridep'" in item and "runs deepep and hybridep" in item
    else:  # DeepEP does not run on the GB200 racks
        assert "'hybridep'" in item and "'deepep'" not in item.split("published")[0]
        assert "keep the flex backend set here only if it won" in item  # the dump sets flex
    # the matchers of the items after it stay after it (the checklist order holds)
    assert not any(m in item for m in ("eager", "static shape", "cuda_graph_impl",
                                       "optimizer_cpu_offload", "container"))


def test_a_dense_model_has_no_dispatcher_item() -> None:
    cfg = load_config(preset="llama3-8b")
    plan = plan_parallelism(cfg, 8, "H100", 8192, 64, top_k=1)
    assert "Precision and dispatcher" not in plan.answer_markdown


def test_the_bounds_lose_nothing_against_pricing_every_layout() -> None:
    """The CP / EP staircase, MBS and ETP dominance and the VPP skip decide most layouts
    without pricing them; pricing every layout must give the same ranked families."""
    from mbridge_perf.advise import parallelism as pl
    from mbridge_perf.advise.layouts import Rejections, groups
    from mbridge_perf.advise.pricing import Counter, price

    cfg = dump_config("qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", {})
    n, seq, gbs = 16, 32768, 64
    plan = plan_parallelism(cfg, n, "H100", seq, gbs, top_k=50, rank_by="keys")
    base = pl._base(cfg, n, "H100-80GB", seq, gbs)
    count, every = Counter(), []
    for g in groups(base.model, n, 8, gbs, None, {}, Rejections({})):
        for ep in g.eps:
            for cp in g.cps:
                p = price(base, g.skeleton(ep), cp, count)
                if p is not None and p.fits:
                    every.append(pl._Cand(p.sk, cp, n, gbs, "as_set", p, cp_start(seq)))
    every.sort(key=pl._Cand.key)
    seen, brute = set(), []
    for c in every:
        if c.family not in seen:
            seen.add(c.family)
            brute.append(c.family)
    got = [(x.tensor_model_parallel_size, x.context_parallel_size,
            x.expert_model_parallel_size, x.expert_tensor_parallel_size or 0,
            x.pipeline_model_parallel_size) for x in plan.layouts if x.fit == "as_set"]
    assert got and got == brute[:len(got)]
    assert count.priced > plan.counts.priced


def test_a_rule_every_layout_breaks_is_named_once_and_the_search_is_bounded() -> None:
    cfg = dump_config("deepseek_v3_pretrain_1024gpu_h100_fp8sc_config",
                      {"model.moe_flex_dispatcher_backend": "deepep"})
    plan = plan_parallelism(cfg, 1_048_576, "GB200", 131072, 1_048_576, top_k=50)
    assert plan.layouts == []
    assert any("moe.flex-backend-gpu" in n for n in plan.notes)  # DeepEP is not for GB200
    assert plan.counts.validated <= 20
    assert plan.counts.priced + plan.counts.rescue_estimates <= 8000
    assert "No layout of this model fits" in plan.answer_markdown
