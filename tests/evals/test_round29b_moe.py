"""Round 29b, MoE skills (long context, optimization workflow): mistake classes blind batches 8
and 9 showed the grader missing or misreading, each tested in sentences of our own with a near
miss that must not trip it."""

from __future__ import annotations

from test_claims import WORKFLOW, found

from mbridge_perf.evals.answer import parse_answer

# ---------------------------------------------------------------- JSON reports are read


def _json(rationale: str) -> str:
    return ("```json\n{\n  \"run\": \"mxfp8 vs bf16\",\n  \"decision\": \"drop\",\n"
            f"  \"why\": \"{rationale}\",\n  \"todo\": [\"rerun the profile\"]\n}}\n```\n")


def test_a_json_verdict_without_recommendations_is_read_as_prose() -> None:
    units = [u.norm for u in parse_answer(_json("The MFU of MXFP8 sank to 30 % from 40 % on "
                                                "BF16, so MXFP8 is the slower recipe.")).units]
    assert any("mfu of mxfp8 sank" in u for u in units)
    assert "rerun the profile" in units
    # one-word labels and ids stay out
    assert "drop" not in units


def test_mfu_verdict_inside_json_is_the_cross_precision_claim() -> None:
    bad = _json("MFU is lower for MXFP8 than for BF16, so the BF16 recipe stays.")
    assert "mfu-across-precisions" in found(WORKFLOW, bad)
    near = _json("MFU is lower for MXFP8, but its peak is higher; on absolute TFLOP/s/GPU "
                 "MXFP8 is ahead, so keep it.")
    assert "mfu-across-precisions" not in found(WORKFLOW, near)


def test_mfu_held_up_as_the_fair_yardstick_is_the_claim() -> None:
    assert "mfu-across-precisions" in found(
        WORKFLOW, "Because MFU normalises for the chip, it is the fair score to set FP8 "
                  "beside BF16, and FP8 comes out behind.")
    assert "mfu-across-precisions" not in found(
        WORKFLOW, "MFU is not a fair score across FP8 and BF16: the FP8 peak is higher.")


# ---------------------------------------------------------------- summed kernel time, denied


def test_summed_kernel_time_set_unequal_to_wall_time_is_a_rejection() -> None:
    assert "summed-kernel-time" not in found(
        WORKFLOW, "Added-up kernel durations ≠ wall time when the all-to-all overlaps GEMMs.")
    assert "summed-kernel-time" not in found(
        WORKFLOW, "通信と計算が重なるとき、カーネル時間の合計はウォールタイムではありません。")
    assert "summed-kernel-time" in found(
        WORKFLOW, "Add up the NCCL kernel times in the trace: that total is the exposed "
                  "communication.")


# ---------------------------------------------------------------- contract held fixed


def test_conditions_held_fixed_in_japanese_state_the_contract() -> None:
    assert "no-measurement-contract" not in found(
        WORKFLOW, "計画: 比較はマッチさせた 2 つの実行で行い、コンテナとレイアウトは固定します。")
    assert "no-measurement-contract" in found(
        WORKFLOW, "計画: DeepEP に切り替えて TFLOP/s を比べてください。")


# ---------------------------------------------------------------- moe graph module, dropless


def test_the_whole_moe_graph_module_without_drop_and_pad_is_wrong() -> None:
    bad = ("Launch gaps sit inside the expert layers.\n\n```python\n"
           "cfg.model.cuda_graph_impl = \"transformer_engine\"\n"
           "cfg.model.cuda_graph_modules = [\"moe\"]\n```\n")
    assert "moe-graph-module-no-drop-pad" in found(WORKFLOW, bad)
    assert "moe-graph-module-no-drop-pad" in found(
        WORKFLOW, "ドロップレスなので MoE 層ごと CUDA グラフでキャプチャします。")
    near = ("Launch gaps sit inside the expert layers.\n\n```python\n"
            "cfg.model.cuda_graph_impl = \"transformer_engine\"\n"
            "cfg.model.cuda_graph_modules = [\"moe_router\", \"moe_preprocess\"]\n```\n")
    assert "moe-graph-module-no-drop-pad" not in found(WORKFLOW, near)
    padded = ("The run routes drop-and-pad (capacity factor 1.0), so the moe module may be "
              "graphed.\n\n```python\ncfg.model.cuda_graph_modules = [\"moe\"]\n```\n")
    assert "moe-graph-module-no-drop-pad" not in found(WORKFLOW, padded)


# ---------------------------------------------------------------- review answers: evidence


def _order_ok(text: str) -> bool:
    from test_claims import card

    from mbridge_perf.evals.grade import grade_skill
    grade = grade_skill(card(WORKFLOW), parse_answer(text), WORKFLOW)
    return all(e.passed for e in grade.expectations if e.check == "checklist.order")


def test_a_contract_diff_of_finished_runs_is_evidence_not_a_late_contract_step() -> None:
    review = ("Hold the merge.\n\n"
              "- Steps: run at least 50 steps and quote iterations 41-50.\n"
              "- Baseline: diff both runs with compare_benchmarks, which flags any mismatch in "
              "the measurement contract (versions, GBS, routing).\n")
    assert _order_ok(review)
    plan = ("1. Run at least 50 steps and quote iterations 41-50.\n"
            "2. Then freeze the measurement contract: versions, GBS, routing, window.\n")
    assert not _order_ok(plan)


def test_a_log_file_in_a_grep_is_not_a_config_field() -> None:
    from mbridge_perf.evals.keys import invented_keys
    ok = parse_answer("```bash\ngrep 'Falling back to alltoall' train.log  # nothing\n```\n")
    assert invented_keys(ok.units) == []
    bad = parse_answer("Set `train.log_every_step=true` for the window.")
    assert [b.what for b in invented_keys(bad.units)] == [
        "train.log_every_step (no such field in train)"]


# ---------------------------------------------------------------- graphs and variable length (JA)


def test_japanese_recapture_per_shape_is_the_variable_shape_claim() -> None:
    from test_claims import LONG
    assert "graphs-with-variable-shapes" in found(
        LONG, "CUDA graph はシーケンス長が変わるたびに再キャプチャされるので、packing した"
              "データのままで大丈夫です。")
    assert "graphs-with-variable-shapes" not in found(
        LONG, "CUDA graph はシーケンス長が変わると再キャプチャが必要になるため、packing した"
              "可変長データでは固定長にそろえるか eager のままにします。")


# ---------------------------------------------------------------- averaging from iteration one


def test_averaging_the_entire_log_is_averaging_from_iteration_one() -> None:
    assert "average-includes-warmup" in found(
        WORKFLOW, "Give each arm 60 steps, then average the complete log for the headline.")
    assert "average-includes-warmup" not in found(
        WORKFLOW, "Give each arm 60 steps, then average iterations 41-50 for the headline.")


def test_a_reported_skipped_count_does_not_excuse_a_window_from_one() -> None:
    assert "average-includes-warmup" in found(
        WORKFLOW, "Quote the mean over iterations 1-60 next to zero skipped/NaN iterations.")
    assert "average-includes-warmup" not in found(
        WORKFLOW, "Quote the mean once the warm-up iterations are skipped, next to zero "
                  "skipped/NaN iterations.")


# ---------------------------------------------------------------- other spellings of a claim


def test_mfu_spelled_out_is_still_mfu() -> None:
    assert "mfu-across-precisions" in found(
        WORKFLOW, "Model FLOPs utilization dropped with MXFP8 against BF16, so revert to BF16.")
    assert "mfu-across-precisions" not in found(
        WORKFLOW, "Model FLOPs utilization dropped with MXFP8, but against a higher peak; the "
                  "absolute TFLOP/s/GPU rose, so keep MXFP8.")


def test_the_moe_scope_as_a_harness_flag_without_drop_and_pad() -> None:
    assert "moe-graph-module-no-drop-pad" in found(
        WORKFLOW, "```bash\nsetup_experiment.py $ARGS --cuda_graph_scope moe\n```\n")
    assert "moe-graph-module-no-drop-pad" not in found(
        WORKFLOW, "```bash\nsetup_experiment.py $ARGS --cuda_graph_scope moe_router\n```\n")


def test_a_new_graph_recorded_per_length_is_the_variable_shape_claim() -> None:
    from test_claims import LONG
    assert "graphs-with-variable-shapes" in found(
        LONG, "Leave the batches packed: TE builds a separate graph for every sequence length.")
    assert "graphs-with-variable-shapes" not in found(
        LONG, "TE would need a separate graph for every sequence length, so keep packed "
              "batches eager or pad them to a fixed length.")


def test_a_review_demanding_a_matching_baseline_is_evidence_not_a_late_contract() -> None:
    review = ("Not ready to ship.\n\n"
              "- Window: at least 50 steps, iterations 41-50.\n"
              "- Baseline: it must match this run's measurement contract (image, layout, "
              "routing).\n")
    assert _order_ok(review)
    ja = ("まだ出せません。\n\n- 50 ステップ以上回し、41–50 の区間で報告してください。\n"
          "- ベースラインと measurement contract（イメージ、レイアウト）が一致していることを"
          "示してください。\n")
    assert _order_ok(ja)
    late = ("1. Run at least 50 steps, iterations 41-50.\n"
            "2. Afterwards freeze the measurement contract (image, layout, routing).\n")
    assert not _order_ok(late)
