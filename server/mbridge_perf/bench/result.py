"""From a parsed log to a benchmark result, and from two results to an A/B comparison.

Why: a number from a run counts only when the run is valid under the measurement contract —
enough steps, the declared steady window logged, finite losses, no skipped or NaN iteration in
the window, and evidence that each requested feature really ran (log-formats.md §8, §11). The
result says which gate failed and why, gives the steady-window metrics with their spread, the
delta against a golden value and an outcome class (§10), and renders the evidence as JSON and
Markdown. ``compare`` accepts an A/B only when the two contracts differ in exactly one variable
and both runs are valid. Pure: no I/O.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mbridge_perf.bench.contract import (
    MIN_FINAL_STEPS,
    ContractDifference,
    MeasurementContract,
    diff,
    variables,
)
from mbridge_perf.bench.logparse import (
    GIB_PER_GB,
    Iteration,
    LogFinding,
    MemoryReport,
    ParsedLog,
    TheoreticalMemory,
)
from mbridge_perf.config.derived import MIXED_PRECISION_RECIPES

Outcome = Literal[
    "pass", "regression", "invalid_window", "nan_loss", "skipped_iterations", "feature_missing",
    "oom", "timeout", "flaky", "config_error", "failed", "truncated",
]
OUTCOME_MEANING: dict[str, str] = {
    "pass": "completed; every validity gate holds (and within the golden threshold if given)",
    "regression": "valid, but TFLOP/s/GPU is below the golden value by more than the threshold",
    "invalid_window": "completed, but the declared window was not run or not logged in full",
    "nan_loss": "a loss or grad norm is not finite, or a NaN iteration, inside the window",
    "skipped_iterations": "an iteration inside the window was skipped",
    "feature_missing": "a requested feature has no evidence that it ran, or a fallback line",
    "oom": "out of memory (torch.OutOfMemoryError / 'CUDA out of memory'; exit 9)",
    "timeout": "Slurm time limit ('DUE TO TIME LIMIT'; exit 143)",
    "flaky": "a transient signature the perf harness retries (NCCL, ECC, socket, …)",
    "config_error": "ValueError / AssertionError before iteration 1",
    "failed": "the run stopped with an error",
    "truncated": "the log ends before the run completed and names no error",
}

# --- features --------------------------------------------------------------------------------

FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise")
FEATURES = (
    "cuda_graph", "flex", "flex:deepep", "flex:hybridep", "dispatcher:alltoall",
    "dispatcher:allgather", "fp8", *(f"fp8:{r}" for r in FP8_RECIPES), "fp4", "tp_comm_overlap",
    "ep_overlap", "delay_wgrad_compute", "overlap_grad_reduce", "overlap_param_gather",
    "moe_shared_expert_overlap",
)
_ALIASES = {
    "cuda_graphs": "cuda_graph", "cudagraph": "cuda_graph", "deepep": "flex:deepep",
    "hybridep": "flex:hybridep", "dispatcher:flex": "flex", "nvfp4": "fp4",
    "overlap_moe_expert_parallel_comm": "ep_overlap", "mxfp8": "fp8:mxfp8",
    "alltoall": "dispatcher:alltoall", "allgather": "dispatcher:allgather",
}
_OFF = {"", "null", "none", "false", "0", "~"}
_ON = {"true", "1", "yes"}


def canonical_feature(name: str) -> str:
    """The canonical id of a requested feature; ValueError names the known ones."""
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in FEATURES:
        raise ValueError(f"unknown feature {name!r}; known: {', '.join(FEATURES)} "
                         f"(aliases: {', '.join(sorted(_ALIASES))})")
    return key


def features_from_contract(contract: MeasurementContract) -> list[str]:
    """The features a contract turns on that can silently not run (§8): CUDA graphs, a flex
    backend, FP8 / FP4, TP and EP overlap, delayed wgrad. Plain defaults are not listed."""
    out: list[str] = []
    if contract.cuda_graphs.impl not in ("none", ""):
        out.append("cuda_graph")
    if contract.dispatcher.type == "flex":
        out.append(f"flex:{contract.dispatcher.backend}" if contract.dispatcher.backend
                   else "flex")
    p = contract.precision
    if p.fp8:
        out.append(f"fp8:{p.fp8_recipe}" if p.fp8_recipe in FP8_RECIPES else "fp8")
    if p.fp4:
        out.append("fp4")
    ov = contract.overlap
    if ov.tp_comm_overlap:
        out.append("tp_comm_overlap")
    if ov.overlap_moe_expert_parallel_comm:
        out.append("ep_overlap")
    if ov.delay_wgrad_compute:
        out.append("delay_wgrad_compute")
    return out


# --- models ----------------------------------------------------------------------------------

class _Measured(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")


class Gate(BaseModel):
    name: str
    passed: bool
    detail: str


class Stats(_Measured):
    """Centre and spread of one metric over the window."""

    n: int
    mean: float
    median: float
    min: float
    max: float
    stdev: float | None = Field(description="sample standard deviation; None for one value")
    q1: float
    q3: float
    iqr: float


class StepRow(_Measured):
    iteration: int
    step_time_ms: float
    tflops_per_gpu: float | None
    tokens_per_sec_per_gpu: float | None
    losses: dict[str, float]
    grad_norm: float | None
    skipped_iterations: int
    nan_iterations: int


class WindowMetrics(_Measured):
    step_time_ms: Stats | None = Field(None, description="elapsed time per iteration (ms)")
    tflops_per_gpu: Stats | None = Field(None, description="model TFLOP/s per GPU")
    tflops_source: Literal["iteration line", "Step Time line"] | None = None
    tokens_per_sec_per_gpu: Stats | None = Field(
        None, description="seq_length · global_batch_size / (step time · num_gpus)")
    tokens_note: str | None = None
    losses_last: dict[str, float] = Field(default_factory=dict,
                                          description="losses on the last window iteration")
    losses_mean: dict[str, float] = Field(default_factory=dict)
    skipped_iterations: int = Field(0, description="sum over the window")
    nan_iterations: int = Field(0, description="sum over the window")


class MemoryPeak(BaseModel):
    """Peak memory from the ``[Rank r] … memory (GB)`` lines (§11 rule 5): the max over every
    rank after iteration 2. The log prints decimal GB; GiB = GB / 1.073741824."""

    peak_allocated_gb: float | None
    peak_allocated_gib: float | None
    peak_allocated_bytes: int | None
    peak_allocated_rank: int | None
    peak_reserved_gb: float | None
    peak_reserved_gib: float | None
    peak_reserved_bytes: int | None
    peak_reserved_rank: int | None
    report_iteration: int = Field(description="the 'after N iterations' the peak was taken from")
    ranks_reporting: int
    alloc_retries: int | None = Field(None, description="max mem-alloc-retires over ranks")
    allocated_key: str = Field(description="the memory key the allocated peak comes from")


class Regression(_Measured):
    golden_tflops: float
    measured_tflops: float | None = Field(description="window mean TFLOP/s/GPU, as the perf "
                                                      "harness gates it")
    delta_pct: float | None
    threshold_pct: float
    passed: bool | None = Field(description="None when the window has no TFLOP/s")
    detail: str


class FeatureEvidence(BaseModel):
    feature: str
    evidenced: bool
    evidence: list[str] = Field(default_factory=list, description="what shows it ran")
    against: list[str] = Field(default_factory=list, description="what shows it did not")
    detail: str


class BenchmarkResult(_Measured):
    outcome: Outcome
    outcome_meaning: str
    valid: bool = Field(description="every validity gate passed (the regression check is not a "
                                    "validity gate)")
    measurement: Literal["final", "screening"] = Field(
        description="screening: the window ends before iteration 50 (§11 rule 1)")
    window_start: int
    window_end: int
    steps_completed: int | None = Field(description="highest iteration logged")
    steps_requested: int | None = Field(description="N of 'iteration k/N'")
    iteration_lines: int
    log_interval: int | None
    gates: list[Gate]
    metrics: WindowMetrics
    memory: MemoryPeak | None
    theoretical_memory: TheoreticalMemory | None
    regression: Regression | None
    features: list[FeatureEvidence]
    fallbacks: list[LogFinding]
    warnings: list[LogFinding]
    errors: list[LogFinding]
    error_excerpt: str | None
    per_step: list[StepRow]
    notes: list[str]
    source: str


# --- evaluation ------------------------------------------------------------------------------

def stats(values: Sequence[float]) -> Stats | None:
    """Median, mean and spread of ``values`` (None when empty)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return None
    if len(vals) > 1:
        q1, _, q3 = statistics.quantiles(vals, n=4, method="inclusive")
    else:
        q1 = q3 = vals[0]
    return Stats(n=len(vals), mean=statistics.fmean(vals), median=statistics.median(vals),
                 min=min(vals), max=max(vals),
                 stdev=statistics.stdev(vals) if len(vals) > 1 else None,
                 q1=q1, q3=q3, iqr=q3 - q1)


def tokens_per_sec_per_gpu(step_time_ms: float, seq_length: int, global_batch_size: int,
                           num_gpus: int) -> float:
    """seq · GBS / (step time in s · GPUs) (§11 'time')."""
    return seq_length * global_batch_size / (step_time_ms / 1000.0 * num_gpus)


def _flatten_config(cfg: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """A resolved ConfigContainer (nested or dotted) as last-key -> printed values."""
    out: dict[str, list[str]] = {}

    def walk(value: Any, key: str) -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list | tuple):
            out.setdefault(key, []).append(",".join(str(v) for v in value))
        else:
            out.setdefault(key.rsplit(".", 1)[-1], []).append(
                "null" if value is None else str(value))

    if cfg:
        walk(cfg, "")
    return out


def _values(key: str, resolved: dict[str, list[str]], logged: dict[str, list[str]]) -> list[str]:
    vals = resolved.get(key) or logged.get(key) or []
    return [v.strip().strip("'\"").lower() for v in vals]


def _precision_from_recipe(resolved: dict[str, list[str]],
                           logged: dict[str, list[str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in _values("mixed_precision", resolved, logged):
        recipe = MIXED_PRECISION_RECIPES.get(name)
        if recipe:
            for k in ("fp8", "fp8_recipe", "fp4", "fp4_recipe"):
                if recipe.get(k):
                    out[k] = str(recipe[k]).lower()
    return out


@dataclass
class _Probe:
    """What a feature check reads: the log, the config values (resolved first, else printed)
    and the contradictions found so far (fallback lines of the feature's family)."""

    feature: str
    family: str
    parsed: ParsedLog
    findings: list[LogFinding]
    resolved: dict[str, list[str]]
    logged: dict[str, list[str]]
    source: str
    against: list[str]
    window_start: int

    def config(self, key: str) -> list[str]:
        return _values(key, self.resolved, self.logged)

    def answer(self, evidenced: bool, evidence: list[str], detail: str) -> FeatureEvidence:
        return FeatureEvidence(feature=self.feature, evidenced=evidenced, evidence=evidence,
                               against=self.against, detail=detail)


def _feature(feature: str, parsed: ParsedLog, resolved: dict[str, list[str]],
             window_start: int) -> FeatureEvidence:
    """Evidence for or against one requested feature: fallback lines that negate its family,
    then the check of its family (CUDA graphs, dispatcher, FP8/FP4, an on/off switch)."""
    findings = parsed.findings
    family = ("flex" if feature.startswith("flex") else
              "ep_overlap" if feature == "ep_overlap" else feature)
    probe = _Probe(
        feature=feature, family=family, parsed=parsed, findings=findings, resolved=resolved,
        logged=parsed.config, source="resolved config" if resolved else "printed config",
        against=[f"{f.id}: {f.line}" for f in findings
                 if f.kind == "fallback" and family in f.negates],
        window_start=window_start)
    if feature == "cuda_graph":
        return _cuda_graph_evidence(probe)
    if family == "flex" or feature.startswith("dispatcher:"):
        return _dispatcher_evidence(probe)
    if feature.startswith(("fp8", "fp4")):
        return _low_precision_evidence(probe)
    return _switch_evidence(probe)


def _cuda_graph_evidence(probe: _Probe) -> FeatureEvidence:
    """A graph-capture line before the window with iteration lines after it: the config alone
    does not show that graphs were captured, and a capture inside the window is timed."""
    evidence: list[str] = []
    impl = [v for v in probe.config("cuda_graph_impl") if v not in _OFF]
    if impl:
        evidence.append(f"{probe.source}: cuda_graph_impl={impl[-1]}")
    captures = [f for f in probe.findings if f.kind == "capture"]
    if not captures:
        return probe.answer(
            False, evidence,
            "no graph-capture line ('Creating N CUDA graphs' / '> built N cuda "
            "graph(s) in …') in the log: nothing shows the graphs were captured")
    first = min(captures, key=lambda f: f.after_rows)
    evidence += [f"{f.id}: {f.line}" for f in captures]
    parsed = probe.parsed
    before = parsed.row_iteration(first.after_rows - 1) if first.after_rows else None
    capture_it = (before or 0) + 1
    after = parsed.iteration_lines - first.after_rows
    if after < 1:
        return probe.answer(
            False, evidence,
            "graphs were captured but no iteration ran after the capture: no "
            "evidence that they were replayed")
    if capture_it >= probe.window_start:
        return probe.answer(
            False, evidence,
            f"graphs were captured during iteration ~{capture_it}, inside the window "
            f"(starts at {probe.window_start}): the capture step is timed; start the "
            "window later")
    evidence.append(f"{after} iteration line(s) after the capture (Megatron-Core replays "
                    "captured graphs on every later step)")
    return probe.answer(
        not probe.against, evidence,
        f"captured during iteration ~{capture_it}, before the window; "
        f"{after} iterations ran after it")


def _dispatcher_evidence(probe: _Probe) -> FeatureEvidence:
    """The token dispatcher type (and flex backend) in the config; a null flex backend is a
    contradiction because Bridge silently resets flex to alltoall."""
    feature, source, against = probe.feature, probe.source, probe.against
    evidence: list[str] = []
    want_type = "flex" if probe.family == "flex" else feature.split(":", 1)[1]
    want_backend = feature.split(":", 1)[1] if feature.startswith("flex:") else None
    types = probe.config("moe_token_dispatcher_type")
    backends = probe.config("moe_flex_dispatcher_backend")
    if want_type in types:
        evidence.append(f"{source}: moe_token_dispatcher_type={want_type}")
    ok = want_type in types
    if probe.family == "flex":
        if backends and all(b in _OFF for b in backends):
            against.append("moe_flex_dispatcher_backend is null: Bridge silently resets flex "
                           "to alltoall (I2)")
        if want_backend:
            ok = ok and want_backend in backends
            if want_backend in backends:
                evidence.append(f"{source}: moe_flex_dispatcher_backend={want_backend}")
            elif backends:
                against.append(f"{source}: moe_flex_dispatcher_backend={backends[-1]}")
    if types and want_type not in types:
        against.append(f"{source}: moe_token_dispatcher_type={types[-1]}")
    return _decide(feature, ok, evidence, against)


def _low_precision_evidence(probe: _Probe) -> FeatureEvidence:
    """FP8 / FP4 on in the config or through a named mixed-precision recipe, and the scaling
    recipe when the feature names one."""
    feature, source, against = probe.feature, probe.source, probe.against
    evidence: list[str] = []
    kind = feature[:3]
    from_recipe = _precision_from_recipe(probe.resolved, probe.logged)
    on = [v for v in probe.config(kind) if v not in _OFF] + (
        [from_recipe[kind]] if kind in from_recipe else [])
    ok = bool(on)
    if on:
        evidence.append(f"{source}: {kind}={on[-1]}")
    if ":" in feature:
        want = feature.split(":", 1)[1]
        recipes = probe.config(f"{kind}_recipe") + (
            [from_recipe[f"{kind}_recipe"]] if f"{kind}_recipe" in from_recipe else [])
        ok = ok and want in recipes
        if want in recipes:
            evidence.append(f"{source}: {kind}_recipe={want}")
        elif recipes:
            against.append(f"{source}: {kind}_recipe={recipes[-1]}")
    return _decide(feature, ok, evidence, against)


def _switch_evidence(probe: _Probe) -> FeatureEvidence:
    """An on/off switch (overlaps, delayed wgrad) printed as true in the config."""
    evidence: list[str] = []
    key = {"ep_overlap": "overlap_moe_expert_parallel_comm"}.get(probe.feature, probe.feature)
    vals = probe.config(key)
    ok = any(v in _ON for v in vals)
    if ok:
        evidence.append(f"{probe.source}: {key}=true")
    elif vals:
        probe.against.append(f"{probe.source}: {key}={vals[-1]}")
    return _decide(probe.feature, ok, evidence, probe.against)


def _decide(feature: str, positive: bool, evidence: list[str],
            against: list[str]) -> FeatureEvidence:
    if against:
        detail = "contradicted: " + "; ".join(against)
    elif positive:
        detail = "the configuration printed in the log (or given) shows it on, and no fallback " \
                 "line says otherwise"
    else:
        detail = ("no evidence in the log that it ran (no fallback line either, which alone "
                  "proves nothing); pass the saved ConfigContainer YAML as resolved_config or "
                  "let the run print its config")
    return FeatureEvidence(feature=feature, evidenced=positive and not against,
                           evidence=evidence, against=against, detail=detail)


def _memory_peak(reports: list[MemoryReport]) -> tuple[MemoryPeak | None, str | None]:
    if not reports:
        return None, "no '[Rank r] (after N iterations) memory (GB)' lines: peak memory unknown"
    late = [r for r in reports if r.after_iterations >= 2]
    use = late or reports
    note = None if late else ("memory reported only after iteration 1 (before optimizer state "
                              "exists): the peak may be low")

    def peak(names: tuple[str, ...]) -> tuple[float | None, int | None, str]:
        for name in names:
            vals = [(r.get(name), r.rank) for r in use if r.get(name) is not None]
            if vals:
                v, rank = max(vals, key=lambda x: (x[0], -x[1]))
                return v, rank, name
        return None, None, names[0]

    alloc, alloc_rank, alloc_key = peak(("max-allocated", "allocated"))
    res, res_rank, _ = peak(("max-reserved", "reserved"))
    retries = [r.alloc_retries for r in use if r.alloc_retries is not None]
    return MemoryPeak(
        peak_allocated_gb=alloc, peak_allocated_gib=None if alloc is None else alloc * GIB_PER_GB,
        peak_allocated_bytes=None if alloc is None else round(alloc * 1e9),
        peak_allocated_rank=alloc_rank, peak_reserved_gb=res,
        peak_reserved_gib=None if res is None else res * GIB_PER_GB,
        peak_reserved_bytes=None if res is None else round(res * 1e9), peak_reserved_rank=res_rank,
        report_iteration=max(r.after_iterations for r in use),
        ranks_reporting=len({r.rank for r in use}), alloc_retries=max(retries) if retries else None,
        allocated_key=f"mem-{alloc_key}-gigabytes"), note


def _window_gate(rows: list[Iteration], start: int, end: int,
                 interval: int | None) -> tuple[bool, str]:
    logged = {r.iteration for r in rows}
    k = interval or 1
    if k > 1:
        if (start - 1) % k or end % k:
            return False, (f"log_interval={k}: the interval lines do not tile iterations "
                           f"{start}-{end}; set logger.log_interval=1 (or a window aligned to "
                           f"{k})")
        expected = set(range(start + k - 1, end + 1, k))
    else:
        expected = set(range(start, end + 1))
    missing = sorted(expected - logged)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
        return False, f"{len(missing)} window iteration(s) not logged: {shown}"
    return True, (f"iterations {start}-{end} logged" + (f" (every {k})" if k > 1 else ""))


def _check_evaluate_args(start: int, end: int, regression_pct: float,
                         golden_tflops: float | None, sizes: dict[str, int | None]) -> None:
    """Refuse a window, threshold, golden value or shape that cannot be judged."""
    if not (1 <= start <= end):
        raise ValueError(f"window {start}-{end}: need 1 <= start <= end (1-based iterations)")
    if regression_pct <= 0:
        raise ValueError("regression_pct must be > 0")
    if golden_tflops is not None and not golden_tflops > 0:
        raise ValueError("golden_tflops must be > 0")
    for name, v in sizes.items():
        if v is not None and v < 1:
            raise ValueError(f"{name} must be >= 1")


def _run_gates(rows: list[Iteration], last: Iteration | None, completed: bool,
               max_it: int | None, interval: int | None, start: int,
               end: int) -> tuple[list[Gate], bool]:
    """Gates 1-3: the run finished, ran enough steps and logged the whole window; also whether
    the window is usable at all (the steps ran and were logged)."""
    gates: list[Gate] = []
    if completed:
        how = (f"iteration {last.iteration}/{last.total} reached" if last is not None and
               last.iteration >= last.total else "an exit marker was printed")
        gates.append(Gate(name="completed", passed=True, detail=how))
    else:
        gates.append(Gate(name="completed", passed=False, detail=(
            "the log ends at iteration " + (f"{last.iteration}/{last.total}" if last else "0")
            + " with no exit marker")))
    ran = max_it or 0
    steps_ok = ran >= end
    gates.append(Gate(name="steps", passed=steps_ok,
                      detail=f"{ran} iteration(s) ran; the window needs {end}"))
    if steps_ok:
        ok, detail = _window_gate(rows, start, end, interval)
    else:
        ok, detail = False, f"iteration {end} was never reached"
    gates.append(Gate(name="window_logged", passed=ok, detail=detail))
    return gates, steps_ok and ok


def _numeric_gates(rows: list[Iteration]) -> tuple[list[Gate], int, int]:
    """Gates 4-6 inside the window: finite losses, no skipped and no NaN iterations; also the
    window's skipped and NaN sums."""
    bad = _nonfinite(rows)
    skipped = sum(r.skipped_iterations for r in rows)
    nans = sum(r.nan_iterations for r in rows)
    gates = [
        Gate(name="loss_finite", passed=not bad and bool(rows), detail=(
            "; ".join(bad[:10]) if bad
            else "every window loss and grad norm is finite" if rows else "no window iteration")),
        Gate(name="no_skipped_iterations", passed=skipped == 0,
             detail=f"{skipped} skipped iteration(s) summed over the window"),
        Gate(name="no_nan_iterations", passed=nans == 0,
             detail=f"{nans} NaN iteration(s) summed over the window"),
    ]
    return gates, skipped, nans


def _run_notes(parsed: ParsedLog, outcome: Outcome, completed: bool, end: int) -> list[str]:
    """Caveats a reader needs besides the gates: an error despite completion, a screening
    window, restarts, unreadable lines, a cut-off last line."""
    notes: list[str] = []
    if outcome in ("oom", "timeout", "flaky", "config_error", "failed") and completed:
        notes.append("an error line was printed although the run completed")
    if end < MIN_FINAL_STEPS:
        notes.append(f"screening measurement: the window ends at {end} < {MIN_FINAL_STEPS}; a "
                     "final measurement needs >= 50 steps with window 41-50")
    if parsed.restarts:
        notes.append(f"the iteration number went backwards {parsed.restarts} time(s) (resume or "
                     "a second run in one log); the last occurrence of each iteration is used")
    if parsed.malformed:
        notes.append(f"{parsed.malformed} iteration line(s) could not be read (broken by another "
                     f"rank's output?): {parsed.malformed_examples[0]}")
    if parsed.truncated_tail:
        notes.append(f"the log ends mid-line: {parsed.truncated_tail!r}")
    return notes


def evaluate(
    parsed: ParsedLog,
    *,
    window: tuple[int, int] = (41, 50),
    golden_tflops: float | None = None,
    regression_pct: float = 5.0,
    requested_features: Sequence[str] = (),
    num_gpus: int | None = None,
    seq_length: int | None = None,
    global_batch_size: int | None = None,
    resolved_config: Mapping[str, Any] | None = None,
    exit_code: int | None = None,
) -> BenchmarkResult:
    """Judge a parsed log against the measurement rules. ``resolved_config`` (the saved
    ConfigContainer, nested or dotted) is stronger feature evidence than the config printed in
    the log; ``exit_code`` (from the scheduler) refines the outcome of a run that did not
    finish (9 = OOM-killed, 143 = SIGTERM). Raises ValueError for bad arguments."""
    start, end = window
    _check_evaluate_args(start, end, regression_pct, golden_tflops, {
        "num_gpus": num_gpus, "seq_length": seq_length, "global_batch_size": global_batch_size})
    features = list(dict.fromkeys(canonical_feature(f) for f in requested_features))

    rows = parsed.window(start, end)
    findings = parsed.findings
    max_it = parsed.max_iteration
    last = parsed.last_row()
    completed = parsed.completed
    interval = parsed.log_interval
    gates, window_ok = _run_gates(rows, last, completed, max_it, interval, start, end)
    numeric, skipped, nans = _numeric_gates(rows)
    gates += numeric
    resolved = _flatten_config(resolved_config)
    evidence = [_feature(f, parsed, resolved, start) for f in features]
    gates += [Gate(name=f"feature:{ev.feature}", passed=ev.evidenced, detail=ev.detail)
              for ev in evidence]

    notes: list[str] = []
    per_step, metrics = _metrics(parsed, rows, seq_length, global_batch_size, num_gpus, notes)
    metrics.skipped_iterations, metrics.nan_iterations = skipped, nans
    memory, mem_note = _memory_peak(parsed.memory)
    if mem_note:
        notes.append(mem_note)
    regression = (None if golden_tflops is None
                  else _regression(metrics, golden_tflops, regression_pct))
    errors = [f for f in findings if f.kind == "error"]
    outcome = _outcome(completed, window_ok, gates, errors, rows, regression, exit_code,
                       parsed)
    notes += _run_notes(parsed, outcome, completed, end)
    return BenchmarkResult(
        outcome=outcome, outcome_meaning=OUTCOME_MEANING[outcome],
        valid=all(g.passed for g in gates),
        measurement="screening" if end < MIN_FINAL_STEPS else "final",
        window_start=start, window_end=end, steps_completed=max_it,
        steps_requested=last.total if last else None, iteration_lines=parsed.iteration_lines,
        log_interval=interval, gates=gates, metrics=metrics, memory=memory,
        theoretical_memory=parsed.theoretical, regression=regression, features=evidence,
        fallbacks=[f for f in findings if f.kind == "fallback"],
        warnings=[f for f in findings if f.kind == "warning"], errors=errors,
        error_excerpt=_excerpt(errors, outcome), per_step=per_step, notes=notes,
        source=parsed.source)


def _nonfinite(rows: list[Iteration]) -> list[str]:
    """Window iterations whose losses are not all finite numbers. Megatron omits a loss whose
    interval average is not > 0 (a NaN among them), so a loss missing from one line that the
    others print counts too — unless the line's own skipped / NaN counters explain it."""
    names = {k for r in rows for k in r.losses}
    out = []
    for r in rows:
        what = [k for k, v in r.losses.items() if not math.isfinite(v)]
        if r.grad_norm is not None and not math.isfinite(r.grad_norm):
            what.append("grad norm")
        if not (r.skipped_iterations or r.nan_iterations):
            what += [f"{k} missing" for k in sorted(names - set(r.losses))]
        if what:
            out.append(f"iteration {r.iteration}: {', '.join(what)}")
    return out


def _metrics(parsed: ParsedLog, rows: list[Iteration], seq: int | None, gbs: int | None,
             gpus: int | None, notes: list[str]) -> tuple[list[StepRow], WindowMetrics]:
    tflops: list[float | None] = [r.tflops_per_gpu for r in rows]
    source: Literal["iteration line", "Step Time line"] | None = "iteration line"
    if rows and any(t is None for t in tflops):
        steps = parsed.step_tflops
        if len(steps) == parsed.iteration_lines and steps:
            tflops = [steps[r.row] for r in rows]
            source = "Step Time line"
        else:
            tflops, source = [None] * len(rows), None
            notes.append("no TFLOP/s/GPU for the window: pass logger.log_throughput=true (the "
                         "Step Time lines, if any, cannot be matched to iterations)")
    tokens_note = None
    if seq is None or gpus is None:
        tokens_note = "tokens/s/GPU needs seq_length and num_gpus"
    per_step = []
    for r, tf in zip(rows, tflops, strict=True):
        b = gbs or r.global_batch_size
        tok = None
        if seq and gpus and b and r.elapsed_ms > 0:
            tok = tokens_per_sec_per_gpu(r.elapsed_ms, seq, b, gpus)
        per_step.append(StepRow(
            iteration=r.iteration, step_time_ms=r.elapsed_ms, tflops_per_gpu=tf,
            tokens_per_sec_per_gpu=tok, losses=r.losses, grad_norm=r.grad_norm,
            skipped_iterations=r.skipped_iterations, nan_iterations=r.nan_iterations))
    if rows and tokens_note is None and any(s.tokens_per_sec_per_gpu is None for s in per_step):
        tokens_note = "global batch size unknown for some window iterations"
    names = list(dict.fromkeys(k for r in rows for k in r.losses))
    losses_mean = {}
    for n in names:
        vals = [r.losses[n] for r in rows if n in r.losses]
        losses_mean[n] = statistics.fmean(vals) if vals else math.nan
    metrics = WindowMetrics(
        step_time_ms=stats([s.step_time_ms for s in per_step]),
        tflops_per_gpu=stats([t for t in tflops if t is not None]),
        tflops_source=source if rows and any(t is not None for t in tflops) else None,
        tokens_per_sec_per_gpu=stats([s.tokens_per_sec_per_gpu for s in per_step
                                      if s.tokens_per_sec_per_gpu is not None]),
        tokens_note=tokens_note, losses_last=dict(rows[-1].losses) if rows else {},
        losses_mean=losses_mean)
    return per_step, metrics


def _regression(metrics: WindowMetrics, golden: float, threshold: float) -> Regression:
    tf = metrics.tflops_per_gpu
    if tf is None:
        return Regression(golden_tflops=golden, measured_tflops=None, delta_pct=None,
                          threshold_pct=threshold, passed=None,
                          detail="the window has no TFLOP/s/GPU to compare")
    delta = (tf.mean - golden) / golden * 100.0
    # a hair of tolerance so that exactly -5.0 % (after float rounding) counts as within 5 %
    passed = delta >= -threshold - 1e-9
    if not passed:
        detail = (f"{tf.mean:.2f} TFLOP/s/GPU is {-delta:.2f} % below the golden {golden:g} "
                  f"(threshold {threshold:g} %): regression")
    elif delta > threshold + 1e-9:
        detail = (f"{tf.mean:.2f} TFLOP/s/GPU is {delta:.2f} % above the golden {golden:g}: "
                  "faster than the threshold allows; update the golden value")
    else:
        detail = f"{tf.mean:.2f} TFLOP/s/GPU is within {threshold:g} % of the golden {golden:g}"
    return Regression(golden_tflops=golden, measured_tflops=tf.mean, delta_pct=delta,
                      threshold_pct=threshold, passed=passed, detail=detail)


def _outcome(completed: bool, window_ok: bool, gates: list[Gate], errors: list[LogFinding],
             rows: list[Iteration], regression: Regression | None, exit_code: int | None,
             parsed: ParsedLog) -> Outcome:
    ids = {f.id for f in errors}
    passed = {g.name: g.passed for g in gates}
    if not completed:
        if "oom" in ids or exit_code == 9:
            return "oom"
        if "timeout" in ids or exit_code == 143:
            return "timeout"
        if "flaky" in ids:
            # the rerun machine's "found NaN in …" is a flaky signature, but a NaN it is
            flaky = [f for f in errors if f.id == "flaky"]
            if all("found NaN in" in f.line for f in flaky):
                return "nan_loss"
            return "flaky"
        if "config_error" in ids and parsed.iteration_lines == 0:
            return "config_error"
        if ids or exit_code not in (None, 0):
            return "failed"
        return "truncated"
    if not window_ok:
        return "invalid_window"
    if not (passed["loss_finite"] and passed["no_nan_iterations"]):
        return "nan_loss"
    if not passed["no_skipped_iterations"]:
        return "skipped_iterations"
    if not all(p for n, p in passed.items() if n.startswith("feature:")):
        return "feature_missing"
    if regression is not None and regression.passed is False:
        return "regression"
    return "pass"


def _excerpt(errors: list[LogFinding], outcome: str) -> str | None:
    if not errors:
        return None
    order = {"oom": 0, "timeout": 1, "flaky": 2, "config_error": 3, "failed": 4}
    first = min(errors, key=lambda f: (f.id != outcome, order.get(f.id, 9), f.after_rows))
    return first.line


def evaluate_run(parsed: ParsedLog, contract: MeasurementContract, *,
                 golden_tflops: float | None = None, regression_pct: float = 5.0,
                 resolved_config: Mapping[str, Any] | None = None,
                 exit_code: int | None = None) -> BenchmarkResult:
    """``evaluate`` with the window, shape and requested features taken from the contract."""
    return evaluate(
        parsed, window=(contract.window.start, contract.window.end), golden_tflops=golden_tflops,
        regression_pct=regression_pct, requested_features=features_from_contract(contract),
        num_gpus=contract.hardware.num_gpus, seq_length=contract.workload.seq_length,
        global_batch_size=contract.workload.global_batch_size, resolved_config=resolved_config,
        exit_code=exit_code)


# --- evidence bundle and Markdown ------------------------------------------------------------

EVIDENCE_SCHEMA = "mbridge-perf/benchmark-evidence/v1"


def _contract_checks(result: BenchmarkResult, contract: MeasurementContract) -> list[str]:
    out = []
    w = contract.window
    if (w.start, w.end) != (result.window_start, result.window_end):
        out.append(f"the result was judged on iterations {result.window_start}-"
                   f"{result.window_end} but the contract declares {w.start}-{w.end}")
    if w.steps is not None and result.steps_requested not in (None, w.steps):
        out.append(f"the log ran {result.steps_requested} iterations, the contract asks "
                   f"for {w.steps}")
    if contract.label == "benchmark-only":
        out.append("benchmark-only: never use this run as convergence or production evidence")
    return out


def evidence_bundle(result: BenchmarkResult,
                    contract: MeasurementContract | None = None) -> dict[str, Any]:
    """Everything needed to trust (or reject) the number, as strict-JSON data (a NaN loss is
    the string "NaN", never a bare NaN token)."""
    return {
        "schema": EVIDENCE_SCHEMA,
        "outcome": result.outcome,
        "valid": result.valid,
        "label": contract.label if contract else None,
        "contract_checks": _contract_checks(result, contract) if contract else [],
        "result": json.loads(result.model_dump_json()),
        "contract": json.loads(contract.model_dump_json()) if contract else None,
    }


def _f(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "–"
    if not math.isfinite(v):
        return str(v)
    return f"{v:,.{digits}f}"


def render_markdown(result: BenchmarkResult, contract: MeasurementContract | None = None) -> str:
    """The evidence bundle for a reader: verdict, gates, window metrics, memory, regression,
    features, fallback lines and the contract."""
    r = result
    label = f"; label: {contract.label}" if contract else ""
    out = [f"## Benchmark result: {r.outcome} ({'valid' if r.valid else 'NOT valid'}, "
           f"{r.measurement} measurement)", "",
           f"{r.outcome_meaning}.", "",
           f"Window: iterations {r.window_start}–{r.window_end} of "
           f"{r.steps_requested if r.steps_requested is not None else '?'} "
           f"(warm-up {r.window_start - 1} excluded); ran {r.steps_completed or 0}; "
           f"log interval {r.log_interval or '?'}{label}. Source: `{r.source}`.", "",
           "| gate | result | detail |", "|---|---|---|"]
    out += [f"| {g.name} | {'pass' if g.passed else 'FAIL'} | {_md(g.detail)} |" for g in r.gates]
    m = r.metrics
    out += ["", f"### Steady-window metrics (iterations {r.window_start}–{r.window_end})", "",
            "| metric | median | mean | min | max | stdev | IQR | n |",
            "|---|---|---|---|---|---|---|---|"]
    for name, st, digits in (
            ("step time (ms)", m.step_time_ms, 1),
            (f"TFLOP/s/GPU ({m.tflops_source or 'n/a'})", m.tflops_per_gpu, 1),
            ("tokens/s/GPU", m.tokens_per_sec_per_gpu, 0)):
        if st is None:
            out.append(f"| {name} | – | – | – | – | – | – | 0 |")
        else:
            out.append(f"| {name} | {_f(st.median, digits)} | {_f(st.mean, digits)} | "
                       f"{_f(st.min, digits)} | {_f(st.max, digits)} | {_f(st.stdev, digits)} | "
                       f"{_f(st.iqr, digits)} | {st.n} |")
    if m.tokens_note:
        out.append(f"\n{m.tokens_note}.")
    if m.losses_last:
        out.append("\nLosses at the last window iteration: " + ", ".join(
            f"{k} {v:.6g}" for k, v in m.losses_last.items()) + f"; skipped "
            f"{m.skipped_iterations}, NaN {m.nan_iterations} (window sums).")
    out += ["", "### Memory", ""]
    if r.memory is None:
        out.append("No memory lines in the log.")
    else:
        mem = r.memory
        out.append(f"Peak allocated {_f(mem.peak_allocated_gb, 3)} GB = "
                   f"{_f(mem.peak_allocated_gib, 3)} GiB on rank {mem.peak_allocated_rank}; "
                   f"peak reserved {_f(mem.peak_reserved_gb, 3)} GB = "
                   f"{_f(mem.peak_reserved_gib, 3)} GiB on rank {mem.peak_reserved_rank} "
                   f"(after iteration {mem.report_iteration}, {mem.ranks_reporting} rank(s) "
                   f"reporting; the log prints decimal GB)."
                   + (f" Allocation retries: {mem.alloc_retries}." if mem.alloc_retries else ""))
    if r.theoretical_memory:
        t = r.theoretical_memory
        out.append(f"Theoretical (Bridge estimator, MiB): weight and optimizer "
                   f"{_f(t.weight_and_optimizer_mib, 1)}"
                   + (f", activation {_f(t.activation_mib, 1)}" if t.activation_mib else "")
                   + (f", total {_f(t.total_mib, 1)}" if t.total_mib else "") + ".")
    if r.regression:
        g = r.regression
        verdict = {True: "pass", False: "REGRESSION", None: "not measured"}[g.passed]
        out += ["", "### Regression against the golden value", "",
                f"Golden {g.golden_tflops:g} TFLOP/s/GPU; measured (window mean) "
                f"{_f(g.measured_tflops)}; delta {_f(g.delta_pct)} % (threshold "
                f"{g.threshold_pct:g} %): {verdict}. {g.detail}."]
    if r.features:
        out += ["", "### Feature evidence", "", "| feature | evidenced | evidence | against |",
                "|---|---|---|---|"]
        out += [f"| {f.feature} | {'yes' if f.evidenced else 'NO'} | "
                f"{_md('; '.join(f.evidence) or '–')} | {_md('; '.join(f.against) or '–')} |"
                for f in r.features]
    lines = [*r.fallbacks, *r.warnings, *r.errors]
    if lines:
        out += ["", "### Fallback, warning and error lines", ""]
        out += [f"- {f.kind} {f.id} (×{f.count}): {f.meaning} — `{_code(f.line)}`" for f in lines]
    if r.notes:
        out += ["", "### Notes", ""] + [f"- {n}" for n in r.notes]
    if contract is not None:
        out += ["", "### Measurement contract", "", _contract_table(contract)]
        checks = _contract_checks(r, contract)
        if checks:
            out += [""] + [f"- {c}" for c in checks]
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return text.replace("`", "'")


def _contract_table(c: MeasurementContract) -> str:
    lay = c.layout
    rows = [
        ("label", c.label + (f" ({'; '.join(c.label_reasons)})" if c.label_reasons else "")),
        ("versions", ", ".join(f"{k}={v}" for k, v in c.versions.model_dump().items() if v)
         or "not recorded"),
        ("hardware", f"{c.hardware.num_gpus} x {c.hardware.gpu or '?'} "
                     f"({c.hardware.gpus_per_node or '?'}/node, {c.hardware.nodes or '?'} node(s))"
                     + (f", {c.hardware.topology}" if c.hardware.topology else "")),
        ("launcher", c.launcher),
        ("environment", ", ".join(f"{k}={v}" for k, v in c.environment.items()) or "–"),
        ("workload", f"{c.workload.model or '?'} {c.workload.task or ''} data={c.workload.data} "
                     f"seq={c.workload.seq_length} MBS={c.workload.micro_batch_size} "
                     f"GBS={c.workload.global_batch_size} optimizer={c.workload.optimizer}"),
        ("layout", f"TP{lay.tp} PP{lay.pp} VPP{lay.vpp or 1} CP{lay.cp} EP{lay.ep} ETP{lay.etp} "
                   f"DP{lay.dp} EDP{lay.edp} SP={lay.sequence_parallel}"),
        ("precision", f"{c.precision.recipe or c.precision.compute}"
                      + (f", fp8={c.precision.fp8}/{c.precision.fp8_recipe}"
                         if c.precision.fp8 else "")
                      + (f", fp4={c.precision.fp4}" if c.precision.fp4 else "")),
        ("recompute", str(c.recompute.model_dump(exclude_none=True) or "none")),
        ("dispatcher", f"{c.dispatcher.type or '–'}"
                       + (f" + {c.dispatcher.backend}" if c.dispatcher.backend else "")),
        ("overlap", ", ".join(k for k, v in c.overlap.model_dump().items() if v) or "none"),
        ("CUDA graphs", c.cuda_graphs.impl + (f" {c.cuda_graphs.modules}"
                                              if c.cuda_graphs.modules else "")),
        ("window", f"{c.window.start}–{c.window.end} of {c.window.steps or '?'} steps"),
    ]
    if c.routing is not None:
        rows.insert(8, ("routing", f"force_load_balancing={c.routing.force_load_balancing}, "
                                   f"{c.routing.load_balancing_type}, top-{c.routing.topk}"))
    return "\n".join(["| field | value |", "|---|---|"]
                     + [f"| {k} | {_md(str(v))} |" for k, v in rows])


# --- A/B comparison --------------------------------------------------------------------------

class MetricDelta(_Measured):
    metric: str
    unit: str
    a: float | None
    b: float | None
    delta: float | None = Field(description="b - a")
    delta_pct: float | None = Field(description="(b - a) / a · 100")
    better: Literal["a", "b", "same"] | None = None


class Comparison(_Measured):
    valid: bool = Field(description="a one-variable A/B between two valid runs")
    reasons: list[str] = Field(description="why it is not a valid A/B (empty when valid)")
    variable: str | None = Field(description="the one variable that differs, when exactly one")
    variables: list[str] = Field(description="every independent variable that differs")
    differences: list[ContractDifference] = Field(description="every differing contract field")
    deltas: list[MetricDelta]
    a_outcome: str
    b_outcome: str
    a_label: str
    b_label: str
    notes: list[str]


def _delta(metric: str, unit: str, a: float | None, b: float | None,
           higher_is_better: bool) -> MetricDelta:
    if a is None or b is None:
        return MetricDelta(metric=metric, unit=unit, a=a, b=b, delta=None, delta_pct=None)
    d = b - a
    pct = d / a * 100.0 if a else None
    better: Literal["a", "b", "same"] = "same" if d == 0 else (
        "b" if (d > 0) == higher_is_better else "a")
    return MetricDelta(metric=metric, unit=unit, a=a, b=b, delta=d, delta_pct=pct, better=better)


def _median(s: Stats | None) -> float | None:
    return None if s is None else s.median


def compare(a: tuple[MeasurementContract, BenchmarkResult],
            b: tuple[MeasurementContract, BenchmarkResult]) -> Comparison:
    """A/B of two runs: valid only when both runs are valid, carry the same label and their
    contracts differ in exactly one variable. The deltas are reported either way (b − a)."""
    (ca, ra), (cb, rb) = a, b
    differences = diff(ca, cb)
    vars_ = variables(differences)
    reasons: list[str] = []
    notes: list[str] = []
    if not vars_:
        reasons.append("the contracts are identical: this is a repeat run (a noise estimate), "
                       "not an A/B of a variable")
    elif len(vars_) > 1:
        reasons.append(f"the contracts differ in {len(vars_)} variables "
                       f"({', '.join(vars_)}); an A/B changes exactly one — the extra "
                       f"difference(s): {', '.join(vars_[1:])}")
    if ca.label != cb.label:
        reasons.append(f"one run is {ca.label}, the other {cb.label}: the two acceptance "
                       "classes are never mixed")
    for name, c, r in (("a", ca, ra), ("b", cb, rb)):
        if not r.valid:
            failed = ", ".join(g.name for g in r.gates if not g.passed)
            reasons.append(f"run {name} is not valid ({r.outcome}: {failed})")
        if (c.window.start, c.window.end) != (r.window_start, r.window_end):
            reasons.append(f"run {name} was judged on iterations {r.window_start}-"
                           f"{r.window_end}, not its contract window {c.window.start}-"
                           f"{c.window.end}")
    ma, mb = ra.metrics, rb.metrics
    deltas = [
        _delta("step_time_ms", "ms (median)", _median(ma.step_time_ms), _median(mb.step_time_ms),
               higher_is_better=False),
        _delta("tflops_per_gpu", "TFLOP/s/GPU (median)", _median(ma.tflops_per_gpu),
               _median(mb.tflops_per_gpu), higher_is_better=True),
        _delta("tokens_per_sec_per_gpu", "tokens/s/GPU (median)",
               _median(ma.tokens_per_sec_per_gpu), _median(mb.tokens_per_sec_per_gpu),
               higher_is_better=True),
        _delta("peak_allocated_gib", "GiB",
               ra.memory.peak_allocated_gib if ra.memory else None,
               rb.memory.peak_allocated_gib if rb.memory else None, higher_is_better=False),
        _delta("peak_reserved_gib", "GiB", ra.memory.peak_reserved_gib if ra.memory else None,
               rb.memory.peak_reserved_gib if rb.memory else None, higher_is_better=False),
    ]
    if ra.memory and rb.memory and ra.memory.peak_allocated_rank != rb.memory.peak_allocated_rank:
        notes.append(f"the allocated peak is on rank {ra.memory.peak_allocated_rank} in a and "
                     f"rank {rb.memory.peak_allocated_rank} in b; §11 compares the same rank")
    if ma.tflops_source and mb.tflops_source and ma.tflops_source != mb.tflops_source:
        notes.append("TFLOP/s comes from different log lines in a and b")
    if "precision" in vars_:
        notes.append("precision differs: compare absolute TFLOP/s, not MFU (§11 rule 7)")
    return Comparison(
        valid=not reasons, reasons=reasons, variable=vars_[0] if len(vars_) == 1 else None,
        variables=vars_, differences=differences, deltas=deltas, a_outcome=ra.outcome,
        b_outcome=rb.outcome, a_label=ca.label, b_label=cb.label, notes=notes)


def render_comparison(c: Comparison) -> str:
    """A readable A/B summary."""
    head = (f"## A/B: {c.variable} ({'valid' if c.valid else 'NOT a valid A/B'})"
            if c.variable else f"## A/B ({'valid' if c.valid else 'NOT a valid A/B'})")
    out = [head, ""]
    out += [f"- {r}" for r in c.reasons]
    out += ["", "| metric | a | b | b − a | % |", "|---|---|---|---|---|"]
    out += [f"| {d.metric} ({d.unit}) | {_f(d.a)} | {_f(d.b)} | {_f(d.delta)} | "
            f"{_f(d.delta_pct)} |" for d in c.deltas]
    if c.differences:
        out += ["", "Contract differences:", ""]
        out += [f"- `{d.field}`: {d.a!r} → {d.b!r}" for d in c.differences]
    out += [f"- note: {n}" for n in c.notes]
    return "\n".join(out) + "\n"
