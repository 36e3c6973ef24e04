"""Read a Hugging Face `config.json` into Megatron Bridge `model`-section fields.

Why: users often have only the HF checkpoint's config. The mapping mirrors what Bridge's
model bridges do when they build a provider from a checkpoint, for the families this project
has presets for. Only the file's own values are used; a family's fixed traits (RMSNorm,
SwiGLU, QK norm) come from the family. Anything the file says that Megatron-Core cannot
represent raises a ValueError naming the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

# model_type -> family; architectures (class names) -> family, as a fallback
MODEL_TYPES = {
    "llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
    "qwen3_next": "qwen3_next", "mixtral": "mixtral", "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v3", "gpt_oss": "gpt_oss", "nemotron_h": "nemotron_h",
}
ARCHITECTURES = {
    "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "Qwen3NextForCausalLM": "qwen3_next",
    "MixtralForCausalLM": "mixtral", "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3", "GptOssForCausalLM": "gpt_oss",
    "NemotronHForCausalLM": "nemotron_h",
}
# HF hybrid-block names (newer Nemotron configs list layers instead of a pattern string)
_HYBRID_BLOCKS = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def detect_family(data: Mapping[str, Any]) -> str:
    """The model family of a config.json, from `model_type`, else `architectures`."""
    model_type = data.get("model_type")
    if model_type in MODEL_TYPES:
        return MODEL_TYPES[model_type]
    for arch in data.get("architectures") or ():
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise ValueError(
        f"unsupported Hugging Face config: model_type={model_type!r}, "
        f"architectures={data.get('architectures')!r}; supported model_type values: "
        f"{', '.join(sorted(MODEL_TYPES))}")


def _req(data: Mapping[str, Any], key: str, family: str) -> Any:
    if data.get(key) is None:
        raise ValueError(f"config.json ({family}) lacks {key!r}")
    return data[key]


def _num(value: Any) -> Any:
    """Whole floats (500000.0) as ints, so presets and converted configs compare equal."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _rope(data: Mapping[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(rope_theta, rope scaling dict) from either the v4 or the v5 (`rope_parameters`) layout."""
    params = data.get("rope_parameters") or {}
    theta = data.get("rope_theta", params.get("rope_theta"))
    scaling = data.get("rope_scaling")
    if scaling is None and params.get("rope_type") not in (None, "default"):
        scaling = params
    return _num(theta), scaling


def _scaling_type(scaling: Mapping[str, Any]) -> str | None:
    return scaling.get("rope_type") or scaling.get("type")


def _silu(data: Mapping[str, Any], family: str) -> None:
    act = data.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"config.json ({family}) hidden_act={act!r}; this family maps to "
                         "SwiGLU (silu) only")


def _base(data: Mapping[str, Any], family: str) -> dict[str, Any]:
    """Fields shared by the decoder-only RMSNorm + SwiGLU + RoPE families."""
    _silu(data, family)
    h = _req(data, "hidden_size", family)
    heads = _req(data, "num_attention_heads", family)
    theta, scaling = _rope(data)
    out: dict[str, Any] = {
        "num_layers": _req(data, "num_hidden_layers", family),
        "hidden_size": h,
        "ffn_hidden_size": _req(data, "intermediate_size", family),
        "num_attention_heads": heads,
        "num_query_groups": data.get("num_key_value_heads") or heads,
        "kv_channels": data.get("head_dim") or h // heads,
        "vocab_size": _req(data, "vocab_size", family),
        "share_embeddings_and_output_weights": bool(data.get("tie_word_embeddings", False)),
        "gated_linear_unit": True,
        "activation_func": "silu",
        "normalization": "RMSNorm",
        "layernorm_epsilon": _req(data, "rms_norm_eps", family),
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "qk_layernorm": False,
        "position_embedding_type": "rope",
        "rotary_base": theta,
        "max_position_embeddings": data.get("max_position_embeddings"),
    }
    if scaling is not None:
        kind = _scaling_type(scaling)
        if kind == "llama3":
            out["rope_scaling"] = True
            out["rope_scaling_factor"] = float(scaling["factor"])
        elif family not in ("deepseek_v2", "deepseek_v3", "gpt_oss"):
            raise ValueError(f"config.json ({family}) rope_scaling type {kind!r} is not mapped")
    if data.get("sliding_window") is not None and data.get("use_sliding_window", True):
        if family in ("mixtral", "gpt_oss"):
            out["window_size"] = [data["sliding_window"], 0]
        elif family.startswith("qwen") and data.get("use_sliding_window"):
            raise ValueError(f"config.json ({family}) use_sliding_window is not mapped")
    return {k: v for k, v in out.items() if v is not None}


def _llama(data: Mapping[str, Any]) -> dict[str, Any]:
    out = _base(data, "llama")
    if data.get("attention_bias") or data.get("mlp_bias"):
        raise ValueError("config.json (llama) attention_bias/mlp_bias=true: Megatron-Core has no "
                         "Llama layout with these biases")
    return out


def _qwen2(data: Mapping[str, Any]) -> dict[str, Any]:
    out = _base(data, "qwen2")
    out["add_qkv_bias"] = True  # Qwen2 q/k/v projections always carry a bias
    return out


def _qwen3(data: Mapping[str, Any], family: str = "qwen3") -> dict[str, Any]:
    out = _base(data, family)
    out["add_qkv_bias"] = bool(data.get("attention_bias", False))
    out["qk_layernorm"] = True
    return out


def _qwen_moe_freq(data: Mapping[str, Any], n: int, family: str) -> int | list[int]:
    """HF: layer i is MoE unless listed in mlp_only_layers and when (i+1) % step == 0."""
    step = int(data.get("decoder_sparse_step", 1) or 1)
    dense = set(data.get("mlp_only_layers") or ())
    if step == 1 and not dense:
        return 1
    if step < 1:
        raise ValueError(f"config.json ({family}) decoder_sparse_step={step}")
    return [0 if i in dense or (i + 1) % step else 1 for i in range(n)]


def _qwen3_moe(data: Mapping[str, Any], family: str = "qwen3_moe") -> dict[str, Any]:
    out = _qwen3(data, family)
    out["num_moe_experts"] = _req(data, "num_experts", family)
    out["moe_router_topk"] = _req(data, "num_experts_per_tok", family)
    out["moe_ffn_hidden_size"] = _req(data, "moe_intermediate_size", family)
    out["moe_layer_freq"] = _qwen_moe_freq(data, out["num_layers"], family)
    return out


def _period(pattern: list[int]) -> int | None:
    """N when the pattern is N-1 ones then a zero, repeated (Megatron's int frequency form)."""
    for n in range(1, len(pattern) + 1):
        if pattern == [0 if (i + 1) % n == 0 else 1 for i in range(len(pattern))]:
            return n
    return None


def _qwen3_next(data: Mapping[str, Any]) -> dict[str, Any]:
    family = "qwen3_next"
    out = _qwen3_moe(data, family)
    n = out["num_layers"]
    types = data.get("layer_types")
    if types is not None:
        if len(types) != n:
            raise ValueError(f"config.json ({family}) layer_types has {len(types)} entries, "
                             f"num_hidden_layers is {n}")
        pattern = [1 if t == "linear_attention" else 0 for t in types]
        freq: int | list[int] = _period(pattern) or pattern
    else:
        freq = int(_req(data, "full_attention_interval", family))
    params = data.get("rope_parameters") or {}
    out.update({
        "layernorm_zero_centered_gamma": True,
        "attention_output_gate": True,
        "rotary_percent": _num(data.get("partial_rotary_factor",
                                        params.get("partial_rotary_factor", 1.0))),
        "experimental_attention_variant": "gated_delta_net",
        "linear_attention_freq": freq,
        "linear_conv_kernel_dim": _req(data, "linear_conv_kernel_dim", family),
        "linear_key_head_dim": _req(data, "linear_key_head_dim", family),
        "linear_value_head_dim": _req(data, "linear_value_head_dim", family),
        "linear_num_key_heads": _req(data, "linear_num_key_heads", family),
        "linear_num_value_heads": _req(data, "linear_num_value_heads", family),
    })
    shared = data.get("shared_expert_intermediate_size")
    if shared:
        out["moe_shared_expert_intermediate_size"] = shared
        out["moe_shared_expert_gate"] = True
    return out


def _mixtral(data: Mapping[str, Any]) -> dict[str, Any]:
    out = _base(data, "mixtral")
    out["num_moe_experts"] = _req(data, "num_local_experts", "mixtral")
    out["moe_router_topk"] = _req(data, "num_experts_per_tok", "mixtral")
    out["moe_ffn_hidden_size"] = out["ffn_hidden_size"]
    out["moe_layer_freq"] = 1
    return out


def _deepseek(data: Mapping[str, Any], family: str) -> dict[str, Any]:
    out = _base(data, family)
    # MLA has its own head shapes; GQA fields do not apply.
    del out["num_query_groups"], out["kv_channels"]
    if data.get("attention_bias"):
        raise ValueError(f"config.json ({family}) attention_bias=true is not mapped for MLA")
    n = out["num_layers"]
    first_dense = int(data.get("first_k_dense_replace", 0) or 0)
    freq = int(data.get("moe_layer_freq", 1) or 1)
    shared = int(data.get("n_shared_experts") or 0)
    moe_width = _req(data, "moe_intermediate_size", family)
    scaling = _rope(data)[1]
    out.update({
        "qk_layernorm": True,  # the latent q/kv norms
        "rotary_scaling_factor": _num(scaling["factor"]) if scaling else 1.0,
        "multi_latent_attention": True,
        "q_lora_rank": data.get("q_lora_rank"),
        "kv_lora_rank": _req(data, "kv_lora_rank", family),
        "qk_head_dim": _req(data, "qk_nope_head_dim", family),
        "qk_pos_emb_head_dim": _req(data, "qk_rope_head_dim", family),
        "v_head_dim": _req(data, "v_head_dim", family),
        "num_moe_experts": _req(data, "n_routed_experts", family),
        "moe_router_topk": _req(data, "num_experts_per_tok", family),
        "moe_ffn_hidden_size": moe_width,
        "moe_layer_freq": [1 if i >= first_dense and i % freq == 0 else 0 for i in range(n)],
        "moe_router_score_function": data.get("scoring_func", "softmax"),
        "moe_router_enable_expert_bias": data.get("topk_method") == "noaux_tc",
        "moe_router_num_groups": data.get("n_group"),
        "moe_router_group_topk": data.get("topk_group"),
        "moe_router_topk_scaling_factor": _num(data.get("routed_scaling_factor")),
    })
    if shared:
        out["moe_shared_expert_intermediate_size"] = shared * moe_width
    mtp = int(data.get("num_nextn_predict_layers") or 0)
    if mtp:
        out["mtp_num_layers"] = mtp
    return {k: v for k, v in out.items() if v is not None or k == "q_lora_rank"}


def _gpt_oss(data: Mapping[str, Any]) -> dict[str, Any]:
    family = "gpt_oss"
    out = _base(data, family)
    n = out["num_layers"]
    types = data.get("layer_types")
    if types is None:  # the HF default alternates, sliding first
        types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    swa = [1 if t == "sliding_attention" else 0 for t in types]
    scaling = _rope(data)[1] or {}
    if scaling and _scaling_type(scaling) != "yarn":
        raise ValueError(f"config.json ({family}) rope_scaling type "
                         f"{_scaling_type(scaling)!r} is not mapped")
    bias = bool(data.get("attention_bias", True))
    out.update({
        # x * sigmoid(1.702 x) on the clamped gate, times (up + 1)
        "activation_func": "quick_gelu",
        "glu_linear_offset": 1.0,
        "activation_func_clamp_value": _num(data.get("swiglu_limit", 7.0)) * 1.0,
        "add_bias_linear": bias,
        "add_qkv_bias": bias,
        "softmax_type": "learnable",
        "window_attn_skip_freq": _period(swa) or swa,
        "position_embedding_type": "yarn",
        "num_moe_experts": _req(data, "num_local_experts", family),
        "moe_router_topk": data.get("num_experts_per_tok") or _req(data, "experts_per_token",
                                                                   family),
        "moe_ffn_hidden_size": out["ffn_hidden_size"],
        "moe_layer_freq": 1,
    })
    if scaling:
        out["yarn_rotary_scaling_factor"] = float(scaling["factor"])
        out["yarn_original_max_position_embeddings"] = scaling[
            "original_max_position_embeddings"]
    return out


def _nemotron_h(data: Mapping[str, Any]) -> dict[str, Any]:
    family = "nemotron_h"
    pattern = data.get("hybrid_override_pattern")
    if pattern is None and data.get("layers_block_type"):
        pattern = "".join(_HYBRID_BLOCKS[b] for b in data["layers_block_type"])
    pattern = _req({"hybrid_override_pattern": pattern}, "hybrid_override_pattern", family)
    n = _req(data, "num_hidden_layers", family)
    if len(pattern) != n:
        raise ValueError(f"config.json ({family}) pattern has {len(pattern)} layers, "
                         f"num_hidden_layers is {n}")
    if data.get("conv_kernel", 4) != 4:
        raise ValueError(f"config.json ({family}) conv_kernel={data['conv_kernel']}: Megatron-"
                         "Core's MambaMixer is built with kernel 4")
    if not data.get("use_conv_bias", True) or data.get("use_bias") or data.get("mlp_bias"):
        raise ValueError(f"config.json ({family}) use_conv_bias/use_bias/mlp_bias differ from "
                         "Megatron-Core's Mamba stack (conv bias on, linear biases off)")
    act = data.get("mlp_hidden_act", "relu2")
    if act != "relu2":
        raise ValueError(f"config.json ({family}) mlp_hidden_act={act!r}; only relu2 is mapped")
    h = _req(data, "hidden_size", family)
    heads = _req(data, "num_attention_heads", family)
    out: dict[str, Any] = {
        "num_layers": n,
        "hybrid_override_pattern": pattern,
        "is_hybrid_model": True,
        "hidden_size": h,
        "ffn_hidden_size": _req(data, "intermediate_size", family),
        "num_attention_heads": heads,
        "num_query_groups": data.get("num_key_value_heads") or heads,
        "kv_channels": data.get("head_dim") or data.get("attention_head_dim") or h // heads,
        "mamba_num_heads": _req(data, "mamba_num_heads", family),
        "mamba_head_dim": _req(data, "mamba_head_dim", family),
        "mamba_state_dim": _req(data, "ssm_state_size", family),
        "mamba_num_groups": _req(data, "n_groups", family),
        "vocab_size": _req(data, "vocab_size", family),
        "share_embeddings_and_output_weights": bool(data.get("tie_word_embeddings", False)),
        "gated_linear_unit": False,
        "activation_func": "squared_relu",
        "normalization": "RMSNorm",
        "layernorm_epsilon": data.get("rms_norm_eps", data.get("layer_norm_epsilon")),
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "qk_layernorm": False,
        "position_embedding_type": "none",
    }
    if "E" in pattern:
        out.update({
            "num_moe_experts": _req(data, "n_routed_experts", family),
            "moe_router_topk": _req(data, "num_experts_per_tok", family),
            "moe_ffn_hidden_size": _req(data, "moe_intermediate_size", family),
        })
        shared = data.get("moe_shared_expert_intermediate_size")
        if shared:
            out["moe_shared_expert_intermediate_size"] = shared
    return {k: v for k, v in out.items() if v is not None}


_READERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "llama": _llama, "qwen2": _qwen2, "qwen3": _qwen3, "qwen3_moe": _qwen3_moe,
    "qwen3_next": _qwen3_next, "mixtral": _mixtral,
    "deepseek_v2": lambda d: _deepseek(d, "deepseek_v2"),
    "deepseek_v3": lambda d: _deepseek(d, "deepseek_v3"),
    "gpt_oss": _gpt_oss, "nemotron_h": _nemotron_h,
}


def model_fields_from_hf(data: Mapping[str, Any]) -> dict[str, Any]:
    """Bridge `model`-section fields for a Hugging Face config.json (as a dict).

    A multimodal wrapper's `text_config` is not unwrapped: pass the text model's config.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"expected a config.json object, got {type(data).__name__}")
    fields = _READERS[detect_family(data)](data)
    # These checkpoints train without dropout (HF attention_dropout 0.0; Megatron Bridge's
    # providers set both to 0), unlike Megatron-Core's default of 0.1.
    return {"attention_dropout": float(data.get("attention_dropout") or 0.0),
            "hidden_dropout": 0.0, **fields}
