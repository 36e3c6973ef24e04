"""Distributed optimizer, Megatron-FSDP / torch FSDP2 and checkpoint formats (constraint catalog
sections L3 and M)."""

from __future__ import annotations

from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import MEM, Violation, rule

FSDP = "ddp.use_megatron_fsdp"
FSDP2 = "dist.use_torch_fsdp2"
FORMAT = "checkpoint.ckpt_format"
DIST_FORMATS = ("torch_dist", "fsdp_dtensor")


def _section(c: TrainingConfig, name: str) -> dict[str, Any]:
    raw = c.carried().get(name)
    return raw if isinstance(raw, dict) else {}


def _megatron_fsdp(c: TrainingConfig) -> bool:
    """Megatron-FSDP is on when either the DDP or the dist section asks for it."""
    return c.ddp.use_megatron_fsdp or _section(c, "dist").get("use_megatron_fsdp") is True


def _ckpt_format(c: TrainingConfig) -> str:
    return str(_section(c, "checkpoint").get("ckpt_format") or "torch_dist")  # Bridge default


@rule("distopt.flags-out-of-sync", "warning", ref="L3", source="megatron-bridge",
      fields=("ddp.use_distributed_optimizer", "optimizer.use_distributed_optimizer"), skill=MEM,
      summary="ddp and optimizer use_distributed_optimizer differ: Bridge turns both on")
def _flags_out_of_sync(c: TrainingConfig, d: Derived) -> Violation | None:
    a, b = c.ddp.use_distributed_optimizer, c.optimizer.use_distributed_optimizer
    if a == b:
        return None
    return Violation(f"ddp.use_distributed_optimizer={a} but optimizer.use_distributed_optimizer="
                     f"{b}: Bridge enables the distributed optimizer for both",
                     "set both to true (or both to false) so the config says what runs")


@rule("fsdp.excludes-fsdp2", "error", ref="M1", source="megatron-bridge",
      fields=("dist.use_megatron_fsdp", FSDP, FSDP2), skill=MEM,
      summary="Megatron-FSDP and torch FSDP2 are mutually exclusive")
def _excludes_fsdp2(c: TrainingConfig, d: Derived) -> Violation | None:
    # Bridge compares the two dist flags; ddp.use_megatron_fsdp turns dist's on right after, so
    # it is included here.
    if not _megatron_fsdp(c) or _section(c, "dist").get("use_torch_fsdp2") is not True:
        return None
    return Violation("Megatron-FSDP (use_megatron_fsdp=True) with dist.use_torch_fsdp2=True",
                     f"keep one: {FSDP} = true and {FSDP2} = false (Megatron-FSDP is the one "
                     "Bridge supports)")


@rule("fsdp.checkpoint-format", "error", ref="M3", source="megatron-bridge",
      fields=(FSDP, FORMAT, "checkpoint.save", "checkpoint.load"), skill=MEM,
      summary="Megatron-FSDP save/load needs ckpt_format=fsdp_dtensor, and fsdp_dtensor needs "
              "Megatron-FSDP")
def _checkpoint_format(c: TrainingConfig, d: Derived) -> Violation | None:
    ckpt, fmt = _section(c, "checkpoint"), _ckpt_format(c)
    io = ckpt.get("save") is not None or ckpt.get("load") is not None
    if _megatron_fsdp(c) and io and fmt != "fsdp_dtensor":
        return Violation(f"Megatron-FSDP saving/loading with ckpt_format={fmt!r}",
                         f"set {FORMAT} = 'fsdp_dtensor'")
    if not _megatron_fsdp(c) and fmt == "fsdp_dtensor":
        return Violation("ckpt_format='fsdp_dtensor' without Megatron-FSDP",
                         f"set {FORMAT} = 'torch_dist', or {FSDP} = true")
    return None


@rule("fsdp.manual-registration-needs-nccl-ub", "error", ref="M4", source="megatron-bridge",
      fields=("ddp.fsdp_manual_registration", "ddp.nccl_ub", FSDP), skill=MEM,
      summary="Megatron-FSDP fsdp_manual_registration needs nccl_ub")
def _manual_registration_needs_nccl_ub(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _megatron_fsdp(c) or not c.ddp.fsdp_manual_registration or c.ddp.nccl_ub:
        return None
    return Violation("fsdp_manual_registration=True with nccl_ub=False",
                     "set ddp.nccl_ub = true, or ddp.fsdp_manual_registration = false")


@rule("checkpoint.async-save-format", "error", ref="M5", source="megatron-bridge",
      fields=("checkpoint.async_save", FORMAT), skill=None,
      summary="async_save works only with ckpt_format torch_dist or fsdp_dtensor")
def _async_save_format(c: TrainingConfig, d: Derived) -> Violation | None:
    fmt = _ckpt_format(c)
    if _section(c, "checkpoint").get("async_save") is not True or fmt in DIST_FORMATS:
        return None
    return Violation(f"async_save=True with ckpt_format={fmt!r}",
                     f"set {FORMAT} = 'torch_dist', or checkpoint.async_save = false")


@rule("checkpoint.no-gloo-needs-dist-format", "error", ref="M6", source="megatron-bridge",
      fields=("dist.use_gloo_process_groups", "optimizer.use_distributed_optimizer", FORMAT),
      skill=None,
      summary="without gloo groups the distributed optimizer needs a distributed checkpoint "
              "format")
def _no_gloo_needs_dist_format(c: TrainingConfig, d: Derived) -> Violation | None:
    fmt = _ckpt_format(c)
    distopt = c.optimizer.use_distributed_optimizer or c.ddp.use_distributed_optimizer
    if _section(c, "dist").get("use_gloo_process_groups") is not False or not distopt or \
            fmt in DIST_FORMATS:
        return None
    return Violation(f"use_gloo_process_groups=False with the distributed optimizer and "
                     f"ckpt_format={fmt!r}",
                     f"set {FORMAT} = 'torch_dist', or dist.use_gloo_process_groups = true")


def _v2_gaps(c: TrainingConfig, d: Derived) -> list[str]:
    """What Megatron-FSDP v2 (DP-only, bf16) does not support, from the modelled fields."""
    m, o, p = c.model, c.optimizer, d.precision
    gaps = [f"{n}={v}" for n, v in (("TP", d.tp), ("PP", d.pp), ("CP", d.cp), ("EP", d.ep))
            if v > 1]
    flags = (("an MoE model", d.is_moe),
             ("VPP", m.virtual_pipeline_model_parallel_size is not None),
             ("non-bf16 precision", not p.bf16), ("FP8/FP4", bool(p.fp8 or p.fp4)),
             ("the precision-aware optimizer", o.use_precision_aware_optimizer),
             ("optimizer CPU offload", o.optimizer_cpu_offload),
             ("CUDA graphs", m.cuda_graph_impl not in ("none", None)),
             ("per-token loss", m.calculate_per_token_loss))
    return gaps + [name for name, on in flags if on]


@rule("fsdp.v2-restrictions", "error", ref="M7", source="megatron-bridge",
      fields=("ddp.megatron_fsdp_version", "model.tensor_model_parallel_size",
              "model.pipeline_model_parallel_size", "model.context_parallel_size",
              "model.expert_model_parallel_size", "mixed_precision"), skill=MEM,
      summary="Megatron-FSDP v2 is DP-only and bf16-only (no MoE, VPP, FP8, graphs, offload, …)")
def _v2_restrictions(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.ddp.carried().get("megatron_fsdp_version") != 2:
        return None
    gaps = _v2_gaps(c, d)
    if not gaps:
        return None
    return Violation(f"megatron_fsdp_version=2 with {', '.join(gaps)}",
                     "use Megatron-FSDP v1 (ddp.megatron_fsdp_version = 1) for this layout, or "
                     "drop the listed features")


@rule("fsdp.torch-fsdp2-unsupported", "warning", ref="M8", source="skill",
      fields=(FSDP2,), skill=MEM,
      summary="torch FSDP2 in Bridge: blocked with PP, EP, the distributed optimizer and FP16; "
              "the Bridge path currently fails")
def _torch_fsdp2_unsupported(c: TrainingConfig, d: Derived) -> Violation | None:
    if _section(c, "dist").get("use_torch_fsdp2") is not True:
        return None
    blockers = [f"PP={d.pp}"] * (d.pp > 1) + [f"EP={d.ep}"] * (d.ep > 1) + (
        ["the distributed optimizer"] if c.optimizer.use_distributed_optimizer else []) + (
        ["fp16"] if d.precision.fp16 else [])
    also = f" (and it is blocked with {', '.join(blockers)})" if blockers else ""
    return Violation(f"dist.use_torch_fsdp2=True: the Bridge FSDP2 path currently fails at "
                     f"setup{also}",
                     f"use Megatron-FSDP ({FSDP} = true) instead")
