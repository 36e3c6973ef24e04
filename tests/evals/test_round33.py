"""Round 33, from blind batches 17 and 18 (written blind this stop, measured once at 7f211b3:
22/32 and 23/32): good answers the grader failed - a claim named as "the misreading to avoid",
"cannot coexist" before a full-recompute verb, a review's verdict after the quoted list, a
record read out ("what the tracker shows"), "the last selective step", a put-first question, a
Japanese same-condition baseline. Sentences of our own, each with a near miss."""

from __future__ import annotations

from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found, order_ok

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.keys import invented_keys


def test_a_claim_named_as_the_misreading_is_a_correction() -> None:
    text = "Summing kernel durations and calling it wall time is the misreading to avoid."
    assert "summed-kernel-time" not in found(WORKFLOW, text)
    assert "summed-kernel-time" in found(WORKFLOW, "Summing the kernel durations gives the "
                                                   "wall time the overlap hid.")


def test_full_recompute_that_cannot_coexist_with_te_graphs_is_no_flipped_claim() -> None:
    text = "Whole-layer recompute cannot coexist with TE-scoped graphs at the pin."
    assert "selective-vs-te-graphs-flipped" not in found(RECOMPUTE, text)
    bad = "Whole-layer recompute coexists with the TE-scoped graphs, so keep them."
    assert "selective-vs-te-graphs-flipped" in found(RECOMPUTE, bad)


def test_a_verdict_after_the_quoted_list_rejects_its_labels() -> None:
    text = ("`recompute_modules: [attn_proj, norm]`: shorthand, not MCore labels; MCore "
            "rejects them.\n")
    assert invented_keys(parse_answer(text).units) == []


def test_a_record_read_out_places_no_step() -> None:
    text = ("Here is what the tracker shows (BF16 + HybridEP): 64K at CP 16 used ~160 GB.\n\n"
            "At 128K start from CP = 131072 / 4096 = 32.\n")
    assert order_ok(LONG, text)


def test_mlp_as_the_last_selective_step_is_not_mlp_first() -> None:
    text = ("| # | lever | cost |\n|---|---|---|\n"
            "| 1 | `recompute_modules: [mlp]` | ~16 % slower, the last selective step |\n")
    assert "mlp-recompute-first" not in found(MEMORY, text)


def test_a_question_that_says_it_comes_first_places_its_step() -> None:
    text = ("1. Selective recompute: `recompute_modules=[\"layernorm\"]`.\n\n"
            "Before any of that: is `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` set?\n")
    assert order_ok(RECOMPUTE, text)


def test_a_japanese_same_condition_baseline_is_the_contract() -> None:
    text = "41〜50 の区間で、同条件ベースラインとステップ時間を比較してください。"
    assert "no-measurement-contract" not in found(WORKFLOW, text)


def test_an_answer_that_opens_with_a_horizontal_rule_is_read_as_its_body() -> None:
    text = "---\n### Slide 1: sizing\n- CP = seq_length / 4096\n---\n### Slide 2\n- EP 32\n"
    a = parse_answer(text)
    assert a.meta == {} and any("seq_length / 4096" in u.norm for u in a.units)
    framed = parse_answer("---\nverdict: pass\n---\nSet expandable_segments first.\n")
    assert framed.meta == {"verdict": "pass"} and len(framed.units) == 1
