"""Round 37: readings that other people's answers needed - an explicit "first", a setting kept
in the job env, a constraint stated, the block a review opens on, a diff's removed lines, a
report's checked claim, a YAML config block, the expert mesh's formula, a heading that narrates,
narrow answers and the measurement contract - each with the near miss that must still count."""

from __future__ import annotations

from test_claims import RECOMPUTE, WORKFLOW, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.layout import formula_errors
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO


def _failed(skill: str, text: str, check: str) -> bool:
    """Whether the named check fails on the answer."""
    g = grade_skill(get_skill(REPO, skill).card, parse_answer(text), skill)
    return any(not e.passed and e.counted and e.check == check for e in g.expectations)


# ------------------------------------------------------------------ order: what comes first

OPTIONS = """Full recompute asserts with TE-scoped graphs. Choose one:

1. Return to submodule recompute: recompute_granularity="selective" with recompute_modules.
2. Switch graphs off with cuda_graph_impl="none".

{tail}"""


def test_first_check_x_puts_x_first_wherever_it_stands() -> None:
    tail = ("If an OOM sent you to full recompute, first check that "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is exported.")
    assert not _failed(RECOMPUTE, OPTIONS.format(tail=tail), "checklist.order")


def test_the_allocator_last_without_a_first_is_still_out_of_order() -> None:
    tail = "Also export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True."
    assert _failed(RECOMPUTE, OPTIONS.format(tail=tail), "checklist.order")


def test_before_any_recompute_change_puts_it_first() -> None:
    tail = ("Try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before any recompute change; "
            "it removed the OOM on this recipe.")
    assert not _failed(RECOMPUTE, OPTIONS.format(tail=tail), "checklist.order")


def test_keeping_a_variable_in_the_job_env_is_no_step() -> None:
    tail = ("For option 1, keep PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and "
            "NCCL_GRAPH_REGISTER=0 in the job env, because TE graphs stay on.")
    assert not _failed(RECOMPUTE, OPTIONS.format(tail=tail), "checklist.order")


def test_a_constraint_stated_is_no_step_of_the_plan() -> None:
    text = ("recompute_granularity=\"full\" with recompute_method and recompute_num_layers is "
            "only accepted with a full-iteration graph.\n\n"
            "Go back to recompute_granularity=\"selective\"; it works with TE graphs.")
    assert not _failed(RECOMPUTE, text, "checklist.order")
    advised = ("Set recompute_method=\"uniform\" and recompute_num_layers=4.\n\n"
               "Go back to recompute_granularity=\"selective\"; it works with TE graphs.")
    assert _failed(RECOMPUTE, advised, "checklist.order")


# ------------------------------------------------------------- what a review shows, not says

CHANGES_ASKED = """**Requesting changes.**

```python
cfg.model.recompute_modules = ["up_proj"]
```

`up_proj` is not a label at the pin: write `mla_up_proj`."""


def test_the_block_a_changes_requested_review_opens_on_is_the_reviewed_state() -> None:
    assert not _failed(RECOMPUTE, CHANGES_ASKED, "valid_keys_only")


def test_the_same_block_without_the_verdict_is_the_answers_own() -> None:
    text = CHANGES_ASKED.replace("**Requesting changes.**", "Here is the fix.")
    assert _failed(RECOMPUTE, text, "valid_keys_only")


def test_a_diffs_removed_line_is_the_old_state() -> None:
    diff = "```diff\n- --recompute_modules up_proj\n+ --recompute_modules mla_up_proj\n```\n"
    assert "invented-up-proj-label" not in found(RECOMPUTE, diff)
    added = "```diff\n- --recompute_modules mla_up_proj\n+ --recompute_modules up_proj\n```\n"
    assert "invented-up-proj-label" in found(RECOMPUTE, added)


def test_a_reports_checked_claim_is_not_its_advice() -> None:
    checked = ('```json\n{"claim_checked": "Add moe_act recompute next under fp8_recipe=delayed",'
               ' "verdict": "rejected"}\n```\n')
    assert "delayed-fp8-recompute-labels-advised" not in found(RECOMPUTE, checked)
    advised = checked.replace("claim_checked", "next_step")
    assert "delayed-fp8-recompute-labels-advised" in found(RECOMPUTE, advised)


def test_a_blockquote_is_the_quoted_text_and_a_note_callout_is_not() -> None:
    quoted = "> Enabling EP overlap took Qwen3 30B-A3B from 244.039 to 299.352 TFLOP/s/GPU.\n"
    assert "gain-credited-to-one-knob" not in found(WORKFLOW, quoted)
    assert "gain-credited-to-one-knob" in found(WORKFLOW, quoted.removeprefix("> "))
    assert not parse_answer("> **Note:** export the allocator setting first.\n").units[0].quoted


# ------------------------------------------------------------------------- YAML config blocks

YAML_BLOCK = """Fix the memory wall with selective recompute:

```yaml
model:
  recompute_granularity: selective
  recompute_modules: [moe_act, layernorm{extra}]
  moe_grouped_gemm: true
comm_overlap:
  overlap_moe_expert_parallel_comm: true
```
"""


def test_a_yaml_block_is_validated_like_code() -> None:
    assert _failed(WORKFLOW, YAML_BLOCK.format(extra=", moe"), "misconceptions")


def test_the_same_yaml_without_the_refused_label_passes_the_validator() -> None:
    assert not _failed(WORKFLOW, YAML_BLOCK.format(extra=""), "misconceptions")


def test_a_yaml_block_shown_as_the_current_state_is_not_validated() -> None:
    shown = YAML_BLOCK.format(extra=", moe").replace("```yaml\n", "```yaml\n# current config\n")
    assert not _failed(WORKFLOW, shown, "misconceptions")


# ------------------------------------------------------------------ the expert mesh's formula

def _formulas(text: str) -> list[str]:
    return [e.missing for e in formula_errors(parse_answer(text).units)]


def test_edp_over_a_numeric_world_that_leaves_out_etp_is_wrong() -> None:
    text = "Layout: ETP 2, EP 8, PP 4 on 128 GPUs. EDP = 128 / (EP·PP) = 4."
    assert _formulas(text) and "ETP" in _formulas(text)[0]
    assert not _formulas("Layout: ETP 2, EP 8, PP 4 on 128 GPUs. EDP = 128 / (ETP·EP·PP) = 2.")


def test_edp_with_the_attention_tp_in_place_of_a_different_etp_is_wrong() -> None:
    text = "TP 2, ETP 1, EP 16, PP 4 on 256 GPUs: EDP = 256 / (TP·EP·PP) = 2."
    assert _formulas(text)
    assert not _formulas("TP 2, ETP 1, EP 16, PP 4 on 256 GPUs: EDP = 256 / (ETP·EP·PP) = 4.")


def test_an_expert_dp_row_is_read_as_the_expert_mesh() -> None:
    row = ("Sizes: TP 1, PP 8, CP 16, EP 32, ETP 1.\n\n| mesh | formula | size |\n|---|---|---|\n"
           "| expert DP (EDP) | 256 / (EP32 · ETP1 · PP8) | **1** |\n")
    assert not _formulas(row)


# --------------------------------------------------------------- headings, Japanese negation

def test_a_heading_that_narrates_an_event_does_not_negate_its_section() -> None:
    text = ("## Postmortem: the speedup did not reach production\n\n"
            "Take step time and TFLOP/s/GPU from those same profiled iterations 41-50.\n")
    assert "metric-from-profiled-run" in found(WORKFLOW, text)
    rejected = text.replace("the speedup did not reach production", "what not to do")
    assert "metric-from-profiled-run" not in found(WORKFLOW, rejected)


def test_japanese_expect_nothing_negates_core_attn() -> None:
    assert "core-attn-first-default-backend" not in found(
        RECOMPUTE, "TE fused attention なので `core_attn` には期待しない。"
                   "まず layernorm を再計算します。")


# ------------------------------------------------------ the measurement contract, narrow answers

def test_a_narrow_answer_about_one_flag_is_not_held_to_the_whole_contract() -> None:
    text = ("--moe_a2a_overlap true also turns on delay_wgrad_compute, so set "
            "comm_overlap.overlap_moe_expert_parallel_comm=True and delay_wgrad_compute=False.")
    assert "no-measurement-contract" not in found(WORKFLOW, text)


def test_a_plan_without_the_contract_still_fails() -> None:
    text = "1. Fit: estimate_memory. 2. Scale: maximise DP. 3. Profile the dominant wall."
    assert "no-measurement-contract" in found(WORKFLOW, text)


def test_an_answer_to_a_startup_assertion_is_not_held_to_the_allocator_step() -> None:
    text = ("Full recompute asserts with every graph impl except full_iteration, so if you are "
            "still short, go back to selective recompute with layernorm.")
    assert "no-allocator-check" not in found(RECOMPUTE, text)
    oom = "You are still short by 3 GB: go back to selective recompute with layernorm."
    assert "no-allocator-check" in found(RECOMPUTE, oom)


# ------------------------------------------------------------- a script's variables are no knobs

SCRIPT = """Hidden share from the matched profile:

```python
comm_u = union([(k.start, k.end) for k in comm])
hidden_share = hidden / total
{extra}
```
"""


def test_a_scripts_computed_variables_are_not_invented_knobs() -> None:
    assert not _failed(WORKFLOW, SCRIPT.format(extra=""), "valid_keys_only")


def test_an_invented_setting_in_the_same_script_is_still_one() -> None:
    assert _failed(WORKFLOW, SCRIPT.format(extra="moe_fast_dispatch = True"), "valid_keys_only")
