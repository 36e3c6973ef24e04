"""Round 34: two readings that do not depend on wording - byte-unit conversions recomputed, and
the config an answer writes checked by the project's validator. Our own phrasings, each with
a near miss that must not be flagged."""

from __future__ import annotations

import pytest

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.configs import config_errors, settings
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.units import unit_errors
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO


def _units(text: str):
    return parse_answer(text).units


@pytest.mark.parametrize("text", [
    "The worst rank peaked at 61.2 GB, which is roughly 65.7 GiB of the card.",
    "ピークは 61.2 GB、つまり約 65.7 GiB です。",
    "Budget: 70.0 GiB (75.2 GB is what) ... so 1 GB = 1.0737 GiB here.",
])
def test_a_conversion_done_the_wrong_way_is_an_error(text: str) -> None:
    found = unit_errors(_units(text))
    assert found and "1 GiB = 1.0737 GB" in found[0].evidence


@pytest.mark.parametrize("text", [
    "The worst rank peaked at 61.2 GB, which is roughly 57.0 GiB of the card.",
    "ピークは 61.2 GB、つまり約 57.0 GiB です。",
    "On an H100-80GB (79.1 GiB usable) the plan fits.",  # the card's name, not a conversion
    "The estimate was high by up to 20 GB (73.8 GiB predicted, 58.8 GB measured).",
    "73.8 GiB に対して実測は 58.8 GB でした。",  # two amounts compared
    "1 GiB = 1.0737 GB.",
])
def test_a_right_conversion_a_product_name_or_a_comparison_is_not(text: str) -> None:
    assert unit_errors(_units(text)) == []


PAD_WITH_DEEPEP = """Use this for the 128K run:

```python
cfg.model.moe_token_dispatcher_type = "flex"
cfg.model.moe_flex_dispatcher_backend = "deepep"
cfg.model.moe_pad_expert_input_to_capacity = True  # static shapes for the buffers
```
"""


def test_a_combination_the_validator_refuses_fails_the_answer() -> None:
    found = config_errors(_units(PAD_WITH_DEEPEP))
    assert [f.rule_id for f in found] == ["moe.deepep-no-pad"]
    assert "validate_config refuses" in found[0].evidence
    card = get_skill(REPO, "nemo-mbridge-perf-moe-long-context").card
    grade = grade_skill(card, parse_answer(PAD_WITH_DEEPEP), "nemo-mbridge-perf-moe-long-context")
    assert not grade.passed
    assert any("moe.deepep-no-pad" in e.evidence for e in grade.expectations if not e.passed)


def test_the_same_settings_without_padding_pass_the_validator() -> None:
    assert config_errors(_units(PAD_WITH_DEEPEP.replace("= True", "= False"))) == []


def test_ep_overlap_with_moe_recompute_written_in_one_block_is_refused() -> None:
    text = """```python
cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
cfg.model.recompute_granularity = "selective"
cfg.model.recompute_modules = ["layernorm", "moe"]   # unchanged from the baseline
```"""
    assert [f.rule_id for f in config_errors(_units(text))] == [
        "moe-overlap.bridge-requirements"]
    assert config_errors(_units(text.replace('"layernorm", "moe"', '"layernorm"'))) == []


@pytest.mark.parametrize("text", [
    # an inline mention inside a refusal is no setting
    "PP is 4, so `model.cpu_offloading=True` raises a ValueError; use recompute instead: "
    "`cfg.model.recompute_granularity = \"selective\"`.",
    # an error that needs a value the answer never wrote (EP left at our base's default)
    "```python\ncfg.comm_overlap.overlap_moe_expert_parallel_comm = True\n"
    "cfg.comm_overlap.delay_wgrad_compute = True\n```",
    # a setting we cannot apply is not judged (check_for_nan_in_loss lives outside our config)
    "```python\ncfg.model.cuda_graph_impl = \"local\"\ncfg.model.cuda_graph_scope = "
    "[\"full_iteration\"]\ncfg.model.use_te_rng_tracker = True\n"
    "cfg.rerun_state_machine.check_for_nan_in_loss = False\n```",
])
def test_what_the_answer_did_not_write_is_not_its_combination(text: str) -> None:
    assert config_errors(_units(text)) == []


def test_settings_are_bounded_literals_of_known_fields() -> None:
    text = "\n".join(["```python", "cfg.model.no_such_knob = 3",
                      "cfg.model.recompute_num_layers = __import__('os')",
                      "cfg.model.recompute_method = 'uniform'", "```"])
    assert list(settings(_units(text))) == ["model.recompute_method"]


def _json_answer(payload: str):
    a = parse_answer(f"Here is the request:\n\n```json\n{payload}\n```\n")
    return config_errors(a.units, a.json_blocks)


def test_a_json_override_map_is_a_config_the_validator_reads() -> None:
    payload = ('{"arguments": {"overrides": {"model.recompute_granularity": "selective", '
               '"model.recompute_modules": ["moe_act", "moe"], '
               '"comm_overlap.overlap_moe_expert_parallel_comm": true}}}')
    assert [f.rule_id for f in _json_answer(payload)] == ["moe-overlap.bridge-requirements"]
    assert _json_answer(payload.replace(', "moe"]', "]")) == []


def test_a_sweeps_jobs_are_alternatives_judged_with_the_shared_settings() -> None:
    shared = '"recompute": {"recompute_granularity": "selective", "recompute_modules": ["moe"]}'
    jobs = [f'{{"overrides": {{"comm_overlap.overlap_moe_expert_parallel_comm": {on}}}}}'
            for on in ("false", "true")]
    sweep = f'{{{shared}, "jobs": [{jobs[0]}, {jobs[1]}]}}'
    assert [f.rule_id for f in _json_answer(sweep)] == ["moe-overlap.bridge-requirements"]
    # two alternatives that would clash only if merged: layer offload vs selective recompute
    alts = ('{"candidates": [{"model.cpu_offloading": true, "model.cpu_offloading_num_layers": 2},'
            ' {"model.recompute_granularity": "selective", "model.recompute_modules": '
            '["layernorm"]}]}')
    assert _json_answer(alts) == []
    merged = alts.replace("}, {", ", ")
    assert "offload.cpu-excludes-recompute" in [f.rule_id for f in _json_answer(merged)]


def test_cp_is_the_result_of_a_chain_and_a_starred_product_keeps_cp() -> None:
    from mbridge_perf.evals.layout import formula_errors

    ok = _units("CP = 65536 / 4096 = 16 ranks.\n\nDense DP = world / (TP*PP*CP) = 2.")
    assert formula_errors(ok) == []
    bad = _units("CP = 65536 / 4096 = 16 ranks.\n\nDense DP = world / (TP*PP) = 32.")
    found = formula_errors(bad)
    assert found and "CP (= 16)" in found[0].evidence


def test_a_diffs_resulting_config_is_read_and_its_removed_lines_are_not() -> None:
    diff = """```diff
 cfg.model.recompute_granularity = "selective"
-cfg.model.recompute_modules = ["core_attn"]
+cfg.model.recompute_modules = ["moe_act"]
+cfg.model.recompute_num_layers = 4
```"""
    got = settings(_units(diff))
    assert got["model.recompute_modules"][0] == ["moe_act"]
    assert [f.rule_id for f in config_errors(_units(diff))] == [
        "recompute.selective-no-num-layers"]
    removed = diff.replace("+cfg.model.recompute_num_layers", "-cfg.model.recompute_num_layers")
    assert config_errors(_units(removed)) == []
