"""Round 31, from blind batches 11 and 14 (written blind this stop, measured once at c1dcba2:
23/32 and 22/32, the same as at the start of the stop): readings and claims they showed
missing, each in sentences of our own with a near miss."""

from __future__ import annotations

import json

from test_claims import LONG, MEMORY, RECOMPUTE, WORKFLOW, found, order_ok

from mbridge_perf.evals.answer import parse_answer

# ---------------------------------------------------------------- readings

def test_sono_mae_ni_after_a_full_stop_places_the_step_first() -> None:
    text = ("- `recompute_modules=[\"layernorm\"]` を使ってください。`mlp` は最後の手段です。"
            "その前に `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` が効いているか確認して"
            "ください。\n")
    assert order_ok(RECOMPUTE, text)


def test_a_labels_verdict_after_its_colon_rejects_the_label() -> None:
    text = "- Layer CPU offloading: impossible with PP > 1 (ValueError).\n"
    assert "cpu-offload-with-pp" not in found(MEMORY, text)
    assert "cpu-offload-with-pp" in found(MEMORY, "- Layer CPU offloading works with PP > 1.\n")


def test_a_row_of_measured_results_is_not_advice_but_a_row_that_says_do_it_is() -> None:
    table = ("| run | step (s) | TFLOP/s |\n|---|---|---|\n"
             "| baseline: flex + DeepEP, no overlap | 24.7 | 244.0 |\n")
    assert "flex-backend-at-bring-up" not in found(WORKFLOW, table)
    advised = table.replace("| 24.7 | 244.0 |", "| 24.7 | 244.0 | start here |")
    assert "flex-backend-at-bring-up" in found(WORKFLOW, advised)


def test_json_settings_keyed_by_config_path_are_read() -> None:
    body = {"candidate": {"changes": {"model.cuda_graph_modules": ["moe"],
                                      "model.cuda_graph_impl": "transformer_engine"}}}
    text = "```json\n" + json.dumps(body) + "\n```\n"
    assert any("cuda_graph_modules=[moe]" in u.norm for u in parse_answer(text).units)
    assert "moe-graph-module-no-drop-pad" in found(WORKFLOW, text)


def test_a_second_imperative_after_and_is_its_own_clause() -> None:
    bad = "Drop the first ten steps as warm-up and average iterations 11-20 for the verdict."
    assert "throughput-averaged-on-an-early-window" in found(RECOMPUTE, bad)
    near = "Run 50 steps, drop the warm-up and average iterations 41-50 for the verdict."
    assert "throughput-averaged-on-an-early-window" not in found(RECOMPUTE, near)


# ---------------------------------------------------------------- when a claim applies

def test_capacity_is_right_once_the_allocator_fix_is_verified() -> None:
    text = ("The allocator fix is verified on every rank and rank 0 still OOMs.\n\n"
            "So this is real capacity, not fragmentation: shrink the biggest bucket.\n")
    assert "fragmentation-ruled-out-blindly" not in found(MEMORY, text)
    bare = "Rank 0 OOMs. This is real capacity, not fragmentation: shrink the biggest bucket.\n"
    assert "fragmentation-ruled-out-blindly" in found(MEMORY, bare)


def test_full_recompute_first_is_not_judged_on_a_uniform_or_block_answer() -> None:
    text = ("Rank 0 OOMs. For full recompute price uniform vs block: uniform with N = 2 "
            "beat N = 1 here.\n\n```python\ncfg.model.recompute_granularity = \"full\"\n```\n")
    assert "full-recompute-first" not in found(RECOMPUTE, text)


def test_an_answer_out_of_activation_room_must_name_the_allocator() -> None:
    bad = ("You are out of activation room on rank 0. Use recompute_modules=[\"layernorm\"]; "
           "full recompute only if selective cannot fit.\n")
    assert "no-allocator-check" in found(RECOMPUTE, bad)
    good = bad + "Before that, set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True.\n"
    assert "no-allocator-check" not in found(RECOMPUTE, good)


def test_distributed_optimizer_at_dp1_with_another_layout_named() -> None:
    bad = ("Layout TP4 PP8 DP1. The DP=2 layout ran at 704 TFLOP/s. Enable "
           "use_distributed_optimizer=true to free several GB here.\n")
    assert "distributed-optimizer-at-dp1" in found(MEMORY, bad)


def test_japanese_contract_in_substance() -> None:
    text = "判定は 41–50 の区間で、条件をそろえた実行同士で、変えるのは一度に 1 変数だけです。"
    assert "no-measurement-contract" not in found(WORKFLOW, text)


# ---------------------------------------------------------------- claims

def test_log_memory_lines_read_as_binary() -> None:
    assert "log-gb-read-as-gib" in found(MEMORY, "The memory lines are in binary units, so "
                                                 "60.0 there is 60.0 GiB.")


def test_delayed_scaling_called_standard_with_the_recipe_list_kept() -> None:
    text = ("Delayed scaling is the standard FP8 recipe on H100 for this run. Keep the "
            "published recompute list.\n")
    assert "delayed-fp8-with-recompute" in found(LONG, text)


def test_every_dimension_multiplied_into_a_gpu_count() -> None:
    text = "Each dimension multiplies: TP·CP·EP·PP = 1 · 16 · 32 · 8 = 4096."
    assert "gpu-count-product" in found(LONG, text)


def test_skipping_the_alltoall_baseline() -> None:
    assert "alltoall-baseline-skipped" in found(WORKFLOW, "Start on HybridEP right away; it "
                                                          "saves an alltoall bring-up run.")
    assert "alltoall-baseline-skipped" not in found(WORKFLOW, "Never skip the alltoall "
                                                              "baseline run.")


def test_pp_for_dp_tried_before_recompute() -> None:
    bad = "2. PP 4→8 (DP 2→1), -5.9 %: try it before selective recompute."
    assert "pp-for-dp-before-recompute" in found(MEMORY, bad)
    near = "Do not try PP 4→8 (DP 2→1) before selective recompute: it cost 5.9 %."
    assert "pp-for-dp-before-recompute" not in found(MEMORY, near)


def test_graph_register_dropped_on_blackwell() -> None:
    bad = "On GB200 NCCL_GRAPH_REGISTER=0 is not required, so drop it."
    assert "graph-register-not-needed-on-blackwell" in found(RECOMPUTE, bad)
    near = "NCCL_GRAPH_REGISTER=0 is still needed on GB200 with TE graphs."
    assert "graph-register-not-needed-on-blackwell" not in found(RECOMPUTE, near)


def test_run_script_said_to_get_the_perf_env() -> None:
    bad = "run_script.py gets the same environment as the perf launcher, so that is not it."
    assert "run-script-gets-perf-env" in found(MEMORY, bad)
    near = "run_script.py skips the env plugin, so PYTORCH_CUDA_ALLOC_CONF is missing there."
    assert "run-script-gets-perf-env" not in found(MEMORY, near)


def test_full_recompute_kept_with_a_narrower_te_scope() -> None:
    bad = "Keep full recompute and narrow the TE graph to attn: cuda_graph_modules=[attn]."
    assert "narrow-te-scope-allows-full" in found(RECOMPUTE, bad)
    near = "Keep full recompute and set cuda_graph_impl=full_iteration instead."
    assert "narrow-te-scope-allows-full" not in found(RECOMPUTE, near)
