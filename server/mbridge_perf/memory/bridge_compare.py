"""Megatron Bridge's own ``estimate_training_memory`` next to ours, term by term.

Bridge's formula (``training/utils/theoretical_memory_utils.py``, 0.6.x) is weights + gradients
+ Adam state at 18 B/parameter (6 + 12/DP with the distributed optimizer) on the most-loaded
shard, plus Korthikanti's per-layer activations ``s·b·h·(18 + 4·FFN/h)`` with sequence
parallelism and selective recompute assumed. It prices what the allocator hands out; it has no
CUDA-graph pool, no reserved-but-unallocated (fragmentation) band, no NCCL or CUDA context and
no MoE dispatcher buffers. This module lines its numbers up with a MemoryReport and names what
each side leaves out. Pure: the numbers come in (Bridge's live result, computed by the caller
where ``megatron.bridge`` imports, or Bridge 0.6.2's recorded result for a shipped recipe).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any, Literal

from mbridge_perf.config.derived import resolve_precision
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.bridge_result import BridgeComparison, BridgeTerm
from mbridge_perf.memory.estimate import MemoryReport


@dataclass(frozen=True)
class BridgeNumbers:
    """Bridge's estimate for one config, GiB (2^30) on its most-loaded GPU."""

    total_gib: float
    weights_optimizer_gib: float
    activations_gib: float
    source: Literal["live", "recorded"]
    label: str  # where the numbers come from, in words


def bridge_importable() -> bool:
    """Whether ``megatron.bridge`` can be imported here (looked up, not imported)."""
    try:
        return importlib.util.find_spec("megatron.bridge") is not None
    except (ImportError, ValueError):
        return False


def unavailable(live_possible: bool | None = None) -> BridgeComparison:
    """The one line when Bridge's numbers cannot be shown."""
    here = bridge_importable() if live_possible is None else live_possible
    msg = ("megatron.bridge imports here, but its estimate_training_memory needs a live "
           "ConfigContainer: call mbridge_perf.api.estimate(cfg) with yours (a config given "
           "as text is never instantiated)" if here else
           "Megatron Bridge is not installed where this runs, so its estimate_training_memory "
           "is not shown (pip install 'mbridge-perf[bridge]', Python >= 3.12)")
    return BridgeComparison(source="unavailable", message=msg)


def recorded_numbers(recipe: str) -> BridgeNumbers | None:
    """Bridge 0.6.2's recorded estimate for a shipped recipe (None where Bridge's own call
    failed or the recipe has none)."""
    from mbridge_perf.config.recipes import recorded_bridge_estimates

    row = recorded_bridge_estimates().get(recipe)
    if not row or not row.get("total_gib"):
        return None
    return BridgeNumbers(float(row["total_gib"]), float(row["weights_optimizer_gib"]),
                         float(row["activations_gib"]), "recorded",
                         f"Bridge 0.6.2's estimate_training_memory recorded for {recipe} on "
                         f"{row['num_gpus']} GPUs")


def _flag(cfg: TrainingConfig, name: str) -> Any:
    m = cfg.model
    return getattr(m, name, None) if name in type(m).model_fields else m.carried().get(name)


def state_terms(cfg: TrainingConfig) -> list[str]:
    """What Bridge's 18 B/parameter (or 6 + 12/DP) weight + optimizer count leaves out here."""
    m, o, ddp = cfg.model, cfg.optimizer, cfg.ddp
    out = []
    if ddp.use_megatron_fsdp:
        out.append(f"Megatron-FSDP sharding ({ddp.data_parallel_sharding_strategy}; Bridge "
                   "shards nothing)")
    p = resolve_precision(cfg)
    if p.fp8 and p.fp8_param:
        out.append("FP8 parameters (fp8_param: 1 B per weight; Bridge: 2)")
    if (p.bf16 or p.fp16) and not p.grad_reduce_in_fp32:
        out.append("BF16 gradient buffers (grad_reduce_in_fp32=False; Bridge: FP32)")
    if o.use_precision_aware_optimizer and "bf16" in (o.exp_avg_dtype, o.exp_avg_sq_dtype,
                                                        o.main_grads_dtype):
        out.append("precision-aware optimizer with BF16 moments / grads (Bridge: FP32)")
    act = str(m.activation_func or "")
    if m.gated_linear_unit and not act.endswith(".silu"):
        out.append(f"GLU with {act.rsplit('.', 1)[-1]} (Bridge counts 2 FFN projections, not 3)")
    if _flag(cfg, "is_hybrid_model") or "hybrid" in str(cfg.model.carried().get("_target_", "")):
        out.append("hybrid Mamba / attention / MLP layers (Bridge: every layer attention + MLP)")
    if m.multi_latent_attention:
        out.append("MLA projections (Bridge: GQA attention)")
    if p.fp8 and not p.fp8_param:
        out.append("FP8 weight copies next to the BF16 weights")
    if cfg.carried().get("peft"):
        out.append("LoRA: both count Adam state for the frozen base weights")
    return out


def activation_terms(cfg: TrainingConfig, report: MemoryReport) -> list[str]:
    """What Bridge's s·b·h·(18 + 4·FFN/h) per layer (SP and selective recompute assumed) leaves
    out here."""
    m = cfg.model
    s = report.per_stage[report.most_loaded_stage]
    out = []
    if m.recompute_granularity == "full":
        out.append("full recompute (Bridge assumes selective: it keeps every layer)")
    if m.tensor_model_parallel_size > 1 and not m.sequence_parallel:
        out.append(f"sequence parallelism off (Bridge divides every activation by TP="
                   f"{m.tensor_model_parallel_size})")
    if m.num_moe_experts:
        out.append(f"MoE dispatch: top-{m.moe_router_topk} token copies, router and expert "
                   "FC buffers (Bridge: top-k x FFN width only)")
    if m.multi_latent_attention:
        out.append("MLA up-projected q/k/v and latents")
    if m.experimental_attention_variant or _flag(cfg, "linear_attention_freq"):
        out.append("gated-delta-net layers (Bridge: softmax attention)")
    if m.fine_grained_activation_offloading or m.cpu_offloading:
        out.append("activation offloading (Bridge: none)")
    heads = m.num_attention_heads or 1
    width = (m.kv_channels or (m.hidden_size or 0) // heads) * heads
    if not m.multi_latent_attention and width and width != m.hidden_size:
        out.append(f"attention {width} wide (kv_channels x heads; Bridge: hidden_size "
                   f"{m.hidden_size})")
    if m.gated_linear_unit:
        out.append("GLU's 2 x FFN fc1 output (Bridge: a GeLU MLP's)")
    if m.context_parallel_size > 1:
        out.append("context-parallel K/V exchange buffers")
    if s.logits_gib > 0.1 * max(s.activations_gib, 1e-9) and m.pipeline_model_parallel_size > 1:
        out.append(f"logits on the last stage ({s.logits_gib:.1f} GiB; Bridge: only at PP=1)")
    if s.transient_gib + s.workspace_gib > 1:
        out.append(f"one layer's backward working set + workspaces "
                   f"({s.transient_gib + s.workspace_gib:.1f} GiB; Bridge: none)")
    return out


def _ours_only(report: MemoryReport, cfg: TrainingConfig) -> list[BridgeTerm]:
    """The terms ours adds that Bridge's formula has no place for."""
    o = report.overheads
    lo, hi = report.reserved_band_gib
    s = report.per_stage[report.most_loaded_stage]
    out = [BridgeTerm(name="CUDA graphs", ours_gib=round(o.cuda_graphs_gib + (
        s.graph_pool_gib or 0.0), 3), bridge_gib=None,
        note="instantiated graphs outside the allocator plus the graphs' private pool")]
    out.append(BridgeTerm(name="fragmentation band", ours_gib=round(lo, 3), bridge_gib=None,
                          note=f"reserved but unallocated: {lo:.1f} to {hi:.1f} GiB"))
    out.append(BridgeTerm(name="NCCL", ours_gib=round(o.nccl_gib, 3), bridge_gib=None,
                          note="communicator buffers outside the allocator"))
    out.append(BridgeTerm(name="CUDA context", ours_gib=round(o.cuda_context_gib, 3),
                          bridge_gib=None, note="driver context per process"))
    if cfg.model.num_moe_experts:
        out.append(BridgeTerm(
            name="dispatcher buffers", ours_gib=None, bridge_gib=None,
            note=f"routed-token copies (top-{cfg.model.moe_router_topk}, with the imbalance "
                 "factor) are inside our activations; DeepEP / HybridEP workspaces are in "
                 "neither"))
    return out


def compare(report: MemoryReport, cfg: TrainingConfig, bridge: BridgeNumbers
            ) -> BridgeComparison:
    """Bridge's numbers and ours, term by term, with what Bridge's formula leaves out."""
    s = report.per_stage[report.most_loaded_stage]
    ours_act = report.peak_allocated_gib - s.static_gib
    launch = report.need_gib[0]  # the largest phase: allocated + pools + band (low) + outside
    rows = [
        BridgeTerm(name="weights + gradients + optimizer", ours_gib=round(s.static_gib, 3),
                   bridge_gib=bridge.weights_optimizer_gib,
                   note="; ".join(state_terms(cfg)) or "same terms"),
        BridgeTerm(name="activations (+ working set)", ours_gib=round(ours_act, 3),
                   bridge_gib=bridge.activations_gib,
                   note="; ".join(activation_terms(cfg, report)[:4]) or "same terms"),
        BridgeTerm(name="peak allocated", ours_gib=round(report.peak_allocated_gib, 3),
                   bridge_gib=bridge.total_gib, note="what the allocator hands out"),
        *_ours_only(report, cfg),
    ]
    diff = report.peak_allocated_gib - bridge.total_gib
    msg = (f"{bridge.label}: {bridge.total_gib:.1f} GiB; ours {report.peak_allocated_gib:.1f} "
           f"GiB allocated ({diff:+.1f}), {launch:.1f} GiB with graphs, band, NCCL and context")
    return BridgeComparison(
        source=bridge.source, message=msg, bridge_total_gib=bridge.total_gib,
        ours_peak_allocated_gib=round(report.peak_allocated_gib, 3),
        ours_launch_gib=round(launch, 3), terms=rows,
        bridge_leaves_out=state_terms(cfg) + activation_terms(cfg, report))


def side_by_side(report: MemoryReport, cfg: TrainingConfig, recipe: str | None
                 ) -> BridgeComparison:
    """What estimate_memory shows: Bridge's recorded estimate for an unmodified shipped recipe,
    else the one line saying why Bridge's estimate is not there."""
    numbers = recorded_numbers(recipe) if recipe else None
    if numbers is None:
        return unavailable()
    return compare(report, cfg, numbers)
