"""Per-layer Transformer Engine CUDA graphs: what the allocator counts once they replay.

Why a second state: with ``cuda_graph_impl="transformer_engine"`` Megatron-Core runs the first
``cuda_graph_warmup_steps`` iterations eagerly, then captures one graph per layer and
micro-batch (``TECudaGraphHelper.create_cudagraphs``: each layer gets ``num_microbatches``
graphs, captured in the pipeline schedule's order into one memory pool) and replays them from
then on. The two states hold different things:

- warm-up (eager): every saved tensor is an ordinary allocation: the estimator's usual peak;
- replay (steady state): tensors a graphed module saves for its backward were allocated and
  freed during capture, so they live in the graph's private pool (reserved, not allocated);
  what stays allocated per graph is its static input and static output (one hidden-sized
  tensor each), for every layer and micro-batch, whatever TP or PP is.

A run's peak is the larger of the two. Megatron-LM CI's ``mem-max-allocated-bytes`` is a
run-long maximum (its graphed case ``..._attn_cudagraph`` peaks at step 1, eager); a log line of
a steady iteration shows the graphed state (the Llama3 70B FP8-CS runs of the memory-tuning
card: 59 / 53.2 / 50.2 GB at TP4 PP4 / TP4 PP8 / TP8 PP4, non-static memory nearly constant
under TP and PP, as the per-(layer, micro-batch) buffers are).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from mbridge_perf.config.model import ModelSection

# Hidden-sized static tensors each graph keeps allocated between replays: its input and its
# output (the backward graph reuses them for the gradients). ESTIMATED: TE make_graphed_callables
# keeps static inputs / outputs per callable; the count 2 reproduces the Llama3 70B FP8-CS
# memory-tuning card runs (mlp-scope graphs, 20 layers x 16 micro-batches x 2 x 16 MiB = 10 GiB
# at TP4 PP4 DP2; base 59 GB, TP8 50.2 GB, PP8 53.2 GB within 3 %), not read from TE's code.
STATIC_IO_TENSORS = 2

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


def te_graph_scopes(m: ModelSection) -> tuple[str, ...] | None:
    """The per-layer TE graph modules in effect (``()`` = whole layers), or None when layers
    are not graphed by Transformer Engine (graphs off, ``local`` or full-iteration graphs)."""
    if m.cuda_graph_impl == "none" and not m.enable_cuda_graph and not m.external_cuda_graph:
        return None
    key = (m.cuda_graph_impl, m.enable_cuda_graph, m.external_cuda_graph,
           _hashable(m.cuda_graph_modules), _hashable(m.cuda_graph_scope))
    try:
        return _scopes(*key)
    except TypeError:  # an unhashable spelling (a mapping): read it without the cache
        return _scopes.__wrapped__(*key)


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@lru_cache(maxsize=256)
def _scopes(impl: str, enable: bool, external: bool, modules: Any,
            scope: Any) -> tuple[str, ...] | None:
    """te_graph_scopes on the graph fields alone (cached: it runs once per estimate)."""
    from mbridge_perf.config.model import ModelSection as _Model
    from mbridge_perf.rules.recompute import full_iteration_graph, graph_impl, graph_modules

    m = _Model.model_construct(cuda_graph_impl=impl, enable_cuda_graph=enable,
                               external_cuda_graph=external,
                               cuda_graph_modules=list(modules) if isinstance(modules, tuple)
                               else modules,
                               cuda_graph_scope=list(scope) if isinstance(scope, tuple)
                               else scope)
    if graph_impl(m) != "transformer_engine" or full_iteration_graph(m):
        return None
    return tuple(sorted(graph_modules(m)))


@lru_cache(maxsize=256)
def graphed(mixer: str, mlp: str, scopes: tuple[str, ...]) -> tuple[frozenset[str], int]:
    """Terms of a layer of this kind that live in the graph pool once graphs replay, and how
    many graphs (each with its static input and output) the layer has per micro-batch."""
    if not scopes:
        return _ATTN | _DENSE_MLP | _MOE | {"dropout_mask"}, 1
    terms: set[str] = set()
    graphs = 0
    if "attn" in scopes and mixer in ("attention", "mla"):
        terms |= _ATTN
        graphs += 1
    if mlp == "dense" and "mlp" in scopes:
        terms |= _DENSE_MLP
        graphs += 1
    elif mlp == "moe":
        if "moe" in scopes:
            terms |= _MOE
            graphs += 1
        elif {"moe_router", "moe_preprocess"} & set(scopes):
            terms |= _ROUTER
            graphs += 1
    return frozenset(terms), graphs
