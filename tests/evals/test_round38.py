"""Round 38: readings that other people's answers needed - a plan step whose head says it comes
first, bullets named for their step, a list of facts to gather, a code comment about another
edit, a validator message with several gaps, a measured pair's stated change and the speakers
of a chat thread - each with the near miss that must still count."""

from __future__ import annotations

from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW

from mbridge_perf.evals.answer import parse_answer, thread_users
from mbridge_perf.evals.claims import change_errors
from mbridge_perf.evals.configs import config_errors
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO


def _failed(skill: str, text: str, check: str) -> bool:
    """Whether the named check fails on the answer."""
    g = grade_skill(get_skill(REPO, skill).card, parse_answer(text), skill)
    return any(not e.passed and e.counted and e.check == check for e in g.expectations)


# ------------------------------------------------------------------ order: a step that says first

STEPS = """Order for the 70B OOM:

1. **{head}** core_attn frees about nothing under TE fused attention; put `layernorm` in
   `recompute_modules` instead. It costs little, but [core_attn, layernorm] still hit OOM at
   59.6 GB on this layout.
2. **Then the allocator.** If layernorm is not enough, export
   `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
3. **`mlp` as the last resort.** recompute_modules=["mlp"] fits at 55.6 GB but costs 16.4 %;
   keep it selective, and adding core_attn on top only makes it slower."""


def test_a_step_head_saying_first_puts_its_body_first() -> None:
    # by position alone the order passes: selective recompute is named again in step 3
    assert not _failed(RECOMPUTE, STEPS.format(head="Change the recompute module."),
                       "checklist.order")
    text = STEPS.format(head="Change the recompute module first.")
    assert _failed(RECOMPUTE, text, "checklist.order")


def test_a_first_step_that_names_no_later_item_keeps_the_order() -> None:
    text = """Order for the 70B OOM:

1. **Read the memory lines first.** Compare mem-max-reserved-gigabytes with
   mem-max-allocated-gigabytes on the failing rank.
2. **Then the allocator.** Export `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
3. **Then recompute.** Put `layernorm` in `recompute_modules`; `mlp` only as the last resort."""
    assert not _failed(RECOMPUTE, text, "checklist.order")


CHECKLIST = """OOM checklist:

- [ ] **Gather facts**: TP/PP/VPP, seq_length, cuda_graph_impl, the current recompute_* and
  PYTORCH_CUDA_ALLOC_CONF.
- [ ] **Step 1: {first}** recompute_granularity="selective", recompute_modules=["layernorm"].
- [ ] **Step 2: if still over, export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.**
- [ ] **Step 3: mlp last.**"""


def test_bullets_named_step_n_are_a_plan_and_a_fact_list_is_no_step() -> None:
    text = CHECKLIST.format(first="start with selective recompute.")
    assert _failed(RECOMPUTE, text, "checklist.order")


def test_the_allocator_as_step_1_of_named_bullets_is_in_order() -> None:
    text = (CHECKLIST.replace("Step 2: if still over, export", "Step 0: export")
            .format(first="selective recompute."))
    text = text.replace("- [ ] **Step 0", "- [ ] **Step 1a").replace("Step 1: ", "Step 1b: ")
    lines = text.splitlines()
    # put the allocator bullet before the recompute bullet
    lines[4], lines[5] = lines[5], lines[4]
    assert not _failed(RECOMPUTE, "\n".join(lines), "checklist.order")


# ------------------------------------------------------------------ configs the answer writes

GRAPHS = """```python
cfg.model.recompute_granularity = "selective"
cfg.model.recompute_modules = ["moe_act", "moe"]
cfg.model.cuda_graph_impl = "transformer_engine"
cfg.model.cuda_graph_modules = ["attn", "moe_router", "moe_preprocess"]   {comment}
```"""


def test_a_comment_forbidding_another_edit_leaves_its_line_set() -> None:
    a = parse_answer(GRAPHS.format(comment='# do NOT add "moe": dropless model'))
    assert [f.rule_id for f in config_errors(a.units)] == ["recompute.moe-vs-router-graph"]


def test_a_comment_rejecting_the_line_itself_still_unsets_it() -> None:
    a = parse_answer(GRAPHS.format(comment="# do not use this"))
    assert config_errors(a.units) == []


OVERLAP = """```json
{{"config_overrides": {{
  "model.moe_token_dispatcher_type": "flex",
  "comm_overlap.overlap_moe_expert_parallel_comm": true,
  "model.moe_shared_expert_overlap": {shared}}}}}
```"""


def test_a_gap_of_the_answers_own_is_reported_though_another_gap_is_the_bases() -> None:
    a = parse_answer(OVERLAP.format(shared="true"))
    errs = config_errors(a.units, a.json_blocks)
    assert [e.rule_id for e in errs] == ["moe-overlap.requirements"]
    assert "moe_shared_expert_overlap=True" in errs[0].message
    assert "expert_model_parallel_size" not in errs[0].message


def test_only_the_bases_gap_is_not_the_answers_error() -> None:
    a = parse_answer(OVERLAP.format(shared="false"))
    assert config_errors(a.units, a.json_blocks) == []


# ------------------------------------------------------------------ a measured pair's change

def test_a_fall_stated_as_the_speedup_is_wrong() -> None:
    a = parse_answer("Step time dropped by 17.73 %, from 24.7138 s to 20.9920 s.")
    errs = change_errors(a.units)
    assert len(errs) == 1 and errs[0].actual == 15.06


def test_the_fall_and_the_throughput_gain_each_checked_right() -> None:
    a = parse_answer("Step time 24.7138 s → 20.9920 s (−15.06 %), "
                     "throughput 244.039 → 287.305 TFLOP/s/GPU (+17.73 %).")
    assert change_errors(a.units) == []


def test_a_layouts_small_integers_are_no_measured_pair() -> None:
    assert change_errors(parse_answer("TP 4 → 8 (-28.4 %) is the last resort.").units) == []


def test_a_signed_change_against_the_pairs_direction_is_not_judged() -> None:
    # "(-17.73 %)" after a rising pair reads another quantity; nothing to recompute
    a = parse_answer("Throughput 244.039 → 287.305 TFLOP/s/GPU (-17.73 %).")
    assert change_errors(a.units) == []


# ------------------------------------------------------------------ chat threads

THREAD = """**@lena** Qwen3 30B-A3B on 16×H100 went 244.039 → 299.352 TFLOP/s/GPU.
Was that the EP overlap?

**@perf-bot** No: the isolated EP overlap A/B gave 244.039 → 287.305 (+17.73 %). {tail}"""


def test_the_users_lines_in_a_thread_are_quoted() -> None:
    text = THREAD.format(tail="The rest came from the tuned standard recipe.")
    assert thread_users(text) == {"lena"}
    assert not _failed(WORKFLOW, text, "misconceptions")


def test_the_answerers_own_lines_are_still_read() -> None:
    text = THREAD.format(tail="Overall EP overlap took you from 244.039 to 299.352.")
    assert _failed(WORKFLOW, text, "misconceptions")


def test_without_a_helper_name_the_second_speaker_answers() -> None:
    text = "**@dana:** is TP 8 fine?\n\n**@ravi:** No.\n\n**@dana:** ok"
    assert thread_users(text) == {"dana"}


def test_bold_labels_are_no_speakers() -> None:
    assert thread_users("**Status** accepted\n\n**Context** the 70B run") == set()


# ------------------------------------------------------------------ claims widened this round

def test_a_table_cell_of_the_distributed_optimizers_cost_is_checked() -> None:
    row = ("| 3 | `optimizer.use_distributed_optimizer = True` | shards optimizer state over DP | "
           "about {cost} % | recommended |")
    assert _failed(MEMORY, "Levers:\n\n" + row.format(cost="8–10"), "misconceptions")
    assert not _failed(MEMORY, "Levers:\n\n" + row.format(cost="1–2"), "misconceptions")


def test_long_context_mfu_across_precisions() -> None:
    text = ("Run BF16 and MXFP8 on the same layout for 50 steps. The one with the higher MFU "
            "wins: MFU normalises each run to its own peak, so it is the fair cross-precision "
            "comparison.")
    assert _failed(LONG, text, "misconceptions")
    fixed = text.replace("The one with the higher MFU wins: MFU normalises each run to its own "
                         "peak, so it is the fair cross-precision comparison.",
                         "Compare TFLOP/s/GPU, not MFU: FP8 MFU uses a higher peak.")
    assert not _failed(LONG, fixed, "misconceptions")


# ------------------------------------------------------------------ narrow answers read fairly

def test_a_not_options_label_rejects_every_item_past_its_semicolons() -> None:
    text = ("Allocator is set and rank 0 still OOMs.\n\n"
            "**Not options:** layer CPU offloading (PP 4 > 1); VPP (a bubble knob); "
            "FP8 as a memory fix (higher-precision copies are kept).")
    assert not _failed(MEMORY, text, "misconceptions")
    plain = text.replace("**Not options:** layer CPU offloading (PP 4 > 1); VPP (a bubble knob); ",
                         "**Options:** ")
    assert _failed(MEMORY, plain.replace(" (higher-precision copies are kept)",
                                         ": FP8 halves the weight memory"), "misconceptions")


def test_capacity_after_the_allocator_is_ruled_out_is_no_claim() -> None:
    claim = "This is a genuine capacity limit, not fragmentation."
    assert not _failed(MEMORY, "The allocator is ruled out. " + claim, "misconceptions")
    assert _failed(MEMORY, "Only rank 0 is over. " + claim, "misconceptions")


LABELLED = """Ship check for the overlap candidate:

1. **Retune one variable at a time** against the matched baseline.
2. **Validate over at least 50 steps**, window 41-50, finite loss, zero skipped/NaN.
3. {last}"""


def test_labelling_a_result_is_no_contract_step() -> None:
    text = LABELLED.format(last="Label the result training-equivalent or benchmark-only.")
    assert not _failed(WORKFLOW, text, "checklist.order")


def test_freezing_the_contract_last_is_still_out_of_order() -> None:
    text = LABELLED.format(last="Freeze the measurement contract.")
    assert _failed(WORKFLOW, text, "checklist.order")
