"""Per-layer Transformer Engine CUDA graphs (memory.graphs): the peak is the larger of the eager
warm-up iterations and the graphed steady state, where the graphed modules' saved tensors sit in
the graph pool and the graphs' static inputs stay allocated, one set per graphed layer-micro-batch
in flight (one micro-batch is captured without a pipeline)."""

from __future__ import annotations

import pytest

from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory, steady_peak_gib

GIB = 2**30
# The seeds' recipe (Llama3 70B SFT FP8-CS, 32x H100, TP4 PP4 VPP5 DP2) with its MLP graphs
LLAMA = ["model.tensor_model_parallel_size=4", "model.pipeline_model_parallel_size=4",
         "model.virtual_pipeline_model_parallel_size=5", "model.sequence_parallel=true",
         "model.seq_length=4096", "train.micro_batch_size=1", "cluster.num_gpus=32",
         "mixed_precision.bf16=true", "mixed_precision.fp8=hybrid",
         "mixed_precision.fp8_recipe=tensorwise", "mixed_precision.fp8_param_gather=true",
         "mixed_precision.grad_reduce_in_fp32=false",
         "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
         "model.recompute_granularity=selective", "model.recompute_modules=[mlp]"]
MLP_GRAPHS = ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]"]


def est(preset: str, *overrides: str):
    return estimate_memory(load_config(preset=preset, overrides=list(overrides)))


def test_without_te_layer_graphs_there_is_no_graphed_state() -> None:
    for extra in ([], ["model.cuda_graph_impl=full_iteration"],
                  ["model.cuda_graph_impl=local", "model.cuda_graph_modules=[full_iteration]"]):
        rep = est("llama3-70b", *LLAMA, "train.global_batch_size=32", *extra)
        assert all(s.graphed_peak_allocated_gib is None for s in rep.per_stage), extra
        assert steady_peak_gib(rep) == rep.peak_allocated_gib


def test_static_inputs_follow_the_micro_batches_in_flight_not_all_of_them() -> None:
    """16 more micro-batches add no static buffers: Megatron-Core hands a micro-batch the static
    inputs of one whose backward has finished (TECudaGraphHelper._get_sample_arguments), so a
    stage holds one set per layer-micro-batch in flight, which a full pipeline does not change."""
    a = est("llama3-70b", *LLAMA, "train.global_batch_size=32", *MLP_GRAPHS).per_stage[0]
    b = est("llama3-70b", *LLAMA, "train.global_batch_size=64", *MLP_GRAPHS).per_stage[0]
    assert a.in_flight_per_chunk == b.in_flight_per_chunk  # same activations in flight
    assert b.graphed_peak_allocated_gib == pytest.approx(a.graphed_peak_allocated_gib)


def test_a_static_input_set_is_the_bf16_hidden_states_plus_the_mask_under_attention() -> None:
    """1024 tokens per TP rank x hidden 8192 x BF16 = 16 MiB; a graph that starts at attention
    also keeps TransformerLayer's boolean causal mask, b x s x s bytes (16 MiB at s = 4096)."""
    from types import SimpleNamespace

    from mbridge_perf.memory.graphs import graphed, static_input_bytes

    c = SimpleNamespace(n=4096, tsp=4, h=8192)
    _, on, attn = graphed("attention", "dense", ("mlp",))
    assert (on, attn) == (True, False)
    assert static_input_bytes(c, on, attn, 4096) == 16 * 2**20
    _, on, attn = graphed("attention", "dense", ())
    assert static_input_bytes(c, on, attn, 4096) == 32 * 2**20
    _, on, attn = graphed("attention", "dense", ("moe",))
    assert static_input_bytes(c, on, attn, 4096) == 0.0


def test_tp_shrinks_the_graphed_state() -> None:
    """TP 4 -> 8 halves the static inputs with the activations; the micro-batches DP doubles
    are not all held."""
    tp4 = est("llama3-70b", *LLAMA, "train.global_batch_size=32", *MLP_GRAPHS)
    tp8 = est("llama3-70b", *LLAMA, "train.global_batch_size=32", *MLP_GRAPHS,
              "model.tensor_model_parallel_size=8")
    assert steady_peak_gib(tp8) < steady_peak_gib(tp4) - 5


def test_without_a_pipeline_one_micro_batch_is_captured() -> None:
    """PP = 1: Megatron-Core captures one micro-batch (TECudaGraphHelper), so the graphed state
    does not grow with the number of micro-batches; with a pipeline it captures them all but
    reuses the static inputs of finished ones, so it does not grow once the pipeline is full."""
    base = ["model.recompute_granularity=selective", "model.recompute_modules=[layernorm]",
            "cluster.num_gpus=8", "train.micro_batch_size=1", "mixed_precision.bf16=true",
            *MLP_GRAPHS]
    pp1 = [est("llama3-8b", *base, f"train.global_batch_size={g}").per_stage[0]
           for g in (8, 64)]
    assert pp1[0].graphed_peak_allocated_gib == pp1[1].graphed_peak_allocated_gib
    pp2 = [est("llama3-8b", *base, "model.pipeline_model_parallel_size=2",
               f"train.global_batch_size={g}").per_stage[0] for g in (8, 64)]
    assert pp2[1].graphed_peak_allocated_gib == pytest.approx(pp2[0].graphed_peak_allocated_gib)


def test_the_eager_warm_up_leads_when_the_graphs_hold_the_big_tensors() -> None:
    """Unfused attention keeps a·s² scores: graphing attention moves them into the pool once
    graphs replay, but the eager warm-up iterations held them (Megatron-LM CI
    ..._attn_cudagraph peaks at step 1)."""
    rep = est("llama3-8b", "model.attention_backend=unfused", "model.seq_length=8192",
              "cluster.num_gpus=8", "train.micro_batch_size=1", "train.global_batch_size=8",
              "mixed_precision.bf16=true", "model.cuda_graph_impl=transformer_engine",
              "model.cuda_graph_modules=[attn]")
    eager = est("llama3-8b", "model.attention_backend=unfused", "model.seq_length=8192",
                "cluster.num_gpus=8", "train.micro_batch_size=1", "train.global_batch_size=8",
                "mixed_precision.bf16=true")
    st = rep.per_stage[0]
    assert st.graphed_peak_allocated_gib < st.peak_allocated_gib - 5
    assert rep.peak_allocated_gib == eager.peak_allocated_gib
    assert any("eager warm-up" in a for a in rep.assumptions)
