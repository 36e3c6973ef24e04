"""The skills' memory ladder: which change comes next when a config does not fit, in one order for
every tool that climbs it (``recommend_recompute`` prices every rung; the planner's rescue stops
at the first rung that fits a layout).

The order, cheapest first: the allocator setting (free), the distributed optimizer where
DP·CP > 1 (about free, and what optimizer offload needs), the selective-recompute modules the
architecture calls for (a few percent each; mlp, shared_experts and moe last), full recompute
(about a third more compute), optimizer CPU offload (1.9x-4.2x step time measured). Long
context (32K and beyond, the long-context skill) is a parameter of the order, not a second copy:
there core_attn is not offered (it repeats attention, which dominates the step). The planner's
walk also leaves full recompute out at long context, where it compares layouts and CP is the
lever (its documented rule); recommend_recompute still lists it, after the selective modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory import overheads as ov

OFFLOAD_FRACTIONS = (0.25, 0.5, 0.75, 1.0)
"""optimizer_offload_fraction values tried, smallest first (the perf-cpu-offloading card's
ladder)."""


@dataclass(frozen=True, slots=True)
class Rung:
    """One step of the ladder: its kind, the change in words and as dotted Bridge keys."""

    name: str  # allocator | selective | full | optimizer_offload
    action: str
    changes: dict[str, Any]


def allocator_changes(cfg: TrainingConfig, d: Derived) -> dict[str, Any]:
    """expandable_segments:True appended to the user's allocator setting; with CUDA graphs
    also NCCL_GRAPH_REGISTER=0 (the perf harness sets both)."""
    conf = cfg.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
    changes: dict[str, Any] = {"env.PYTORCH_CUDA_ALLOC_CONF":
                               f"{conf},expandable_segments:True" if conf else
                               "expandable_segments:True"}
    if d.graphs.on:
        changes["env.NCCL_GRAPH_REGISTER"] = "0"
    return changes


def allocator_applies(cfg: TrainingConfig) -> bool:
    """Not already set, and not with NCCL user buffers (env.expandable-vs-nccl-ub)."""
    return not ov.expandable_segments(cfg.env) and not cfg.ddp.nccl_ub


DISTRIBUTED_OPTIMIZER: dict[str, Any] = {"optimizer.use_distributed_optimizer": True,
                                         "ddp.use_distributed_optimizer": True}


def distributed_optimizer_applies(cfg: TrainingConfig, d: Derived) -> bool:
    """Not on yet, not under Megatron-FSDP, and something to shard over (DP·CP > 1)."""
    if cfg.optimizer.use_distributed_optimizer or cfg.ddp.use_megatron_fsdp:
        return False
    return (d.dp or 1) * d.cp > 1


def selective_changes(cfg: TrainingConfig, mods: list[str]) -> dict[str, Any]:
    """Selective recompute of exactly ``mods``."""
    changes: dict[str, Any] = {}
    if cfg.model.recompute_granularity != "selective":
        changes["model.recompute_granularity"] = "selective"
    changes["model.recompute_modules"] = mods
    return changes


def graph_fix(d: Derived) -> dict[str, Any]:
    """Full recompute asserts with any per-layer CUDA graph: turn graphs off (the listed
    alternative to a full-iteration graph)."""
    return {"model.cuda_graph_impl": "none"} if d.graphs.per_layer else {}


def full_changes(d: Derived, method: str = "uniform", num_layers: int = 1) -> dict[str, Any]:
    return {"model.recompute_granularity": "full", "model.recompute_method": method,
            "model.recompute_num_layers": num_layers, **graph_fix(d)}


def offload_changes(fraction: float) -> dict[str, Any]:
    return {"optimizer.optimizer_cpu_offload": True,
            "optimizer.optimizer_offload_fraction": fraction}


def rescue_rungs(cfg: TrainingConfig, d: Derived, *, long_context: bool) -> list[Rung]:
    """The ladder as single rungs for a walk that keeps each accepted rung and stops at the
    first that fits: the allocator, the distributed optimizer, the selective modules one by one
    (each to be added to the modules kept so far), full recompute (uniform, one layer: the
    fewest stored inputs per micro-batch; not at long context), then optimizer CPU offload at
    growing fractions (needs the distributed optimizer: on already or from its rung)."""
    m = cfg.model
    steps: list[Rung] = []
    if allocator_applies(cfg):
        steps.append(Rung("allocator", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                          allocator_changes(cfg, d)))
    distopt = cfg.optimizer.use_distributed_optimizer
    if distributed_optimizer_applies(cfg, d):
        steps.append(Rung("distributed_optimizer", "distributed optimizer "
                          "(use_distributed_optimizer=true)", dict(DISTRIBUTED_OPTIMIZER)))
        distopt = True
    if m.recompute_granularity != "full":
        have = d.recompute.selective
        for mod in d.selective_order(long_context=long_context):
            if mod not in have:
                steps.append(Rung("selective", f"add {mod} to recompute_modules (selective)",
                                  {"model.recompute_granularity": "selective",
                                   "model.recompute_modules": [mod]}))
        if not long_context:
            steps.append(Rung("full", "full recompute (uniform, recompute_num_layers=1)",
                              {**full_changes(d), "model.recompute_modules": None}))
    o = cfg.optimizer
    if distopt:
        for frac in OFFLOAD_FRACTIONS:
            if o.optimizer_cpu_offload and frac <= o.optimizer_offload_fraction:
                continue
            steps.append(Rung("optimizer_offload", "optimizer CPU offload, "
                              f"optimizer_offload_fraction={frac:g}",
                              {**offload_changes(frac),
                               "optimizer.decoupled_weight_decay": True}))
    return steps
