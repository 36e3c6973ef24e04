"""estimate_memory / layer_activation_bytes: golden vectors (memory-estimation.md §10), measured
per-layer bytes of real Megatron-Core layers (cpu-ground-truth.md §4), the seeds' Llama3-70B
case, DeepSeek-V3, sharding, FP8, recompute, pipeline in-flight counts and bad input."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.activations import layer_activation_bytes
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory, format_estimate
from mbridge_perf.memory.params import count_params
from mbridge_perf.memory.pipeline import in_flight

GIB = 2**30
MIB = 2**20


def cfg_of(model: dict[str, Any], *, train: dict[str, Any] | None = None,
           **sections: Any) -> TrainingConfig:
    return load_config(data={"model": model, "train": train or {}, **sections})


# ---------------------------------------------------------------------------------------------
# Bridge unit-test golden vectors (memory-estimation.md §10). Fixture: L4 h16 s8 f64 a4 g4 d4
# V32 (no padding), tied, TP2 PP2, non-gated, SP + selective, b2, DistOpt, DP4. Bridge's
# estimator divides everything by TP and averages stages; Megatron-Core keeps norms and routers
# whole on every TP rank, so per-stage counts are derived by hand from Megatron's buckets.

FIXTURE = dict(num_layers=4, hidden_size=16, seq_length=8, ffn_hidden_size=64,
               num_attention_heads=4, num_query_groups=4, kv_channels=4, vocab_size=32,
               make_vocab_size_divisible_by=1, should_pad_vocab=False,
               share_embeddings_and_output_weights=True, add_bias_linear=False,
               position_embedding_type="rope", tensor_model_parallel_size=2,
               pipeline_model_parallel_size=2, sequence_parallel=True,
               recompute_granularity="selective")
FP32_GRADS = {"ddp": {"use_distributed_optimizer": True},
              "optimizer": {"use_distributed_optimizer": True},
              "mixed_precision": {"bf16": True, "grad_reduce_in_fp32": True}}


def fixture(*, world: int = 16, gbs: int = 16, **model: Any) -> TrainingConfig:
    return cfg_of({**FIXTURE, **model}, train={"micro_batch_size": 2, "global_batch_size": gbs},
                  cluster={"num_gpus": world}, **FP32_GRADS)


def stage_state_bytes(rep: MemoryReport, i: int) -> float:
    s = rep.per_stage[i]
    return (s.weights_gib + s.grads_gib + s.optimizer_gib) * GIB


def test_golden_dense_model_state() -> None:
    """13,088 parameters; 6 + 12/4 = 9 bytes each with the distributed optimizer over DP4."""
    cfg = fixture()
    assert count_params(cfg.model, pad_vocab=False).total == 13_088
    rep = estimate_memory(cfg)
    # attention 1024/2 + MLP 2048/2 + norms 64 (whole) per layer; tied embedding 512/2 on the
    # first stage, its copy on the last stage (PP > 1) plus the final norm 32
    assert [s.params for s in rep.per_stage] == [2 * 1600 + 256, 2 * 1600 + 256 + 32]
    for i, stage in enumerate(rep.per_stage):
        assert stage_state_bytes(rep, i) == pytest.approx(9 * stage.params, abs=1)


def test_golden_uneven_pipeline() -> None:
    """L8 TP1 PP4, first stage 1 layer, last 3, untied: the last stage holds 9,952 parameters
    = 89,568 bytes at 9 B/param (Bridge PR #5077 vector)."""
    cfg = fixture(num_layers=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=4,
                  sequence_parallel=False, num_layers_in_first_pipeline_stage=1,
                  num_layers_in_last_pipeline_stage=3,
                  share_embeddings_and_output_weights=False, world=16)
    rep = estimate_memory(cfg)
    assert [len(s.layers) for s in rep.per_stage] == [1, 2, 2, 3]
    assert rep.per_stage[3].params == 9_952
    assert stage_state_bytes(rep, 3) == pytest.approx(89_568, abs=1)


def test_golden_uneven_pipeline_moe_list() -> None:
    """+ 2 experts on layers [0,1,0,0,1,0,1,1], f_e 32: last stage routed 4,096; dense 5,856
    plus the two routers (2 x h·E = 64) that Megatron-Core has and Bridge leaves out."""
    cfg = fixture(num_layers=8, tensor_model_parallel_size=1, pipeline_model_parallel_size=4,
                  sequence_parallel=False, num_layers_in_first_pipeline_stage=1,
                  num_layers_in_last_pipeline_stage=3,
                  share_embeddings_and_output_weights=False, num_moe_experts=2,
                  moe_layer_freq=[0, 1, 0, 0, 1, 0, 1, 1], moe_ffn_hidden_size=32, world=16)
    last = estimate_memory(cfg).per_stage[3]
    assert last.expert_params == 4_096
    assert last.params - last.expert_params == 5_856 + 64


def test_golden_ep_sharding() -> None:
    """PP1 CP2 TP2, 8 experts every 2nd layer, EP4 ETP1, DP8 (32 GPUs): routed 16,384 total,
    4,096 per GPU at 6 + 12/EDP8 = 7.5 B/param = 30,720 B; dense at 6 + 12/(DP·CP) = 6.75."""
    cfg = fixture(pipeline_model_parallel_size=1, context_parallel_size=2, num_moe_experts=8,
                  moe_layer_freq=2, moe_ffn_hidden_size=32, expert_model_parallel_size=4,
                  expert_tensor_parallel_size=1, world=32, gbs=16)
    rep = estimate_memory(cfg)
    stage = rep.per_stage[0]
    assert rep.parallelism["data"] == 8 and rep.parallelism["expert_data"] == 8
    assert stage.expert_params == 4_096
    dense = stage.params - stage.expert_params
    # attention 512 x4 + norms 64 x4 + dense MLP 1024 x2 + routers 128 x2 + final norm 32
    # + tied embedding 256
    assert dense == 2048 + 256 + 2048 + 256 + 32 + 256
    assert stage_state_bytes(rep, 0) == pytest.approx(dense * 6.75 + 4_096 * 7.5, abs=1)


def test_golden_activation_tp_cp() -> None:
    """TP2 SP CP2: a layer keeps 34·s·b·h/(t·c) = 2,176 bytes (fused attention adds only the
    fp32 logsumexp and LayerNorm statistics)."""
    cfg = fixture(pipeline_model_parallel_size=1, context_parallel_size=2,
                  position_embedding_type="learned_absolute", world=16)
    layer = layer_activation_bytes(cfg, 0)
    assert 2_176 <= layer.total <= 2_176 * 1.25
    assert layer.terms["qkv"] == 6 * 8 * 16 // 2  # QKV buffer: 6 bytes per token·h / TP


def test_golden_vpp_penalty() -> None:
    """PP2 VPP2, 4 micro-batches: the first stage holds p·(1 + (p-1)/(p·v)) = 2.5 stage
    micro-batches (Bridge 22,240-byte vector: 1.25 x the 1F1B value)."""
    cfg = fixture(virtual_pipeline_model_parallel_size=2, world=16, gbs=32)
    stage = estimate_memory(cfg).per_stage[0]
    assert stage.in_flight_per_chunk == (3, 2)
    layers = sum(c * n for c, n in zip(stage.in_flight_per_chunk, stage.layers_per_chunk,
                                        strict=True))
    assert layers / len(stage.layers) == pytest.approx(2.5)


# ---------------------------------------------------------------------------------------------
# per-layer activations vs real Megatron-Core layers (cpu-ground-truth.md §4.3: h=1024, a=16,
# s=2048, b=1, 2 layers, local transformer impl, BF16, dropout 0.1 unless stated)

LOCAL = dict(num_layers=2, hidden_size=1024, num_attention_heads=16, seq_length=2048,
             vocab_size=1024, transformer_impl="local", attention_softmax_in_fp32=False,
             bf16=True)


@pytest.mark.parametrize(("extra", "measured_mib"), [
    ({}, 388.02),  # Korthikanti: 34sbh + 5as²b
    ({"position_embedding_type": "rope"}, 397.02),
    ({"attention_dropout": 0.0, "hidden_dropout": 0.0}, 192.02),
    ({"attention_softmax_in_fp32": True}, 516.02),
    ({"recompute_granularity": "selective"}, 68.02),
    ({"recompute_granularity": "selective", "position_embedding_type": "rope"}, 77.02),
    ({"add_bias_linear": False, "recompute_granularity": "selective",
      "recompute_modules": ["layernorm"]}, 380.00),
    ({"add_bias_linear": False, "recompute_granularity": "selective",
      "recompute_modules": ["mlp"]}, 356.02),
    ({"add_bias_linear": False, "recompute_granularity": "selective",
      "recompute_modules": ["core_attn", "layernorm", "mlp"]}, 28.00),
    ({"num_query_groups": 4, "add_bias_linear": False, "recompute_granularity": "selective"},
     66.02),
    ({"gated_linear_unit": True, "ffn_hidden_size": 2816, "recompute_granularity": "selective"},
     91.02),  # unfused glu()
    ({"gated_linear_unit": True, "ffn_hidden_size": 2816, "recompute_granularity": "selective",
      "bias_activation_fusion": True}, 69.02),
    ({"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024,
      "add_bias_linear": False, "recompute_granularity": "selective"}, 68.13),
    ({"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024,
      "moe_shared_expert_intermediate_size": 1024, "add_bias_linear": False,
      "recompute_granularity": "selective"}, 76.13),
])
def test_layer_matches_measured_megatron_layer(extra: dict[str, Any],
                                               measured_mib: float) -> None:
    layer = layer_activation_bytes(cfg_of({**LOCAL, **extra}), 0)
    assert layer.total / MIB == pytest.approx(measured_mib, rel=0.01), layer.terms


def test_full_recompute_keeps_group_inputs_only() -> None:
    base = {**LOCAL, "recompute_granularity": "full", "recompute_num_layers": 1}
    uniform = [layer_activation_bytes(cfg_of(base), i) for i in range(2)]
    assert [x.total for x in uniform] == [2 * 2048 * 1024] * 2  # 2·s·b·h each
    block = [layer_activation_bytes(cfg_of({**base, "recompute_method": "block"}), i)
             for i in range(2)]
    assert block[0].total == 2 * 2048 * 1024
    assert block[1].total / MIB == pytest.approx(388.02, rel=0.01)  # left whole
    grouped = {**base, "recompute_method": "uniform", "recompute_num_layers": 2}
    assert [layer_activation_bytes(cfg_of(grouped), i).recompute for i in range(2)] == [
        "full_group_input", "full_inside_group"]


def test_tensor_parallel_with_and_without_sp() -> None:
    """TP2: 10 of the 34 units stay whole without SP; with SP everything divides by t."""
    no_sp = layer_activation_bytes(cfg_of({**LOCAL, "tensor_model_parallel_size": 2}), 0)
    sp = layer_activation_bytes(cfg_of({**LOCAL, "tensor_model_parallel_size": 2,
                                        "sequence_parallel": True}), 0)
    assert no_sp.total / MIB == pytest.approx(204.02, rel=0.01)
    assert sp.total / MIB == pytest.approx(194.01, rel=0.01)


# ---------------------------------------------------------------------------------------------
# the seeds' case: Llama3 70B SFT, 32 x H100, TP4 PP4 VPP5 DP2, FP8 current scaling, MBS1
# GBS32 seq 4096, selective core_attn (Bridge perf recipe knobs)

LLAMA_SEED = [
    "model.tensor_model_parallel_size=4", "model.pipeline_model_parallel_size=4",
    "model.virtual_pipeline_model_parallel_size=5", "model.sequence_parallel=true",
    "model.seq_length=4096", "model.recompute_granularity=selective",
    "model.recompute_modules=[core_attn]", "model.attention_dropout=0.0",
    "model.hidden_dropout=0.0", "+model.disable_parameter_transpose_cache=true",
    "mixed_precision.bf16=true", "mixed_precision.fp8=hybrid",
    "mixed_precision.fp8_recipe=tensorwise", "mixed_precision.fp8_param_gather=true",
    "mixed_precision.grad_reduce_in_fp32=false", "optimizer.use_distributed_optimizer=true",
    "ddp.use_distributed_optimizer=true", "train.micro_batch_size=1",
    "train.global_batch_size=32", "cluster.num_gpus=32", "cluster.gpu=H100",
]


def test_llama70b_seed_case_fits_with_risk_in_reserved_band() -> None:
    rep = estimate_memory(load_config(preset="llama3-70b", overrides=LLAMA_SEED))
    assert rep.most_loaded_stage == 0  # embedding + most micro-batches in flight
    assert rep.gpu_capacity_gib == pytest.approx(79.11)
    # measured 58.8 GB = 54.8 GiB on rank 0 (OOM from fragmentation, not capacity)
    assert 50 < rep.peak_allocated_gib < 65
    # tight: the verdict flips inside the reserved band (fragmentation), not a capacity limit
    assert rep.verdict == "tight" and rep.fits is False
    assert rep.headroom_gib is not None and rep.headroom_gib > 5
    assert rep.fits_with_fragmentation is False  # the high end of the band crosses 80 GB
    assert any("fragmentation" in w for w in rep.warnings)
    assert all(s.static_gib < s.peak_allocated_gib for s in rep.per_stage)
    expseg = estimate_memory(load_config(
        preset="llama3-70b",
        overrides=[*LLAMA_SEED, "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]))
    assert expseg.reserved_band_gib[1] < rep.reserved_band_gib[1] / 2
    assert expseg.fits_with_fragmentation is True and expseg.verdict == "fits"


def test_seed_case_table_renders() -> None:
    rep = estimate_memory(load_config(preset="llama3-70b", overrides=LLAMA_SEED))
    text = format_estimate(rep)
    assert "TP4 PP4 VPP5" in text and "H100-80GB" in text
    assert len([line for line in text.splitlines() if line.strip().startswith(("0", "1", "2",
                                                                               "3"))]) == 4
    assert "stage 3" not in format_estimate(rep, stage=0).split("most loaded")[0]


# ---------------------------------------------------------------------------------------------
# DeepSeek-V3 (MLA, MoE, MTP) and sharding

DSV3 = ["model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=16",
        "model.expert_model_parallel_size=64", "model.expert_tensor_parallel_size=1",
        "model.seq_length=4096", "model.pipeline_model_parallel_layout=E|(t|)*61|mL",
        "model.moe_grouped_gemm=true", "mixed_precision=bf16_mixed",
        "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
        "train.global_batch_size=8192", "cluster.num_gpus=1024", "cluster.gpu=H100"]


def test_deepseek_v3_pp16_vpp4() -> None:
    rep = estimate_memory(load_config(preset="deepseek-v3", overrides=DSV3))
    assert rep.parallelism["virtual_pipeline"] == 4
    assert sum(len(s.layers) for s in rep.per_stage) == 61
    last = rep.per_stage[-1]
    assert last.mtp_layers == 1 and last.output_layer and last.mtp_activations_gib > 0
    assert rep.per_stage[0].embedding
    # 256 experts over EP64: 4 per GPU per MoE layer
    count = count_params(load_config(preset="deepseek-v3").model)
    per_layer_routed = next(x.routed_experts for x in count.layers if x.mlp == "moe")
    moe_here = sum(1 for i in rep.per_stage[5].layers if count.layers[i].mlp == "moe")
    assert rep.per_stage[5].expert_params == moe_here * per_layer_routed // 64
    assert rep.fits is not None and rep.gpu == "H100-80GB"


def test_ep_shards_experts_not_dense_and_not_activations() -> None:
    def run(ep: int) -> MemoryReport:
        return estimate_memory(load_config(preset="qwen3-30b-a3b", overrides=[
            "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
            f"model.expert_model_parallel_size={ep}", "model.expert_tensor_parallel_size=1",
            "model.seq_length=4096", "cluster.num_gpus=16", "train.global_batch_size=64"]))
    a, b = run(4), run(8)
    sa, sb = a.per_stage[0], b.per_stage[0]
    assert sb.expert_params * 2 == pytest.approx(sa.expert_params, rel=1e-6)
    assert sb.params - sb.expert_params == sa.params - sa.expert_params
    assert sb.activation_per_microbatch_gib == pytest.approx(sa.activation_per_microbatch_gib)


def test_distributed_optimizer_shards_state_over_dp_times_cp() -> None:
    base = ["model.tensor_model_parallel_size=8", "model.seq_length=4096",
            "mixed_precision=bf16_mixed", "train.global_batch_size=64"]

    def stage(*extra: str) -> Any:
        return estimate_memory(load_config(preset="llama3-8b",
                                           overrides=[*base, *extra])).per_stage[0]
    plain = stage("cluster.num_gpus=32")
    dist = stage("cluster.num_gpus=32", "optimizer.use_distributed_optimizer=true")
    dist_cp = stage("cluster.num_gpus=64", "optimizer.use_distributed_optimizer=true",
                    "model.context_parallel_size=2")
    assert plain.optimizer_gib == pytest.approx(12 * plain.params / GIB, rel=1e-3)
    assert dist.optimizer_gib == pytest.approx(plain.optimizer_gib / 4, rel=1e-3)
    assert dist.grads_gib == plain.grads_gib and dist.weights_gib == plain.weights_gib
    assert dist_cp.optimizer_gib == pytest.approx(dist.optimizer_gib / 2, rel=1e-3)
    fsdp = stage("cluster.num_gpus=32", "ddp.use_megatron_fsdp=true",
                 "ddp.data_parallel_sharding_strategy=optim_grads_params")
    assert fsdp.weights_gib == pytest.approx(plain.weights_gib / 4, rel=1e-3)
    assert fsdp.grads_gib == pytest.approx(plain.grads_gib / 4, rel=1e-3)
    offload = stage("cluster.num_gpus=32", "optimizer.use_distributed_optimizer=true",
                    "optimizer.optimizer_cpu_offload=true",
                    "optimizer.optimizer_offload_fraction=0.5")
    assert offload.optimizer_gib == pytest.approx(dist.optimizer_gib / 2, rel=1e-3)


def test_precision_aware_optimizer_and_bf16_grads() -> None:
    base = ["model.seq_length=4096", "cluster.num_gpus=8", "mixed_precision=bf16_mixed",
            "optimizer.use_distributed_optimizer=true"]
    fp32 = estimate_memory(load_config(preset="llama3-8b", overrides=base)).per_stage[0]
    aware = estimate_memory(load_config(preset="llama3-8b", overrides=[
        *base, "optimizer.use_precision_aware_optimizer=true", "optimizer.exp_avg_dtype=bf16",
        "optimizer.exp_avg_sq_dtype=bf16"])).per_stage[0]
    assert aware.optimizer_gib == pytest.approx(fp32.optimizer_gib * 8 / 12, rel=1e-3)
    bf16_grads = estimate_memory(load_config(preset="llama3-8b", overrides=[
        *base[:-2], "mixed_precision.bf16=true", "mixed_precision.grad_reduce_in_fp32=false",
        "optimizer.use_distributed_optimizer=true"])).per_stage[0]
    assert bf16_grads.grads_gib == pytest.approx(fp32.grads_gib / 2, rel=1e-3)


def test_fp8_weights_and_activations() -> None:
    base = ["model.seq_length=4096", "cluster.num_gpus=8", "model.tensor_model_parallel_size=8",
            "model.sequence_parallel=true"]
    bf16 = estimate_memory(load_config(preset="llama3-8b",
                                       overrides=[*base, "mixed_precision=bf16_mixed"]))
    fp8_params = estimate_memory(load_config(preset="llama3-8b", overrides=[
        *base, "mixed_precision=bf16_with_fp8_current_scaling_mixed"]))
    fp8_copies = estimate_memory(load_config(preset="llama3-8b", overrides=[
        *base, "mixed_precision=bf16_with_fp8_current_scaling_mixed",
        "mixed_precision.fp8_param_gather=false", "mixed_precision.fp8_param=false"]))
    s_bf16, s_param, s_copy = (r.per_stage[0] for r in (bf16, fp8_params, fp8_copies))
    # FP8 never halves weight memory: FP8 data + transpose ~ BF16; without fp8_param the FP8
    # copies come on top of the BF16 weights
    assert s_param.weights_gib == pytest.approx(s_bf16.weights_gib, rel=0.1)
    assert s_copy.weights_gib > 1.5 * s_bf16.weights_gib
    # FP8 linears keep one-byte inputs: fewer activation bytes
    assert s_param.activation_per_microbatch_gib < s_bf16.activation_per_microbatch_gib
    kinds = {(k.fp8, k.count) for k in fp8_params.layer_activations}
    assert kinds == {(False, 2), (True, 30)}  # first and last layer stay BF16


def test_recompute_ordering_and_working_set() -> None:
    def stage(*extra: str) -> Any:
        return estimate_memory(load_config(preset="llama3-8b", overrides=[
            "model.seq_length=8192", "model.tensor_model_parallel_size=2",
            "model.sequence_parallel=true", "model.attention_backend=unfused",
            "mixed_precision=bf16_mixed", *extra])
        ).per_stage[0]
    none = stage()
    selective = stage("model.recompute_granularity=selective")
    full = stage("model.recompute_granularity=full", "model.recompute_method=uniform",
                 "model.recompute_num_layers=1")
    assert full.activations_gib < selective.activations_gib < none.activations_gib
    # the recomputed layer's activations come back during its backward
    assert full.transient_gib > none.transient_gib


def test_pipeline_in_flight_counts() -> None:
    assert [in_flight(4, 1, r, 8)[0] for r in range(4)] == [4, 3, 2, 1]
    assert [in_flight(4, 1, r, 2)[0] for r in range(4)] == [2, 2, 2, 1]
    for p, v, expected in ((2, 2, 2.5), (2, 4, 2.25), (4, 2, 5.5)):
        chunks = in_flight(p, v, 0, 8)
        assert sum(chunks) / v == pytest.approx(expected)  # Megatron p·(1 + (p-1)/(p·v))
    rep = estimate_memory(load_config(preset="llama3-8b", overrides=[
        "model.pipeline_model_parallel_size=4", "model.seq_length=4096",
        "train.global_batch_size=64", "cluster.num_gpus=8"]))
    assert [s.in_flight_per_chunk for s in rep.per_stage] == [(4,), (3,), (2,), (1,)]


def test_unfused_attention_warns_and_costs_scores() -> None:
    base = ["model.seq_length=8192", "mixed_precision=bf16_mixed"]
    fused = estimate_memory(load_config(preset="llama3-8b", overrides=base))
    unfused = estimate_memory(load_config(preset="llama3-8b", overrides=[
        *base, "model.attention_backend=unfused"]))
    assert unfused.peak_allocated_gib > fused.peak_allocated_gib + 10
    assert any("unfused attention" in w for w in unfused.warnings)
    assert any("fused" in a for a in fused.assumptions)


def test_megatron_7b_static_golden() -> None:
    """Megatron-LM CI 7B TP4 PP1 DP2: measured resident 19.2444 GiB (memory-estimation §10)."""
    cfg = cfg_of(dict(num_layers=32, hidden_size=4096, num_attention_heads=32,
                      num_query_groups=8, seq_length=8192, vocab_size=131073,
                      tensor_model_parallel_size=4, share_embeddings_and_output_weights=False),
                 train={"micro_batch_size": 1, "global_batch_size": 8},
                 cluster={"num_gpus": 8}, ddp={"use_distributed_optimizer": True},
                 mixed_precision={"bf16": True, "grad_reduce_in_fp32": True})
    stage = estimate_memory(cfg).per_stage[0]
    assert stage.static_gib + stage.workspace_gib == pytest.approx(19.2444, rel=0.03)


# ---------------------------------------------------------------------------------------------
# bad input: one ConfigError naming the field


@pytest.mark.parametrize("missing", ["num_layers", "hidden_size", "num_attention_heads",
                                     "seq_length", "vocab_size"])
def test_missing_size_names_the_field(missing: str) -> None:
    model = {k: v for k, v in dict(num_layers=2, hidden_size=64, num_attention_heads=4,
                                   seq_length=128, vocab_size=100).items() if k != missing}
    with pytest.raises(ConfigError) as err:
        estimate_memory(cfg_of(model))
    assert err.value.field == f"model.{missing}"


def test_invalid_pipeline_split() -> None:
    with pytest.raises(ConfigError) as err:
        estimate_memory(load_config(preset="llama3-8b", overrides=[
            "model.num_layers=30", "model.pipeline_model_parallel_size=4"]))
    assert err.value.field.startswith("model.pipeline")
    with pytest.raises(ConfigError) as err:
        estimate_memory(load_config(preset="llama3-8b", overrides=[
            "model.pipeline_model_parallel_size=2", "model.pipeline_model_parallel_layout=Et|tL"]))
    assert "32" in str(err.value)


def test_unknown_gpu_and_world_size() -> None:
    cfg = load_config(preset="llama3-8b")
    with pytest.raises(ConfigError) as err:
        estimate_memory(cfg, gpu="H900")
    assert err.value.field == "gpu" and "H100" in str(err.value)
    with pytest.raises(ConfigError) as err:
        estimate_memory(load_config(preset="llama3-8b", overrides=[
            "model.tensor_model_parallel_size=8", "cluster.num_gpus=12"]))
    assert err.value.field == "cluster.num_gpus"
    assert estimate_memory(cfg).fits is None  # capacity unknown


# ---------------------------------------------------------------------------------------------
# properties


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       layers=st.sampled_from([8, 16, 32]), seq=st.sampled_from([512, 2048, 4096]))
def test_properties(tp: int, pp: int, layers: int, seq: int) -> None:
    def run(t: int, *extra: str) -> MemoryReport:
        return estimate_memory(load_config(preset="llama3-8b", overrides=[
            f"model.num_layers={layers}", f"model.tensor_model_parallel_size={t}",
            f"model.pipeline_model_parallel_size={pp}", f"model.seq_length={seq}",
            f"cluster.num_gpus={8 * pp}", "train.global_batch_size=64", *extra]))
    rep = run(tp)
    assert sum(len(s.layers) for s in rep.per_stage) == layers
    assert rep == run(tp)  # deterministic
    # every parameter once: TP-sharded buckets times TP plus replicated ones
    count = count_params(load_config(preset="llama3-8b", overrides=[
        f"model.num_layers={layers}", f"model.seq_length={seq}"]).model, tp=tp)
    on_gpus = sum(s.params for s in rep.per_stage)
    sharded = count.total - count.tp_replicated
    copy = 0  # no tied copy: llama3 is untied
    assert on_gpus == pytest.approx(sharded / tp + count.tp_replicated + copy, rel=1e-6)
    if tp < 8:
        more = run(tp * 2)
        for a, b in zip(rep.per_stage, more.per_stage, strict=True):
            assert b.weights_gib <= a.weights_gib
    full = run(tp, "model.recompute_granularity=full", "model.recompute_num_layers=1")
    sel = run(tp, "model.recompute_granularity=selective")
    for f, s, n in zip(full.per_stage, sel.per_stage, rep.per_stage, strict=True):
        assert f.activations_gib <= s.activations_gib <= n.activations_gib
        assert math.isfinite(n.peak_allocated_gib)
