"""Benchmark results: every validity gate and outcome class, steady-window metrics and their
arithmetic, regression edges, feature evidence, the evidence bundle and Markdown, and compare()
accepting only one-variable A/Bs between valid runs."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from logmaker import line

from mbridge_perf.bench.contract import MeasurementContract, contract_from_config
from mbridge_perf.bench.logparse import GIB_PER_GB, parse_log
from mbridge_perf.bench.result import (
    BenchmarkResult,
    canonical_feature,
    compare,
    evaluate,
    evaluate_run,
    evidence_bundle,
    features_from_contract,
    render_comparison,
    render_markdown,
    tokens_per_sec_per_gpu,
)
from mbridge_perf.config.load import load_config

FIXTURES = Path(__file__).parent / "fixtures"

WINDOW_MS = [2000.0, 2010.0, 1990.0, 2005.0, 1995.0, 2000.0, 2020.0, 1980.0, 2000.0, 2000.0]
SHAPE = {"num_gpus": 8, "seq_length": 4096}  # the fixtures: 8 GPUs, GBS 128, seq 4096


def run(name: str, **kw) -> BenchmarkResult:
    return evaluate(parse_log(FIXTURES / name), **{**SHAPE, **kw})




def log(n: int = 60, total: int = 60, *, done: bool = True, tail: tuple[str, ...] = (),
        every: int = 1, special: dict[int, str] | None = None, **kw) -> list[str]:
    out = [(special or {}).get(i) or line(i, total, **kw) for i in range(every, n + 1, every)]
    out += list(tail)
    if done:
        out.append("[after training is done] datetime: 2026-08-22 10:30:00 ")
    return out


def failing(r: BenchmarkResult) -> set[str]:
    return {g.name for g in r.gates if not g.passed}


# --- a clean run ---------------------------------------------------------------------------

def test_clean_run_passes_with_window_metrics_and_spread() -> None:
    r = run("clean_60.log")
    assert (r.outcome, r.valid, r.measurement) == ("pass", True, "final")
    assert failing(r) == set()
    assert [g.name for g in r.gates] == ["completed", "steps", "window_logged", "loss_finite",
                                         "no_skipped_iterations", "no_nan_iterations"]
    st = r.metrics.step_time_ms
    assert st is not None
    assert (st.n, st.median, st.mean, st.min, st.max) == (10, 2000.0, 2000.0, 1980.0, 2020.0)
    assert st.stdev == pytest.approx(statistics.stdev(WINDOW_MS))
    q1, _, q3 = statistics.quantiles(WINDOW_MS, n=4, method="inclusive")
    assert (st.q1, st.q3, st.iqr) == (q1, q3, q3 - q1)
    tf = r.metrics.tflops_per_gpu
    assert tf is not None and r.metrics.tflops_source == "iteration line"
    assert tf.mean == pytest.approx(300.0) and tf.median == 300.0
    assert [s.iteration for s in r.per_step] == list(range(41, 51))
    assert (r.steps_completed, r.steps_requested, r.iteration_lines) == (60, 60, 60)
    assert r.metrics.losses_last == {"lm loss": pytest.approx(10.2 - 50 * 0.03)}


def test_tokens_per_second_per_gpu_arithmetic() -> None:
    # seq · GBS / (step time in s · GPUs)
    assert tokens_per_sec_per_gpu(2000.0, 4096, 128, 8) == 32768.0
    r = run("clean_60.log")
    tok = r.metrics.tokens_per_sec_per_gpu
    assert tok is not None and tok.median == 32768.0
    i47 = next(s for s in r.per_step if s.iteration == 47)
    assert i47.tokens_per_sec_per_gpu == pytest.approx(4096 * 128 / (2.020 * 8))
    # an explicit GBS wins over the logged one; without seq or GPUs there is no tokens/s
    assert run("clean_60.log", global_batch_size=256).metrics.tokens_per_sec_per_gpu.median == (
        65536.0)
    r2 = evaluate(parse_log(FIXTURES / "clean_60.log"))
    assert r2.metrics.tokens_per_sec_per_gpu is None
    assert "seq_length and num_gpus" in (r2.metrics.tokens_note or "")


def test_peak_memory_max_over_ranks_after_iteration_2_in_gb_and_gib() -> None:
    m = run("clean_60.log").memory
    assert m is not None
    assert (m.peak_allocated_gb, m.peak_allocated_rank) == (47.5, 4)
    assert m.peak_allocated_gib == pytest.approx(47.5 / 1.073741824)
    assert m.peak_allocated_bytes == 47_500_000_000
    assert (m.peak_reserved_gb, m.peak_reserved_rank) == (53.1, 0)
    assert m.peak_reserved_gib == pytest.approx(53.1 * GIB_PER_GB)
    assert (m.report_iteration, m.ranks_reporting, m.alloc_retries) == (2, 4, 0)


def test_memory_after_iteration_1_only_and_no_memory_lines_are_noted() -> None:
    mem = ("[Rank 0] (after 1 iterations) memory (GB) | mem-allocated-gigabytes: 10.0 | "
           "mem-reserved-gigabytes: 12.0 | mem-max-allocated-gigabytes: 11.0 | "
           "mem-max-reserved-gigabytes: 12.5 | mem-alloc-retires: 3")
    r = evaluate(parse_log([line(1), mem, *log()[1:]]))
    assert r.memory is not None and r.memory.report_iteration == 1
    assert r.memory.alloc_retries == 3
    assert any("only after iteration 1" in n for n in r.notes)
    r2 = run("no_memory.log")
    assert r2.memory is None and any("memory" in n for n in r2.notes)
    assert r2.outcome == "pass"


# --- gates and outcome classes -------------------------------------------------------------

@pytest.mark.parametrize(("source", "kw", "gates", "outcome"), [
    ("clean_60.log", {"window": (41, 70)}, {"steps", "window_logged"}, "invalid_window"),
    ("interleaved.log", {"window": (21, 30)}, {"window_logged"}, "invalid_window"),
    ("nan_in_window.log", {}, {"loss_finite", "no_nan_iterations"}, "nan_loss"),
    ("skipped.log", {}, {"no_skipped_iterations"}, "skipped_iterations"),
    ("cuda_graph_no_capture.log", {"requested_features": ["cuda_graph"]},
     {"feature:cuda_graph"}, "feature_missing"),
    ("fallback.log", {"requested_features": ["flex:deepep"]}, {"feature:flex:deepep"},
     "feature_missing"),
    ("truncated.log", {}, {"completed"}, "truncated"),
    ("cuda_graph_replay.log", {"requested_features": ["cuda_graph"]}, set(), "pass"),
])
def test_each_gate_and_its_outcome(source, kw, gates, outcome) -> None:
    r = run(source, **kw)
    assert failing(r) == gates
    assert r.outcome == outcome
    assert r.valid == (not gates)


def test_a_truncated_run_still_reports_its_window() -> None:
    r = run("truncated.log")
    assert r.metrics.step_time_ms is not None and r.metrics.step_time_ms.median == 2000.0
    assert any("ends mid-line" in n for n in r.notes)


def test_literal_nan_and_missing_loss_fail_the_loss_gate() -> None:
    nan_line = line(45, losses={"lm loss": float("nan")})
    r = evaluate(parse_log(log(special={45: nan_line})))
    assert failing(r) == {"loss_finite"} and r.outcome == "nan_loss"
    # Megatron omits a NaN average: a loss the other lines print is missing, counters are 0
    r = evaluate(parse_log(log(special={46: line(46, losses={})})))
    assert failing(r) == {"loss_finite"}
    assert "lm loss missing" in next(g.detail for g in r.gates if g.name == "loss_finite")
    r = evaluate(parse_log(log(special={47: line(47, grad="inf")})))
    assert failing(r) == {"loss_finite"}


def test_log_interval_must_tile_the_window() -> None:
    lines = log(every=5)
    assert evaluate(parse_log(lines)).outcome == "pass"  # 45 and 50 cover 41-50
    r = evaluate(parse_log(lines), window=(42, 51))
    assert failing(r) == {"window_logged"} and "log_interval=5" in r.gates[2].detail


@pytest.mark.parametrize(("tail", "n", "exit_code", "outcome"), [
    (("[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",), 2,
     None, "oom"),
    ((), 2, 9, "oom"),
    (("slurmstepd: error: *** JOB 77 ON node01 CANCELLED AT 2026-08-22T11:00:00 DUE TO TIME "
      "LIMIT ***",), 30, None, "timeout"),
    ((), 30, 143, "timeout"),
    (("[rank1]:[E822 11:00:00.1 ProcessGroupNCCL.cpp:616] Watchdog caught collective "
      "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE) ran for 600000 ms",), 30, None,
     "flaky"),
    (("RuntimeError: Rerun state machine found NaN in local forward loss calculation",), 30,
     None, "nan_loss"),
    (("Traceback (most recent call last):", "  File \"train.py\", line 3, in <module>",
      "ValueError: num_layers (48) must be divisible by pipeline_model_parallel_size (5)"), 0,
     None, "config_error"),
    (("Traceback (most recent call last):", "RuntimeError: CUDA driver error: unknown"), 30,
     None, "failed"),
    ((), 30, 1, "failed"),
    ((), 30, None, "truncated"),
])
def test_outcome_classes_of_runs_that_did_not_finish(tail, n, exit_code, outcome) -> None:
    r = evaluate(parse_log(log(n, done=False, tail=tail)), exit_code=exit_code)
    assert r.outcome == outcome and not r.valid
    assert "completed" in failing(r)
    if tail and outcome != "truncated":
        assert r.error_excerpt is not None and r.errors


def test_an_error_after_a_completed_run_is_noted_not_fatal() -> None:
    tail = ("[rank0]: RuntimeError: NCCL communicator was aborted on teardown",)
    r = evaluate(parse_log(log(tail=tail)))
    assert r.outcome == "pass" and r.errors


# --- regression against a golden value -----------------------------------------------------

@pytest.mark.parametrize(("golden", "threshold", "passed", "outcome", "words"), [
    (300.0 / 0.95, 5.0, True, "pass", "within 5 %"),          # exactly -5 %
    (300.0 / 0.9499, 5.0, False, "regression", "below"),      # -5.01 %
    (300.0 / 1.05, 5.0, True, "pass", "within 5 %"),          # exactly +5 %
    (280.0, 5.0, True, "pass", "update the golden"),          # +7.1 %
    (300.0 / 0.98, 2.0, True, "pass", "within 2 %"),          # exactly -2 %
    (300.0 / 0.97, 2.0, False, "regression", "below"),        # -3 %
])
def test_regression_threshold_edges(golden, threshold, passed, outcome, words) -> None:
    r = run("clean_60.log", golden_tflops=golden, regression_pct=threshold)
    assert r.regression is not None
    assert r.regression.passed is passed and r.outcome == outcome
    assert words in r.regression.detail
    assert r.regression.measured_tflops == pytest.approx(300.0)
    assert r.regression.delta_pct == pytest.approx((300.0 - golden) / golden * 100)
    assert r.valid  # a regression is not a validity failure


def test_regression_without_tflops_cannot_be_judged() -> None:
    r = evaluate(parse_log(log(tflops=None)), golden_tflops=700.0)
    assert r.regression is not None and r.regression.passed is None
    assert r.outcome == "pass" and r.metrics.tflops_per_gpu is None
    assert any("log_throughput" in n for n in r.notes)


def test_tflops_fall_back_to_the_step_time_lines() -> None:
    r = run("no_memory.log", golden_tflops=300.0)
    assert r.metrics.tflops_source == "Step Time line"
    assert r.metrics.tflops_per_gpu is not None and r.metrics.tflops_per_gpu.median == 300.0
    assert r.regression is not None and r.regression.passed


# --- features ------------------------------------------------------------------------------

def test_cuda_graph_capture_must_precede_the_window_and_be_followed_by_steps() -> None:
    r = run("cuda_graph_replay.log", requested_features=["cuda_graphs"])
    ev = r.features[0]
    assert ev.feature == "cuda_graph" and ev.evidenced
    assert any("built 96 cuda graph(s)" in e for e in ev.evidence)
    assert "iteration ~4" in ev.detail
    inside = run("cuda_graph_replay.log", requested_features=["cuda_graph"], window=(4, 13))
    assert inside.outcome == "feature_missing" and "inside the window" in inside.features[0].detail
    missing = run("cuda_graph_no_capture.log", requested_features=["cuda_graph"])
    assert "cuda_graph_impl=transformer_engine" in missing.features[0].evidence[0]
    assert "no graph-capture line" in missing.features[0].detail
    last = log(n=60, tail=("INFO:megatron.core.transformer.cuda_graphs:> built 4 cuda graph(s) "
                           "in 0.25 sec, with total memory usage: allocated 1.0 mb, reserved "
                           "2.0 mb.",), done=False)
    r = evaluate(parse_log(last), requested_features=["cuda_graph"])
    assert "no iteration ran after the capture" in r.features[0].detail


def test_fallback_lines_contradict_the_requested_feature() -> None:
    r = run("fallback.log", requested_features=["deepep", "tp_comm_overlap"])
    flex, tp = r.features
    assert not flex.evidenced and any(a.startswith("I1:") for a in flex.against)
    assert "moe_flex_dispatcher_backend=deepep" in " ".join(flex.evidence)
    assert not tp.evidenced and tp.against[0].startswith("L1:")
    assert {f.id for f in r.fallbacks} == {"I1", "L1"}


def test_resolved_config_is_feature_evidence() -> None:
    p = parse_log(FIXTURES / "clean_60.log")
    r = evaluate(p, requested_features=["mxfp8", "tp_comm_overlap", "ep_overlap"],
                 resolved_config={"mixed_precision": "bf16_with_mxfp8_mixed",
                                  "comm_overlap": {"tp_comm_overlap": True,
                                                   "overlap_moe_expert_parallel_comm": False}})
    fp8, tp, ep = r.features
    assert fp8.feature == "fp8:mxfp8" and fp8.evidenced
    assert tp.evidenced and not ep.evidenced and ep.against
    r2 = evaluate(p, requested_features=["fp8"])
    assert not r2.features[0].evidenced and "no evidence" in r2.features[0].detail
    # flex with a null backend is reset to alltoall silently (I2)
    r3 = evaluate(p, requested_features=["flex"],
                  resolved_config={"model.moe_token_dispatcher_type": "flex",
                                   "model.moe_flex_dispatcher_backend": None})
    assert not r3.features[0].evidenced and "I2" in r3.features[0].against[0]


def test_bad_arguments_are_named() -> None:
    p = parse_log(FIXTURES / "clean_60.log")
    with pytest.raises(ValueError, match="unknown feature 'graphs'"):
        evaluate(p, requested_features=["graphs"])
    with pytest.raises(ValueError, match="window"):
        evaluate(p, window=(10, 5))
    with pytest.raises(ValueError, match="golden_tflops"):
        evaluate(p, golden_tflops=0.0)
    with pytest.raises(ValueError, match="regression_pct"):
        evaluate(p, regression_pct=0)
    with pytest.raises(ValueError, match="num_gpus"):
        evaluate(p, num_gpus=0)
    assert canonical_feature("HybridEP") == "flex:hybridep"


def test_a_screening_window_is_labelled() -> None:
    r = evaluate(parse_log(log(12, 12)), window=(7, 12))
    assert r.measurement == "screening" and r.outcome == "pass"
    assert any("screening" in n for n in r.notes)


# --- evidence bundle and Markdown ----------------------------------------------------------

def contract(*extra: str, **kw) -> MeasurementContract:
    cfg = load_config(preset="llama3-8b", overrides=[
        "cluster.num_gpus=8", "cluster.gpus_per_node=8", "cluster.gpu=H100",
        "model.tensor_model_parallel_size=2", "model.pipeline_model_parallel_size=2",
        "model.sequence_parallel=true", "train.global_batch_size=128", "train.train_iters=60",
        "model.seq_length=4096", "mixed_precision=bf16_mixed", *extra])
    return contract_from_config(cfg, model="llama3-8b", task="pretrain", data="mock", **kw)


def test_evidence_bundle_is_json_with_the_contract() -> None:
    c = contract()
    r = evaluate_run(parse_log(FIXTURES / "clean_60.log"), c, golden_tflops=310.0)
    b = evidence_bundle(r, c)
    data = json.loads(json.dumps(b))
    assert data["schema"].startswith("mbridge-perf/benchmark-evidence")
    assert (data["outcome"], data["valid"], data["label"]) == ("pass", True,
                                                                "training-equivalent")
    assert data["contract"]["layout"]["dp"] == 2
    assert data["result"]["metrics"]["step_time_ms"]["median"] == 2000.0
    assert data["contract_checks"] == []
    nan = evaluate(parse_log(FIXTURES / "nan_in_window.log"))
    text = json.dumps(evidence_bundle(nan), allow_nan=False)  # strict JSON
    assert '"grad_norm": "NaN"' in text  # a NaN stays visible
    other = evaluate_run(parse_log(FIXTURES / "clean_60.log"), contract(window=(31, 40)))
    assert evidence_bundle(other, c)["contract_checks"]


def test_markdown_report_contains_the_numbers() -> None:
    c = contract()
    r = evaluate_run(parse_log(FIXTURES / "clean_60.log"), c, golden_tflops=310.0)
    md = render_markdown(r, c)
    for text in ("## Benchmark result: pass (valid, final measurement)",
                 "| step time (ms) | 2,000.0 | 2,000.0 | 1,980.0 | 2,020.0 |",
                 "| tokens/s/GPU | 32,768 |", "TFLOP/s/GPU (iteration line) | 300.0",
                 "Peak allocated 47.500 GB = 44.238 GiB on rank 4",
                 "peak reserved 53.100 GB = 49.453 GiB on rank 0",
                 "Golden 310 TFLOP/s/GPU", "-3.23 %", "| window_logged | pass |",
                 "training-equivalent", "TP2 PP2 VPP1 CP1", "weight and optimizer 34,461.8"):
        assert text in md, text
    bad = render_markdown(run("fallback.log", requested_features=["deepep"]))
    assert "feature_missing" in bad and "fallback I1" in bad and "| flex:deepep | NO |" in bad


# --- A/B -----------------------------------------------------------------------------------

GRAPH_LINES = ("INFO:megatron.core.transformer.cuda_graphs:Creating 96 CUDA graphs",
               "INFO:megatron.core.transformer.cuda_graphs:> built 96 cuda graph(s) in 2.51 "
               "sec, with total memory usage: allocated 1.2 gb, reserved 1.5 gb.")


def graphs_run(c: MeasurementContract, elapsed: float = 1900.0,
               tflops: float = 315.8) -> BenchmarkResult:
    lines = log(elapsed=elapsed, tflops=tflops)
    lines[3:3] = GRAPH_LINES  # captured after iteration 3
    return evaluate_run(parse_log(lines), c)


def test_compare_a_one_variable_ab() -> None:
    ca = contract()
    cb = contract("model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[attn]",
                  "model.use_te_rng_tracker=true")
    assert features_from_contract(cb) == ["cuda_graph"]
    ra = evaluate_run(parse_log(FIXTURES / "clean_60.log"), ca)
    rb = graphs_run(cb)
    assert ra.valid and rb.valid
    c = compare((ca, ra), (cb, rb))
    assert c.valid and c.reasons == [] and c.variable == "cuda_graphs"
    d = {x.metric: x for x in c.deltas}
    assert d["step_time_ms"].delta == -100.0 and d["step_time_ms"].delta_pct == -5.0
    assert d["step_time_ms"].better == "b"
    assert d["tflops_per_gpu"].delta == pytest.approx(15.8)
    assert d["tflops_per_gpu"].delta_pct == pytest.approx(15.8 / 300.0 * 100)
    assert d["tokens_per_sec_per_gpu"].b == pytest.approx(4096 * 128 / (1.9 * 8))
    assert d["peak_allocated_gib"].a == pytest.approx(47.5 * GIB_PER_GB)
    assert d["peak_allocated_gib"].b is None  # run b printed no memory lines
    md = render_comparison(c)
    assert "## A/B: cuda_graphs (valid)" in md and "-100.00" in md


def test_compare_rejects_extra_variables_mixed_labels_and_invalid_runs() -> None:
    ca = contract()
    ra = evaluate_run(parse_log(FIXTURES / "clean_60.log"), ca)
    cb = contract("model.cuda_graph_impl=transformer_engine", "model.use_te_rng_tracker=true",
                  "env.NCCL_GRAPH_REGISTER=0")
    c = compare((ca, ra), (cb, graphs_run(cb)))
    assert not c.valid and c.variable is None
    assert set(c.variables) == {"cuda_graphs", "environment.NCCL_GRAPH_REGISTER"}
    assert "2 variables" in c.reasons[0] and "extra difference" in c.reasons[0]
    assert {d.field for d in c.differences} == {"cuda_graphs.impl",
                                                "environment.NCCL_GRAPH_REGISTER"}
    assert c.deltas[0].delta == -100.0  # deltas are reported anyway

    same = compare((ca, ra), (ca, ra))
    assert not same.valid and "identical" in same.reasons[0]

    cbo = contract(label="benchmark-only")
    mixed = compare((ca, ra), (cbo, ra))
    assert not mixed.valid and any("never mixed" in x for x in mixed.reasons)

    bad = evaluate_run(parse_log(FIXTURES / "nan_in_window.log"), ca)
    cn = contract("env.NCCL_NVLS_ENABLE=0")
    invalid = compare((ca, ra), (cn, bad))
    assert not invalid.valid and invalid.variable == "environment.NCCL_NVLS_ENABLE"
    assert any("run b is not valid (nan_loss" in x for x in invalid.reasons)

    wrong_window = evaluate(parse_log(FIXTURES / "clean_60.log"), window=(31, 40))
    cw = contract("env.NCCL_NVLS_ENABLE=0")
    ww = compare((ca, ra), (cw, wrong_window))
    assert any("not its contract window" in x for x in ww.reasons)
