"""Model state per GPU: weights, gradients and optimizer state of the parameters a pipeline
stage holds, after TP / EP / ETP sharding and distributed-optimizer or Megatron-FSDP sharding.

Why buckets: Megatron-Core shards three kinds of parameters differently (memory-estimation.md
§3-§4, cpu-ground-truth.md §5): TP-sharded ones (attention, dense MLP, shared experts,
embeddings) divide by TP; replicated ones (norms, router, MLA down-projections, row-parallel
biases) stay whole on every TP rank; routed experts divide by EP x ETP and never by TP. The
distributed optimizer then shards optimizer state over DP x CP for dense parameters and over the
expert-data-parallel group for routed experts.

Per-shape results (parameters per layer kind, prefix counts of kinds over layer indices) are
cached: an estimate only multiplies counts by bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import Any, NamedTuple

from mbridge_perf.config.derived import Precision
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.layers import LayerKind, LoRASpec
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.memory.params import (
    Adapters,
    layer_adapters,
    layer_kinds,
    layer_linears,
    layer_params,
    mtp_adapters,
    mtp_layer_params,
    mtp_layers,
    output_adapter_rank,
)

# Fields of the model section the parameter count and the per-layer kinds depend on.
SHAPE_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "gated_linear_unit", "normalization", "add_bias_linear", "add_qkv_bias",
    "qk_layernorm", "position_embedding_type", "experimental_attention_variant",
    "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
    "moe_shared_expert_intermediate_size", "multi_latent_attention", "q_lora_rank",
    "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers",
    # embedding and output layer: vocabulary, tying, learned-position table length
    "vocab_size", "share_embeddings_and_output_weights", "seq_length", "max_position_embeddings",
)

# Bytes per parameter of FP8 weights held by Transformer Engine: the FP8 data plus its
# transposed (column-wise) copy for the backward GEMMs; MXFP8 adds an E8M0 scale per 32
# elements for each. ESTIMATED from TE's Float8Tensor / MXFP8Tensor layout (not measurable on
# CPU); memory-estimation.md §9 warns that FP8 never halves weight memory.
FP8_WEIGHT_BYTES = {"mxfp8": 2 * (1 + 1 / 32)}
FP8_WEIGHT_BYTES_DEFAULT = 2.0
# NVFP4 (Transformer Engine's NVFP4BlockScaling): 4-bit values with one FP8 (E4M3) scale per
# 16 elements, a row-wise and a column-wise (transposed) copy cached per weight, like FP8.
# ESTIMATED from the format (TE docs: NVFP4 block size 16, E4M3 scales), not measured.
FP4_BYTES = 0.5 + 1 / 16
FP4_WEIGHT_BYTES = 2 * FP4_BYTES
_DTYPE_BYTES = {"float32": 4, "fp32": 4, "float": 4, "bfloat16": 2, "bf16": 2, "float16": 2,
                "fp16": 2, "half": 2, "uint8": 1, "fp8": 1, "float8": 1, "int8": 1,
                "float64": 8, "fp64": 8}


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, int | float | str | bool | type(None)):
        return value
    return repr(value)


_shape_fields = attrgetter(*SHAPE_FIELDS)  # one C call returning the tuple of values


def shape_key(m: ModelSection) -> tuple[Any, ...]:
    """Everything parameter counts depend on, hashable."""
    freq = m.moe_layer_freq
    extras = tuple((m.__pydantic_extra__ or {}).items())
    try:
        hash(extras)
    except TypeError:  # a list or mapping among the carried fields
        extras = _freeze(dict(extras))
    return (_shape_fields(m), tuple(freq) if isinstance(freq, list) else freq, extras)


@dataclass(frozen=True, slots=True)
class Bucket:
    """Parameters of one layer kind, split by how they shard."""

    tp_sharded: int
    replicated: int
    routed: int


@dataclass(frozen=True, slots=True)
class Shape:
    """Cached per model shape."""

    num_layers: int
    kinds: tuple[tuple[str, str], ...]
    """Distinct (mixer, mlp) kinds."""
    kind_of: tuple[int, ...]
    """Kind id of every decoder layer."""
    prefix: tuple[tuple[int, ...], ...]
    """prefix[k][i] = layers of kind k among layers [0, i)."""
    buckets: tuple[Bucket, ...]
    """Parameters per kind."""
    mtp: tuple[Bucket, ...]
    """Parameters of each MTP layer that holds them (one when Megatron-Core repeats one layer
    over the ``mtp_num_layers`` depths; none for a hybrid model whose pattern spells no MTP)."""
    mtp_kinds: tuple[int, ...]
    """Kind ids of the inner layers of one MTP depth (one transformer layer for GPT models, the
    MTP pattern's layers for hybrid ones); () when there are none."""
    h: int
    positions: int
    """Learned absolute position embedding (replicated), 0 with RoPE."""
    final_norm: int
    tied: bool
    total_params: int
    """Everything once, vocabulary unpadded (the published-style count)."""

    def count(self, kind: int, lo: int, hi: int) -> int:
        row = self.prefix[kind]
        return row[hi] - row[lo]


def model_shape(m: ModelSection) -> Shape:
    """Parameter buckets per layer kind, cached by the model's shape."""
    for name in ("num_layers", "hidden_size", "num_attention_heads"):
        if getattr(m, name) == 0:  # a recipe template (Bridge's vanilla_gpt) leaves them 0
            raise ConfigError(f"model.{name}", "is 0: there is no model to size; set the "
                                               "architecture (or start from a preset)")
    return _shape(shape_key(m), m)


_SHAPES: dict[tuple[Any, ...], Shape] = {}


def _shape(key: tuple[Any, ...], m: ModelSection) -> Shape:
    hit = _SHAPES.get(key)
    if hit is not None:
        return hit
    if len(_SHAPES) > 256:
        _SHAPES.clear()
    try:
        shape = _build_shape(m)
    except ConfigError:
        raise
    except ValueError as exc:
        text = str(exc)
        field = text.split()[0].rstrip(":,") if text.startswith("model.") else "model"
        raise ConfigError(field, text) from None
    _SHAPES[key] = shape
    return shape


def _build_shape(m: ModelSection) -> Shape:
    for name, what in (("num_layers", "the number of transformer layers"),
                       ("hidden_size", "the model width"),
                       ("num_attention_heads", "the attention heads"),
                       ("vocab_size", "the tokenizer vocabulary size")):
        if getattr(m, name) is None:
            raise ConfigError(f"model.{name}", f"required to estimate memory; set {what} "
                                               "(or use a preset)")
    all_kinds = layer_kinds(m)
    distinct: list[tuple[str, str]] = []
    kind_of: list[int] = []
    first_index: list[int] = []
    for i, k in enumerate(all_kinds):
        key = (k.mixer, k.mlp)
        if key not in distinct:
            distinct.append(key)
            first_index.append(i)
        kind_of.append(distinct.index(key))
    buckets = []
    for i in first_index:
        lp = layer_params(m, i)
        routed = lp.routed_experts
        buckets.append(Bucket(tp_sharded=lp.total - routed - lp.tp_replicated,
                              replicated=lp.tp_replicated, routed=routed))
    prefix = []
    for k in range(len(distinct)):
        row = [0]
        for kid in kind_of:
            row.append(row[-1] + (kid == k))
        prefix.append(tuple(row))
    mtp_buckets = []
    mtp_kinds: tuple[int, ...] = ()
    for depth in range(mtp_layers(m)):
        mp = mtp_layer_params(m, depth)
        routed = mp.routed_experts
        mtp_buckets.append(Bucket(tp_sharded=mp.total - routed - mp.tp_replicated,
                                  replicated=mp.tp_replicated, routed=routed))
        ids = []
        for layer in mp.inner_layers:
            key = (layer.mixer, layer.mlp)
            if key not in distinct:
                distinct.append(key)
                prefix.append(tuple([0] * (len(kind_of) + 1)))
                buckets.append(Bucket(0, 0, 0))
            ids.append(distinct.index(key))
        mtp_kinds = tuple(ids)
    h = int(m.hidden_size or 0)
    positions = 0
    if m.position_embedding_type == "learned_absolute":
        table = m.seq_length or m.max_position_embeddings
        if table is None:
            raise ConfigError("model.seq_length", "learned absolute positions need the "
                                                  "sequence length; set model.seq_length")
        positions = int(table) * h
    final_norm = 2 * h if m.normalization == "LayerNorm" else h
    tied = m.share_embeddings_and_output_weights
    vocab = int(m.vocab_size or 0)
    total = (vocab * h * (1 if tied else 2) + positions + final_norm
             + sum(b.tp_sharded + b.replicated + b.routed
                   for b, kid in ((buckets[kid], kid) for kid in kind_of))
             + sum(b.tp_sharded + b.replicated + b.routed for b in mtp_buckets))
    return Shape(num_layers=len(all_kinds), kinds=tuple(distinct), kind_of=tuple(kind_of),
                 prefix=tuple(prefix), buckets=tuple(buckets), mtp=tuple(mtp_buckets),
                 mtp_kinds=mtp_kinds, h=h, positions=positions, final_norm=final_norm,
                 tied=tied, total_params=total)


# ---------------------------------------------------------------------------------------------
# bytes per parameter


def dtype_bytes(value: Any, default: int) -> int:
    """Bytes of a dtype given as torch.float32, "bf16", "torch.uint8", ... (None: default)."""
    if value is None:
        return default
    name = str(getattr(value, "name", value)).lower().replace("torch.", "").strip()
    if name not in _DTYPE_BYTES:
        raise ConfigError("optimizer", f"unknown dtype {value!r} for a precision-aware "
                                       "optimizer field; use fp32, bf16, fp16 or uint8")
    return _DTYPE_BYTES[name]


class StateRates(NamedTuple):
    """Bytes per parameter on this GPU, by bucket: dense (DP x CP group) and expert (EDP)."""

    weight: float  # 16/32-bit weights
    fp8_weight: float  # weights of FP8 layers' linear (TP-sharded or expert) parameters
    grad: float
    optim: float  # master weights + optimizer moments, unsharded
    dense_shard: int  # optimizer shard group of dense parameters
    expert_shard: int
    grad_shard_dense: int  # Megatron-FSDP optim_grads(_params)
    grad_shard_expert: int
    weight_shard_dense: int  # Megatron-FSDP optim_grads_params
    weight_shard_expert: int
    offload_fraction: float


def state_rates(cfg: TrainingConfig, p: Precision, dp: int, edp: int) -> StateRates:
    """Bytes per parameter of weights, grads and optimizer state, and their shard groups."""
    o, ddp = cfg.optimizer, cfg.ddp
    w = 2 if (p.bf16 or p.fp16) else 4
    fp8_w = float(w)
    if p.fp8 and cfg.model.transformer_impl != "local":
        fp8 = FP8_WEIGHT_BYTES.get(str(p.fp8_recipe), FP8_WEIGHT_BYTES_DEFAULT)
        if (cfg.model.__pydantic_extra__ or {}).get("disable_parameter_transpose_cache"):
            fp8 /= 2  # the transposed copy is made per use, not kept
        # fp8_param keeps only FP8 weights; otherwise TE caches FP8 copies next to BF16 ones
        fp8_w = fp8 if p.fp8_param else w + fp8
    elif p.fp4 and cfg.model.transformer_impl != "local":
        fp4 = FP4_WEIGHT_BYTES / (2 if (cfg.model.__pydantic_extra__ or {}).get(
            "disable_parameter_transpose_cache") else 1)
        fp8_w = w + fp4
    grad = 4 if (p.grad_reduce_in_fp32 or w == 4) else w
    if o.use_precision_aware_optimizer:
        master = dtype_bytes(o.main_params_dtype, 4)
        m1 = dtype_bytes(o.exp_avg_dtype, 4)
        m2 = dtype_bytes(o.exp_avg_sq_dtype, 4)
    else:
        master, m1, m2 = 4, 4, 4
    if w == 4:
        master = 0  # fp32 training: the parameters are the master weights
    opt_name = str(o.optimizer).lower()
    optim = master + (m1 + m2 if opt_name == "adam" else m1)
    cp = cfg.model.context_parallel_size
    fsdp = ddp.use_megatron_fsdp
    strategy = ddp.data_parallel_sharding_strategy if fsdp else "no_shard"
    dist = o.use_distributed_optimizer or ddp.use_distributed_optimizer or strategy != "no_shard"
    # several distributed-optimizer instances each shard over their part of DP only
    instances = (ddp.__pydantic_extra__ or {}).get("num_distributed_optimizer_instances") or 1
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise ConfigError("ddp.num_distributed_optimizer_instances",
                          f"expected a whole number >= 1, got {instances!r}")
    dense, expert = max(dp * cp // instances, 1), max(edp // instances, 1)
    shard_opt = dist
    shard_grad = strategy in ("optim_grads", "optim_grads_params")
    shard_w = strategy == "optim_grads_params"
    return StateRates(
        weight=w, fp8_weight=fp8_w, grad=grad, optim=optim,
        dense_shard=dense if shard_opt else 1, expert_shard=expert if shard_opt else 1,
        grad_shard_dense=dense if shard_grad else 1,
        grad_shard_expert=expert if shard_grad else 1,
        weight_shard_dense=dense if shard_w else 1, weight_shard_expert=expert if shard_w else 1,
        offload_fraction=o.optimizer_offload_fraction if o.optimizer_cpu_offload else 0.0)


# ---------------------------------------------------------------------------------------------
# PEFT: the LoRA adapters a shape carries (the base is frozen)


@dataclass(frozen=True, slots=True)
class AdapterShape:
    """LoRA adapters of a model shape, global counts: per layer kind (aligned with
    ``Shape.kinds``), per MTP layer and the output layer's rank (0 when not adapted)."""

    spec: LoRASpec
    kinds: tuple[Adapters, ...]
    mtp: tuple[Adapters, ...]
    output_rank: int
    total: int
    """Every adapter parameter once (output layer at the unpadded vocabulary)."""
    modules: tuple[str, ...]
    """Adapted module names, in layer order."""
    unmatched: tuple[str, ...]
    """Targets that name no module of this model (Bridge warns and adapts nothing for them)."""
    adapted_layers: int
    """Decoder layers with at least one adapter."""


_ADAPTERS: dict[tuple[int, LoRASpec], tuple[Shape, AdapterShape]] = {}


def adapter_shape(m: ModelSection, shape: Shape, spec: LoRASpec) -> AdapterShape:
    """The adapters ``spec`` puts on this model (cached per shape object and spec)."""
    key = (id(shape), spec)
    hit = _ADAPTERS.get(key)
    if hit is not None and hit[0] is shape:
        return hit[1]
    if len(_ADAPTERS) > 256:
        _ADAPTERS.clear()
    layer_kinds_ = [LayerKind(*k) for k in shape.kinds]  # type: ignore[arg-type]
    kinds = tuple(layer_adapters(m, k, spec) for k in layer_kinds_)
    mtp = tuple(mtp_adapters(m, d, spec) for d in range(len(shape.mtp)))
    rank = output_adapter_rank(m, spec)
    per_kind = [shape.prefix[k][-1] for k in range(len(shape.kinds))]
    total = (sum(n * a.total for n, a in zip(per_kind, kinds, strict=True))
             + sum(a.total for a in mtp) + rank * (shape.h + int(m.vocab_size or 0)))
    modules = tuple(dict.fromkeys(
        [x for a in (*kinds, *mtp) for x in a.modules] + (["output_layer"] if rank else [])))
    known = {name for k in layer_kinds_ for lin in layer_linears(m, k)
             for name in (lin.path.rsplit(".", 1)[-1], *(p for p, _ in lin.parts))}
    known |= {"output_layer", "eh_proj"}
    unmatched = tuple(t for t in spec.targets if "*" not in t and "." not in t
                      and t not in known)
    adapted = sum(n for n, a in zip(per_kind, kinds, strict=True) if a.total)
    out = AdapterShape(spec, kinds, mtp, rank, total, modules, unmatched, adapted)
    _ADAPTERS[key] = (shape, out)
    return out


def _millions(n: float) -> str:
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def _expert_words(lora: AdapterShape) -> str:
    shared = any(a.expert_shared for a in (*lora.kinds, *lora.mtp))
    each = any(a.expert_each for a in (*lora.kinds, *lora.mtp))
    if not shared and not each:
        return ""
    how = " and ".join(w for w, on in (("one set per EP rank shared by its experts", shared),
                                        ("one per expert", each)) if on)
    return f"; expert adapters over ETP, {how}"


def peft_assumption(lora: AdapterShape) -> str:
    """What the estimate assumed about a peft section, in one paragraph for the report."""
    spec = lora.spec
    where = ("every linear layer" + (f" but {', '.join(spec.exclude)}" if spec.exclude else "")
             if spec.all_linears else ", ".join(lora.modules) or "no module")
    text = (f"PEFT (Megatron Bridge LoRA, rank {spec.dim}): adapters on {where} "
            f"({lora.adapted_layers} decoder layers"
            + (f", {len(lora.mtp)} MTP layer(s)" if any(a.total for a in lora.mtp) else "")
            + (", the output layer" if lora.output_rank else "")
            + f"), {_millions(lora.total)} parameters in all (A: in x rank, B: rank x out per "
            "adapted linear; split over TP" + _expert_words(lora)
            + "), trained with weights, gradients and optimizer state; the frozen base keeps "
            "only its weights (in the params dtype, FP8 copies as configured): no FP32 main "
            "copy, no gradients, no optimizer state. Activations as for full fine-tuning "
            "(a frozen linear that keeps no input for a weight gradient is not credited): an "
            "upper bound")
    if spec.dropout:
        text += f"; LoRA dropout {spec.dropout:g} masks not counted"
    if lora.unmatched:
        text += (f"; target(s) {', '.join(lora.unmatched)} name no module of this model: no "
                 "adapter there (Bridge warns)")
    if spec.indexed:
        text += (f"; pattern(s) {', '.join(spec.indexed)} name layer indices, priced on every "
                 "layer (Megatron numbers layers per pipeline chunk): an upper bound")
    return text
