"""``diagnose_oom(text, config=None)``: read an out-of-memory failure and say which kind it is.

Why the numbers decide: PyTorch's message carries allocated and reserved memory; a reserved-but-
unallocated band that is large next to the failed request means the allocator held the memory
but no block fitted (fragmentation: fixed by expandable segments, no throughput cost); a small
band means the GPU is really full (capacity: recompute, offload, parallelism). One rank failing
while the others' memory lines show headroom, and failures during CUDA-graph capture, are the
skills' other fragmentation signatures. Formats: ../shared/reference/log-formats.md §4 and §15.

Logs are read from their tail (the failure is at the end) and only the last ``SCAN_CHARS``
characters are scanned, so a text of any length is accepted; nothing here raises on odd input.
"""

from __future__ import annotations

import re

from mbridge_perf.advise.markdown import oom_markdown
from mbridge_perf.advise.oom_result import (
    FailureMode,
    OOMDiagnosis,
    OOMNumbers,
    RankMemory,
)
from mbridge_perf.advise.recompute import recommend_recompute
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory import overheads as ov

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
NCCL_OOM = re.compile(r"Failed to CUDA calloc|ncclUnhandledCudaError[^\n]*out of memory")
CAPTURE = re.compile(r"graph capture|cudaGraphInstantiate|capture_begin|CUDAGraph|"
                     r"make_graphed_callables|cuda_graph", re.I)
HOST_OOM = re.compile(r"oom-kill|Out of memory: Killed process|exit code 137|signal 9|"
                      r"\bKilled\b|SIGKILL")
NCCL_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|NCCL operations have "
                          r"failed or timed out|ProcessGroupNCCL.*[Tt]imeout")
RANK_PREFIX = re.compile(r"(?:\[rank(\d+)\]:|^(\d+): )", re.M)
BRIDGE_MEM = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)((?:\s*\|\s*[\w-]+: [\d.]+)+)")
MLM_MEM = re.compile(
    r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)((?:\s*\|\s*[\w ]+: [\d.]+)+)")
HINT = re.compile(r"try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", re.I)
ALLOC_SET = re.compile(r"PYTORCH_CUDA_ALLOC_CONF\s*[=:]\s*['\"]?[^\s'\"]*"
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


def _classify_pytorch(n: OOMNumbers, allocator: bool | None, ranks: list[RankMemory],
                      capture: bool) -> tuple[str, str]:
    band = n.reserved_unallocated_gib or 0.0
    req = n.requested_gib or 0.0
    if capture:
        return "fragmentation", (f"the allocation failed during CUDA-graph capture with "
                                 f"{band:.2f} GiB reserved but unallocated: graph pools "
                                 "fragment the allocator")
    if band >= FRAG_BAND_GIB or (req and band >= FRAG_BAND_X * req):
        return "fragmentation", (f"{band:.2f} GiB reserved but unallocated next to a "
                                 f"{req:.2f} GiB request: the memory was held but no block "
                                 "fitted")
    other = _headroom_elsewhere(n, ranks)
    if other:
        return "fragmentation", other
    set_txt = ("with expandable_segments:True already set" if allocator else
               "(expandable_segments not seen in the text)")
    return "capacity", (f"only {band:.2f} GiB reserved but unallocated {set_txt}: "
                        f"{n.allocated_gib or 0:.2f} GiB really allocated of "
                        f"{n.total_capacity_gib or 0:.2f} GiB")


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
    """Classify the failure in ``text``; with ``config`` also run the recommend ladder."""
    tail = text[-SCAN_CHARS:] if isinstance(text, str) else ""
    ranks = rank_lines(tail)
    allocator = _allocator_set(tail, config)
    found = _pytorch(tail)
    fmt: str = "none"
    numbers = OOMNumbers()
    if found is not None:
        fmt, numbers = found
        pos = max(tail.rfind("CUDA out of memory"), 0)
        capture = bool(CAPTURE.search(tail[max(0, pos - 4000):pos + 4000]))
        kind, reason = _classify_pytorch(numbers, allocator, ranks, capture)
    else:
        fmt, kind, reason = _other(tail, ranks)
    return _finish(kind, reason, fmt, numbers, ranks, allocator, config)


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


def _finish(kind: str, reason: str, fmt: str, numbers: OOMNumbers, ranks: list[RankMemory],
            allocator: bool | None, cfg: TrainingConfig | None) -> OOMDiagnosis:

    row = None
    if kind == "fragmentation":
        row = FRAGMENTATION_ROW
    elif kind == "capacity":
        row = CAPACITY_ROW if allocator else FRAGMENTATION_ROW.model_copy(
            update={"fix": FRAGMENTATION_ROW.fix + " Not set yet: try it first, it costs "
                                                   "nothing; if the OOM persists it is "
                                                   "capacity: " + CAPACITY_ROW.fix})
    plan = None
    notes: list[str] = []
    if cfg is not None and kind != "none":

        try:
            target = numbers.total_capacity_gib
            plan = recommend_recompute(cfg, target_gib=target if target else None)
        except ConfigError as exc:
            notes.append(f"no plan: {exc}")
    diag = OOMDiagnosis(classification=kind, reason=reason,  # type: ignore[arg-type]
                        message_format=fmt, numbers=numbers,  # type: ignore[arg-type]
                        ranks=ranks, allocator_set=allocator, failure_mode=row, plan=plan,
                        answer_markdown="")
    return diag.model_copy(update={"answer_markdown": oom_markdown(diag, notes)})
