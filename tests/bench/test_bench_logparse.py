"""The streaming log parser on hand-written logs in the formats of log-formats.md §2–§8: a clean
run, NaN and skipped iterations, a truncated log, interleaved ranks with prefixes, missing
optional fields, CUDA-graph capture and fallback lines; chunk boundaries anywhere."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from logmaker import line

from mbridge_perf.bench.logparse import (
    GIB_PER_GB,
    ParsedLog,
    parse_iteration_line,
    parse_log,
    shape_of,
)

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> Path:
    return FIXTURES / name




@pytest.mark.parametrize("chunk", [64, 97, 1000, 4096, 1 << 24])
def test_clean_run_every_field_and_any_chunk_size(chunk: int) -> None:
    p = parse_log(fixture("clean_60.log"), chunk_bytes=chunk)
    s = p.summary()
    assert (s.iteration_lines, s.first_iteration, s.last_iteration, s.total_iterations) == (
        60, 1, 60, 60)
    assert s.completed and s.restarts == 0 and s.log_interval == 1
    assert s.malformed_iteration_lines == 0 and s.truncated_tail is None
    assert s.step_time_lines == 60 and s.skipped_iterations == 0 and s.nan_iterations == 0
    it = p.get(45)
    assert it is not None
    assert (it.iteration, it.total, it.elapsed_ms, it.tflops_per_gpu) == (45, 60, 1995.0, 300.8)
    assert it.losses == {"lm loss": pytest.approx(10.2 - 45 * 0.03)}
    assert (it.consumed_samples, it.global_batch_size, it.loss_scale) == (5760, 128, 1.0)
    assert it.learning_rate == pytest.approx(1e-4) and it.grad_norm == pytest.approx(1.05)
    assert [r.iteration for r in p.window(41, 50)] == list(range(41, 51))
    assert [r.elapsed_ms for r in p.window(41, 50)] == [
        2000.0, 2010.0, 1990.0, 2005.0, 1995.0, 2000.0, 2020.0, 1980.0, 2000.0, 2000.0]
    # memory: 4 DP-rank-0 ranks, after iterations 1 and 2, decimal GB as printed
    assert len(s.memory_reports) == 8
    r4 = next(m for m in s.memory_reports if m.rank == 4 and m.after_iterations == 2)
    assert r4.get("max-allocated") == 47.5 and r4.get("max-reserved") == 52.0
    assert r4.alloc_retries == 0 and r4.counts["mem-allocated-count"] == 281949
    assert s.theoretical_memory is not None
    assert (s.theoretical_memory.weight_and_optimizer_mib, s.theoretical_memory.activation_mib,
            s.theoretical_memory.total_mib) == (34461.75, 10240.0, 44701.75)
    assert s.parameters_billions["Total number of parameters"] == 8.03
    assert s.config["moe_token_dispatcher_type"] == ["alltoall"]
    assert s.config["cuda_graph_impl"] == ["none"]
    assert {f.id for f in s.findings} == {"start", "done"}
    # every line has its throughput, so the Step Time lines are counted, not kept
    assert len(p.step_tflops) == 0 and not p.steps_incomplete


def test_lines_path_and_bytes_sources_agree() -> None:
    text = fixture("clean_60.log").read_text()
    a = parse_log(fixture("clean_60.log")).summary()
    b = parse_log(text.splitlines()).summary()
    c = parse_log(text.encode().splitlines(keepends=True)).summary()
    with fixture("clean_60.log").open() as f:
        d = parse_log(f).summary()
    for x in (b, c, d):
        assert x.model_dump(exclude={"source"}) == a.model_dump(exclude={"source"})


def test_nan_loss_inside_the_window() -> None:
    p = parse_log(fixture("nan_in_window.log"))
    it = p.get(45)
    assert it is not None
    # Megatron prints no loss whose average is not > 0 (a NaN), counts the NaN iteration
    assert it.losses == {} and it.nan_iterations == 1
    assert it.grad_norm is not None and it.grad_norm != it.grad_norm  # nan
    assert not it.finite
    assert p.summary().nan_iterations == 1
    assert '"grad_norm":"NaN"' in it.model_dump_json()


def test_literal_nan_and_inf_losses_are_read() -> None:
    p = parse_log([line(1, 2), line(2, 2, losses={"lm loss": float("nan"),
                                                  "mtp_1 loss": float("inf")}, grad="inf")])
    it = p.get(2)
    assert it is not None and not it.finite
    assert set(it.losses) == {"lm loss", "mtp_1 loss"}


def test_skipped_iterations_without_loss_and_grad_norm() -> None:
    p = parse_log(fixture("skipped.log"))
    rows = {r.iteration: r for r in p.window(42, 45)}
    assert rows[43].skipped_iterations == rows[44].skipped_iterations == 1
    assert rows[43].grad_norm is None and rows[43].losses == {}
    assert (rows[42].loss_scale, rows[43].loss_scale, rows[44].loss_scale) == (
        65536.0, 32768.0, 16384.0)
    assert p.summary().skipped_iterations == 2


@pytest.mark.parametrize("chunk", [50, 1000, 1 << 24])
def test_truncated_last_line_is_reported_not_parsed(chunk: int) -> None:
    p = parse_log(fixture("truncated.log"), chunk_bytes=chunk)
    s = p.summary()
    assert s.iteration_lines == 55 and s.last_iteration == 55
    assert s.truncated_tail is not None and "iteration       56/" in s.truncated_tail
    assert s.malformed_iteration_lines == 0 and not s.completed
    with fixture("truncated.log").open() as f:  # a file iterator shows the same
        assert parse_log(f).summary().truncated_tail == s.truncated_tail


@pytest.mark.parametrize("chunk", [100, 4096, 1 << 24])
def test_interleaved_ranks_prefixes_ansi_and_carriage_returns(chunk: int) -> None:
    p = parse_log(fixture("interleaved.log"), chunk_bytes=chunk)
    s = p.summary()
    # iteration 30's line was cut by another rank's output: counted, not invented
    assert s.iteration_lines == 59 and p.get(30) is None
    assert s.malformed_iteration_lines == 1 and "iteration       30/" in s.malformed_examples[0]
    assert p.get(12) is not None  # after a \r progress bar on the same physical line
    assert s.completed  # the done marker is wrapped in ANSI colour codes
    assert len(s.memory_reports) == 8  # "[rankN]: [Rank N] …"
    assert s.step_time_lines == 60
    i12 = next(f for f in s.findings if f.id == "I12")
    assert "\x1b" not in i12.line and i12.kind == "warning"
    # the same warning from several ranks is one finding with a count
    assert all(f.count >= 1 for f in s.findings)


def test_missing_optional_fields_and_no_memory_lines() -> None:
    p = parse_log(fixture("no_memory.log"))
    s = p.summary()
    assert s.memory_reports == [] and s.iteration_lines == 60
    it = p.get(45)
    assert it is not None and it.tflops_per_gpu is None and it.grad_norm is None
    # rank 0's Step Time lines carry the TFLOP/s instead (§3), in order
    assert len(p.step_tflops) == 60 and p.step_tflops[44] == 300.8
    assert p.step_times_s[44] == 2.0  # "2.00s" (Step Time rounds to 10 ms)


def test_cuda_graph_capture_lines_and_their_position() -> None:
    p = parse_log(fixture("cuda_graph_replay.log"))
    caps = p.findings_of("capture")
    assert {f.id for f in caps} == {"cuda_graph.create", "cuda_graph.built"}
    assert all(f.after_rows == 3 for f in caps)  # printed after iteration 3's line
    assert p.row_iteration(2) == 3
    assert p.config["cuda_graph_impl"] == ["transformer_engine"]
    assert parse_log(fixture("cuda_graph_no_capture.log")).findings_of("capture") == []


def test_fallback_lines_name_rule_and_feature() -> None:
    p = parse_log(fixture("fallback.log"))
    fb = {f.id: f for f in p.findings_of("fallback")}
    assert set(fb) == {"I1", "L1"}
    assert fb["I1"].negates == ["flex"] and "Falling back to alltoall" in fb["I1"].line
    assert fb["L1"].negates == ["tp_comm_overlap"]
    assert p.config["moe_flex_dispatcher_backend"] == ["deepep"]


def test_error_markers_and_flaky_signatures_are_classified() -> None:
    lines = [line(1, 50), line(2, 50),
             "[rank3]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
             "[rank5]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB",
             "slurmstepd: error: *** JOB 1234 ON node01 CANCELLED AT 2026-08-22T10:30:00 DUE TO "
             "TIME LIMIT ***",
             "[rank1]:[E822 10:30:00.1 ProcessGroupNCCL.cpp:616] Watchdog caught collective "
             "operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE) ran for 600000 ms",
             "/usr/lib/python3/site-packages/x.py:3: UserWarning: ValueError is deprecated here",
             "[exiting program at iteration 2] datetime: 2026-08-22 10:30:00 "]
    found = {f.id: f for f in parse_log(lines).findings}
    assert found["oom"].count == 2 and found["oom"].after_rows == 2
    assert found["timeout"].kind == "error" and found["flaky"].kind == "error"
    assert "config_error" not in found  # a UserWarning mentioning an error is not one
    assert found["exit"].kind == "marker"


def test_unknown_fields_take_the_tolerant_path() -> None:
    odd = line(2, 3, extra=" tokens per GPU (tokens/s/GPU): 16384.0 |")
    p = parse_log([line(1, 3), odd, line(3, 3)])
    assert [r.iteration for r in p.rows()] == [1, 2, 3]
    r2 = p.get(2)
    assert r2 is not None and r2.extra == {"tokens per GPU (tokens/s/GPU)": "16384.0"}
    assert r2.losses == {"lm loss": pytest.approx(8.1)} and r2.tflops_per_gpu == 300.0


def test_megatron_lm_decoupled_learning_rate_is_in_the_template() -> None:
    mlm = line(3, 3).replace(" | global batch size:", " | decoupled learning rate: 2.000000E-05"
                                                        " | global batch size:")
    p = parse_log([line(1, 3), line(2, 3), mlm])
    r3 = p.get(3)
    assert r3 is not None and r3.decoupled_learning_rate == 2e-5 and r3.extra == {}
    assert p.malformed == 0


def test_parse_iteration_line_needs_a_whole_line() -> None:
    whole = line(7, 50)
    it = parse_iteration_line(whole)
    assert it is not None and (it.iteration, it.total, it.nan_iterations) == (7, 50, 0)
    assert parse_iteration_line(whole[:150]) is None
    assert parse_iteration_line("Starting training loop at iteration 0") is None


def test_restart_keeps_the_last_occurrence_and_counts_it() -> None:
    first = [line(i, 60, elapsed=3000.0) for i in range(1, 31)]
    resumed = [line(i, 60, elapsed=2000.0) for i in range(21, 61)]
    p = parse_log([*first, "Starting training loop at iteration 20", *resumed])
    assert p.restarts == 1 and p.iteration_lines == 70
    assert {r.elapsed_ms for r in p.window(21, 30)} == {2000.0}
    assert p.get(10) is not None and p.get(10).elapsed_ms == 3000.0  # type: ignore[union-attr]


def test_crlf_endings_and_log_interval() -> None:
    text = "\r\n".join(line(i, 60) for i in range(5, 61, 5)) + "\r\n"
    p = parse_log([text])
    assert p.iteration_lines == 12 and p.log_interval == 5


def test_units_and_shapes() -> None:
    assert pytest.approx(1.0) == GIB_PER_GB * 1.073741824  # GB (1e9) -> GiB (2^30)
    assert shape_of("[rank12]: step 345") == b"[rank00]: step 000"


def test_summary_is_json() -> None:
    s = parse_log(fixture("interleaved.log")).summary()
    data = json.loads(s.model_dump_json())
    assert data["iteration_lines"] == 59 and isinstance(data["findings"], list)


def test_empty_and_noise_only_logs() -> None:
    assert parse_log([]).summary().iteration_lines == 0
    p: ParsedLog = parse_log(["hello", "world"])
    s = p.summary()
    assert (s.iteration_lines, s.lines, s.completed) == (0, 2, False)
    assert p.window(1, 10) == [] and p.last_row() is None
