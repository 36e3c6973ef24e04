"""``diagnose_oom(text, config=None)``: read an out-of-memory failure and say which kind it is.

Why the numbers decide: PyTorch's message carries allocated and reserved memory; a reserved-but-
unallocated band that is large next to the failed request means the allocator held the memory
but no block fitted (fragmentation: fixed by expandable segments, no throughput cost); a small
band means the GPU is really full (capacity: recompute, offload, parallelism). One rank failing
while the others' memory lines show headroom, and failures during CUDA-graph capture, are the
skills' other fragmentation signatures. Formats: ../shared/reference/log-formats.md §4 and §15.

With expandable_segments:True set (in the text or the config) a small band is capacity: the
allocator unmaps its free pages before it raises, so what is left is at most the CUDA-graph
private pool + the expandable band (memory.overheads.RESERVED_BAND). A wider band with the
setting in the config says it did not reach the failing process.

With a config, the message's numbers are set next to the estimate of the phase the failure
looks like (``reconciliation``: allocated, reserved but unallocated, outside PyTorch = capacity
- free - reserved, in use), and the recommend plan is judged on the measured state: it starts
from the allocator setting the failing process had, and its budget is
``capacity - measured outside + the estimate's outside term`` (``PlanBudget``): every step's
need counts the estimate's outside term once, so a step fits when its allocated + graph pool +
band fit in what PyTorch could really have.

Logs are read from their tail (the failure is at the end) and only the last ``SCAN_CHARS``
characters are scanned, so a text of any length is accepted; nothing here raises on odd input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from mbridge_perf.advise.markdown import oom_markdown
from mbridge_perf.advise.oom_result import (
    FailureMode,
    OOMDiagnosis,
    OOMNumbers,
    PlanBudget,
    RankMemory,
    Reconciliation,
)
from mbridge_perf.advise.recompute import recommend_recompute
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory import overheads as ov
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory

SCAN_CHARS = 2_000_000
MAX_CANDIDATES = 64  # OOM headers tried from the end of the text
MAX_RANKS = 256  # per-rank memory lines returned (the fullest ones)
GIB = 2**30
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
_Q = r"(\d+(?:\.\d+)?) (B|KiB|MiB|GiB|TiB)"
CURRENT = re.compile(
    r"CUDA out of memory\. Tried to allocate " + _Q + r"\. GPU (\d+) has a total capacity of "
    + _Q + r" of which " + _Q + r" is free\.(?:.{0,2000}?this process has " + _Q
    + r" memory in use\.)?.{0,4000}?Of the allocated memory " + _Q
    + r" is allocated by PyTorch, and " + _Q + r" is reserved by PyTorch but unallocated", re.S)
LEGACY = re.compile(
    r"CUDA out of memory\. Tried to allocate " + _Q + r" \(GPU (\d+); " + _Q
    + r" total capacity; " + _Q + r" already allocated; " + _Q + r" free; " + _Q
    + r" reserved in total by PyTorch\)")
DRIVER = re.compile(r"CUDA error: out of memory|cudaErrorMemoryAllocation")
# Every pattern that scans the text is linear in its length: no unbounded quantifier next to
# another over the same characters, bounded spans between fixed words (tests/test_regex_linear.py
# searches each for inputs that would make it quadratic). CURRENT and LEGACY only ever .match() at
# the MAX_CANDIDATES header positions found from the end, their lazy spans bounded.
NCCL_OOM = re.compile(r"Failed to CUDA calloc|ncclUnhandledCudaError[^\n]{0,200}?out of memory")
CAPTURE = re.compile(r"graph capture|cudaGraphInstantiate|capture_begin|CUDAGraph|"
                     r"make_graphed_callables|cuda_graph", re.I)
HOST_OOM = re.compile(r"oom-kill|Out of memory: Killed process|exit code 137|signal 9|"
                      r"\bKilled\b|SIGKILL")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL operations have "
                          r"failed or timed out|ProcessGroupNCCL[^\n]{0,200}?[Tt]imeout")
RANK_PREFIX = re.compile(r"(?:\[rank(\d+)\]:|^(\d+): )", re.M)
BRIDGE_MEM = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)((?:\s*\|\s*[\w-]+: [\d.]+)+)")
MLM_MEM = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)"
    r"((?:[ \t]*\|[ \t]*\w[\w ]{0,63}: [\d.]+){1,32})")
HINT = re.compile(r"try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", re.I)
ALLOC_SET = re.compile(r"PYTORCH_CUDA_ALLOC_CONF[ \t]{0,8}[=:][ \t]{0,8}['\"]?[^\s'\"]{0,200}?"
                       r"expandable_segments:True", re.I)
GB = 1e9 / GIB  # one decimal GB in GiB
FRAG_BAND_GIB = 1.0  # a GiB-scale band ...
FRAG_BAND_X = 4.0  # ... or several times the failed request


MEMORY = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"
# Rows of the skills' failure tables (card.yaml failure_modes; tests check them verbatim).
FRAGMENTATION_ROW = FailureMode(
    skill=MEMORY, name="fragmentation-oom",
    symptom="One rank OOMs while the other ranks still have headroom.",
    fix="Export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.")
CAPACITY_ROW = FailureMode(
    skill=MEMORY, name="capacity-oom", symptom="OOM persists with expandable_segments already "
                                               "set.",
    fix="Raise PP (keeping DP), enable the distributed optimizer, or add recompute.")


def _gib(value: str, unit: str) -> float:
    return float(value) * _UNITS[unit] / GIB


def _pytorch(tail: str) -> tuple[str, OOMNumbers] | None:
    """The last PyTorch allocator message of either shape (tried from the end, a bounded
    number of candidates)."""
    pos = len(tail)
    for _ in range(MAX_CANDIDATES):
        pos = tail.rfind("CUDA out of memory", 0, pos)
        if pos < 0:
            return None
        found = _numbers_at(tail, pos)
        if found is not None:
            return found[0], found[1].model_copy(update={"rank": _rank_before(tail, pos)})
    return None


def _numbers_at(tail: str, pos: int) -> tuple[str, OOMNumbers] | None:
    m = CURRENT.match(tail, pos)
    if m:
        g = m.groups()
        q = [_gib(g[i], g[i + 1]) if g[i] else None for i in (0, 3, 5, 7, 9, 11)]
        alloc, unalloc = q[4], q[5]
        return "pytorch>=2.1", OOMNumbers(
            requested_gib=q[0], gpu_index=int(g[2]), total_capacity_gib=q[1], free_gib=q[2],
            in_use_gib=q[3], allocated_gib=alloc, reserved_unallocated_gib=unalloc,
            reserved_gib=(alloc or 0) + (unalloc or 0))
    m = LEGACY.match(tail, pos)
    if m:
        g = m.groups()
        req, cap, alloc, free, res = (_gib(g[i], g[i + 1]) for i in (0, 3, 5, 7, 9))
        return "pytorch-2.0/1.x", OOMNumbers(
            requested_gib=req, gpu_index=int(g[2]), total_capacity_gib=cap, allocated_gib=alloc,
            free_gib=free, reserved_gib=res, reserved_unallocated_gib=max(res - alloc, 0.0))
    return None


def _rank_before(tail: str, pos: int) -> int | None:
    start = tail.rfind("\n", 0, pos) + 1
    m = RANK_PREFIX.search(tail[start:pos + 1]) or RANK_PREFIX.match(tail, start)
    if not m:
        return None
    return int(m.group(1) or m.group(2))


def _fields(text: str) -> dict[str, float]:
    out = {}
    for part in text.split("|"):
        key, _, val = part.partition(":")
        try:
            out[key.strip()] = float(val)
        except ValueError:
            continue
    return out


def rank_lines(tail: str) -> list[RankMemory]:
    """The last Bridge (GB) or Megatron-LM (MB) memory line of each rank."""
    last: dict[int, RankMemory] = {}
    for m in BRIDGE_MEM.finditer(tail):
        f = _fields(m.group(3))
        last[int(m.group(1))] = RankMemory(
            rank=int(m.group(1)), iteration=int(m.group(2)),
            allocated_gib=_scale(f.get("mem-allocated-gigabytes"), GB),
            max_allocated_gib=_scale(f.get("mem-max-allocated-gigabytes"), GB),
            reserved_gib=_scale(f.get("mem-reserved-gigabytes"), GB),
            max_reserved_gib=_scale(f.get("mem-max-reserved-gigabytes"), GB),
            alloc_retries=int(f["mem-alloc-retires"]) if "mem-alloc-retires" in f else None)
    for m in MLM_MEM.finditer(tail):
        f = _fields(m.group(3))
        mib = 2**20 / GIB
        last[int(m.group(1))] = RankMemory(
            rank=int(m.group(1)), iteration=int(m.group(2)),
            allocated_gib=_scale(f.get("allocated"), mib),
            max_allocated_gib=_scale(f.get("max allocated"), mib),
            reserved_gib=_scale(f.get("reserved"), mib),
            max_reserved_gib=_scale(f.get("max reserved"), mib), alloc_retries=None)
    kept = sorted(last.values(), key=lambda r: -(r.max_reserved_gib or r.max_allocated_gib
                                                 or 0.0))[:MAX_RANKS]
    return sorted(kept, key=lambda r: r.rank)


def _scale(v: float | None, k: float) -> float | None:
    return None if v is None else round(v * k, 3)


def _allocator_set(tail: str, cfg: TrainingConfig | None) -> bool | None:
    if cfg is not None and ov.expandable_segments(cfg.env):
        return True
    if ALLOC_SET.search(HINT.sub("", tail)):
        return True
    return False if cfg is not None else None


# ---------------------------------------------------------------------------------------------
# the measured state next to the estimate


@dataclass
class _Look:
    """What the estimate says for the phase the failure looks like, and what the message
    measured; ``explained_gib``: the reserved-but-unallocated memory the estimate accounts for
    with expandable segments on (the phase's CUDA-graph private pool + the expandable band's
    high end), what a working ``expandable_segments:True`` leaves at most."""

    report: MemoryReport | None = None
    phase: str = ""
    stage: int = 0
    allocated: float = 0.0
    pool: float = 0.0
    band: tuple[float, float] = (0.0, 0.0)
    outside: float = 0.0
    explained_gib: float | None = None
    rows: list[Reconciliation] = field(default_factory=list)


def _estimate(cfg: TrainingConfig, notes: list[str]) -> MemoryReport | None:
    try:
        return estimate_memory(cfg)
    except ConfigError as exc:
        notes.append(f"no estimate to compare the message with: {exc}")
        return None


def _look(n: OOMNumbers, rep: MemoryReport | None, expandable: bool) -> _Look:
    """Pick the estimated phase whose allocated is nearest what the failing allocation would
    have made it (allocated + requested): the eager warm-up or, with per-layer TE graphs, the
    replayed steady state. Reports without phases compare with the peak."""
    if rep is None:
        return _Look()
    reached = (n.allocated_gib or 0.0) + (n.requested_gib or 0.0)
    phases = getattr(rep, "phases", None) or []
    look = _Look(report=rep, phase="peak", stage=rep.most_loaded_stage,
                 allocated=rep.peak_allocated_gib, band=tuple(rep.reserved_band_gib),
                 outside=rep.overheads.total_gib)
    if phases:
        p = min(phases, key=lambda ph: abs(ph.allocated_gib - reached))
        look = _Look(report=rep, phase=p.phase, stage=p.stage, allocated=p.allocated_gib,
                     pool=p.private_pool_gib, band=tuple(p.reserved_band_gib),
                     outside=p.outside_gib)
    (_, hi_frac), _ = ov.RESERVED_BAND[True]
    look.explained_gib = look.pool + look.allocated * hi_frac
    look.rows = _reconcile(n, look, rep, expandable)
    return look


def measured_outside_gib(n: OOMNumbers) -> float | None:
    """GPU memory the message puts outside this process's PyTorch allocator: capacity - free -
    reserved (CUDA context, NCCL buffers, instantiated graphs, cuBLAS / driver memory, other
    processes on the GPU), at the moment of the failure."""
    if None in (n.total_capacity_gib, n.free_gib, n.reserved_gib):
        return None
    return max(0.0, (n.total_capacity_gib or 0) - (n.free_gib or 0) - (n.reserved_gib or 0))


def _row(term: str, measured: float, estimated: float, note: str,
         rng: tuple[float, float] | None = None) -> Reconciliation:
    """One term; where the estimate is a range, the end nearest the measurement is compared
    (the difference is 0 inside the range)."""
    if rng is not None:
        estimated = min(max(measured, rng[0]), rng[1])
    return Reconciliation(term=term, measured_gib=round(measured, 2),  # type: ignore[arg-type]
                          estimated_gib=round(estimated, 2), difference_gib=round(
                              measured - estimated, 2), note=note,
                          estimated_range_gib=None if rng is None else (
                              round(rng[0], 2), round(rng[1], 2)))


def _reconcile(n: OOMNumbers, lk: _Look, rep: MemoryReport,
               expandable: bool) -> list[Reconciliation]:
    rows: list[Reconciliation] = []
    where = f"{lk.phase} phase, stage {lk.stage}"
    if n.allocated_gib is not None:
        req = n.requested_gib or 0.0
        rows.append(_row("allocated", n.allocated_gib, lk.allocated,
                         f"measured at the failure (the failed {req:.2f} GiB request would "
                         f"have made it {n.allocated_gib + req:.2f}); estimated: allocated in "
                         f"the {where}"))
    if n.reserved_unallocated_gib is not None:
        lo, hi = lk.pool + lk.band[0], lk.pool + lk.band[1]
        pool = f"CUDA-graph private pool {lk.pool:.2f} + " if lk.pool else ""
        rows.append(_row("reserved_unallocated", n.reserved_unallocated_gib, hi,
                         f"estimated: {pool}the allocator's reserved band {lk.band[0]:.2f}-"
                         f"{lk.band[1]:.2f} " + ("with expandable segments" if expandable else
                                                 "without expandable segments"), (lo, hi)))
    outside = measured_outside_gib(n)
    if outside is not None:
        o = rep.overheads.model_dump()
        parts = " + ".join(f"{k.removesuffix('_gib').replace('_', ' ')} {v:.2f}"
                           for k, v in o.items() if k != "total_gib" and v)
        others = ""
        if n.in_use_gib is not None and n.total_capacity_gib is not None:
            other = (n.total_capacity_gib - (n.free_gib or 0)) - n.in_use_gib
            if other > 0.05:
                others = f", of which {other:.2f} other processes"
        rows.append(_row("outside_pytorch", outside, lk.outside,
                         f"measured: capacity - free - reserved{others}; estimated: "
                         f"{parts or 'none'}"))
    if n.total_capacity_gib is not None and n.free_gib is not None:
        used = n.total_capacity_gib - n.free_gib
        lo = lk.allocated + lk.pool + lk.band[0] + lk.outside
        hi = lk.allocated + lk.pool + lk.band[1] + lk.outside
        rows.append(_row("in_use", used, hi, "measured: capacity - free; estimated: allocated "
                         "+ private pool + reserved band + outside", (lo, hi)))
    cap = rep.gpu_capacity_gib
    if cap is not None and n.total_capacity_gib is not None and \
            abs(cap - n.total_capacity_gib) > 0.5:
        rows.append(_row("capacity", n.total_capacity_gib, cap,
                         f"the message's GPU vs the config's {rep.gpu}: the plan is priced "
                         "against the message's"))
    return rows


# ---------------------------------------------------------------------------------------------
# classification


def _classify_pytorch(n: OOMNumbers, allocator: bool | None, ranks: list[RankMemory],
                      capture: bool, lk: _Look) -> tuple[str, str]:
    band = n.reserved_unallocated_gib or 0.0
    req = n.requested_gib or 0.0
    if capture:
        return "fragmentation", (f"the allocation failed during CUDA-graph capture with "
                                 f"{band:.2f} GiB reserved but unallocated: graph pools "
                                 "fragment the allocator")
    if allocator:
        small = _small_band(n, lk)
        if band <= small:
            return "capacity", (
                f"only {band:.2f} GiB reserved but unallocated with expandable_segments:True "
                f"already set (up to {small:.2f} GiB is what expandable segments"
                + (" and the CUDA-graph pool" if lk.pool else "") + " leave): "
                f"{n.allocated_gib or 0:.2f} GiB really allocated of "
                f"{n.total_capacity_gib or 0:.2f} GiB")
    if band >= FRAG_BAND_GIB or (req and band >= FRAG_BAND_X * req):
        why = (f"{band:.2f} GiB reserved but unallocated next to a {req:.2f} GiB request: the "
               "memory was held but no block fitted")
        if allocator and lk.explained_gib is not None:
            pool = f"the CUDA-graph pool {lk.pool:.2f} + " if lk.pool else ""
            why += (f"; expandable_segments:True is set, yet the estimate explains only "
                    f"{lk.explained_gib:.2f} GiB of that band ({pool}the expandable band's "
                    "high end), and with expandable segments the allocator unmaps its free "
                    "pages before it raises an OOM: the failing processes did not run with "
                    "it - check that PYTORCH_CUDA_ALLOC_CONF reaches every rank's environment "
                    "before CUDA starts")
        return "fragmentation", why
    other = _headroom_elsewhere(n, ranks)
    if other:
        return "fragmentation", other
    set_txt = ("with expandable_segments:True already set" if allocator else
               "(expandable_segments not seen in the text)")
    return "capacity", (f"only {band:.2f} GiB reserved but unallocated {set_txt}: "
                        f"{n.allocated_gib or 0:.2f} GiB really allocated of "
                        f"{n.total_capacity_gib or 0:.2f} GiB")


def _small_band(n: OOMNumbers, lk: _Look) -> float:
    """The widest reserved-but-unallocated band a working expandable_segments:True explains:
    with a config, the estimate's graph pool + the expandable band's high end; without one,
    that band's high end on the allocated memory (memory.overheads.RESERVED_BAND)."""
    if lk.explained_gib is not None:
        return lk.explained_gib
    (_, hi_frac), _ = ov.RESERVED_BAND[True]
    return (n.allocated_gib or 0.0) * hi_frac


def _headroom_elsewhere(n: OOMNumbers, ranks: list[RankMemory]) -> str:
    if n.rank is None or len(ranks) < 2 or not n.total_capacity_gib:
        return ""
    others = [r for r in ranks if r.rank != n.rank and r.max_reserved_gib is not None]
    roomy = [r for r in others if (r.max_reserved_gib or 0) < 0.9 * n.total_capacity_gib]
    if others and len(roomy) == len(others):
        return (f"only rank {n.rank} failed while {len(others)} other rank(s) peaked at "
                f"<= {max(r.max_reserved_gib or 0 for r in others):.1f} GiB reserved: one "
                "rank of many is the fragmentation signature")
    return ""


def diagnose_oom(text: str, config: TrainingConfig | None = None) -> OOMDiagnosis:
    """Classify the failure in ``text``; with ``config`` also compare the message's numbers with
    the estimate and run the recommend ladder on the measured state."""
    tail = text[-SCAN_CHARS:] if isinstance(text, str) else ""
    ranks = rank_lines(tail)
    allocator = _allocator_set(tail, config)
    found = _pytorch(tail)
    fmt: str = "none"
    numbers = OOMNumbers()
    notes: list[str] = []
    lk = _Look()
    if found is not None:
        fmt, numbers = found
        if config is not None:
            rep = _estimate(config, notes)
            lk = _look(numbers, rep, ov.expandable_segments(config.env))
        pos = max(tail.rfind("CUDA out of memory"), 0)
        capture = bool(CAPTURE.search(tail[max(0, pos - 4000):pos + 4000]))
        kind, reason = _classify_pytorch(numbers, allocator, ranks, capture, lk)
    else:
        fmt, kind, reason = _other(tail, ranks)
    return _finish(kind, reason, fmt, numbers, ranks, allocator, config, lk, notes)


def _other(tail: str, ranks: list[RankMemory]) -> tuple[str, str, str]:
    """Failures without an allocator message: driver / NCCL OOM, memory lines, or no OOM."""
    if DRIVER.search(tail):
        if CAPTURE.search(tail):
            return "cuda-driver", "fragmentation", (
                "driver-level out of memory during CUDA-graph capture / instantiation: graph "
                "pools outside the caching allocator")
        return "cuda-driver", "capacity", ("driver-level out of memory (outside the caching "
                                           "allocator: CUDA context, graph pools, NCCL)")
    if NCCL_OOM.search(tail):
        return "nccl", "capacity", "NCCL could not allocate its buffers: GPU memory outside " \
                                   "the caching allocator is exhausted"
    if NCCL_TIMEOUT.search(tail):
        return "none", "none", "an NCCL watchdog timeout, not an out-of-memory failure"
    if HOST_OOM.search(tail):
        return "none", "none", ("host memory (the kernel's OOM killer / exit 137): not GPU "
                                "memory; the GPU tools do not apply")
    retries = [r for r in ranks if r.alloc_retries]
    if retries:
        r = retries[-1]
        return "memory-lines", "fragmentation", (
            f"rank {r.rank} logged mem-alloc-retires {r.alloc_retries} (the allocator freed "
            "its cache to retry allocations): fragmentation, before any OOM")
    if ranks:
        return "memory-lines", "none", "memory lines only, no out-of-memory failure in the text"
    return "none", "none", "no out-of-memory message found in the text"


def _in_effect(n: OOMNumbers, allocator: bool | None, lk: _Look) -> bool | None:
    """Whether expandable_segments:True was in effect in the failing process, as far as the
    measured band tells: a band wider than the graph pool + the expandable band says no."""
    if not allocator or lk.explained_gib is None or n.reserved_unallocated_gib is None:
        return None
    return n.reserved_unallocated_gib <= max(lk.explained_gib, FRAG_BAND_GIB)


def _with_allocator(cfg: TrainingConfig, on: bool) -> TrainingConfig:
    """``cfg`` with expandable_segments:True added to or dropped from PYTORCH_CUDA_ALLOC_CONF
    (the other allocator options kept)."""
    env = dict(cfg.env)
    for key in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if key in env:
            kept = [x for x in env[key].split(",") if x.strip() and not x.replace(
                " ", "").lower().startswith("expandable_segments:")]
            env[key] = ",".join(kept)
            if not env[key]:
                del env[key]
    if on:
        conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "")
        env["PYTORCH_CUDA_ALLOC_CONF"] = ",".join(x for x in ("expandable_segments:True", conf)
                                                  if x)
    return cfg.model_copy(update={"env": env})


def _budget(n: OOMNumbers, lk: _Look) -> PlanBudget | None:
    """target = capacity - measured outside + the estimate's outside term. The ladder's need
    of every step is allocated + private pools + reserved band + the estimate's outside term,
    so need <= target is allocated + pools + band <= capacity - measured outside: the plan is
    judged on what the message measured outside PyTorch, not on the estimator's guess of it."""
    outside = measured_outside_gib(n)
    if outside is None or lk.report is None or not n.total_capacity_gib:
        return None
    cap = n.total_capacity_gib
    return PlanBudget(target_gib=round(cap - outside + lk.outside, 2), capacity_gib=cap,
                      measured_outside_gib=round(outside, 2),
                      estimated_outside_gib=round(lk.outside, 2),
                      pytorch_budget_gib=round(cap - outside, 2))


def _finish(kind: str, reason: str, fmt: str, numbers: OOMNumbers, ranks: list[RankMemory],
            allocator: bool | None, cfg: TrainingConfig | None, lk: _Look,
            notes: list[str]) -> OOMDiagnosis:
    row = None
    if kind == "fragmentation":
        row = FRAGMENTATION_ROW
    elif kind == "capacity":
        row = CAPACITY_ROW if allocator else FRAGMENTATION_ROW.model_copy(
            update={"fix": FRAGMENTATION_ROW.fix + " Not set yet: try it first, it costs "
                                                   "nothing; if the OOM persists it is "
                                                   "capacity: " + CAPACITY_ROW.fix})
    in_effect = _in_effect(numbers, allocator, lk)
    budget = _budget(numbers, lk)
    plan = None
    if cfg is not None and kind != "none":
        # the plan starts from the allocator setting the failing process had: the text's
        # export counts, a config's setting the measured band contradicts does not
        had = bool(allocator) and in_effect is not False
        plan_cfg = cfg
        if had != ov.expandable_segments(cfg.env):
            plan_cfg = _with_allocator(cfg, had)
            notes.append(
                "The plan starts from the allocator setting the failing process had: "
                + ("expandable_segments:True (exported in the log)" if had else
                   "without expandable_segments:True (the config sets it, the measured band "
                   "says it was not in effect)") + ".")
        try:
            target = budget.target_gib if budget is not None else numbers.total_capacity_gib
            plan = recommend_recompute(plan_cfg, target_gib=target if target else None)
        except ConfigError as exc:
            notes.append(f"no plan: {exc}")
    diag = OOMDiagnosis(classification=kind, reason=reason,  # type: ignore[arg-type]
                        message_format=fmt, numbers=numbers,  # type: ignore[arg-type]
                        ranks=ranks, allocator_set=allocator, allocator_in_effect=in_effect,
                        failure_mode=row, reconciliation=lk.rows,
                        estimate_phase=(f"{lk.phase} (stage {lk.stage})" if lk.rows else None),
                        plan_budget=budget if plan is not None else None, plan=plan,
                        answer_markdown="")
    return diag.model_copy(update={"answer_markdown": oom_markdown(diag, notes)})
