"""Round 35: readings that good answers tripped over in other people's words - a results-row
cell that opens with "no" and a noun, Japanese negations of existence and advice, a failing
command shown with its error, placeholder labels, our own tool names - each with the near miss
that must still be caught."""

from __future__ import annotations

import pytest

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.checks import checklist, order
from mbridge_perf.evals.claims import find_misconceptions
from mbridge_perf.evals.configs import config_errors
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.keys import OUR_TOOLS, invented_keys
from mbridge_perf.evals.matching import recommended
from mbridge_perf.server_tools import TOOLS
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO

MEMORY = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"


def _units(text: str):
    return parse_answer(text).units


def _claims(skill: str, text: str) -> list[str]:
    card = get_skill(REPO, skill).card
    return [f.misconception.id for f in find_misconceptions(card, _units(text))]


def _order(skill: str, text: str) -> list:
    """The card-order verdicts of a skill-checklist grade (none when fewer than two steps)."""
    items = get_skill(REPO, skill).card["answer_checklist"]
    return [e for e in checklist(parse_answer(text), items, lenient_order=True)
            if e.check == "checklist.order"]


PLAN_ROWS = """| step | lever | setting | cost |
|---|---|---|---|
| 1 | recompute | `model.recompute_modules = ["layernorm"]` | about 0 % |
| 2 | allocator | `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` | no throughput cost |
"""


def test_a_cell_opening_with_no_and_a_noun_does_not_reject_its_row() -> None:
    """Row 2 advises the allocator (its cost cell says "no throughput cost"), so the plan puts
    it after recompute."""
    got = order(parse_answer(PLAN_ROWS), [["expandable_segments", "layernorm"]])[0]
    assert not got.passed and "no throughput cost" in got.evidence


def test_a_bare_no_verdict_still_rejects_its_row() -> None:
    text = PLAN_ROWS.replace("| 2 | allocator |", "| 2 | allocator | no |")
    got = order(parse_answer(text), [["expandable_segments", "layernorm"]])[0]
    assert got.evidence == "'expandable_segments' is not recommended"


@pytest.mark.parametrize("text", [
    "`up_proj` と `norm` は seed の略記で、ピン留めされた recompute_modules には存在しません。",
    "**やってはいけないこと**：FP8 をメモリ削減策として勧めない。",
])
def test_japanese_negations_of_existence_and_of_advice(text: str) -> None:
    skill = RECOMPUTE if "up_proj" in text else MEMORY
    assert _claims(skill, text) == []


@pytest.mark.parametrize("text, claim", [
    ("MLA の up-projection は recompute_modules に `up_proj` を入れて再計算します。",
     "invented-up-proj-label"),
])
def test_the_same_claims_without_the_negation_are_caught(text: str, claim: str) -> None:
    assert claim in _claims(RECOMPUTE, text)


def test_a_pp_raise_that_halves_dp_in_a_numbered_plan_row_is_caught_with_its_cost() -> None:
    row = ("| 2 | `model.pipeline_model_parallel_size` | 4 → 8 (DP 2 → 1) | peak 58.8 → 53.2 GB "
           "| 668.0 TFLOP/s/GPU, −5.9 % |")
    assert "pp-for-dp-trade" in _claims(MEMORY, row)
    assert "pp-for-dp-trade" not in _claims(
        MEMORY, "PP を上げるのは余っている GPU で DP を維持できる場合に限ります（PP 4→8、DP 2→1 "
                "は -5.9%）。")


FAILING = """```console
$ python scripts/performance/setup_experiment.py --recompute_modules core_attn layernorm
error: unrecognized arguments: layernorm
```

Pass one comma-separated value instead:

```console
$ python scripts/performance/setup_experiment.py --recompute_modules core_attn,layernorm
# --recompute_modules a,b -> selective with those labels
```
"""


def test_a_command_shown_with_its_error_and_placeholder_labels_are_no_advice() -> None:
    assert invented_keys(_units(FAILING)) == []


def test_the_space_separated_command_without_an_error_line_is_still_advice() -> None:
    text = FAILING.replace("error: unrecognized arguments: layernorm\n", "")
    assert [b.what.split(" (")[0] for b in invented_keys(_units(text))] == [
        "--recompute_modules core_attn layernorm"]


def test_one_letter_placeholders_do_not_hide_a_made_up_label_beside_a_real_one() -> None:
    bad = invented_keys(_units("Set `--recompute_modules moe_act,x,up_proj` on the launcher."))
    assert any("'up_proj'" in b.what for b in bad)


def test_our_tool_names_are_known_and_match_the_server() -> None:
    assert {fn.__name__ for fn, _, _ in TOOLS} == OUR_TOOLS
    text = "Run `validate_config`: it reports recompute.full-needs-method first."
    assert invented_keys(_units(text)) == []


def test_japanese_optimizer_offload_is_not_layer_offload_at_pp_gt_1() -> None:
    layout = "レイアウトは TP1 PP8 です。"
    assert "cpu-offload-at-pp-gt-1" not in _claims(
        "nemo-mbridge-perf-moe-long-context",
        layout + "それでも足りなければオプティマイザーの CPU オフロードを有効にします。")
    assert "cpu-offload-at-pp-gt-1" in _claims(
        "nemo-mbridge-perf-moe-long-context",
        layout + "それでも足りなければ CPU オフロードを有効にしてください。")


@pytest.mark.parametrize("text", [
    "既存の `core_attn` は効いていないので、layernorm に替えます。",
    "VPP はバブルのための設定で、メモリを減らす効果はありません。",
])
def test_more_japanese_negations(text: str) -> None:
    skill = RECOMPUTE if "core_attn" in text else MEMORY
    assert _claims(skill, text) == []


def test_a_constraint_cited_by_its_rule_id_is_not_offloading_advised_first() -> None:
    row = ("| layers offloaded | `model.cpu_offloading_num_layers` in [0, num_layers) | "
           "`offload.cpu-num-layers-range` |")
    assert "cpu-offload-first" not in _claims(MEMORY, row)
    assert "cpu-offload-first" in _claims(MEMORY, "1. Enable cpu_offloading=True for 4 layers.")


def test_setting_up_offload_with_recompute_off_is_not_ranking_it_first() -> None:
    text = ("PP is 1 here. Offload path: `cpu_offloading=True`, `cpu_offloading_num_layers=4`, "
            "`recompute_granularity=None` (offloading excludes recompute).")
    assert "cpu-offload-first" not in _claims(MEMORY, text)


def test_a_pp_1_layout_is_not_read_from_what_one_stage_holds() -> None:
    text = ("Layout TP4 PP4. Yes, as long as the count fits within what a single pipeline stage "
            "holds.\n\n```python\ncfg.model.cpu_offloading = True\n```")
    assert "cpu-offload-at-pp-gt-1" in _claims(MEMORY, text)
    assert "cpu-offload-at-pp-gt-1" not in _claims(
        MEMORY, text.replace("Layout TP4 PP4. Yes, as long as the count fits within what a "
                             "single pipeline stage holds.", "The job runs a single pipeline "
                             "stage (PP=1)."))


@pytest.mark.parametrize("text, claim", [
    # "not" negates the resize, not fragmentation
    ("Do not resize the layout for a fragmentation OOM; TP 8 cost 28.4 %.",
     "fragmentation-ruled-out-blindly"),
    # FP8 names the measured recipe; the 3 GB is mlp's
    ("Checklist: proving a memory fix on the Llama3 70B FP8 SFT job.", "fp8-saves-memory"),
    ("llama3 70b・h100・fp8 の実測では mlp で約 3 GB 減りました。", "fp8-saves-memory"),
    # the DP = 1 caveat in Japanese
    ("DP=4 なので distributed optimizer は効果があります。DP=1 の構成では何も節約しません。",
     "distributed-optimizer-at-dp1"),
])
def test_claims_not_made(text: str, claim: str) -> None:
    assert claim not in _claims(MEMORY, text)


@pytest.mark.parametrize("text, claim", [
    ("Only rank 0 is over, so it is not fragmentation; it is a genuine capacity problem.",
     "fragmentation-ruled-out-blindly"),
    ("Switch to an FP8 recipe: it halves the weight memory.", "fp8-saves-memory"),
    ("Layout TP8 PP8 DP1. Enable the distributed optimizer to save memory.",
     "distributed-optimizer-at-dp1"),
])
def test_the_claims_themselves_are_still_caught(text: str, claim: str) -> None:
    assert claim in _claims(MEMORY, text)


def test_mlp_cost_is_not_read_across_a_japanese_sentence_end() -> None:
    text = ("TE グラフの scope は `mlp` です。1 行目だけで OOM が消えました（golden 比 -0.8 %）。")
    assert "mlp-cost-understated" not in _claims(RECOMPUTE, text)
    assert "mlp-cost-understated" in _claims(
        RECOMPUTE, "Adding mlp to recompute_modules is cheap: about 3 % lower throughput.")


def test_etp_default_of_one_is_right_with_tp_1() -> None:
    mlc = "nemo-mbridge-perf-moe-long-context"
    text = "ETP is not given; with TP=1 it defaults to 1."
    assert "etp-unset-defaults-to-one" not in _claims(mlc, text)
    assert "etp-unset-defaults-to-one" in _claims(mlc, "If you don't set ETP, it defaults to 1.")


def test_summed_kernel_time_set_against_the_union_is_no_claim() -> None:
    mow = "nemo-mbridge-perf-moe-optimization-workflow"
    text = ("The summed kernel time can go up while the union of busy intervals and the step "
            "time go down, so it says nothing about overlap.")
    assert "summed-kernel-time" not in _claims(mow, text)


def test_a_step_already_in_place_or_put_first_does_not_break_the_order() -> None:
    kept = ("```python\ncfg.model.recompute_granularity = \"full\"\n"
            "cfg.model.recompute_method = \"uniform\"\ncfg.model.recompute_num_layers = 2\n```\n\n"
            "```bash\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  "
            "# keep the allocator fix on\n```\n")
    first = ("Stay with `recompute_granularity=\"selective\"` and recompute layernorm. If you went "
             "to full because of an OOM: make sure `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:"
             "True` is set first.")
    for text in (kept, first):
        got = _order(RECOMPUTE, text)
        assert all(e.passed for e in got), got
    moved = kept.replace("  # keep the allocator fix on", "  # then the allocator")
    got = _order(RECOMPUTE, moved)
    assert got and not got[0].passed


def _json_errors(payload: str) -> list[str]:
    a = parse_answer(f"```json\n{payload}\n```\n")
    return [f.rule_id for f in config_errors(a.units, a.json_blocks)]


BUILDS_ON = """{"baseline": {"comm_overlap.overlap_moe_expert_parallel_comm": false,
              "comm_overlap.delay_wgrad_compute": false},
 "candidates": [
   {"id": "ep_overlap", "changes": {"comm_overlap.overlap_moe_expert_parallel_comm": true}},
   {"id": "plus_delay_wgrad", "compare_to": "ep_overlap",
    "changes": {"comm_overlap.delay_wgrad_compute": true}}]}"""


def test_a_candidate_that_names_its_sibling_builds_on_its_settings() -> None:
    assert _json_errors(BUILDS_ON) == []
    # without the link it is delayed wgrad with EP overlap off, which the validator refuses
    assert _json_errors(BUILDS_ON.replace('"compare_to": "ep_overlap",', "")) == [
        "moe-overlap.delay-wgrad-needs-overlap"]


def test_the_setup_of_a_measured_figure_is_not_a_step_in_the_order() -> None:
    mlc = "nemo-mbridge-perf-moe-long-context"
    text = ("Tracked runs: 32 GB200, BF16, HybridEP.\n\n1. Size CP from the sequence: CP = "
            "seq_length / 4096.\n2. Selective recompute on moe_act and layernorm.")
    got = _order(mlc, text)
    assert all(e.passed for e in got), got
    text = text.replace("Tracked runs: 32 GB200, BF16, HybridEP.", "Use HybridEP on GB200.")
    got = _order(mlc, text)
    assert got and not got[0].passed


def test_clearing_a_field_is_not_recommending_it() -> None:
    text = "Go back to selective and clear `recompute_num_layers` (it must be None there)."
    assert not recommended(_units(text), "recompute_num_layers")
    assert recommended(_units("Set `recompute_num_layers` to 2 under full."),
                       "recompute_num_layers")


ENV_AND_UB = """```bash
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True   # the allocator fix
```

```python
cfg.ddp.nccl_ub = True   # keep NCCL user buffers on
```
"""


def test_an_exported_allocator_setting_is_validated_with_the_config_lines() -> None:
    assert [f.rule_id for f in config_errors(_units(ENV_AND_UB))] == ["env.expandable-vs-nccl-ub"]
    assert config_errors(_units(ENV_AND_UB.replace("= True", "= False"))) == []


def test_a_claim_that_something_is_refused_keeps_its_own_negative_words() -> None:
    text = ("Selective granularity needs a non-empty `recompute_modules` list, and an empty one "
            "fails config validation.")
    assert "selective-needs-nonempty-list" in _claims(RECOMPUTE, text)
    assert "selective-needs-nonempty-list" not in _claims(
        RECOMPUTE, "The seed wants a non-empty list, but the pinned code accepts an empty list.")


def test_a_task_list_item_is_read_like_any_list_item() -> None:
    mow = "nemo-mbridge-perf-moe-optimization-workflow"
    text = ("- [ ] Bring up directly on `moe_token_dispatcher_type=\"flex\"` + "
            "`moe_flex_dispatcher_backend=\"deepep\"`.")
    assert parse_answer(text).units[0].text.startswith("Bring up")
    assert "flex-backend-at-bring-up" in _claims(mow, text)
    assert "flex-backend-at-bring-up" not in _claims(
        mow, "- [ ] Bring up on alltoall; A/B flex + deepep later.")


@pytest.mark.parametrize("tail", [
    "Export `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` regardless.",
    "If you keep TE graphs, make sure `NCCL_GRAPH_REGISTER=0` is exported next to "
    "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.",
    "If so, try `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (plus `NCCL_GRAPH_REGISTER=0` "
    "while TE-scoped graphs stay on) first.",
])
def test_an_allocator_line_made_regardless_checked_or_put_first_keeps_the_order(tail: str) -> None:
    text = "Go back to `recompute_granularity=\"selective\"` with layernorm. " + tail
    got = _order(RECOMPUTE, text)
    assert all(e.passed for e in got), got
    plain = "Go back to `recompute_granularity=\"selective\"` with layernorm. Then export " \
            "`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`."
    got = _order(RECOMPUTE, plain)
    assert got and not got[0].passed


@pytest.mark.parametrize("text", [
    "```python\ncfg.model.recompute_granularity = \"selective\"\n"
    "cfg.model.recompute_modules = [...]\n```",
    "```json\n{\"model.recompute_modules\": [1], "
    "\"model.recompute_granularity\": \"selective\"}\n```",
])
def test_a_value_of_the_wrong_type_is_not_judged_and_does_not_crash_the_grade(text: str) -> None:
    a = parse_answer(text)
    assert config_errors(a.units, a.json_blocks) == []
    card = get_skill(REPO, RECOMPUTE).card
    assert grade_skill(card, a, RECOMPUTE).passed


def test_a_typed_combination_is_still_refused() -> None:
    text = ("```python\ncfg.model.recompute_granularity = \"selective\"\n"
            "cfg.model.recompute_num_layers = 2\n```")
    assert [f.rule_id for f in config_errors(_units(text))] == ["recompute.selective-no-num-layers"]
