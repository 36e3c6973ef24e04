"""Ground truth: params.py against real Megatron-Core GPT models built on CPU.

Each case builds a `GPTModel` with the local (no Transformer Engine) layer specs in a one-rank
gloo group and compares `sum(p.numel())` with `count_params` exactly: in total, per decoder
layer, for the embedding, output layer and MTP layers, and for the TP-replicated share (the
parameters Megatron-Core leaves unmarked by `tensor_model_parallel`).

Documented local-spec difference: the local MLA spec builds the q/kv down-projections as
column-parallel, the Transformer Engine spec (what training uses, and what params.py follows)
as duplicated linears; the replicated-share comparison moves them across for MLA cases.
Attention sinks (`softmax_offset`, one per local head) are split with the heads but carry no
`tensor_model_parallel` mark, so they are left out of that comparison.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from mbridge_perf.memory.params import count_params, vocab_rows

from helpers import require_megatron

require_megatron()
import torch  # noqa: E402
from mcore_activations import one_rank_gloo  # noqa: E402

# name -> model-section fields (small shapes; every case exercises a different piece)
CASES: dict[str, dict[str, Any]] = {
    "dense-gqa-swiglu-rmsnorm-untied": dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=160, num_attention_heads=8,
        num_query_groups=2, vocab_size=1000, make_vocab_size_divisible_by=128,
        normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
        position_embedding_type="rope"),
    "dense-gqa-qkv-bias-qk-layernorm": dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        num_query_groups=2, kv_channels=24, vocab_size=300, make_vocab_size_divisible_by=64,
        normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
        add_qkv_bias=True, qk_layernorm=True, position_embedding_type="rope"),
    "gpt2-layernorm-bias-learned-pos-tied": dict(
        num_layers=2, hidden_size=48, num_attention_heads=4, vocab_size=500,
        make_vocab_size_divisible_by=8, normalization="LayerNorm", add_bias_linear=True,
        qk_layernorm=True, share_embeddings_and_output_weights=True,
        position_embedding_type="learned_absolute", seq_length=32),
    "moe-shared-gate-freq-list": dict(
        num_layers=4, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
        vocab_size=256, make_vocab_size_divisible_by=128, normalization="RMSNorm",
        gated_linear_unit=True, add_bias_linear=False, position_embedding_type="rope",
        num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32,
        moe_layer_freq=[0, 1, 0, 1], moe_shared_expert_intermediate_size=48,
        moe_shared_expert_gate=True),
    "moe-bias-every-2nd-layer": dict(
        num_layers=4, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
        num_query_groups=4, vocab_size=256, make_vocab_size_divisible_by=128,
        normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=True,
        position_embedding_type="rope", num_moe_experts=8, moe_router_topk=2,
        moe_ffn_hidden_size=16, moe_layer_freq=2),
    "mla-qlora-moe-mtp": dict(
        num_layers=3, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        vocab_size=200, make_vocab_size_divisible_by=128, normalization="RMSNorm",
        gated_linear_unit=True, add_bias_linear=False, qk_layernorm=True,
        position_embedding_type="rope", multi_latent_attention=True, q_lora_rank=32,
        kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=12,
        num_moe_experts=4, moe_router_topk=2, moe_ffn_hidden_size=32, moe_layer_freq=[0, 1, 1],
        moe_shared_expert_intermediate_size=32, mtp_num_layers=1),
    "mla-no-qlora-bias": dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=4,
        vocab_size=200, make_vocab_size_divisible_by=128, normalization="RMSNorm",
        gated_linear_unit=True, add_bias_linear=True, qk_layernorm=True,
        position_embedding_type="rope", multi_latent_attention=True, q_lora_rank=None,
        kv_lora_rank=16, qk_head_dim=8, qk_pos_emb_head_dim=4, v_head_dim=8),
    "gated-attention-sinks-mtp": dict(
        num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4,
        num_query_groups=2, kv_channels=32, vocab_size=128, make_vocab_size_divisible_by=128,
        normalization="RMSNorm", gated_linear_unit=True, add_bias_linear=False,
        qk_layernorm=True, attention_output_gate=True, softmax_type="learnable",
        position_embedding_type="rope", mtp_num_layers=1),
}

TC_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "normalization", "add_bias_linear", "add_qkv_bias", "gated_linear_unit",
    "qk_layernorm", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_layer_freq", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
    "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
    "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers", "attention_output_gate",
    "softmax_type",
)


@pytest.fixture(scope="module")
def mcore() -> Iterator[dict[str, Any]]:
    """A one-rank gloo group with the CPU shims of the ground-truth recipe, undone afterwards."""
    from megatron.core.transformer import multi_latent_attention

    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # Without TE the MLA module's isinstance checks hit a mock; plain classes suffice.
        for name in ("TELinear", "TEColumnParallelLinear", "TELayerNormColumnParallelLinear"):
            mp.setattr(multi_latent_attention, name, type(name, (), {}), raising=False)
        with one_rank_gloo(mp):
            yield {"torch": torch}


class _CoreAttention(torch.nn.Module):
    """Parameter-free stand-in: the local DotProductAttention rejects MLA's k/v channels."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


def _build(fields: dict[str, Any]) -> Any:
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_decoder_block_spec,
        get_gpt_mtp_block_spec,
    )
    from megatron.core.transformer.transformer_config import (
        MLATransformerConfig,
        TransformerConfig,
    )

    kwargs = {k: fields[k] for k in TC_FIELDS if k in fields}
    kwargs["activation_func"] = F.silu if fields.get("gated_linear_unit") else F.gelu
    if fields.get("num_moe_experts"):
        kwargs["moe_token_dispatcher_type"] = "allgather"
    config_cls = MLATransformerConfig if fields.get("multi_latent_attention") else (
        TransformerConfig)
    config = config_cls(
        **kwargs, use_cpu_initialization=True, params_dtype=torch.float32,
        gradient_accumulation_fusion=False, bias_dropout_fusion=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, apply_rope_fusion=False,
        persist_layer_norm=False, transformer_impl="local")
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                      normalization=config.normalization)
    if fields.get("multi_latent_attention"):
        for layer_spec in spec.layer_specs:
            layer_spec.submodules.self_attention.submodules.core_attention = _CoreAttention
    mtp_spec = None
    if fields.get("mtp_num_layers"):
        mtp_spec = get_gpt_mtp_block_spec(config, spec, use_transformer_engine=False)
    return GPTModel(
        config, spec, vocab_size=vocab_rows(fields, pad_vocab=True, tp=1),
        max_sequence_length=fields.get("seq_length") or 64,
        position_embedding_type=fields["position_embedding_type"],
        share_embeddings_and_output_weights=fields.get(
            "share_embeddings_and_output_weights", False),
        mtp_block_spec=mtp_spec)


def _numel(model: Any, prefix: str) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if n.startswith(prefix))


@pytest.mark.parametrize("case", sorted(CASES))
def test_count_matches_megatron_core(mcore: dict[str, Any], case: str) -> None:
    fields = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _build(fields)
    ours = count_params(fields, pad_vocab=True, tp=1)

    real_total = sum(p.numel() for p in model.parameters())
    assert ours.total == real_total, f"{case}: params.py {ours.total:,} != MCore {real_total:,}"
    for i, layer in enumerate(ours.layers):
        real = _numel(model, f"decoder.layers.{i}.")
        assert layer.total == real, f"{case}: layer {i} ({layer.mixer}/{layer.mlp}) " \
                                    f"{layer.total:,} != {real:,}"
    assert ours.embedding == _numel(model, "embedding.")
    assert ours.output_layer == _numel(model, "output_layer.")
    assert ours.final_norm == _numel(model, "decoder.final_layernorm.")
    assert ours.mtp == _numel(model, "mtp.")

    replicated = sum(p.numel() for n, p in model.named_parameters()
                     if not getattr(p, "tensor_model_parallel", False)
                     and ".experts." not in n and not n.endswith("softmax_offset"))
    if fields.get("multi_latent_attention"):
        h = fields["hidden_size"]
        down = h * (fields["kv_lora_rank"] + fields["qk_pos_emb_head_dim"])
        if fields.get("q_lora_rank"):
            down += h * fields["q_lora_rank"]
        replicated += down * (fields["num_layers"] + (fields.get("mtp_num_layers") or 0))
    assert ours.tp_replicated == replicated, f"{case}: replicated {ours.tp_replicated:,} " \
                                             f"!= {replicated:,}"
