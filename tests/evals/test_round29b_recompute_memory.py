"""Round 29b, activation-recompute and memory-tuning: the mistake classes blind batches 8 and 9
showed the grader missing, and the good answers it failed, tested in sentences of our own."""

from __future__ import annotations

import pytest
from test_claims import MEMORY, RECOMPUTE, found

# ---------------------------------------------------------------- FP8 recipe and the labels


def test_labels_said_to_ignore_the_fp8_recipe_are_wrong() -> None:
    text = ("Use recompute_modules=[\"layernorm\", \"moe_act\"]. Neither label cares about the "
            "FP8 recipe; they are independent of the scaling mode you train with.")
    assert "fp8-recipe-independent-labels" in found(RECOMPUTE, text)


def test_labels_with_the_delayed_exception_are_fine() -> None:
    text = ("Use recompute_modules=[\"layernorm\"]; the label is independent of the FP8 recipe "
            "except delayed scaling, which rejects it at startup.")
    assert "fp8-recipe-independent-labels" not in found(RECOMPUTE, text)


# ---------------------------------------------------------------- invented label


def test_up_proj_named_as_the_recompute_label_is_wrong() -> None:
    text = "For MLA, the label to recompute is up_proj; put it next to moe_act."
    assert "invented-up-proj-label" in found(RECOMPUTE, text)


def test_mla_up_proj_or_a_rejected_up_proj_is_fine() -> None:
    for text in ("For MLA, the label to recompute is mla_up_proj; put it next to moe_act.",
                 "The error says up_proj is an invalid label for recompute_modules."):
        assert "invented-up-proj-label" not in found(RECOMPUTE, text)


# ---------------------------------------------------------------- core_attn by default


def test_core_attn_first_with_no_word_on_the_backend_is_wrong() -> None:
    text = ("The allocator is done, so this is capacity.\n\n"
            "1. Begin with core_attn: recompute_modules=[\"core_attn\"].\n"
            "2. Add layernorm if that is not enough.")
    assert "core-attn-first-default-backend" in found(RECOMPUTE, text)


def test_core_attn_first_on_unfused_attention_or_after_layernorm_is_fine() -> None:
    unfused = ("This model sets attention_backend=unfused.\n\n"
               "1. Begin with core_attn: recompute_modules=[\"core_attn\"].\n"
               "2. Add layernorm if that is not enough.")
    later = ("1. Begin with layernorm: recompute_modules=[\"layernorm\"].\n"
             "2. Add core_attn if that is not enough.")
    for text in (unfused, later):
        assert "core-attn-first-default-backend" not in found(RECOMPUTE, text)


def test_core_attn_called_the_most_efficient_fix_in_japanese_is_a_big_saving_claim() -> None:
    text = "core_attn を入れるのが一番効率的で、1 GB 程度の不足なら十分収まるはずです。"
    assert "core-attn-big-saver" in found(RECOMPUTE, text)
    text = "TE fused attention では core_attn はほぼ効きません。layernorm を入れてください。"
    assert "core-attn-big-saver" not in found(RECOMPUTE, text)


# ---------------------------------------------------------------- VPP as a memory lever


def test_vpp_raise_listed_as_a_memory_lever_is_wrong() -> None:
    text = "- **Lever 3: bump VPP from 5 to 10.** Each rank then holds smaller chunks."
    assert "vpp-raise-as-memory-lever" in found(MEMORY, text)


def test_vpp_raise_for_the_bubble_is_not_a_memory_lever() -> None:
    text = "- **Lever for throughput: bump VPP from 5 to 10** to shrink the pipeline bubble."
    assert "vpp-raise-as-memory-lever" not in found(MEMORY, text)


def test_vpp_credited_with_clearing_the_oom_is_wrong() -> None:
    assert "vpp-cleared-the-oom" in found(
        MEMORY, "The run with VPP 10 resolved the OOM, so we stay on it.")


def test_allocator_credited_with_clearing_the_oom_is_fine() -> None:
    assert "vpp-cleared-the-oom" not in found(
        MEMORY, "expandable_segments resolved the OOM; VPP 10 merely rode along in that run.")


# ---------------------------------------------------------------- PP raise cost


def test_pp_raise_called_nearly_free_is_wrong() -> None:
    text = "Doubling PP to 8 on the same nodes has no real cost: just more micro-batches per step."
    assert "pp-cost-understated" in found(MEMORY, text)


@pytest.mark.parametrize("text", [
    "Doubling PP to 8 on the same nodes is not free: DP halves and it cost 5.9 %.",
    "Doubling PP to 8 with spare GPUs keeps DP, so the cost is negligible.",
])
def test_pp_raise_priced_or_with_spare_gpus_is_fine(text: str) -> None:
    assert "pp-cost-understated" not in found(MEMORY, text)


# ---------------------------------------------------------------- Japanese sizes, bold step heads


def test_japanese_size_change_with_a_particle_reads_as_a_size_change() -> None:
    from mbridge_perf.evals.text import normalise
    assert normalise("TP を 2 → 4 にする") == "tp=2 -> tp=4 にする"
    assert normalise("DP は 1") == "dp=1"
    # a factor is not a size
    assert normalise("TP を 2 倍にする") == "tp を 2 倍にする"


def test_a_bold_numbered_head_is_a_plan_step() -> None:
    from mbridge_perf.evals.answer import parse_answer
    units = parse_answer("**1. Bump PP 2 → 4.** More stages.\n\n**2. Then X.**\n").units
    assert units[0].lead and units[0].norm.startswith("bump pp=2 -> pp=4")
    # a bold phrase that is not numbered stays prose
    assert not parse_answer("**Bump PP 2 → 4.** More stages.\n").units[0].lead


def test_a_japanese_pp_raise_as_the_first_step_is_caught() -> None:
    text = ("おすすめの順番です。\n\n**1. PP を 2 → 4 に増やす（DP 4 → 2）**\n"
            "ステージが細かくなりピークが下がります。\n\n"
            "**2. expandable_segments:True を設定**\n断片化を防ぎます。\n")
    assert "pp-raise-first" in found(MEMORY, text)


def test_a_japanese_allocator_first_plan_is_not_the_pp_mistake() -> None:
    text = ("おすすめの順番です。\n\n**1. expandable_segments:True を設定**\n断片化を防ぎます。\n\n"
            "**2. layernorm の再計算を追加**\n小さいが安い。\n")
    assert "pp-raise-first" not in found(MEMORY, text)


# ---------------------------------------------------------------- JSON lever lists


def _json(obj: object) -> str:
    import json
    return "```json\n" + json.dumps(obj) + "\n```\n"


def test_a_json_lever_list_under_another_key_is_read_with_its_layout() -> None:
    text = _json({"layout": {"tp": 8, "pp": 4, "dp": 1},
                  "next_levers": [{"rank": 1, "knob": "optimizer.use_distributed_optimizer",
                                   "value": True, "effect": "shards the Adam state, a few GB"}],
                  "rejected": [{"knob": "model.cpu_offloading", "why": "PP is above 1"}]})
    assert "distributed-optimizer-at-dp1" in found(MEMORY, text)


def test_a_json_lever_list_at_dp_above_one_or_rejecting_the_knob_is_fine() -> None:
    at_dp2 = _json({"layout": {"tp": 8, "pp": 2, "dp": 2},
                    "next_levers": [{"rank": 1, "knob": "optimizer.use_distributed_optimizer",
                                     "value": True, "effect": "shards the Adam state"}]})
    rejected = _json({"layout": {"tp": 8, "pp": 4, "dp": 1},
                      "next_levers": [{"rank": 1, "knob": "model.recompute_modules",
                                       "value": ["layernorm"], "effect": "small saving"}],
                      "blocked": [{"knob": "optimizer.use_distributed_optimizer",
                                   "why": "shards over data parallel ranks only"}]})
    for text in (at_dp2, rejected):
        assert "distributed-optimizer-at-dp1" not in found(MEMORY, text)


# ---------------------------------------------------------------- Japanese verdicts


@pytest.mark.parametrize("text", [
    "recompute_num_layers 付きの full 再計算は TE グラフと組み合わせるとアサートします。",
    "PP が 1 より大きいと cpu_offloading は使えません。",
    "ここでは core_attn ではなく layernorm を再計算します。",
])
def test_a_japanese_verdict_after_the_knob_is_not_advice_for_it(text: str) -> None:
    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.matching import recommended
    units = parse_answer(text).units
    for knob in ("recompute_num_layers", "cpu_offloading", "core_attn"):
        assert not recommended(units, knob)


def test_a_japanese_sentence_end_bounds_the_verdict() -> None:
    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.matching import recommended
    # the verdict in the second sentence does not reach back to the first
    units = parse_answer("layernorm を再計算に追加します。core_attn は効きません。").units
    assert recommended(units, "layernorm")
    assert not recommended(units, "core_attn")


# ---------------------------------------------------------------- put first, said late


def _allocator_order_ok(text: str) -> bool:
    from test_claims import REPO

    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.grade import grade_skill
    from mbridge_perf.skillpack.pack import get_skill
    card = get_skill(REPO, RECOMPUTE).card
    g = grade_skill(card, parse_answer(text), RECOMPUTE)
    return all(e.passed for e in g.expectations if e.check == "checklist.order")


@pytest.mark.parametrize("tail", [
    "Separately, if this was a borderline OOM, try expandable_segments:True first.",
    "別件ですが、境界的な OOM なら先に expandable_segments:True を設定してください。",
])
def test_an_allocator_note_that_says_it_goes_first_keeps_the_order(tail: str) -> None:
    text = "1. Go back to selective: recompute layernorm.\n2. Then mlp if needed.\n\n" + tail
    assert _allocator_order_ok(text)


def test_an_allocator_note_after_the_plan_without_first_breaks_the_order() -> None:
    text = ("1. Go back to selective: recompute layernorm.\n2. Then mlp if needed.\n\n"
            "後で expandable_segments:True も設定してください。")
    assert not _allocator_order_ok(text)


# ---------------------------------------------------------------- harness label lists


def test_a_made_up_label_in_the_harness_flag_is_an_invented_knob() -> None:
    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.keys import invented_keys
    run = "```bash\npython setup_experiment.py --recompute_modules {}\n```"
    bad = parse_answer(run.format("norm,moe_act"))
    assert next(b.what for b in invented_keys(bad.units)).startswith("--recompute_modules label")
    assert not invented_keys(parse_answer(run.format("layernorm,moe_act")).units)


def test_prose_about_the_harness_flag_names_no_label() -> None:
    from mbridge_perf.evals.answer import parse_answer
    from mbridge_perf.evals.keys import invented_keys
    text = "Note that `--recompute_modules` expects a comma-separated list of labels."
    assert not invented_keys(parse_answer(text).units)
    one = "```bash\npython setup_experiment.py --recompute_modules norm\n```"
    assert invented_keys(parse_answer(one).units)


# ---------------------------------------------------------------- Japanese requests as advice


def test_a_japanese_request_to_raise_pp_first_is_the_pp_mistake() -> None:
    text = "1 つの rank が OOM です。最初に PP を 2 → 4 に増やしましょう。次に allocator を見ます。"
    assert "pp-raise-first" in found(MEMORY, text)


@pytest.mark.parametrize("text", [
    "1 つの rank が OOM です。PP を 2 → 4 に増やすのはおすすめしません。allocator が先です。",
    "1 つの rank が OOM です。PP を 2 → 4 に増やすのは避けてください。allocator が先です。",
])
def test_a_japanese_refusal_of_the_pp_raise_is_not_advice(text: str) -> None:
    assert "pp-raise-first" not in found(MEMORY, text)
