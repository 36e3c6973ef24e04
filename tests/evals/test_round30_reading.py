"""Round 30: readings blind batch 10 showed the grader missing - a step placed "before any of
that" or with その前に, a review quoting the user's diff, a name judged "not a label", a size
written as a config path or in a table cell, a Japanese slide's plain-form step, FP8 sold as a
memory drop. Each is tested in sentences of our own, with a near miss that must not trip it."""

from __future__ import annotations

from test_claims import LONG, MEMORY, RECOMPUTE, card, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.keys import invented_keys
from mbridge_perf.evals.text import normalise


def _grade(skill: str, text: str) -> dict[str, bool]:
    g = grade_skill(card(skill), parse_answer(text), skill)
    return {e.check: e.passed for e in g.expectations if e.counted} | {"passed": g.passed}


# ---------------------------------------------------------------- order: placed first

def test_before_any_of_that_puts_the_allocator_check_first() -> None:
    text = ("Two ways out of the assertion:\n\n"
            "1. Selective recompute with `layernorm`, then `mlp` if you still lack memory.\n"
            "2. Disable the TE graphs with `cuda_graph_impl=\"none\"`.\n\n"
            "Before any of that, make sure `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` "
            "reaches every rank.\n")
    assert _grade(RECOMPUTE, text)["checklist.order"]


def test_an_allocator_check_only_named_afterwards_still_breaks_the_order() -> None:
    text = ("1. Selective recompute with `layernorm`, then `mlp` if you still lack memory.\n"
            "2. After that, set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.\n")
    assert not _grade(RECOMPUTE, text)["checklist.order"]


def test_sono_mae_ni_places_a_japanese_step_ahead_of_the_list() -> None:
    text = ("- まず selective recompute で `layernorm` を入れてください。\n"
            "- 足りなければ `mlp` を追加してください。\n"
            "- その前に、`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` が全 rank に"
            "入っているかを確認してください。\n")
    assert _grade(RECOMPUTE, text)["checklist.order"]


# ---------------------------------------------------------------- a review quotes the diff

def test_a_blockquoted_config_line_is_the_users_diff_not_advice() -> None:
    text = ("Review of `train.yaml`:\n\n"
            "> `recompute_modules: [attn_proj, layernorm]`\n\n"
            "`attn_proj`: not a recompute label; MCore rejects it at startup. Use "
            "`recompute_modules: [layernorm]`.\n")
    units = parse_answer(text).units
    assert units[1].quoted
    assert invented_keys(units) == []


def test_an_invented_label_in_the_answers_own_setting_is_still_caught() -> None:
    text = "Use `recompute_modules: [attn_proj, layernorm]` to save memory.\n"
    assert [b.what for b in invented_keys(parse_answer(text).units)]


def test_a_blockquoted_note_in_prose_is_still_read() -> None:
    units = parse_answer("> Note: raise TP 4→8 first.\n").units
    assert not units[0].quoted


# ---------------------------------------------------------------- sizes in config paths, tables

def test_a_size_written_as_a_config_path_or_a_table_cell_reads_as_a_size() -> None:
    assert normalise("model.pipeline_model_parallel_size=8") == "model.pp=8"
    assert "pp=4 -> pp=8" in normalise("| `model.pipeline_model_parallel_size` | 4 → 8 |")
    assert normalise("| PP | DP | TP |") == "| pp | dp | tp |"
    assert normalise("model.virtual_pipeline_model_parallel_size: 5") == "model.vpp=5"


def test_a_pp_raise_priced_as_free_in_a_lever_table_is_a_wrong_claim() -> None:
    row = ("| 2 | `model.pipeline_model_parallel_size` | 4 → 8, DP 2 → 1 | smaller stages | "
           "costs nothing worth measuring |\n")
    assert "pp-cost-understated" in found(MEMORY, "| # | knob | value | effect | cost |\n"
                                                  "|---|---|---|---|---|\n" + row)


def test_a_pp_raise_priced_at_its_measured_cost_is_not() -> None:
    row = ("| 5 | `model.pipeline_model_parallel_size` | 4 → 8, DP 2 → 1 | smaller stages | "
           "-5.9 %, skip |\n")
    assert "pp-cost-understated" not in found(MEMORY, row)


def test_tp8_named_as_the_next_lever_through_a_config_path() -> None:
    text = ("Allocator flag first. If the peak is still over, the next step is "
            "`model.tensor_model_parallel_size=16`.\n")
    assert "tp-named-next-lever" in found(MEMORY, text)


# ---------------------------------------------------------------- Japanese plain-form steps

def test_a_japanese_slide_step_in_plain_form_is_advice() -> None:
    text = ("### recompute\n"
            "- 128K では attention が重いので、まず `core_attn` を recompute に入れる\n")
    assert "core-attn-at-long-seq" in found(LONG, text)


def test_a_japanese_slide_step_that_leaves_core_attn_out_is_not() -> None:
    text = ("### recompute\n"
            "- 128K では、まず `moe_act` を recompute に入れる (`core_attn` は入れない)\n")
    assert "core-attn-at-long-seq" not in found(LONG, text)


# ---------------------------------------------------------------- FP8 as a memory lever

def test_fp8_sold_as_making_memory_drop_is_a_wrong_claim() -> None:
    text = ("Switch the BF16 run to an FP8 recipe: values stored in 8 bits mean the "
            "activation memory will drop a lot.\n")
    assert "fp8-saves-memory" in found(MEMORY, text)


def test_fp8_for_speed_with_memory_kept_is_not() -> None:
    text = ("An FP8 recipe is for speed: it keeps the BF16 weights, so memory will not drop; "
            "for memory use FP8 param gather.\n")
    assert "fp8-saves-memory" not in found(MEMORY, text)


# ---------------------------------------------------------------- wrapped comments in code

def test_a_sentence_wrapped_over_comment_lines_is_one_unit() -> None:
    text = ("```yaml\n"
            "# Target: 32x H100, TP4 PP4\n"
            "# Next: recompute the norms only; their cost stays below one percent and\n"
            "# (per the measured runs) frees little.\n"
            "recompute_modules: [layernorm]   # inline note stays with its line\n"
            "```\n")
    norms = [u.norm for u in parse_answer(text).units]
    assert norms == ["# target: 32x h100, tp=4 pp=4",
                     "# next: recompute the norms only; their cost stays below one percent "
                     "and (per the measured runs) frees little.",
                     "recompute_modules: [layernorm] # inline note stays with its line"]


def test_comment_lines_that_open_new_thoughts_stay_apart() -> None:
    text = "```bash\n# Step 1: export the allocator flag\n# Step 2: rerun 50 steps\n```\n"
    assert len(parse_answer(text).units) == 2
