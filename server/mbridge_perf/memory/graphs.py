"""CUDA-graph memory, every term in one place and each counted once: what the allocator counts
as allocated once per-layer Transformer Engine graphs replay (``graph_vectors``,
``graphed_state``), the private pool those graphs keep reserved (``graphed_state``'s pool:
reserved, not allocated) and the instantiated graphs outside the allocator
(``graph_exec_gib``). Full-iteration and ``local`` graphs capture the eager activations into
their pool: the eager peak already counts them, so they add only the outside term.

Why a second state: with ``cuda_graph_impl="transformer_engine"`` Megatron-Core runs the first
``cuda_graph_warmup_steps`` iterations eagerly, then captures one graph per layer and
micro-batch (``TECudaGraphHelper.create_cudagraphs``: each layer gets ``num_microbatches``
graphs, captured in the pipeline schedule's order into one memory pool) and replays them from
then on. The two states hold different things:

- warm-up (eager): every saved tensor is an ordinary allocation: the estimator's usual peak;
- replay (steady state): tensors a graphed module saves for its backward were allocated and
  freed during capture, so they live in the graph's private pool (reserved, not allocated);
  what stays allocated is the graphs' static inputs, which are shared between graphs whose
  micro-batches do not overlap (``static_input_bytes``): as many as the stage has
  layer-micro-batches in flight, not one per layer and micro-batch.

A run's peak is the larger of the two. Megatron-LM CI's ``mem-max-allocated-bytes`` is a
run-long maximum (its graphed case ``..._attn_cudagraph`` peaks at step 1, eager); a log line of
a steady iteration shows the graphed state (the Llama3 70B FP8-CS runs of the memory-tuning
card: 59 / 53.2 / 50.2 GB at TP4 PP4 / TP4 PP8 / TP8 PP4, non-static memory nearly constant
under TP and PP).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from mbridge_perf.config.semantics import Graphs
from mbridge_perf.memory import overheads as ov

# What stays allocated once the graphs replay, as Megatron-Core 0.16.0 and later capture them
# (core_v0.16.1 and core_v0.19.x megatron/core/transformer/cuda_graphs.py, identical here;
# Megatron-LM PR #2392 "Optimize TE cudagraph input memory", 2025-12-18; these are the only
# releases config.mcore accepts):
# - static inputs: TECudaGraphHelper._get_sample_arguments walks the pipeline schedule's order
#   and hands a (layer, micro-batch) the static inputs of one whose backward has finished when
#   their signature (shape, dtype) matches, which it does for every decoder layer of a stage.
#   So the stage holds one set per layer-micro-batch in flight at the peak of the schedule.
#   A set is ``hidden_states`` ([s/CP/TP-if-SP, b, h], always BF16: the base
#   ``get_layer_static_inputs``) plus, when the graph covers attention, TransformerLayer's
#   boolean causal ``attention_mask`` [b, 1, s/CP, s]. Allocated outside capture, so counted.
# - static outputs and input gradients live in the graph pool and are dropped (weak
#   references) once their backward is captured; static output-gradients are one per output
#   signature: TE make_graphed_callables with ``_reuse_graph_input_output_buffers=True``
#   (transformer_engine/pytorch/graph.py, v2.7 to v2.18), which Megatron-Core passes for TE
#   >= 2.7; 0.16.1 requires transformer-engine >= 2.9 (pyproject.toml).
# - without a pipeline (PP = 1, no overlap_moe_expert_parallel_comm) one micro-batch is
#   captured (``_get_cuda_graph_input_data``): one set per layer, which is also what is in
#   flight then.
# cuda_graph_use_single_mempool only concerns the ``local`` implementation (CudaGraphManager);
# TE graphs share the one pool make_graphed_callables creates. Each layer is one callable: one
# graph per micro-batch, whatever modules it covers (TransformerLayer._te_cuda_graph_capture).
SHARED_GRAD_OUTPUTS = 1  # hidden-sized static output-gradient buffers per stage


def static_input_bytes(c: Any, graphed_layer: bool, attn: bool, seq_length: int) -> float:
    """Bytes of one graphed layer-micro-batch's static inputs: the BF16 hidden states (sharded
    by sequence parallelism) and, when the graph starts at attention, the causal mask."""
    if not graphed_layer:
        return 0.0
    hidden = 2.0 * c.n / c.tsp * c.h
    return hidden + (c.n * seq_length if attn else 0.0)


# Saved-tensor terms (memory.activations names) each graph scope captures. Scope names are
# Megatron-Core's cuda_graph_modules; an empty list graphs the whole layer.
_ATTN = frozenset({"attn_norm", "qkv_input", "qkv", "rope_cos_sin", "core_attn",
                   "cp_kv_buffers", "proj_input", "mla_latent", "mixer", "attn_dropout_mask"})
_DENSE_MLP = frozenset({"mlp_norm", "mlp_input", "mlp_fc1_output", "mlp_fc2_input",
                        "mlp_glu_unfused", "mlp_dropout_mask"})
_MOE = frozenset({"mlp_norm", "mlp_input", "router", "moe_dispatched", "moe_fc1_output",
                  "moe_fc2_input", "moe_probs", "moe_glu_unfused", "shared_fc1_output",
                  "shared_fc2_input", "shared_glu_unfused", "mlp_dropout_mask"})
# the router graph runs the pre-MLP norm and the router; the dispatch after it stays eager
_ROUTER = frozenset({"mlp_norm", "mlp_input", "router"})


@lru_cache(maxsize=256)
def graphed(mixer: str, mlp: str, scopes: tuple[str, ...]) -> tuple[frozenset[str], bool, bool]:
    """Terms of a layer of this kind that live in the graph pool once graphs replay, whether
    the layer is graphed (one graph per micro-batch) and whether its graph covers attention
    (its static inputs then carry the attention mask)."""
    attn_mixer = mixer in ("attention", "mla")
    if not scopes:
        return _ATTN | _DENSE_MLP | _MOE | {"dropout_mask"}, True, attn_mixer
    terms: set[str] = set()
    attn = "attn" in scopes and attn_mixer
    if attn:
        terms |= _ATTN
    if mlp == "dense" and "mlp" in scopes:
        terms |= _DENSE_MLP
    elif mlp == "moe":
        if "moe" in scopes:
            terms |= _MOE
        elif {"moe_router", "moe_preprocess"} & set(scopes):
            terms |= _ROUTER
    return frozenset(terms), bool(terms), attn


def graph_exec_gib(graphs: Graphs) -> float:
    """Outside the allocator once graphs exist: the instantiated graphs (cudaGraphExec, owned by
    the driver) and their bookkeeping. No public per-node figure exists (cuda-graph-memory.md
    §5, open question): a floor, ESTIMATED."""
    return ov.CUDA_GRAPH_FIXED.value if graphs.on else 0.0


def graph_vectors(c: Any, kinds: tuple[tuple[str, str], ...], terms_of: Any,
                  scopes: tuple[str, ...], seq_length: int) -> tuple[list[float], list[float],
                                                                 list[float]]:
    """Per layer kind: BF16 and FP8 bytes of one layer's saved tensors that sit in the graph
    pool once per-layer TE graphs replay, and the static-input bytes of one graphed
    layer-micro-batch. ``terms_of(kind, fp8)``: that kind's saved-tensor terms."""
    bf16, fp8, inputs = [], [], []
    for kind, (mixer, mlp) in enumerate(kinds):
        names, graphed_layer, attn = graphed(mixer, mlp, scopes)
        for out, on in ((bf16, False), (fp8, True)):
            terms = terms_of(kind, on and c.fp8_bytes > 0)
            out.append(sum(v for k, v in terms.items() if k in names))
        inputs.append(static_input_bytes(c, graphed_layer, attn, seq_length))
    return bf16, fp8, inputs


def graphed_state(c: Any, fb: float, step: float, held: tuple[Any, ...],
                  graph_bytes: Any) -> tuple[float, float, float]:
    """Forward/backward and optimizer-step bytes of a stage once its per-layer TE graphs replay:
    the graphed modules' saved tensors leave the allocated count for the graph pool; the
    graphs' static inputs stay allocated, one set per graphed layer-micro-batch in flight
    (shared across micro-batches that do not overlap), plus the shared static output-gradient
    buffer, through the optimizer step too. ``held``: (kind, FP8 layers, BF16 layers) in
    flight; ``graph_bytes``: per kind the pooled BF16 / FP8 bytes and the static inputs. The
    third value is the private pool's high-water mark: the graphed saved tensors of the
    layer-micro-batches in flight at the schedule's peak, which the one pool TE captures into
    (in schedule order, reusing what finished micro-batches freed) keeps reserved for the
    graphs' lifetime - reserved, not allocated, and not reusable by eager code or the optimizer
    step (PyTorch CUDACachingAllocator private pools; TE make_graphed_callables one pool per
    call; cuda-graph-memory.md §1-2)."""
    pooled_bf16, pooled_fp8, inputs = graph_bytes
    pooled = 0.0
    buffers = 0.0
    for k, w8, w16 in held:
        pooled += w8 * pooled_fp8[k] + w16 * pooled_bf16[k]
        buffers += (w8 + w16) * inputs[k]
    if buffers:
        buffers += SHARED_GRAD_OUTPUTS * c.e * c.n / c.tsp * c.h
    return fb - pooled + buffers, step + buffers, pooled


def graphed_assumption(scopes: tuple[str, ...]) -> str:
    return ("per-layer Transformer Engine CUDA graphs (" + (", ".join(scopes) or "whole layers")
            + "): the peak is the larger of the eager warm-up iterations and the graphed steady "
            "state, where the graphed modules' saved tensors live in the graph pool and the "
            "graphs' static inputs stay allocated, one set per graphed layer-micro-batch in "
            "flight (Megatron-Core reuses those of finished micro-batches)")
