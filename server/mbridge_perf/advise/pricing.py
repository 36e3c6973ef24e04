"""Price planner layouts with the estimator: one config per layout, built by copying the one
section that changes, priced by ``estimate_memory`` itself (so a layout's per-stage memory is
exactly what ``estimate_memory`` says on the same config), and a short rescue ladder for the
layouts that do not fit as set.

Why CP is walked and not swept: at a fixed world size the static state does not depend on CP
(the optimizer shards over DP·CP = N / (TP·PP)) and activations per rank fall as CP grows
(micro-batches in flight rise with CP only up to PP), so for one skeleton the smallest CP that
fits bounds all the others: larger CPs fit too, smaller ones do not. The walk starts at the
skill's CP = seq / 4096 and prices only until the boundary is found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mbridge_perf.advise.changes import apply_changes
from mbridge_perf.advise.layouts import Group, Skeleton
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory import overheads as ov
from mbridge_perf.memory.activations import attention_is_fused
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory
from mbridge_perf.memory.params import layer_kinds
from mbridge_perf.rules.validate import validate

LONG_CONTEXT = 32768
"""From here on (the long-context skill's 32K-256K range) full recompute is not offered as a
way to fit: it recomputes attention, which dominates the step at long sequence."""


@dataclass(slots=True)
class Priced:
    """One layout at one CP with its estimate."""

    sk: Skeleton
    cp: int
    cfg: TrainingConfig
    report: MemoryReport
    rung: Rung | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return bool(self.report.fits)


@dataclass(slots=True)
class Rung:
    """The first step of the rescue ladder that makes a layout fit."""

    name: str  # allocator | selective | optimizer_offload | full
    action: str
    changes: dict[str, Any]


@dataclass
class Counter:
    priced: int = 0
    bounded: int = 0
    rescued: int = 0
    validated: int = 0
    budget: int = 8000
    """Most estimates one plan may spend (tool arguments are untrusted: a million GPUs with
    many divisors must not run for minutes); past it the search stops and says so."""
    errors: list[str] = field(default_factory=list)

    @property
    def spent(self) -> bool:
        return self.priced + self.rescued >= self.budget


def layout_changes(sk: Skeleton, cp: int) -> dict[str, Any]:
    """Dotted Bridge keys that put ``sk`` at ``cp`` on a config."""
    ch: dict[str, Any] = {"model.tensor_model_parallel_size": sk.tp,
                          "model.context_parallel_size": cp,
                          "model.sequence_parallel": sk.tp > 1,
                          "model.expert_model_parallel_size": sk.ep,
                          "model.expert_tensor_parallel_size": sk.etp,
                          "train.micro_batch_size": sk.mbs}
    ch.update(sk.split.changes())
    return ch


def price(base: TrainingConfig, sk: Skeleton, cp: int, count: Counter) -> Priced | None:
    """The layout's config and its estimate; None (reason kept) when the estimator refuses or
    the budget is spent."""
    if count.spent:
        return None
    try:
        cfg = apply_changes(base, layout_changes(sk, cp))
        rep = estimate_memory(cfg)
    except ConfigError as exc:
        count.errors.append(str(exc))
        return None
    count.priced += 1
    return Priced(sk, cp, cfg, rep)


def _row_boundary(get: Any, row: int, cps: tuple[int, ...], j: int) -> int | None:
    """Smallest CP index that fits in ``row``, searching from index ``j`` (down while it fits,
    up until it does)."""
    if get(row, j):
        while j > 0 and get(row, j - 1):
            j -= 1
        return j
    for k in range(j + 1, len(cps)):
        if get(row, k):
            return k
    return None


def staircase(base: TrainingConfig, g: Group, start: int, count: Counter) -> tuple[
        dict[tuple[int, int], Priced], dict[int, int]]:
    """Price the fit boundary of a group's (EP, CP) grid: the largest EP row first, from the
    CP nearest ``start``; each smaller EP needs at least the CP of the row above. Returns the
    priced layouts by (EP, CP) and, per EP that fits somewhere, the smallest fitting CP."""
    priced: dict[tuple[int, int], Priced] = {}
    refused: set[tuple[int, int]] = set()

    def get(row: int, k: int) -> bool:
        key = (g.eps[row], g.cps[k])
        if key in refused:
            return False
        hit = priced.get(key)
        if hit is None:
            hit = price(base, g.skeleton(key[0]), key[1], count)
            if hit is None:
                refused.add(key)
                return False
            priced[key] = hit
        return hit.fits

    bounds: dict[int, int] = {}
    cps = g.cps
    j = min(range(len(cps)), key=lambda k: (abs(cps[k] - start), -cps[k]))
    b = _row_boundary(get, len(g.eps) - 1, cps, j)
    for row in range(len(g.eps) - 1, -1, -1):
        if b is None:
            break
        if row < len(g.eps) - 1:
            b = _row_boundary(get, row, cps, b) if not get(row, b) else b
            if b is None:
                break
        bounds[g.eps[row]] = cps[b]
    return priced, bounds


# ---------------------------------------------------------------------------------------------
# the rescue ladder (recommend_recompute's rung order without full recompute at long context)


def _selective_order(cfg: TrainingConfig) -> list[str]:
    """The skills' selective modules for this architecture, cheapest memory first."""
    m = cfg.model
    kinds = layer_kinds(m)
    moe = any(k.mlp == "moe" for k in kinds)
    # core_attn only with unfused attention, and never at long context (it repeats attention)
    order = [] if attention_is_fused(cfg) or (m.seq_length or 0) >= LONG_CONTEXT else [
        "core_attn"]
    if any(k.mixer == "mla" for k in kinds):
        order.append("mla_up_proj")
    if moe and m.moe_grouped_gemm:
        order.append("moe_act")
    order.append("layernorm")
    if any(k.mlp == "dense" for k in kinds):
        order.append("mlp")
    if moe:
        order.append("moe")
    return order


def rescue_steps(cfg: TrainingConfig) -> list[Rung]:
    """Rungs to try on a layout that does not fit, each a change on top of the rungs kept
    before it: the allocator setting, the selective modules one by one, optimizer CPU offload
    0.25..1.0, then full recompute - the last only below LONG_CONTEXT (the long-context skill:
    selective before full; attention recompute at long sequence costs far more than it saves).
    """
    m = cfg.model
    steps: list[Rung] = []
    if not ov.expandable_segments(cfg.env) and not cfg.ddp.nccl_ub:
        conf = cfg.env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        steps.append(Rung("allocator", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                          {"env.PYTORCH_CUDA_ALLOC_CONF": f"{conf},expandable_segments:True"
                           if conf else "expandable_segments:True"}))
    if m.recompute_granularity != "full":
        have = list(m.recompute_modules or ["core_attn"]) if \
            m.recompute_granularity == "selective" else []
        for mod in _selective_order(cfg):
            if mod not in have:
                steps.append(Rung("selective", f"add {mod} to recompute_modules (selective)",
                                  {"model.recompute_granularity": "selective",
                                   "model.recompute_modules": [mod]}))
    o = cfg.optimizer
    if o.use_distributed_optimizer:
        for frac in (0.25, 0.5, 0.75, 1.0):
            if o.optimizer_cpu_offload and frac <= o.optimizer_offload_fraction:
                continue
            steps.append(Rung("optimizer_offload", "optimizer CPU offload, "
                              f"optimizer_offload_fraction={frac:g}",
                              {"optimizer.optimizer_cpu_offload": True,
                               "optimizer.optimizer_offload_fraction": frac,
                               "optimizer.decoupled_weight_decay": True}))
    if (m.seq_length or 0) < LONG_CONTEXT and m.recompute_granularity != "full":
        steps.append(Rung("full", "full recompute (uniform, recompute_num_layers=1)",
                          {"model.recompute_granularity": "full",
                           "model.recompute_method": "uniform",
                           "model.recompute_num_layers": 1, "model.recompute_modules": None}))
    return steps


def _errors(cfg: TrainingConfig) -> set[str]:
    return {f.rule_id for f in validate(cfg).findings if f.severity == "error"}


def rescue(p: Priced, count: Counter) -> Priced | None:
    """The first rung that makes ``p`` fit, priced and validated; a rung the validator
    rejects (e.g. ``moe`` recompute under a graphed router) is skipped, the ones that pass are
    kept for the next. Full recompute replaces the selective modules and offload before it."""
    known = _errors(p.cfg)
    kept: dict[str, Any] = {}
    mods = list(p.cfg.model.recompute_modules or ["core_attn"]) if \
        p.cfg.model.recompute_granularity == "selective" else []
    for step in rescue_steps(p.cfg):
        delta = dict(step.changes)
        if step.name == "selective":
            delta["model.recompute_modules"] = [*mods, *delta["model.recompute_modules"]]
        trial = {**kept, **delta} if step.name != "full" else {
            k: v for k, v in {**kept, **delta}.items()
            if not k.startswith(("optimizer.", "model.recompute"))} | delta
        try:
            cfg = apply_changes(p.cfg, trial)
            rep = estimate_memory(cfg)
        except ConfigError:
            continue
        count.rescued += 1
        if _errors(cfg) - known:
            continue
        kept = trial
        if step.name == "selective":
            mods = list(delta["model.recompute_modules"])
        if rep.fits:
            return Priced(p.sk, p.cp, cfg, rep, Rung(step.name, describe(p.cfg, trial), trial))
    return None


def describe(cfg: TrainingConfig, changes: dict[str, Any]) -> str:
    """A rung's kept changes in words: the allocator, the modules added, the offload."""
    out = []
    if "env.PYTORCH_CUDA_ALLOC_CONF" in changes:
        out.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if changes.get("model.recompute_granularity") == "full":
        out.append('full recompute (recompute_method="uniform", recompute_num_layers=1)')
    elif "model.recompute_modules" in changes:
        had = set(cfg.model.recompute_modules or []) if \
            cfg.model.recompute_granularity == "selective" else set()
        added = [x for x in changes["model.recompute_modules"] if x not in had]
        out.append(f"selective recompute_modules += {added}")
    if changes.get("optimizer.optimizer_cpu_offload"):
        out.append("optimizer CPU offload, optimizer_offload_fraction="
                   f"{changes['optimizer.optimizer_offload_fraction']:g}")
    return "; ".join(out)
