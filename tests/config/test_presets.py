"""Model presets: names resolve forgivingly, unknown names get a useful suggestion."""

from __future__ import annotations

import pytest
import yaml

from mbridge_perf.config.presets import get_preset, load_presets

from helpers import REPO

REQUIRED = {"llama3-8b", "llama3-70b", "llama3-405b", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b",
            "qwen3-235b-a22b", "qwen3-next-80b-a3b", "deepseek-v3", "moonlight-16b-a3b",
            "gpt-oss-120b", "mixtral-8x7b"}


def test_catalog_has_the_promised_models() -> None:
    assert set(load_presets()) >= REQUIRED


def test_lookup_is_case_insensitive() -> None:
    assert get_preset("DeepSeek-V3").name == "deepseek-v3"
    assert get_preset("  Llama3-70B ").model["num_layers"] == 80


def test_unknown_preset_suggests_the_closest_names() -> None:
    with pytest.raises(ValueError, match="Did you mean 'llama3-70b'") as err:
        get_preset("llama3-7b")
    assert "Known presets:" in str(err.value)
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'"):
        get_preset("gpt-5")


def test_every_preset_names_its_sources_and_a_sequence_length() -> None:
    for preset in load_presets().values():
        assert preset.source and preset.published_params_source
        assert preset.defaults.get("seq_length", 0) > 0
        if preset.active_params_b is not None:
            assert preset.active_params_source


def test_preset_model_is_a_plain_copyable_dict() -> None:
    model = get_preset("qwen3-30b-a3b").model
    assert isinstance(model, dict) and model["num_moe_experts"] == 128
    raw = yaml.safe_load((REPO / "server/mbridge_perf/config/presets.yaml").read_text())
    assert raw["qwen3-30b-a3b"]["model"] == model
