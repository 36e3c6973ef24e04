"""Round 36: structure other people's answers use - a block the answer reviews, a blockquoted
command, a Japanese prohibition, layout arithmetic stated with the answer's own sizes - each
with the near miss that must still be caught."""

from __future__ import annotations

import pytest
from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.layout import accumulation_errors, formula_errors
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO


def test_a_japanese_prohibition_is_not_the_claim_it_forbids() -> None:
    assert "summed-kernel-time" not in found(
        WORKFLOW, "オーバーラップの効果は、カーネル時間の合計で判断してはいけません。")


def test_the_same_japanese_sentence_as_advice_is_still_the_claim() -> None:
    assert "summed-kernel-time" in found(
        WORKFLOW, "オーバーラップの効果は、カーネル時間の合計で判断してください。")


QUOTED_FLAG = """> `--moe_a2a_overlap true   # isolates EP overlap`

That flag also turns on delayed wgrad, so it does not isolate EP overlap."""


def test_a_blockquoted_command_is_the_users_words() -> None:
    assert "a2a-flag-is-plain-ep-overlap" not in found(WORKFLOW, QUOTED_FLAG)


def test_the_same_command_unquoted_is_the_answers_own() -> None:
    text = "`--moe_a2a_overlap true   # isolates EP overlap`"
    assert "a2a-flag-is-plain-ep-overlap" in found(WORKFLOW, text)


REVIEWED = """Requesting changes on your recompute list:

```python
cfg.model.recompute_modules = ["up_proj", "norm"]
```

`up_proj` and `norm` are not Megatron-Core labels. Write `mla_up_proj` and `layernorm`."""


def _passes_keys(text: str) -> bool:
    card = get_skill(REPO, RECOMPUTE).card
    grade = grade_skill(card, parse_answer(text), RECOMPUTE)
    return next(e for e in grade.expectations if e.check == "valid_keys_only").passed


def test_a_block_under_a_review_lead_is_the_state_reviewed() -> None:
    assert _passes_keys(REVIEWED)


def test_the_same_block_offered_as_the_fix_is_advice() -> None:
    assert not _passes_keys(REVIEWED.replace("Requesting changes on your recompute list:",
                                             "Set this:"))


def test_a_japanese_check_that_a_warning_is_absent_is_no_advice() -> None:
    assert found(LONG, "ログに core_attn の警告が出ていないことを確認してください。") == []


def test_japanese_advice_to_add_the_label_is_still_the_claim() -> None:
    text = "128K では core_attn の再計算を追加してください。"
    assert "core-attn-at-long-seq" in found(LONG, text)


OPENING_DIFF = """```python
 cfg.model.context_parallel_size = 8
+cfg.model.recompute_modules = ["up_proj"]
```

{verdict} `up_proj` is not a recompute label; the MLA one is `mla_up_proj`."""


def test_a_diff_the_answer_opens_with_is_reviewed_when_a_verdict_follows() -> None:
    assert _passes_keys(OPENING_DIFF.format(verdict="**Comment (blocking):**"))


def test_an_opening_block_without_a_review_verdict_is_the_answers_config() -> None:
    assert not _passes_keys(OPENING_DIFF.format(verdict="Then check:"))


@pytest.mark.parametrize(("text", "missing"), [
    ("Expert mesh: ETP=1, EP=8, PP=2. EDP = world / (ETP·EP) = 64 / 8 = 8.", "PP (= 2)"),
    ("Layout TP=2, PP=4, CP=1. Dense DP = world / (TP·CP) = 16.", "PP (= 4)"),
    ("EP=16 and PP=2 on 128 GPUs: EDP = world / (ETP*PP) = 64.", "EP (= 16)"),
])
def test_a_data_parallel_formula_that_drops_a_sized_dimension_is_caught(text: str,
                                                                        missing: str) -> None:
    found = formula_errors(parse_answer(text).units)
    assert found and missing in found[0].evidence, found


@pytest.mark.parametrize("text", [
    "Expert mesh: ETP=1, EP=8, PP=2. EDP = world / (ETP·EP·PP) = 64 / 16 = 4.",
    "EP=8 on one stage (PP=1): EDP = world / (ETP·EP) = 8.",
    "Layout TP=2, PP=4. Dense DP = world / (TP·PP·CP) = 8.",
])
def test_the_complete_formulas_and_a_dimension_of_one_are_not(text: str) -> None:
    assert formula_errors(parse_answer(text).units) == []


SHAPE = "Llama3 70B, TP4 PP4 DP2, MBS 1, GBS 64, seq 4096.\n\n"


def test_an_accumulation_count_that_is_not_gbs_over_mbs_dp_is_wrong_arithmetic() -> None:
    found = accumulation_errors(parse_answer(
        SHAPE + "Going to PP 8 halves DP: DP 1 means 32 accumulation steps per update.").units)
    assert found and found[0].actual == 64 and "DP 1 means 32" in found[0].evidence


@pytest.mark.parametrize("tail", [
    "Going to PP 8 halves DP: DP 1 means 64 accumulation steps per update.",
    "The baseline runs 32 accumulation steps at DP 2.",
    "PP 8 doubles the accumulation micro-batches.",              # no count: nothing to check
])
def test_a_right_count_or_one_without_a_dp_beside_it_is_not(tail: str) -> None:
    assert accumulation_errors(parse_answer(SHAPE + tail).units) == []


def test_two_global_batch_sizes_leave_the_count_unjudged() -> None:
    text = SHAPE + "At GBS 128 instead, DP 1 means 32 accumulation steps."
    assert accumulation_errors(parse_answer(text).units) == []


MLP_STEP = ("4. If it still does not fit, add `mlp` to `recompute_modules`. "
            "That saves about 3 GB for roughly {cost} throughput, a cheap last step.")


def test_a_figure_in_the_sentence_that_points_back_at_its_subject_is_judged() -> None:
    assert "mlp-cost-understated" in found(MEMORY, MLP_STEP.format(cost="1-2 %"))


@pytest.mark.parametrize("text", [
    MLP_STEP.format(cost="16 %"),
    MLP_STEP.replace("That saves", "\n\nThe allocator fix saves").format(cost="2 %"),
])
def test_the_measured_figure_or_another_subject_is_not(text: str) -> None:
    assert "mlp-cost-understated" not in found(MEMORY, text)


def test_an_env_key_in_a_json_change_map_is_read_as_its_setting() -> None:
    text = ('```json\n{"steps": [{"step": 1, "change": '
            '{"env.PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}]}\n```')
    units = parse_answer(text).units
    assert any("expandable_segments" in u.norm for u in units)
    lower = text.replace("env.PYTORCH_CUDA_ALLOC_CONF", "env.Pytorch alloc")
    assert not any("expandable_segments" in u.norm for u in parse_answer(lower).units)


def test_a_failure_set_aside_by_rather_than_does_not_negate_the_claim() -> None:
    text = ('Keep recompute_granularity="full" under the TE graphs: the full-recompute '
            'combination mostly costs some of the graph gain rather than failing.')
    assert "full-recompute-runs-under-te-graphs" in found(WORKFLOW, text)
    refused = text.replace("rather than failing", "and it fails at startup")
    assert "full-recompute-runs-under-te-graphs" not in found(WORKFLOW, refused)


def test_a_japanese_becomes_unusable_negates_the_combination() -> None:
    text = ("将来 FP8 の delayed scaling に切り替える場合、"
            "moe_act と layernorm の再計算は使えなくなります。")
    assert "delayed-fp8-with-recompute" not in found(RECOMPUTE, text)
    assert "delayed-fp8-with-recompute" in found(
        RECOMPUTE, "FP8 の delayed scaling でも moe_act と layernorm の再計算は使えます。")


def test_japanese_try_x_before_adding_modules_puts_x_first() -> None:
    from mbridge_perf.evals.checks import checklist

    items = get_skill(REPO, RECOMPUTE).card["answer_checklist"]
    text = ("moe_act の再計算を使います。コストは低めです。\n\n"
            "境界ぎりぎりの OOM であれば、モジュールを追加する前に "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` を試してください。")
    got = [e for e in checklist(parse_answer(text), items, lenient_order=True)
           if e.check == "checklist.order"]
    assert got and got[0].passed, got
    late = text.replace("モジュールを追加する前に ", "")
    got = [e for e in checklist(parse_answer(late), items, lenient_order=True)
           if e.check == "checklist.order"]
    assert got and not got[0].passed, got
