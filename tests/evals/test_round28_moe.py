"""Round 28, MoE skills (long context, optimization workflow): mistake classes the blind
batches showed the grader missing, and good answers it failed, tested in sentences of our own."""

from __future__ import annotations

import pytest
from test_claims import LONG, WORKFLOW, found


@pytest.mark.parametrize("skill", [LONG, WORKFLOW])
def test_a_config_line_that_switches_layer_offload_on_is_advice(skill: str) -> None:
    on = ("Layout: TP=2 PP=4 EP=8.\n\n```python\nrecipe.model.cpu_offloading = True\n"
          "recipe.model.cpu_offloading_num_layers = 3\n```\n")
    assert "cpu-offload-at-pp-gt-1" in found(skill, on)
    off = ("Layout: TP=2 PP=4 EP=8.\n\n```python\nrecipe.model.cpu_offloading = False\n"
           "recipe.optimizer.optimizer_cpu_offload = True\n```\n")
    assert "cpu-offload-at-pp-gt-1" not in found(skill, off)


def test_config_lines_of_one_code_block_are_not_ordered_against_each_other() -> None:
    from test_claims import card

    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.grade import grade_skill

    text = ("Size CP at 65536 / 4096 = 16 tokens-per-rank target; keep DP above 1.\n\n"
            "```python\ncfg.model.moe_flex_dispatcher_backend = \"deepep\"\n"
            "cfg.model.recompute_granularity = \"selective\"\n"
            "cfg.model.recompute_modules = [\"mla_up_proj\", \"layernorm\"]\n```\n")
    grade = grade_skill(card(LONG), parse_answer(text), LONG)
    order = [e for e in grade.expectations if "order" in e.text]
    assert all(e.passed for e in order), [e.evidence for e in order]
    prose = ("1. Use flex with moe_flex_dispatcher_backend deepep.\n"
             "2. Then set recompute_granularity selective.\n")
    grade = grade_skill(card(LONG), parse_answer(prose), LONG)
    assert not all(e.passed for e in grade.expectations if "order" in e.text)


@pytest.mark.parametrize(("text", "mid"), [
    ("Plan on a 8K-token shard per CP rank here: CP = 65536 / 8192 = 8.", "cp-from-8k-shard"),
    ("All four parallel sizes stack, so the run needs 4096 GPUs.", "gpu-count-dims-multiply"),
    ("Leave ETP alone, it falls back to 1 for the experts.", "etp-unset-defaults-to-one"),
    ("At 256K I would add core_attn to the recompute list first.", "core-attn-at-long-seq"),
])
def test_long_context_mistake_classes_in_new_words(text: str, mid: str) -> None:
    assert mid in found(LONG, text)


@pytest.mark.parametrize(("text", "mid"), [
    ("The 8192-token shard only applies inside the SP regions; CP still targets 4096 per rank.",
     "cp-from-8k-shard"),
    ("The meshes fold: the GPU count is PP·max(TP·CP, EP·ETP), not every dimension multiplied.",
     "gpu-count-dims-multiply"),
    ("ETP inherits TP when left unset, so pin it to 1 yourself.", "etp-unset-defaults-to-one"),
    ("Avoid core_attn at 256K; recompute moe_act and layernorm instead.", "core-attn-at-long-seq"),
])
def test_long_context_correct_uses_of_the_same_words(text: str, mid: str) -> None:
    assert mid not in found(LONG, text)


@pytest.mark.parametrize(("text", "mid"), [
    ("Use the launcher option --moe_a2a_overlap true by itself as the clean EP-overlap test.",
     "a2a-flag-is-plain-ep-overlap"),
    ("Write it up as: EP overlap lifted throughput from 244.039 to 299.352.",
     "gain-credited-to-one-knob"),
    ("Believe the kernel totals; the step time is noisy.", "kernel-sum-over-step-time"),
    ("BF16 shows 40 % MFU and FP8 only 30 %, so BF16 is better.", "mfu-across-precisions"),
    ("cuda_graph_modules: [moe_router, moe]", "moe-graph-module-dropless"),
    ("Combine both fixes in one candidate to save a day.", "bundle-fixes-one-candidate"),
])
def test_workflow_mistake_classes_in_new_words(text: str, mid: str) -> None:
    assert mid in found(WORKFLOW, text)


@pytest.mark.parametrize(("text", "mid"), [
    ("--moe_a2a_overlap true is not a clean test: it flips delayed wgrad too.",
     "a2a-flag-is-plain-ep-overlap"),
    ("Credit EP overlap with 287.305 only; 299.352 is the tuned standard recipe.",
     "gain-credited-to-one-knob"),
    ("Believe the unprofiled step time, not the kernel totals.", "kernel-sum-over-step-time"),
    ("FP8 MFU is measured against a higher peak; compare absolute TFLOP/s instead.",
     "mfu-across-precisions"),
    ("cuda_graph_modules: [moe_router, moe_preprocess]", "moe-graph-module-dropless"),
    ("Give each fix its own A/B; never combine both fixes in one candidate.",
     "bundle-fixes-one-candidate"),
])
def test_workflow_correct_uses_of_the_same_words(text: str, mid: str) -> None:
    assert mid not in found(WORKFLOW, text)


def test_a_narrow_answer_with_a_matched_baseline_states_the_contract() -> None:
    text = "Test the graph candidate alone, against today's config as the matched baseline."
    assert "no-measurement-contract" not in found(WORKFLOW, text)
