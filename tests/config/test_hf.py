"""Hugging Face config.json reader: real configs map to the presets' fields and counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mbridge_perf.config.hf import detect_family, model_fields_from_hf
from mbridge_perf.config.presets import load_presets
from mbridge_perf.memory.params import count_params

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
PRESETS = load_presets()
# Bridge provider values that config.json does not state
NOT_IN_HF = {"make_vocab_size_divisible_by"}
# fixtures without a preset: published total in billions (HF model cards)
PUBLISHED = {"qwen2.5-7b": 7.61, "deepseek-v2-lite": 15.7}


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


WITH_PRESET = sorted(p.stem for p in FIXTURES.glob("*.json") if p.stem in PRESETS)


def test_every_fixture_is_checked() -> None:
    names = {p.stem for p in FIXTURES.glob("*.json")}
    assert names == set(WITH_PRESET) | set(PUBLISHED)
    assert len(WITH_PRESET) >= 8


@pytest.mark.parametrize("name", WITH_PRESET)
def test_fixture_maps_to_the_preset(name: str) -> None:
    fields = model_fields_from_hf(_fixture(name))
    expected = {k: v for k, v in PRESETS[name].model.items() if k not in NOT_IN_HF}
    assert fields == expected
    assert count_params(fields, pad_vocab=False).total == count_params(
        PRESETS[name].model, pad_vocab=False).total


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_fixture_without_preset_matches_published_total(name: str) -> None:
    total = count_params(model_fields_from_hf(_fixture(name)), pad_vocab=False).total
    assert total == pytest.approx(PUBLISHED[name] * 1e9, rel=0.01)


def test_family_detection() -> None:
    assert detect_family({"model_type": "qwen3_moe"}) == "qwen3_moe"
    assert detect_family({"architectures": ["MixtralForCausalLM"]}) == "mixtral"
    qwen2 = model_fields_from_hf(_fixture("qwen2.5-7b"))
    assert qwen2["add_qkv_bias"] is True and qwen2["qk_layernorm"] is False


def test_unsupported_architecture_is_named() -> None:
    with pytest.raises(ValueError, match=r"model_type='gemma3'.*Gemma3ForCausalLM"):
        model_fields_from_hf({"model_type": "gemma3", "architectures": ["Gemma3ForCausalLM"]})


def test_missing_and_unmappable_fields_are_named() -> None:
    config = _fixture("llama3-8b")
    del config["hidden_size"]
    with pytest.raises(ValueError, match="lacks 'hidden_size'"):
        model_fields_from_hf(config)
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        model_fields_from_hf({**_fixture("llama3-8b"), "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="attention_bias"):
        model_fields_from_hf({**_fixture("llama3-8b"), "attention_bias": True})


def test_deepseek_dense_prefix_and_shared_experts() -> None:
    fields = model_fields_from_hf({**_fixture("deepseek-v3"), "first_k_dense_replace": 5})
    assert fields["moe_layer_freq"][:6] == [0, 0, 0, 0, 0, 1]
    assert fields["moe_shared_expert_intermediate_size"] == 2048
    assert fields["mtp_num_layers"] == 1


def test_qwen_moe_sparse_step_and_dense_layers() -> None:
    config = {**_fixture("qwen3-30b-a3b"), "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    freq = model_fields_from_hf(config)["moe_layer_freq"]
    assert freq[:6] == [0, 0, 0, 1, 0, 1]


def test_v5_rope_parameters_layout() -> None:
    config = _fixture("qwen3-8b")
    theta = config.pop("rope_theta")
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    assert model_fields_from_hf(config)["rotary_base"] == 1_000_000
