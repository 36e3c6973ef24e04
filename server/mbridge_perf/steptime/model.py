"""Step time of one global-batch iteration on a layout (analytical, calibrated).

Per micro-batch and pipeline stage: the stage's layers' forward+backward GEMM FLOPs over the
dense peak of the precision in use times a calibrated efficiency (attention core at the BF16
peak, MoE experts at the grouped-GEMM factor), memory-bound ops as bytes over HBM bandwidth,
recompute's extra forward, a per-layer host overhead, and the exposed part of each in-layer
collective (TP all-gather/reduce-scatter, CP ring K/V exchange, EP dispatch+combine, PP
send/recv), with the CP ring's per-step merges of partial attention outputs and gradients.
The pipeline runs ``(M + (PP-1)/VPP)`` stage times (1F1B, interleaved with VPP);
the DP/EDP gradient reduce-scatter and parameter all-gather and the optimizer step are added
once. FLOP counts follow Megatron Bridge's model-FLOP convention (flop_utils.py: 6 x params
per token on every GEMM, causal-halved core attention, logits; no recompute), which is what
``model_tflops_per_gpu`` reports; the time counts the recomputed work too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict

from mbridge_perf.config.derived import Derived, derive
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import GPUSpec, lookup_gpu
from mbridge_perf.config.layers import layer_kinds, opt_field, opt_int
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.semantics import fused_attention
from mbridge_perf.memory.params import (
    _mamba_dims,
    count_params,
    layer_params,
    mtp_layers,
    vocab_rows,
)
from mbridge_perf.memory.state import shape_key
from mbridge_perf.steptime.calibration import Calibration, load_calibration

ACT_BYTES = 2  # BF16 activations on the wire
OPT_BYTES_PER_PARAM = 30  # Adam: fp32 param/m/v read+write, grad read, bf16 copy write
MEM_BYTES_PER_TOKEN_H = 40  # norms, activation, dropout, residual: fwd+bwd bytes / (token·h)
# Context parallelism's ring (TE's p2p attention) runs the attention as CP separate kernel calls
# per layer and pass, one per K/V chunk received, and merges them outside the kernel: forward,
# each step's bf16 output is read and folded into an fp32 accumulator rescaled by the
# softmax-LSE correction (2 + 4 + 4 B per output element); backward, each step's dQ is read and
# added into an fp32 dQ (2 + 2 + 4 + 4), the kernel's dot(dO, O) pre-pass re-reads dO and O
# (2 + 2), and the half-chunk slices of Q, O and dO are copied out (about 8) - 34 B per output
# element and step; each step's dK/dV is added into an fp32 buffer too (12 B per K/V element).
# Without CP the kernel does this once, inside, in registers. TE merges a step on its second
# stream while the next step's attention kernel runs, so the last step's merge is exposed and
# an earlier one only where it outlasts a step's attention.
CP_STEP_BYTES_OUT, CP_STEP_BYTES_KV = 34, 12
# Unfused attention (attention_backend unfused / local, Megatron before flash attention) builds
# the whole s x s score matrix per head (no causal skipping) and passes it through HBM: the
# QK^T batched GEMM writes it (2 B), the fused scale-mask-softmax reads and writes it (4), the
# attention dropout reads it and writes its mask and output (5), the PV GEMM reads it (2);
# backward, PV's dgrad writes the probability gradient and its wgrad re-reads the dropped
# probabilities (4), dropout's backward reads gradient and mask and writes (5), softmax's reads
# gradient and output and writes (6), and QK^T's dgrad reads the score gradient twice (4).
SCORE_BYTES = 32


class Term(BaseModel):
    """One part of the step time, seconds per step, with what it assumed."""

    model_config = ConfigDict(frozen=True)

    name: str
    seconds: float
    share: float
    assumes: str


class StepTimeReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    step_time_s: float
    tokens_per_s_per_gpu: float
    model_tflops_per_gpu: float
    mfu: float
    band_s: float
    gpu: str
    precision: str
    num_gpus: int
    num_microbatches: int
    tokens_per_step: int
    model_flops_per_step: float
    breakdown: list[Term]
    assumptions: list[str]


@dataclass(frozen=True, slots=True)
class LayerWork:
    """Forward+backward FLOPs per token of one decoder layer (model-FLOP convention)."""

    attn_linear: float  # token mixer projections (attention / MLA / Mamba / GDN)
    attn_core: float  # QK^T and PV, causal-halved
    ssm_core: float  # Mamba-2 SSD / GatedDeltaNet chunked scan
    dense_mlp: float  # dense MLP and shared experts
    experts: float  # routed experts, top-k active
    scan_bytes: float  # Mamba-2 / GDN mixer's memory-bound bytes per token, fwd+bwd
    counted: float  # FLOPs per token as Bridge's model-FLOP convention counts this layer
    moe: bool
    attention: bool


@dataclass(frozen=True, slots=True)
class ModelWork:
    layers: tuple[LayerWork, ...]
    logits: float  # per token, incl. MTP heads
    mtp: float  # per token, MTP layers' bodies
    mtp_counted: float  # the same as Bridge's model-FLOP convention counts it
    kv_dim: int  # K/V width per token (for CP)
    out_dim: int  # attention output width per token, heads x value head dim (for CP)
    dense_params: int
    expert_params: int


_WORK: dict[tuple[Any, ...], ModelWork] = {}


def model_work(m: ModelSection, seq: int) -> ModelWork:
    key = (shape_key(m), seq)
    hit = _WORK.get(key)
    if hit is not None:
        return hit
    if len(_WORK) > 512:
        _WORK.clear()
    _WORK[key] = work = _build_work(m, seq)
    return work


def _core(m: ModelSection, mixer: str, seq: int) -> float:
    heads = m.num_attention_heads or 1
    if mixer == "mla":
        d_qk, d_v = m.qk_head_dim + m.qk_pos_emb_head_dim, m.v_head_dim
    elif mixer == "attention":
        d_qk = d_v = m.kv_channels or (m.hidden_size or 0) // heads
    else:
        return 0.0
    # fwd: 2 GEMMs x 2 FLOP x heads x d x s, causal half; x3 for fwd+bwd
    return 3.0 * heads * seq * (d_qk + d_v)


SSM_CHUNK = 128  # Megatron-Core's default mamba_chunk_size (SSD)
GDN_CHUNK = 64  # GatedDeltaNet's chunk
# The chunked-scan kernels (Triton, small tiles, register-limited occupancy) run at a rate set by
# SM count x clock, not by the tensor-core peak: a public pure Mamba-2 model (d_model 2048, 48
# layers, bf16) trains at 102.5 / 239 / 360 TFLOP/s on A100 / H200 / GB200
# (state-spaces/mamba#904), where the dense BF16 peak grows 312 / 989 / 2,500. So ``ssm_eff`` is
# a fraction of Hopper's dense BF16 peak, scaled per generation by SM count x clock: A100 108 SMs
# at 1.41 GHz vs H100's 132 at 1.98 (NVIDIA's A100 / H100 specifications); Blackwell by its
# non-tensor FP32 rate (128 lanes per SM, as Hopper): B200/GB200 75 vs H100's 67 TFLOP/s, Blackwell
# Ultra between B300's 75 and GB300's 80 (verda.com's GB300 table, step-time-model.md §1).
SCAN_REF_FLOPS = 989e12
SCAN_SM_SCALE = {"ampere": 0.58, "hopper": 1.0, "blackwell": 1.12, "blackwell_ultra": 1.16}
# A scan mixer's bf16 elementwise traffic per element and token, forward + backward (the
# backward recomputes the conv and the gated norm): the in_proj output (z, x, B, C, dt) turned
# from sequence-first to batch-first and back for its gradient (5 passes); the causal conv1d
# over x, B, C (forward read + write, recomputed, backward reads input and gradient, writes one:
# 7); the chunked-scan kernels over x and y (read x twice, write y; backward about three times
# that: 12); the gated RMSNorm (read y and z, write; backward 5: 8); the output back to
# sequence-first (4).
SCAN_PASSES_INPROJ, SCAN_PASSES_CONV, SCAN_PASSES_INNER = 5, 7, 24
# fp32 chunk states (heads x head_dim x state per chunk) between the scan's kernels: written by
# chunk_state, read and rewritten by state_passing, read by chunk_scan (4); the backward
# recomputes the first three and writes, passes and reads the state gradients (10).
STATE_PASSES, STATE_BYTES = 14, 4


def _gdn_values(m: ModelSection) -> int:
    """A GatedDeltaNet mixer's value width (value heads x head dim), Megatron-Core's defaults."""
    return opt_int(m, "linear_num_value_heads", 32) * opt_int(m, "linear_value_head_dim", 128)


def _ssm_chunk(m: ModelSection) -> int:
    return int(opt_int(m, "mamba_chunk_size", SSM_CHUNK))


def _ssm(m: ModelSection, mixer: str) -> float:
    """Chunked-scan FLOPs per token, fwd+bwd: intra-chunk (Q per element) plus the state
    update and read-out (2 x state per element), 2 FLOP per multiply-add, x3."""
    h = m.hidden_size or 0
    if mixer == "mamba":
        state, _, _, d_inner = _mamba_dims(m, h)
        return 3.0 * 2 * d_inner * (_ssm_chunk(m) + 2 * state)
    if mixer == "gdn":
        d_k = opt_int(m, "linear_key_head_dim", 128)
        return 3.0 * 2 * _gdn_values(m) * (GDN_CHUNK + 2 * d_k)
    return 0.0


def _scan_bytes(m: ModelSection, mixer: str) -> float:
    """A scan mixer's memory-bound bytes per token, forward + backward: the bf16 passes over
    its in_proj output, conv input and inner width, plus the fp32 chunk states the chunked
    scan's kernels hand to each other (d_inner x state / chunk elements per token for Mamba-2,
    values x key width / chunk for GatedDeltaNet)."""
    if mixer == "mamba":
        state, groups, heads, d_in = _mamba_dims(m, m.hidden_size or 0)
        conv = d_in + 2 * groups * state
        bf16 = SCAN_PASSES_INPROJ * (conv + d_in + heads) + SCAN_PASSES_CONV * conv \
            + SCAN_PASSES_INNER * d_in
        states = d_in * state / _ssm_chunk(m)
    elif mixer == "gdn":
        v, d_k = _gdn_values(m), opt_int(m, "linear_key_head_dim", 128)
        qk = d_k * opt_int(m, "linear_num_key_heads", 16)
        conv = 2 * qk + v
        bf16 = SCAN_PASSES_INPROJ * (conv + v) + SCAN_PASSES_CONV * conv \
            + SCAN_PASSES_INNER * v
        states = v * d_k / GDN_CHUNK
    else:
        return 0.0
    return ACT_BYTES * bf16 + STATE_PASSES * STATE_BYTES * states


def _counted_mixer(m: ModelSection, mixer: str) -> float | None:
    """A scan mixer's fwd+bwd FLOPs per token as Bridge's hybrid helpers count them (flop_utils
    mamba_layer_flops / gdn_layer_flops): Mamba with an inner width of 2h whatever the heads
    say, and a 7·d_in·N scan. None: the layer's own FLOPs are the convention's."""
    h = m.hidden_size or 0
    if mixer == "mamba":
        state = opt_int(m, "mamba_state_dim", 128)
        groups, head_dim = opt_int(m, "mamba_num_groups", 8), opt_int(m, "mamba_head_dim", 64)
        d_in = 2 * h
        heads = opt_int(m, "mamba_num_heads", 128) or d_in // head_dim
        return 3.0 * (2 * h * (2 * d_in + 2 * groups * state + heads) + 7 * d_in * state
                      + 2 * d_in * h)
    if mixer == "gdn":
        qk = opt_int(m, "linear_key_head_dim", 128) * opt_int(m, "linear_num_key_heads", 16)
        vh, vd = opt_int(m, "linear_num_value_heads", 32), opt_int(m, "linear_value_head_dim", 128)
        conv, v = opt_int(m, "linear_conv_kernel_dim", 4), _gdn_values(m)
        return 3.0 * 2 * (h * (2 * qk + 2 * v + 2 * vh) + conv * (2 * qk + v) + vh * vd ** 2 * 4
                          + h * v)
    return None


def _layer_work(m: ModelSection, i: int, mixer: str, mlp: str, seq: int) -> LayerWork:
    lp = layer_params(m, i)
    attn_linear, core, ssm = 6.0 * lp.attention, _core(m, mixer, seq), _ssm(m, mixer)
    dense = 6.0 * (lp.dense_mlp + lp.shared_experts + lp.router)
    experts = 6.0 * lp.routed_per_expert * lp.topk
    mixer_counted = _counted_mixer(m, mixer)
    counted = (attn_linear + core + ssm if mixer_counted is None else mixer_counted) \
        + dense + experts
    return LayerWork(attn_linear=attn_linear, attn_core=core, ssm_core=ssm, dense_mlp=dense,
                     experts=experts, scan_bytes=_scan_bytes(m, mixer), counted=counted,
                     moe=mlp == "moe", attention=mixer in ("attention", "mla"))


def _build_work(m: ModelSection, seq: int) -> ModelWork:
    kinds = layer_kinds(m)
    cache: dict[tuple[str, str], LayerWork] = {}
    layers = []
    for i, k in enumerate(kinds):
        lw = cache.get((k.mixer, k.mlp))
        if lw is None:
            lw = cache[(k.mixer, k.mlp)] = _layer_work(m, i, k.mixer, k.mlp, seq)
        layers.append(lw)
    n_mtp = mtp_layers(m)
    h = m.hidden_size or 0
    vocab = vocab_rows(m, tp=1)
    logits = 6.0 * h * vocab * (1 + n_mtp)
    last = layers[-1] if layers else None
    mtp = mtp_counted = 0.0
    if n_mtp and last is not None:
        real = last.attn_linear + last.attn_core + last.ssm_core + last.dense_mlp + last.experts
        mtp, mtp_counted = (n_mtp * (x + 6.0 * 2 * h * h) for x in (real, last.counted))
    heads = m.num_attention_heads or 1
    groups = m.num_query_groups or heads
    kv = 2 * groups * (m.kv_channels or h // heads)
    out = heads * (m.kv_channels or h // heads)
    if any(k.mixer == "mla" for k in kinds):
        kv = m.kv_lora_rank + m.qk_pos_emb_head_dim
        out = heads * m.v_head_dim
    pc = count_params(m, tp=1)
    return ModelWork(layers=tuple(layers), logits=logits, mtp=mtp, mtp_counted=mtp_counted,
                     kv_dim=kv, out_dim=out,
                     dense_params=pc.total - pc.routed_experts,
                     expert_params=pc.routed_experts)


def _precision(d: Derived) -> str:
    p = d.precision
    if p.fp4:
        return "fp4"
    if p.fp8:
        return "fp8"
    return "bf16"


def _peak(gpu: GPUSpec, prec: str) -> float:
    bf16 = gpu.bf16_dense_tflops
    if bf16 is None:
        raise ConfigError("cluster.gpu", f"{gpu.name}: no public dense BF16 peak, so no step "
                                         "time can be computed")
    if prec == "fp4" and gpu.fp4_dense_tflops:
        return gpu.fp4_dense_tflops * 1e12
    if prec in ("fp8", "fp4") and gpu.fp8_dense_tflops:
        return gpu.fp8_dense_tflops * 1e12
    return bf16 * 1e12


def generation(gpu: GPUSpec) -> str:
    """Calibration key: the architecture, Blackwell Ultra (B300, GB300) apart."""
    if gpu.family in ("b300", "gb300"):
        return "blackwell_ultra"
    return gpu.architecture


def _bw(gpu: GPUSpec, span: int, cal: Calibration) -> float:
    """Bus bandwidth (bytes/s) of a group spanning ``span`` consecutive ranks."""
    if span <= gpu.nvlink_domain and gpu.nvlink_gb_s:
        return gpu.nvlink_gb_s * 1e9 * cal.nvlink_eff
    return (gpu.network_gb_s or 50.0) * 1e9 * cal.network_eff


def _stage_layers(d: Derived, n: int) -> list[list[int]]:
    """Decoder layer indices per pipeline stage (chunk c of stage s follows chunk c of s-1)."""
    chunks = d.layers_per_chunk
    if chunks is None:
        raise ConfigError("model.num_layers", "the layers do not split over the pipeline "
                                              "stages; no step time can be computed")
    pp = len(chunks)
    v = max(len(c) for c in chunks)
    out: list[list[int]] = [[] for _ in range(pp)]
    i = 0
    for c in range(v):
        for s in range(pp):
            k = chunks[s][c] if c < len(chunks[s]) else 0
            out[s].extend(range(i, min(i + k, n)))
            i += k
    return out


_KINDS: dict[tuple[int, tuple[tuple[int, ...], ...]], list[list[tuple[LayerWork, int]]]] = {}


def _stage_kinds(work: ModelWork, stages: list[list[int]]) -> list[list[tuple[LayerWork, int]]]:
    """(layer work, count) per stage, cached per model work and split."""
    key = (id(work), tuple(tuple(s) for s in stages))
    hit = _KINDS.get(key)
    if hit is None:
        if len(_KINDS) > 1024:
            _KINDS.clear()
        hit = []
        for idx in stages:
            counts: dict[LayerWork, int] = {}
            for i in idx:
                counts[work.layers[i]] = counts.get(work.layers[i], 0) + 1
            hit.append(list(counts.items()))
        _KINDS[key] = hit
    return hit


def _recompute_share(d: Derived, lw: LayerWork, layers_in_chunk: int
                     ) -> tuple[float, float, float, float, float]:
    """Extra forward fractions (attn_linear, core, dense_mlp, experts, memory-bound ops)
    recompute adds."""
    r = d.recompute
    if r.granularity == "full":
        n = r.num_layers or layers_in_chunk
        f = min(1.0, n / max(1, layers_in_chunk)) if r.method == "block" else 1.0
        return f, f, f, f, f
    mods = set(r.selective)
    # elementwise work: norms about half of a layer's memory-bound bytes, activations the rest
    mem = 0.5 * ("layernorm" in mods) + 0.5 * ("moe_act" in mods and lw.moe) + \
        0.5 * ("mlp" in mods)
    a = 1.0 if "mla_up_proj" in mods else 0.0
    core = 1.0 if "core_attn" in mods else 0.0
    mlp = 1.0 if "mlp" in mods else 0.0
    exp = 1.0 if ("moe" in mods or (mlp and lw.moe)) else 0.0
    if "shared_experts" in mods and lw.moe:
        mlp = max(mlp, 1.0)
    return a * 0.5, core, mlp, exp, min(1.0, mem)


def estimate_step_time(cfg: TrainingConfig | Derived, *, gpu: str | GPUSpec | None = None,
                       calibration: Calibration | None = None) -> StepTimeReport:
    """Predicted time of one global-batch iteration of ``cfg`` on its layout and GPU, with its
    breakdown (ConfigError when the layout, batch or GPU do not determine one)."""
    return _estimate(cfg, gpu, calibration, report=True)  # type: ignore[return-value]


def predict_step_time_s(cfg: TrainingConfig | Derived, *, gpu: str | GPUSpec | None = None,
                        calibration: Calibration | None = None) -> float:
    """The step time alone (the calibration fit and rankers call it many times)."""
    return _estimate(cfg, gpu, calibration, report=False)  # type: ignore[return-value]


@dataclass(slots=True)
class _Ctx:
    """What every phase of one estimate reads: the resolved view, the GPU, the calibration,
    the work per layer and the rates and volumes per micro-batch."""

    d: Derived
    spec: GPUSpec
    cal: Calibration
    work: ModelWork
    prec: str
    peak: float
    eff: float
    gemm_rate: float
    group_rate: float
    attn_rate: float
    ssm_rate: float
    hbm: float
    tok: float
    tok_cp: float
    act: float
    tp_bw: float
    cp_bw: float
    pp_bw: float
    ep_time: float
    tp_exp: float
    overhead: float
    host: float
    chunk_len: int
    unfused: bool  # attention builds the s x s scores in HBM (no flash / fused kernel)


def _setup(cfg: TrainingConfig | Derived, gpu: str | GPUSpec | None,
           calibration: Calibration | None) -> _Ctx:
    """Phase 1: the inputs checked and the rates of this GPU, precision and calibration."""
    d = cfg if isinstance(cfg, Derived) else derive(cfg)
    cal = calibration or load_calibration()
    try:
        spec = gpu if isinstance(gpu, GPUSpec) else (lookup_gpu(gpu) if gpu else d.gpu)
    except ValueError as exc:
        raise ConfigError("gpu", str(exc)) from None
    if spec is None:
        raise ConfigError("cluster.gpu", "set the GPU (cluster.gpu or --gpu) to estimate the "
                                         "step time")
    m, t = d.cfg.model, d.cfg.train
    if d.world_size is None or d.dp is None or d.num_microbatches is None \
            or not t.global_batch_size:
        raise ConfigError("cluster.num_gpus", "the GPU count, global batch and micro-batch "
                                              "size must divide into whole micro-batches")
    seq = m.seq_length
    if not seq or not m.hidden_size:
        raise ConfigError("model.seq_length", "needs the sequence length and model width")
    prec = _precision(d)
    peak = _peak(spec, prec)
    peak_bf16 = spec.bf16_dense_tflops * 1e12  # type: ignore[operator]
    g = cal.gen(generation(spec))
    eff = {"bf16": g.gemm_eff_bf16, "fp8": g.gemm_eff_fp8, "fp4": g.gemm_eff_fp4}[prec]
    tok_cp = t.micro_batch_size * seq / d.cp  # tokens of the CP rank (TP group shares them)
    ep_overlap = bool(d.cfg.overlap.overlap_moe_expert_parallel_comm
                      or opt_field(m, "overlap_moe_expert_parallel_comm", False))
    graphs = cal.graph_overhead_factor if d.graphs.on else 1.0  # what CUDA graphs leave
    return _Ctx(
        d=d, spec=spec, cal=cal, work=model_work(m, seq), prec=prec, peak=peak, eff=eff,
        gemm_rate=peak * eff, group_rate=peak * eff * cal.grouped_gemm_factor,
        attn_rate=peak_bf16 * cal.attn_eff, ssm_rate=_scan_rate(spec, cal),
        hbm=(spec.hbm_tb_s or 3.0) * 1e12 * cal.hbm_eff, tok=tok_cp / d.tp, tok_cp=tok_cp,
        act=tok_cp * m.hidden_size * ACT_BYTES, tp_bw=_bw(spec, d.tp, cal),
        cp_bw=_bw(spec, d.tp * d.cp, cal),
        pp_bw=_bw(spec, d.world_size, cal),
        ep_time=_ep_time(d, spec, cal, tok_cp / d.tp) * cal.ep_exposed
        * (cal.ep_overlap_flag_factor if ep_overlap else 1.0) if d.ep > 1 else 0.0,
        tp_exp=cal.tp_exposed if d.cfg.overlap.tp_comm_overlap else cal.tp_exposed_no_overlap,
        overhead=cal.layer_overhead_us * 1e-6 * graphs, host=cal.layer_host_us * 1e-6 * graphs,
        chunk_len=max(1, max(max(c) for c in d.layers_per_chunk or [[1]])),
        unfused=not fused_attention(m, half_precision=True))


def _scan_rate(spec: GPUSpec, cal: Calibration) -> float:
    """FLOP/s of the chunked-scan kernels: ssm_eff of Hopper's BF16 peak, scaled by the
    generation's SM count x clock (see SCAN_SM_SCALE)."""
    return cal.ssm_eff * SCAN_REF_FLOPS * SCAN_SM_SCALE.get(generation(spec), 1.12)


def _layer_terms(c: _Ctx, lw: LayerWork, n: int, terms: dict[str, float]) -> None:
    """Phase 2a: one kind of layer, ``n`` of them, into the stage's per-micro-batch terms."""
    d, cal, tok, h = c.d, c.cal, c.tok, c.d.cfg.model.hidden_size or 0
    before = sum(terms.values())
    # GEMM-size efficiency: a layer's typical GEMM (forward, one of ~4 projections)
    f_gemm = tok * (lw.attn_linear + lw.dense_mlp) / 12
    size_eff = f_gemm / (f_gemm + cal.gemm_half_flops) if f_gemm > 0 else 1.0
    t_lin = tok * (lw.attn_linear + lw.dense_mlp) / (c.gemm_rate * size_eff)
    t_core = tok * lw.attn_core / c.attn_rate
    if c.unfused and lw.attention:
        t_core = 2 * t_core + _score_time(c)  # full s x s GEMMs, scores through HBM
    t_exp = tok * lw.experts / (c.group_rate * _expert_size_eff(c, lw))
    terms["compute"] += n * (t_lin + t_core + t_exp + tok * lw.ssm_core / c.ssm_rate)
    # about half the elementwise bytes (norms, dropout, residual adds) run on every token of
    # the TP group when sequence parallelism is off
    rep = 0.5 * (d.tp if d.tp > 1 and not d.cfg.model.sequence_parallel else 1) + 0.5
    t_mem = tok * (h * MEM_BYTES_PER_TOKEN_H * (3 if lw.moe else 1) * rep + lw.scan_bytes) \
        / c.hbm
    terms["memory"] += n * t_mem
    fa, fc, fm, fe, fmem = _recompute_share(d, lw, c.chunk_len)
    terms["recompute"] += n * (fa * tok * lw.attn_linear / c.gemm_rate + fc * t_core
                               + fm * tok * lw.dense_mlp / c.gemm_rate + fe * t_exp
                               + fmem * t_mem) / 3.0
    if d.tp > 1:
        # AG + RS around each projection pair, forward and backward; full recompute repeats
        # the forward's half
        n_coll = ((4 if lw.attention or lw.attn_linear else 0) + 4) * \
            (1 + 0.5 * (fa if d.recompute.granularity == "full" else 0.0))
        one = (d.tp - 1) / d.tp * c.act / c.tp_bw + _latency(cal, d.tp)
        terms["tp"] += n * n_coll * one * c.tp_exp
    if d.cp > 1 and lw.attention:
        kv = c.tok_cp * c.work.kv_dim * ACT_BYTES / d.tp
        terms["cp"] += n * 3 * (d.cp - 1) * (kv / c.cp_bw + _latency(cal, 2)) * cal.cp_exposed
        terms["cp"] += n * _cp_merge_time(c, t_core)
    if lw.moe and d.ep > 1:
        terms["ep"] += n * c.ep_time
    # the host launches a layer's kernels in c.host: a layer with less GPU work waits for it
    gpu = (sum(terms.values()) - before) / n
    terms["other"] += n * (c.overhead + max(0.0, c.host - gpu))


def _score_time(c: _Ctx) -> float:
    """HBM time of unfused attention's score matrices (SCORE_BYTES per element, forward and
    backward) for one layer and micro-batch: micro-batch x heads/TP x s x s elements per GPU,
    an s^2 term that flash attention never materialises - large where the micro-batch is
    several sequences and the model narrow (Korthikanti et al.'s 22B: MBS 4, 8 heads a GPU)."""
    m = c.d.cfg.model
    heads, seq = m.num_attention_heads or 1, m.seq_length or 0
    return SCORE_BYTES * c.tok_cp * seq * heads / c.d.tp / c.hbm


def _cp_merge_time(c: _Ctx, t_core: float) -> float:
    """Exposed HBM time of the ring's per-step merges (CP_STEP_BYTES_*) for one attention
    layer and micro-batch, whose attention core takes ``t_core``: the last step's merge, and
    each earlier one's excess over a step's attention (the next kernel hides the rest). Few
    ring steps of short kernels expose most of it - why CP2 trails CP1 at 8K (NeMo's
    Llama3-8B sweep) - while a long sequence over many steps hides all but one."""
    w, cp = c.work, c.d.cp
    per_tok = CP_STEP_BYTES_OUT * w.out_dim + CP_STEP_BYTES_KV * w.kv_dim
    step = c.tok_cp * per_tok / c.d.tp / c.hbm
    return step + (cp - 1) * max(0.0, step - t_core / cp)


def _latency(cal: Calibration, ranks: int) -> float:
    """Start-up time (s) of one collective over ``ranks`` ranks (a send/recv: 2)."""
    return (cal.coll_latency_us + cal.coll_hop_us * (ranks - 2)) * 1e-6


def _ep_time(d: Derived, spec: GPUSpec, cal: Calibration, tok: float) -> float:
    """Dispatch + combine, forward and backward, of one MoE layer and micro-batch (before the
    exposed share). Inside the NVLink domain every copy of a token to another rank crosses
    NVLink. Across nodes the two links work at once: copies to ranks of the same node over
    NVLink, copies to other nodes over the GPU's own NIC, each of the token's top-k copies,
    whatever the dispatcher (counting one copy per remote node for ``flex`` put Qwen3-30B-A3B
    EP16 on two H100 nodes at half its measured step)."""
    m = d.cfg.model
    topk, h, span = m.moe_router_topk or 1, m.hidden_size or 0, d.ep * d.etp
    per_copy = 4 * tok * h * ACT_BYTES
    start = 4 * _latency(cal, 2)  # pairwise exchanges run at once: no per-hop chain
    if span <= spec.nvlink_domain or not spec.nvlink_gb_s:
        return start + per_copy * topk * (d.ep - 1) / d.ep / _bw(spec, span, cal)
    nodes = -(-span // spec.nvlink_domain)
    local = topk * (spec.nvlink_domain // d.etp - 1) / d.ep
    remote = topk * (nodes - 1) / nodes
    return start + per_copy * max(local / _bw(spec, 1, cal), remote / _bw(spec, span, cal))


def _expert_size_eff(c: _Ctx, lw: LayerWork) -> float:
    """Grouped-GEMM size efficiency: each local expert sees tok·EP·topk/E tokens (more EP,
    bigger GEMMs); one of its ~3 projections' forward FLOPs, split over ETP."""
    e = c.d.cfg.model.num_moe_experts or 0
    if not lw.experts or not e:
        return 1.0
    f = c.tok * c.d.ep * lw.experts / (9.0 * e * c.d.etp)
    return f / (f + c.cal.gemm_half_flops)


def _slowest_stage(c: _Ctx) -> tuple[float, dict[str, float]]:
    """Phase 2: per micro-batch, every stage's time by term; the slowest stage sets the pace."""
    d, work = c.d, c.work
    best: tuple[float, dict[str, float]] | None = None
    for s, kinds in enumerate(_stage_kinds(work, _stage_layers(d, len(work.layers)))):
        terms = dict.fromkeys(("compute", "memory", "recompute", "tp", "cp", "ep", "pp",
                               "other"), 0.0)
        for lw, n in kinds:
            _layer_terms(c, lw, n, terms)
        if s == d.pp - 1:
            terms["compute"] += c.tok * (work.logits + work.mtp) / c.gemm_rate
        if d.pp > 1:
            terms["pp"] += 2 * d.vpp * ((c.act / d.tp) / c.pp_bw + _latency(c.cal, 2)) \
                * c.cal.pp_exposed
        total = sum(terms.values())
        if best is None or total > best[0]:
            best = (total, terms)
    assert best is not None
    return best


def _step_extras(c: _Ctx) -> tuple[float, float]:
    """Phase 3: exposed DP/EDP communication (gradient reduce-scatter, or all-reduce without
    the distributed optimizer, and parameter all-gather, once per step) and the optimizer."""
    d, work, cal = c.d, c.work, c.cal
    p = d.precision
    grad_b = 4 if p.grad_reduce_in_fp32 else 2
    param_b = 1 if (p.fp8_param_gather or p.fp4) else 2
    dist = d.cfg.optimizer.use_distributed_optimizer
    dense_local = work.dense_params / (d.tp * d.pp)
    exp_local = work.expert_params / (d.ep * d.etp * d.pp)
    dp = d.dp or 1
    edp, dpcp, span = d.edp or dp, dp * d.cp, (d.world_size or 1) // d.pp

    def dp_time(params: float, n: int) -> float:
        if n <= 1:
            return 0.0
        vol = params * (grad_b + param_b) * (n - 1) / n if dist else \
            params * grad_b * 2 * (n - 1) / n
        return vol / _bw(c.spec, span, cal)

    dp_raw = dp_time(dense_local, dpcp) + dp_time(exp_local, edp)
    dp_exp = dp_raw * (cal.dp_exposed if d.cfg.ddp.overlap_grad_reduce else 1.0)
    shard = (dense_local / dpcp + exp_local / edp) if dist else dense_local + exp_local
    return dp_exp, shard * OPT_BYTES_PER_PARAM / c.hbm


_TERM_NAMES = {
    "compute": ("compute", "GEMMs at the dense peak x calibrated efficiency x F/(F + "
                           "gemm_half_flops) for the layer's GEMM size F, attention core "
                           "at the BF16 peak x attn_eff, experts x grouped_gemm_factor x "
                           "the same size factor for a local expert's tokens (tok·EP·topk/E)"),
    "memory": ("memory-bound ops", "norms/activations/dropout (and Mamba/GDN scan "
                                   "traffic) as bytes over HBM bandwidth x hbm_eff"),
    "recompute": ("recompute", "extra forward of the recomputed modules"),
    "tp": ("exposed comm: TP", "AG/RS (or AR) per layer, NVLink when TP <= domain; "
                               "tp_exposed with tp_comm_overlap, tp_exposed_no_overlap "
                               "without"),
    "cp": ("exposed comm: CP", "ring K/V exchange per attention layer, and the ring's per-step "
                               "fp32 output / gradient merges over HBM"),
    "ep": ("exposed comm: EP", "dispatch+combine all-to-all per MoE layer, NVLink when "
                               "EP x ETP <= domain, else copies within the node over NVLink "
                               "and to other nodes over one NIC per GPU, concurrently"),
    "pp": ("exposed comm: PP", "send/recv per chunk boundary"),
    "other": ("other (host/launch)", "fixed overhead per layer and micro-batch, and the "
                                     "wait for the host where a layer's GPU work is shorter "
                                     "than launching it (layer_host_us); less with CUDA "
                                     "graphs"),
}


def _report(c: _Ctx, step: float, per_mb: dict[str, float], bubble: float, dp_exp: float,
            t_opt: float) -> StepTimeReport:
    """Phase 4: the report: throughput in NVIDIA's model-FLOP convention, the breakdown."""
    d, work, mb, world = c.d, c.work, c.d.num_microbatches or 1, c.d.world_size or 1
    tokens = (d.cfg.train.global_batch_size or 0) * (d.cfg.model.seq_length or 0)
    per_token = sum(lw.counted for lw in work.layers) + work.logits + work.mtp_counted
    flops = per_token * tokens
    tflops = flops / step / world / 1e12
    breakdown = [Term(name=_TERM_NAMES[k][0], seconds=mb * v, share=mb * v / step,
                      assumes=_TERM_NAMES[k][1]) for k, v in per_mb.items()]
    breakdown += [
        Term(name="pipeline bubble", seconds=bubble, share=bubble / step,
             assumes="(PP-1)/VPP stage times (1F1B, interleaved with VPP)"),
        Term(name="exposed comm: DP/EDP", seconds=dp_exp, share=dp_exp / step,
             assumes="grad reduce-scatter + param all-gather once per step, overlap flags"),
        Term(name="optimizer", seconds=t_opt, share=t_opt / step,
             assumes=f"{OPT_BYTES_PER_PARAM} B per local parameter over HBM bandwidth"),
    ]
    assumptions = [
        f"precision {c.prec}: peak {c.peak / 1e12:.0f} TFLOP/s, GEMM efficiency {c.eff:.3f} "
        f"({c.spec.architecture})",
        "balanced MoE routing (as Bridge's benchmarks force); attention core causal-halved",
        "Mamba-2 / GatedDeltaNet scans: chunked-scan FLOPs at ssm_eff x Hopper's BF16 peak x the "
        "GPU's SM count x clock, and their fp32 chunk states and bf16 passes over HBM",
        f"calibration: {c.cal.source or 'seed'}",
    ]
    return StepTimeReport(
        step_time_s=step, tokens_per_s_per_gpu=tokens / step / world,
        model_tflops_per_gpu=tflops, mfu=tflops * 1e12 / c.peak, band_s=step * c.cal.band_frac,
        gpu=c.spec.name, precision=c.prec, num_gpus=world, num_microbatches=mb,
        tokens_per_step=tokens, model_flops_per_step=flops, breakdown=breakdown,
        assumptions=assumptions)


def _estimate(cfg: TrainingConfig | Derived, gpu: str | GPUSpec | None,
              calibration: Calibration | None, *, report: bool) -> StepTimeReport | float:
    """Setup, the slowest stage per micro-batch, the schedule (M stage times plus the bubble),
    DP/EDP and the optimizer; the report when asked for."""
    c = _setup(cfg, gpu, calibration)
    t_stage, per_mb = _slowest_stage(c)
    dp_exp, t_opt = _step_extras(c)
    bubble = (c.d.pp - 1) / c.d.vpp * t_stage
    step = (c.d.num_microbatches or 1) * t_stage + bubble + dp_exp + t_opt
    if not report:
        return step
    return _report(c, step, per_mb, bubble, dp_exp, t_opt)
