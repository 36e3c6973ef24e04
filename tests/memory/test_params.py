"""Parameter counts: every preset against its published figure, and the pieces a per-stage
estimator relies on (layer-by-index sums, MoE placement, vocabulary padding, MTP)."""

from __future__ import annotations

import pytest

from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.presets import Preset, load_presets
from mbridge_perf.memory.params import (
    ParamCount,
    count_params,
    layer_kinds,
    layer_params,
    mtp_layer_params,
    padded_vocab_size,
)

PRESETS = load_presets()


def _excluded(count: ParamCount, parts: tuple[str, ...], *, active: bool) -> int:
    """What a published figure leaves out of our count, by the preset's own declaration."""
    out = 0
    if "mtp" in parts:
        out += count.mtp_active if active else count.mtp
    if "input_embedding" in parts:
        out += count.embedding
    if "output_layer" in parts:
        out += count.output_layer
    return out


def _report(name: str, what: str, ours: int, published_b: float, source: str) -> str:
    err = 100 * (ours / 1e9 / published_b - 1)
    return (f"{name}: {what} {ours / 1e9:.3f}B vs published {published_b}B "
            f"({err:+.2f} %), published in: {source}")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_total_matches_published_count(name: str) -> None:
    preset = PRESETS[name]
    count = count_params(preset.model, pad_vocab=False)
    ours = count.total - _excluded(count, preset.published_params_excludes, active=False)
    assert ours == pytest.approx(preset.published_params_b * 1e9, rel=0.01), _report(
        name, "total", ours, preset.published_params_b, preset.published_params_source)


@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if p.active_params_b))
def test_moe_preset_active_matches_published_count(name: str) -> None:
    preset = PRESETS[name]
    assert preset.active_params_b is not None
    count = count_params(preset.model, pad_vocab=False)
    ours = count.active - _excluded(count, preset.active_params_excludes, active=True)
    assert ours == pytest.approx(preset.active_params_b * 1e9, rel=0.03), _report(
        name, "active", ours, preset.active_params_b, preset.active_params_source or "")


def test_every_moe_preset_states_an_active_count() -> None:
    missing = [n for n, p in PRESETS.items()
               if p.model.get("num_moe_experts") and p.active_params_b is None]
    assert not missing


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_is_a_valid_model_section(name: str) -> None:
    preset: Preset = PRESETS[name]
    config = TrainingConfig.model_validate({"model": preset.model})
    assert config.model.num_layers == preset.model["num_layers"]


def test_exact_counts_of_known_checkpoints() -> None:
    """Safetensors totals of the HF checkpoints, to the parameter."""
    assert count_params(PRESETS["llama3-8b"].model, pad_vocab=False).total == 8_030_261_248
    # Qwen3-Next-80B-A3B main model (MTP layer not included), GatedDeltaNet + gated attention
    assert count_params(PRESETS["qwen3-next-80b-a3b"].model,
                        pad_vocab=False).total == 79_674_391_296
    # Nemotron-H 8B: Mamba-2 / attention / MLP hybrid
    assert count_params(PRESETS["nemotron-h-8b"].model, pad_vocab=False).total == 8_100_852_736


def test_bridge_golden_dense_vector() -> None:
    """Bridge estimator unit-test fixture (L4 h16 f64 a4 V32, tied, LayerNorm): 13,088."""
    model = dict(num_layers=4, hidden_size=16, ffn_hidden_size=64, num_attention_heads=4,
                 num_query_groups=4, kv_channels=4, vocab_size=32,
                 make_vocab_size_divisible_by=1, share_embeddings_and_output_weights=True,
                 add_bias_linear=False, position_embedding_type="rope")
    count = count_params(model, pad_vocab=False)
    assert count.layers[0].attention == 1024
    assert count.layers[0].norms == 64
    assert count.layers[0].dense_mlp == 2048
    assert count.final_norm == 32
    assert count.total == 13_088


def test_layers_by_index_sum_to_the_total() -> None:
    model = PRESETS["deepseek-v3"].model
    count = count_params(model, pad_vocab=False)
    layers = sum(layer_params(model, i).total for i in range(model["num_layers"]))
    mtp = mtp_layer_params(model, 0)
    assert count.embedding + layers + count.final_norm + count.output_layer + mtp.total == (
        count.total)
    kinds = count.by_kind()
    assert (kinds["num_dense_layers"], kinds["num_moe_layers"]) == (3, 58)
    assert kinds["dense_layers"] + kinds["moe_layers"] == count.decoder


def test_deepseek_v3_mla_layer_and_mtp_shape() -> None:
    model = PRESETS["deepseek-v3"].model
    first = layer_params(model, 0)
    assert (first.mixer, first.mlp) == ("mla", "dense")
    assert 186e6 < first.attention < 188e6  # ~187 M per MLA layer (reference check)
    moe = layer_params(model, 3)
    assert moe.mlp == "moe" and moe.routed_experts == 256 * moe.routed_per_expert
    assert moe.routed_per_expert == 3 * 7168 * 2048
    assert moe.shared_experts == 3 * 7168 * 2048 and moe.router == 7168 * 256
    assert moe.active == moe.total - moe.routed_experts + 8 * moe.routed_per_expert
    mtp = mtp_layer_params(model, 0)
    assert mtp.layer.mlp == "moe" and mtp.projection == 2 * 7168 * 7168
    assert mtp.norms == 3 * 7168


def test_moe_layer_freq_int_and_list() -> None:
    base = dict(num_layers=6, hidden_size=64, num_attention_heads=4, vocab_size=128,
                num_moe_experts=4, moe_ffn_hidden_size=32)
    every_third = layer_kinds({**base, "moe_layer_freq": 3})
    assert [k.mlp for k in every_third] == ["moe", "dense", "dense", "moe", "dense", "dense"]
    listed = layer_kinds({**base, "moe_layer_freq": [0, 0, 1, 1, 0, 1]})
    assert [k.mlp for k in listed] == ["dense", "dense", "moe", "moe", "dense", "moe"]
    with pytest.raises(ValueError, match="moe_layer_freq has 3 entries, expected 6"):
        layer_kinds({**base, "moe_layer_freq": [0, 1, 1]})


def test_qwen3_next_layer_pattern() -> None:
    kinds = layer_kinds(PRESETS["qwen3-next-80b-a3b"].model)
    assert [k.mixer for k in kinds[:8]] == ["gdn", "gdn", "gdn", "attention"] * 2
    assert all(k.mlp == "moe" for k in kinds)


def test_vocab_padding_follows_divisor_times_tp() -> None:
    assert padded_vocab_size(128256, 128, 8) == 129024
    assert padded_vocab_size(128256, 128, 1) == 128256
    model = PRESETS["llama3-8b"].model
    padded = count_params(model, pad_vocab=True, tp=8)
    plain = count_params(model, pad_vocab=False)
    assert padded.vocab_size == 129024
    assert padded.total - plain.total == 2 * (129024 - 128256) * 4096  # embedding + output
    # Bridge's own switch decides when no flag is given
    assert count_params({**model, "should_pad_vocab": False}, tp=8).total == plain.total
    assert count_params({**model, "tensor_model_parallel_size": 8}).total == padded.total


def test_tied_embeddings_have_no_output_layer() -> None:
    model = {**PRESETS["qwen3-8b"].model, "share_embeddings_and_output_weights": True}
    count = count_params(model, pad_vocab=False)
    assert count.output_layer == 0
    assert count.total == count_params(PRESETS["qwen3-8b"].model,
                                       pad_vocab=False).total - 151936 * 4096


def test_tp_replicated_share_of_a_dense_model() -> None:
    count = count_params(PRESETS["llama3-8b"].model, pad_vocab=False)
    assert count.tp_replicated == 32 * 2 * 4096 + 4096  # two RMSNorms per layer + final norm


def test_accepts_a_model_section_and_names_missing_fields() -> None:
    section = ModelSection.model_validate(PRESETS["mixtral-8x7b"].model)
    assert count_params(section, pad_vocab=False).total == count_params(
        PRESETS["mixtral-8x7b"].model, pad_vocab=False).total
    with pytest.raises(ValueError, match=r"model\.hidden_size is required"):
        count_params({"num_layers": 2, "num_attention_heads": 4, "vocab_size": 10})
    with pytest.raises(ValueError, match="layer_index 99 out of range"):
        layer_params(PRESETS["llama3-8b"].model, 99)
