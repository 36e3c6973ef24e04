"""PEFT / LoRA priced as it trains: the frozen base keeps its weights only (no FP32 main copy,
no gradients, no optimizer state); the adapters (A: in x rank, B: rank x out per targeted
linear, split over TP, expert adapters over ETP) carry weights, gradients and optimizer state.
Checked on the real Bridge PEFT dumps and against independent adapter counts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from bridge_corpus import dumps, is_diffusion
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.layers import lora_spec
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory
from mbridge_perf.memory.state import adapter_shape, model_shape

LLAMA70B_FP8 = "llama3_70b_peft_8gpu_h100_fp8cs_config"
# Meta-Llama-3-70B config.json: hidden 8192, 64 heads, 8 KV heads (head dim 128), 80 layers,
# intermediate 28672; Llama-3-8B: hidden 4096, 32 heads, 8 KV heads, 32 layers, 14336
L70 = {"h": 8192, "heads": 64, "kv": 8, "d": 128, "layers": 80, "ffn": 28672}
L8 = {"h": 4096, "heads": 32, "kv": 8, "d": 128, "layers": 32, "ffn": 14336}


def _data(name: str, peft: Any = "keep", **model: Any) -> dict[str, Any]:
    data = copy.deepcopy(dumps()[name])
    if peft != "keep":
        data["peft"] = peft
    data["model"].update(model)
    return data


def _report(name: str, peft: Any = "keep", **model: Any) -> MemoryReport:
    return estimate_memory(load_config(data=_data(name, peft, **model)))


def _adapters(name: str, peft: Any = "keep") -> int:
    cfg = load_config(data=_data(name, peft))
    spec = lora_spec(cfg.carried()["peft"])
    assert spec is not None
    return adapter_shape(cfg.model, model_shape(cfg.model), spec).total


def test_llama3_70b_peft_static_is_the_frozen_weights_plus_small_adapters() -> None:
    peft, full = _report(LLAMA70B_FP8), _report(LLAMA70B_FP8, peft=None)
    assert full.peak_allocated_gib > 150  # what it was priced at before: a full fine-tune
    assert peft.peak_allocated_gib < 60
    for p, f in zip(peft.per_stage, full.per_stage, strict=True):
        # the base weights are what full training holds (FP8 params, TP2 x PP4 here) ...
        assert p.weights_gib == pytest.approx(f.weights_gib, abs=0.05)
        # ... and nothing else but the adapters' gradients and optimizer state
        assert p.grads_gib + p.optimizer_gib < 0.05
        assert p.activations_gib == pytest.approx(f.activations_gib)
    # 70.6B parameters over TP2 x PP4, ~1 byte each as FP8 params: 8-9 GiB a GPU
    assert 7.5 < max(s.static_gib for s in peft.per_stage) < 9.5
    words = " ".join(peft.assumptions)
    assert "PEFT" in words and "rank 16" in words and "linear_qkv" in words
    assert "no gradients, no optimizer state" in words


def test_adapter_count_matches_the_hf_config_arithmetic() -> None:
    # Bridge's LoRA on the fused linear_qkv: A is h x r, B is r x (q + k + v)
    r, c = 16, L70
    qkv = c["heads"] * c["d"] + 2 * c["kv"] * c["d"]
    assert _adapters(LLAMA70B_FP8) == c["layers"] * r * (c["h"] + qkv)  # 23,592,960
    # per GPU: a TP2 x PP4 stage of 20 layers holds its layers' adapters over TP
    peft, full = _report(LLAMA70B_FP8), _report(LLAMA70B_FP8, peft=None)
    stage = peft.per_stage[1]
    assert stage.params - full.per_stage[1].params == pytest.approx(
        20 * r * (c["h"] + qkv) / 2, abs=1)


def test_canonical_targets_give_hugging_face_peft_s_published_count() -> None:
    # HF PEFT prints "trainable params: 20,971,520" for Llama-3-8B with r=8 on q, k, v, o,
    # gate, up, down; Bridge's canonical target names adapt the same pieces separately
    peft = {"dim": 8, "target_modules": ["linear_q", "linear_k", "linear_v", "linear_proj",
                                         "linear_fc1_gate", "linear_fc1_up", "linear_fc2"]}
    assert _adapters("llama3_8b_peft_1gpu_h100_bf16_config", peft) == 20_971_520
    # the fused modules share one A: fewer parameters than the canonical split
    c, r = L8, 8
    fused = c["layers"] * r * (
        (c["h"] + c["heads"] * c["d"] + 2 * c["kv"] * c["d"]) + (c["heads"] * c["d"] + c["h"])
        + (c["h"] + 2 * c["ffn"]) + (c["ffn"] + c["h"]))
    assert _adapters("llama3_8b_peft_1gpu_h100_bf16_config") == fused == 17_825_792


def test_every_peft_dump_trains_only_small_adapters() -> None:
    names = [n for n in sorted(dumps()) if "_peft_" in n and not is_diffusion(n)]
    assert len(names) >= 40
    for name in names:
        report, full = _report(name), _report(name, peft=None)
        for p, f in zip(report.per_stage, full.per_stage, strict=True):
            assert p.grads_gib + p.optimizer_gib < 0.05 * (f.grads_gib + f.optimizer_gib), name
            assert p.weights_gib >= f.weights_gib, name
        assert any("PEFT" in a for a in report.assumptions), name


def test_moe_expert_adapters_are_one_set_per_ep_rank_or_one_per_expert() -> None:
    name = "gpt_oss_20b_peft_1gpu_h100_bf16_config"
    m = dumps()[name]["model"]
    experts = m["num_moe_experts"]
    shared = _report(name)
    peft = copy.deepcopy(dumps()[name]["peft"])
    peft["share_expert_adapters"] = False
    each = _report(name, peft)
    shared_n = _adapters(name)
    each_n = _adapters(name, peft)
    # one adapter pair per layer for fc1 and fc2 of the experts, or one per expert
    h, f, r, layers = m["hidden_size"], m["moe_ffn_hidden_size"], peft["dim"], m["num_layers"]
    per_set = r * (h + 2 * f) + r * (f + h)  # gated fc1 (2f out), fc2
    assert each_n - shared_n == layers * (experts - 1) * per_set
    assert each.per_stage[0].expert_params - shared.per_stage[0].expert_params == (
        pytest.approx(layers * (experts - 1) * per_set, abs=2))


def test_no_peft_section_prices_full_training() -> None:
    name = "llama3_8b_peft_1gpu_h100_bf16_config"
    full = _report(name, peft=None)
    assert full.per_stage[0].optimizer_gib > 50
    assert not any("PEFT" in a for a in full.assumptions)


@pytest.mark.parametrize(("peft", "field"), [
    ({"dim": 0}, "peft.dim"),
    ({"dim": 10**9}, "peft.dim"),
    ({"dim": "16"}, "peft.dim"),
    ({"dim": True}, "peft.dim"),
    ({"dim": 8, "target_modules": ["linear_qkv"] * 1000}, "peft.target_modules"),
    ({"dim": 8, "target_modules": ["linear qkv; rm -rf"]}, "peft.target_modules"),
    ({"dim": 8, "target_modules": "x" * 10_000}, "peft.target_modules"),
    ({"dim": 8, "target_modules": [{"a": 1}]}, "peft.target_modules"),
    ({"dim": 8, "target_modules": ["linear_qkv"], "exclude_modules": ["linear_fc2"]},
     "peft.exclude_modules"),
    ({"dim": 8, "share_expert_adapters": "yes"}, "peft.share_expert_adapters"),
    ({"dim": 8, "dropout": 2}, "peft.dropout"),
    ("prefix_tuning", "peft"),
    ([1, 2], "peft"),
])
def test_absurd_peft_sections_are_one_error_naming_the_field(peft: Any, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        _report("llama3_8b_peft_1gpu_h100_bf16_config", peft)
    assert err.value.field == field
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_targets_that_name_nothing_and_every_linear_mode_are_said() -> None:
    name = "llama3_8b_peft_1gpu_h100_bf16_config"
    report = _report(name, {"dim": 8, "target_modules": ["linear_qkv", "q_proj"]})
    words = " ".join(report.assumptions)
    assert "q_proj name no module" in words
    every = _report(name, {"dim": 8, "target_modules": [], "exclude_modules": ["output_layer"]})
    assert "every linear layer but output_layer" in " ".join(every.assumptions)
    assert _adapters(name, {"dim": 8, "target_modules": []}) == (
        17_825_792 + 8 * (L8["h"] + 128_256))  # + the untied output layer (h -> vocabulary)
    pattern = _report(name, {"dim": 8, "target_modules": ["*.layers.0.*.linear_qkv"]})
    assert "name layer indices" in " ".join(pattern.assumptions)
