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
from mbridge_perf.advise.ladder import Rung, rescue_rungs
from mbridge_perf.advise.layouts import Group, Skeleton
from mbridge_perf.config.derived import Derived
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory
from mbridge_perf.rules.validate import validate


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
        return fits_central(self.report)


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
# the rescue: the memory ladder (advise.ladder), walked until a layout fits


def fits_central(rep: MemoryReport) -> bool:
    """The planner's fit: the need at the low end of the reserved band is within the GPU (its
    classes then separate the layouts that also fit at the band's high end from the tight
    ones); the estimator's own margin is not spent here, where layouts are compared."""
    return rep.headroom_gib is not None and rep.headroom_gib >= 0


def _errors(cfg: TrainingConfig) -> set[str]:
    return {f.rule_id for f in validate(cfg).findings if f.severity == "error"}


def rescue(p: Priced, count: Counter) -> Priced | None:
    """The first rung that makes ``p`` fit, priced and validated; a rung the validator
    rejects (e.g. ``moe`` recompute under a graphed router) is skipped, the ones that pass are
    kept for the next. Full recompute replaces the selective modules and offload before it."""
    known = _errors(p.cfg)
    kept: dict[str, Any] = {}
    mods = list(Derived(p.cfg).recompute.selective)
    d = Derived(p.cfg)
    for step in rescue_rungs(p.cfg, d, long_context=d.long_context):
        delta = dict(step.changes)
        if step.name == "selective":
            delta["model.recompute_modules"] = [*mods, *delta["model.recompute_modules"]]
        trial = {**kept, **delta} if step.name != "full" else {
            k: v for k, v in {**kept, **delta}.items()
            if not k.startswith("model.recompute")} | delta
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
        if fits_central(rep):
            return Priced(p.sk, p.cp, cfg, rep, Rung(step.name, describe(p.cfg, trial), trial))
    return None


def describe(cfg: TrainingConfig, changes: dict[str, Any]) -> str:
    """A rung's kept changes in words: the allocator, the modules added, the offload."""
    out = []
    if "env.PYTORCH_CUDA_ALLOC_CONF" in changes:
        out.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if changes.get("optimizer.use_distributed_optimizer"):
        out.append("distributed optimizer")
    if changes.get("model.recompute_granularity") == "full":
        out.append('full recompute (recompute_method="uniform", recompute_num_layers=1)')
    elif "model.recompute_modules" in changes:
        had = set(Derived(cfg).recompute.selective)
        added = [x for x in changes["model.recompute_modules"] if x not in had]
        out.append(f"selective recompute_modules += {added}")
    if changes.get("optimizer.optimizer_cpu_offload"):
        out.append("optimizer CPU offload, optimizer_offload_fraction="
                   f"{changes['optimizer.optimizer_offload_fraction']:g}")
    return "; ".join(out)
