"""The rules follow the Megatron-Core release a config runs on: 0.19.2 (what Megatron Bridge
0.6.2 ships) by default, 0.16.1 on request; the per-release facts come from the wheels."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from bridge_corpus import dumps
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.mcore import DEFAULT_MCORE_VERSION, mcore_facts, supported_versions
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.rules import validate

from helpers import REPO

M = {"num_layers": 8, "hidden_size": 128, "num_attention_heads": 8}
# Our ModelSection defaults that deliberately differ from TransformerConfig's: Bridge's
# GPTModelProvider default, or None where the release's literal means the same thing.
OWN_DEFAULTS = {
    "cross_entropy_loss_fusion",  # GPTModelProvider: True
    "cuda_graph_modules",  # None ≡ "full" (whole layer)
    "distribute_saved_activations",  # None ≡ False
    "fp4_recipe",  # only read when fp4 is set
    "q_lora_rank",  # None = no query compression (DeepSeek-V2-Lite); MLA's 512 when unset
}


def errors(cfg: dict[str, Any], version: str | None = None) -> set[str]:
    report = validate(load_config(data=cfg), mcore_version=version)
    return {f.rule_id for f in report.findings if f.severity == "error"}


def test_the_default_is_the_release_bridge_ships() -> None:
    assert DEFAULT_MCORE_VERSION == "0.19.2" and mcore_facts().version == "0.19.2"
    assert set(supported_versions()) == {"0.16.1", "0.19.2"}


def test_our_defaults_are_megatron_cores() -> None:
    facts = mcore_facts("0.19.2")
    differ = {k for k, v in facts.defaults.items() if ModelSection.model_fields[k].default != v}
    assert differ == OWN_DEFAULTS


def test_the_facts_file_is_what_the_generator_writes() -> None:
    data = json.loads((REPO / "server/mbridge_perf/config/mcore_facts.json").read_text())
    assert data["generated_by"] == "scripts/gen_mcore_facts.py"
    old, new = data["releases"]["0.16.1"], data["releases"]["0.19.2"]
    assert "full_iteration" in new["choices"]["cuda_graph_impl"]
    assert "full_iteration" not in old["choices"]["cuda_graph_impl"]
    assert set(new["recompute_modules"]) - set(old["recompute_modules"]) == {"gdn_norm_out"}


def test_full_iteration_graphs_exist_from_0_19() -> None:
    cfg = {"model": {**M, "cuda_graph_impl": "full_iteration", "use_te_rng_tracker": True},
           "rerun_state_machine": {"check_for_nan_in_loss": False}}
    assert "cudagraph.impl-valid" not in errors(cfg)
    assert "cudagraph.impl-valid" in errors(cfg, "0.16.1")


def test_recompute_labels_are_the_releases_own() -> None:
    cfg = {"model": {**M, "recompute_granularity": "selective",
                     "recompute_modules": ["gdn_norm_out"]}}
    assert "recompute.unknown-module" not in errors(cfg)
    report = validate(load_config(data=cfg), mcore_version="0.16.1")
    hit = [f for f in report.findings if f.rule_id == "recompute.unknown-module"]
    assert hit and "0.16.1" in hit[0].message and "gdn_norm_out" not in hit[0].fix


def test_a_scope_next_to_modules_full_is_migrated_in_0_19() -> None:
    # What Bridge dumps: cuda_graph_modules at its default "full", the scope carrying the choice.
    cfg = {"model": {**M, "num_moe_experts": 8, "moe_ffn_hidden_size": 64,
                     "cuda_graph_impl": "transformer_engine", "use_te_rng_tracker": True,
                     "cuda_graph_modules": "full", "cuda_graph_scope": ["attn", "moe_router"]}}
    assert "cudagraph.scope-and-modules" not in errors(cfg)
    report = validate(load_config(data=cfg))
    info = [f for f in report.findings if f.rule_id == "cudagraph.deprecated-fields"]
    assert info and info[0].severity == "info" and "['attn', 'moe_router']" in info[0].message
    both = copy.deepcopy(cfg)
    both["model"]["cuda_graph_modules"] = ["attn"]
    assert "cudagraph.scope-and-modules" in errors(both)


def test_0_16_has_no_cuda_graph_modules_field() -> None:
    cfg = {"model": {**M, "cuda_graph_impl": "transformer_engine", "use_te_rng_tracker": True,
                     "cuda_graph_modules": ["attn"]}}
    assert "cudagraph.scope-and-modules" not in errors(cfg)
    assert "cudagraph.scope-and-modules" in errors(cfg, "0.16.1")


def test_a_real_dump_under_the_older_release() -> None:
    name = "qwen3_235b_a22b_pretrain_64gpu_gb300_nvfp4_full_iteration_config"
    cfg = copy.deepcopy(dumps()[name])
    assert cfg["model"]["cuda_graph_impl"] == "full_iteration"
    assert "cudagraph.impl-valid" in errors(cfg, "0.16.1")
    assert not errors(cfg)


@pytest.mark.parametrize(("given", "release"), [("0.19.0", "0.19.2"), ("v0.16.0", "0.16.1"),
                                                ("0.19.2rc1", "0.19.2")])
def test_other_patches_of_a_line_use_its_rules(given: str, release: str) -> None:
    assert mcore_facts(given).version == release


@pytest.mark.parametrize(("given", "words"), [("0.17.0", "0.16.1 and 0.19.2"),
                                              ("latest", "not a Megatron-Core version")])
def test_an_unknown_release_is_one_clear_error(given: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(load_config(data={"model": M}), mcore_version=given)
    assert info.value.field == "mcore_version" and words in info.value.problem


@pytest.mark.parametrize(("field", "value"), [("moe_router_score_function", "sqrtsoftplus"),
                                              ("moe_flex_dispatcher_backend", "ncclep")])
def test_a_value_newer_than_the_release_is_an_error(field: str, value: str) -> None:
    cfg = {"model": {**M, "num_moe_experts": 8, "moe_ffn_hidden_size": 64,
                     "moe_token_dispatcher_type": "flex", field: value}}
    assert "release.value-not-in-release" not in errors(cfg)
    report = validate(load_config(data=cfg), mcore_version="0.16.1")
    hit = [f for f in report.findings if f.rule_id == "release.value-not-in-release"]
    assert hit and "needs Megatron-Core 0.19.2" in hit[0].message
    assert hit[0].fields == [f"model.{field}"]


def test_deprecated_sm_knobs_are_info_and_conflicting_ones_an_error() -> None:
    moe = {**M, "num_moe_experts": 8, "moe_ffn_hidden_size": 64}
    one = validate(load_config(data={"model": {**moe, "moe_hybridep_num_sms": 32}}))
    assert [f.severity for f in one.findings if f.rule_id == "moe.deprecated-num-sms"] == [
        "info"]
    both = {"model": {**moe, "moe_hybridep_num_sms": 32, "moe_deepep_num_sms": 20}}
    assert "moe.deprecated-num-sms" in errors(both)
    assert "moe.deprecated-num-sms" not in errors(both, "0.16.1")  # fields of their own there


def _mcore_errors(config: dict[str, Any], version: str) -> set[str]:
    from mbridge_perf.rules import get_rule

    report = validate(TrainingConfig(**config), mcore_version=version)
    return {f.rule_id for f in report.findings
            if f.severity == "error" and get_rule(f.rule_id).source == "megatron-core"}


def test_the_parity_corpus_version_gaps_follow_the_release_asked_for() -> None:
    # parity_corpus.yaml records both verdicts of every version gap: `expect` is what the
    # installed 0.16.1 does, `pin_expect` what the newer release does.
    cases = [c for c in yaml.safe_load((REPO / "tests/rules/parity_corpus.yaml").read_text())
             if c.get("version_gap")]
    raised_old = [c for c in cases if c["expect"] != "ok"]
    ok_new = [c for c in cases if c["pin_expect"] == "ok"]
    assert raised_old and ok_new
    for c in raised_old:
        assert _mcore_errors(c["config"], "0.16.1"), c["name"]
    for c in ok_new:
        assert not _mcore_errors(c["config"], "0.19.2"), c["name"]
