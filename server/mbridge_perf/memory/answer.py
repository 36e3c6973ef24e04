"""``answer_markdown`` for an estimate_memory report: the estimate read the way the memory
skill answers — the most-loaded stage and what dominates it, whether it fits, and the levers in
the skill's order (allocator first when the risk is the reserved band, selective recompute by
architecture, distributed optimizer only with DP > 1, mlp last; never TP, VPP or layer CPU
offload as a memory fix)."""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import MemoryReport, StageMemory, estimate_memory
from mbridge_perf.memory.overheads import expandable_segments

_SIZES = {"tensor": "TP", "pipeline": "PP", "virtual_pipeline": "VPP", "context": "CP",
          "expert": "EP", "expert_tensor": "ETP", "data": "DP"}


def _dominant(s: StageMemory) -> str:
    parts = {"optimizer state": s.optimizer_gib, "activations": s.activations_gib,
             "gradients": s.grads_gib, "weights": s.weights_gib}
    name = max(parts, key=lambda k: parts[k])
    return f"{name} ({parts[name]:.1f} GiB)"


def _verdict(r: MemoryReport) -> str:
    if r.gpu_capacity_gib is None or r.verdict is None:
        return "No GPU given, so fits / headroom are not judged (pass gpu, e.g. 'H100')."
    on = f"on {r.gpu} ({r.gpu_capacity_gib:.1f} GiB)"
    if r.verdict == "fits":
        return f"**Verdict: fits** {on}: {r.verdict_term}."
    if r.verdict == "tight" and not r.fits_with_fragmentation:
        return (f"**Verdict: tight** {on}: {r.verdict_term} - it fits only if fragmentation "
                "stays low, which is how a fragmentation OOM looks (one rank OOMs, others keep "
                "headroom).")
    if r.verdict == "tight":
        return (f"**Verdict: tight** {on}: {r.verdict_term}; the estimate cannot promise it "
                "fits.")
    return (f"**Verdict: does not fit** {on}: {r.verdict_term} - a genuine capacity limit.")


def _graph_line(r: MemoryReport) -> list[str]:
    graphed = [p for p in r.phases if p.phase == "graphed_steady_state"]
    if not graphed:
        return []
    g = graphed[0]
    return [f"- Per-layer CUDA graphs: once they replay, stage {g.stage} holds "
            f"{g.allocated_gib:.1f} GiB allocated plus {g.private_pool_gib:.1f} GiB in the "
            "graphs' private pool (reserved, not reusable by eager code or the optimizer "
            f"step): up to {g.need_gib[1]:.1f} GiB with the band and the overheads."]


def _selective_step(cfg: TrainingConfig) -> str:
    d = Derived(cfg)
    fused = d.fused_attention
    now = list(d.recompute.selective)
    kept = [x for x in now if not (fused and x == "core_attn")]
    mods = list(dict.fromkeys([*kept, *d.first_selective_modules()]))
    why = (" (core_attn frees about 0 under Transformer Engine fused / flash attention)"
           if fused else "")
    if now and mods == now:
        return (f"Selective recompute is on with `recompute_modules=[{', '.join(now)}]`, the "
                "modules this architecture calls for.")
    return (f"If it still OOMs, use selective recompute: `recompute_granularity=\"selective\"`, "
            f"`recompute_modules=[{', '.join(mods)}]`{why}.")


def _levers(r: MemoryReport, cfg: TrainingConfig) -> list[str]:
    steps = []
    if not expandable_segments(cfg.env):
        steps.append("Export `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` in the job "
                     "environment first; it removes fragmentation at no throughput cost"
                     + (", though it cannot close a capacity gap."
                        if r.verdict == "does_not_fit" else "."))
    steps.append(_selective_step(cfg))
    dp = r.parallelism.get("data")
    distopt = cfg.optimizer.use_distributed_optimizer or cfg.ddp.use_distributed_optimizer
    if not distopt and dp and dp > 1:
        steps.append(f"Shard the optimizer state over DP={dp} with "
                     "`optimizer.use_distributed_optimizer=true` (about 1-2% cost).")
    if r.verdict == "does_not_fit":
        steps.append("Offload optimizer state with `optimizer.optimizer_cpu_offload=true` and a "
                     "non-zero `optimizer.optimizer_offload_fraction` (not layer activation "
                     "offload, which needs PP = 1).")
    steps.append("Only as a last resort add `mlp` to `recompute_modules` (about 3 GB for about "
                 "16% throughput on Llama3 70B).")
    return steps


def memory_markdown(r: MemoryReport, cfg: TrainingConfig) -> str:
    """The report in a few lines an assistant can hand over as its answer."""
    s = r.per_stage[r.most_loaded_stage]
    lo, hi = r.reserved_band_gib
    par = r.parallelism
    layout = " ".join(f"{short}{par[k]}" for k, short in _SIZES.items()
                      if par.get(k) is not None) + f" on {par.get('world_size')} GPUs"
    lines = [
        _verdict(r),
        "",
        f"**Memory estimate** ({layout}; GiB = 2^30 bytes, Megatron logs decimal GB): the most "
        f"loaded stage is stage {r.most_loaded_stage}, peak allocated "
        f"{r.peak_allocated_gib:.1f} GiB, dominated by {_dominant(s)}.",
        "",
        f"- Reserved-but-unallocated band: +{lo:.1f} to +{hi:.1f} GiB; CUDA context, NCCL and "
        f"instantiated CUDA graphs {r.overheads.total_gib:.1f} GiB outside the allocator.",
        *_graph_line(r),
        f"- Total parameters {r.total_params / 1e9:.1f} B"
        + (" (every expert counted, not only the active parameters: routed experts are "
           "stored whether a token uses them or not)." if cfg.model.num_moe_experts else "."),
        "",
        "Next steps, in order:",
        "",
    ]
    lines += [f"{k}. {step}" for k, step in enumerate(_levers(r, cfg), 1)]
    lines += ["", "Do not raise TP, VPP or turn on layer CPU offloading as a memory fix. TP 4 -> 8 "
              "cost -28.4% on Llama3 70B; VPP adds activation memory; cpu_offloading needs "
              "PP = 1."]
    if r.warnings:
        lines += ["", "Warnings: " + "; ".join(r.warnings)]
    return "\n".join(lines)


def estimate_with_answer(cfg: TrainingConfig, *, gpu: str | None = None,
                         imbalance: float = 1.0) -> MemoryReport:
    """estimate_memory plus its answer_markdown (what the MCP tool and the eval grader use)."""
    from mbridge_perf.config.load import shipped_recipe, source_notes
    from mbridge_perf.memory.bridge_compare import side_by_side

    report = estimate_memory(cfg, gpu=gpu, imbalance=imbalance)
    notes = source_notes(cfg)  # which Bridge recipe the perf-harness flags resolved to
    return report.model_copy(update={"answer_markdown": memory_markdown(report, cfg),
                                     "assumptions": notes + report.assumptions,
                                     "bridge": side_by_side(report, cfg, shipped_recipe(cfg))})
