"""Estimated change of peak memory vs measured runs that differ in one knob (recompute
modules, TP, PP, full recompute). Pairs and their configs are copied from
../shared/data/memory/recompute-pairs.csv (fixtures/recompute_pairs.csv names the source of
each); a pair counts when both readings are real peaks."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

PAIRS = list(csv.DictReader((Path(__file__).parent / "fixtures" / "recompute_pairs.csv")
                            .open(newline="")))
COUNTING = [r for r in PAIRS if r["counts"] == "yes"]
# The Llama3 70B FP8-CS pairs carry the recipe's per-layer Transformer Engine graphs of the MLP
# (Bridge 0.6.2 dump: cuda_graph_impl transformer_engine, cuda_graph_scope [mlp]); their peaks
# are the larger of the eager warm-up iterations and the graphed steady state (memory.graphs).
# Not met (issue 11): with the graphs' static inputs shared as Megatron-Core captures them
# (PR #2392, in every release config.mcore accepts; the measured runs' Bridge pinned a
# Megatron-LM that has it), the graphed state falls below the eager warm-up, and the eager model
# frees ~11 GiB for mlp recompute and ~17 GiB for TP 4 -> 8 where the runs show 3.2 and 8.2.
# The gap is in the eager model of graphed FP8 runs; it needs GPU measurements to settle.
KNOWN_MISSES = {"llama70b-tp8", "llama70b-mlp", "llama70b-mlp-core-attn"}


def _peak(preset: str, overrides: str) -> float:
    cfg = load_config(preset=preset or None, overrides=overrides.split(";"))
    return estimate_memory(cfg).peak_allocated_gib


def test_the_fixture_holds_the_ten_counting_pairs() -> None:
    assert len(COUNTING) == 10
    assert all(r["source"].startswith("../shared/data/memory/recompute-pairs.csv") for r in PAIRS)


@pytest.mark.parametrize("row", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="Llama3 70B FP8-CS deltas: the "
                                            "eager model of graphed FP8 runs (issue 11)"))
    if r["pair_id"] in KNOWN_MISSES else r for r in COUNTING], ids=[r["pair_id"] for r in COUNTING])
def test_estimated_change_is_within_35_percent_or_1_gib_of_the_measured(row: dict) -> None:
    measured = float(row["measured_delta_gib"])
    est = _peak(row["preset"], row["variant_overrides"]) - _peak(row["preset"],
                                                                   row["base_overrides"])
    assert abs(est - measured) <= max(0.35 * abs(measured), 1.0), (est, measured)
    if abs(measured) > 1.0:
        assert est * measured > 0, (est, measured)
