"""Streaming parser for Megatron Bridge / Megatron-Core training logs (log-formats.md §1–§9).

Why it is built this way: a log from a long run on many ranks reaches gigabytes and must parse
in seconds on one core. The parser reads large binary chunks and never loops over lines in
Python on the hot path:

- iteration lines (§2) are found and split into fields by one compiled regex per chunk
  (``re.split``: C speed); their values are kept as raw bytes per chunk and converted to
  numbers only for the rows a caller asks for (a steady window is 10 rows of millions);
- every other line is reduced to its *shape* (every digit turned into 0, so the same warning
  from 1,000 ranks or 10,000 iterations is one shape) and counted; only a new shape is
  classified, with cheap substring tests (no regex before them), and only lines of an
  interesting shape are looked at again;
- Step Time (§3) and memory (§4) lines are read with one regex over the non-iteration text,
  only in chunks where their shape occurs.

A chunk whose iteration lines do not fit the documented template (an unknown field, a line
broken by another rank's output) is re-read line by line with a tolerant parser, so odd logs
are slower, never wrong. Rank prefixes (``[rank N]:``, ``[defaultN]:``, ``srun -l``'s ``N:``),
ANSI colour codes, ``\\r`` progress output, missing optional fields and a truncated last line
are all tolerated.
"""

from __future__ import annotations

import math
import re
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from operator import lt
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CHUNK_BYTES = 16 * 1024 * 1024
GIB_PER_GB = 1e9 / 2**30  # log-formats.md §4: Bridge prints decimal GB; GiB = GB / 1.073741824

# --- the iteration line (§2), one regex for the documented template -------------------------
_V = rb"([^ |\n]++)"
_N = rb"(\d++)"
_ITER = re.compile(
    rb"iteration +" + _N + rb"/ *" + _N + rb" \| consumed samples: *" + _N + rb" \|"
    rb"(?: skipped samples: *" + _N + rb" \|)?"
    rb" elapsed time per iteration \(ms\): *" + _V + rb" \|"
    rb"(?: throughput per GPU \(TFLOP/s/GPU\): *" + _V + rb" \|)?"
    rb"(?: energy per GPU \(J/iter/GPU\): *" + _V + rb" \| power per GPU \(W/GPU\): *" + _V
    + rb" \|)?"
    rb" learning rate: *" + _V + rb" \|"
    rb"(?: decoupled learning rate: *" + _V + rb" \|)?"  # Megatron-LM with --decoupled-lr
    rb" global batch size: *" + _N + rb" \|"
    rb"((?: [^|:\n]++: *[^ |\n]++ \|)*?)"
    rb" loss scale: *" + _V + rb" \|"
    rb"(?: grad norm: *" + _V + rb" \|)?"
    rb"(?: num zeros: *" + _V + rb" \|)?"
    rb"(?: params norm: *" + _V + rb" \|)?"
    rb"(?: max attention logit: *" + _V + rb" \|)?"
    rb" number of skipped iterations: *" + _N + rb" \| number of nan iterations: *" + _N
    + rb" \|")
_G = _ITER.groups  # 19
(_IT, _TOTAL, _CONSUMED, _SKIPPED_SAMPLES, _ELAPSED, _TFLOPS, _ENERGY, _POWER, _LR, _DLR, _GBS,
 _LOSSES, _LOSS_SCALE, _GRAD_NORM, _NUM_ZEROS, _PARAMS_NORM, _MAX_LOGIT, _SKIPPED,
 _NAN) = range(_G)
_LOSS_PAIR = re.compile(rb"([^|:\n]+):\s*([^\s|]+)\s*\|")
# a line that starts like an iteration line: on a shape, and on a real line
_HEAD_SHAPE = re.compile(rb"iteration +0+/ *0+ *\|")
_HEAD = re.compile(rb"iteration +(\d+)/ *(\d+) *\|")
_NAN_MARK = b"| number of nan iterations:"

_STEP = re.compile(rb"Step Time : *([\d.]+)s GPU utilization: *([\d.]+)")
_MEM = re.compile(rb"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(GB\)([^\n]*)")
_THEO = re.compile(rb"Theoretical memory footprints: weight and optimizer=([\d.]+) MB"
                   rb"(?:, activation=([\d.]+) MB)?(?:, total=([\d.]+) MB)?")
_BILLIONS = re.compile(rb"((?:Total n|N)umber of [^\n:]*?) in billions: *([\d.]+)")
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
_DIGITS = b"0123456789"
# A line's shape: every digit becomes 0, so one warning from 1,000 ranks or 10,000 iterations is
# one shape (a translate over the whole text, then a split: C speed).
_SHAPE_TABLE = bytes.maketrans(_DIGITS, b"0" * 10)


def shape_of(text: bytes | str) -> bytes:
    """The shape of a line (digits -> 0), as the classifier sees it."""
    raw = text.encode() if isinstance(text, str) else text
    return raw.translate(_SHAPE_TABLE)


# Config keys whose printed value (Bridge prints the ConfigContainer as YAML on rank 0) is
# evidence of what was requested (§8 "resolved config").
CONFIG_KEYS = (
    "cuda_graph_impl", "cuda_graph_scope", "cuda_graph_warmup_steps", "enable_cuda_graph",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "fp8", "fp8_recipe", "fp4",
    "fp4_recipe", "mixed_precision", "tp_comm_overlap", "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute", "moe_shared_expert_overlap", "overlap_grad_reduce",
    "overlap_param_gather", "recompute_granularity", "recompute_method", "recompute_num_layers",
    "moe_router_force_load_balancing",
)
_CONFIG_SHAPE = re.compile(
    rb"(?:^|[\s:\]>])(" + b"|".join(sorted({shape_of(k) for k in CONFIG_KEYS}, key=len,
                                            reverse=True))
    + rb"): +\S")
_CONFIG_LINE = re.compile(
    rb"(?:^|[\s:\]>])(" + b"|".join(sorted((k.encode() for k in CONFIG_KEYS), key=len,
                                           reverse=True))
    + rb"): +['\"]?([^\s'\"#]+)")

FindingKind = Literal["fallback", "warning", "capture", "marker", "error"]


@dataclass(frozen=True)
class Signature:
    """A kind of line worth reporting; its needles (all must occur) are matched on line shapes,
    so they are stored as shapes too."""

    id: str
    kind: FindingKind
    needles: tuple[bytes, ...]  # all must occur
    meaning: str
    negates: tuple[str, ...] = ()  # feature families a fallback line proves inactive


def _sig(id: str, kind: FindingKind, needles: str | tuple[str, ...], meaning: str,
         negates: tuple[str, ...] = ()) -> Signature:
    ns = (needles,) if isinstance(needles, str) else needles
    return Signature(id, kind, tuple(shape_of(n) for n in ns), meaning, negates)


# §8 fallback / downgrade lines (rule ids from constraints.md), Bridge's flex-backend helper,
# MCore's graph-capture lines, §7 markers, §9 flaky signatures and §10 error classes.
SIGNATURES: tuple[Signature, ...] = (
    _sig("I1", "fallback", "Falling back to alltoall",
         "flex backend (DeepEP/HybridEP) unsupported on this GPU: alltoall ran instead",
         ("flex",)),
    _sig("I1", "fallback", "Not a valid flex dispatcher backend",
         "flex backend not recognised: flex dispatcher not configured", ("flex",)),
    _sig("I1", "fallback", "only applicable to MoE models",
         "DeepEP/HybridEP skipped: the model is not MoE", ("flex",)),
    _sig("L1", "fallback", "Disabling tensor parallel communication overlap",
         "TP communication overlap switched off (TP < 2, SP off, or TE missing)",
         ("tp_comm_overlap",)),
    _sig("J8", "fallback", "Disabling MoE expert-parallel communication overlap",
         "EP overlap and delayed wgrad switched off (Energon native packing)",
         ("ep_overlap", "delay_wgrad_compute")),
    _sig("L3", "warning", "Distributed optimizer settings were not in sync",
         "ddp / optimizer flags reconciled automatically"),
    _sig("I6", "warning", "Use moe_flex_dispatcher_num_sms instead",
         "deprecated SM-count knob"),
    _sig("C4", "warning", "sequence parallelism must be used",
         "EP > 1 with TP > 1 needs sequence parallelism"),
    _sig("E11", "warning", "no need to set 'core_attn' to recompute",
         "core_attn recompute is ~no-op with fused attention"),
    _sig("I20", "warning", "without fp32 routing", "many experts without an FP32 router"),
    _sig("I12", "warning", "moe_ffn_hidden_size is not set",
         "moe_ffn_hidden_size defaulted to ffn_hidden_size"),
    _sig("cudagraph.no-te", "warning", "Transformer Engine was not detected while capturing",
         "graphs captured without TE weak references: more graph memory"),
    _sig("cuda_graph.create", "capture", ("Creating", "CUDA graphs"),
         "Megatron-Core began capturing CUDA graphs"),
    _sig("cuda_graph.built", "capture", "cuda graph(s) in",
         "Megatron-Core finished building CUDA graphs"),
    _sig("start", "marker", "Starting training loop at iteration", "training loop started"),
    _sig("exit", "marker", "exiting program at iteration", "exit at the requested iteration"),
    _sig("done", "marker", "after training is done", "training finished"),
    _sig("no_samples", "marker", "no samples left to consume", "data exhausted (completion)"),
    _sig("stop_iteration", "marker", "StopIteration", "data iterator exhausted (completion)"),
    _sig("sigterm", "marker", "exiting program after receiving SIGTERM", "SIGTERM exit"),
    _sig("oom", "error", "OutOfMemoryError", "CUDA out of memory"),
    _sig("oom", "error", "CUDA out of memory", "CUDA out of memory"),
    _sig("oom", "error", "oom-kill event", "host memory: Slurm's cgroup OOM killer"),
    _sig("oom", "error", "oom_kill event", "host memory: Slurm's cgroup OOM killer"),
    _sig("timeout", "error", "DUE TO TIME LIMIT", "Slurm time limit"),
    *(_sig("flaky", "error", s, "transient failure (perf harness retries it)") for s in (
        "The server socket has failed to listen on any local network address",
        "Some NCCL operations have failed or timed out", "uncorrectable ECC error encountered",
        "illegal memory access", "illegal instruction", "DistNetworkError", "DistBackendError",
        "ncclRemoteError", "Watchdog caught collective operation timeout", "Segmentation fault",
        "CUDA_LAUNCH_BLOCKING=1", "double free or corruption",
        "Call to CUDA function failed", "Connection reset by peer", "invalid pointer",
        "unspecified launch failure", "EOFError: No data left in file", "ncclUniqueId",
        "wait timeout after", "possible application crash on rank",
        "We couldn't connect to 'https://huggingface.co'", "Max retries exceeded with url")),
    _sig("flaky", "error", "found NaN in",
         "NaN found by the rerun state machine (the perf harness retries it as flaky)"),
    _sig("config_error", "error", "ValueError", "invalid configuration"),
    _sig("config_error", "error", "AssertionError", "a configuration assertion failed"),
    _sig("failed", "error", "Traceback (most recent call last)", "Python error"),
    _sig("failed", "error", "RuntimeError", "Python error"),
    _sig("failed", "error", "ChildFailedError", "torchrun: a rank failed"),
)
# §10: lines that mention errors without being one (grep exclusions of the perf harness)
_ERROR_EXCLUDES = (b"UserWarning", b"AllocatorConfig", b"FutureWarning", b"DeprecationWarning",
                   b"frame #", b"srun: error")

# shape kinds handled by the parser itself, not reported as findings
_K_ITER, _K_STEP, _K_MEM, _K_THEO, _K_BILLIONS, _K_CONFIG = (
    "iteration", "step", "memory", "theoretical", "billions", "config")
_SHAPE_CACHE_LIMIT = 500_000
_MAX_ORIGINALS = 16  # distinct real lines kept per interesting shape per chunk


def _classify(shape: bytes) -> tuple[str, Signature | None] | None:
    """What a line of this shape is, or None for noise."""
    if b"iteration" in shape and _HEAD_SHAPE.search(shape):
        return _K_ITER, None
    if b"Step Time" in shape:
        return _K_STEP, None
    if b"memory (GB)" in shape and b"[Rank" in shape:
        return _K_MEM, None
    if b"Theoretical memory footprints" in shape:
        return _K_THEO, None
    if b"in billions:" in shape:
        return _K_BILLIONS, None
    excluded = any(x in shape for x in _ERROR_EXCLUDES)
    for sig in SIGNATURES:
        if sig.kind == "error" and excluded:
            continue
        if all(n in shape for n in sig.needles):
            return sig.kind, sig
    if b": " in shape and _CONFIG_SHAPE.search(shape):
        return _K_CONFIG, None
    return None


def _num(raw: bytes | None) -> float | None:
    if not raw:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _int(raw: bytes | None) -> int | None:
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _text(raw: bytes, limit: int = 400) -> str:
    s = raw.decode("utf-8", "replace").strip()
    return s if len(s) <= limit else s[:limit] + "…"


# --- public models ---------------------------------------------------------------------------

class _Measured(BaseModel):
    # NaN / inf are measurements here (a NaN loss); keep them visible in JSON
    model_config = ConfigDict(ser_json_inf_nan="strings")


class Iteration(_Measured):
    """One iteration line (§2), as printed by the last rank; the interval average when
    ``logger.log_interval`` > 1."""

    iteration: int
    total: int = Field(description="train iterations requested (the N of 'iteration k/N')")
    row: int = Field(description="0-based position among the log's iteration lines")
    elapsed_ms: float = Field(description="elapsed time per iteration (ms)")
    tflops_per_gpu: float | None = Field(None, description="throughput per GPU (TFLOP/s/GPU); "
                                                           "needs logger.log_throughput=true")
    losses: dict[str, float] = Field(default_factory=dict,
                                     description="every 'name: value' between the batch size "
                                                 "and the loss scale (lm loss, MoE aux, MTP …)")
    grad_norm: float | None = None
    skipped_iterations: int = 0
    nan_iterations: int = 0
    consumed_samples: int | None = None
    skipped_samples: int | None = None
    learning_rate: float | None = None
    decoupled_learning_rate: float | None = None
    global_batch_size: int | None = None
    loss_scale: float | None = None
    num_zeros: float | None = None
    params_norm: float | None = None
    max_attention_logit: float | None = None
    energy_j_per_gpu: float | None = None
    power_w_per_gpu: float | None = None
    extra: dict[str, str] = Field(default_factory=dict,
                                  description="fields outside the documented template")

    @property
    def finite(self) -> bool:
        """Every loss and the grad norm are finite numbers."""
        vals = [*self.losses.values(), *([self.grad_norm] if self.grad_norm is not None else [])]
        return all(math.isfinite(v) for v in vals)


class MemoryReport(BaseModel):
    """A ``[Rank r] (after N iterations) memory (GB)`` line (§4): decimal GB, as printed."""

    rank: int
    after_iterations: int
    values_gb: dict[str, float] = Field(description="key -> decimal GB (bytes / 1e9); keys ending "
                                                    "in -bytes are converted")
    counts: dict[str, int] = Field(default_factory=dict,
                                   description="counters, e.g. mem-allocated-count")
    alloc_retries: int | None = Field(None, description="mem-alloc-retires (sic): a non-zero "
                                                        "value signals fragmentation")

    def get(self, name: str) -> float | None:
        """A value by its short name: allocated, max-allocated, reserved, max-reserved, …"""
        return self.values_gb.get(f"mem-{name}-gigabytes", self.values_gb.get(f"mem-{name}-bytes"))


class TheoreticalMemory(BaseModel):
    """Bridge's estimator line (§5): MiB, although the log labels it "MB"."""

    weight_and_optimizer_mib: float
    activation_mib: float | None = None
    total_mib: float | None = None


class LogFinding(BaseModel):
    """A reportable line: fallback, warning, graph capture, marker or error."""

    id: str = Field(description="constraint rule id (I1, L1 …), outcome class (oom, timeout, "
                                "flaky, config_error, failed) or marker name")
    kind: FindingKind
    meaning: str
    line: str = Field(description="first occurrence, as printed (trimmed)")
    count: int = Field(description="occurrences in the whole log")
    after_rows: int = Field(description="iteration lines printed before the first occurrence")
    negates: list[str] = Field(default_factory=list)


class LogSummary(_Measured):
    """What a log holds, without the per-iteration rows (those come from ParsedLog)."""

    source: str
    bytes_read: int
    lines: int
    iteration_lines: int
    first_iteration: int | None
    last_iteration: int | None
    max_iteration: int | None
    total_iterations: int | None = Field(description="N of the last 'iteration k/N' line")
    restarts: int = Field(description="times the iteration number went backwards (a resume "
                                      "or a second run in the same log)")
    log_interval: int | None
    skipped_iterations: int = Field(description="sum over all iteration lines")
    nan_iterations: int = Field(description="sum over all iteration lines")
    step_time_lines: int
    memory_reports: list[MemoryReport]
    theoretical_memory: TheoreticalMemory | None
    parameters_billions: dict[str, float]
    config: dict[str, list[str]] = Field(description="values printed for the CONFIG_KEYS")
    findings: list[LogFinding]
    malformed_iteration_lines: int
    malformed_examples: list[str]
    truncated_tail: str | None = Field(description="the last line when the log does not end "
                                                   "with a newline and it is not a whole "
                                                   "iteration line")
    completed: bool = Field(description="the last iteration line reached its total, or an exit "
                                        "marker was printed")


# --- row storage -----------------------------------------------------------------------------

_LAZY_COLS = (_CONSUMED, _SKIPPED_SAMPLES, _ELAPSED, _TFLOPS, _ENERGY, _POWER, _LR, _DLR, _GBS,
              _LOSSES, _LOSS_SCALE, _GRAD_NORM, _NUM_ZEROS, _PARAMS_NORM, _MAX_LOGIT)


class _LazyBlock:
    """The iteration rows of one chunk as raw bytes per field; numbers on demand."""

    __slots__ = ("_blobs", "_split", "first_row", "increasing", "iters", "n", "nan", "skipped",
                 "totals")

    def __init__(self, parts: list[Any], first_row: int) -> None:
        step = _G + 1
        cols = [parts[j::step] for j in range(1, step)]
        self.n = n = len(cols[0])
        self.first_row = first_row
        self.iters = array("q", map(int, cols[_IT]))
        self.totals = array("q", map(int, cols[_TOTAL]))
        self.skipped = sum(map(int, cols[_SKIPPED]))
        self.nan = sum(map(int, cols[_NAN]))
        blobs: dict[int, bytes | None] = {}
        for j in _LAZY_COLS:
            col = cols[j]
            missing = col.count(None)
            if missing == n:
                blobs[j] = None
            elif missing:
                blobs[j] = b"\x00".join([x or b"" for x in col])
            else:
                blobs[j] = b"\x00".join(col)
        blobs[_SKIPPED] = b"\x00".join(cols[_SKIPPED])
        blobs[_NAN] = b"\x00".join(cols[_NAN])
        self._blobs = blobs
        self._split: dict[int, list[bytes] | None] | None = None
        self.increasing = all(map(lt, self.iters, self.iters[1:]))

    def row(self, i: int) -> Iteration:
        if self._split is None:
            self._split = {j: (None if b is None else b.split(b"\x00"))
                           for j, b in self._blobs.items()}
        s = self._split

        def raw(j: int) -> bytes | None:
            col = s[j]
            return None if col is None else col[i]

        losses = {}
        for name, value in _LOSS_PAIR.findall(raw(_LOSSES) or b""):
            v = _num(value)
            if v is not None:
                losses[name.strip().decode("utf-8", "replace")] = v
        return Iteration(
            iteration=self.iters[i], total=self.totals[i], row=self.first_row + i,
            elapsed_ms=_num(raw(_ELAPSED)) or 0.0, tflops_per_gpu=_num(raw(_TFLOPS)),
            losses=losses, grad_norm=_num(raw(_GRAD_NORM)),
            skipped_iterations=_int(raw(_SKIPPED)) or 0, nan_iterations=_int(raw(_NAN)) or 0,
            consumed_samples=_int(raw(_CONSUMED)), skipped_samples=_int(raw(_SKIPPED_SAMPLES)),
            learning_rate=_num(raw(_LR)), decoupled_learning_rate=_num(raw(_DLR)),
            global_batch_size=_int(raw(_GBS)),
            loss_scale=_num(raw(_LOSS_SCALE)), num_zeros=_num(raw(_NUM_ZEROS)),
            params_norm=_num(raw(_PARAMS_NORM)), max_attention_logit=_num(raw(_MAX_LOGIT)),
            energy_j_per_gpu=_num(raw(_ENERGY)), power_w_per_gpu=_num(raw(_POWER)))

    def release(self) -> None:
        self._split = None


class _EagerBlock:
    """Rows parsed one line at a time (the tolerant path)."""

    __slots__ = ("first_row", "increasing", "iters", "n", "nan", "rows", "skipped", "totals")

    def __init__(self, rows: list[Iteration], first_row: int) -> None:
        self.rows = rows
        self.n = len(rows)
        self.first_row = first_row
        self.iters = array("q", (r.iteration for r in rows))
        self.totals = array("q", (r.total for r in rows))
        self.skipped = sum(r.skipped_iterations for r in rows)
        self.nan = sum(r.nan_iterations for r in rows)
        self.increasing = all(map(lt, self.iters, self.iters[1:]))

    def row(self, i: int) -> Iteration:
        return self.rows[i]

    def release(self) -> None:
        pass


_Block = _LazyBlock | _EagerBlock

_GENERIC_KEYS = {
    "consumed samples": "consumed_samples", "skipped samples": "skipped_samples",
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "energy per GPU (J/iter/GPU)": "energy_j_per_gpu", "power per GPU (W/GPU)": "power_w_per_gpu",
    "learning rate": "learning_rate", "decoupled learning rate": "decoupled_learning_rate",
    "global batch size": "global_batch_size",
    "loss scale": "loss_scale", "grad norm": "grad_norm", "num zeros": "num_zeros",
    "params norm": "params_norm", "max attention logit": "max_attention_logit",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
}
_INT_FIELDS = {"consumed_samples", "skipped_samples", "global_batch_size", "skipped_iterations",
               "nan_iterations"}


def parse_iteration_line(line: bytes | str, row: int = 0) -> Iteration | None:
    """One iteration line, tolerant of extra or reordered fields; None unless the line is whole
    (it must carry the elapsed time and end with the NaN-iteration count)."""
    if isinstance(line, str):
        line = line.encode("utf-8", "surrogateescape")
    m = _HEAD.search(line)
    if m is None:
        return None
    values: dict[str, Any] = {}
    losses: dict[str, float] = {}
    extra: dict[str, str] = {}
    in_losses = False  # the template prints the losses between the batch size and loss scale
    for part in line[m.end():].split(b"|"):
        key, sep, raw = part.partition(b":")
        if not sep:
            continue
        name = key.strip().decode("utf-8", "replace")
        raw = raw.strip()
        known = _GENERIC_KEYS.get(name)
        if known in _INT_FIELDS:
            values[known] = _int(raw)
        elif known:
            values[known] = _num(raw)
        elif (in_losses or name.endswith("loss")) and (v := _num(raw)) is not None:
            losses[name] = v
        else:
            extra[name] = raw.decode("utf-8", "replace")
        if known == "global_batch_size":
            in_losses = True
        elif known == "loss_scale":
            in_losses = False
    if values.get("elapsed_ms") is None or values.get("nan_iterations") is None:
        return None
    values = {k: v for k, v in values.items() if v is not None}
    return Iteration(iteration=int(m.group(1)), total=int(m.group(2)), row=row, losses=losses,
                     extra=extra, **values)


def _row_from_match(g: tuple[Any, ...], row: int) -> Iteration:
    """An Iteration from the groups of the template regex (the tolerant path's first try)."""
    block = _LazyBlock([b"", *g, b""], row)
    return block.row(0)


# --- the parser ------------------------------------------------------------------------------

@dataclass
class _FindingAcc:
    sig: Signature
    line: bytes
    after_rows: int
    count: int = 0


@dataclass
class ParsedLog:
    """Everything a log says; iteration rows are materialised on request (``window``,
    ``rows``, ``get``). Build it with ``parse_log``."""

    source: str = "<lines>"
    bytes_read: int = 0
    lines: int = 0
    step_time_lines: int = 0
    step_times_s: array = field(default_factory=lambda: array("d"), repr=False)
    step_tflops: array = field(default_factory=lambda: array("d"), repr=False)
    steps_incomplete: bool = False  # Step Time values were not kept for every line
    _need_steps: bool | None = field(default=None, repr=False)
    memory: list[MemoryReport] = field(default_factory=list)
    theoretical: TheoreticalMemory | None = None
    parameters_billions: dict[str, float] = field(default_factory=dict)
    config: dict[str, list[str]] = field(default_factory=dict)
    malformed: int = 0
    malformed_examples: list[str] = field(default_factory=list)
    truncated_tail: str | None = None
    _blocks: list[_Block] = field(default_factory=list, repr=False)
    _findings: dict[tuple[str, bytes], _FindingAcc] = field(default_factory=dict, repr=False)
    _shape_kind: dict[bytes, tuple[str, Signature | None] | None] = field(default_factory=dict,
                                                                           repr=False)

    # -- rows --
    @property
    def iteration_lines(self) -> int:
        return sum(b.n for b in self._blocks)

    def rows(self) -> Iterator[Iteration]:
        """Every iteration line in log order (duplicates after a restart included)."""
        for b in self._blocks:
            for i in range(b.n):
                yield b.row(i)
            b.release()

    def window(self, start: int, end: int) -> list[Iteration]:
        """Iterations ``start..end`` (inclusive) that were logged, sorted; after a restart the
        last occurrence of an iteration wins (it is the one the resumed run kept)."""
        found: dict[int, Iteration] = {}
        for b in reversed(self._blocks):
            if b.increasing:
                lo, hi = bisect_left(b.iters, start), bisect_right(b.iters, end)
                idx = range(hi - 1, lo - 1, -1)
            else:
                idx = [i for i in range(b.n - 1, -1, -1) if start <= b.iters[i] <= end]
            for i in idx:
                it = b.iters[i]
                if it not in found:
                    found[it] = b.row(i)
            b.release()
        return [found[k] for k in sorted(found)]

    def get(self, iteration: int) -> Iteration | None:
        rows = self.window(iteration, iteration)
        return rows[0] if rows else None

    def last_row(self) -> Iteration | None:
        for b in reversed(self._blocks):
            if b.n:
                row = b.row(b.n - 1)
                b.release()
                return row
        return None

    @property
    def max_iteration(self) -> int | None:
        vals = [max(b.iters) for b in self._blocks if b.n]
        return max(vals) if vals else None

    @property
    def restarts(self) -> int:
        """How often the iteration number did not increase from one line to the next."""
        n, prev = 0, None
        for b in self._blocks:
            if not b.n:
                continue
            if prev is not None and b.iters[0] <= prev:
                n += 1
            if not b.increasing:
                n += sum(y <= x for x, y in pairwise(b.iters))
            prev = b.iters[-1]
        return n

    @property
    def log_interval(self) -> int | None:
        """The usual gap between consecutive iteration lines (1 with log_interval=1)."""
        its = array("q")
        for b in self._blocks:  # the first few thousand lines tell
            its.extend(b.iters[: 4096 - len(its)])
            if len(its) >= 4096:
                break
        gaps = Counter(y - x for x, y in pairwise(its) if y > x)
        return gaps.most_common(1)[0][0] if gaps else None

    @property
    def skipped_iterations(self) -> int:
        return sum(b.skipped for b in self._blocks)

    @property
    def nan_iterations(self) -> int:
        return sum(b.nan for b in self._blocks)

    # -- findings --
    @property
    def findings(self) -> list[LogFinding]:
        merged: dict[tuple[str, str], LogFinding] = {}
        for acc in self._findings.values():
            key = (acc.sig.id, acc.sig.meaning)
            f = merged.get(key)
            if f is None:
                merged[key] = LogFinding(id=acc.sig.id, kind=acc.sig.kind,
                                         meaning=acc.sig.meaning, line=_text(acc.line),
                                         count=acc.count, after_rows=acc.after_rows,
                                         negates=list(acc.sig.negates))
            else:
                f.count += acc.count
                if acc.after_rows < f.after_rows:
                    f.line, f.after_rows = _text(acc.line), acc.after_rows
        return sorted(merged.values(), key=lambda f: (f.after_rows, f.id))

    def findings_of(self, kind: FindingKind) -> list[LogFinding]:
        return [f for f in self.findings if f.kind == kind]

    def row_iteration(self, row: int) -> int | None:
        """The iteration number printed on the 0-based ``row``-th iteration line."""
        for b in self._blocks:
            if b.first_row <= row < b.first_row + b.n:
                return b.iters[row - b.first_row]
        return None

    @property
    def completed(self) -> bool:
        last = self.last_row()
        if last is not None and last.iteration >= last.total:
            return True
        return any(f.kind == "marker" and f.id in ("exit", "done", "no_samples", "stop_iteration")
                   for f in self.findings)

    def summary(self) -> LogSummary:
        first = next((b.iters[0] for b in self._blocks if b.n), None)
        last = self.last_row()
        return LogSummary(
            source=self.source, bytes_read=self.bytes_read, lines=self.lines,
            iteration_lines=self.iteration_lines, first_iteration=first,
            last_iteration=last.iteration if last else None, max_iteration=self.max_iteration,
            total_iterations=last.total if last else None, restarts=self.restarts,
            log_interval=self.log_interval, skipped_iterations=self.skipped_iterations,
            nan_iterations=self.nan_iterations, step_time_lines=self.step_time_lines,
            memory_reports=self.memory, theoretical_memory=self.theoretical,
            parameters_billions=self.parameters_billions, config=self.config,
            findings=self.findings, malformed_iteration_lines=self.malformed,
            malformed_examples=self.malformed_examples, truncated_tail=self.truncated_tail,
            completed=self.completed)

    # -- feeding --
    def _feed(self, base: bytes, lo: int, hi: int, final: bool = False) -> None:
        """Parse the whole lines ``base[lo:hi]`` (a view: a 16 MB chunk is never copied)."""
        if hi <= lo:
            return
        if b"\r" in base or b"\x1b" in base:
            text = base[lo:hi]
            if b"\r" in text:
                text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if b"\x1b" in text:
                text = _ANSI.sub(b"", text)
            base, lo, hi = text, 0, len(text)
        view = memoryview(base)[lo:hi]
        rows_before = self.iteration_lines
        parts = _ITER.split(view)
        nrows = (len(parts) - 1) // (_G + 1)
        noise = b"".join(parts[0::_G + 1]) if nrows else bytes(view)
        slow = self._scan_noise(noise, base, lo, hi, rows_before, nrows, parts)
        if slow:
            self._feed_slowly(bytes(view), rows_before, final)
            return
        if nrows:
            self._blocks.append(_LazyBlock(parts, rows_before))
        if final and not noise.endswith(b"\n"):
            tail = noise[noise.rfind(b"\n") + 1:]
            if tail.strip():
                self.truncated_tail = _text(tail, 200)

    def _feed_slowly(self, buf: bytes, rows_before: int, final: bool) -> None:
        rows: list[Iteration] = []
        lines = buf.split(b"\n")
        for k, line in enumerate(lines):
            if b"iteration" not in line:
                continue
            m = _ITER.search(line)
            row = rows_before + len(rows)
            it = (_row_from_match(m.groups(), row) if m is not None
                  else parse_iteration_line(line, row))
            if it is not None:
                rows.append(it)
            elif _HEAD.search(line):
                if final and k == len(lines) - 1:
                    self.truncated_tail = _text(line, 200)
                else:
                    self.malformed += 1
                    if len(self.malformed_examples) < 5:
                        self.malformed_examples.append(_text(line, 200))
        if rows:
            self._blocks.append(_EagerBlock(rows, rows_before))
        tail = lines[-1]
        if final and tail.strip() and self.truncated_tail is None and not (
                rows and _HEAD.search(tail)):
            self.truncated_tail = _text(tail, 200)

    def _scan_noise(self, noise: bytes, base: bytes, lo: int, hi: int, rows_before: int,
                    nrows: int, parts: list[Any]) -> bool:
        """Count and classify the non-iteration lines; True when an iteration-shaped line did
        not fit the template (the chunk then takes the tolerant path)."""
        shapes = noise.translate(_SHAPE_TABLE).split(b"\n")
        self.lines += len(shapes) - (1 if noise.endswith(b"\n") else 0)
        if nrows and self._need_steps is None:
            # Step Time lines (§3) are only a fallback source of TFLOP/s: decided once, by the
            # first iteration lines, whether they are needed (log_throughput is per run)
            self._need_steps = None in parts[_TFLOPS + 1::_G + 1]
            if not self._need_steps:
                del self.step_times_s[:], self.step_tflops[:]
        elif nrows and self._need_steps is False and None in parts[_TFLOPS + 1::_G + 1]:
            self.steps_incomplete = True
        counts = Counter(shapes)
        cache = self._shape_kind
        kinds: dict[bytes, tuple[str, Signature | None]] = {}
        for s in counts:
            k = cache.get(s, False)
            if k is False:
                k = _classify(s)
                if len(cache) < _SHAPE_CACHE_LIMIT:
                    cache[s] = k
            if k is not None:
                kinds[s] = k
        if not kinds:
            return False
        present = {k[0] for k in kinds.values()}
        if _K_STEP in present:
            self.step_time_lines += sum(counts[s] for s, k in kinds.items() if k[0] == _K_STEP)
            if self._need_steps is not False:
                steps = _STEP.findall(noise)
                self.step_times_s.extend(float(x) for x, _ in steps)
                self.step_tflops.extend(float(t) for _, t in steps)
        if _K_MEM in present:
            for m in _MEM.finditer(noise):
                self._memory(m)
        slow = _K_ITER in present
        wanted = {s for s, k in kinds.items() if k[0] not in (_K_STEP, _K_MEM, _K_ITER)}
        if not wanted:
            return slow
        originals: dict[bytes, list[bytes]] = {}
        for s, line in zip(shapes, noise.split(b"\n"), strict=True):
            if s in wanted:
                seen = originals.setdefault(s, [])
                if len(seen) < _MAX_ORIGINALS and line not in seen:
                    seen.append(line)
        for s, found in originals.items():
            kind, sig = kinds[s]
            if kind == _K_THEO:
                for line in found:
                    self._theoretical(line)
            elif kind == _K_BILLIONS:
                for line in found:
                    if m := _BILLIONS.search(line):
                        self.parameters_billions[_text(m.group(1))] = float(m.group(2))
            elif kind == _K_CONFIG:
                for line in found:
                    for key, value in _CONFIG_LINE.findall(line):
                        vals = self.config.setdefault(key.decode(), [])
                        v = value.decode("utf-8", "replace")
                        if v not in vals:
                            vals.append(v)
            elif sig is not None:
                acc = self._findings.get((sig.id, s))
                if acc is None:
                    line = found[0]
                    pos = base.find(line, lo, hi) if line else -1
                    after = rows_before + (base.count(_NAN_MARK, lo, pos) if pos > lo else 0)
                    acc = self._findings[(sig.id, s)] = _FindingAcc(sig, line, after)
                acc.count += counts[s]
        return slow

    def _memory(self, m: re.Match[bytes]) -> None:
        values: dict[str, float] = {}
        counts: dict[str, int] = {}
        for part in m.group(3).split(b"|"):
            key, sep, raw = part.partition(b":")
            v = _num(raw.strip()) if sep else None
            if v is None:
                continue
            k = key.strip().decode("utf-8", "replace")
            if k.endswith("-gigabytes"):
                values[k] = v
            elif k.endswith("-bytes"):
                values[k] = v / 1e9
            else:  # mem-alloc-retires (sic), mem-allocated-count, …
                counts[k] = int(v)
        self.memory.append(MemoryReport(
            rank=int(m.group(1)), after_iterations=int(m.group(2)), values_gb=values,
            counts=counts, alloc_retries=counts.get("mem-alloc-retires",
                                                    counts.get("mem-alloc-retries"))))

    def _theoretical(self, line: bytes) -> None:
        m = _THEO.search(line)
        if m is not None and self.theoretical is None:
            self.theoretical = TheoreticalMemory(
                weight_and_optimizer_mib=float(m.group(1)), activation_mib=_num(m.group(2)),
                total_mib=_num(m.group(3)))


# --- sources ---------------------------------------------------------------------------------

def read_tail(path: str | Path | None, size: int = 65_536) -> bytes | None:
    """The last `size` bytes of a log (None when there is none): enough for the newest
    iteration or a launcher's failure summary without reading a huge log whole."""
    if not path:
        return None
    try:
        return tail_bytes(path, size)
    except (OSError, ValueError):
        return None


def tail_bytes(path: str | Path, size: int) -> bytes:
    """The last `size` bytes of a file (a seek) or a pipe (streamed, in bounded memory).
    Raises ConfigError for anything else: a device such as /dev/zero never ends."""
    import os
    import stat

    from mbridge_perf.config.errors import ConfigError

    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise ConfigError(str(path), "not a file or a pipe; give the training log or OOM text")
    with open(path, "rb") as f:
        if stat.S_ISREG(mode):
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
        return stream_tail(f, size)


def stream_tail(stream: Any, size: int) -> bytes:
    """The last `size` bytes of a binary stream, holding at most about twice that."""
    buf = bytearray()
    while chunk := stream.read(1 << 20):
        buf += chunk
        if len(buf) > 2 * size:
            del buf[:-size]
    return bytes(buf[-size:])


def _path_chunks(path: Path, size: int) -> Iterator[bytes]:
    """A log file's chunks; a device (``/dev/zero``) never ends and is refused, naming it."""
    import os
    import stat

    from mbridge_perf.config.errors import ConfigError

    mode = os.stat(path).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise ConfigError(str(path), "not a file or a pipe; give the training log")
    with path.open("rb") as f:
        while chunk := f.read(size):
            yield chunk


def _line_chunks(lines: Iterable[str | bytes], size: int) -> Iterator[bytes]:
    """Lines (with or without their terminator) as byte chunks. A last line without a
    terminator, after lines that had one, stays unterminated: that is how a file iterator shows
    a truncated log."""
    buf: list[bytes] = []
    n = 0
    saw_terminated = False
    prev: bytes | None = None
    for item in lines:
        if prev is not None:
            piece = prev if prev.endswith((b"\n", b"\r")) else prev + b"\n"
            buf.append(piece)
            n += len(piece)
            if n >= size:
                yield b"".join(buf)
                buf, n = [], 0
            saw_terminated = saw_terminated or piece is prev
        prev = item.encode("utf-8", "surrogateescape") if isinstance(item, str) else bytes(item)
    if prev is not None:
        terminated = prev.endswith((b"\n", b"\r"))
        buf.append(prev if terminated or saw_terminated else prev + b"\n")
    if buf:
        yield b"".join(buf)


def parse_log(source: str | Path | Iterable[str | bytes], *,
              chunk_bytes: int = CHUNK_BYTES) -> ParsedLog:
    """Parse a training log from a path or from lines (any iterable of str or bytes, e.g. an
    open text file or ``text.splitlines()``). Streaming: memory stays near a few chunk sizes
    plus the raw iteration values (about 115 bytes per iteration line)."""
    if isinstance(source, str | Path):
        path = Path(source)
        chunks = _path_chunks(path, chunk_bytes)
        log = ParsedLog(source=str(path))
    else:
        chunks = _line_chunks(source, chunk_bytes)
        log = ParsedLog()
    rest = b""
    for chunk in chunks:
        log.bytes_read += len(chunk)
        start = 0
        if rest:  # the line cut at the previous chunk's end, completed from this one
            nl = chunk.find(b"\n")
            if nl < 0 and len(rest) < 8 * chunk_bytes:
                rest += chunk
                continue
            nl = len(chunk) - 1 if nl < 0 else nl  # one enormous line: take it as it is
            seam = rest + chunk[:nl + 1]
            log._feed(seam, 0, len(seam))
            start = nl + 1
        cut = chunk.rfind(b"\n")
        if cut < start:
            rest = chunk[start:]
            continue
        log._feed(chunk, start, cut + 1)
        rest = chunk[cut + 1:]
    if rest:
        log._feed(rest, 0, len(rest), final=True)
    return log
