"""Per-GPU, per-pipeline-stage training memory: ``estimate_memory(cfg) -> MemoryReport``.

Why per stage: pipeline stages differ (the first holds the embedding and the most micro-batches
in flight, the last the output layer, the fp32 logits and MTP heads), so "will it fit, and on
which rank does it break" needs every stage, not an average. Each stage's peak is

    static (weights + grads + optimizer state)
    + activations (per-micro-batch bytes of each chunk x micro-batches in flight)
    + transient working set (one layer's backward, a recompute unit, the logits upcast)
    + resident allocator workspaces,

the larger of the forward/backward phase and the optimizer step; with per-layer Transformer
Engine CUDA graphs also of the graphed steady state that follows the eager warm-up iterations
(memory.graphs). Overheads outside the allocator (CUDA context, NCCL, CUDA-graph pools) and the
allocator's reserved band are reported next to it, never inside it.

Fast by construction: parameters per layer kind are cached per model shape, layers of a chunk
are counted by kind from prefix sums, and report objects are built without re-validation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer

from mbridge_perf.config.derived import Derived, resolve_precision
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.layers import lora_spec, opt_int
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.semantics import Graphs
from mbridge_perf.config.semantics import graphs as graphs_of
from mbridge_perf.memory import overheads as ov
from mbridge_perf.memory.activations import (
    ActContext,
    context,
    group_input_bytes,
    layer_terms,
)
from mbridge_perf.memory.bridge_result import BridgeComparison
from mbridge_perf.memory.graphs import (
    graph_exec_gib,
    graph_vectors,
    graphed_assumption,
    graphed_state,
)
from mbridge_perf.memory.params import padded_vocab_size
from mbridge_perf.memory.pipeline import in_flight
from mbridge_perf.memory.placement import Placement, placement
from mbridge_perf.memory.state import (
    AdapterShape,
    Shape,
    adapter_shape,
    model_shape,
    peft_assumption,
    state_rates,
)
from mbridge_perf.memory.verdict import MARGIN_SOURCE, Verdict, judge

GIB = 2**30
_INV_GIB = 1 / GIB


def _round3(value: float) -> float:
    return round(value, 3)


Gib = Annotated[float, PlainSerializer(_round3, return_type=float)]
"""GiB (2^30 bytes), kept unrounded in memory and written with three decimals."""


# ---------------------------------------------------------------------------------------------
# report models (the MCP tool contract uses these names)


class StageMemory(BaseModel):
    """One pipeline stage (PP rank): what one GPU of that stage holds."""

    model_config = ConfigDict(frozen=True)

    stage: int
    layers: tuple[int, ...] = Field(description="transformer layer indices on this stage")
    layers_per_chunk: tuple[int, ...] = Field(description="transformer layers per virtual chunk")
    embedding: bool = Field(description="holds the input embedding")
    output_layer: bool = Field(description="holds the final norm, output layer and loss")
    mtp_layers: int = Field(description="multi-token-prediction layers on this stage")
    params: int = Field(description="parameters on one GPU of this stage")
    expert_params: int = Field(description="of which routed-expert parameters")
    weights_gib: Gib
    grads_gib: Gib
    optimizer_gib: Gib = Field(description="master weights and optimizer moments on the GPU")
    static_gib: Gib = Field(description="weights + grads + optimizer state")
    activation_per_microbatch_gib: Gib = Field(
        description="bytes saved for backward by one micro-batch through every chunk")
    in_flight_microbatches: Gib = Field(
        description="micro-batches held at the peak, in units of whole-stage micro-batches")
    in_flight_per_chunk: tuple[int, ...]
    activations_gib: Gib = Field(description="all activations held at the peak")
    embedding_activations_gib: Gib = Field(description="part of activations: embedding")
    logits_gib: Gib = Field(description="part of activations: final norm, output layer "
                                          "input and fp32 logits kept by the loss")
    mtp_activations_gib: Gib = Field(description="part of activations: MTP layers and heads")
    transient_gib: Gib = Field(description="working set at the peak: one layer's backward, "
                                             "a recompute unit, the logits upcast")
    workspace_gib: Gib = Field(description="resident cuBLAS / TE workspaces in the allocator")
    peak_allocated_gib: Gib
    graphed_peak_allocated_gib: Gib | None = Field(
        description="steady-state peak once per-layer Transformer Engine CUDA graphs replay "
                    "(graphed modules' saved tensors in the graph pool; the graphs' static "
                    "inputs, shared across micro-batches, allocated); None without "
                    "them. peak_allocated_gib is the larger of this and the eager warm-up")
    graph_pool_gib: Gib | None = Field(
        None, description="the graphs' private pool in that steady state: the graphed saved "
                          "tensors of the layer-micro-batches in flight, reserved (not "
                          "allocated) for the graphs' lifetime; None without per-layer TE "
                          "graphs")
    peak_phase: Literal["forward_backward", "optimizer_step"]


class LayerKindActivation(BaseModel):
    """Per-layer activation of one kind of layer (one micro-batch, one GPU)."""

    model_config = ConfigDict(frozen=True)

    mixer: str
    mlp: str
    fp8: bool
    count: int = Field(description="layers of this kind in the model")
    per_layer_gib: Gib
    terms_gib: dict[str, Gib]


class Overheads(BaseModel):
    """Memory outside the allocator's "allocated" count, per GPU."""

    model_config = ConfigDict(frozen=True)

    cuda_context_gib: Gib
    nccl_gib: Gib
    cuda_graphs_gib: Gib = Field(description="instantiated CUDA graphs (driver-owned)")
    total_gib: Gib


class Phase(BaseModel):
    """What the process holds in one phase of the run, on the stage that needs the most in it:
    allocated (what torch.cuda.memory_allocated and Megatron's memory log show), the CUDA-graph
    private pool (reserved, not allocated), the reserved-but-unallocated band (low, high), the
    memory outside the allocator, and their sum at the band's two ends."""

    model_config = ConfigDict(frozen=True)

    phase: Literal["eager", "graphed_steady_state"]
    stage: int
    allocated_gib: Gib
    private_pool_gib: Gib
    reserved_band_gib: tuple[Gib, Gib]
    outside_gib: Gib
    need_gib: tuple[Gib, Gib]


class MemoryReport(BaseModel):
    """Per-GPU training memory of a configuration, stage by stage."""

    model_config = ConfigDict(frozen=True)

    per_stage: list[StageMemory]
    most_loaded_stage: int
    peak_allocated_gib: Gib = Field(description="peak allocated on the most-loaded stage")
    reserved_band_gib: tuple[Gib, Gib] = Field(
        description="allocator reserved-but-unallocated band (low, high) at that peak")
    overheads: Overheads
    gpu: str | None
    gpu_capacity_gib: Gib | None
    phases: list[Phase] = Field(
        description="per phase (eager warm-up; graphed steady state with per-layer TE graphs) "
                    "what the process holds; the fit is the largest need over them")
    need_gib: tuple[Gib, Gib] = Field(
        description="the largest (allocated + private pools + band + outside) over the phases, "
                    "at the low and the high end of the reserved band")
    verdict: Verdict | None = Field(
        description="fits: fits at the high end of the band with the estimator's margin; "
                    "tight: the decision flips inside the band or the margin; does_not_fit: "
                    "over even at the band's low end by more than the margin; None: no GPU")
    verdict_term: str = Field(description="the term that decides the verdict, with figures")
    margin: str = Field(MARGIN_SOURCE, description="where the estimator's margin comes from")
    fits: bool | None = Field(description="verdict == 'fits'")
    fits_with_fragmentation: bool | None = Field(
        description="the need at the high end of the reserved band <= capacity")
    headroom_gib: Gib | None = Field(
        description="capacity - the need at the low end of the reserved band")
    total_params: int
    layer_activations: list[LayerKindActivation]
    parallelism: dict[str, int | None]
    warnings: list[str]
    assumptions: list[str]
    not_modeled: list[str]
    answer_markdown: str = Field(
        "", description="the estimate as the memory skill answers it (most-loaded stage, fit, "
                        "levers in order); filled by memory.answer.estimate_with_answer")
    bridge: BridgeComparison | None = Field(
        None, description="Megatron Bridge's own estimate_training_memory lined up with ours "
                          "term by term (live on a ConfigContainer through mbridge_perf.api, or "
                          "Bridge 0.6.2's recorded result for an unmodified shipped recipe), "
                          "or one line saying why it is not shown")


NOT_MODELED = (
    "MoE dispatcher workspaces (DeepEP / HybridEP buffers, permutation scratch) beyond the "
    "dispatched tokens",
    "token-routing imbalance beyond the given imbalance factor (per-EP-rank loads differ)",
    "memory of the first iteration before the optimizer state exists, checkpoint loading and "
    "evaluation passes",
    "vision encoders; under LoRA, activations are priced as for full fine-tuning (an upper "
    "bound) and LoRA dropout masks and DoRA magnitude vectors are not counted",
    "packed (THD) sequences and variable-length batches",
    "allocator rounding (512-byte blocks) and the exact fragmentation of a run (given as a band)",
)


# ---------------------------------------------------------------------------------------------
# per-kind activation numbers


class _Kinds:
    """Per-layer bytes of each (kind, fp8, selective) and each kind's backward working set,
    for one activation context; shared by every estimate with the same context and shape."""

    __slots__ = ("_graphed", "_summ", "_terms", "_vectors", "_ws", "c", "kinds")

    def __init__(self, c: ActContext, kinds: tuple[tuple[str, str], ...]) -> None:
        self.c = c
        self.kinds = kinds
        self._terms: dict[tuple[int, bool, bool], tuple[float, dict[str, float]]] = {}
        self._ws: dict[int, float] = {}
        self._summ: dict[tuple[int, bool], tuple[float, dict[str, float]]] = {}
        self._vectors: dict[tuple[bool, bool], tuple[list[float], list[float], list[float]]] = {}
        self._graphed: dict[tuple[tuple[str, ...], int],
                           tuple[list[float], list[float], list[float]]] = {}

    def get(self, kind: int, fp8: bool, selective: bool = True) -> tuple[float, dict[str, float]]:
        key = (kind, fp8, selective)
        hit = self._terms.get(key)
        if hit is None:
            mixer, mlp = self.kinds[kind]
            terms = layer_terms(self.c, mixer, mlp, fp8, selective=selective)
            hit = (sum(terms.values()), terms)
            self._terms[key] = hit
        return hit

    def summary(self, kind: int, fp8: bool) -> tuple[float, dict[str, float]]:
        """Total bytes and the non-zero terms in GiB (cached; callers copy the dict)."""
        hit = self._summ.get((kind, fp8))
        if hit is None:
            total, terms = self.get(kind, fp8)
            hit = (total, {k: v * _INV_GIB for k, v in terms.items() if v})
            self._summ[(kind, fp8)] = hit
        return hit

    def total(self, kind: int, fp8: bool, selective: bool = True) -> float:
        hit = self._terms.get((kind, fp8, selective))
        return hit[0] if hit is not None else self.get(kind, fp8, selective)[0]

    def vectors(self, selective: bool, fp8_on: bool) -> tuple[list[float], list[float],
                                                              list[float]]:
        """Per kind: BF16 bytes, FP8 bytes (the BF16 list when no layer runs in FP8) and the
        backward working set (cached; callers only read the lists)."""
        hit = self._vectors.get((selective, fp8_on))
        if hit is None:
            n = range(len(self.kinds))
            bf16 = [self.total(k, False, selective) for k in n]
            fp8 = [self.total(k, True, selective) for k in n] if fp8_on else bf16
            hit = self._vectors[(selective, fp8_on)] = (bf16, fp8,
                                                        [self.working_set(k) for k in n])
        return hit

    def graphed(self, scopes: tuple[str, ...],
                seq_length: int) -> tuple[list[float], list[float], list[float]]:
        """Per kind: BF16 and FP8 bytes of one layer's saved tensors that sit in the graph pool
        once per-layer TE graphs replay, and the static-input bytes of one graphed
        layer-micro-batch (memory.graphs; cached)."""
        key = (scopes, seq_length)
        hit = self._graphed.get(key)
        if hit is None:
            hit = self._graphed[key] = graph_vectors(
                self.c, self.kinds, lambda kind, fp8: self.get(kind, fp8)[1], scopes,
                seq_length)
        return hit

    def working_set(self, kind: int) -> float:
        """Transient bytes of one layer's backward, plus what recompute rebuilds for it: full
        recompute re-runs ``c.full_window`` whole layers on top of what the micro-batch keeps
        (uniform: its largest group; block: one layer, only where a chunk is checkpointed whole,
        else the kept layers it freed first make room; memory.recompute)."""
        hit = self._ws.get(kind)
        if hit is None:
            c = self.c
            mixer, mlp = self.kinds[kind]
            hit = _working_set(c, mixer, mlp)
            if c.full is not None:
                hit += self.total(kind, False, False) * c.full_window
            elif c.selective:
                hit += self.total(kind, False, False) - self.total(kind, False)
            self._ws[kind] = hit
        return hit


_KIND_CACHE: dict[tuple[ActContext, tuple[tuple[str, str], ...]], _Kinds] = {}


def _kinds_for(c: ActContext, kinds: tuple[tuple[str, str], ...]) -> _Kinds:
    key = (c, kinds)
    hit = _KIND_CACHE.get(key)
    if hit is None:
        if len(_KIND_CACHE) > 512:
            _KIND_CACHE.clear()
        hit = _KIND_CACHE[key] = _Kinds(c, kinds)
    return hit


def _working_set(c: ActContext, mixer: str, mlp: str) -> float:
    """Transient bytes while one layer runs its backward: gradients of its input and residual,
    the sequence-parallel all-gathered input, and the largest intermediate gradient."""
    e, n, h, t = c.e, c.n, c.h, c.t
    base = 2 * e * n * h / c.tsp + (e * n * h if c.tsp > 1 else 0.0)
    if mlp == "dense":
        f = c.ffn
        mlp_ws = e * n / t * ((2 * f if c.glu else f) + f)
    elif mlp == "moe":
        routed = c.topk * n / c.tsp * c.etp * c.imbalance
        w = c.moe_ffn / c.etp
        mlp_ws = e * routed * ((2 * w if c.glu else w) + w + 2 * h)
    else:
        mlp_ws = 0.0
    a_l = max(c.heads // t, 1)
    if mixer in ("attention", "mla") and not c.fused_attn:
        attn_ws = 2 * e * c.b * a_l * c.s * c.s
    elif mixer == "mla":
        attn_ws = e * n * a_l * (3 * (c.qk_head + c.qk_rope) + c.v_head)
    elif mixer == "attention":
        attn_ws = e * n * (a_l + 2 * max(c.groups // t, 1)) * c.head_dim
    else:
        attn_ws = 0.0
    return base + max(mlp_ws, attn_ws)


# ---------------------------------------------------------------------------------------------
# the layout plan: what each stage holds, independent of batch, precision bytes and recompute
# modules (cached per model shape x pipeline layout x sharding)


@dataclass(frozen=True, slots=True)
class _ChunkPlan:
    embedding: bool
    loss: bool
    mtp: int
    layers: tuple[tuple[int, int, int], ...]
    """(kind, FP8 layers, BF16 layers) of the chunk's transformer layers."""
    groups: int
    """Full recompute: checkpointed groups (each keeps its input)."""
    kept: tuple[tuple[int, int, int], ...]
    """Full ``block`` recompute: layers left whole, as (kind, FP8, BF16)."""


@dataclass(frozen=True, slots=True)
class _StagePlan:
    chunks: tuple[_ChunkPlan, ...]
    layers: tuple[int, ...]
    layers_per_chunk: tuple[int, ...]
    embedding: bool
    output_layer: bool
    mtp_layers: int
    dense: float
    expert: float
    fp8_dense: float
    fp8_expert: float
    kinds: tuple[int, ...]
    lora_dense: float = 0.0
    """PEFT: LoRA adapter parameters on one GPU of this stage (the trainable ones; the base
    counted in dense / expert is frozen), non-expert and expert."""
    lora_expert: float = 0.0


_PLANS: dict[tuple[Any, ...], tuple[Shape, Placement, tuple[_StagePlan, ...],
                                    AdapterShape | None]] = {}


@dataclass(slots=True)
class _PlanArgs:
    """What a stage plan is priced from (one model shape on one layout)."""

    shape: Shape
    tp: int
    ep_etp: int
    vocab_rows: int
    bf16_lo: int
    bf16_hi: int
    full: str | None
    full_n: int
    fp8_on: bool
    lora: AdapterShape | None
    ad_kind: tuple[tuple[float, float], ...]
    ad_mtp: tuple[tuple[float, float], ...]


@dataclass(slots=True)
class _Acc:
    """A stage's parameters as its chunks are added up."""

    dense: float = 0.0
    expert: float = 0.0
    fp8_dense: float = 0.0
    fp8_expert: float = 0.0
    lora_dense: float = 0.0
    lora_expert: float = 0.0
    kinds: set[int] = field(default_factory=set)


def _fp8_layers(a: _PlanArgs, k: int, lo: int, hi: int, cnt: int) -> int:
    """Layers of kind ``k`` in [lo, hi) that run in FP8 (the first / last stay BF16)."""
    if not a.fp8_on:
        return 0
    sh = a.shape
    return cnt - (sh.count(k, lo, max(min(hi, a.bf16_lo), lo))
                  + sh.count(k, max(lo, a.bf16_hi), max(hi, a.bf16_hi)))


def _layer_mix(a: _PlanArgs, acc: _Acc, lo: int, hi: int) -> tuple[tuple[int, int, int], ...]:
    """The chunk's decoder layers by kind (kind, FP8 count, BF16 count), their parameters and
    adapters added to the stage."""
    mix = []
    for k, bucket in enumerate(a.shape.buckets):
        cnt = a.shape.count(k, lo, hi)
        if not cnt:
            continue
        acc.kinds.add(k)
        n_fp8 = _fp8_layers(a, k, lo, hi, cnt)
        mix.append((k, n_fp8, cnt - n_fp8))
        acc.dense += cnt * (bucket.tp_sharded / a.tp + bucket.replicated)
        acc.expert += cnt * bucket.routed / a.ep_etp
        acc.fp8_dense += n_fp8 * bucket.tp_sharded / a.tp
        acc.fp8_expert += n_fp8 * bucket.routed / a.ep_etp
        if a.ad_kind:
            acc.lora_dense += cnt * a.ad_kind[k][0]
            acc.lora_expert += cnt * a.ad_kind[k][1]
    return tuple(mix)


def _recompute_groups(a: _PlanArgs, num_layers: int, lo: int,
                      hi: int) -> tuple[int, tuple[tuple[int, int, int], ...]]:
    """Full recompute: the checkpointed groups of the chunk and, for ``block``, the layers
    after the first N that keep their activations (kind, FP8, BF16)."""
    if a.full is None or not num_layers:
        return 0, ()
    if a.full == "uniform":
        return -(-num_layers // a.full_n), ()
    start = min(lo + a.full_n, hi)
    kept = []
    for k in range(len(a.shape.buckets)):
        cnt = a.shape.count(k, start, hi)
        if cnt:
            n_fp8 = _fp8_layers(a, k, start, hi, cnt)
            kept.append((k, n_fp8, cnt - n_fp8))
    return start - lo, tuple(kept)


def _chunk_extras(a: _PlanArgs, acc: _Acc, ch: Any) -> int:
    """The embedding, output layer and MTP layers a chunk holds; returns its MTP depth."""
    sh, h, tp, vocab = a.shape, a.shape.h, a.tp, a.vocab_rows
    if ch.embedding:
        acc.dense += vocab * h / tp + sh.positions
    if ch.loss:
        acc.dense += sh.final_norm
        if not sh.tied or not ch.embedding:
            acc.dense += vocab * h / tp
        if a.lora is not None and a.lora.output_rank:
            acc.lora_dense += a.lora.output_rank * (h + vocab) / tp
    mtp = ch.mtp if sh.mtp else 0  # a hybrid pattern without MTP parts builds none
    if mtp:
        if not ch.embedding:  # MTP embeds its shifted tokens with its own copy
            acc.dense += vocab * h / tp + sh.positions
        # one layer's parameters serve every depth when Megatron-Core repeats it
        for b in sh.mtp[:mtp]:
            acc.dense += b.tp_sharded / tp + b.replicated
            acc.expert += b.routed / a.ep_etp
            if a.fp8_on:
                acc.fp8_dense += b.tp_sharded / tp
                acc.fp8_expert += b.routed / a.ep_etp
        for a_dense, a_expert in a.ad_mtp[:mtp]:
            acc.lora_dense += a_dense
            acc.lora_expert += a_expert
        acc.kinds.update(sh.mtp_kinds)
    return mtp


def _stage_plan(a: _PlanArgs, chunks: Any) -> _StagePlan:
    acc = _Acc()
    cplans = []
    for ch in chunks:
        lo, hi = ch.first_layer, ch.first_layer + ch.num_layers
        mix = _layer_mix(a, acc, lo, hi)
        groups, kept = _recompute_groups(a, ch.num_layers, lo, hi)
        mtp = _chunk_extras(a, acc, ch)
        cplans.append(_ChunkPlan(embedding=ch.embedding, loss=ch.loss, mtp=mtp, layers=mix,
                                 groups=groups, kept=kept))
    return _StagePlan(
        chunks=tuple(cplans), layers=tuple(i for ch in chunks for i in ch.layers),
        layers_per_chunk=tuple(ch.num_layers for ch in chunks),
        embedding=any(ch.embedding for ch in chunks),
        output_layer=any(ch.loss for ch in chunks), mtp_layers=sum(cp.mtp for cp in cplans),
        dense=acc.dense, expert=acc.expert, fp8_dense=acc.fp8_dense, fp8_expert=acc.fp8_expert,
        kinds=tuple(sorted(acc.kinds)), lora_dense=acc.lora_dense, lora_expert=acc.lora_expert)


def _plan(shape: Shape, place: Placement, tp: int, ep_etp: int, vocab_rows: int, bf16_lo: int,
          bf16_hi: int, full: str | None, full_n: int, fp8_on: bool, etp: int = 1,
          lora: AdapterShape | None = None) -> tuple[_StagePlan, ...]:
    """What every stage holds: parameters by kind and precision, adapters, the chunks'
    layers and recompute groups (cached per shape and layout)."""
    # shapes and placements are cached objects: key on identity, check it on a hit (adapter
    # shapes too; their spec is the rest of what they depend on)
    key = (id(shape), id(place), tp, ep_etp, vocab_rows, bf16_lo, bf16_hi, full, full_n, fp8_on,
           etp, id(lora))
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is shape and hit[1] is place and hit[3] is lora:
        return hit[2]
    if len(_PLANS) > 512:
        _PLANS.clear()
    # LoRA adapters per GPU of one layer of each kind / one MTP layer: non-expert ones over TP,
    # expert ones over ETP (one set per EP rank) or EP x ETP (one per expert)
    ad_kind: tuple[tuple[float, float], ...] = ()
    ad_mtp: tuple[tuple[float, float], ...] = ()
    if lora is not None:
        ad_kind = tuple((x.tp_sharded / tp, x.expert_shared / etp + x.expert_each / ep_etp)
                        for x in lora.kinds)
        ad_mtp = tuple((x.tp_sharded / tp, x.expert_shared / etp + x.expert_each / ep_etp)
                       for x in lora.mtp)
    args = _PlanArgs(shape, tp, ep_etp, vocab_rows, bf16_lo, bf16_hi, full, full_n, fp8_on,
                     lora, ad_kind, ad_mtp)
    out = tuple(_stage_plan(args, chunks) for chunks in place)
    _PLANS[key] = (shape, place, out, lora)
    return out


_WEIGHTS: dict[tuple[Any, ...], tuple[tuple[_StagePlan, ...], tuple[Any, ...]]] = {}


def _stage_weights(plans: tuple[_StagePlan, ...], counts: tuple[tuple[int, ...], ...],
                   selective: bool, offload_layers: int) -> tuple[Any, ...]:
    """Per stage, how many layer-micro-batches of each (kind, FP8 / BF16) and how many
    embedding / loss / MTP / recompute-group terms its activations hold: in flight at the peak
    (weighted by each chunk's in-flight count) and for one micro-batch. Activations are then a
    short dot product with the per-kind bytes (cached per plan and schedule). Each row is
    (stage, plan, in-flight counts, in-flight rows, group / embedding / loss / MTP weights,
    twin, per-micro-batch part); the twin is the first stage that differs from this one in
    in-flight counts only."""
    key = (id(plans), counts, selective, offload_layers)
    hit = _WEIGHTS.get(key)
    if hit is not None and hit[0] is plans:
        return hit[1]
    if len(_WEIGHTS) > 512:
        _WEIGHTS.clear()
    out: list[tuple[Any, ...]] = []
    twins: dict[tuple[Any, ...], int] = {}
    for sp, cnts in zip(plans, counts, strict=True):
        rows: dict[int, list[float]] = {}
        gw = gu = ew = eu = lw = lu = mw = mu = 0.0
        for i, ch in enumerate(sp.chunks):
            cnt = cnts[i]
            scale = 1.0
            nl = sp.layers_per_chunk[i]
            if offload_layers and nl > 1:  # offloaded layers keep nothing on the GPU
                scale = 1 - min(offload_layers, nl - 1) / nl
            for k, nf, nb in (ch.layers if selective else ch.kept):
                row = rows.setdefault(k, [0.0, 0.0, 0.0, 0.0])
                row[0] += cnt * nf * scale
                row[1] += cnt * nb * scale
                row[2] += nf * scale
                row[3] += nb * scale
            if not selective:
                gw += cnt * ch.groups * scale
                gu += ch.groups * scale
            if ch.embedding:
                ew += cnt
                eu += 1
            if ch.loss:
                lw += cnt
                lu += 1
            if ch.mtp:
                mw += cnt * ch.mtp
                mu += ch.mtp
        unit = (tuple((k, v[2], v[3]) for k, v in rows.items()), gu, eu, lu, mu)
        # stages equal in all but their in-flight counts share the values that only depend on
        # what they hold (state, per-micro-batch activations, working set)
        twin = twins.setdefault((sp.dense, sp.expert, sp.fp8_dense, sp.fp8_expert, sp.kinds,
                                 sp.embedding, sp.output_layer, sp.mtp_layers, sp.lora_dense,
                                 sp.lora_expert, unit), len(out))
        out.append((len(out), sp, cnts, tuple((k, v[0], v[1]) for k, v in rows.items()), gw,
                    ew, lw, mw, twin, unit))
    result = tuple(out)
    _WEIGHTS[key] = (plans, result)
    return result


@lru_cache(maxsize=1024)
def _all_in_flight(pp: int, vpp: int, mbs: int | None, group: int | None) -> tuple[
        tuple[int, ...], ...]:
    return tuple(tuple(in_flight(pp, vpp, r, mbs, group)) for r in range(pp))


_setattr = object.__setattr__
_new = object.__new__
# every field is always given: copying a ready set is cheaper than hashing the dict's keys
_FIELDS_SET: dict[type[BaseModel], set[str]] = {
    cls: set(cls.model_fields) for cls in (StageMemory, LayerKindActivation, Overheads,
                                           Phase, MemoryReport)}


def _make(cls: type[Any], values: dict[str, Any]) -> Any:
    """Build a report model from values this module computed (already valid): pydantic's
    ``model_construct`` minus its per-field default handling, which dominated the run time.
    Every field is given, so the fields-set is the model's field names (a fresh copy per
    object, as pydantic keeps it mutable)."""
    obj = _new(cls)
    _setattr(obj, "__dict__", values)
    _setattr(obj, "__pydantic_fields_set__", _FIELDS_SET[cls].copy())
    _setattr(obj, "__pydantic_extra__", None)
    _setattr(obj, "__pydantic_private__", None)
    return obj




# ---------------------------------------------------------------------------------------------
# the estimate


def _require(cfg: TrainingConfig) -> None:
    m = cfg.model
    if (m.num_layers is not None and m.hidden_size is not None
            and m.num_attention_heads is not None and m.seq_length is not None
            and m.vocab_size is not None):
        return  # the usual case, without the loop below
    for name, what in (("num_layers", "the number of transformer layers"),
                       ("hidden_size", "the model width"),
                       ("num_attention_heads", "the number of attention heads"),
                       ("seq_length", "the training sequence length"),
                       ("vocab_size", "the tokenizer vocabulary size")):
        if getattr(m, name) is None:
            raise ConfigError(f"model.{name}", f"required to estimate memory; set {what} "
                                               "(or start from a preset)")


def _gpu(cfg: TrainingConfig, gpu: str | None) -> tuple[str | None, float | None, str | None]:
    name = gpu or cfg.cluster.gpu
    if not name:
        return None, None, None
    try:
        return _gpu_spec(name)
    except ValueError as exc:
        raise ConfigError("gpu" if gpu else "cluster.gpu", str(exc)) from None


@lru_cache(maxsize=64)
def _gpu_spec(name: str) -> tuple[str, float, str]:
    spec = lookup_gpu(name)
    return spec.name, spec.capacity_gib, spec.architecture


_NOTES: dict[tuple[Any, ...], tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {}


@dataclass(slots=True)
class _Setup:
    """Everything resolved once per estimate, before any stage is priced: precision, GPU,
    shape, placement, activation context, parallel sizes, state rates and the layout plan."""

    cfg: TrainingConfig
    d: Derived
    graph_view: Graphs
    p: Any
    gpu_name: str | None
    capacity: float | None
    arch: str | None
    shape: Shape
    place: Placement
    c: ActContext
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    world: int | None
    is_moe: bool
    dp: int
    edp: int
    mbs: int | None
    rates: Any
    vocab_rows: int
    kinds: _Kinds
    fp8_on: bool
    bf16_lo: int
    bf16_hi: int
    plans: tuple[_StagePlan, ...]
    assumptions: list[str]
    graphs: tuple[str, ...] | None
    """Per-layer TE CUDA graph modules (() = whole layers), None when layers run eager."""
    lora: AdapterShape | None = None
    """PEFT: the LoRA adapters of the config's peft section (the base is frozen); None
    without one."""


@dataclass(slots=True)
class _Terms:
    """Per-micro-batch bytes of the pieces a stage holds (embedding, loss, recompute-group
    input, MTP) and the resident / transient extras, shared by every stage."""

    emb_act: float
    loss_act: float
    loss_ws: float
    ckpt: float
    mtp_one: float
    workspace: float
    fsdp_ws: float
    step_tmp: float
    offload_layers: int


def _expert_dp(d: Derived, world: int, assumptions: list[str]) -> int:
    """Expert DP = world / (ETP·EP·PP). A world the user gave must hold the expert mesh; one a
    Bridge dump only implies (comm_overlap.data_parallel_size x TP·PP·CP) is what the recipe
    was written for, not what it must launch on, so it is sized anyway and said so."""
    ex_size = d.expert_model_parallel_size
    if world % ex_size == 0:
        return world // ex_size
    if not d.world_from_dump:
        raise ConfigError("cluster.num_gpus", f"{world} GPUs do not divide by ETP x EP x PP = "
                                              f"{ex_size}; use a multiple")
    edp = max(world // ex_size, 1)
    assumptions.append(
        f"the {world} GPUs this dump implies (comm_overlap.data_parallel_size x TP·PP·CP) do "
        f"not divide by the expert mesh ETP x EP x PP = {ex_size}: sized with expert DP = {edp}; "
        f"launch on a multiple of {math.lcm(world, ex_size)} GPUs (set cluster.num_gpus)")
    return edp


def _sizes(d: Derived, assumptions: list[str]) -> tuple[int, int, int | None]:
    """DP, expert DP and micro-batches per step (None: not determined) from the resolved
    view, where the estimator needs them whole: a world both meshes divide (else sized from
    the smallest world, said so) and a global batch the data-parallel micro-batches divide."""
    world, cfg = d.world_size, d.cfg
    if world is None:
        dp = edp = 1
        assumptions.append("cluster.num_gpus not given: assumed the smallest world for this "
                           f"layout ({d.min_gpus} GPUs), so DP = 1 and nothing is "
                           "sharded by the distributed optimizer")
    else:
        mp_size = d.model_parallel_size
        if world % mp_size:
            raise ConfigError("cluster.num_gpus", f"{world} GPUs do not divide by TP x PP x CP "
                                                  f"= {mp_size}; use a multiple")
        dp = world // mp_size
        edp = _expert_dp(d, world, assumptions) if d.is_moe else 1
    mbs = None
    gbs = cfg.train.global_batch_size
    if gbs is not None and world is not None:
        per_step = cfg.train.micro_batch_size * dp
        if gbs % per_step:
            raise ConfigError("train.global_batch_size",
                              f"{gbs} is not a multiple of micro_batch_size x DP = "
                              f"{per_step}; fix the batch sizes")
        mbs = gbs // per_step
    else:
        assumptions.append("train.global_batch_size or cluster.num_gpus not given: assumed "
                           "enough micro-batches to fill the pipeline")
    return dp, edp, mbs


def _resolve(cfg: TrainingConfig, gpu: str | None, imbalance: float) -> _Setup:
    """Phase 1: resolve precision, GPU, derived sizes and the layout plan once up front."""
    _require(cfg)
    m = cfg.model
    extras = m.__pydantic_extra__ or {}
    d = Derived(cfg)  # its plain properties only here: the cached ones take a lock each
    p = resolve_precision(cfg)
    gpu_name, capacity, arch = _gpu(cfg, gpu)
    shape = model_shape(m)
    place = placement(m)
    c = context(cfg, imbalance=imbalance, precision=p, shape_kinds=shape.kinds)
    assumptions: list[str] = []
    vpp = len(place[0])
    tp, pp, cp, ep, etp = d.tp, d.pp, d.cp, d.ep, d.etp
    dp, edp, mbs = _sizes(d, assumptions)
    rates = state_rates(cfg, p, dp, edp)
    vocab_rows = int(m.vocab_size or 0)
    if extras.get("should_pad_vocab", True) is not False:
        vocab_rows = padded_vocab_size(vocab_rows, m.make_vocab_size_divisible_by, tp)
    kinds = _kinds_for(c, shape.kinds)
    fp8_on = c.fp8_bytes > 0
    L = shape.num_layers
    bf16_lo, bf16_hi = 0, L  # layers [0, lo) and [hi, L) stay BF16 in FP8 recipes
    if fp8_on and p.first_last_layers_bf16:
        bf16_lo = min(p.num_layers_at_start_in_bf16, L)
        bf16_hi = max(L - p.num_layers_at_end_in_bf16, bf16_lo)
    spec = lora_spec(cfg.carried().get("peft"))
    lora = adapter_shape(m, shape, spec) if spec is not None else None
    if lora is not None:
        assumptions.append(peft_assumption(lora))
    plans = _plan(shape, place, tp, ep * etp, vocab_rows, bf16_lo, bf16_hi, c.full, c.full_n,
                  fp8_on, etp, lora)
    # full recompute with per-layer graphs is rejected by Megatron-Core: priced eager
    view = graphs_of(m)
    graphs = view.te_scopes if c.full is None else None
    return _Setup(cfg, d, view, p, gpu_name, capacity, arch, shape, place, c, tp, pp, cp, ep,
                  etp, vpp, d.world_size, d.is_moe, dp, edp, mbs, rates, vocab_rows, kinds,
                  fp8_on, bf16_lo, bf16_hi, plans, assumptions, graphs, lora=lora)


def _loss_terms(s: _Setup, tok: float, stats: float) -> tuple[float, float]:
    """Bytes the loss keeps per micro-batch (saved) and its transient working set."""
    m, c = s.cfg.model, s.c
    extras = m.__pydantic_extra__ or {}
    e, n, h, tp, vocab_rows = c.e, c.n, c.h, s.tp, s.vocab_rows
    te_ce = m.cross_entropy_loss_fusion and str(
        extras.get("cross_entropy_fusion_impl") or "native") == "te"
    # logits kept by the loss: FP32 softmax (Megatron's cross-entropy) or, with Transformer
    # Engine's fused cross-entropy, the BF16 logits overwritten in place by their gradient
    logits_saved = (e if te_ce else 4) * n * vocab_rows / tp
    loss_act = 2 * (e * tok * h) + stats + logits_saved + 8 * n
    # the BF16 logits live next to the saved FP32 copy while the loss runs; the native fused
    # cross-entropy (jit-fused, out-of-place) holds one more FP32 copy: measured on the
    # Megatron-LM CI goldens gpt3_mcore_te_tp2_pp2{,_cross_entropy_loss_fusion} (H100): equal
    # model state, peaks 1.330 vs 1.711 GiB = 4·s·b·V/t
    loss_ws = 0.0 if te_ce else e * n * vocab_rows / tp
    if m.cross_entropy_loss_fusion and not te_ce:
        loss_ws += 4 * n * vocab_rows / tp
    cfg = s.cfg
    ov_extra = (cfg.comm_overlap.__pydantic_extra__ or {}) if cfg.comm_overlap else {}
    defer = bool(cfg.comm_overlap and cfg.comm_overlap.defer_embedding_wgrad_compute) or bool(
        extras.get("defer_embedding_wgrad_compute"))
    if defer:
        # the output layer's weight gradient waits for up to wgrad_deferral_limit micro-batches
        # (0 = all of them): their logits gradients and inputs stay on the last stage
        mbs = s.mbs
        limit = int(ov_extra.get("wgrad_deferral_limit") or extras.get("wgrad_deferral_limit")
                    or 0)
        held = (mbs or s.pp) if not limit else (min(limit, mbs) if mbs else limit)
        loss_ws += held * (e * n * vocab_rows / tp + e * tok * h)
    return loss_act, loss_ws


def _terms(s: _Setup) -> _Terms:
    """Phase 2: the per-micro-batch pieces every stage is priced from."""
    m, c, shape, rates, tp = s.cfg.model, s.c, s.shape, s.rates, s.tp
    e, n, h = c.e, c.n, c.h
    tok = n / c.tsp
    stats = (8 if c.layer_norm else 4) * tok
    emb_act = 8 * n + (tok * h if c.hid_drop else 0.0)
    loss_act, loss_ws = _loss_terms(s, tok, stats)
    ckpt = group_input_bytes(c)
    mtp_extra = 4 * e * tok * h + 2 * stats + loss_act + 8 * n
    mtp_layer = 0.0
    if shape.mtp_kinds:  # one depth: its transformer layer, or a hybrid MTP pattern's layers
        mtp_layer = ckpt if c.full is not None else sum(
            s.kinds.total(k, False) for k in shape.mtp_kinds)
    offload_layers = m.cpu_offloading_num_layers if (
        m.cpu_offloading and m.cpu_offloading_activations) else 0
    workspace = ov.ALLOCATED_WORKSPACE.value * GIB
    fsdp_ws = 0.0
    if rates.weight_shard_dense > 1:  # Megatron-FSDP: two layers all-gathered (and their grads)
        ep_etp = s.ep * s.etp
        big = max(b.tp_sharded / tp + b.replicated + b.routed / ep_etp for b in shape.buckets)
        fsdp_ws = 2 * big * (rates.weight + rates.grad)
    step_tmp = 4.0 if rates.grad < 4 else 0.0
    return _Terms(emb_act, loss_act, loss_ws, ckpt, mtp_extra + mtp_layer, workspace, fsdp_ws,
                  step_tmp, offload_layers)


def _shared_part(s: _Setup, t: _Terms, sp: _StagePlan, unit: tuple[Any, ...],
                 vectors: tuple[list[float], list[float], list[float]]) -> tuple[Any, ...]:
    """What a stage costs from what it holds alone (shared with its twins): per-micro-batch
    activations, working set, static state, the optimizer-step peak and the report's fields."""
    tot_bf16, tot_fp8, ws_kind = vectors
    rates = s.rates
    units, groups_u, emb_u, loss_u, mtp_u = unit
    per_mb = groups_u * t.ckpt + emb_u * t.emb_act + loss_u * t.loss_act + mtp_u * t.mtp_one
    for k, u8, u16 in units:
        per_mb += u8 * tot_fp8[k] + u16 * tot_bf16[k]
    dense, expert, f8d, f8e = sp.dense, sp.expert, sp.fp8_dense, sp.fp8_expert
    ws = max(map(ws_kind.__getitem__, sp.kinds), default=0.0)
    if sp.output_layer and t.loss_ws > ws:
        ws = t.loss_ws
    ws += t.fsdp_ws
    r_w, r_w8 = rates.weight, rates.fp8_weight
    weights = ((dense - f8d) * r_w + f8d * r_w8) / rates.weight_shard_dense + (
        (expert - f8e) * r_w + f8e * r_w8) / rates.weight_shard_expert
    if s.lora is not None:
        # PEFT: the base is frozen (its weights only); the adapters (plain, never FP8, linears)
        # carry weights, gradients and optimizer state like any trained parameter
        dense, expert = sp.lora_dense, sp.lora_expert
        weights += r_w * (dense / rates.weight_shard_dense + expert / rates.weight_shard_expert)
    grads = rates.grad * (dense / rates.grad_shard_dense + expert / rates.grad_shard_expert)
    optim_shard = dense / rates.dense_shard + expert / rates.expert_shard
    optimizer = rates.optim * optim_shard * (1.0 - rates.offload_fraction)
    static = weights + grads + optimizer
    # what the stage holds, in field order; the per-stage entries are set by the caller
    proto = {
        "stage": 0, "layers": (), "layers_per_chunk": (), "embedding": sp.embedding,
        "output_layer": sp.output_layer, "mtp_layers": sp.mtp_layers,
        "params": int(sp.dense + sp.expert + sp.lora_dense + sp.lora_expert + 0.5),
        "expert_params": int(sp.expert + sp.lora_expert + 0.5),
        "weights_gib": weights * _INV_GIB, "grads_gib": grads * _INV_GIB,
        "optimizer_gib": optimizer * _INV_GIB, "static_gib": static * _INV_GIB,
        "activation_per_microbatch_gib": per_mb * _INV_GIB,
        "in_flight_microbatches": 0.0, "in_flight_per_chunk": (),
        "activations_gib": 0.0, "embedding_activations_gib": 0.0, "logits_gib": 0.0,
        "mtp_activations_gib": 0.0, "transient_gib": ws * _INV_GIB,
        "workspace_gib": t.workspace * _INV_GIB, "peak_allocated_gib": 0.0,
        "graphed_peak_allocated_gib": None, "graph_pool_gib": None,
        "peak_phase": "forward_backward"}
    step = static + t.workspace + t.step_tmp * optim_shard
    return per_mb, ws, static, step, proto


def _stages(s: _Setup, t: _Terms) -> tuple[list[StageMemory], int, float]:
    """Phase 3: every stage's peak (forward/backward or optimizer step); stages that differ only
    in their in-flight counts share what they hold. Returns the stages, the most-loaded one and
    its peak (GiB)."""
    # checked before the in-flight cache: a carried list or word would not even hash there
    group = opt_int(s.cfg.model, "microbatch_group_size_per_vp_stage", None)
    vectors = s.kinds.vectors(s.c.full is None, s.fp8_on)
    tot_bf16, tot_fp8, _ = vectors
    stages: list[StageMemory] = []
    best, best_peak = 0, -1.0
    weights_all = _stage_weights(s.plans, _all_in_flight(s.pp, s.vpp, s.mbs, group),
                                 s.c.full is None, t.offload_layers)
    # one fields-set for this report's stages: it already names every field, so pydantic's
    # only in-place change (adding a field's name on assignment, and these are frozen) is a
    # no-op; a copy per stage was a large allocation each
    fields_set = _FIELDS_SET[StageMemory].copy()
    shared: dict[int, tuple[Any, ...]] = {}  # by twin: what depends only on what it holds
    emb_act, loss_act, mtp_one, ckpt = t.emb_act, t.loss_act, t.mtp_one, t.ckpt
    graph_bytes = (s.kinds.graphed(s.graphs, int(s.cfg.model.seq_length or 0))
                   if s.graphs is not None else None)
    for r, sp, counts, held, groups_w, emb_w, loss_w, mtp_w, twin, unit in weights_all:
        emb_part, loss_part, mtp_part = emb_w * emb_act, loss_w * loss_act, mtp_w * mtp_one
        activations = groups_w * ckpt + emb_part + loss_part + mtp_part
        for k, w8, w16 in held:
            activations += w8 * tot_fp8[k] + w16 * tot_bf16[k]
        if twin == r:
            shared[r] = _shared_part(s, t, sp, unit, vectors)
        per_mb, ws, static, step, proto = shared[twin]
        fb = static + activations + ws + t.workspace
        peak = fb if fb >= step else step
        graph_peak = graph_step = pool = None
        if s.graphs is not None:
            graph_fb, graph_step, pool = graphed_state(s.c, fb, step, held, graph_bytes)
            graph_peak = max(graph_fb, graph_step)
            if graph_peak > peak:
                peak = graph_peak
        pk = _INV_GIB * peak
        if pk > best_peak:
            best, best_peak = r, pk
        # copying the shared part is cheaper than building a 24-key dict per stage
        values = proto.copy()
        values["stage"] = r
        values["layers"] = sp.layers
        values["layers_per_chunk"] = sp.layers_per_chunk
        values["in_flight_microbatches"] = activations / per_mb if per_mb else 0.0
        values["in_flight_per_chunk"] = counts
        values["activations_gib"] = activations * _INV_GIB
        # the parts most stages lack stay at the prototype's 0.0 (a zero count times finite
        # bytes is +0.0 too)
        if emb_w:
            values["embedding_activations_gib"] = emb_part * _INV_GIB
        if loss_w:
            values["logits_gib"] = loss_part * _INV_GIB
        if mtp_w:
            values["mtp_activations_gib"] = mtp_part * _INV_GIB
        values["peak_allocated_gib"] = pk
        if graph_peak is not None:
            values["graphed_peak_allocated_gib"] = graph_peak * _INV_GIB
            values["graph_pool_gib"] = pool * _INV_GIB
        if (fb < step and peak == step) or peak == graph_step:
            values["peak_phase"] = "optimizer_step"
        # _make inlined: this runs once per stage
        stage = _new(StageMemory)
        _setattr(stage, "__dict__", values)
        _setattr(stage, "__pydantic_fields_set__", fields_set)
        _setattr(stage, "__pydantic_extra__", None)
        _setattr(stage, "__pydantic_private__", None)
        stages.append(stage)
    return stages, best, best_peak


def steady_peak_gib(report: MemoryReport) -> float:
    """Peak allocated (GiB) of the stage most loaded in steady-state iterations: the graphed
    state where per-layer TE graphs replay, else the usual peak. What a log line of a running
    job shows; ``peak_allocated_gib`` also covers the eager warm-up iterations."""
    return max(st.peak_allocated_gib if st.graphed_peak_allocated_gib is None
               else st.graphed_peak_allocated_gib for st in report.per_stage)


@dataclass(slots=True)
class _Fit:
    band: tuple[float, float]
    band_source: str
    expandable: bool
    context_c: ov.Constant
    nccl: float
    graph: float
    over_total: float
    phases: list[Phase]
    need: tuple[float, float]
    verdict: Verdict | None
    verdict_term: str
    fits_frag: bool | None
    headroom: float | None


def _phase(name: Any, st: StageMemory, allocated: float, pool: float,
           band_f: tuple[float, float], outside: float) -> Phase:
    band = (allocated * band_f[0], allocated * band_f[1])
    return _make(Phase, {
        "phase": name, "stage": st.stage, "allocated_gib": allocated, "private_pool_gib": pool,
        "reserved_band_gib": band, "outside_gib": outside,
        "need_gib": (allocated + pool + band[0] + outside, allocated + pool + band[1] + outside)})


def _phases(stages: list[StageMemory], most: int, graphed_on: bool,
            band_f: tuple[float, float], outside: float) -> list[Phase]:
    """Per phase, the stage that needs the most: the eager warm-up (every saved tensor
    allocated; also where full-iteration and local graphs keep their pool) and, with per-layer
    TE graphs, the replayed steady state (graphed allocated + the graphs' private pool, which
    eager code and the optimizer step cannot reuse). No byte in two terms."""
    eager = stages[most]
    out = [_phase("eager", eager, eager.peak_allocated_gib, 0.0, band_f, outside)]
    if graphed_on:
        def need(st: StageMemory) -> float:
            return st.graphed_peak_allocated_gib * (1 + band_f[0]) + (st.graph_pool_gib or 0)

        g = max(stages, key=need)
        out.append(_phase("graphed_steady_state", g, g.graphed_peak_allocated_gib,
                          g.graph_pool_gib or 0.0, band_f, outside))
    return out


def _fit(s: _Setup, stages: list[StageMemory], most: int, peak_gib: float,
         warnings: list[str]) -> _Fit:
    """Phase 4: the reserved band, what lives outside the allocator, the phases and the
    verdict on the GPU."""
    cfg, m = s.cfg, s.cfg.model
    expandable = ov.expandable_segments(cfg.env)
    band_f, band_source = ov.RESERVED_BAND[expandable]
    band = (peak_gib * band_f[0], peak_gib * band_f[1])
    context_c = ov.cuda_context(s.arch)
    nccl = ov.nccl_bytes(tp=s.tp, cp=s.cp, dp=s.dp, pp=s.pp, ep=s.ep, edp=s.edp,
                         alltoall=m.moe_token_dispatcher_type != "allgather")
    graph = graph_exec_gib(s.graph_view)
    over_total = context_c.value + nccl / GIB + graph
    phases = _phases(stages, most, s.graphs is not None, band_f, over_total)
    need = (max(p.need_gib[0] for p in phases), max(p.need_gib[1] for p in phases))
    verdict, term, fits_frag, headroom = None, "no GPU given: pass gpu (e.g. 'H100')", None, None
    capacity = s.capacity
    if capacity is not None:
        verdict, term = judge(need[0], need[1], capacity)
        fits_frag = need[1] <= capacity
        headroom = capacity - need[0]
        if verdict != "fits":
            warnings.append(f"{verdict.replace('_', ' ')}: {term}"
                            + ("" if expandable or fits_frag else
                               "; set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"))
    return _Fit(band, band_source, expandable, context_c, nccl, graph, over_total, phases,
                need, verdict, term, fits_frag, headroom)


def _config_notes(s: _Setup, f: _Fit) -> tuple[tuple[str, ...], tuple[str, ...],
                                               tuple[str, ...]]:
    """Phase 5: the config's warnings, assumptions and gaps (cached per what they read)."""
    cfg, m, p, c, shape = s.cfg, s.cfg.model, s.p, s.c, s.shape
    o, dd = cfg.optimizer, cfg.ddp
    note_key = (c, shape.kinds, f.expandable, s.arch, p.assumed, p.bf16, p.fp16, p.fp8,
                p.grad_reduce_in_fp32, p.first_last_layers_bf16, s.is_moe,
                o.optimizer_cpu_offload, o.optimizer_offload_fraction, dd.use_megatron_fsdp,
                dd.data_parallel_sharding_strategy, m.cpu_offloading,
                m.cpu_offloading_num_layers, m.transformer_impl, m.seq_length,
                m.multi_latent_attention, m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim,
                s.graphs)
    notes = _NOTES.get(note_key)
    if notes is None:
        w: list[str] = []
        a: list[str] = []
        nm: list[str] = []
        _notes(cfg, s.d, c, shape, f.expandable, f.band_source, f.context_c, w, a, nm)
        if s.graphs is not None:
            a.append(graphed_assumption(s.graphs))
        if len(_NOTES) > 512:
            _NOTES.clear()
        notes = _NOTES[note_key] = (tuple(w), tuple(a), tuple(nm))
    return notes


def _layer_summary(s: _Setup) -> list[LayerKindActivation]:
    """Per-layer activation of each layer kind (and FP8 / BF16 split)."""
    shape, kinds, fp8_on = s.shape, s.kinds, s.fp8_on
    L = shape.num_layers
    layer_summ = []
    for k, (mixer, mlp) in enumerate(shape.kinds):
        count = shape.prefix[k][-1]
        for fp8 in ((False, True) if fp8_on else (False,)):
            nk = count
            if fp8_on:
                bf = shape.count(k, 0, s.bf16_lo) + shape.count(k, s.bf16_hi, L)
                nk = count - bf if fp8 else bf
            if not nk:
                continue
            layer_total, terms_gib = kinds.summary(k, fp8)
            layer_summ.append(_make(LayerKindActivation, {
                "mixer": mixer, "mlp": mlp, "fp8": fp8, "count": nk,
                "per_layer_gib": layer_total * _INV_GIB, "terms_gib": dict(terms_gib)}))
    return layer_summ


def estimate_memory(cfg: TrainingConfig, *, gpu: str | None = None,
                    imbalance: float = 1.0) -> MemoryReport:
    """Per-stage GPU memory of a training configuration (see the module docstring): resolve
    once, price the per-micro-batch pieces, every stage, then the fit and the notes."""
    s = _resolve(cfg, gpu, imbalance)
    t = _terms(s)
    stages, most, peak_gib = _stages(s, t)
    warnings: list[str] = []
    f = _fit(s, stages, most, peak_gib, warnings)
    notes = _config_notes(s, f)
    warnings += notes[0]
    assumptions = s.assumptions + list(notes[1])
    not_modeled = list(NOT_MODELED) + list(notes[2])
    return _make(MemoryReport, {
        "per_stage": stages, "most_loaded_stage": most, "peak_allocated_gib": peak_gib,
        "reserved_band_gib": f.band,
        "overheads": _make(Overheads, {
            "cuda_context_gib": f.context_c.value, "nccl_gib": f.nccl * _INV_GIB,
            "cuda_graphs_gib": f.graph, "total_gib": f.over_total}),
        "gpu": s.gpu_name, "gpu_capacity_gib": s.capacity, "phases": f.phases,
        "need_gib": f.need, "verdict": f.verdict, "verdict_term": f.verdict_term,
        "margin": MARGIN_SOURCE, "fits": None if f.verdict is None else f.verdict == "fits",
        "fits_with_fragmentation": f.fits_frag, "headroom_gib": f.headroom,
        "total_params": s.shape.total_params, "layer_activations": _layer_summary(s),
        "parallelism": {"world_size": s.world, "tensor": s.tp, "pipeline": s.pp,
                        "virtual_pipeline": s.vpp, "context": s.cp, "expert": s.ep,
                        "expert_tensor": s.etp, "data": s.dp,
                        "expert_data": s.edp if s.is_moe else None,
                        "num_microbatches": s.mbs},
        "warnings": warnings, "assumptions": assumptions, "not_modeled": not_modeled})


def _notes(cfg: TrainingConfig, d: Derived, c: ActContext, shape: Shape, expandable: bool,
           band_source: str, context_c: ov.Constant, warnings: list[str],
           assumptions: list[str], not_modeled: list[str]) -> None:
    """Plain-words assumptions, warnings and gaps that depend on the config."""
    m, p = cfg.model, d.precision
    half = p.bf16 or p.fp16
    if p.assumed:
        assumptions.append("no precision given: priced as Megatron Bridge's recipes train "
                           "(mixed_precision=bf16_mixed); write mixed_precision, or model.bf16 "
                           "/ fp16 (false for FP32), to price another")
    attn = ("fused (flash / cuDNN: no s² scores kept)" if c.fused_attn
            else "unfused (a·s² scores, probabilities and dropout masks kept)")
    assumptions.append(f"activations in {'BF16/FP16' if c.e == 2 else 'FP32'}; attention {attn}")
    grad_dtype = "FP32" if (p.grad_reduce_in_fp32 or not half) else "BF16/FP16"
    assumptions.append(f"weights {'BF16/FP16' if half else 'FP32'}, gradient buffers "
                       f"{grad_dtype} (grad_reduce_in_fp32), Adam master weights and moments "
                       "FP32 unless the precision-aware optimizer dtypes say otherwise")
    assumptions.append("resident cuBLAS / Transformer Engine workspaces: "
                       f"{ov.ALLOCATED_WORKSPACE.value} GiB ({ov.ALLOCATED_WORKSPACE.source})")
    assumptions.append(f"CUDA context {context_c.value} GiB ({context_c.source}); NCCL "
                       f"{ov.NCCL_COLLECTIVE_GIB.value} GiB per collective communicator "
                       f"({ov.NCCL_COLLECTIVE_GIB.source}), {ov.NCCL_ALLTOALL_GIB.value} GiB for "
                       f"expert all-to-all ({ov.NCCL_ALLTOALL_GIB.source})")
    assumptions.append(f"reserved band: {band_source}")
    assumptions.append("in-flight micro-batches follow Megatron-Core's 1F1B / interleaved "
                       "warm-up (stage r holds min(PP - r, M); interleaved (PP - r - 1)·2 + "
                       "(VPP - 1)·PP + 1 chunk passes)")
    if d.is_moe:
        assumptions.append(f"routed tokens per GPU = top-k x tokens x ETP x imbalance "
                           f"{c.imbalance:g} (not divided by EP); router scores "
                           "16 bytes per token and expert")
    if c.fp8_bytes:
        no_t = bool((m.__pydantic_extra__ or {}).get("disable_parameter_transpose_cache"))
        weights = ("FP8 weights only (fp8_param)" if p.fp8_param else
                   "BF16 weights plus cached FP8 copies")
        assumptions.append(
            "FP8 (Transformer Engine): linear inputs saved as one FP8 copy per element; "
            f"{weights}, {'without' if no_t else 'with'} a cached transpose (ESTIMATED, not "
            "measured on a GPU)"
            + ("; first/last layers kept in BF16" if p.first_last_layers_bf16 else ""))
        not_modeled.append("FP8 amax histories, scaling factors and TE's per-module FP8 "
                           "workspaces")
    elif p.fp8 and m.transformer_impl == "local":
        warnings.append("fp8 is set but transformer_impl=local runs without Transformer Engine: "
                        "FP8 is ignored here")
    _memory_notes(cfg, c, shape, expandable, warnings, assumptions, not_modeled)


def _memory_notes(cfg: TrainingConfig, c: ActContext, shape: Shape, expandable: bool,
                  warnings: list[str], assumptions: list[str], not_modeled: list[str]) -> None:
    """The notes on recompute, offload, sharding, attention kernels and the allocator."""
    m = cfg.model
    if c.full is not None:
        assumptions.append(f"full recompute ({c.full}, recompute_num_layers={c.full_n}): "
                           + ("each group of N layers keeps its input and is rebuilt whole in "
                              "its backward" if c.full == "uniform" else
                              "the first N layers of each chunk keep only their input and are "
                              "rebuilt one at a time; the rest keep their activations"))
    if c.offload:
        assumptions.append("fine-grained activation offloading: the offloaded modules' saved "
                           f"tensors ({', '.join(sorted(c.offload))}) are counted on the host")
        not_modeled.append("GPU staging buffers of activation offloading")
    if m.cpu_offloading:
        assumptions.append(f"CPU activation offloading of {m.cpu_offloading_num_layers} "
                           "layers per stage (one layer stays as a staging buffer)")
    if cfg.optimizer.optimizer_cpu_offload:
        assumptions.append(f"optimizer CPU offload: {cfg.optimizer.optimizer_offload_fraction:g}"
                           " of the optimizer state lives on the host")
    if cfg.ddp.use_megatron_fsdp:
        assumptions.append(f"Megatron-FSDP ({cfg.ddp.data_parallel_sharding_strategy}): two "
                           "layers' parameters all-gathered at a time")
    if any(k[0] in ("gdn", "mamba") for k in shape.kinds):
        not_modeled.append("GatedDeltaNet / Mamba activations beyond their input / output "
                           "projections (chunked-scan states), approximate")
    if not c.fused_attn and m.seq_length and m.seq_length >= 2048:
        warnings.append(f"unfused attention keeps a·s² scores per layer at seq_length="
                        f"{m.seq_length}; a fused backend (attention_backend=auto / flash / "
                        "fused with Transformer Engine) removes them")
    elif c.fused_attn:
        qk = (m.qk_head_dim + m.qk_pos_emb_head_dim) if m.multi_latent_attention else c.head_dim
        vd = m.v_head_dim if m.multi_latent_attention else c.head_dim
        if qk > 256 or vd > 256 or qk != vd:
            s_local = c.s
            extra = 5 * c.b * max(c.heads // c.t, 1) * s_local * s_local / GIB
            warnings.append(f"attention head dims (q/k {qk}, v {vd}) may not be supported by "
                            "every fused kernel; if Transformer Engine falls back to unfused "
                            f"attention each layer keeps ~{extra:.2f} GiB more per micro-batch")
    if c.cp > 1:
        assumptions.append("context parallelism: K/V kept twice for the ring exchange "
                           "(ESTIMATED, as the mbridge estimator does)")
    if not expandable:
        not_modeled.append("fragmentation beyond the reserved band's high end")


# ---------------------------------------------------------------------------------------------
# text rendering


def format_estimate(report: MemoryReport, stage: int | None = None) -> str:
    """A readable per-stage table (the CLI's default output); ``stage`` picks one stage
    (negative counts from the last, so -1 is the last stage)."""
    n = len(report.per_stage)
    if stage is not None and not -n <= stage < n:
        raise ConfigError("stage", f"{stage} is not a pipeline stage; use 0..{n - 1} or -1 for "
                                   "the last")
    rows = report.per_stage if stage is None else [report.per_stage[stage]]
    head = ("stage", "layers", "params", "weights", "grads", "optim", "static", "act/mb",
            "in-flight", "activ.", "transient", "peak")
    lines = []
    par = report.parallelism
    lines.append("Memory estimate per GPU (GiB = 2^30 bytes): TP{tensor} PP{pipeline} "
                 "VPP{virtual_pipeline} CP{context} EP{expert} ETP{expert_tensor} DP{data}, "
                 "{num_microbatches} micro-batches".format(
                     **{k: ("?" if v is None else v) for k, v in par.items()}))
    widths = (5, 9, 8, 8, 7, 7, 7, 7, 9, 7, 9, 7)
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    for s in rows:
        chunks = s.layers_per_chunk
        span = (f"{len(s.layers)}" if len(chunks) == 1 or len(set(chunks)) > 1
                else f"{len(chunks)}x{chunks[0]}")
        tags = ("E" if s.embedding else "") + ("L" if s.output_layer else "") + (
            "m" if s.mtp_layers else "")
        cells = (f"{s.stage}{'*' if s.stage == report.most_loaded_stage else ''}",
                 f"{span}{tags and ' ' + tags}", f"{s.params / 1e9:.2f}B",
                 f"{s.weights_gib:.2f}", f"{s.grads_gib:.2f}", f"{s.optimizer_gib:.2f}",
                 f"{s.static_gib:.2f}", f"{s.activation_per_microbatch_gib:.2f}",
                 f"{s.in_flight_microbatches:.2f}", f"{s.activations_gib:.2f}",
                 f"{s.transient_gib:.2f}", f"{s.peak_allocated_gib:.2f}")
        lines.append("  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)))
    if stage is not None:
        lines += _stage_detail(report.per_stage[stage])
    o = report.overheads
    lo, hi = report.reserved_band_gib
    lines.append(f"* most loaded: stage {report.most_loaded_stage}, peak allocated "
                 f"{report.peak_allocated_gib:.2f} GiB; reserved band +{lo:.2f}..+{hi:.2f} GiB; "
                 f"outside the allocator: context {o.cuda_context_gib:.2f} + NCCL "
                 f"{o.nccl_gib:.2f} + CUDA graphs {o.cuda_graphs_gib:.2f} GiB")
    graphed = [s for s in report.per_stage if s.graphed_peak_allocated_gib is not None]
    if graphed:
        g = max(graphed, key=lambda s: s.graphed_peak_allocated_gib or 0.0)
        lines.append(f"  per-layer TE CUDA graphs: once they replay, stage {g.stage} peaks at "
                     f"{g.graphed_peak_allocated_gib:.2f} GiB (graphed modules' activations in "
                     "the graph pool, static inputs per layer-micro-batch in flight); the peaks "
                     "above "
                     "also cover the eager warm-up iterations")
    for ph in report.phases if len(report.phases) > 1 else ():
        lines.append(f"  {ph.phase.replace('_', ' ')} (stage {ph.stage}): allocated "
                     f"{ph.allocated_gib:.2f} + graph pool {ph.private_pool_gib:.2f} + band "
                     f"{ph.reserved_band_gib[0]:.2f}..{ph.reserved_band_gib[1]:.2f} + outside "
                     f"{ph.outside_gib:.2f} = {ph.need_gib[0]:.2f}..{ph.need_gib[1]:.2f} GiB")
    if report.gpu_capacity_gib is not None and report.verdict is not None:
        lines.append(f"  {report.gpu} {report.gpu_capacity_gib:.2f} GiB: "
                     f"{report.verdict.replace('_', ' ').upper()} - {report.verdict_term}")
    for w in report.warnings:
        lines.append(f"  warning: {w}")
    return "\n".join(lines)


def _stage_detail(s: StageMemory) -> list[str]:
    """The full breakdown of one stage (`--stage N`)."""
    first, last = (s.layers[0], s.layers[-1]) if s.layers else (None, None)
    held = ", ".join(x for x, on in (("embedding", s.embedding),
                                     ("final norm + output layer + loss", s.output_layer),
                                     (f"{s.mtp_layers} MTP layer(s)", s.mtp_layers)) if on)
    rows = [
        ("transformer layers", f"{len(s.layers)} (indices {first}..{last}), per virtual chunk "
                               f"{list(s.layers_per_chunk)}" if s.layers else "none"),
        ("also holds", held or "nothing else"),
        ("parameters on this GPU", f"{s.params:,} ({s.expert_params:,} routed-expert)"),
        ("weights / grads / optimizer", f"{s.weights_gib:.3f} / {s.grads_gib:.3f} / "
                                        f"{s.optimizer_gib:.3f} GiB = static {s.static_gib:.3f}"),
        ("activations per micro-batch", f"{s.activation_per_microbatch_gib:.3f} GiB"),
        ("micro-batches in flight", f"{s.in_flight_microbatches:.2f} (per chunk "
                                    f"{list(s.in_flight_per_chunk)})"),
        ("activations held at the peak", f"{s.activations_gib:.3f} GiB, of which embedding "
                                         f"{s.embedding_activations_gib:.3f}, logits "
                                         f"{s.logits_gib:.3f}, MTP "
                                         f"{s.mtp_activations_gib:.3f}"),
        ("transient working set", f"{s.transient_gib:.3f} GiB"),
        ("resident workspaces", f"{s.workspace_gib:.3f} GiB"),
        ("peak allocated", f"{s.peak_allocated_gib:.3f} GiB (during the "
                           f"{s.peak_phase.replace('_', ' ')})"),
    ]
    return [f"  stage {s.stage} in full:"] + [f"    {k:30} {v}" for k, v in rows]
