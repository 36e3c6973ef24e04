"""Misconceptions (each card's wrong claims and wrong first steps) and stated arithmetic:
asserted ones fail the answer with the claim quoted; rejected, corrected or reported ones do
not. Also the regression phrasings of issue 22, graded as `eval grade --skill` does."""

from __future__ import annotations

import re
from typing import Any

import pytest

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.checks import numeric, valid_keys
from mbridge_perf.evals.claims import (
    arithmetic_errors,
    find_misconceptions,
    misconceptions,
)
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.layout import formula_errors
from mbridge_perf.skillpack.pack import get_skill, list_skills

from helpers import REPO

SKILLS = [s.folder_name for s in list_skills(REPO)]
MEMORY = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"
LONG = "nemo-mbridge-perf-moe-long-context"
WORKFLOW = "nemo-mbridge-perf-moe-optimization-workflow"


def card(skill: str) -> dict[str, Any]:
    return get_skill(REPO, skill).card


def found(skill: str, text: str) -> list[str]:
    c = card(skill)
    terms = [t for i in c["answer_checklist"] for t in i["match"]]
    return [f.misconception.id for f in find_misconceptions(c, parse_answer(text).units, terms)]


def examples() -> list[tuple[str, str, str, bool]]:
    out = []
    for skill in SKILLS:
        for m in card(skill).get("misconceptions", []):
            ex = m.get("examples", {})
            out += [(skill, m["id"], t, True) for t in ex.get("asserts", [])]
            out += [(skill, m["id"], t, False) for t in ex.get("rejects", [])]
    return out


def test_every_skill_lists_misconceptions_with_a_reason_and_a_source() -> None:
    for skill in SKILLS:
        items = card(skill).get("misconceptions", [])
        assert len(items) >= 5, skill
        for m in items:
            assert m["wrong_because"].strip() and m["source"].strip(), (skill, m["id"])
            assert m.get("examples", {}).get("asserts"), (skill, m["id"])
        assert len(misconceptions(card(skill))) == len(items)


@pytest.mark.parametrize(("skill", "mid", "text", "asserts"), examples(),
                         ids=lambda v: v if isinstance(v, str) and len(v) < 40 else None)
def test_card_examples_assert_or_reject_their_claim(skill: str, mid: str, text: str,
                                                    asserts: bool) -> None:
    assert (mid in found(skill, text)) is asserts, (mid, text)


@pytest.mark.parametrize("text", [
    "Your teammate claims that uniform with recompute_num_layers=1 recomputes only the first "
    "layer.",
    "It is a myth that uniform with recompute_num_layers=1 recomputes only the first layer.",
    "## Wrong claims\n- uniform with recompute_num_layers=1 recomputes only the first layer",
])
def test_reported_corrected_or_listed_as_wrong_claims_do_not_count(text: str) -> None:
    assert "uniform-one-first-layer-only" not in found(RECOMPUTE, text)


def skill_grade(skill: str, text: str) -> Any:
    return grade_skill(card(skill), parse_answer(text), skill)


def order_ok(skill: str, text: str) -> bool:
    """Whether the skill grade's order check (when there is one) passes."""
    return all(e.passed for e in skill_grade(skill, text).expectations
               if e.check == "checklist.order")


def failed(grade: Any) -> list[str]:
    return [f"{e.text} :: {e.evidence}" for e in grade.expectations if not e.passed]


MEMORY_GOOD = """\
1. Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` first: rank 0 at 59 GB on 80 GB cards
   is fragmentation, and the allocator fix alone fitted this recipe.
2. If still tight, selective recompute of `layernorm` (core_attn frees ≈ 0 with fused attention).
3. Do not raise TP: TP 4-way → 8-way cost 28 % throughput on Llama3 70B.
4. Do not trade DP for PP: PP 4→8 halves DP, doubles gradient accumulation and cost 5.9 %.
5. `mlp` recompute only as a last resort (~16 % slower).
6. CPU offload is unavailable at PP=4 (MCore raises a ValueError).
"""


def test_a_correct_memory_answer_passes() -> None:
    grade = skill_grade(MEMORY, MEMORY_GOOD)
    assert grade.passed, failed(grade)


def test_raise_tp_first_fails_even_with_the_rest_of_the_checklist() -> None:
    text = "Raise TP 4→8 first; it halves the weights per GPU.\n\n" + MEMORY_GOOD.replace(
        "Set `PYTORCH", "Then set `PYTORCH").replace(" first:", ":")
    grade = skill_grade(MEMORY, text)
    assert not grade.passed
    assert any("Raise TP 4→8 first" in f and "28.4" in f for f in failed(grade)), failed(grade)


def test_move_to_tp8_as_step_one_fails() -> None:
    text = MEMORY_GOOD.replace("1. Set `PYTORCH", "1. Move to TP=8.\n1. Set `PYTORCH")
    assert "tp-raise-first" in found(MEMORY, text)


def test_uniform_first_layer_and_cpu_offload_at_pp4_fail() -> None:
    text = ("Set `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` first. Then selective "
            "recompute with `recompute_modules=[layernorm]`. For full recompute, uniform with "
            "recompute_num_layers=1 recomputes only the first layer, so it is cheap; set "
            "recompute_method and recompute_num_layers. CPU offload works at PP=4 too, so you can "
            "also enable `cpu_offloading=True`. CUDA graphs need cuda_graph_impl=full_iteration "
            "with full recompute.")
    grade = skill_grade(RECOMPUTE, text)
    assert not grade.passed
    evidence = " ".join(failed(grade))
    assert "recomputes only the first layer" in evidence
    ids = found(RECOMPUTE, text)
    assert "uniform-one-first-layer-only" in ids and "cpu-offload-with-pp" in ids


def test_do_not_trade_dp_for_pp_is_not_advice_to_raise_pp() -> None:
    text = "Do not trade DP for PP: PP 4→8 halves DP and cost 5.9 %."
    from mbridge_perf.evals.matching import recommended
    assert not recommended(parse_answer(text).units, "PP=8")
    assert "pp-raise-first" not in found(MEMORY, text)


def test_one_knob_per_ab_and_the_41_50_window_in_the_contract() -> None:
    text = """\
1. **Contract.** Freeze versions, topology, routing semantics and the 41–50 window; label
   forced-balance runs benchmark-only.
2. **Fit.** Selective recompute before full; check with `--fake-init-process-group`.
3. **Scale.** Maximize DP, EP over extra TP.
4. **Profile.** Name the dominant wall.
5. **Retune.** One knob per A/B against the profiled wall.
6. **Validate.** At least 50 steps, window 41–50.
7. **Meshes.** Parallel Folding: attention TP × CP × DP × PP; MoE ETP × EP × EDP × PP.
8. **Bring-up.** alltoall, BF16, eager; FP8 is a later candidate.
"""
    grade = skill_grade(WORKFLOW, text)
    assert grade.passed, failed(grade)


def test_fp8_mentioned_as_a_later_candidate_keeps_bf16_first() -> None:
    from mbridge_perf.evals.checks import order
    a = parse_answer("1. Contract: pin versions; FP8 is a later candidate once BF16 is stable.\n"
                     "2. Bring-up: alltoall, BF16, eager.")
    assert all(e.passed for e in order(a, [["BF16", "FP8"]]))


def test_a_wrong_tp_cost_fails_and_the_measured_one_passes() -> None:
    assert "tp-cost-understated" in found(MEMORY, "TP 4→8 costs about 5 % throughput.")
    assert "tp-cost-understated" not in found(MEMORY, "TP 4→8 costs 28 % throughput.")
    assert "tp-cost-understated" not in found(MEMORY, "TP 4→8 cost −28.4 percent.")


@pytest.mark.parametrize(("text", "wrong"), [
    ("CP = 131072 / 4096 = 16 ranks.", True),
    ("CP = 131072 / 4096 = 32 ranks.", False),
    ("min GPUs = 4·32 = 128; dense DP = 128/(1·4·16) = 2.", False),
    ("65536 % (2·16) = 0 ✓", False),
    ("8 × 4 = 24", True),
])
def test_stated_arithmetic_is_recomputed(text: str, wrong: bool) -> None:
    assert bool(arithmetic_errors(parse_answer(text).units)) is wrong


def test_known_grader_bugs() -> None:
    # mixed_precision is a Bridge section and a recipe name, not an invented key
    assert valid_keys(parse_answer("Set mixed_precision=bf16_mixed.")).passed
    # a graph scope list is not mlp recompute advice
    g = skill_grade(MEMORY, MEMORY_GOOD + "\nKeep cuda_graph_modules: [mlp] as it is.\n")
    assert g.passed, failed(g)
    # a numeric regex with two capture groups does not crash
    exp = numeric(parse_answer("peak 54.8 GiB"),
                  {"extract": r"text:(peak|max) (\d+(?:\.\d+)?)", "expect": 54.8})
    assert exp.check == "numeric"
    exp = numeric(parse_answer("peak 54.8 GiB"),
                  {"extract": r"text:(?:peak|max) (\d+(?:\.\d+)?)|(\d+) GB", "expect": 54.8})
    assert exp.passed


def test_every_verdict_quotes_what_it_read() -> None:
    grade = skill_grade(MEMORY, "Raise TP 4→8 first. Then set expandable_segments:True.")
    data = grade.grading_json()
    bad = [e for e in data["expectations"] if not e["passed"]]
    assert bad and all(e["evidence"] for e in data["expectations"])
    assert any(re.search(r"Raise TP 4→8 first", e["evidence"]) for e in bad)


def test_a_200kb_adversarial_answer_grades(tmp_path: Any) -> None:
    # speed is measured in benchmarks/eval_speed.py; this only checks it completes and is read
    text = ("- " * 2000 + "raise TP 4→8 first" + " " * 3000 + "\n") * 30
    grade = skill_grade(MEMORY, text[:200_000])
    assert not grade.passed


def test_misconception_patterns_stay_bounded() -> None:
    """Every scan linear: no unbounded wildcard runs in a card's regexes (a `[^.;]*` would make
    each start position scan to the end of the unit)."""
    unbounded = re.compile(r"\[\^[^\]]*\][*+]|\.[*+]")
    for skill in SKILLS:
        for m in card(skill).get("misconceptions", []):
            for rx in [*m["match"], *m.get("unless", []), *m.get("context", []),
                       *m.get("first_among", [])]:
                assert not unbounded.search(rx), (skill, m["id"], rx)


def _agreement() -> Any:
    """benchmarks/grader_agreement.py as a module; the test skips without ../shared/data."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "grader_agreement", REPO / "benchmarks" / "grader_agreement.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if not mod.DEFAULT_DATA.is_dir():
        pytest.skip("no ../shared/data/evals-dev here")
    return mod


def test_the_agreement_split_is_fixed_and_balanced() -> None:
    mod = _agreement()
    halves = mod.split(mod.DEFAULT_DATA)
    assert len(halves["dev"]) == len(halves["measured"]) == 24
    assert not set(halves["dev"]) & set(halves["measured"])
    assert halves == mod.split(mod.DEFAULT_DATA)


def test_both_halves_and_our_own_answers_agree_with_their_labels() -> None:
    """Issue 22's done-when figure, kept from sliding: every answer of both evals-dev halves
    and every answer of our own is graded as labelled (where ../shared/data is checked out)."""
    mod = _agreement()
    halves = mod.split(mod.DEFAULT_DATA)
    files = [*halves["dev"], *halves["measured"], *sorted(mod.OWN_DATA.glob("*/*.md"))]
    wrong = []
    for f in files:
        meta, body = mod._meta(f)
        skill = mod.PREFIX + f.parent.name.removeprefix(mod.PREFIX)
        graded = grade_skill(get_skill(REPO, skill).card, parse_answer(body), skill).passed
        if graded != (meta.get("label") == "good"):
            wrong.append(f.name)
    assert len(files) == 48 + 66 and not wrong, wrong


# ---- capabilities added after the first measurement of the measured half (issue 22): each
# found missing by looking at which measured answers were misjudged, fixed in general and
# tested here with our own phrasing (see benchmarks/grader_agreement.py's disclosure).

def test_a_sentence_ends_before_closing_emphasis() -> None:
    units = parse_answer("1. **Pin the allocator first.** Then measure `mlp`.").units
    assert [u.norm for u in units] == ["pin the allocator first.", "then measure mlp."]
    assert units[0].lead and not units[1].lead and units[0].block == units[1].block


def test_the_head_of_a_numbered_step_is_advice() -> None:
    text = ("1. The allocator is already exported everywhere.\n"
            "2. **Full recompute, right away.** Uniform method, one layer per group.\n")
    assert "full-recompute-first" in found(RECOMPUTE, text)


def test_a_step_head_is_qualified_by_the_rest_of_its_step() -> None:
    text = ("1. Set `expandable_segments:True` first.\n"
            "2. **CPU offloading.** Possible only because PP=1 here, and never with recompute.\n")
    assert "cpu-offload-at-pp-gt-1" not in found(MEMORY, text)
    text = text.replace("Possible only because PP=1 here, and never with recompute.",
                        "Out while PP > 1: MCore rejects it.")
    assert "cpu-offload-at-pp-gt-1" not in found(MEMORY, text + "Layout: TP=4 PP=2.\n")


def test_instead_of_negates_only_what_it_names() -> None:
    from mbridge_perf.evals.matching import recommended
    units = parse_answer("Instead of mlp recompute, turn on cpu_offloading for two layers.").units
    assert recommended(units, "cpu_offloading") and not recommended(units, "mlp")
    assert "cpu-offload-at-pp-gt-1" in found(
        MEMORY, "Layout TP=4 PP=4. Instead of recompute, turn on cpu_offloading for 2 layers.")


@pytest.mark.parametrize("skill", [RECOMPUTE, MEMORY])
def test_mlp_before_any_cheaper_module_is_a_wrong_first_step(skill: str) -> None:
    bad = ("1. `expandable_segments:True` is already on.\n"
           "2. **Recompute with `mlp`** — the FFN is the widest activation.\n"
           "3. `layernorm` can be added on top.\n")
    assert "mlp-recompute-first" in found(skill, bad)
    good = ("1. Set `expandable_segments:True`.\n2. Recompute `layernorm`.\n"
            "3. Add `mlp` after that, for about 16 % TFLOP/s.\n")
    assert "mlp-recompute-first" not in found(skill, good)


@pytest.mark.parametrize(("text", "asserts"), [
    ("Recompute core_attn. It gives back about 6 GB on every stage.", True),
    ("I'd add core_attn next. At 8K it likely hands back 6 GB per GPU, which should do.", True),
    ("Recompute core_attn only with unfused attention. There it gives back about 6 GB.", False),
    ("Skip core_attn. mlp recompute frees about 3 GB.", False),
    ("Recompute core_attn.\n\nIt gives back about 6 GB on every stage.", False),  # new paragraph
])
def test_a_claim_split_over_two_sentences_of_a_paragraph(text: str, asserts: bool) -> None:
    assert ("core-attn-big-saver" in found(MEMORY, text)) is asserts


def test_dismissing_the_allocator_is_the_fragmentation_claim() -> None:
    assert "fragmentation-ruled-out-blindly" in found(
        MEMORY, "Only rank 2 is over, so you don't need expandable_segments for this.")
    assert "fragmentation-ruled-out-blindly" not in found(
        MEMORY, "expandable_segments is already set and it still OOMs, so you do not need to "
                "touch the allocator again.")


def test_the_eight_misjudgements_of_issue_22_each_have_a_test() -> None:
    """The issue's list, mapped to the tests above that hold each phrasing (not a file)."""
    names = set(globals())
    for test in ("test_raise_tp_first_fails_even_with_the_rest_of_the_checklist",   # TP 4→8 first
                 "test_uniform_first_layer_and_cpu_offload_at_pp4_fail",  # uniform + offload PP=4
                 "test_a_wrong_tp_cost_fails_and_the_measured_one_passes",  # "28 %" with a space
                 "test_a_correct_memory_answer_passes",                     # "4-way → 8-way"
                 "test_one_knob_per_ab_and_the_41_50_window_in_the_contract",  # one knob, 41–50
                 "test_do_not_trade_dp_for_pp_is_not_advice_to_raise_pp",   # Do not trade DP
                 "test_fp8_mentioned_as_a_later_candidate_keeps_bf16_first"):  # FP8 later
        assert test in names, test


def test_a_negated_lead_in_governs_the_list_after_it() -> None:
    text = ("1. Set `expandable_segments:True` first.\n2. Then `layernorm` recompute.\n\n"
            "Things I would not do:\n1. **Raise TP to 8.**\n2. **CPU offloading.**\n\n"
            "Layout: TP=4 PP=4.\n")
    units = parse_answer(text).units
    assert [u.negated_section for u in units] == [False] * 3 + [True] * 2 + [False]
    assert not {"tp-raise-first", "cpu-offload-at-pp-gt-1"} & set(found(MEMORY, text))
    plan = parse_answer("If it still does not fit:\n1. Add `layernorm`.\n").units
    assert not any(u.negated_section for u in plan)   # a condition is not a rejection


def test_a_contrast_inside_a_claim_negates_its_tail() -> None:
    text = "Report the mean over iterations 41-50, not from iteration 1."
    assert "average-includes-warmup" not in found(WORKFLOW, text)
    assert "average-includes-warmup" in found(WORKFLOW, "Report the mean from iteration 1.")


def test_a_label_leading_a_line_is_not_an_invented_key() -> None:
    assert valid_keys(parse_answer("- core_attn: about 0 with fused attention, skip it.")).passed
    assert not valid_keys(parse_answer("Set recompute_attention_scores: true.")).passed


def test_inline_step_numbers_split_sentences() -> None:
    units = parse_answer("Plan: 1) pin the contract. 2) fit first. 3) profile.").units
    assert [u.norm for u in units] == ["plan: 1) pin the contract.", "2) fit first.",
                                       "3) profile."]


def test_a_rejecting_verdict_cell_negates_its_table_row() -> None:
    from mbridge_perf.evals.matching import recommended
    rows = parse_answer("| lever | verdict |\n|---|---|\n| TP 4→8 | no (−28.4 %) |\n"
                        "| CPU offload | ✗ at PP=4 |\n| layernorm | yes, first |\n").units
    assert not recommended(rows, "TP=8") and not recommended(rows, "cpu offload")
    assert recommended(rows, "layernorm")
    # the first cell is the lever's name, not a verdict
    assert recommended(parse_answer("| no-op recompute? | use layernorm |").units, "layernorm")


def test_mark_led_lines_are_list_items_and_keep_their_mark() -> None:
    units = parse_answer("✅ Set `expandable_segments:True`.\n❌ Raise TP 4→8.\n"
                         "⚠️ With TE graphs, full recompute needs full_iteration.").units
    assert [u.text[:2] for u in units] == ["✅ ", "❌ ", "⚠️"]
    from mbridge_perf.evals.matching import recommended
    assert not recommended(units, "TP=8")


def test_selective_blamed_for_graphs_named_before_it() -> None:
    assert "selective-vs-te-graphs-flipped" in found(
        RECOMPUTE, "With TE-scoped CUDA graphs on, selective recompute conflicts with them.")


def test_layer_offload_before_any_recompute_is_a_wrong_first_memory_step() -> None:
    text = ("| order | change |\n|---|---|\n| 1 | CP = 131072 / 4096 = 32 |\n"
            "| 2 | `cpu_offloading=True` for 4 layers, before any recompute |\n"
            "| 3 | selective recompute of `moe_act` |\n")
    assert "cpu-offload-first" in found(LONG, text)
    ok = text.replace("| 2 |", "| 9 |").replace("| 3 |", "| 2 |")
    ok = "\n".join(sorted(ok.splitlines()[2:], key=lambda r: r.split("|")[1])) + "\n"
    assert "cpu-offload-first" not in found(LONG, "| order | change |\n|---|---|\n" + ok)


def test_a_claim_deep_in_a_long_unit_is_quoted_where_it_stands() -> None:
    text = "Set expandable_segments:True first, " + "then measure again, " * 20 + (
        "and note that uniform with recompute_num_layers=1 recomputes only the first layer.")
    grade = skill_grade(RECOMPUTE, text)
    assert any("recomputes only the first layer" in f for f in failed(grade)), failed(grade)


def test_nested_items_belong_to_their_parent_step() -> None:
    units = parse_answer("1. **Selective.**\n   - `recompute_modules=[core_attn]`\n"
                         "   - it frees several GB\n2. Full\n\nProse.\n").units
    assert [u.block for u in units][:3] == [units[0].block] * 3
    assert units[3].block != units[0].block and units[4].block != units[3].block
    assert "core-attn-big-saver" in found(MEMORY, "- Recompute core_attn.\n"
                                                  "  - With flash attention it frees 6 GB.\n")


# ---- blind batch 1 (benchmarks/heldout): the four misjudged good answers, in new words


@pytest.mark.parametrize(("text", "asserts"), [
    # a Q&A question proposes nothing; its answer rejects the idea
    ("Layout: TP=8, PP=2.\n\n**Q: Can I use cpu_offloading for the activations instead?"
     "**\nA: It is refused at PP=2 (a ValueError).\n", False),
    ("Layout: TP=8, PP=2.\n\nWould cpu_offloading help at this size?\n", False),
    # the same advice stated, not asked, still asserts
    ("Layout: TP=8, PP=2.\n\nEnable cpu_offloading for 6 layers.\n", True),
])
def test_a_question_asserts_nothing(text: str, asserts: bool) -> None:
    assert ("cpu-offload-at-pp-gt-1" in found(RECOMPUTE, text)) is asserts


@pytest.mark.parametrize(("text", "asserts"), [
    ("Two numbers from the failing rank would show whether we face fragmentation or a real "
     "capacity limit.", False),
    ("If this turns out to be a genuine capacity problem, recompute comes next.", False),
    ("Rank 5 alone ran out, so it is a genuine capacity problem, not fragmentation.", True),
])
def test_an_open_alternative_or_condition_asserts_neither_side(text: str, asserts: bool
                                                               ) -> None:
    assert ("fragmentation-ruled-out-blindly" in found(MEMORY, text)) is asserts


@pytest.mark.parametrize(("text", "asserts"), [
    ("**3. Only if selective still cannot fit in memory: full recompute plus a graph-scope "
     "workaround**", False),
    ("Selective recompute cannot fit, so use full recompute and keep the TE graphs.", False),
    ("Selective recompute cannot be combined with TE-scoped CUDA graphs.", True),
    ("Selective recompute breaks under the TE graph capture, so go full.", True),
])
def test_selective_graph_claim_needs_the_graphs_as_its_object(text: str, asserts: bool) -> None:
    assert ("selective-vs-te-graphs-flipped" in found(RECOMPUTE, text)) is asserts


# ---- blind batch 1: the misjudged bad answer (dense DP without CP), in new words


@pytest.mark.parametrize(("text", "asserts"), [
    ("Going to CP=16 leaves the data-parallel width alone: context parallelism works inside a "
     "replica and does not eat into DP ranks.", True),
    ("Context parallelism never takes data-parallel ranks, so the 1024 batch stays as is.", True),
    ("CP=16 eats data-parallel ranks: DP = 1024 / (TP·PP·CP) = 1024 / (2·4·16) = 8.", False),
])
def test_dense_dp_that_ignores_cp_is_a_wrong_claim(text: str, asserts: bool) -> None:
    assert ("dp-ignores-cp" in found(LONG, text)) is asserts


@pytest.mark.parametrize(("text", "wrong"), [
    ("CP=16 for 64K.\n\n| item | formula |\n|---|---|\n| dense DP on 1024 GPUs | "
     "world / (TP × PP) |\n", True),
    ("Sequence split: CP = 65536 / 4096 = 16. Then DP = world_size / (pp*tp) = 128.", True),
    ("CP=16 for 64K. DP = world / (TP·CP·PP) = 8; EDP = world / (EP·ETP·PP).", False),
    ("CP=16 for 64K. DP = world / (TP·PP) / CP = 8.", False),
    ("No context parallelism here (CP=1): DP = world / (TP·PP) = 32.", False),
])
def test_a_dense_dp_formula_without_cp_is_caught_when_cp_is_above_one(text: str,
                                                                        wrong: bool) -> None:
    assert bool(formula_errors(parse_answer(text).units)) is wrong
    if wrong:
        grade = skill_grade(LONG, text)
        assert any("leaves out CP" in f for f in failed(grade)), failed(grade)


# ---- blind batch 2: the three bad answers that passed, in new words


@pytest.mark.parametrize(("text", "asserts"), [
    ("Leave ddp.nccl_ub=True on. Expandable segments only change how the caching allocator "
     "grows, and user-buffer registration is a DP comm matter, so the two are compatible.",
     True),
    ("NCCL user buffers and the expandable allocator can be combined; keep both settings.", True),
    ("With torch 2.8 you must pick one: nccl_ub and expandable segments are incompatible.",
     False),
    ("MCore raises a ValueError when nccl_ub meets expandable_segments:True; drop one.", False),
])
def test_keeping_nccl_ub_with_expandable_segments_is_a_wrong_claim(text: str,
                                                                   asserts: bool) -> None:
    assert ("expandable-with-nccl-ub" in found(MEMORY, text)) is asserts


@pytest.mark.parametrize(("text", "asserts"), [
    ("```python\ncfg.model.recompute_modules = [\"moe_act\", \"layernorm\"]\n"
     "cfg.mixed_precision.fp8_recipe = \"delayed\"\n```", True),
    ("On H100, delayed FP8 keeps the fewest copies, and layernorm recompute trims the rest.",
     True),
    ("```python\ncfg.model.recompute_modules = [\"layernorm\"]\n"
     "cfg.mixed_precision.fp8_recipe = \"blockwise\"  # not delayed\n```", False),
    ("Delayed FP8 alone is fine for a short run; nothing here recomputes norms.", False),
])
def test_delayed_fp8_next_to_layernorm_or_moe_act_recompute_is_wrong(text: str,
                                                                     asserts: bool) -> None:
    assert ("delayed-fp8-with-recompute" in found(LONG, text)) is asserts


@pytest.mark.parametrize(("text", "asserts"), [
    ("At 16K tokens per rank the attention score grows quadratically and dwarfs everything "
     "else the layer keeps, which is why core_attn is where I would start.", True),
    ("Choose core_attn. That gets tens of GB per rank back once sequences are long.", True),
    ("With fused attention the score matrix is never kept, so core_attn gives almost nothing "
     "back.", False),
])
def test_core_attn_sold_as_the_big_saver_in_new_phrasings(text: str, asserts: bool) -> None:
    assert ("core-attn-big-saver" in found(RECOMPUTE, text)) is asserts


# ---- blind batch 2: program output quoted in a plain fence, and list placeholders


def test_a_quoted_error_line_in_a_plain_fence_asserts_nothing() -> None:
    text = ("The run stopped with this:\n\n```\nRuntimeError: full recompute needs a "
            "whole-iteration graph\n```\n\nSo use selective recompute with layernorm, after "
            "setting expandable_segments:True.")
    units = parse_answer(text).units
    assert any(u.quoted for u in units)
    assert "full-recompute-first" not in found(RECOMPUTE, text)


def test_a_config_line_in_a_plain_fence_is_still_read() -> None:
    text = "```\ncfg.model.recompute_modules = [\"core_attn\"]\n```"
    assert not any(u.quoted for u in parse_answer(text).units)
    text = "```\nmodel.recompute_modules=[bogus_label]\n```"
    assert not valid_keys(parse_answer(text)).passed


def test_an_ellipsis_in_a_label_list_and_the_estimator_argument_are_not_invented_keys() -> None:
    text = ("Go selective: `recompute_granularity=\"selective\"`, `recompute_modules=[…]` with "
            "the labels below. Price it with `estimate_training_memory(cfg, "
            "num_microbatches=16)` first.")
    assert valid_keys(parse_answer(text)).passed
