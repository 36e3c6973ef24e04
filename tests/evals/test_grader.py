"""The grader's matching and checks, through its public functions: normalisation, negation,
late recommendations, order, numbers, the knob allowlist and critical checks."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_case, grade_skill
from mbridge_perf.evals.matching import recommended
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO

MEMORY = "nemo-mbridge-perf-memory-tuning"


def rec(text: str, term: str) -> bool:
    return bool(recommended(parse_answer(text).units, term))


@pytest.mark.parametrize("text", [
    "Set TP=8.", "Set tensor_model_parallel_size=8.", "Use tensor parallel size 8.",
    "Raise TP 4->8.", "Move to TP8 inside the node.", "Raise TP from 4 to 8.",
])
def test_every_spelling_of_tp8_is_one_recommendation(text: str) -> None:
    assert rec(text, "TP=8")
    assert rec(text, "tensor_model_parallel_size=8")


def test_sizes_do_not_match_inside_other_sizes_or_labels() -> None:
    assert not rec("Set VPP=8.", "PP=8")
    assert not rec("Set TP=80.", "TP=8")
    assert not rec("recompute_modules=[moe_act]", "recompute_modules=[moe")
    assert rec("Add mlp recompute.", "mlp")
    assert rec("Set expandable_segments: True", "expandable_segments:True")


@pytest.mark.parametrize("text", [
    "Do not raise TP to 8.", "Avoid TP=8 here.", "Use expandable segments instead of TP=8.",
    "TP=8 should not be the first fix.", "TP=8 is blocked by the NVLink domain.",
    "TP=8 is incompatible with this layout.", "Your teammate wants TP=8.",
    "If you raise TP to 8, throughput drops.", "Avoid: TP=8, PP=8 and CPU offload.",
    "❌ TP=8 (costs 28.4%)",
])
def test_negated_reported_or_conditional_mentions_are_not_advice(text: str) -> None:
    assert not rec(text, "TP=8")


def test_a_condition_does_not_negate_the_advice_after_it() -> None:
    assert rec("If the allocator fix is not enough, add layernorm.", "layernorm")
    assert rec("Only if it still does not fit, add mlp.", "mlp")
    assert rec("Use layernorm (core_attn frees about 0 here).", "layernorm")
    assert not rec("Use layernorm (core_attn frees about 0 here).", "core_attn")


def test_last_resort_advice_ranks_after_everything_else() -> None:
    text = "Use mlp only as a last resort. Export expandable_segments:True. Add layernorm."
    card = get_skill(REPO, MEMORY).card
    case = {"id": "x-positive-y", "expected_skill": MEMORY,
            "checks": {"order": [["expandable_segments", "layernorm"], ["layernorm", "mlp"]]}}
    grade = grade_case(case, card, parse_answer(text), MEMORY)
    assert grade.passed, [e.evidence for e in grade.expectations]


def test_a_negation_heading_covers_its_section() -> None:
    text = "1. Export expandable_segments:True.\n\n## What not to do\n\n- TP=8.\n- PP=8.\n"
    assert rec(text, "expandable_segments")
    assert not rec(text, "TP=8") and not rec(text, "PP=8")


def _case(**checks: Any) -> dict[str, Any]:
    return {"id": "memory-tuning-positive-t", "expected_skill": MEMORY, "checks": checks}


def grade(text: str, **checks: Any) -> Any:
    return grade_case(_case(**checks), get_skill(REPO, MEMORY).card, parse_answer(text), MEMORY)


def test_order_fails_when_the_two_recommendations_are_swapped() -> None:
    good = "1. Export expandable_segments:True.\n2. Add layernorm.\n"
    bad = "1. Add layernorm.\n2. Export expandable_segments:True.\n"
    pair = [["expandable_segments", "layernorm"]]
    assert grade(good, order=pair, critical=["order"]).passed
    swapped = grade(bad, order=pair, critical=["order"])
    assert not swapped.passed
    assert "Add layernorm" in swapped.expectations[0].evidence


def test_a_critical_failure_fails_the_answer_whatever_else_passes() -> None:
    text = "Export expandable_segments:True and set TP=8. Fragmentation is the cause."
    checks = {"must_include_any": [["fragmentation"], ["expandable_segments"], ["cause"],
                                   ["Export"], ["set"]],
              "must_not_recommend": ["TP=8"]}
    soft = grade(text, **checks)
    assert soft.summary.pass_rate >= 0.8 and soft.passed
    hard = grade(text, **checks, critical=["must_not_recommend"])
    assert not hard.passed
    assert hard.failed_critical == ["must not recommend 'TP=8'"]
    assert "set TP=8" in next(e.evidence for e in hard.expectations if not e.passed)


def test_invented_knobs_fail_and_real_ones_pass() -> None:
    bad = grade("Set `recompute_modules: [attention]` and model.fake_knob=1.",
                valid_keys_only=True)
    e = next(e for e in bad.expectations if e.check == "valid_keys_only")
    assert not e.passed and "attention" in e.evidence and "fake_knob" in e.evidence
    good = grade("Set `recompute_modules=[moe_act, layernorm]`, `recompute_method=uniform` and "
                 "`optimizer.use_distributed_optimizer=true`.", valid_keys_only=True)
    assert all(e.passed for e in good.expectations)
    rejected = grade("Labels such as `recompute_modules=[up_proj]` do not exist.",
                     valid_keys_only=True)
    assert rejected.passed


def test_numeric_checks_read_tool_json_and_text_with_a_tolerance() -> None:
    data = {"peak_allocated_gib": 57.0, "answer_markdown": "Peak allocated 57.0 GiB."}
    answer = parse_answer(json.dumps(data))
    case = _case(numeric=[{"extract": "json:$.peak_allocated_gib", "expect": 54.8,
                           "rel_tol": 0.05}])
    card = get_skill(REPO, MEMORY).card
    assert grade_case(case, card, answer, MEMORY).passed
    case["checks"]["numeric"][0]["rel_tol"] = 0.01
    miss = grade_case(case, card, answer, MEMORY)
    assert not miss.expectations[0].passed and "57" in miss.expectations[0].evidence
    text = grade("The peak allocated is 59.7 GiB.",
                 numeric=[{"extract": r"text:peak allocated is (\d+\.\d) GiB", "expect": 59.7}])
    assert text.passed


def test_tool_calls_come_from_front_matter() -> None:
    text = "---\ntool_calls: [mcp__mbridge__submit_benchmark]\n---\nDone.\n"
    g = grade(text, tool_calls={"forbidden": ["submit_benchmark"]},
              critical=["tool_calls.forbidden"])
    assert not g.passed and "submit_benchmark" in g.expectations[0].evidence


def test_a_negative_case_fails_an_answer_that_claims_the_skill() -> None:
    case = {"id": "memory-tuning-negative-t", "expected_skill": None, "checks": {}}
    card = get_skill(REPO, MEMORY).card
    claim = parse_answer(f"Using the {MEMORY} skill: export expandable_segments:True.")
    assert not grade_case(case, card, claim, MEMORY).passed
    fine = parse_answer("This is a serving question; the memory-tuning skill does not apply.")
    assert grade_case(case, card, fine, MEMORY).passed


def test_skill_grade_needs_its_recommendations_in_the_card_order() -> None:
    card = get_skill(REPO, MEMORY).card
    good = ("1. Export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.\n"
            "2. If it still OOMs, use selective recompute with layernorm.\n"
            "3. Only if it still does not fit, add mlp (about 16%).\n\n"
            "TP 4 -> 8 cost -28.4%; PP 8 cost -5.9%. CPU offloading needs PP = 1.\n")
    assert grade_skill(card, parse_answer(good), MEMORY).passed
    lines = good.splitlines()
    swapped = "\n".join([lines[1], lines[0], *lines[2:]])
    g = grade_skill(card, parse_answer(swapped), MEMORY)
    assert not g.passed
    assert any("order" in e.text and not e.passed for e in g.expectations)


def test_a_narrow_answer_is_not_failed_for_the_steps_it_leaves_out() -> None:
    """The grader does not see the question: a pushback that names one knob's real effect
    passes, the checklist steps it skips are reported (counted=False), and the same pushback
    with a wrong claim in it still fails."""
    card = get_skill(REPO, MEMORY).card
    narrow = ("Keep that line out of the wiki. The job stopped failing because the allocator "
              "change (expandable_segments:True) removed the fragmentation; the VPP bump in the "
              "same commit raised the peak a little. Interleaving is a bubble knob.")
    g = grade_skill(card, parse_answer(narrow), MEMORY)
    assert g.passed, [e.evidence for e in g.expectations if not e.passed]
    skipped = [e for e in g.expectations if not e.passed]
    assert skipped and all(not e.counted and not e.critical for e in skipped)
    assert g.summary.total == len([e for e in g.expectations if e.counted])
    wrong = narrow + " Next time, switch to FP8 as well: it saves activation memory."
    assert not grade_skill(card, parse_answer(wrong), MEMORY).passed


def test_an_unbroken_answer_is_judged_in_bounded_units() -> None:
    """One 200 KB "sentence" would make judging each match scan the whole text (quadratic);
    units are cut at 2,000 characters, at a space, so the cost grows with the length."""
    from mbridge_perf.evals.answer import MAX_UNIT_CHARS, split_units

    text = "do not raise TP " * 12_000
    units, _ = split_units(text)
    assert len(units) > 90 and all(len(u.text) <= MAX_UNIT_CHARS for u in units)
    assert " ".join(u.text for u in units).split() == text.split()  # cut at spaces, no loss


def test_claims_are_read_in_the_claim_window_and_the_verdict_says_so() -> None:
    """Real answers are a few KB; a claim buried after 32,000 characters of filler is not read
    (bounded cost), and the passing verdict names the window it read."""
    from mbridge_perf.evals.checks import CLAIM_WINDOW_CHARS

    card = get_skill(REPO, "nemo-mbridge-perf-memory-tuning").card
    wrong = "Layer CPU offloading works fine with pipeline parallelism, so enable it at PP=4."
    early = grade_skill(card, parse_answer(wrong + "\n\n"), "nemo-mbridge-perf-memory-tuning")
    filler = "\n\n".join(["Measured the steady window again and wrote it down."] * 1000)
    assert len(filler) > CLAIM_WINDOW_CHARS
    late = grade_skill(card, parse_answer(filler + "\n\n" + wrong),
                       "nemo-mbridge-perf-memory-tuning")
    verdict = {e.check: e for e in early.expectations}["misconceptions"]
    assert not verdict.passed
    verdict = {e.check: e for e in late.expectations}["misconceptions"]
    assert verdict.passed and f"{CLAIM_WINDOW_CHARS:,} characters" in verdict.evidence
