"""Round 29, MoE skills (long context, optimization workflow): the order check reads only the
steps an answer places (not evidence named in a verification statement, not a setting kept as
it is), and mistake classes the blind batches showed the grader missing — each tested in
sentences of our own, with a near miss that must not trip it."""

from __future__ import annotations

import pytest
from test_claims import LONG, WORKFLOW, card, found

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_skill


def _order_ok(skill: str, text: str) -> bool:
    grade = grade_skill(card(skill), parse_answer(text), skill)
    order = [e for e in grade.expectations if e.check == "checklist.order"]
    return all(e.passed for e in order)


# ---------------------------------------------------------------- order: verification

def test_a_fallback_grep_in_the_evidence_list_is_not_the_bring_up_step() -> None:
    text = ("Not yet; a saved config proves nothing.\n\n"
            "- Search the job log: `grep \"Falling back to alltoall\" job.log` has to print "
            "nothing, or the flex backend never ran.\n"
            "- Then rerun the winner for at least 50 steps and compare iterations 41-50 "
            "against the matched baseline.\n")
    assert _order_ok(WORKFLOW, text)


def test_a_training_equivalent_rerun_at_sign_off_is_validation_not_the_contract() -> None:
    text = ("1. Run the winner for at least 50 steps; compare window 41-50 with the baseline.\n"
            "2. The forced-balance screen is benchmark-only: re-validate on a "
            "training-equivalent run before you ship.\n")
    assert _order_ok(WORKFLOW, text)
    ja = ("1. 採用前に 50 ステップ以上回し、41–50 の区間で比較してください。\n"
          "2. 本番の判断は training-equivalent な条件で測り直した結果で行ってください。\n")
    assert _order_ok(WORKFLOW, ja)


def test_a_contract_frozen_only_after_retuning_still_breaks_the_order() -> None:
    text = ("1. Profile and name the dominant wall.\n"
            "2. Retune one variable at a time.\n"
            "3. Now freeze the measurement contract: versions, layout, routing, window.\n")
    assert not _order_ok(WORKFLOW, text)


# ---------------------------------------------------------------- order: kept settings

def test_keeping_selective_recompute_is_not_a_fit_step_after_profiling() -> None:
    text = ("The trace shows a host / launch wall, so the next candidate is a minimal graph "
            "scope.\n\n"
            "Caveat: full recompute would clash with TE graphs, so stick with selective "
            "recompute.\n")
    assert _order_ok(WORKFLOW, text)


def test_adding_selective_recompute_after_profiling_still_breaks_the_order() -> None:
    text = ("1. Profile and name the dominant wall.\n"
            "2. Then switch to selective recompute so the model fits.\n")
    assert not _order_ok(WORKFLOW, text)


# ---------------------------------------------------------------- order: a rule with no place

def test_bring_up_on_alltoall_may_be_stated_after_validation() -> None:
    text = ("1. Profile and name the dominant wall.\n"
            "2. Validate the winner over at least 50 steps, window 41-50.\n"
            "3. Keep the bring-up on alltoall, BF16 and eager; DeepEP is an A/B later.\n")
    assert _order_ok(WORKFLOW, text)


# ---------------------------------------------------------------- "false" as a config value

def test_a_config_value_false_is_not_a_correction_cue() -> None:
    text = ("| both fixes, one run | `delay_wgrad_compute=False` | do it: the dispatcher and "
            "EP overlap go in together in one candidate to save a slot |")
    bundled = {"bundle-fixes-one-candidate", "multi-variable-ab"}
    assert bundled & set(found(WORKFLOW, text))
    corrected = ("That both fixes should go in together in one candidate is false: each gets "
                 "its own A/B.")
    assert not bundled & set(found(WORKFLOW, corrected))


# ---------------------------------------------------------------- dispatcher picked by hardware

@pytest.mark.parametrize("text", [
    "The flex backend is dictated by the platform: HybridEP on our GB200 racks.",
    "Choose the backend according to the GPU type, DeepEP for the H100 nodes.",
    "Given that the fleet is Hopper, moe_flex_dispatcher_backend should be deepep.",
    "Baseline run: flex with the hybridep backend, BF16, no graphs.",
])
def test_dispatcher_chosen_from_the_hardware_or_at_bring_up(text: str) -> None:
    ids = found(WORKFLOW, text)
    assert {"dispatcher-by-hardware", "flex-backend-at-bring-up"} & set(ids), ids


@pytest.mark.parametrize("text", [
    "The platform does not decide the backend; A/B HybridEP against alltoall on GB200.",
    "Given that the fleet is Hopper, DeepEP is a candidate to compare with alltoall.",
    "Baseline run: alltoall, BF16, no graphs; the hybridep backend is a later candidate.",
])
def test_hardware_named_next_to_a_backend_candidate_is_fine(text: str) -> None:
    ids = found(WORKFLOW, text)
    assert not {"dispatcher-by-hardware", "flex-backend-at-bring-up"} & set(ids), ids


def test_long_context_card_keeps_its_own_checklist_order() -> None:
    # the verification rule is the workflow card's: the long-context card marks no item
    assert not any(i.get("verification") for i in card(LONG)["answer_checklist"])


def test_a_code_line_that_switches_a_key_off_is_not_advice_to_use_it() -> None:
    text = "Layout: TP=1 PP=8.\n\n```python\ncfg.model.cpu_offloading = False\n```\n"
    assert "cpu-offload-at-pp-gt-1" not in found(LONG, text)
    on = "Layout: TP=1 PP=8.\n\n```python\ncfg.model.cpu_offloading = True\n```\n"
    assert "cpu-offload-at-pp-gt-1" in found(LONG, on)


def test_a_contract_that_names_the_window_still_places_the_contract_first() -> None:
    text = ("First pin the measurement contract: versions, layout, routing, precision and the "
            "window (iterations 41-50 of a 50-step run).\n\n"
            "Then get it to fit with selective recompute before anything full.\n\n"
            "Every later candidate is labelled training-equivalent or benchmark-only.\n\n"
            "Last, run the winner for at least 50 steps.\n")
    assert _order_ok(WORKFLOW, text)


# ---------------------------------------------------------------- workflow claims, new words

@pytest.mark.parametrize(("text", "mid"), [
    ("moe_shared_expert_overlap plays well alongside EP overlap; enable both for the next run.",
     "shared-overlap-with-ep-overlap"),
    ("Total the runtimes of all a2a kernels in the window and call the part not inside the "
     "step time hidden.", "summed-kernel-time"),
    ("A 12-iteration run is our verdict: promote the HybridEP config.", "short-run-signoff"),
    ("Quote the mean over the entire job, warm-up included.", "average-includes-warmup"),
])
def test_workflow_claims_in_new_words(text: str, mid: str) -> None:
    assert mid in found(WORKFLOW, text)


@pytest.mark.parametrize(("text", "mid"), [
    ("Keep moe_shared_expert_overlap off while EP overlap is on; it gets its own A/B.",
     "shared-overlap-with-ep-overlap"),
    ("Union the a2a kernel intervals instead of totalling their runtimes; intersect with "
     "compute.", "summed-kernel-time"),
    ("A 12-iteration screen narrows the field; the winner then runs 50 steps.",
     "short-run-signoff"),
    ("Quote the mean over iterations 41-50, after the warm-up.", "average-includes-warmup"),
])
def test_workflow_claims_near_misses(text: str, mid: str) -> None:
    assert mid not in found(WORKFLOW, text)


# ---------------------------------------------------------------- long-context claims

@pytest.mark.parametrize(("text", "mid"), [
    ("Budget: TP·CP·EP·PP = 2·16·16·4 = 2048 H200s.", "gpu-count-product"),
    ("Each of the parallel sizes multiplies into the mesh, so the minimum is 2048.",
     "gpu-count-dims-multiply"),
    ("Packed SFT is fine under TE graphs: it captures a graph for every new length and "
     "replays it from then on.", "graphs-with-variable-shapes"),
    ("DeepSeek-V3 on flex + DeepEP.\n\n```python\ncfg.mixed_precision.fp8_recipe = "
     "\"mxfp8\"\n```", "mxfp8-on-hopper"),
    ("Memory did not move, so add this:\n\n```python\n"
     "cfg.optimizer.optimizer_cpu_offload = True\n```", "optimizer-offload-no-fraction"),
])
def test_long_context_claims_in_new_words(text: str, mid: str) -> None:
    assert mid in found(LONG, text)


@pytest.mark.parametrize(("text", "mid"), [
    ("Budget: PP·max(TP·CP, EP·ETP) = 4·max(32, 16) = 128 H200s, not the plain product.",
     "gpu-count-product"),
    ("The dense mesh TP·CP·DP·PP multiplies out to the world; the expert mesh folds over it.",
     "gpu-count-dims-multiply"),
    ("TE graphs capture one static shape; a new packed length breaks replay, so stay eager.",
     "graphs-with-variable-shapes"),
    ("DeepSeek-V3 on flex + DeepEP: blockwise FP8; MXFP8 is not an option on Hopper.",
     "mxfp8-on-hopper"),
    ("Qwen3 235B on GB200 with HybridEP: BF16 or `fp8_recipe = \"mxfp8\"`.",
     "mxfp8-on-hopper"),
    ("```python\ncfg.optimizer.optimizer_cpu_offload = True\n"
     "cfg.optimizer.optimizer_offload_fraction = 0.6\n```", "optimizer-offload-no-fraction"),
])
def test_long_context_claims_near_misses(text: str, mid: str) -> None:
    assert mid not in found(LONG, text)


def test_a_japanese_sentence_restricting_mla_up_proj_to_mla_is_not_the_claim() -> None:
    says_no = ("Qwen3 235B, GQA.\n\n- `mla_up_proj` は MLA 専用のラベルなので、"
               "Qwen3 では指定できません。")
    assert "mla-up-proj-on-gqa" not in found(LONG, says_no)
    says_yes = ("Qwen3 235B, GQA.\n\n- recompute_modules に `mla_up_proj` と `moe_act` を入れて"
                "ください。")
    assert "mla-up-proj-on-gqa" in found(LONG, says_yes)


@pytest.mark.parametrize(("text", "hit"), [
    ("From iteration one onward, average the logged step times for the report.", True),
    ("Timing window: steps 1-40.", True),
    ("From iteration one onward the loss is finite; average steps 41-50 for the report.",
     False),
    ("Timing window: steps 41-50, warm-up excluded.", False),
])
def test_averaging_from_the_first_iteration_in_other_orders(text: str, hit: bool) -> None:
    assert ("average-includes-warmup" in found(WORKFLOW, text)) is hit
