"""Round 30, from blind batch 12 (measured at 24/32 before any change for it): a question back
and a statement of where a field belongs place no step; a field said to "must be None" is reset;
a config block that shows the user's current state and a quoted line are not advice; a search
command names no advice; JSON recommendations are read with all their prose fields; and claims
the cards missed (any recompute refused under TE graphs, log GB read as GiB, an unset ETP read
as 1, the offload fraction's default, flex choosing its own backend). Sentences of our own,
each with a near miss."""

from __future__ import annotations

import json

from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found, order_ok

from mbridge_perf.evals.answer import parse_answer

# ---------------------------------------------------------------- what places a step

def test_a_question_back_about_the_allocator_places_no_step() -> None:
    text = ("Swap the list for `recompute_modules: [mla_up_proj, moe_act]`; add `layernorm` if "
            "still short.\n\nOne thing to confirm: did the failing job export "
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`?\n")
    assert order_ok(RECOMPUTE, text)


def test_an_allocator_step_placed_last_still_breaks_the_order() -> None:
    text = ("1. Swap the list for `recompute_modules: [mla_up_proj, moe_act]`.\n"
            "2. Then export `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.\n")
    assert not order_ok(RECOMPUTE, text)


def test_where_a_field_belongs_and_a_reset_are_not_full_recompute_steps() -> None:
    text = ("- `recompute_num_layers` has to be None under selective; it belongs only to full "
            "recompute, next to `recompute_method`.\n"
            "- Use `recompute_modules: [layernorm]` and add `mlp` only if still short.\n")
    assert order_ok(RECOMPUTE, text)


def test_a_block_showing_the_current_config_is_the_users_state() -> None:
    text = ("```yaml\n# current config\nrecompute_granularity: full\nrecompute_method: block\n"
            "recompute_num_layers: 2\n```\n\n"
            "Move to `recompute_modules: [layernorm]` with selective recompute; `mlp` only "
            "if still short.\n")
    units = parse_answer(text).units
    assert all(u.quoted for u in units[:4])
    assert order_ok(RECOMPUTE, text)
    advised = text.replace("# current config", "# proposed config")
    assert not any(u.quoted for u in parse_answer(advised).units)


def test_a_searched_term_is_not_advice() -> None:
    text = "```bash\n$ grep -c core_attn train.log   # should print 0\n```\n"
    assert "core-attn-at-long-seq" not in found(LONG, text)
    assert "core-attn-at-long-seq" in found(LONG, "At 128K, add core_attn to "
                                                  "recompute_modules first.\n")


def test_json_recommendations_are_read_with_their_prose_fields() -> None:
    body = {"recommendations": [
        {"rank": 1, "knob": "model.recompute_modules", "value": ["layernorm"],
         "expected_effect": "the logged peak of 58.8 GB is GiB, so 63.1 GB decimal"}],
        "rejected": [{"knob": "model.cpu_offloading", "value": True,
                      "reason": "ValueError at PP 4"}]}
    units = parse_answer("```json\n" + json.dumps(body) + "\n```\n").units
    assert "gib" in units[0].norm and units[1].negated_section


# ---------------------------------------------------------------- claims

def test_any_recompute_said_to_be_refused_under_te_graphs() -> None:
    bad = "Megatron-Core won't let you use recompute with TE-scoped CUDA graphs; drop the graphs."
    assert "selective-vs-te-graphs-flipped" in found(RECOMPUTE, bad)
    near = "Megatron-Core won't let you use full recompute with TE-scoped CUDA graphs."
    assert "selective-vs-te-graphs-flipped" not in found(RECOMPUTE, near)


def test_delayed_scaling_named_as_not_allowing_the_labels_spares_the_advice() -> None:
    text = ("Use `recompute_modules: [moe_act]`. Should you switch to FP8 delayed scaling, "
            "moe_act is not allowed there.\n")
    assert "delayed-fp8-recompute-labels-advised" not in found(RECOMPUTE, text)


def test_log_gigabytes_read_as_gib() -> None:
    bad = "The logged memory (GB) values are in GiB, so 58.8 there means 63.1 GB."
    assert "log-gb-read-as-gib" in found(MEMORY, bad)
    near = "The log prints decimal GB while the estimator reports GiB: 58.8 GB is 54.8 GiB."
    assert "log-gb-read-as-gib" not in found(MEMORY, near)


def test_unset_etp_read_as_one() -> None:
    bad = "Leave expert_tensor_parallel_size unset; the experts then stay whole (ETP = 1)."
    assert "etp-unset-defaults-to-one" in found(LONG, bad)
    near = "Set ETP = 1 explicitly: left unset it follows TP."
    assert "etp-unset-defaults-to-one" not in found(LONG, near)


def test_offload_fraction_default_read_as_everything() -> None:
    bad = "optimizer_offload_fraction is 1.0 by default, so the flag offloads everything."
    assert "offload-fraction-default-all" in found(LONG, bad)
    near = "optimizer_offload_fraction defaults to 0.0; set 1.0 to offload everything."
    assert "offload-fraction-default-all" not in found(LONG, near)


def test_flex_said_to_choose_its_backend() -> None:
    bad = "Setting moe_token_dispatcher_type to flex is enough; it uses DeepEP by default."
    assert "flex-picks-its-backend" in found(WORKFLOW, bad)
    near = ("Setting moe_token_dispatcher_type to flex is not enough: set "
            "moe_flex_dispatcher_backend too, or it falls back to alltoall.")
    assert "flex-picks-its-backend" not in found(WORKFLOW, near)


def test_a_passing_mention_of_drop_and_pad_does_not_license_the_moe_graph() -> None:
    text = ("```yaml\n# full_iteration graphs suit drop-and-pad experiments; not used here\n"
            "cuda_graph_impl: transformer_engine\ncuda_graph_modules: [moe]\n```\n")
    assert "moe-graph-module-no-drop-pad" in found(WORKFLOW, text)


def test_one_flag_differing_is_the_contract_in_substance() -> None:
    text = ("Next step: judge it on the unprofiled step time over iterations 41-50, and make "
            "sure only the overlap flag differs between the two runs.\n")
    assert "no-measurement-contract" not in found(WORKFLOW, text)
    assert "no-measurement-contract" in found(WORKFLOW, "Next step: judge it on the unprofiled "
                                                        "step time over iterations 41-50.\n")
