"""Activation memory: the bytes one transformer layer keeps saved for backward, for one
micro-batch on one GPU, after the recompute and offload decisions.

Why term by term: the classic per-layer formula (Korthikanti et al. 2022: 34·s·b·h + 5·a·s²·b)
is exact only for its own assumptions (MHA, GeLU 4h, dropout, learned positions, unfused
attention). Real layers move away from it in known ways, each measured on real Megatron-Core
layers on CPU (../shared/reference/cpu-ground-truth.md §4, §10):

- fused / flash attention stores no s² scores, only q, k, v, the output and an fp32 logsumexp;
- GQA copies the query and keeps the whole QKV buffer alive through the k / v views; unfused
  attention saves k and v expanded to every head;
- RoPE makes new q and k tensors (the v view keeps the buffer) and, unfused, saves cos / sin;
- SwiGLU's fc1 output is 2F wide; the unfused ``glu()`` also keeps silu(x) and the linear half;
- dropout masks are one byte per element and vanish with dropout 0;
- unfused softmax in fp32 stores fp32 probabilities;
- MoE layers save the router's scores, the dispatched tokens (top-k x tokens, not divided by
  EP) and the expert MLP's intermediates;
- selective recompute drops the terms of the modules it recomputes; full recompute keeps only
  each recompute group's input.

Which kernels are fused is read from the config: ``transformer_impl="local"`` is Megatron-Core's
own unfused attention and runs without Transformer Engine or Apex kernels, so its fusions default
off (MCore's ``TransformerConfig`` defaults, fp32 softmax included); Transformer Engine defaults
them on (Megatron-LM and Bridge defaults). An explicit ``model.masked_softmax_fusion``,
``model.bias_activation_fusion``, ``model.attention_softmax_in_fp32`` or ``model.apply_rope_fusion``
wins over either default.

Bytes are exact element counts times element widths; nothing here is fitted.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from mbridge_perf.config.derived import Precision, resolve_precision
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.layers import opt_int
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.semantics import fused_attention, recompute
from mbridge_perf.memory.recompute import rebuilt_layers

# Bytes per element a Transformer Engine FP8 linear keeps of its input for the weight gradient:
# one FP8 copy (the transposed / column-wise one on Hopper; MXFP8 adds one E8M0 scale per 32
# elements). ESTIMATED from TE's saved sets; not measurable on CPU.
FP8_SAVED_INPUT_BYTES = {"delayed": 1.0, "tensorwise": 1.0, "blockwise": 1.0 + 4 / 128,
                         "mxfp8": 1.0 + 1 / 32}
# NVFP4: a linear's saved input in 4 bits plus one FP8 scale per 16 elements (TE
# NVFP4BlockScaling; ESTIMATED from the format, not measured on a GPU).
FP4_SAVED_INPUT_BYTES = 0.5 + 1 / 16
# Router scores kept per token and expert (fp32 logits, scores, top-k map): measured 0.125 MiB
# for 2,048 tokens x 4 experts on MCore 0.16.1 (cpu-ground-truth §4.3, MoE rows) = 16 B.
ROUTER_BYTES_PER_TOKEN_EXPERT = 16
# Transformer Engine's fused softmax kernel (unfused attention path) handles keys up to this
# length; longer sequences fall back to torch softmax in fp32.
TE_FUSED_SOFTMAX_MAX_SEQ = 16384

SELECTIVE_MODULES = frozenset({"core_attn", "layernorm", "mlp", "moe", "moe_act",
                               "shared_experts", "mla_up_proj", "gdn_norm_out"})


class LayerActivation(BaseModel):
    """What one transformer layer keeps for backward, for one micro-batch, on one GPU."""

    model_config = ConfigDict(frozen=True)

    layer_index: int
    mixer: str
    mlp: str
    recompute: Literal["none", "selective", "full_group_input", "full_inside_group",
                       "full_not_recomputed"]
    """How recompute treats this layer: nothing; some modules; full recompute, where the first
    layer of a group keeps the group's input and the others keep nothing; or a layer that
    full ``block`` recompute leaves whole."""
    terms: dict[str, int]
    """Named contributions in bytes (zero terms omitted)."""
    total: int
    """Bytes saved for backward (sum of the terms)."""


class ActContext(NamedTuple):
    """Everything the per-layer terms depend on, resolved once per estimate (a tuple: cheap to
    hash and compare, it keys the per-kind caches)."""

    s: int  # sequence length per context-parallel rank
    b: int  # micro-batch size
    n: int  # tokens per micro-batch on this CP rank: s * b
    h: int
    t: int  # tensor parallel
    tsp: int  # t with sequence parallelism (layer-norm regions sharded), else 1
    cp: int
    e: int  # bytes per activation element
    te: bool  # Transformer Engine layer specs (fused norms into linears, TE attention)
    fused_attn: bool  # flash / cuDNN attention: no s^2 tensors
    softmax_bytes: int  # unfused attention: bytes per saved probability
    attn_drop: bool
    hid_drop: bool
    rope: bool
    rope_fused: bool
    glu: bool
    act_fused: bool  # bias-activation fusion (SwiGLU / weighted SwiGLU kernels)
    layer_norm: bool  # LayerNorm (mean + rstd) vs RMSNorm (rstd)
    qk_norm: bool
    heads: int
    groups: int
    head_dim: int
    ffn: int
    moe_ffn: int
    shared_ffn: int
    topk: int
    experts: int
    etp: int
    grouped_gemm: bool
    capacity_factor: float | None
    pad_to_capacity: bool
    q_lora: int | None
    kv_lora: int
    qk_head: int
    qk_rope: int
    v_head: int
    selective: frozenset[str]
    full: str | None  # "uniform" | "block" | None
    full_n: int
    full_window: int  # layers one backward rebuilds on top of what is kept (memory.recompute)
    distribute_saved: bool
    offload: frozenset[str]
    fp8_bytes: float  # 0.0 = no FP8 layers
    imbalance: float
    mixer_dims: tuple[int, ...]  # GDN / Mamba widths (approximate model)


def _flag(m: ModelSection, name: str, default: bool) -> bool:
    """A model switch: explicit value (modelled or carried), else the given default."""
    if name in m.__pydantic_fields_set__:  # model_fields_set, without the property call
        return bool(getattr(m, name))
    extra = (m.__pydantic_extra__ or {}).get(name)
    return default if extra is None else bool(extra)


def _need(m: ModelSection, name: str, what: str) -> int:
    value = getattr(m, name, None)
    if value is None:
        raise ConfigError(f"model.{name}", f"required to estimate memory; set {what}")
    return int(value)


def context(cfg: TrainingConfig, *, imbalance: float = 1.0, precision: Precision | None = None,
            shape_kinds: tuple[tuple[str, str], ...] | None = None) -> ActContext:
    """Resolve the per-layer activation inputs of a config (ConfigError when a size is
    missing)."""
    m = cfg.model
    p = precision or resolve_precision(cfg)
    h, heads, seq = m.hidden_size, m.num_attention_heads, m.seq_length
    if h is None or heads is None or seq is None:
        _need(m, "hidden_size", "model.hidden_size (the model width)")
        _need(m, "num_attention_heads", "model.num_attention_heads")
        _need(m, "seq_length", "model.seq_length=<training sequence length>")
    h, heads, seq = int(h), int(heads), int(seq)
    if imbalance < 1.0:
        raise ConfigError("imbalance", f"must be >= 1.0 (1.0 = perfectly balanced routing), "
                                       f"got {imbalance}")
    t, cp = m.tensor_model_parallel_size, m.context_parallel_size
    s = max(1, seq // cp)
    b = cfg.train.micro_batch_size
    te = m.transformer_impl != "local"
    fused_attn = fused_attention(m, p.bf16 or p.fp16)
    softmax_fused = _flag(m, "masked_softmax_fusion", te)
    if te and s > TE_FUSED_SOFTMAX_MAX_SEQ:
        softmax_fused = False
    fp32_softmax = _flag(m, "attention_softmax_in_fp32", not te) or bool(
        _flag(m, "apply_query_key_layer_scaling", False))
    e = 2 if (p.bf16 or p.fp16) else 4
    softmax_bytes = 4 if (fp32_softmax and not softmax_fused) else e
    r = recompute(m)
    selective = frozenset(r.selective)
    full = None
    full_n = int(m.recompute_num_layers or 1)
    full_window = 0
    if r.granularity == "full":
        full = r.method or "uniform"
        full_window = rebuilt_layers(m, full, full_n)
    fp8_bytes = 0.0
    if te and p.fp8:
        fp8_bytes = FP8_SAVED_INPUT_BYTES.get(str(p.fp8_recipe), 1.0)
    elif te and p.fp4:
        fp8_bytes = FP4_SAVED_INPUT_BYTES
    offload: frozenset[str] = frozenset()
    if m.fine_grained_activation_offloading:
        offload = frozenset(m.offload_modules or ())
    gated = m.gated_linear_unit
    experts = int(m.num_moe_experts or 0)
    # positional, in field order (_make checks the count): 44 keyword arguments cost about a
    # microsecond per estimate
    return ActContext._make((
        s, b, s * b, h, t,  # s, b, n, h, t
        t if m.sequence_parallel else 1, cp, e, te, fused_attn,  # tsp, cp, e, te, fused_attn
        softmax_bytes, m.attention_dropout > 0, m.hidden_dropout > 0,  # .., attn/hid_drop
        m.position_embedding_type in ("rope", "mrope", "yarn"),  # rope
        _flag(m, "apply_rope_fusion", te), gated,  # rope_fused, glu
        _flag(m, "bias_activation_fusion", te), m.normalization == "LayerNorm",  # act_fused, ..
        m.qk_layernorm, heads, int(m.num_query_groups or heads),  # qk_norm, heads, groups
        int(m.kv_channels or h // heads), int(m.ffn_hidden_size or 4 * h),  # head_dim, ffn
        int(m.moe_ffn_hidden_size or m.ffn_hidden_size or 4 * h),  # moe_ffn
        int(m.moe_shared_expert_intermediate_size or 0), m.moe_router_topk,  # shared_ffn, topk
        experts, m.expert_tensor_parallel_size or t,  # experts, etp
        m.moe_grouped_gemm or te, m.moe_expert_capacity_factor,  # grouped_gemm, capacity_factor
        m.moe_pad_expert_input_to_capacity, m.q_lora_rank,  # pad_to_capacity, q_lora
        m.kv_lora_rank, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim,  # kv_lora .. v_head
        selective, full, full_n, full_window,  # selective, full, full_n, full_window
        bool(m.distribute_saved_activations) and not m.sequence_parallel,  # distribute_saved
        offload, fp8_bytes, imbalance,  # offload, fp8_bytes, imbalance
        _mixer_dims(m, h) if shape_kinds is None or _has_scan_mixer(shape_kinds)
        else ()))  # mixer_dims


@lru_cache(maxsize=64)
def _has_scan_mixer(kinds: tuple[tuple[str, str], ...]) -> bool:
    """Whether any layer kind is GDN / Mamba (cached per shape's kinds: checked per estimate)."""
    return any(k[0] in ("gdn", "mamba") for k in kinds)


def _mixer_dims(m: ModelSection, h: int) -> tuple[int, ...]:
    """(GDN q/k width, GDN v width, Mamba inner width, Mamba B/C width, Mamba heads)."""
    qk = opt_int(m, "linear_num_key_heads", 16) * opt_int(m, "linear_key_head_dim", 128)
    v = opt_int(m, "linear_num_value_heads", 32) * opt_int(m, "linear_value_head_dim", 128)
    head_dim = opt_int(m, "mamba_head_dim", 64)
    heads = opt_int(m, "mamba_num_heads", None)
    inner = heads * head_dim if heads is not None else 2 * h
    bc = 2 * opt_int(m, "mamba_num_groups", 8) * opt_int(m, "mamba_state_dim", 128)
    return qk, v, inner, bc, inner // head_dim


def _norm_bytes(c: ActContext, width: int, tokens: float, recomputed: bool = False) -> float:
    """A norm's saved input plus its fp32 statistics (LayerNorm mean + rstd, RMSNorm rstd);
    recomputed norms keep only the input (their checkpoint's)."""
    stats = 0 if recomputed else (8 if c.layer_norm else 4) * tokens
    return c.e * tokens * width + stats


def layer_terms(c: ActContext, mixer: str, mlp: str, fp8: bool, *,
                selective: bool = True) -> dict[str, float]:
    """Named bytes one layer of this kind saves for one micro-batch (before full recompute).
    ``selective=False`` ignores selective recompute (the working set of a recomputed layer)."""
    sel = c.selective if selective else frozenset()
    off = c.offload
    e, n, h, t, tsp = c.e, c.n, c.h, c.t, c.tsp
    f8 = c.fp8_bytes if fp8 else 0.0
    lin = f8 or e  # bytes per element of an input kept only for a (possibly FP8) linear
    tok = n / tsp  # tokens in the layer-norm regions
    out: dict[str, float] = {}
    hybrid_block = mixer == "none" or mlp == "none"

    if mixer != "none":
        separate = (not c.te) or mixer in ("mla", "gdn", "mamba")
        norm_rc = "layernorm" in sel and separate
        out["attn_norm"] = 0.0 if "attn_norm" in off else _norm_bytes(c, h, tok, norm_rc)
        qkv_in = (e if separate else lin) * tok * h
        if norm_rc or "qkv_linear" in off:
            qkv_in = 0.0
        out["qkv_input"] = qkv_in
        if mixer == "attention":
            _attention(c, sel, off, lin, out)
        elif mixer == "mla":
            _mla(c, sel, off, lin, out)
        else:
            _linear_mixer(c, mixer, out)
        if c.hid_drop and not hybrid_block:
            out["attn_dropout_mask"] = tok * h
    if mlp != "none":
        separate = (not c.te) or mlp == "moe"
        norm_rc = "layernorm" in sel and separate
        out["mlp_norm"] = 0.0 if "mlp_norm" in off else _norm_bytes(c, h, tok, norm_rc)
        mlp_in = (e if separate else lin) * tok * h
        if mlp == "dense" and "mlp" in sel:
            mlp_in = e * tok * h if separate else 0.0  # the checkpoint's input
        if norm_rc:
            mlp_in = 0.0  # discarded after use, recomputed before backward
        out["mlp_input"] = mlp_in
        if mlp == "dense":
            if "mlp" not in sel:
                _dense_mlp(c, c.ffn, n / t, lin, out, "mlp")
        else:
            _moe(c, sel, off, lin, out)
        if c.hid_drop and not hybrid_block:
            out["mlp_dropout_mask"] = tok * h
    if hybrid_block and c.hid_drop:
        out["dropout_mask"] = tok * h
    return out


def _attention(c: ActContext, sel: frozenset[str], off: frozenset[str], lin: float,
               out: dict[str, float]) -> None:
    e, n, t = c.e, c.n, c.t
    a_l = max(c.heads // t, 1)
    g_l = max(c.groups // t, 1)
    d = c.head_dim
    gqa = c.groups < c.heads
    q_copy = gqa or c.rope or c.qk_norm
    k_copy = c.rope or c.qk_norm
    core_rc = "core_attn" in sel or "core_attn" in off  # offloaded: its saved set is on host
    unfused = not c.fused_attn
    if unfused and gqa and not core_rc:
        # repeat_interleave'd k and v are what the score / context matmuls save; no view of
        # the QKV buffer survives
        qkv = e * n * a_l * d * 3
    else:
        qkv = e * n * (a_l + 2 * g_l) * d + (e * n * a_l * d if q_copy else 0.0) + (
            e * n * g_l * d if k_copy else 0.0)
    out["qkv"] = 0.0 if "core_attn" in off else qkv
    if c.rope and not c.rope_fused:
        out["rope_cos_sin"] = 4 * c.s * d * e
    _core(c, a_l, core_rc, out)
    if c.cp > 1 and c.fused_attn:
        out["cp_kv_buffers"] = e * n * 2 * g_l * d
    _proj(c, a_l * d, core_rc, off, lin, out)


def _core(c: ActContext, heads_local: int, core_rc: bool, out: dict[str, float]) -> None:
    if c.fused_attn:
        if not core_rc:
            out["core_attn"] = 4.0 * c.b * heads_local * c.s  # fp32 logsumexp
        return
    if core_rc:
        return
    scores = c.b * heads_local * c.s * c.s
    kept = c.softmax_bytes * scores
    if c.attn_drop:
        kept += scores + c.e * scores  # mask (1 byte) and dropped probabilities
    elif c.softmax_bytes != c.e:
        kept += c.e * scores  # fp32 probabilities cast down for the context matmul
    out["core_attn"] = kept


def _proj(c: ActContext, width: int, core_rc: bool, off: frozenset[str], lin: float,
          out: dict[str, float]) -> None:
    el = c.n * width
    if "attn_proj" in off:
        out["proj_input"] = 0.0
        return
    if c.fused_attn and not core_rc and lin != c.e:
        out["proj_input"] = (c.e + lin) * el  # attention keeps its output, the FP8 GEMM a copy
    else:
        out["proj_input"] = lin * el


def _mla(c: ActContext, sel: frozenset[str], off: frozenset[str], lin: float,
         out: dict[str, float]) -> None:
    e, n, t = c.e, c.n, c.t
    tok = n / c.tsp
    a_l = max(c.heads // t, 1)
    latent = 0.0
    if c.q_lora:
        latent += 2 * e * tok * c.q_lora + (8 if c.layer_norm else 4) * tok
    latent += e * tok * (c.kv_lora + c.qk_rope) + e * tok * c.kv_lora + (
        8 if c.layer_norm else 4) * tok
    out["mla_latent"] = latent
    if "mla_up_proj" not in sel and "core_attn" not in off:
        qk = c.qk_head + c.qk_rope
        out["qkv"] = e * n * a_l * (2 * qk + c.qk_head + c.v_head)
    if c.rope and not c.rope_fused:
        out["rope_cos_sin"] = 4 * c.s * c.qk_rope * e
    core_rc = "core_attn" in sel or "core_attn" in off
    _core(c, a_l, core_rc, out)
    _proj(c, a_l * c.v_head, core_rc, off, lin, out)


def _linear_mixer(c: ActContext, mixer: str, out: dict[str, float]) -> None:
    """GatedDeltaNet / Mamba: projections in and out only (approximate, see not_modeled)."""
    e, n, t = c.e, c.n, c.t
    qk, v, inner, bc, heads = c.mixer_dims
    if mixer == "gdn":
        width = (2 * qk + 2 * v) + (2 * qk + v) + 2 * v
    else:
        width = (2 * inner + bc + heads) + (inner + bc) + 2 * inner
    out["mixer"] = e * n * width / t


def _dense_mlp(c: ActContext, width: int, tokens: float, lin: float, out: dict[str, float],
               prefix: str) -> None:
    fc1 = 2 * width if c.glu else width
    out[f"{prefix}_fc1_output"] = c.e * tokens * fc1
    out[f"{prefix}_fc2_input"] = lin * tokens * width
    if c.glu and not c.act_fused:
        out[f"{prefix}_glu_unfused"] = 2 * c.e * tokens * width


def _moe(c: ActContext, sel: frozenset[str], off: frozenset[str], lin: float,
         out: dict[str, float]) -> None:
    if "moe" in sel:
        return  # the checkpoint keeps the layer input only (mlp_input)
    e = c.e
    tok = c.n / c.tsp
    out["router"] = ROUTER_BYTES_PER_TOKEN_EXPERT * tok * c.experts
    routed = c.topk * tok * c.etp  # token-expert pairs this GPU computes (ETP gathers them)
    if c.capacity_factor is not None:
        cap = c.capacity_factor * routed
        routed = cap if c.pad_to_capacity else min(routed * c.imbalance, cap)
    else:
        routed *= c.imbalance
    width = c.moe_ffn / c.etp
    out["moe_dispatched"] = 0.0 if "expert_fc1" in off else lin * routed * c.h
    fc1 = 2 * width if c.glu else width
    out["moe_fc1_output"] = 0.0 if "moe_act" in off else e * routed * fc1
    if "moe_act" not in sel:
        out["moe_fc2_input"] = lin * routed * width
        if not c.grouped_gemm:
            out["moe_probs"] = e * routed * width  # activation output kept for the prob. multiply
        if c.glu and not c.act_fused:
            out["moe_glu_unfused"] = 2 * e * routed * width
    if c.shared_ffn and "shared_experts" not in sel:
        _dense_mlp(c, c.shared_ffn, c.n / c.t, lin, out, "shared")


def layer_total(terms: dict[str, float]) -> float:
    return sum(terms.values())


def group_input_bytes(c: ActContext) -> float:
    """What full recompute keeps per recompute group: the group's input hidden states."""
    div = c.tsp if c.tsp > 1 else (c.t if c.distribute_saved else 1)
    return c.e * c.n * c.h / div


# ---------------------------------------------------------------------------------------------
# public: one layer


def layer_activation_bytes(cfg: TrainingConfig, layer_index: int, *,
                           imbalance: float = 1.0) -> LayerActivation:
    """Bytes transformer layer ``layer_index`` keeps saved for backward for one micro-batch on
    one GPU, after recompute and offload decisions.

    Under full recompute the first layer of each recompute group carries the group's input
    (2·s·b·h bytes, / TP with sequence parallelism) and the others carry nothing; Megatron-Core
    attributes that input to the transformer block rather than to a layer.

    Kernel choices come from the model section: ``transformer_impl`` / ``attention_backend``
    (local or unfused: s² scores kept), ``masked_softmax_fusion`` and
    ``attention_softmax_in_fp32`` (FP32 probabilities when the softmax is unfused),
    ``bias_activation_fusion`` (unfused ``glu()`` keeps 4·s·b·F more) and ``apply_rope_fusion``
    (unfused RoPE saves cos / sin). Unset, they follow Megatron-Core's ``TransformerConfig``
    for ``transformer_impl="local"`` (all False, softmax in FP32) and the Megatron-LM / Bridge
    GPU defaults for Transformer Engine (fused).
    """
    from mbridge_perf.config.layers import layer_kinds
    from mbridge_perf.memory.placement import placement

    m = cfg.model
    _need(m, "num_layers", "model.num_layers")
    try:
        kinds = layer_kinds(m)
    except ValueError as exc:
        raise ConfigError("model", str(exc)) from None
    if not 0 <= layer_index < len(kinds):
        raise ConfigError("layer_index", f"{layer_index} is out of range 0..{len(kinds) - 1}")
    p = resolve_precision(cfg)
    c = context(cfg, imbalance=imbalance, precision=p)
    kind = kinds[layer_index]
    fp8 = layer_runs_fp8(p, layer_index, len(kinds)) and c.fp8_bytes > 0
    mode: Any = "selective" if c.selective else "none"
    if c.full is not None:
        chunk = next(ch for rank in placement(m) for ch in rank
                     if ch.first_layer <= layer_index < ch.first_layer + ch.num_layers)
        pos = layer_index - chunk.first_layer
        if c.full == "block":
            mode = "full_group_input" if pos < c.full_n else "full_not_recomputed"
        else:
            mode = "full_group_input" if pos % c.full_n == 0 else "full_inside_group"
    if mode == "full_group_input":
        terms = {"recompute_group_input": group_input_bytes(c)}
    elif mode == "full_inside_group":
        terms = {}
    else:
        terms = layer_terms(c, kind.mixer, kind.mlp, fp8, selective=mode != "full_not_recomputed")
    clean = {k: round(v) for k, v in terms.items() if v}
    return LayerActivation(layer_index=layer_index, mixer=kind.mixer, mlp=kind.mlp,
                           recompute=mode, terms=clean, total=sum(clean.values()))


def layer_runs_fp8(p: Precision, index: int, num_layers: int) -> bool:
    """FP8 recipes can keep the first / last layers in BF16 (``first_last_layers_bf16``)."""
    if not p.fp8:
        return False
    if p.first_last_layers_bf16:
        if index < p.num_layers_at_start_in_bf16:
            return False
        if index >= num_layers - p.num_layers_at_end_in_bf16:
            return False
    return True
