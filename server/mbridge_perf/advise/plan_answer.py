"""``answer_markdown`` for plan_parallelism, in the long-context skill's Answer checklist order
(skills/nemo-mbridge-perf-moe-long-context/card.yaml answer_checklist): CP from the sequence,
the GPU budget, selective recompute, no attention recompute, TP for CP on NVL72, the global
batch, precision and dispatcher, optimizer offload, CUDA graphs last, a current container - then
the ranked table, what was rejected, and the closing JSON block the skill asks for."""

from __future__ import annotations

import json

from mbridge_perf.advise.layouts import cp_rule_applies
from mbridge_perf.advise.plan_result import ParallelismPlan, PlannedLayout
from mbridge_perf.config.derived import Derived, resolve_precision
from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.moe import _backend_supported


def _sizes(lay: PlannedLayout) -> str:
    s = (f"TP{lay.tensor_model_parallel_size} CP{lay.context_parallel_size} "
         f"PP{lay.pipeline_model_parallel_size}")
    if lay.virtual_pipeline_model_parallel_size:
        s += f" VPP{lay.virtual_pipeline_model_parallel_size}"
    if lay.expert_tensor_parallel_size is not None:
        s += f" EP{lay.expert_model_parallel_size} ETP{lay.expert_tensor_parallel_size}"
    return s + f" MBS{lay.micro_batch_size}"


def _cp(plan: ParallelismPlan, best: PlannedLayout) -> str:
    seq, cp = plan.seq_length, best.context_parallel_size
    tpcp = best.tensor_model_parallel_size * cp
    short = ("" if cp_rule_applies(plan.cp_start) else "; below 32K, outside the long-context "
             "skill's scope, ties go to the smallest CP (NVIDIA's 8K-16K recipes mostly run CP 1)")
    return (f"1. **CP from the sequence length:** {seq} / 4096 = {seq / 4096:g} → the search "
            f"starts at CP = {plan.cp_start} (a 4096-token shard per CP rank); memory decides "
            f"the rest{short}. The best layout uses CP = {cp} ({best.tokens_per_cp_rank} tokens "
            f"per CP rank; TP·CP = {tpcp} splits the sequence), and "
            f"seq_length % (2·CP) = {seq % (2 * cp) if cp > 1 else 0}.")


def _budget(plan: ParallelismPlan, best: PlannedLayout) -> str:
    tp, pp, cp = (best.tensor_model_parallel_size, best.pipeline_model_parallel_size,
                  best.context_parallel_size)
    n = plan.num_gpus
    text = (f"2. **GPU budget:** attention mesh {best.attention_mesh} → dense DP = {n} / "
            f"(TP·PP·CP = {tp * pp * cp}) = {best.data_parallel_size}")
    if best.expert_mesh:
        ep, etp = best.expert_model_parallel_size, best.expert_tensor_parallel_size or 1
        text += (f"; expert mesh {best.expert_mesh} → EDP = {n} / (EP·ETP·PP = "
                 f"{ep * etp * pp}) = {best.expert_data_parallel_size}; minimum GPUs = "
                 f"PP·lcm(TP·CP, EP·ETP) = {pp}·lcm({tp * cp}, {ep * etp}) = {best.min_gpus}, "
                 f"not the product {tp * pp * cp * ep * etp:,}")
    else:
        text += f"; minimum GPUs = TP·CP·PP = {best.min_gpus}"
    dp_note = (" DP = 1 here: one replica takes every GPU; preserve DP above its floor when "
               "you add GPUs." if best.data_parallel_size == 1 else
               " This keeps DP above its floor (more DP ranks first once TP, CP and the "
               "experts' NVLink span agree).")
    return text + "." + dp_note


def _recompute(cfg: TrainingConfig, best: PlannedLayout) -> str:
    r = Derived(cfg).recompute
    if r.granularity == "selective":
        now = (f'recompute_granularity="selective" with recompute_modules='
               f"{list(r.selective)}")
    elif r.granularity == "full":
        now = 'recompute_granularity="full" (as set; selective recompute is cheaper)'
    else:
        now = "no recompute (as set)"
    rung = {"with_rung": f" This layout fits only with: {best.rung}.",
            "as_set": " It fits as set.",
            "no": " It does not fit even with the selective modules and optimizer offload."}[
        best.fit]
    return (f"3. **Recompute:** priced with {now}; use selective recompute before full "
            f"(MoE/MLP-side modules such as mla_up_proj, layernorm, moe_act, moe, mlp).{rung}")


def _attention(plan: ParallelismPlan) -> str | None:
    if plan.seq_length < 32768:
        return None
    return ("4. **No attention recompute at this length:** do not add core_attn (or "
            "SDPA-heavy) recompute; full recompute is not offered as a way to fit, it repeats "
            "attention, which dominates the step at long sequence.")


def _nvl72(plan: ParallelismPlan, best: PlannedLayout) -> str | None:
    if plan.nvlink_domain < 72:
        return None
    return (f"5. **NVL72 (NVLink domain {plan.nvlink_domain}):** trade part of CP for TP inside "
            f"the NVLink domain (CP for TP): TP{best.tensor_model_parallel_size} × "
            f"CP{best.context_parallel_size} carries the sequence split here.")


def _gbs(plan: ParallelismPlan, best: PlannedLayout) -> str:
    return (f"6. **Global batch:** global_batch_size {plan.global_batch_size} = MBS "
            f"{best.micro_batch_size} × DP {best.data_parallel_size} × "
            f"{best.num_microbatches} micro-batches (gradient accumulation); pipeline bubble "
            f"{best.bubble_fraction:.1%}. As CP rises and DP falls, plan for a smaller GBS or "
            "more gradient accumulation.")


def _dispatcher(plan: ParallelismPlan, cfg: TrainingConfig) -> str | None:
    """The MoE optimization workflow's order (skills/nemo-mbridge-perf-moe-optimization-workflow:
    answer checklist 5 and 8): bring up in BF16 on alltoall without CUDA graphs; the flex
    backends are candidates measured against it where the GPU supports them (Bridge's check,
    rules/moe.py), never picked from the hardware name; low precision later, from a validated
    BF16 baseline. The long-context skill's published precision / dispatcher pairs are where
    those runs' tuning ended, said as such."""
    m = cfg.model
    if not m.num_moe_experts:
        return None
    p = resolve_precision(cfg)
    prec = (f"FP8 ({p.fp8_recipe})" if p.fp8 else "FP4" if p.fp4 else
            "BF16" if p.bf16 else "FP16" if p.fp16 else "FP32")
    now = (f"moe_token_dispatcher_type={m.moe_token_dispatcher_type!r}, "
           f"moe_flex_dispatcher_backend={m.moe_flex_dispatcher_backend!r}")
    backends, runs = ["deepep", "hybridep"], ""
    try:
        spec = lookup_gpu(plan.gpu)
    except ValueError:
        spec = None
    if spec is not None and spec.sm is not None:
        backends = [b for b in ("deepep", "hybridep") if _backend_supported(b, spec)]
        runs = f" ({spec.name} runs {' and '.join(backends)})" if backends else ""
    keep = ("; keep the flex backend set here only if it won that A/B"
            if m.moe_token_dispatcher_type == "flex" and m.moe_flex_dispatcher_backend else "")
    ab = (f"then A/B flex with moe_flex_dispatcher_backend {' / '.join(map(repr, backends))} "
          f"against it where the package and topology support them{runs}, one variable per "
          f"matched run{keep}" if backends
          else f"the flex backends do not run on {plan.gpu}: stay on alltoall")
    return (f"7. **Precision and dispatcher:** priced in {prec}, {now}. The dispatcher is "
            "measured, not looked up from the GPU name (MoE optimization workflow): bring the "
            "run up in BF16 on moe_token_dispatcher_type='alltoall' without CUDA graphs, "
            f"{ab}. Low precision (FP8-class blockwise or tensorwise; MXFP8 on Blackwell) and "
            "CUDA graphs come later in the loop, from a validated BF16 baseline when a profile "
            "points at them. The long-context skill's published runs ended at FP8-class + "
            "DeepEP (DeepSeek-V3, H100) and BF16 / MXFP8 + HybridEP (Qwen3 235B, GB200): where "
            "their tuning landed, not where to start.")


def _offload(cfg: TrainingConfig, best: PlannedLayout) -> str:
    o = cfg.optimizer
    if best.fit == "with_rung" and "offload" in (best.rung or ""):
        state = "needed for this layout (see the rung above)"
    elif o.optimizer_cpu_offload:
        state = f"on as set (optimizer_offload_fraction={o.optimizer_offload_fraction:g})"
    else:
        state = "not needed for this layout"
    return ("8. **Optimizer offload:** optimizer CPU offload (optimizer.optimizer_cpu_offload "
            f"with optimizer_offload_fraction > 0) is {state}; prefer it to layer activation "
            "offload, which needs PP = 1.")


def _graphs(cfg: TrainingConfig) -> str:
    impl = cfg.model.cuda_graph_impl
    return ("9. **CUDA graphs last:** only with static shapes (fixed seq_length and MBS) and "
            "once a profile shows launch gaps; "
            f"cuda_graph_impl={impl!r} as set - keep eager for variable-length batches.")


def _table(plan: ParallelismPlan) -> list[str]:
    rows = ["| # | layout | predicted tokens/s/GPU (step s) | DP / EDP | min GPUs | "
            "peak GiB (stage) | headroom GiB | fit | bubble |",
            "|---|---|---|---|---|---|---|---|---|"]
    for lay in plan.layouts:
        fit = lay.fit if lay.fit != "with_rung" else f"with: {lay.rung}"
        speed = (f"{lay.predicted_tokens_per_s_per_gpu:,.0f} ({lay.predicted_step_time_s:.2f})"
                 if lay.predicted_tokens_per_s_per_gpu and lay.predicted_step_time_s else "-")
        if lay.tied_with:
            speed += " tie " + ",".join(f"#{r}" for r in lay.tied_with)
        rows.append(f"| {lay.rank} | {_sizes(lay)} | {speed} | {lay.data_parallel_size} / "
                    f"{lay.expert_data_parallel_size or '-'} | {lay.min_gpus} | "
                    f"{lay.peak_allocated_gib:.1f} ({lay.most_loaded_stage}) | "
                    f"{lay.headroom_gib if lay.headroom_gib is not None else '-'} | {fit} | "
                    f"{lay.bubble_fraction:.1%} |")
    return rows


def _published(plan: ParallelismPlan) -> list[str]:
    """The skill's published layout for this case, where it lands and why."""
    out = []
    for pub in plan.published:
        vpp = pub.virtual_pipeline_model_parallel_size
        sizes = (f"TP{pub.tensor_model_parallel_size} CP{pub.context_parallel_size} "
                 f"EP{pub.expert_model_parallel_size} PP{pub.pipeline_model_parallel_size}"
                 + (f" VPP{vpp}" if vpp else ""))
        where = f"rank #{pub.rank} - " if pub.rank else ""
        out.append(f"- {sizes} ({pub.model}, the long-context skill's published layout): "
                   f"{where}{pub.reason}. The skill gives it as a representative family "
                   "for efficiency, with no memory or throughput figures; this ranking prices "
                   "memory and orders by predicted step time (estimate_step_time, "
                   "out-of-sample error in each layout's band), the skills' layout rules "
                   "deciding ties - benchmark both if they differ.")
    return ["", "**The skill's published layout for this case:**", *out] if out else []


def _closing(plan: ParallelismPlan, best: PlannedLayout) -> str:
    layout = {"tp": best.tensor_model_parallel_size, "pp": best.pipeline_model_parallel_size,
              "vpp": best.virtual_pipeline_model_parallel_size,
              "cp": best.context_parallel_size, "ep": best.expert_model_parallel_size,
              "etp": best.expert_tensor_parallel_size, "dp": best.data_parallel_size,
              "edp": best.expert_data_parallel_size, "min_gpus": best.min_gpus}
    recs = [{"rank": i + 1, "knob": k, "value": v, "rationale": "plan_parallelism rank 1",
             "expected_effect": f"peak {best.peak_allocated_gib:.1f} GiB, headroom "
                                f"{best.headroom_gib} GiB", "evidence": "estimate_memory"}
            for i, (k, v) in enumerate(
                (k, v) for k, v in best.config_changes.items() if v is not None and v is not False)]
    return "```json\n" + json.dumps({"layout": layout, "recommendations": recs}, indent=1) + \
        "\n```"


def _nothing_planned(plan: ParallelismPlan) -> str:
    """Why no layout is listed: memory (more or larger GPUs help) or the validator refusing the
    config's own settings for every layout (no GPU count helps: fix the setting first)."""
    reasons = "; ".join(f"{r.family}: {r.reason}" for r in plan.rejected[:5])
    if plan.rejected and all(r.reason.startswith("validator:") for r in plan.rejected):
        return (f"No layout can be planned on {plan.num_gpus} × {plan.gpu}: the validator refuses "
                f"the config's own settings for every layout that fits ({reasons}). Fix those "
                "settings first, then plan again; more GPUs will not help.")
    return (f"No layout of this model fits on {plan.num_gpus} × {plan.gpu} at seq_length "
            f"{plan.seq_length} (CP search started at {plan.cp_start} = seq / 4096). "
            f"Rejected: {reasons}. Add GPUs or use a GPU with more memory.")


def plan_markdown(plan: ParallelismPlan, cfg: TrainingConfig) -> str:
    """The plan as the long-context skill answers: checklist items in order, skipping those
    that do not apply, then the ranked layouts and the closing JSON block."""
    if not plan.layouts:
        return _nothing_planned(plan)
    best = plan.layouts[0]
    verdict = "Best layout" if best.fit != "no" else "Nothing fits; closest layout"
    head = (f"**{verdict} on {plan.num_gpus} × {plan.gpu}:** {_sizes(best)} - peak "
            f"{best.peak_allocated_gib:.1f} GiB on stage {best.most_loaded_stage}, headroom "
            f"{best.headroom_gib} GiB of {plan.gpu_capacity_gib:.1f}.")
    items = [_cp(plan, best), _budget(plan, best), _recompute(cfg, best), _attention(plan),
             _nvl72(plan, best), _gbs(plan, best), _dispatcher(plan, cfg), _offload(cfg, best),
             _graphs(cfg)]
    if plan.seq_length >= 131072:
        items.append("10. **Container:** at 128K and beyond run on a current container; "
                     "long-context paths depend on newer kernels and fixes.")
    body = [head, "", *[i for i in items if i], "",
            "**Ranked layouts** by predicted tokens/s/GPU (validate_config passes on each; "
            "per-stage memory from estimate_memory; a tie is within the step-time model's "
            "pair band and ordered by the skills' keys):", "", *_table(plan)]
    body += _published(plan)
    if plan.notes:
        body += ["", *[f"> {n}" for n in plan.notes]]
    if plan.rejected:
        body += ["", "**Rejected families:** " + "; ".join(
            f"{r.family} ({r.count}): {r.reason}" for r in plan.rejected[:6])]
    return "\n".join([*body, "", _closing(plan, best)])
