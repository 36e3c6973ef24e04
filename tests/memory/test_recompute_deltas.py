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
# Not met yet (issue 11): the Llama3 70B FP8-CS runs' memory barely moves with TP (non-static
# 16.6 -> 14.9 GiB for TP 4 -> 8) and mlp recompute frees 3.2 GiB; the estimator halves ~21 GiB
# of activations and frees ~12 GiB. A TP-independent term the size of Transformer Engine's
# per-(layer, micro-batch) graph I/O buffers of the recipe's mlp-scope graphs fits the TP / PP
# pairs but contradicts the Megatron-LM CI graph goldens (see the issue-11 report).
KNOWN_MISSES = {"llama70b-tp8", "llama70b-mlp", "llama70b-mlp-core-attn"}


def _peak(preset: str, overrides: str) -> float:
    cfg = load_config(preset=preset or None, overrides=overrides.split(";"))
    return estimate_memory(cfg).peak_allocated_gib


def test_the_fixture_holds_the_ten_counting_pairs() -> None:
    assert len(COUNTING) == 10
    assert all(r["source"].startswith("../shared/data/memory/recompute-pairs.csv") for r in PAIRS)


@pytest.mark.parametrize("row", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason="Llama3 70B FP8-CS deltas "
                                            "not modelled yet (issue 11)"))
    if r["pair_id"] in KNOWN_MISSES else r for r in COUNTING], ids=[r["pair_id"] for r in COUNTING])
def test_estimated_change_is_within_35_percent_or_1_gib_of_the_measured(row: dict) -> None:
    measured = float(row["measured_delta_gib"])
    est = _peak(row["preset"], row["variant_overrides"]) - _peak(row["preset"],
                                                                   row["base_overrides"])
    assert abs(est - measured) <= max(0.35 * abs(measured), 1.0), (est, measured)
    if abs(measured) > 1.0:
        assert est * measured > 0, (est, measured)
