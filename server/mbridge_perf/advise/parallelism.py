"""``plan_parallelism``: every valid layout of a model on N GPUs, priced per pipeline stage and
ranked the way the skills rank.

Why a planner: the classic mistakes (GPU count as the product TP·PP·CP·EP·ETP, MoE sized by
active parameters, CP too small at 256K, TP over EP for experts) come from guessing layouts.
The planner enumerates with Parallel Folding (attention mesh TP·CP·DP·PP = N, expert mesh
ETP·EP·EDP·PP = N), rejects by the divisibility rules, prices with ``estimate_memory`` (with
the recompute the user set; a short rescue ladder says when a layout fits only with a rung)
and ranks the families that fit by predicted tokens/s/GPU (advise/speed.py: the step-time
model; layouts within its pair band of each other are a tie) and, within a tie, by the
skills' keys, in order: (1) fits with headroom (as set, then tight, then only with a rung);
(2) CP no larger than seq / 4096 (shards of at least the skill's 4K tokens); (3) the smallest
TP; (4) experts on EP before ETP; (5) the experts' all-to-all inside the fewest NVLink
domains; (6) the most DP; (7) from 32K tokens the CP nearest seq / 4096, below 32K the smallest
CP; (8) the fewest pipeline stages, then bubbles (PP - 1) / (VPP·M); headroom breaks the
remaining ties.

Why (7) stops at 32K: seq / 4096 is the long-context skill's rule, for its 32K-256K scope.
NVIDIA's shorter recipes run CP 1: 121 of the 153 Bridge perf dumps at 8K-16K, the majority in
13 of 16 model families (gpt-oss-20B, Llama3.1-8B and Moonlight are the exceptions) - so at 8K
CP 2 is not the tie-breaker's start, CP 1 is.

Why these keys and not "smallest footprint PP·lcm(TP·CP, EP·ETP) first": measured against
the layouts NVIDIA tuned for throughput - the 88 Bridge MoE perf recipes whose own layout our
estimator fits (``benchmarks/plan_vs_recipes.py``) - footprint-first put one recipe layout in
the top 3 and the median beyond rank 50; these keys put 49 in the top 3, median 3. Those
recipes keep TP at 1 (2 on H100 for the 671B / 235B models), keep CP at 1 for 4K, keep the
experts' all-to-all inside the NVLink domain where the memory allows it, and spend the rest
on PP: the workflow skill's "smallest model parallelism that fits, maximise DP, frequent
communication inside the fastest interconnect, PP across nodes, EP before TP for experts".
On the frozen list of 40 recipes NVIDIA measured at their own layout
(``plan_vs_recipes.py --frozen``, each ranked with the step-time calibration fitted without
its family), speed with ties puts 30 in the top 3, median rank 2; the keys alone 30 (26 and 27
with seq / 4096 as key (7) at 8K too).
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from math import ceil, log2
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError

from mbridge_perf.advise.changes import apply_changes, as_overrides
from mbridge_perf.advise.layouts import (
    SIZE_FIELDS,
    Group,
    Rejections,
    Skeleton,
    bubble_fraction,
    cp_rule_applies,
    cp_start,
    groups,
    min_gpus,
)
from mbridge_perf.advise.plan_answer import plan_markdown
from mbridge_perf.advise.plan_result import (
    ParallelismPlan,
    PlanCounts,
    PlannedLayout,
    RejectedFamily,
    StagePeak,
)
from mbridge_perf.advise.pricing import (
    Counter,
    Priced,
    layout_changes,
    price,
    rescue,
    staircase,
)
from mbridge_perf.advise.published import PublishedLayout, PublishedRow, matching
from mbridge_perf.advise.speed import Predicted, order_by_speed, pair_band, predict, widest_gap
from mbridge_perf.config.derived import resolve_precision
from mbridge_perf.config.errors import ConfigError, type_problem
from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.model import MAX_GPUS, TrainingConfig
from mbridge_perf.config.semantics import LONG_CONTEXT
from mbridge_perf.rules.validate import validate
from mbridge_perf.steptime import Calibration

MAX_TOP_K = 50
MAX_CONSTRAINT_VALUES = 32
RESCUE_BUDGET = 40
SAME_RULE_STOP = 12
SPEED_POOL = MAX_TOP_K
"""Families (best by the keys) whose step time is predicted and ranked by speed, whatever
top_k is (so a layout's rank does not depend on how many are returned)."""
HOPELESS = 1.25
"""A VPP 1 group whose largest EP and CP need more than this times the GPU: its VPP > 1 groups
(interleaving adds 1 + (PP - 1) / (PP·VPP) in flight) are not priced."""


Sizes = Annotated[list[Annotated[int, Field(ge=1, le=MAX_GPUS)]] | None,
                  Field(min_length=1, max_length=MAX_CONSTRAINT_VALUES)]


class PlanConstraints(BaseModel):
    """Allowed values per size (Bridge field names); a missing key means "any"."""

    model_config = {"extra": "forbid"}

    tensor_model_parallel_size: Sizes = None
    pipeline_model_parallel_size: Sizes = None
    virtual_pipeline_model_parallel_size: Sizes = None
    context_parallel_size: Sizes = None
    expert_model_parallel_size: Sizes = None
    expert_tensor_parallel_size: Sizes = None
    micro_batch_size: Sizes = None


# ---------------------------------------------------------------------------------------------
# inputs


def _bounded(name: str, value: Any, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise ConfigError(name, f"must be a whole number from {lo} to {hi:,}, got {value!r}")
    return value


def _constraints(c: PlanConstraints | dict[str, Any] | None) -> dict[str, list[int]]:
    if c is None:
        return {}
    if isinstance(c, dict):
        bad = [k for k in c if k not in SIZE_FIELDS]
        if bad:
            raise ConfigError(f"constraints.{str(bad[0])[:60]}", "unknown size; use "
                              + ", ".join(SIZE_FIELDS))
        try:
            c = PlanConstraints.model_validate(c)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ConfigError("constraints." + ".".join(str(x) for x in err["loc"]),
                              type_problem(err)) from None
    out = {}
    for k, v in c.model_dump(exclude_none=True).items():
        if not v or len(v) > MAX_CONSTRAINT_VALUES:
            raise ConfigError(f"constraints.{k}", f"give 1 to {MAX_CONSTRAINT_VALUES} values")
        out[k] = [_bounded(f"constraints.{k}", x, 1, MAX_GPUS) for x in v]
    return out


def _base(cfg: TrainingConfig, n: int, gpu: str, seq: int, gbs: int) -> TrainingConfig:
    """The user's config at the planned world, GPU, sequence and batch."""
    changes: dict[str, Any] = {"cluster.num_gpus": n, "cluster.gpu": gpu,
                               "model.seq_length": seq, "train.global_batch_size": gbs}
    base = apply_changes(cfg, changes)
    ds = (base.__pydantic_extra__ or {}).get("dataset")
    if isinstance(ds, dict) and "seq_length" in ds:
        base = base.model_copy(update={"dataset": {**ds, "seq_length": seq}})
    return base


# ---------------------------------------------------------------------------------------------
# ranking


_FIT = {"as_set": 0, "with_rung": 1, "no": 2}


@dataclass(slots=True)
class _Cand:
    sk: Skeleton
    cp: int
    n: int
    gbs: int
    fit: str
    priced: Priced | None  # None: fits by the CP bound, not priced yet
    start: int = 1  # the skill's CP = seq / 4096
    nvlink: int = 8  # GPUs in one NVLink domain (the GPU catalog's)
    alts: list[str] = field(default_factory=list)
    pred: Predicted | None = None  # predicted step (the families ranked by speed)
    tie: int = -1  # tie group among the ranked layouts (-1: not ranked by speed)

    @property
    def family(self) -> tuple[int, ...]:
        s = self.sk
        return (s.tp, self.cp, s.ep, s.etp or 0, s.split.pp)

    @property
    def dp(self) -> int:
        return self.n // (self.sk.tp * self.sk.split.pp * self.cp)

    @property
    def footprint(self) -> int:
        s = self.sk
        return min_gpus(s.tp, s.split.pp, self.cp, s.ep, s.etp if s.etp is not None else 1)

    @property
    def vpp(self) -> int | None:
        """Bridge's virtual_pipeline_model_parallel_size: None without interleaving."""
        v = self.sk.split.vpp
        return v if v > 1 else None

    @property
    def cp_over(self) -> float:
        """How many doublings CP goes past seq / 4096: shards under 4K tokens."""
        return max(0.0, log2(self.cp / self.start))

    @property
    def cp_distance(self) -> float:
        """Key (7): doublings from the long-context skill's CP = seq / 4096 inside its 32K-256K
        scope (``cp_rule_applies``); below it, from CP 1."""
        return abs(log2(self.cp / (self.start if cp_rule_applies(self.start) else 1)))

    @property
    def ep_domains(self) -> int:
        """NVLink domains one expert all-to-all group (EP·ETP ranks) spans."""
        return ceil(self.sk.ep * (self.sk.etp or 1) / self.nvlink)

    @property
    def micro(self) -> int:
        return self.gbs // (self.dp * self.sk.mbs)

    @property
    def bubble(self) -> float:
        return bubble_fraction(self.sk.split.pp, self.sk.split.vpp, self.micro)

    def fit_class(self) -> int:
        """0 fits as set with the reserved band's high end, 1 as set but tight, 2 and 3 the
        same with a rung, 4 does not fit."""
        if self.fit == "no":
            return 4
        tight = self.priced is not None and not self.priced.report.fits_with_fragmentation
        return 2 * _FIT[self.fit] + tight

    def order(self) -> tuple[Any, ...]:
        """Keys (2) to (8) of the module docstring: what ranks layouts that fit alike."""
        s = self.sk
        return (self.cp_over, s.tp, s.etp or 0, self.ep_domains, -self.dp,
                self.cp_distance, s.split.pp, self.bubble)

    def key(self) -> tuple[Any, ...]:
        head = -(self.priced.report.headroom_gib or 0.0) if self.priced else 0.0
        if self.fit == "no":
            return (4, head)
        return (self.fit_class(), *self.order(), head)


_KEY_WORDS = ("fits with headroom (as set, then tight, then only with a rung)",
              "CP no larger than seq / 4096 (shards of at least 4K tokens)", "smaller TP",
              "experts on EP before ETP", "expert all-to-all inside fewer NVLink domains",
              "more data parallelism",
              "CP nearer seq / 4096 from 32K (the skill's start), the smaller CP below",
              "fewer pipeline stages", "fewer pipeline bubbles", "more headroom")


def _why_below(prev: _Cand, cur: _Cand) -> str:
    """Why ``cur`` ranks below ``prev`` (a ``{}`` for prev's rank): predicted slower, or, in a
    tie or without predictions, the first rule-of-thumb key that differs."""
    p, q = prev.pred, cur.pred
    if prev.tie < 0 or p is None or q is None:
        return _why_by_keys(prev, cur)
    speeds = f"predicted {q.tokens_per_s_per_gpu:,.0f} vs {p.tokens_per_s_per_gpu:,.0f} " \
             f"tokens/s/GPU"
    if prev.tie != cur.tie:
        return f"below #{{}}: {speeds} ({widest_gap(p, q)})"
    return _why_by_keys(prev, cur).replace(
        "below #{} on:", f"tie with #{{}} by predicted speed ({speeds}, within the band); "
                         "below it on:")


def _why_by_keys(prev: _Cand, cur: _Cand) -> str:
    a, b = prev.key(), cur.key()
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y and not (isinstance(x, float) and abs(x - y) < 5e-3):
            return f"below #{{}} on: {_KEY_WORDS[min(i, len(_KEY_WORDS) - 1)]}"
    return "below #{} on: tie, kept in enumeration order"


# ---------------------------------------------------------------------------------------------
# phases


def _enumerate(base: TrainingConfig, n: int, nvlink: int, gbs: int, mbs: int | None,
               cons: dict[str, list[int]], rej: Rejections) -> list[Group]:
    return list(groups(base.model, n, nvlink, gbs, mbs, cons, rej))


def _price_all(base: TrainingConfig, gs: list[Group], n: int, gbs: int, start: int,
               nvlink: int, mbs_fixed: bool, count: Counter, rej: Rejections) -> list[_Cand]:
    """The staircase of every group. Unless the user fixed it, MBS > 1 is not priced: it needs
    more memory than MBS 1 and ranks below it (fewer micro-batches, larger bubble). Interleaving
    adds memory, so a VPP > 1 group is not priced when its VPP 1 group missed by more than
    HOPELESS even at its largest EP and CP."""
    cands: list[_Cand] = []
    missed: dict[tuple[Any, ...], float] = {}  # (TP, PP, ETP, MBS) -> VPP 1 corner need / cap
    for g in gs:
        if count.spent:
            break
        size = len(g.eps) * len(g.cps)
        count.bounded += g.dominated
        if g.mbs > 1 and not mbs_fixed:
            count.bounded += size
            continue
        key = (g.tp, g.split.pp, g.etp, g.mbs)
        if g.split.vpp > 1 and missed.get(key, 0.0) > HOPELESS:
            count.bounded += size
            rej.add(f"memory: VPP 1 of this TP / PP / ETP already needs more than "
                    f"{HOPELESS:.2f} x the GPU at its largest EP and CP; interleaving adds "
                    "memory", _family(g.skeleton(g.eps[-1])))
            continue
        priced, bounds = staircase(base, g, start, count)
        for (_ep, cp), p in priced.items():
            cands.append(_Cand(p.sk, cp, n, gbs, "as_set" if p.fits else "no", p, start,
                               nvlink))
        for ep, cp_b in bounds.items():
            extra = [c for c in g.cps if c > cp_b and (ep, c) not in priced]
            cands += [_Cand(g.skeleton(ep), c, n, gbs, "as_set", None, start, nvlink)
                      for c in extra]
        count.bounded += size - len(priced)
        if not bounds and priced:
            corner = max(priced.values(), key=lambda p: (p.sk.ep, p.cp))
            rej.add(_memory_reason(corner), _family(corner.sk, corner.cp))
            r = corner.report
            if g.split.vpp == 1 and r.gpu_capacity_gib:
                missed[key] = (r.gpu_capacity_gib - (r.headroom_gib or 0.0)) / r.gpu_capacity_gib
    return cands


def _memory_reason(p: Priced) -> str:
    r = p.report
    need = (r.gpu_capacity_gib or 0) - (r.headroom_gib or 0)
    return (f"memory: needs {need:.1f} GiB of {r.gpu_capacity_gib:.1f} even at the largest CP "
            f"and EP allowed (stage {r.most_loaded_stage} peak {r.peak_allocated_gib:.1f} GiB)")


def _family(sk: Skeleton, cp: int | None = None) -> str:
    s = sk.split
    parts = [f"TP{sk.tp}", f"PP{s.pp}"] + ([f"VPP{s.vpp}"] if s.vpp > 1 else [])
    parts += [f"CP{cp}"] if cp is not None else []
    if sk.etp is not None:
        parts += [f"EP{sk.ep}", f"ETP{sk.etp}"]
    return " ".join([*parts, f"MBS{sk.mbs}"])


def _rescue(base: TrainingConfig, cands: list[_Cand], top_k: int, count: Counter,
            rej: Rejections) -> None:
    """When fewer than top_k layouts fit as set, try the rescue ladder on the best
    non-fitting ones (smallest need first within the ranking of their shape); a family a rung
    rescues is no longer listed as rejected for memory."""
    fitting = sum(c.fit == "as_set" for c in cands)
    if fitting >= top_k:
        return
    todo = [c for c in cands if c.fit == "no" and c.priced is not None]
    todo.sort(key=_Cand.order)
    for c in todo[:RESCUE_BUDGET]:
        assert c.priced is not None
        got = rescue(c.priced, count)
        if got is not None:
            c.priced, c.fit = got, "with_rung"
            family = _family(c.sk, c.cp)
            rej.by_reason = {r: row for r, row in rej.by_reason.items()
                             if not (r.startswith("memory:") and row[1] == family)}


def _finalize(base: TrainingConfig, cands: list[_Cand], top_k: int, count: Counter,
              rej: Rejections, refused_families: set[tuple[int, ...]]) -> list[_Cand]:
    """Rank, price the bound-only ones that reach the top, validate; drop what the validator
    rejects and fill from below. One entry per (TP, CP, EP, ETP, PP): its best VPP / MBS, the
    other fitting ones named in its reasons."""
    cands.sort(key=_Cand.key)
    out: list[_Cand] = []
    best: dict[tuple[int, ...], _Cand] = {}
    refused: dict[str, int] = {}
    for c in cands:
        if not out and max(refused.values(), default=0) >= SAME_RULE_STOP:
            break  # one rule refuses every layout: the config, not the layout, needs fixing
        if c.family in best:
            if c.fit != "no" and len(best[c.family].alts) < 8:
                best[c.family].alts.append(f"VPP{c.sk.split.vpp} MBS{c.sk.mbs}")
            continue
        if len(out) >= top_k:
            continue
        rule = _admit(base, c, count, rej)
        if rule is None:
            continue
        if rule:
            refused[rule] = refused.get(rule, 0) + 1
            refused_families.add(c.family)
            continue
        out.append(c)
        best[c.family] = c
    out.sort(key=_Cand.key)
    if any(c.fit != "no" for c in out):  # the closest misses only when nothing fits
        out = [c for c in out if c.fit != "no"]
    return out


def _price_into(base: TrainingConfig, c: _Cand, count: Counter) -> bool:
    """Price a bound-only candidate in place; False when the estimator refuses it."""
    if c.priced is None:
        p = price(base, c.sk, c.cp, count)
        if p is None:
            return False
        c.priced, c.fit = p, "as_set" if p.fits else "no"
    return True


def _admit(base: TrainingConfig, c: _Cand, count: Counter, rej: Rejections) -> str | None:
    """Price a bound-only candidate and validate it: "" when it is kept, the rule id of the
    first validator error when refused, None when it cannot be priced."""
    if not _price_into(base, c, count):
        return None
    assert c.priced is not None
    rep = validate(c.priced.cfg)
    count.validated += 1
    errors = [f for f in rep.findings if f.severity == "error"]
    if errors:
        rej.add(f"validator: {errors[0].rule_id}: {errors[0].message}", _family(c.sk, c.cp))
        return errors[0].rule_id
    c.priced.warnings = [f"{f.rule_id}: {f.message}" for f in rep.findings
                         if f.severity == "warning"]
    return ""


def _by_speed(pool: list[_Cand], cal: Calibration | None,
              band: float | None = None) -> list[_Cand]:
    """Phase 4b: the families the keys put first, each timed by the step-time model and
    ordered by predicted tokens/s/GPU within its fit class; layouts within the pair band of
    each other are a tie and keep the keys' order (advise/speed.py)."""
    for c in pool:
        assert c.priced is not None
        c.pred = predict(c.priced.cfg, cal)
    order, groups = order_by_speed([c.pred for c in pool], [c.key() for c in pool],
                                   [_FIT[c.fit] for c in pool],
                                   pair_band(cal) if band is None else band)
    out = [pool[i] for i in order]
    for c, g in zip(out, groups, strict=True):
        c.tie = g if band is None else -1
    return out


# ---------------------------------------------------------------------------------------------
# results


def _layout(c: _Cand, rank: int, prev: _Cand | None, nvlink: int, seq: int,
            n: int) -> PlannedLayout:
    assert c.priced is not None
    p, sk, r = c.priced, c.sk, c.priced.report
    s = sk.split
    edp = n // (sk.ep * sk.etp * s.pp) if sk.etp is not None else None
    changes = _changes(c)
    reasons = _reasons(c, nvlink, seq)
    if prev is not None:
        reasons.insert(0, _why_below(prev, c).format(rank - 1))
    split = {"even": "even split", "account": "account_for_embedding/loss_in_pipeline_split "
             "(embedding and loss count as a layer each)"}.get(
        s.kind, f"pipeline_model_parallel_layout={s.layout!r}")
    return PlannedLayout(
        rank=rank, tensor_model_parallel_size=sk.tp, pipeline_model_parallel_size=s.pp,
        virtual_pipeline_model_parallel_size=c.vpp,
        context_parallel_size=c.cp, expert_model_parallel_size=sk.ep,
        expert_tensor_parallel_size=sk.etp, micro_batch_size=sk.mbs, data_parallel_size=c.dp,
        expert_data_parallel_size=edp, min_gpus=c.footprint,
        attention_mesh=f"TP{sk.tp} x CP{c.cp} x DP{c.dp} x PP{s.pp} = {n}",
        expert_mesh=(f"ETP{sk.etp} x EP{sk.ep} x EDP{edp} x PP{s.pp} = {n}"
                     if sk.etp is not None else None),
        pipeline_split=split, tokens_per_cp_rank=seq // c.cp, num_microbatches=c.micro,
        bubble_fraction=round(c.bubble, 4), fit=c.fit,  # type: ignore[arg-type]
        rung=p.rung.action if p.rung else None,
        per_stage=[StagePeak(stage=st.stage, layers=len(st.layers),
                             peak_allocated_gib=round(st.peak_allocated_gib, 3))
                   for st in r.per_stage],
        most_loaded_stage=r.most_loaded_stage,
        peak_allocated_gib=round(r.peak_allocated_gib, 3),
        headroom_gib=None if r.headroom_gib is None else round(r.headroom_gib, 2),
        fits_with_fragmentation=r.fits_with_fragmentation, config_changes=changes,
        overrides=as_overrides(changes), warnings=p.warnings,
        reasons=reasons, **_predicted_fields(c.pred),
        predicted_band_s=round(c.pred.band_s, 3) if c.pred else None)


def _predicted_fields(q: Predicted | None) -> dict[str, Any]:
    """A prediction as the result models carry it (layouts and the published one)."""
    return {"predicted_step_time_s": round(q.step_time_s, 3) if q else None,
            "predicted_tokens_per_s_per_gpu": round(q.tokens_per_s_per_gpu, 1) if q else None}


def _changes(c: _Cand) -> dict[str, Any]:
    """A layout's dotted Bridge keys, with its rescue rung's where it has one."""
    changes = layout_changes(c.sk, c.cp)
    if c.priced is not None and c.priced.rung is not None:
        changes.update(c.priced.rung.changes)
    return changes


def _reasons(c: _Cand, nvlink: int, seq: int) -> list[str]:
    assert c.priced is not None
    sk, s = c.sk, c.sk.split
    out = [_fit_words(c)]
    ex = f"EP{sk.ep}·ETP{sk.etp}" if sk.etp is not None else "no experts"
    out.append(f"min GPUs {c.footprint} = PP{s.pp}·lcm(TP·CP {sk.tp * c.cp}, {ex}); "
               f"DP {c.dp}" + (" (DP = 1: one replica takes every GPU)" if c.dp == 1 else ""))
    out.append(f"TP{sk.tp} inside the NVLink domain of {nvlink}"
               + (f"; experts on EP{sk.ep} with ETP{sk.etp}, their all-to-all over "
                  f"{c.ep_domains} NVLink domain{'s' if c.ep_domains > 1 else ''}"
                  if sk.etp is not None else ""))
    out.append(f"bubble (PP-1)/(VPP·M) = {s.pp - 1}/({s.vpp}·{c.micro}) = {c.bubble:.1%}")
    out.append(f"{seq // c.cp} tokens per CP rank (the skill's start: 4096)")
    if c.alts:
        out.append("same sizes also fit with " + ", ".join(c.alts))
    if c.pred is not None:
        q = c.pred
        out.append(f"predicted step {q.step_time_s:.2f} s (band ±{q.band_s:.2f} s), "
                   f"{q.tokens_per_s_per_gpu:,.0f} tokens/s/GPU; largest term: "
                   f"{q.largest_term}")
    return out


def _published(base: TrainingConfig, row: PublishedRow, cands: list[_Cand], top: list[_Cand],
               refused: set[tuple[int, ...]], count: Counter,
               cal: Calibration | None) -> PublishedLayout:
    """Phase 5: a published layout priced and placed: its family's rank among every layout
    that fits (the returned ones first, then the rest by the same keys, leaving out families
    the validator refused) and the first key on which #1 beats it."""
    sizes = {"tensor_model_parallel_size": row.tp, "context_parallel_size": row.cp,
             "expert_model_parallel_size": row.ep, "pipeline_model_parallel_size": row.pp,
             "virtual_pipeline_model_parallel_size": row.vpp}
    head = {"source": row.source, "model": row.model, **sizes}
    mine = [c for c in cands if (c.sk.tp, c.cp, c.sk.ep, c.sk.split.pp, c.vpp) ==
            (row.tp, row.cp, row.ep, row.pp, row.vpp)]
    if not mine:
        return PublishedLayout(
            **head, fit="not_offered", rank=None, ranked_vpp=None, peak_allocated_gib=None,
            headroom_gib=None, config_changes={}, overrides=[],
            reason="not among the layouts enumerated here: a divisibility rule, the GPU count "
                   "or a constraint excludes it (see rejected)")
    pub = _price_published(base, min(mine, key=lambda c: (c.sk.mbs, c.sk.etp != 1,
                                                          c.sk.etp or 0)), count)
    r = pub.priced.report if pub.priced is not None else None
    changes = _changes(pub)
    mem = {"peak_allocated_gib": round(r.peak_allocated_gib, 3) if r else None,
           "headroom_gib": round(r.headroom_gib, 2) if r and r.headroom_gib is not None
           else None, "config_changes": changes, "overrides": as_overrides(changes)}
    if pub.fit == "no" or pub.family in refused or r is None:
        why = ("the validator refuses it with these settings (see rejected)"
               if pub.family in refused else _fit_words(pub) if r else "could not be priced")
        return PublishedLayout(**head, fit="no", rank=None, ranked_vpp=None, **mem, reason=why)
    rank, best = _family_rank(base, pub, cands, top, refused, count)
    if best.pred is None and best.priced is not None:
        best.pred = predict(best.priced.cfg, cal)
    why = ("ranks first" if rank == 1 else f"rank {rank} by the plan's keys" if not top else
           _why_below(top[0], best).format(1) + f" (#1 {_family(top[0].sk, top[0].cp)}: "
           f"{_traits(top[0])}; this one: {_traits(best)})")
    q = best.pred
    if rank != 1 and top and top[0].pred is not None and q is not None \
            and "tokens/s/GPU (" not in why:
        why += f"; its largest predicted extra over #1: {widest_gap(top[0].pred, q)}"
    return PublishedLayout(**head, fit=pub.fit, rank=rank,  # type: ignore[arg-type]
                           ranked_vpp=best.vpp,
                           **mem, reason=f"{_fit_words(pub)}; {why}",
                           **_predicted_fields(q))


def _traits(c: _Cand) -> str:
    """What the ranking reads beyond the sizes _family spells, to compare two layouts."""
    return (f"experts over {c.ep_domains} NVLink domain{'s' if c.ep_domains > 1 else ''}, "
            f"DP {c.dp}")


def _price_published(base: TrainingConfig, pub: _Cand, count: Counter) -> _Cand:
    """Price a candidate the ranking left bound-only and, where it does not fit as set, find
    the rescue rung that makes it fit."""
    _price_into(base, pub, count)
    if pub.fit == "no" and pub.priced is not None:
        got = rescue(pub.priced, count)
        if got is not None:
            pub.priced, pub.fit = got, "with_rung"
    return pub


def _family_rank(base: TrainingConfig, pub: _Cand, cands: list[_Cand], top: list[_Cand],
                 refused: set[tuple[int, ...]], count: Counter) -> tuple[int, _Cand]:
    """Where ``pub``'s family ranks, and the candidate it ranks with (its best VPP / MBS).
    Below the returned layouts each family is priced and validated as _finalize does, so the
    rank does not depend on top_k; a bound-only candidate's key can only fall when priced, so
    candidates are priced lazily, in key order, and only those ahead of ``pub`` are."""
    for i, c in enumerate(top):
        if c.family == pub.family:
            return i + 1, c
    seen = {c.family for c in top} | refused
    heap = [(c.key(), i, c) for i, c in enumerate(cands)
            if c.fit != "no" and c.family not in seen]
    heapq.heapify(heap)
    rank, scratch = len(top), Rejections({})
    while heap:
        _, i, c = heapq.heappop(heap)
        if c.family in seen:
            continue
        if c.priced is None:
            if _price_into(base, c, count) and c.fit != "no":
                heapq.heappush(heap, (c.key(), i, c))
            continue
        if c.family != pub.family and _admit(base, c, count, scratch) != "":
            continue
        seen.add(c.family)
        rank += 1
        if c.family == pub.family:
            return rank, c
    return rank + 1, pub


def _fit_words(c: _Cand) -> str:
    """Whether a priced layout fits, on which stage, with what headroom."""
    assert c.priced is not None
    r = c.priced.report
    fit = {"as_set": "fits as set", "with_rung": f"fits only with: {c.priced.rung.action}"
           if c.priced.rung else "", "no": "does not fit"}[c.fit]
    return (f"{fit}: stage {r.most_loaded_stage} peak {r.peak_allocated_gib:.1f} GiB, headroom "
            f"{r.headroom_gib:.1f} GiB of {r.gpu_capacity_gib:.1f}"
            + ("" if r.fits_with_fragmentation else " (tight: not with the reserved band's "
               "high end)"))


def _rejected(rej: Rejections) -> list[RejectedFamily]:
    rows = [RejectedFamily(family=ex, reason=reason, count=n)
            for reason, (n, ex) in rej.by_reason.items()]
    return sorted(rows, key=lambda r: -r.count)[:40]


# ---------------------------------------------------------------------------------------------
# the entry point


def plan_parallelism(cfg: TrainingConfig, num_gpus: int, gpu: str, seq_length: int,
                     global_batch_size: int, micro_batch_size: int | None = None,
                     top_k: int = 10, constraints: PlanConstraints | dict[str, Any] | None = None,
                     calibration: Calibration | None = None,
                     rank_by: Literal["speed", "keys"] = "speed") -> ParallelismPlan:
    """Ranked layouts of ``cfg``'s model on ``num_gpus`` ``gpu``s (see the module docstring);
    the config's recompute, precision, optimizer and offload settings are kept.
    ``calibration``: the step-time model's (the shipped one when None); ``rank_by="keys"``
    orders by the skills' keys alone (predictions still shown), for comparison."""
    t0 = time.perf_counter()
    n = _bounded("num_gpus", num_gpus, 1, MAX_GPUS)
    seq = _bounded("seq_length", seq_length, 1, 16_777_216)
    gbs = _bounded("global_batch_size", global_batch_size, 1, 100_000_000)
    mbs = None if micro_batch_size is None else _bounded("micro_batch_size", micro_batch_size,
                                                         1, 4096)
    top_k = _bounded("top_k", top_k, 1, MAX_TOP_K)
    cons = _constraints(constraints)
    try:
        spec = lookup_gpu(gpu)
    except ValueError as exc:
        raise ConfigError("gpu", str(exc)) from None
    if not cfg.model.num_layers or not cfg.model.num_attention_heads:
        raise ConfigError("model", "give a model (a preset or a config with num_layers, "
                                   "num_attention_heads, hidden_size)")
    base = _base(cfg, n, spec.name, seq, gbs)
    rej, count = Rejections({}), Counter()
    gs = _enumerate(base, n, spec.nvlink_domain, gbs, mbs, cons, rej)
    start = cp_start(seq)
    cands = _price_all(base, gs, n, gbs, start, spec.nvlink_domain, mbs is not None,
                       count, rej)
    _rescue(base, cands, top_k, count, rej)
    refused: set[tuple[int, ...]] = set()
    pool = _finalize(base, cands, SPEED_POOL, count, rej, refused)
    ranked = _by_speed(pool, calibration, 1.0 if rank_by == "keys" else None)
    top = ranked[:top_k]
    layouts = [_layout(c, i + 1, top[i - 1] if i else None, spec.nvlink_domain, seq, n)
               .model_copy(update={"tied_with": _tied(top, i)}) for i, c in enumerate(top)]
    published = [_published(base, row, cands, ranked, refused, count, calibration)
                 for row in matching(base.model, spec.name, seq)]
    counts = PlanCounts(skeletons=sum(len(g.eps) for g in gs),
                        layouts=sum(len(g.eps) * len(g.cps) + g.dominated for g in gs),
                        priced=count.priced, bounded=count.bounded,
                        rescue_estimates=count.rescued, validated=count.validated,
                        seconds=round(time.perf_counter() - t0, 3))
    plan = ParallelismPlan(
        num_gpus=n, gpu=spec.name, gpu_capacity_gib=spec.capacity_gib,
        nvlink_domain=spec.nvlink_domain, seq_length=seq, global_batch_size=gbs,
        cp_start=start, layouts=layouts, published=published, rejected=_rejected(rej),
        counts=counts,
        notes=_notes(base, layouts, seq, spec.nvlink_domain, count.errors, count, rej),
        answer_markdown="")

    return plan.model_copy(update={"answer_markdown": plan_markdown(plan, base)})


def _tied(top: list[_Cand], i: int) -> list[int]:
    """Ranks (1-based) in the same tie group as ``top[i]``."""
    t = top[i].tie
    return [j + 1 for j, c in enumerate(top) if j != i and t >= 0 and c.tie == t]


def _notes(cfg: TrainingConfig, layouts: list[PlannedLayout], seq: int,
           nvlink: int, errors: list[str], count: Counter, rej: Rejections) -> list[str]:
    notes = []
    if count.spent:
        notes.append(f"Search stopped after {count.budget:,} estimates: pin sizes with "
                     "constraints (e.g. expert_tensor_parallel_size, "
                     "pipeline_model_parallel_size) to search the rest.")
    refused = [(n, r) for r, (n, _) in rej.by_reason.items() if r.startswith("validator")]
    if not layouts and refused:
        notes.append("The validator refuses the layouts that fit for the config's own "
                     f"settings - fix this first: {max(refused)[1]}")
    elif not layouts and errors:
        notes.append(f"The estimator refused the config: {errors[0]}")
    elif not layouts or all(lay.fit == "no" for lay in layouts):
        notes.append("No layout fits, even with the rescue ladder: more GPUs, a GPU with more "
                     "memory, or a shorter sequence.")
    p = resolve_precision(cfg)
    if not (p.bf16 or p.fp16):
        notes.append("Priced in FP32 (no mixed_precision or model.bf16 in the config): set "
                     "mixed_precision, e.g. bf16_mixed, as every Bridge recipe does.")
    if seq >= LONG_CONTEXT:
        notes.append("Full recompute is not offered as a way to fit at this sequence length: "
                     "it recomputes attention, which dominates the step at long context "
                     "(long-context skill: selective before full, no attention recompute).")
    if layouts and layouts[0].tied_with:
        ranks = ", ".join(f"#{r}" for r in [1, *layouts[0].tied_with])
        notes.append(f"Layouts {ranks} are predicted within the step-time model's pair band of "
                     "each other (a tie it cannot order; kept in the skills' key order): run "
                     "each with submit_benchmark and pick with compare_benchmarks.")
    if nvlink >= 72:
        notes.append("NVL72: TP inside the 72-GPU NVLink domain can replace part of CP "
                     "(TP·CP carries the sequence split).")
    return notes


def layout_config(cfg: TrainingConfig, plan: ParallelismPlan,
                  layout: PlannedLayout | PublishedLayout) -> TrainingConfig:
    """The config a returned layout was priced on (for validate_config / estimate_memory):
    ``cfg`` at the plan's world, GPU, sequence and batch, with the layout's changes."""
    base = _base(cfg, plan.num_gpus, plan.gpu, plan.seq_length, plan.global_batch_size)
    return apply_changes(base, layout.config_changes)
