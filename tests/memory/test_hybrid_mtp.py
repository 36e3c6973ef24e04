"""MTP layers of hybrid Mamba models (Nemotron 3.5 Lightning: hybrid Mamba + MoE with MTP) as
Megatron Bridge and Megatron-Core build them: Bridge appends ``mtp_hybrid_override_pattern``
to the decoder pattern after '/', one MTP layer is enorm + hnorm + eh_proj + the pattern's
hybrid layers + a final norm, ``mtp_use_repeated_layer`` holds one layer's parameters for all
``mtp_num_layers`` depths; and MTP of GPT models repeated the same way."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bridge_corpus import dumps, index
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory
from mbridge_perf.memory.params import count_params

LIGHTNING = ("nemotron_3_5_lightning_pretrain_16gpu_h100_bf16_config",
             "nemotron_3_5_lightning_pretrain_8gpu_b200_fp8mx_config")


def _dump(name: str = LIGHTNING[0], **model: Any) -> dict[str, Any]:
    data = copy.deepcopy(dumps()[name])
    data["model"].update(model)
    return data


def _mtp_arithmetic(m: dict[str, Any]) -> int:
    """One Lightning MTP layer ('*E') from the dump's fields, written out: RMSNorm, no biases,
    squared-ReLU (not gated) experts and shared expert."""
    h, heads, groups, d = (m["hidden_size"], m["num_attention_heads"], m["num_query_groups"],
                           m["kv_channels"])
    experts, f, shared = m["num_moe_experts"], m["moe_ffn_hidden_size"], m[
        "moe_shared_expert_intermediate_size"]
    attention = h + h * (heads * d + 2 * groups * d) + heads * d * h  # norm, qkv, proj
    moe = h + h * experts + experts * 2 * h * f + 2 * h * shared  # norm, router, experts, shared
    return attention + moe + 2 * h * h + 3 * h  # eh_proj, enorm / hnorm / final norm


@pytest.mark.parametrize("name", LIGHTNING)
def test_lightning_dumps_load_and_estimate_with_their_mtp_layers(name: str) -> None:
    assert index()[name]["validate"] == "PASS"
    cfg = load_config(data=_dump(name))
    report = estimate_memory(cfg)
    last = report.per_stage[-1]
    assert last.mtp_layers == 2 and last.mtp_activations_gib > 0
    assert 0 < report.peak_allocated_gib < 400
    count = count_params(cfg.model, pad_vocab=False)
    assert len(count.mtp_layers) == 1  # mtp_use_repeated_layer: one layer, two depths
    assert count.mtp == _mtp_arithmetic(dumps()[name]["model"])
    inner = count.mtp_layers[0].inner_layers
    assert [(x.mixer, x.mlp) for x in inner] == [("attention", "none"), ("none", "moe")]
    # the decoder is Nemotron 3 Nano 30B-A3B's (31.6B published); MTP adds 1.34B
    assert count.total - count.mtp == pytest.approx(31.58e9, rel=0.005)


def test_repeated_mtp_layer_holds_one_layers_parameters_for_every_depth() -> None:
    shared = estimate_memory(load_config(data=_dump()))
    one = estimate_memory(load_config(data=_dump(mtp_num_layers=1)))
    separate = estimate_memory(load_config(data=_dump(mtp_use_repeated_layer=False)))
    mtp = _mtp_arithmetic(dumps()[LIGHTNING[0]]["model"])
    s, o, p = shared.per_stage[-1], one.per_stage[-1], separate.per_stage[-1]
    assert s.params == o.params  # depths share the one layer
    m = dumps()[LIGHTNING[0]]["model"]
    experts = m["num_moe_experts"] * 2 * m["hidden_size"] * m["moe_ffn_hidden_size"]
    ep = m["expert_model_parallel_size"]
    # the second layer on this GPU: its non-expert part whole (TP 1), its experts over EP
    assert p.params - s.params == pytest.approx(mtp - experts + experts / ep, abs=2)
    assert p.expert_params - s.expert_params == pytest.approx(experts / ep, abs=2)
    assert s.mtp_activations_gib == pytest.approx(2 * o.mtp_activations_gib)
    assert separate.total_params - shared.total_params == mtp


def test_mtp_parts_after_the_separator_read_as_the_override() -> None:
    base = _dump()
    pattern = base["model"]["hybrid_layer_pattern"]
    spelled = estimate_memory(load_config(data=_dump(
        hybrid_layer_pattern=pattern + "/*E/*E", mtp_hybrid_override_pattern=None)))
    override = estimate_memory(load_config(data=base))
    assert spelled.per_stage[-1].params == override.per_stage[-1].params
    assert spelled.per_stage[-1].mtp_layers == 2


@pytest.mark.parametrize(("model", "field", "words"), [
    ({"hybrid_layer_pattern": "MEM*E/*E/*-", "mtp_hybrid_override_pattern": None,
      "num_layers": 5}, "model.hybrid_layer_pattern", "same layers"),
    ({"hybrid_layer_pattern": "MEM*E/*E", "mtp_hybrid_override_pattern": None,
      "mtp_use_repeated_layer": False, "num_layers": 5}, "model.mtp_num_layers",
     "set model.mtp_num_layers=1"),
    ({"mtp_hybrid_override_pattern": "*X"}, "model.mtp_hybrid_override_pattern", "'X'"),
    ({"hybrid_layer_pattern": "MEM|*E", "num_layers": 5}, "model.hybrid_layer_pattern",
     "pipeline_model_parallel_layout"),
])
def test_bad_hybrid_mtp_patterns_are_one_error_naming_the_field(model: dict[str, Any],
                                                                 field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        estimate_memory(load_config(data=_dump(**model)))
    assert err.value.field == field and words in err.value.problem


def test_hybrid_mtp_num_layers_without_an_mtp_pattern_builds_none() -> None:
    cfg = load_config(data=_dump(mtp_hybrid_override_pattern=None))
    report = estimate_memory(cfg)
    last = report.per_stage[-1]
    assert last.mtp_layers == 0 and last.mtp_activations_gib == 0
    assert count_params(cfg.model).mtp == 0


def test_gpt_mtp_repeated_layer_counts_one_layer() -> None:
    over = ["model.mtp_num_layers=2", "model.pipeline_model_parallel_size=1",
            "model.virtual_pipeline_model_parallel_size=null",
            "model.pipeline_model_parallel_layout=null"]
    two = count_params(load_config(preset="deepseek-v3", overrides=over).model)
    rep = count_params(load_config(preset="deepseek-v3", overrides=[
        *over, "+model.mtp_use_repeated_layer=true"]).model)
    assert len(two.mtp_layers) == 2 and len(rep.mtp_layers) == 1
    assert two.mtp == 2 * rep.mtp
