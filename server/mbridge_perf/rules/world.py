"""World size, DP / EDP and parallel folding (constraint catalog section A)."""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import MEM, WORKFLOW, Violation, rule

TP = "model.tensor_model_parallel_size"
PP = "model.pipeline_model_parallel_size"
CP = "model.context_parallel_size"
EP = "model.expert_model_parallel_size"
ETP = "model.expert_tensor_parallel_size"
WORLD = "cluster.num_gpus"


@rule("world.dp-divisible", "error", ref="A1", source="megatron-bridge",
      fields=(WORLD, TP, PP, CP), skill=MEM,
      summary="world size divisible by TP·PP·CP; dense DP = world / (TP·PP·CP)")
def _dp_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    w, mp = d.world_size, d.model_parallel_size
    if w is None or w % mp == 0:
        return None
    return Violation(
        f"{w} GPUs are not divisible by TP·PP·CP = {d.tp}·{d.pp}·{d.cp} = {mp}",
        f"use a GPU count that is a multiple of {mp}, or change TP/PP/CP so their product "
        f"divides {w}")


@rule("world.edp-divisible", "error", ref="A3", source="megatron-core",
      fields=(WORLD, ETP, EP, PP), skill=WORKFLOW,
      summary="world size divisible by ETP·EP·PP; EDP = world / (ETP·EP·PP)")
def _edp_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    w, emp = d.world_size, d.expert_model_parallel_size
    if w is None or not d.is_moe or w % emp == 0:
        return None
    unset = " (ETP is unset, so it defaults to TP)" if c.model.expert_tensor_parallel_size \
        is None and d.tp > 1 else ""
    # Bridge's validate() does not check the expert mesh (process-group init does), so on the
    # world a dump merely implies this is a warning about where it can launch.
    inferred = (f" (the world the dump implies: comm_overlap.data_parallel_size "
                f"{d.dp} x TP·PP·CP {d.model_parallel_size}; Megatron-Core's process-group "
                "init raises on it)") if d.world_from_dump else ""
    return Violation(
        f"{w} GPUs are not divisible by the expert mesh ETP·EP·PP = {d.etp}·{d.ep}·{d.pp} = "
        f"{emp}{unset}{inferred}",
        f"launch on a multiple of {emp} GPUs (set {WORLD}), or set {ETP}/{EP} so ETP·EP·PP "
        f"divides {w}", severity="warning" if d.world_from_dump else None)


@rule("world.ep-needs-moe", "error", ref="A6", source="megatron-core", fields=(EP,
      "model.num_moe_experts"), skill=WORKFLOW, mcore_enforced=True,
      summary="expert parallelism needs an MoE model (num_moe_experts set)")
def _ep_needs_moe(c: TrainingConfig, d: Derived) -> Violation | None:
    if d.ep > 1 and c.model.num_moe_experts is None:
        return Violation(f"{EP} = {d.ep} but model.num_moe_experts is not set",
                         f"set {EP} = 1 for a dense model, or set model.num_moe_experts")
    return None


@rule("world.experts-divisible-by-ep", "error", ref="A7", source="megatron-core",
      fields=("model.num_moe_experts", EP), skill=WORKFLOW,
      summary="num_moe_experts divisible by EP (each EP rank holds the same number of experts)")
def _experts_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    n = c.model.num_moe_experts
    if n is None or n % d.ep == 0:
        return None
    return Violation(f"{n} experts cannot be split evenly over EP = {d.ep}",
                     f"choose {EP} among the divisors of {n}")


@rule("world.gbs-divisible", "error", ref="A10", source="megatron-bridge",
      fields=("train.global_batch_size", "train.micro_batch_size", WORLD, TP, PP, CP),
      skill=MEM, summary="global batch divisible by micro batch · DP")
def _gbs_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    t = c.train
    if d.dp is None or t.global_batch_size is None:
        return None
    step = t.micro_batch_size * d.dp
    if t.global_batch_size % step == 0:
        return None
    lower = t.global_batch_size // step * step
    near = f"{lower} or {lower + step}" if lower else str(step)
    return Violation(
        f"global_batch_size {t.global_batch_size} is not divisible by micro_batch_size · DP = "
        f"{t.micro_batch_size}·{d.dp} = {step}",
        f"set train.global_batch_size to a multiple of {step} (e.g. {near})")
