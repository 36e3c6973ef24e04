"""``recommend_recompute(cfg, target_gib=None)``: the skills' memory ladder run on the user's
config, every rung priced by the estimator and checked by the validator.

Why a ladder and not a search: the skills order the fixes by what they cost (allocator: free;
a selective module: a few percent; mlp: ~16 %; full recompute; CPU offload: 2-4x) and the user
should stop at the first rung that fits. Rungs are cumulative (each builds on the ones above),
except the alternatives that exclude recompute (activation offload). TP increases and VPP
changes are never a memory fix (skills: TP 4 -> 8 cost -28.4 % on Llama3 70B; VPP adds memory);
when nothing fits, the plan says which parallelism change to plan instead.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from mbridge_perf.advise.changes import apply_changes, as_overrides
from mbridge_perf.advise.costs import (
    FREE,
    OFFLOAD_CARD,
    ThroughputCost,
    estimated_cost,
    measured_saving,
    model_cost,
    module_cost,
)
from mbridge_perf.advise.ladder import (
    DISTRIBUTED_OPTIMIZER,
    OFFLOAD_FRACTIONS,
    allocator_changes,
    full_changes,
    graph_fix,
    offload_changes,
    selective_changes,
)
from mbridge_perf.advise.markdown import plan_markdown
from mbridge_perf.advise.recommend_result import Baseline, RecomputePlan, RecomputeStep
from mbridge_perf.config.derived import Derived
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory import overheads as ov
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory
from mbridge_perf.memory.verdict import Verdict, judge
from mbridge_perf.rules.validate import validate

MEMORY = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"


# ---------------------------------------------------------------------------------------------
# the ladder's state


@dataclass
class _Priced:
    cfg: TrainingConfig
    report: MemoryReport
    peak: float
    need: float


@dataclass
class _Ladder:
    user: TrainingConfig
    d: Derived
    budget: float
    gpu: str | None
    base: _Priced
    steps: list[RecomputeStep] = field(default_factory=list)
    priced: list[_Priced] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    base_errors: frozenset[str] = frozenset()

    def at(self, index: int | None) -> _Priced:
        return self.base if index is None else self.priced[index]

    def last(self) -> int | None:
        return len(self.steps) - 1 if self.steps else None

    def before_recompute(self) -> int | None:
        """The last step that changes no recompute setting (allocator, optimizer sharding):
        what full recompute and activation offload build on instead of selective."""
        idx = None
        for st in self.steps:
            if st.rung in ("allocator", "distributed_optimizer"):
                idx = st.index
        return idx


def _price(cfg: TrainingConfig, gpu: str | None) -> _Priced:
    rep = estimate_memory(cfg, gpu=gpu)
    return _Priced(cfg, rep, rep.peak_allocated_gib, rep.need_gib[1])


def _judge(lad: _Ladder, priced: _Priced) -> tuple[Verdict, str]:
    lo, hi = priced.report.need_gib
    return judge(lo, hi, lad.budget)


def _new_errors(lad: _Ladder, cfg: TrainingConfig) -> list[str]:
    rep = validate(cfg)
    return [f"{f.rule_id}: {f.message}" for f in rep.findings
            if f.severity == "error" and f.rule_id not in lad.base_errors]


def _try(lad: _Ladder, on: int | None, changes: dict[str, Any]) -> tuple[_Priced | None, str]:
    """Price ``changes`` on top of step ``on``; None and the reason when the validator or the
    estimator refuses the result."""
    try:
        cfg = apply_changes(lad.at(on).cfg, changes)
        errors = _new_errors(lad, cfg)
        if errors:
            return None, errors[0]
        return _price(cfg, lad.gpu), ""
    except ConfigError as exc:
        return None, str(exc)


def _add(lad: _Ladder, on: int | None, priced: _Priced, *, rung: Any, action: str,
         changes: dict[str, Any], cost: ThroughputCost, rationale: str, skill: str) -> None:
    prev = lad.at(on)
    if cost.basis == "estimate":
        cost = model_cost(prev.cfg, priced.cfg, cost, lad.gpu)
    verdict, term = _judge(lad, priced)
    lad.steps.append(RecomputeStep(
        index=len(lad.steps), rung=rung, action=action, config_changes=changes,
        overrides=as_overrides(changes), builds_on=on, est_peak_gib=round(priced.peak, 2),
        est_need_gib=round(priced.need, 2), est_saving_gib=round(prev.peak - priced.peak, 2),
        throughput_cost=cost, verdict=verdict, verdict_term=term,
        fits=verdict != "does_not_fit", rationale=rationale, skill=skill))
    lad.priced.append(priced)


# ---------------------------------------------------------------------------------------------
# rungs


def _allocator(lad: _Ladder) -> None:
    cfg = lad.user
    if ov.expandable_segments(cfg.env):
        lad.notes.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is already set: a "
                         "remaining OOM is capacity, not fragmentation.")
        return
    if cfg.ddp.nccl_ub:
        lad.skipped.append("allocator: expandable_segments:True does not work with NCCL "
                           "user buffers (ddp.nccl_ub=true; env.expandable-vs-nccl-ub); "
                           "drop nccl_ub first if fragmentation is the problem")
        return
    changes = allocator_changes(cfg, lad.d)
    graphs = lad.d.graphs.on
    priced, why = _try(lad, None, changes)
    if priced is None:
        lad.skipped.append(f"allocator: {why}")
        return
    lo, hi = lad.base.report.reserved_band_gib
    lo2, hi2 = priced.report.reserved_band_gib
    _add(lad, None, priced, rung="allocator",
         action="Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
                + (" and NCCL_GRAPH_REGISTER=0 (CUDA graphs are on)" if graphs else ""),
         changes=changes, cost=FREE, skill=MEMORY,
         rationale=f"Segments grow in place instead of leaving reserved-but-unallocated holes: "
                   f"the band above the {lad.base.peak:.1f} GiB peak narrows from "
                   f"{lo:.1f}-{hi:.1f} to {lo2:.1f}-{hi2:.1f} GiB. Borderline OOMs are mostly "
                   "fragmentation (the Llama3 70B SFT OOM at 58.8 GB on 80 GB was).")


def _distributed_optimizer(lad: _Ladder) -> None:
    """Shard master weights and Adam moments over the data-parallel ranks when DP > 1: about
    free in step time (reduce-scatter + all-gather instead of one all-reduce)."""
    cfg = lad.user
    if cfg.optimizer.use_distributed_optimizer or cfg.ddp.use_megatron_fsdp:
        return
    par = lad.base.report.parallelism
    if (par.get("data") or 1) * (par.get("context") or 1) <= 1:
        lad.skipped.append("distributed optimizer: DP x CP = 1, nothing to shard over")
        return
    on = lad.last()
    changes = dict(DISTRIBUTED_OPTIMIZER)
    priced, why = _try(lad, on, changes)
    if priced is None:
        lad.skipped.append(f"distributed optimizer: {why}")
        return
    _add(lad, on, priced, rung="distributed_optimizer",
         action="Enable the distributed optimizer (use_distributed_optimizer=true)",
         changes=changes, skill=MEMORY,
         cost=ThroughputCost(pct=None, basis="none", text="about none: gradients are "
                             "reduce-scattered and parameters all-gathered instead of one "
                             "all-reduce of the same volume; not measured in the skills",
                             source="-"),
         rationale=f"Master weights and Adam moments are sharded over DP x CP = "
                   f"{(par.get('data') or 1) * (par.get('context') or 1)} ranks instead of "
                   "replicated on each.")


def _selective_order(lad: _Ladder) -> list[str]:
    """The ladder's modules for this architecture; where both MLA's and the experts' cheap
    modules apply, the one that saves more per percent of step time goes first."""
    order = lad.d.selective_order(long_context=lad.d.long_context)
    firsts = [x for x in order if x in ("mla_up_proj", "moe_act")]
    if len(firsts) == 2:
        start = order.index(firsts[0])
        firsts.sort(key=lambda mod: -_saving_per_cost(lad, mod))
        order[start:start + 2] = firsts
    return order


def _saving_per_cost(lad: _Ladder, module: str) -> float:
    base = lad.at(lad.last())
    mods = _modules(base.cfg)
    priced, _ = _try(lad, lad.last(), selective_changes(base.cfg, [*mods, module]))
    saving = 0.0 if priced is None else base.peak - priced.peak
    pct = module_cost(lad.user, module).pct or 0.0
    return saving / max(pct, 0.5)


def _modules(cfg: TrainingConfig) -> list[str]:
    return list(Derived(cfg).recompute.selective)


_WHY = {
    "core_attn": "unfused attention keeps the a·s² scores, probabilities and dropout masks; "
                 "recomputing core attention drops them for a cheap re-run",
    "mla_up_proj": "MLA's up-projected per-head Q/K/V are the largest saved tensors of an MLA "
                   "layer; the up-projection is recomputed from the small latent",
    "moe_act": "the routed experts' activation-function output is dropped and recomputed "
               "(needs moe_grouped_gemm); cheap, memory-bound",
    "layernorm": "norm outputs are recomputed; near-free but small (Llama3 70B: 59.6 GB, still "
                 "OOM) - with Transformer Engine the norms fused into the next linear save "
                 "little",
    "mlp": "the whole FFN block is recomputed: the last selective resort on wide dense FFNs",
    "shared_experts": "the shared experts' FFN is recomputed (extra compute: one dense FFN "
                      "per MoE layer)",
    "moe": "the whole MoE layer is recomputed (extra compute: router, experts and the token "
           "dispatch / combine all-to-all again)",
}


def _selective(lad: _Ladder) -> None:
    cfg = lad.user
    fused = lad.d.fused_attention
    if fused:
        have = "core_attn" in _modules(cfg)
        lad.notes.append(
            "Attention is fused / flash (Transformer Engine): core_attn recompute frees ≈ 0 "
            "(Moonlight 16B: -0.01 % memory, +3.85 % step time)"
            + (" - the core_attn you already recompute is not a memory lever: the selective "
               "steps below drop it" if have else " - do not add it")
            + "; the module this architecture calls for comes first.")
    for module in _selective_order(lad):
        on = lad.last()
        base = lad.at(on)
        mods = _modules(base.cfg)
        if module in mods:
            continue
        dropped = fused and "core_attn" in mods
        if dropped:
            mods = [x for x in mods if x != "core_attn"]
        changes = selective_changes(base.cfg, [*mods, module])
        priced, why = _try(lad, on, changes)
        if priced is None:
            lad.skipped.append(f"selective {module}: {why}")
            continue
        ref = _without_module(lad, on, mods) if dropped else base.peak
        small = ref - priced.peak < 0.05
        if small and module != "layernorm":
            lad.skipped.append(f"selective {module}: frees ≈ 0 on this model")
            continue
        why = _WHY[module] + (" (frees ≈ 0 on this model)" if small else "")
        if dropped:
            why += _DROP_CORE_ATTN
            if ref - base.peak > 0.05:
                why += (f"; the estimate charges the drop +{ref - base.peak:.1f} GiB: under FP8 "
                        "attention's BF16 output is then kept next to linear_proj's FP8 copy")
        measured = measured_saving(cfg.model, module)
        if measured is not None and base.peak - priced.peak > 1.5 * measured[0]:
            why += (f". Measured: {measured[0]:.1f} GiB ({measured[1]}); the estimate "
                    f"({base.peak - priced.peak:.1f} GiB) is high for this recipe - the "
                    "estimator over-rates recompute savings of graphed FP8 runs (a known gap), "
                    "so expect the measured saving")
        _add(lad, on, priced, rung="selective", action=f"Add {module} to recompute_modules "
             "(selective recompute)", changes=changes, cost=module_cost(cfg, module),
             rationale=why[0].upper() + why[1:] + ".", skill=RECOMPUTE)


# Why a selective step under fused attention leaves core_attn out of the list it writes: the
# skills' measurements (activation-recompute card: Moonlight 16B [] -> [core_attn] -0.01 %
# memory, +3.85 % step time; Llama3 70B FP8-CS: mlp alone 593.6 vs mlp + core_attn 586.8 TFLOP/s,
# both runs peaking at 55.6 GB).
_DROP_CORE_ATTN = (". It also drops core_attn from recompute_modules: under fused / flash "
                   "attention core_attn recompute frees ≈ 0 and costs step time (Moonlight 16B: "
                   "-0.01 % memory, +3.85 % step time; Llama3 70B FP8-CS: mlp alone 593.6 vs "
                   "mlp + core_attn 586.8 TFLOP/s at the same 55.6 GB peak)")


def _without_module(lad: _Ladder, on: int | None, mods: list[str]) -> float:
    """Peak (GiB) of the step's base with core_attn dropped and nothing added: what the added
    module is measured against, so the estimator's price of the drop does not make a module
    look useless (or useful)."""
    base = lad.at(on)
    if not mods:
        changes: dict[str, Any] = {"model.recompute_granularity": None,
                                   "model.recompute_modules": None}
    else:
        changes = selective_changes(base.cfg, mods)
    ref, _ = _try(lad, on, changes)
    return base.peak if ref is None else ref.peak


def _full(lad: _Ladder) -> None:
    on = lad.before_recompute()
    base = lad.at(on)
    m = base.cfg.model
    chunk = max((len(c.layers) for c in _chunks(base.cfg)), default=1)
    based = Derived(base.cfg)
    graph = graph_fix(based)
    tried: tuple[_Priced, dict[str, Any], int, str] | None = None
    for method, n in [("block", k) for k in range(1, chunk + 1)] + [("uniform", 1)]:
        changes = full_changes(based, method, n)
        priced, why = _try(lad, on, changes)
        if priced is None:
            lad.skipped.append(f"full recompute: {why}")
            return
        tried = (priced, changes, n, method)
        if (priced.need <= lad.budget and priced.peak <= lad.at(lad.last()).peak + 0.01) \
                or method == "uniform":
            break
    assert tried is not None
    priced, changes, n, method = tried
    frac = n / chunk if method == "block" else 1.0
    how = (f'recompute_method="block", recompute_num_layers={n}: the first {n} of the '
           f"{chunk} layers of each pipeline chunk keep only their input, the rest stay whole "
           "(the fewest recomputed layers that fit and save more than the step above)"
           if method == "block" else
           'recompute_method="uniform", recompute_num_layers=1: every layer keeps only its '
           "input and is recomputed in its backward (the fewest stored inputs per "
           "micro-batch)")
    extra = ""
    if graph:
        extra = (f" Full recompute asserts with per-layer CUDA graphs "
                 f"(cuda_graph_impl={m.cuda_graph_impl!r}): this step sets "
                 'cuda_graph_impl="none"; the alternatives are selective recompute or '
                 'cuda_graph_impl="full_iteration" (graph modules empty, '
                 "rerun_state_machine.check_for_nan_in_loss=False).")
    _add(lad, on, priced, rung="full",
         action=f'Full recompute: recompute_granularity="full", recompute_method="{method}", '
                f"recompute_num_layers={n}", changes=changes,
         cost=estimated_cost(base.cfg, [], full_layers=frac), skill=RECOMPUTE,
         rationale=f"When the selective steps are not enough; {how}. recompute_method and "
                   "recompute_num_layers are both required with full granularity." + extra)


def _chunks(cfg: TrainingConfig) -> list[Any]:
    from mbridge_perf.memory.placement import placement

    return [c for stage in placement(cfg.model) for c in stage]


def _optimizer_offload(lad: _Ladder) -> None:
    on = lad.last()
    base = lad.at(on)
    if not base.cfg.optimizer.use_distributed_optimizer:
        lad.skipped.append("optimizer CPU offload: needs the distributed optimizer "
                           "(optimizer.use_distributed_optimizer=true)")
        return
    got = _smallest_fitting(lad, on, "optimizer CPU offload", (
        offload_changes(frac) for frac in OFFLOAD_FRACTIONS))
    if got is None:
        return
    priced, changes = got
    frac = changes["optimizer.optimizer_offload_fraction"]
    cost = ThroughputCost(pct=None, basis="measured", text="step time 1.9x-4.2x over "
                          "fractions 0.25-1.0 (Qwen3-30B-A3B, 16x H100, PP2); memory falls "
                          "linearly, ~3.8 GB per 25 %", source=OFFLOAD_CARD)
    _add(lad, on, priced, rung="optimizer_offload",
         action=f"Offload {frac:g} of the optimizer state to the CPU "
                "(optimizer_cpu_offload=true)", changes=changes, cost=cost, skill=MEMORY,
         rationale="The smallest fraction that fits; works at any PP (the measured ladder ran "
                   "at PP2) and frees master weights and Adam moments, not activations.")


def _smallest_fitting(lad: _Ladder, on: int, what: str,
                      options: Iterable[dict[str, Any]]) -> tuple[Any, dict[str, Any]] | None:
    """Price change sets in order, smallest first, and keep the first that fits (else the
    last, the most it can do). None when one is refused: the reason goes to skipped."""
    priced = changes = None
    for changes in options:
        priced, why = _try(lad, on, changes)
        if priced is None:
            lad.skipped.append(f"{what}: {why}")
            return None
        if priced.need <= lad.budget:
            break
    return None if priced is None or changes is None else (priced, changes)


def _activation_offload(lad: _Ladder) -> None:
    on = lad.before_recompute()
    cfg = lad.at(on).cfg
    m = cfg.model
    if m.pipeline_model_parallel_size > 1:
        lad.skipped.append("layer CPU activation offload (model.cpu_offloading): needs "
                           "pipeline_model_parallel_size=1 (offload.cpu-needs-pp1); this "
                           f"config has PP={m.pipeline_model_parallel_size}")
        return
    if Derived(cfg).graphs.per_layer:
        lad.skipped.append("layer CPU activation offload: CUDA graphs other than full_iteration "
                           "(offload.cpu-excludes-cuda-graphs)")
        return
    got = _smallest_fitting(lad, on, "layer CPU activation offload", (
        {"model.recompute_granularity": None, "model.cpu_offloading": True,
         "model.cpu_offloading_num_layers": k, "model.cpu_offloading_activations": True}
        for k in range(1, len(Derived(cfg).layer_kinds))))
    if got is None:
        return
    priced, changes = got
    _add(lad, on, priced, rung="activation_offload",
         action=f"Instead of recompute: offload the activations of "
                f"{changes['model.cpu_offloading_num_layers']} layers to the CPU "
                "(cpu_offloading)", changes=changes,
         cost=ThroughputCost(pct=None, basis="none", text="depends on host bandwidth; not "
                             "measured in the skills", source="-"), skill=MEMORY,
         rationale="An alternative to recompute at PP = 1: cpu_offloading excludes activation "
                   "recompute (offload.cpu-excludes-recompute), so recompute is switched off.")


# ---------------------------------------------------------------------------------------------
# the plan


def _budget(base: MemoryReport, target_gib: float | None) -> tuple[float, str]:
    if target_gib is not None:
        if not 0 < target_gib <= 10_000:
            raise ConfigError("target_gib", f"must be a positive GiB budget, got {target_gib}")
        return float(target_gib), f"target_gib={target_gib:g}"
    if base.gpu_capacity_gib is None:
        raise ConfigError("target_gib", "no memory budget: give target_gib or set cluster.gpu "
                                        "(e.g. H100) in the config")
    return base.gpu_capacity_gib, f"{base.gpu} capacity"


def _scenario(lad: _Ladder, verdict: Verdict) -> Literal["fragmentation", "capacity", "tight",
                                                          "fits"]:
    lo, hi = lad.base.report.need_gib
    if verdict == "fits":
        return "fits"
    if lo <= lad.budget < hi:
        return "fragmentation"
    return "capacity" if lo > lad.budget else "tight"


def _mark_optional(lad: _Ladder) -> int | None:
    """The first step whose verdict is fits or tight: the ladder stops there; the steps after
    it are listed as optional margin."""
    first = next((s.index for s in lad.steps if s.fits), None)
    if first is not None:
        lad.steps[first + 1:] = [s.model_copy(update={"optional": True})
                                 for s in lad.steps[first + 1:]]
    return first


def recommend_recompute(cfg: TrainingConfig, target_gib: float | None = None, *,
                        gpu: str | None = None) -> RecomputePlan:
    """The ladder for ``cfg`` against ``target_gib`` (default: the GPU's capacity)."""
    base = _price(cfg, gpu)
    budget, source = _budget(base.report, target_gib)
    errors = [f for f in validate(cfg).findings if f.severity == "error"]
    lad = _Ladder(user=cfg, d=Derived(cfg), budget=budget, gpu=gpu, base=base,
                  base_errors=frozenset(f.rule_id for f in errors))
    verdict, term = _judge(lad, base)
    if verdict == "fits":
        lad.notes.append(f"It already fits: {term}. Nothing to change for memory.")
    else:
        for rung in (_allocator, _distributed_optimizer, _selective, _full, _optimizer_offload,
                     _activation_offload):
            rung(lad)
    first = _mark_optional(lad)
    if first is None and verdict != "fits":
        lad.notes.append(_nothing_fits(lad))
    rep = base.report
    plan = RecomputePlan(
        scenario=_scenario(lad, verdict), budget_gib=round(budget, 2), budget_source=source,
        baseline=Baseline(est_peak_gib=round(base.peak, 2), est_need_gib=round(base.need, 2),
                          reserved_band_gib=(round(rep.reserved_band_gib[0], 2),
                                             round(rep.reserved_band_gib[1], 2)),
                          overheads_gib=round(rep.overheads.total_gib, 2),
                          verdict=verdict, verdict_term=term, fits=verdict == "fits",
                          expandable_segments=ov.expandable_segments(cfg.env),
                          findings=[f"{f.rule_id}: {f.message}" for f in errors]),
        steps=lad.steps, first_fitting_step=first, notes=lad.notes, skipped=lad.skipped,
        answer_markdown="")
    return plan.model_copy(update={"answer_markdown": plan_markdown(plan, cfg)})


def _nothing_fits(lad: _Ladder) -> str:
    m = lad.user.model
    pp = m.pipeline_model_parallel_size
    return (f"Nothing on this ladder fits in {lad.budget:.1f} GiB. Plan a parallelism change "
            f"instead: more pipeline stages at the same DP (PP {pp} -> {pp * 2} with twice the "
            "GPUs), context parallelism for long sequences, expert parallelism for MoE, or a "
            "GPU with more memory - not a TP increase and not a VPP change (a plan_parallelism "
            "tool will rank layouts; until then check each with validate_config and "
            "estimate_memory).")
