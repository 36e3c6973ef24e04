"""Capabilities added for the misjudgements of blind batch 4 (benchmarks/heldout4), tested in
sentences of our own: "leave X out" / "keep X out" negate X, a "frozen baseline" counts as the
measurement contract, and core_attn priced as a "small saving" is not the big-saver claim."""

from __future__ import annotations

import pytest
from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.matching import recommended


@pytest.mark.parametrize("skill", [LONG, RECOMPUTE])
def test_leaving_core_attn_out_is_not_the_core_attn_saver_claim(skill: str) -> None:
    text = ("Keep `core_attn` out of the module list: with flash attention its recompute "
            "buys almost no memory at 32K.")
    assert "core-attn-big-saver" not in found(skill, text)
    units = parse_answer("Leave core_attn out for this model.").units
    assert not recommended(units, "core_attn")


def test_leave_and_keep_without_out_still_recommend() -> None:
    units = parse_answer("Keep core_attn in the list for the unfused path.").units
    assert recommended(units, "core_attn")


def test_a_frozen_baseline_counts_as_the_measurement_contract() -> None:
    text = ("Treat today's run as the frozen baseline (same image, data order, layout and "
            "precision); then A/B one change at a time against it.")
    assert "no-measurement-contract" not in found(WORKFLOW, text)
    assert "no-measurement-contract" in found(WORKFLOW, "Next steps: change the dispatcher and "
                                                        "re-run.")


@pytest.mark.parametrize("skill", [MEMORY, RECOMPUTE, LONG])
def test_core_attn_priced_as_a_small_saving_is_not_the_big_saver_claim(skill: str) -> None:
    text = ("| add layernorm next to core_attn | cheap | small saving (57.1 GB peak with both, "
            "still over budget) | later |")
    assert "core-attn-big-saver" not in found(skill, text)
    assert "core-attn-big-saver" in found(
        skill, "Recompute core_attn: with flash attention it frees about 6 GB per GPU.")
