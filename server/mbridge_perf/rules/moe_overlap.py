"""MoE expert-parallel communication overlap and delayed weight-gradient compute (constraint
catalog section J).

Bridge's CommOverlapConfig checks these before the model is finalized and copies the two flags
onto the model, where Megatron-Core's TransformerConfig checks them again; a user may also put
them on the model directly, so both places are read.
"""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import WORKFLOW, Violation, rule

EP_OVERLAP = "comm_overlap.overlap_moe_expert_parallel_comm"
DELAY_WGRAD = "comm_overlap.delay_wgrad_compute"
FIX_TAIL = f"or set {EP_OVERLAP} = false"


def _on(c: TrainingConfig, name: str) -> bool:
    """A comm-overlap flag as the model ends up with it (comm_overlap section or model field)."""
    return bool(getattr(c.overlap, name, False)) or c.model.carried().get(name) is True


def _mcore_gaps(c: TrainingConfig, d: Derived) -> list[str]:
    """EP-overlap prerequisites Megatron-Core itself asserts (torch ≥ 2.6 aside)."""
    m, p = c.model, d.precision
    gaps = []
    if d.ep <= 1:
        gaps.append(f"expert_model_parallel_size={d.ep} (needs > 1)")
    if m.moe_token_dispatcher_type not in ("alltoall", "flex"):
        gaps.append(f"moe_token_dispatcher_type={m.moe_token_dispatcher_type!r} (needs alltoall "
                    "or flex)")
    if not (p.bf16 or p.fp16):
        gaps.append("neither bf16 nor fp16 (needs a bf16/fp16 model)")
    if d.pp > 1 and m.virtual_pipeline_model_parallel_size is None:
        gaps.append(f"pipeline_model_parallel_size={d.pp} without "
                    "virtual_pipeline_model_parallel_size")
    if m.recompute_granularity == "full":
        gaps.append("recompute_granularity='full'")
    if m.recompute_method is not None:
        gaps.append(f"recompute_method={m.recompute_method!r}")
    if m.recompute_num_layers is not None:
        gaps.append(f"recompute_num_layers={m.recompute_num_layers}")
    if m.moe_shared_expert_overlap:
        gaps.append("moe_shared_expert_overlap=True")
    # the pin allows at most one MTP layer (0.16.1 additionally rejects 0 and needs PP > 1 with 1)
    if m.mtp_num_layers is not None and m.mtp_num_layers > 1:
        gaps.append(f"mtp_num_layers={m.mtp_num_layers} (at most 1)")
    return gaps


@rule("moe-overlap.requirements", "error", ref="J1", source="megatron-core",
      fields=(EP_OVERLAP, "model.expert_model_parallel_size", "model.moe_token_dispatcher_type",
              "mixed_precision", "model.virtual_pipeline_model_parallel_size",
              "model.recompute_granularity", "model.recompute_method",
              "model.recompute_num_layers", "model.moe_shared_expert_overlap",
              "model.mtp_num_layers"), skill=WORKFLOW, mcore_enforced=True,
      summary="EP comm overlap prerequisites: EP > 1, alltoall/flex, bf16/fp16, VPP when PP > 1, "
              "no full recompute, no shared-expert overlap, MTP ≤ 1")
def _requirements(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _on(c, "overlap_moe_expert_parallel_comm"):
        return None
    gaps = _mcore_gaps(c, d)
    if not gaps:
        return None
    return Violation(f"overlap_moe_expert_parallel_comm=True with {'; '.join(gaps)}",
                     f"fix each listed setting (e.g. set model.virtual_pipeline_model_parallel_"
                     f"size when PP > 1, selective recompute without a method), {FIX_TAIL}")


@rule("moe-overlap.bridge-requirements", "error", ref="J1", source="megatron-bridge",
      fields=(EP_OVERLAP, "model.num_moe_experts", "model.recompute_modules"), skill=WORKFLOW,
      summary="EP comm overlap in Bridge also needs more than one expert and no `moe` recompute")
def _bridge_requirements(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _on(c, "overlap_moe_expert_parallel_comm"):
        return None
    m = c.model
    gaps = ([f"num_moe_experts={m.num_moe_experts} (needs > 1)"]
            if (m.num_moe_experts or 0) <= 1 else []) + (
        ["'moe' in recompute_modules"] if "moe" in (m.recompute_modules or []) else [])
    if not gaps:
        return None
    return Violation(f"overlap_moe_expert_parallel_comm=True with {'; '.join(gaps)}",
                     f"use an MoE model and drop 'moe' from model.recompute_modules (keep "
                     f"moe_act / layernorm), {FIX_TAIL}")


@rule("moe-overlap.delay-wgrad-needs-overlap", "error", ref="J2", source="megatron-core",
      fields=(DELAY_WGRAD, EP_OVERLAP), skill=WORKFLOW, mcore_enforced=True,
      summary="delay_wgrad_compute needs overlap_moe_expert_parallel_comm")
def _delay_wgrad_needs_overlap(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _on(c, "delay_wgrad_compute") or _on(c, "overlap_moe_expert_parallel_comm"):
        return None
    return Violation("delay_wgrad_compute=True with overlap_moe_expert_parallel_comm=False",
                     f"set {EP_OVERLAP} = true, or {DELAY_WGRAD} = false")


@rule("moe-overlap.early-release-needs-overlap", "error", ref="J6", source="megatron-core",
      fields=("model.ep_overlap_early_attn_memory_release", EP_OVERLAP), skill=WORKFLOW,
      mcore_enforced=True,
      summary="ep_overlap_early_attn_memory_release needs overlap_moe_expert_parallel_comm")
def _early_release_needs_overlap(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _on(c, "ep_overlap_early_attn_memory_release") or \
            _on(c, "overlap_moe_expert_parallel_comm"):
        return None
    return Violation("ep_overlap_early_attn_memory_release=True without "
                     "overlap_moe_expert_parallel_comm",
                     f"set {EP_OVERLAP} = true, or drop "
                     "model.ep_overlap_early_attn_memory_release")
