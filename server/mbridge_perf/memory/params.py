"""Parameter counts from a `model` section, layer by layer, as Megatron-Core builds the model.

Why layer by layer: a per-pipeline-stage estimator sums the layers a stage owns
(`layer_params(model, i)`), adds the embedding on the first stage and the output layer, final
norm and MTP layers on the last. Why a `tp_replicated` count: norms, routers and a few
projections are held whole on every tensor-parallel rank, so per-GPU shares are not total / TP.

Shapes follow the Transformer Engine layer specs used for training. A norm fused into the next
linear (TE's LayerNormColumnParallelLinear) is counted once, where the unfused model has it.
Buffers (rotary caches, the MoE router's expert bias) are not parameters and are not counted.
Pure arithmetic: no torch or megatron import.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, computed_field

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.layers import (
    LayerKind,
    LoRASpec,
    Mixer,
    MLPKind,
    as_model,
    hybrid_mtp,
    hybrid_pattern,
    layer_kinds,
    need_field,
    num_layers,
    opt_field,
    opt_int,
)
from mbridge_perf.config.model import ModelSection

# MambaMixer's causal-conv width: a constructor default in Megatron-Core, not a config field.
MAMBA_CONV_KERNEL = 4
# Megatron-Core's MambaMixer expansion when `mamba_num_heads` is not given.
MAMBA_EXPAND = 2


def padded_vocab_size(vocab_size: int, divisible_by: int, tp: int = 1) -> int:
    """Megatron's padding: round the vocabulary up to a multiple of divisor x TP."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


class LayerParams(BaseModel):
    """Parameters of one transformer layer (a decoder layer, or the body of an MTP layer)."""

    model_config = ConfigDict(frozen=True)

    index: int
    mixer: Mixer
    mlp: MLPKind
    attention: int
    """Token mixer (attention, MLA, GatedDeltaNet or Mamba) with its biases and inner norms
    (q/k norms, MLA latent norms, GDN/Mamba output norm, attention sinks)."""
    norms: int
    """The layer's own norms: the input norm before the mixer and the pre-MLP norm."""
    dense_mlp: int
    routed_experts: int
    routed_per_expert: int
    shared_experts: int
    """Shared experts, including the shared-expert gate."""
    router: int
    topk: int
    tp_replicated: int
    """Non-expert parameters every TP rank holds whole (norms, router, row-parallel biases, MLA
    down-projections); the rest of the non-expert parameters divide by TP. Routed experts are
    a separate bucket (they divide by EP x ETP)."""

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return (self.attention + self.norms + self.dense_mlp + self.routed_experts
                + self.shared_experts + self.router)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def active(self) -> int:
        """Parameters one token passes through: the routed experts count top-k times one."""
        return self.total - self.routed_experts + self.routed_per_expert * self.topk


class MTPLayerParams(BaseModel):
    """One multi-token-prediction layer: DeepSeek-style (one transformer layer) or, in a hybrid
    Mamba model, a stack of hybrid layers spelled by the MTP pattern. The embedding and output
    layer are shared with the main model and not counted again."""

    model_config = ConfigDict(frozen=True)

    depth: int
    layer: LayerParams
    """The (first) inner layer."""
    more_layers: tuple[LayerParams, ...] = ()
    """The other inner layers of a hybrid MTP stack (e.g. the MoE layer of '*E')."""
    projection: int
    """eh_proj: concatenated [embedding, hidden] (2h) down to h, no bias."""
    norms: int
    """enorm, hnorm and the MTP layer's own final norm."""

    @property
    def inner_layers(self) -> tuple[LayerParams, ...]:
        return (self.layer, *self.more_layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return sum(x.total for x in self.inner_layers) + self.projection + self.norms

    @computed_field  # type: ignore[prop-decorator]
    @property
    def active(self) -> int:
        return sum(x.active for x in self.inner_layers) + self.projection + self.norms

    @computed_field  # type: ignore[prop-decorator]
    @property
    def routed_experts(self) -> int:
        return sum(x.routed_experts for x in self.inner_layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tp_replicated(self) -> int:
        return sum(x.tp_replicated for x in self.inner_layers) + self.norms


class ParamCount(BaseModel):
    """Global parameter count of one model (all ranks together, each parameter once)."""

    model_config = ConfigDict(frozen=True)

    vocab_size: int
    """Vocabulary rows of the embedding (padded or not, as asked)."""
    embedding: int
    """Word embeddings plus learned absolute positions (if any)."""
    position_embedding: int = 0
    """The learned absolute position part of `embedding` (replicated across TP)."""
    output_layer: int
    """Untied output projection; 0 when tied to the embedding."""
    final_norm: int
    layers: tuple[LayerParams, ...]
    mtp_layers: tuple[MTPLayerParams, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def decoder(self) -> int:
        return sum(layer.total for layer in self.layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mtp(self) -> int:
        return sum(layer.total for layer in self.mtp_layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.embedding + self.output_layer + self.final_norm + self.decoder + self.mtp

    @computed_field  # type: ignore[prop-decorator]
    @property
    def active(self) -> int:
        """Per-token parameters: everything but the routed experts a token skips. Includes the
        embedding table and MTP layers; subtract them for conventions that leave them out."""
        return (self.embedding + self.output_layer + self.final_norm
                + sum(layer.active for layer in self.layers)
                + sum(layer.active for layer in self.mtp_layers))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def mtp_active(self) -> int:
        return sum(layer.active for layer in self.mtp_layers)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def routed_experts(self) -> int:
        return (sum(layer.routed_experts for layer in self.layers)
                + sum(m.routed_experts for m in self.mtp_layers))

    @computed_field  # type: ignore[prop-decorator]
    @property
    def non_expert(self) -> int:
        """Everything outside the routed experts (sharded by TP/PP, optimizer over DP x CP)."""
        return self.total - self.routed_experts

    @computed_field  # type: ignore[prop-decorator]
    @property
    def tp_replicated(self) -> int:
        """Non-expert parameters every TP rank holds whole (see LayerParams.tp_replicated)."""
        return (self.position_embedding + self.final_norm
                + sum(layer.tp_replicated for layer in self.layers)
                + sum(layer.tp_replicated for layer in self.mtp_layers))

    def by_kind(self) -> dict[str, int]:
        """Decoder totals split the way memory reasoning needs them (MTP layers excluded)."""
        parts = ("attention", "norms", "dense_mlp", "routed_experts", "shared_experts", "router")
        out = {part: sum(getattr(layer, part) for layer in self.layers) for part in parts}
        out["dense_layers"] = sum(x.total for x in self.layers if x.mlp != "moe")
        out["moe_layers"] = sum(x.total for x in self.layers if x.mlp == "moe")
        out["num_dense_layers"] = sum(1 for x in self.layers if x.mlp == "dense")
        out["num_moe_layers"] = sum(1 for x in self.layers if x.mlp == "moe")
        return out


# ---------------------------------------------------------------------------------------------
def _norm(model: ModelSection, width: int) -> int:
    """LayerNorm has a weight and a bias, RMSNorm a weight."""
    return 2 * width if model.normalization == "LayerNorm" else width


def _heads(model: ModelSection) -> tuple[int, int, int]:
    h = int(need_field(model, "hidden_size"))
    a = int(need_field(model, "num_attention_heads"))
    g = int(model.num_query_groups or a)
    d = int(model.kv_channels or h // a)
    return a, g, d


def _attention(model: ModelSection) -> tuple[int, int]:
    """Softmax attention (MHA/GQA): (params, TP-replicated params), input norm excluded."""
    h = int(need_field(model, "hidden_size"))
    a, g, d = _heads(model)
    q_out = a * d * (2 if opt_field(model, "attention_output_gate", False) else 1)
    qkv_out = q_out + 2 * g * d
    params = h * qkv_out + a * d * h
    replicated = 0
    if model.add_bias_linear or model.add_qkv_bias:
        params += qkv_out
    if model.add_bias_linear:
        params += h
        replicated += h
    if model.qk_layernorm:
        qk = 2 * _norm(model, d)
        params += qk
        replicated += qk
    if opt_field(model, "softmax_type", "vanilla") == "learnable":
        params += a  # attention sinks: one learned logit per head, split with the heads
    return params, replicated


def _mla(model: ModelSection) -> tuple[int, int]:
    """Multi-latent attention (DeepSeek-V2/V3): (params, TP-replicated params)."""
    h = int(need_field(model, "hidden_size"))
    a = int(need_field(model, "num_attention_heads"))
    r_q, r_kv = model.q_lora_rank, model.kv_lora_rank
    d_n, d_r, d_v = model.qk_head_dim, model.qk_pos_emb_head_dim, model.v_head_dim
    q_head = a * (d_n + d_r)
    kv_down = h * (r_kv + d_r)
    params = kv_down + r_kv * a * (d_n + d_v) + a * d_v * h
    replicated = kv_down  # TE spec: the down-projections are duplicated on every TP rank
    if r_q is None:
        params += h * q_head
    else:
        params += h * r_q + r_q * q_head
        replicated += h * r_q
    if model.qk_layernorm:
        norms = _norm(model, r_kv) + (_norm(model, r_q) if r_q is not None else 0)
        params += norms
        replicated += norms
    if model.add_bias_linear:
        params += h
        replicated += h
    return params, replicated


def _gdn(model: ModelSection) -> tuple[int, int]:
    """GatedDeltaNet (Qwen3-Next linear attention): (params, TP-replicated params)."""
    h = int(need_field(model, "hidden_size"))
    kernel = opt_int(model, "linear_conv_kernel_dim", 4)
    d_k = opt_int(model, "linear_key_head_dim", 128)
    d_v = opt_int(model, "linear_value_head_dim", 128)
    n_k = opt_int(model, "linear_num_key_heads", 16)
    n_v = opt_int(model, "linear_num_value_heads", 32)
    qk, v = n_k * d_k, n_v * d_v
    in_proj = h * (2 * qk + 2 * v + 2 * n_v)  # q, k, v, output gate z, beta, alpha
    conv = (2 * qk + v) * kernel  # depthwise, no bias
    out_norm = _norm(model, d_v)  # one norm over each value head, shared by the heads
    params = in_proj + conv + 2 * n_v + out_norm + v * h  # + dt_bias, A_log; out_proj
    return params, out_norm


def _mamba_dims(model: ModelSection, h: int) -> tuple[int, int, int, int]:
    """(state, groups, heads, d_inner) of a Mamba-2 mixer with Megatron-Core's defaults."""
    head_dim = opt_int(model, "mamba_head_dim", 64)
    state = opt_int(model, "mamba_state_dim", 128)
    groups = opt_int(model, "mamba_num_groups", 8)
    heads = opt_int(model, "mamba_num_heads", None)
    d_inner = heads * head_dim if heads is not None else MAMBA_EXPAND * h
    return state, groups, heads if heads is not None else d_inner // head_dim, d_inner


def _mamba(model: ModelSection) -> tuple[int, int]:
    """Mamba-2 mixer as Megatron-Core's MambaMixer builds it: (params, TP-replicated)."""
    h = int(need_field(model, "hidden_size"))
    state, groups, heads, d_inner = _mamba_dims(model, h)
    conv_dim = d_inner + 2 * groups * state  # x, B, C
    in_proj = h * (2 * d_inner + 2 * groups * state + heads)  # z, x, B, C, dt
    conv = conv_dim * MAMBA_CONV_KERNEL + conv_dim  # depthwise weight + bias
    params = in_proj + conv + 3 * heads + d_inner + d_inner * h  # dt_bias, A_log, D; norm; out
    return params, 0


def _mlp(model: ModelSection, width: int, *, bias: bool | None = None) -> tuple[int, int]:
    """A (possibly gated) MLP of the given width: (params, TP-replicated params)."""
    h = int(need_field(model, "hidden_size"))
    fc1_out = 2 * width if model.gated_linear_unit else width
    params = h * fc1_out + width * h
    replicated = 0
    if model.add_bias_linear if bias is None else bias:
        params += fc1_out + h
        replicated += h
    return params, replicated


def _ffn_width(model: ModelSection) -> int:
    return int(model.ffn_hidden_size or 4 * int(need_field(model, "hidden_size")))


def _layer(model: ModelSection, index: int, kind: LayerKind) -> LayerParams:
    h = int(need_field(model, "hidden_size"))
    norm = _norm(model, h)
    attention = replicated = 0
    if kind.mixer != "none":
        attention, replicated = {"attention": _attention, "mla": _mla, "gdn": _gdn,
                                 "mamba": _mamba}[kind.mixer](model)
    hybrid = hybrid_pattern(model) is not None
    # A GPT layer always has an input norm and a pre-MLP norm; a hybrid (Mamba-stack) layer
    # holds one block and its one norm.
    norms = norm if hybrid else 2 * norm
    dense = routed = per_expert = shared = router = topk = 0
    if kind.mlp == "dense":
        dense, rep = _mlp(model, _ffn_width(model))
        replicated += rep
    elif kind.mlp == "moe":
        experts = int(need_field(model, "num_moe_experts"))
        width = int(model.moe_ffn_hidden_size or _ffn_width(model))
        per_expert, _ = _mlp(model, width)
        routed = experts * per_expert
        topk = int(model.moe_router_topk)
        router = h * experts + (experts if model.add_bias_linear else 0)
        replicated += router
        if model.moe_shared_expert_intermediate_size:
            # Megatron-Core's shared experts refuse biases, so none are counted.
            shared, rep = _mlp(model, int(model.moe_shared_expert_intermediate_size),
                               bias=False)
            replicated += rep
            if opt_field(model, "moe_shared_expert_gate", False):
                shared += h
                replicated += h
    replicated += norms
    return LayerParams(index=index, mixer=kind.mixer, mlp=kind.mlp, attention=attention,
                       norms=norms, dense_mlp=dense, routed_experts=routed,
                       routed_per_expert=per_expert, shared_experts=shared, router=router,
                       topk=topk, tp_replicated=replicated)


# ---------------------------------------------------------------------------------------------
# public entry points


def layer_params(model: ModelSection | Mapping[str, Any], layer_index: int) -> LayerParams:
    """Parameters of decoder layer `layer_index` (0-based), for per-stage sums."""
    m = as_model(model)
    kinds = layer_kinds(m)
    if not 0 <= layer_index < len(kinds):
        raise ValueError(f"layer_index {layer_index} out of range 0..{len(kinds) - 1}")
    return _layer(m, layer_index, kinds[layer_index])


def mtp_layers(model: ModelSection | Mapping[str, Any]) -> int:
    """MTP layers that hold parameters: ``mtp_num_layers``, one in all when Megatron-Core
    repeats one layer (``mtp_use_repeated_layer``); a hybrid model has them only where its
    pattern spells them (``mtp_hybrid_override_pattern`` or parts after '/')."""
    m = as_model(model)
    if hybrid_pattern(m) is not None:
        mtp = hybrid_mtp(m)
        return mtp.physical if mtp is not None else 0
    depths = int(m.mtp_num_layers or 0)
    if depths and opt_field(m, "mtp_use_repeated_layer", False) is True:
        return 1
    return depths


def mtp_layer_params(model: ModelSection | Mapping[str, Any], depth: int = 0) -> MTPLayerParams:
    """One MTP layer (of the ``mtp_layers`` that hold parameters). A GPT model's MTP layer reuses
    the last decoder layer's spec for its transformer layer (softmax attention or MLA, never a
    linear-attention mixer); a hybrid model's holds the layers its MTP pattern spells, each with
    its one norm, like the decoder's."""
    m = as_model(model)
    n_mtp = mtp_layers(m)
    if not 0 <= depth < n_mtp:
        raise ValueError(f"MTP layer {depth} out of range ({n_mtp} MTP layer(s) hold "
                         f"parameters; model.mtp_num_layers={m.mtp_num_layers})")
    h = int(need_field(m, "hidden_size"))
    hybrid = hybrid_mtp(m)
    if hybrid is not None:
        first = num_layers(m) + depth * len(hybrid.pattern)
        inner = tuple(_layer(m, first + j, kind) for j, kind in enumerate(hybrid.kinds))
        if not inner:
            raise ValueError("model.mtp_hybrid_override_pattern is empty: an MTP layer needs "
                             "at least one layer symbol")
        return MTPLayerParams(depth=depth, layer=inner[0], more_layers=inner[1:],
                              projection=2 * h * h, norms=3 * _norm(m, h))
    last = layer_kinds(m)[-1]
    kind = LayerKind("mla" if m.multi_latent_attention else "attention", last.mlp)
    layer = _layer(m, num_layers(m) + depth, kind)
    return MTPLayerParams(depth=depth, layer=layer, projection=2 * h * h,
                          norms=3 * _norm(m, h))


def vocab_rows(model: ModelSection | Mapping[str, Any], *, pad_vocab: bool | None = None,
               tp: int | None = None) -> int:
    """Embedding rows: the tokenizer vocabulary, padded to divisor x TP unless told not to.

    `pad_vocab=None` follows an explicit `should_pad_vocab` in the section (Bridge's switch)
    and otherwise pads, as Megatron-LM always does; the larger count errs on the safe side.
    """
    m = as_model(model)
    vocab = int(need_field(m, "vocab_size"))
    if pad_vocab is None:
        pad_vocab = bool(opt_field(m, "should_pad_vocab", True))
    if not pad_vocab:
        return vocab
    return padded_vocab_size(vocab, m.make_vocab_size_divisible_by,
                             tp or m.tensor_model_parallel_size)


def count_params(model: ModelSection | Mapping[str, Any], *, pad_vocab: bool | None = None,
                 tp: int | None = None) -> ParamCount:
    """Every parameter of the model once: embedding, decoder layers, final norm, output layer
    (when untied) and MTP layers. Published counts use `pad_vocab=False`.

    With tied embeddings and PP > 1 Megatron keeps a second copy of the embedding on the last
    stage; that copy is a per-stage matter and is not in this global count.
    """
    m = as_model(model)
    h = int(need_field(m, "hidden_size"))
    rows = vocab_rows(m, pad_vocab=pad_vocab, tp=tp)
    positions = 0
    if m.position_embedding_type == "learned_absolute":
        # Bridge builds the table with max_sequence_length = seq_length.
        table = m.seq_length or m.max_position_embeddings
        if table is None:
            raise ValueError("learned_absolute positions need model.seq_length "
                             "(or max_position_embeddings)")
        positions = int(table) * h
    output = 0 if m.share_embeddings_and_output_weights else rows * h
    kinds = layer_kinds(m)
    layers = tuple(_layer(m, i, kind) for i, kind in enumerate(kinds))
    mtp = tuple(mtp_layer_params(m, d) for d in range(mtp_layers(m)))
    return ParamCount(vocab_size=rows, embedding=rows * h + positions,
                      position_embedding=positions, output_layer=output,
                      final_norm=_norm(m, h), layers=layers, mtp_layers=mtp)


# ---------------------------------------------------------------------------------------------
# LoRA adapters: which linears a layer has (as Megatron-Core names them) and the adapter
# parameters Megatron Bridge's LoRA puts on the ones a peft section targets


class Linear(NamedTuple):
    """One linear module of a layer, as LoRA sees it (full, unsharded feature counts)."""

    path: str
    """Module path inside the layer, e.g. ``self_attention.linear_qkv``."""
    d_in: int
    d_out: int
    expert: bool = False
    """A routed expert's linear: its adapter lives on each EP rank and splits over ETP."""
    walked: bool = True
    """One of the linear types Bridge adapts when no target_modules are given (column / row
    parallel and TE linears; not TE's duplicated linears, grouped expert GEMMs or the router)."""
    parts: tuple[tuple[str, int], ...] = ()
    """CanonicalLoRA's names for the pieces of a fused linear and their output features
    (linear_q / linear_k / linear_v of linear_qkv, linear_fc1_gate / linear_fc1_up of fc1)."""


class Adapters(NamedTuple):
    """Adapter parameters (A: in x r, B: r x out per adapted linear), global counts, split the
    way Bridge shards them: non-expert adapters over TP (A and B are column / row parallel
    linears), expert adapters over ETP, either one set every EP rank holds (shared by its
    local experts) or one per expert (over EP x ETP)."""

    tp_sharded: int = 0
    expert_shared: int = 0
    expert_each: int = 0
    modules: tuple[str, ...] = ()
    """Names of the adapted modules (``linear_qkv``, …)."""

    def __add__(self, other: Any) -> Adapters:  # type: ignore[override]
        return Adapters(self.tp_sharded + other.tp_sharded,
                        self.expert_shared + other.expert_shared,
                        self.expert_each + other.expert_each,
                        tuple(dict.fromkeys((*self.modules, *other.modules))))

    @property
    def total(self) -> int:
        return self.tp_sharded + self.expert_shared + self.expert_each


def layer_linears(model: ModelSection | Mapping[str, Any], kind: LayerKind) -> tuple[Linear, ...]:
    """The linear modules of one layer of this kind, in Megatron-Core's TE layer specs."""
    m = as_model(model)
    h = int(need_field(m, "hidden_size"))
    out: list[Linear] = []
    if kind.mixer == "attention":
        a, g, d = _heads(m)
        q = a * d * (2 if opt_field(m, "attention_output_gate", False) else 1)
        out.append(Linear("self_attention.linear_qkv", h, q + 2 * g * d,
                          parts=(("linear_q", q), ("linear_k", g * d), ("linear_v", g * d))))
        out.append(Linear("self_attention.linear_proj", a * d, h))
    elif kind.mixer == "mla":
        a = int(need_field(m, "num_attention_heads"))
        r_q, r_kv = m.q_lora_rank, m.kv_lora_rank
        q_head = a * (m.qk_head_dim + m.qk_pos_emb_head_dim)
        if r_q is None:
            out.append(Linear("self_attention.linear_q_proj", h, q_head))
        else:
            out.append(Linear("self_attention.linear_q_down_proj", h, r_q, walked=False))
            out.append(Linear("self_attention.linear_q_up_proj", r_q, q_head))
        out.append(Linear("self_attention.linear_kv_down_proj", h, r_kv + m.qk_pos_emb_head_dim,
                          walked=False))
        out.append(Linear("self_attention.linear_kv_up_proj", r_kv,
                          a * (m.qk_head_dim + m.v_head_dim)))
        out.append(Linear("self_attention.linear_proj", a * m.v_head_dim, h))
    elif kind.mixer == "gdn":
        d_k = opt_int(m, "linear_key_head_dim", 128)
        d_v = opt_int(m, "linear_value_head_dim", 128)
        n_k = opt_int(m, "linear_num_key_heads", 16)
        n_v = opt_int(m, "linear_num_value_heads", 32)
        qk, v = n_k * d_k, n_v * d_v
        out.append(Linear("self_attention.in_proj", h, 2 * qk + 2 * v + 2 * n_v))
        out.append(Linear("self_attention.out_proj", v, h))
    elif kind.mixer == "mamba":
        state, groups, heads, d_inner = _mamba_dims(m, h)
        out.append(Linear("mixer.in_proj", h, 2 * d_inner + 2 * groups * state + heads))
        out.append(Linear("mixer.out_proj", d_inner, h))
    if kind.mlp == "dense":
        out += _mlp_linears(m, "mlp", _ffn_width(m))
    elif kind.mlp == "moe":
        experts = int(need_field(m, "num_moe_experts"))
        out.append(Linear("mlp.router", h, experts, walked=False))
        grouped = bool(m.moe_grouped_gemm)
        where = "mlp.experts" if grouped else "mlp.experts.local_experts.{e}"
        out += _mlp_linears(m, where, int(m.moe_ffn_hidden_size or _ffn_width(m)), expert=True,
                            walked=not grouped)
        if m.moe_shared_expert_intermediate_size:
            out += _mlp_linears(m, "mlp.shared_experts",
                                int(m.moe_shared_expert_intermediate_size))
    return tuple(out)


def _mlp_linears(m: ModelSection, where: str, width: int, *, expert: bool = False,
                 walked: bool = True) -> list[Linear]:
    h = int(need_field(m, "hidden_size"))
    gated = m.gated_linear_unit
    parts = (("linear_fc1_gate", width), ("linear_fc1_up", width)) if gated else ()
    return [Linear(f"{where}.linear_fc1", h, 2 * width if gated else width, expert, walked,
                   parts),
            Linear(f"{where}.linear_fc2", width, h, expert, walked)]


def _adapt(m: ModelSection, spec: LoRASpec, linears: tuple[Linear, ...],
           prefixes: tuple[str, ...]) -> Adapters:
    """Adapter parameters of the targeted linears among ``linears`` (full names: each prefix +
    the module path; ``{i}`` stands for a layer index)."""
    tp_sharded = shared = each = 0
    names: list[str] = []
    for lin in linears:
        name = lin.path.rsplit(".", 1)[-1]
        full = tuple(p + lin.path.replace("{e}", "0") for p in prefixes)
        whole = spec.matches(name, full, linear=lin.walked)
        parts = [] if whole else [(p, out) for p, out in lin.parts if p in spec.targets]
        pieces = [(lin.d_in, lin.d_out)] if whole else [(lin.d_in, out) for _, out in parts]
        if not pieces:
            continue
        names.append(name if whole else "/".join(p for p, _ in parts))
        if not lin.expert:
            tp_sharded += sum(spec.dim * (i + o) for i, o in pieces)
            continue
        r = _expert_rank(m, spec)
        experts = int(need_field(m, "num_moe_experts"))
        grouped = bool(m.moe_grouped_gemm)
        for i, o in pieces:
            if grouped and spec.experts_shared_outer:  # gate_up A and down B shared
                outer, inner = (i * r, r * o) if name == "linear_fc1" else (r * o, i * r)
                shared += outer
                each += experts * inner
            elif grouped and spec.share_expert_adapters:
                shared += r * (i + o)
            else:  # one adapter per expert (SequentialMLP names each local expert's linear)
                each += experts * r * (i + o)
    return Adapters(tp_sharded, shared, each, tuple(names))


def _expert_rank(m: ModelSection, spec: LoRASpec) -> int:
    if not spec.normalize_moe:
        return spec.dim
    topk = int(m.moe_router_topk)
    if spec.dim % topk:
        raise ConfigError("peft.dim", f"normalize_moe_lora divides the rank by "
                                      f"moe_router_topk={topk}; {spec.dim} does not divide")
    return spec.dim // topk


_DECODER = ("decoder.layers.{i}.", "module.decoder.layers.{i}.")


def layer_adapters(model: ModelSection | Mapping[str, Any], kind: LayerKind,
                   spec: LoRASpec) -> Adapters:
    """LoRA adapters on one decoder layer of this kind."""
    m = as_model(model)
    return _adapt(m, spec, layer_linears(m, kind), _DECODER)


def mtp_adapters(model: ModelSection | Mapping[str, Any], depth: int,
                 spec: LoRASpec) -> Adapters:
    """LoRA adapters on one MTP layer: its inner layers (named like the decoder's) and its
    eh_proj (a column-parallel linear, adapted when targeted or when every linear is)."""
    m = as_model(model)
    h = int(need_field(m, "hidden_size"))
    base = (f"mtp.layers.{depth}.", f"module.mtp.layers.{depth}.")
    hybrid = hybrid_mtp(m)
    if hybrid is not None:
        total = Adapters()
        for j, kind in enumerate(hybrid.kinds):
            inner = tuple(b + f"mtp_model_layer.layers.{j}." for b in base)
            total = total + _adapt(m, spec, layer_linears(m, kind), inner)
    else:
        last = layer_kinds(m)[-1]
        kind = LayerKind("mla" if m.multi_latent_attention else "attention", last.mlp)
        total = _adapt(m, spec, layer_linears(m, kind),
                       tuple(b + "mtp_model_layer." for b in base))
    return total + _adapt(m, spec, (Linear("eh_proj", 2 * h, h),), base)


def output_adapter_rank(model: ModelSection | Mapping[str, Any], spec: LoRASpec) -> int:
    """The LoRA rank on the (untied) output layer, 0 when it is not adapted: its adapter is
    rank x (h + vocabulary rows), split over TP."""
    m = as_model(model)
    if m.share_embeddings_and_output_weights:
        return 0
    hit = spec.matches("output_layer", ("output_layer", "module.output_layer"))
    return spec.dim if hit else 0
