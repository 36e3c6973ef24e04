"""Rules of catalog sections B, C, D, I, J, K, L, M, N, O: every rule fires on a config that
breaks it (with its severity and the user's value in the message) and stays quiet on a nearby
config that does not."""

from __future__ import annotations

from typing import Any

import pytest

import mbridge_perf.rules.cp
import mbridge_perf.rules.fsdp
import mbridge_perf.rules.misc
import mbridge_perf.rules.moe
import mbridge_perf.rules.moe_overlap
import mbridge_perf.rules.packing
import mbridge_perf.rules.pipeline
import mbridge_perf.rules.precision
import mbridge_perf.rules.tp  # noqa: F401  (imported to register their rules)
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import RULES, get_rule
from mbridge_perf.rules.validate import validate

MODULES = {"pipeline", "tp", "cp", "moe", "moe_overlap", "precision", "fsdp", "packing", "misc"}
M = {"num_layers": 8, "hidden_size": 128, "num_attention_heads": 8}
MOE = {**M, "num_moe_experts": 8, "moe_ffn_hidden_size": 64, "add_bias_linear": False}
BIG = {"num_layers": 80, "hidden_size": 8192, "num_attention_heads": 64, "num_query_groups": 8,
       "tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4,
       "virtual_pipeline_model_parallel_size": 5, "sequence_parallel": True}
EP_OVERLAP = {"overlap_moe_expert_parallel_comm": True}
FLEX = {"moe_token_dispatcher_type": "flex"}


def cfg(model: dict[str, Any] | None = None, **sections: Any) -> dict[str, Any]:
    return {"model": {**M, **(model or {})}, **sections}


def moe(**model: Any) -> dict[str, Any]:
    return cfg({**MOE, **model})


def big(world: int = 32, **model: Any) -> dict[str, Any]:
    return {"model": {**BIG, **model}, "cluster": {"num_gpus": world, "gpus_per_node": 8},
            "mixed_precision": "bf16_mixed"}


def mp_fp8(**model: Any) -> dict[str, Any]:
    return cfg({"fp8": "hybrid", **model})


# (rule id, severity, config that breaks it, text its message must contain, nearby config that
# does not break it, baseline for the bad config, baseline for the good one)
CASES: list[tuple[Any, ...]] = [
    # B: pipeline
    ("pipeline.vpp-needs-pp", "error", cfg({"virtual_pipeline_model_parallel_size": 2}),
     "virtual_pipeline_model_parallel_size=2",
     cfg({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2})),
    ("pipeline.layers-divisible-by-pp", "error",
     cfg({"num_layers": 30, "pipeline_model_parallel_size": 4}), "num_layers=30",
     cfg({"num_layers": 32, "pipeline_model_parallel_size": 4})),
    ("pipeline.layers-divisible-by-pp", "error",
     cfg({"pipeline_model_parallel_size": 4, "account_for_embedding_in_pipeline_split": True}),
     "= 9", cfg({"num_layers": 7, "pipeline_model_parallel_size": 4,
                 "account_for_embedding_in_pipeline_split": True})),
    ("pipeline.vpp-layers-divisible", "error",
     cfg({"num_layers": 32, "pipeline_model_parallel_size": 4,
          "virtual_pipeline_model_parallel_size": 3}), "virtual_pipeline_model_parallel_size=3",
     cfg({"num_layers": 32, "pipeline_model_parallel_size": 4,
          "virtual_pipeline_model_parallel_size": 2})),
    ("pipeline.vpp-layers-divisible", "error",
     cfg({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
          "num_layers_in_first_pipeline_stage": 3}), "first stage 3",
     cfg({"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2,
          "num_layers_in_first_pipeline_stage": 2})),
    ("pipeline.vpp-layers-divisible", "error",
     cfg({"num_layers": 9, "pipeline_model_parallel_size": 2,
          "virtual_pipeline_model_parallel_size": 2,
          "account_for_embedding_in_pipeline_split": True}), "5 layers per stage",
     cfg({"num_layers": 7, "pipeline_model_parallel_size": 2,
          "virtual_pipeline_model_parallel_size": 2,
          "account_for_embedding_in_pipeline_split": True})),
    ("pipeline.uneven-stage-positive", "error",
     cfg({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 0}),
     "num_layers_in_first_pipeline_stage=0",
     cfg({"pipeline_model_parallel_size": 2, "num_layers_in_first_pipeline_stage": 4})),
    ("pipeline.uneven-middle-divisible", "error",
     cfg({"num_layers": 9, "pipeline_model_parallel_size": 4,
          "num_layers_in_first_pipeline_stage": 2}), "7 middle layers",
     cfg({"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": 2,
          "num_layers_in_last_pipeline_stage": 2})),
    ("pipeline.uneven-exceeds-layers", "error",
     cfg({"num_layers": 4, "pipeline_model_parallel_size": 2,
          "num_layers_in_first_pipeline_stage": 6}), "num_layers=4",
     cfg({"num_layers": 4, "pipeline_model_parallel_size": 2,
          "num_layers_in_first_pipeline_stage": 3})),
    ("pipeline.uneven-vs-account-for", "error",
     cfg({"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": 1,
          "account_for_loss_in_pipeline_split": True}), "account_for_loss_in_pipeline_split",
     cfg({"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": 2})),
    ("pipeline.layout-conflict", "error",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t*3|t*3|tL",
          "num_layers_in_first_pipeline_stage": 1}), "num_layers_in_first_pipeline_stage=1",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t*3|t*3|tL"})),
    ("pipeline.layout-conflict", "error",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t*3|t*3|tL",
          "virtual_pipeline_model_parallel_size": 1}), "virtual_pipeline_model_parallel_size=1",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t*3|t*3|tL",
          "virtual_pipeline_model_parallel_size": 2})),
    ("pipeline.layout-valid", "error",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et|t|t|tL"}),
     "4 decoder layers",
     cfg({"pipeline_model_parallel_size": 2, "pipeline_model_parallel_layout": "Et*3|t*3|t|tL"})),
    ("pipeline.layout-valid", "error",
     cfg({"pipeline_model_parallel_size": 2,
          "pipeline_model_parallel_layout": [["embedding", "decoder"], ["decoder", "loss"]]}),
     "2 decoder layers",
     cfg({"pipeline_model_parallel_size": 2,
          "pipeline_model_parallel_layout": [["embedding"] + ["decoder"] * 4,
                                             ["decoder"] * 4 + ["loss"]]})),
    ("pipeline.defer-embedding-wgrad", "error",
     cfg({"pipeline_model_parallel_size": 2, "defer_embedding_wgrad_compute": True}),
     "gradient_accumulation_fusion=False",
     cfg({"pipeline_model_parallel_size": 2, "defer_embedding_wgrad_compute": True,
          "gradient_accumulation_fusion": True})),
    ("pipeline.vpp-not-a-memory-fix", "info", big(virtual_pipeline_model_parallel_size=10),
     "5 → 10", big(), big(), big()),
    ("pipeline.pp-raised-for-memory", "warning", big(pipeline_model_parallel_size=8),
     "4 → 8", big(64, pipeline_model_parallel_size=8), big(), big()),
    # C, L1: tensor / sequence parallel
    ("model.sizes-set", "error", cfg({"num_layers": 0, "hidden_size": 0}),
     "num_layers=0, hidden_size=0", cfg()),
    ("tp.sp-needs-tp", "error", cfg({"sequence_parallel": True}), "tensor_model_parallel_size=1",
     cfg({"sequence_parallel": True, "tensor_model_parallel_size": 2})),
    ("tp.heads-divisible", "error", cfg({"tensor_model_parallel_size": 3}),
     "num_attention_heads=8", cfg({"tensor_model_parallel_size": 4})),
    ("tp.query-groups-divisible", "error",
     cfg({"num_attention_heads": 12, "num_query_groups": 6, "tensor_model_parallel_size": 4}),
     "num_query_groups=6",
     cfg({"num_attention_heads": 12, "num_query_groups": 2, "tensor_model_parallel_size": 4})),
    ("tp.ep-tp-needs-sp", "warning",
     moe(expert_model_parallel_size=2, tensor_model_parallel_size=2), "sequence_parallel=False",
     moe(expert_model_parallel_size=2, tensor_model_parallel_size=2, sequence_parallel=True)),
    ("tp.mla-lora-divisible", "warning",
     cfg({"multi_latent_attention": True, "q_lora_rank": 100, "tensor_model_parallel_size": 8}),
     "q_lora_rank=100",
     cfg({"multi_latent_attention": True, "q_lora_rank": 1536, "tensor_model_parallel_size": 8})),
    ("attention.mla-rotary-interleaved", "error",
     cfg({"multi_latent_attention": True, "rotary_interleaved": True}), "rotary_interleaved=True",
     cfg({"multi_latent_attention": True})),
    ("attention.mla-rope-fusion-needs-yarn", "error",
     cfg({"multi_latent_attention": True, "apply_rope_fusion": True, "rope_type": "rope"}),
     "'rope'",
     cfg({"multi_latent_attention": True, "apply_rope_fusion": True, "rope_type": "yarn"})),
    ("tp.gdn-heads-divisible", "error",
     cfg({"experimental_attention_variant": "gated_delta_net", "linear_num_key_heads": 6,
          "linear_num_value_heads": 24, "tensor_model_parallel_size": 4}),
     "linear_num_key_heads=6",
     cfg({"experimental_attention_variant": "gated_delta_net", "linear_num_key_heads": 8,
          "linear_num_value_heads": 32, "tensor_model_parallel_size": 4})),
    ("tp.crosses-nvlink-domain", "warning",
     cfg({"num_attention_heads": 16, "tensor_model_parallel_size": 16},
         cluster={"gpus_per_node": 8}), "8 GPUs per node",
     cfg({"num_attention_heads": 16, "tensor_model_parallel_size": 16},
         cluster={"gpus_per_node": 4, "gpu": "GB200"})),
    ("tp.crosses-nvlink-domain", "warning",
     cfg({"num_attention_heads": 16, "tensor_model_parallel_size": 16}, cluster={"gpu": "H100"}),
     "NVLink domain of 8",
     cfg({"num_attention_heads": 16, "tensor_model_parallel_size": 8}, cluster={"gpu": "H100"})),
    ("tp.comm-overlap-needs-sp", "warning",
     cfg({"tensor_model_parallel_size": 2}, comm_overlap={"tp_comm_overlap": True}),
     "sequence_parallel=False",
     cfg({"tensor_model_parallel_size": 2, "sequence_parallel": True},
         comm_overlap={"tp_comm_overlap": True})),
    ("tp.raised-for-memory", "warning", big(tensor_model_parallel_size=8), "4 → 8",
     big(64, tensor_model_parallel_size=8), big(), big()),
    # D: context parallel
    ("cp.seq-divisible", "error", cfg({"context_parallel_size": 4, "seq_length": 10002}),
     "seq_length=10002", cfg({"context_parallel_size": 4, "seq_length": 8192})),
    ("cp.finetune-per-token-loss", "error",
     cfg({"context_parallel_size": 2, "seq_length": 4096},
         dataset={"_target_": "megatron.bridge.training.config.FinetuningDatasetConfig"}),
     "calculate_per_token_loss=False",
     cfg({"context_parallel_size": 2, "seq_length": 4096, "calculate_per_token_loss": True},
         dataset={"_target_": "megatron.bridge.training.config.FinetuningDatasetConfig"})),
    ("cp.hierarchical-sizes-required", "error",
     cfg({"context_parallel_size": 4, "cp_comm_type": "a2a+p2p"}), "'a2a+p2p'",
     cfg({"context_parallel_size": 4, "cp_comm_type": "a2a+p2p",
          "hierarchical_context_parallel_sizes": [2, 2]})),
    ("cp.hierarchical-product", "error",
     cfg({"context_parallel_size": 4, "hierarchical_context_parallel_sizes": [2, 4]}), "[2, 4]",
     cfg({"context_parallel_size": 4, "hierarchical_context_parallel_sizes": [2, 2]})),
    ("cp.comm-type-length", "error",
     cfg({"context_parallel_size": 2, "cp_comm_type": ["p2p"] * 3}), "3 entries",
     cfg({"context_parallel_size": 2, "cp_comm_type": ["p2p"] * 8})),
    ("cp.hierarchical-needs-mpu-pg", "warning",
     cfg({"context_parallel_size": 4, "hierarchical_context_parallel_sizes": [2, 2]},
         dist={"use_decentralized_pg": True}), "use_decentralized_pg=True",
     cfg({"context_parallel_size": 4, "hierarchical_context_parallel_sizes": [2, 2]},
         dist={"use_decentralized_pg": False})),
    ("cp.size-advice", "info", cfg({"seq_length": 65536}), "65536 tokens",
     cfg({"seq_length": 65536, "context_parallel_size": 16})),
    ("cp.dsa-needs-allgather", "error",
     cfg({"experimental_attention_variant": "dsa", "context_parallel_size": 2,
          "cp_comm_type": "p2p"}), "'p2p'",
     cfg({"experimental_attention_variant": "dsa", "context_parallel_size": 2,
          "cp_comm_type": "allgather"})),
    # I: MoE
    ("moe.flex-needs-backend", "warning", moe(**FLEX, moe_flex_dispatcher_backend=None),
     "moe_flex_dispatcher_backend=None", moe(**FLEX, moe_flex_dispatcher_backend="deepep")),
    ("moe.flex-backend-gpu", "error",
     {**moe(**FLEX, moe_flex_dispatcher_backend="deepep"), "cluster": {"gpu": "GB200"}},
     "GB200", {**moe(**FLEX, moe_flex_dispatcher_backend="deepep"), "cluster": {"gpu": "H100"}}),
    ("moe.deepep-flag-needs-flex", "error",
     moe(moe_enable_deepep=True, moe_token_dispatcher_type="alltoall"), "'alltoall'",
     moe(moe_enable_deepep=True, **FLEX)),
    ("moe.deepep-no-pad", "error",
     moe(**FLEX, moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
     "moe_pad_expert_input_to_capacity=True",
     moe(**FLEX, moe_flex_dispatcher_backend="hybridep", moe_expert_capacity_factor=1.0,
         moe_pad_expert_input_to_capacity=True)),
    ("moe.ncclep-needs-flex", "error",
     moe(moe_flex_dispatcher_backend="ncclep", moe_token_dispatcher_type="alltoall"),
     "'alltoall'", moe(moe_flex_dispatcher_backend="ncclep", **FLEX)),
    ("moe.deprecated-num-sms", "error", moe(moe_deepep_num_sms=20, moe_hybridep_num_sms=16),
     "different values", moe(moe_flex_dispatcher_num_sms=20)),
    ("moe.shared-overlap-dispatcher", "error",
     moe(moe_shared_expert_intermediate_size=64, moe_shared_expert_overlap=True),
     "'allgather'",
     moe(moe_shared_expert_intermediate_size=64, moe_shared_expert_overlap=True,
         moe_token_dispatcher_type="alltoall")),
    ("moe.shared-expert-size-positive", "error", moe(moe_shared_expert_intermediate_size=0),
     "moe_shared_expert_intermediate_size=0", moe(moe_shared_expert_intermediate_size=64)),
    ("moe.capacity-factor-load-balancing", "error",
     moe(moe_expert_capacity_factor=1.0, moe_router_load_balancing_type="sinkhorn"),
     "'sinkhorn'", moe(moe_expert_capacity_factor=1.0)),
    ("moe.pad-needs-capacity-factor", "error", moe(moe_pad_expert_input_to_capacity=True),
     "moe_expert_capacity_factor=None",
     moe(moe_pad_expert_input_to_capacity=True, moe_expert_capacity_factor=1.0)),
    ("moe.rank-capacity-needs-backend", "error",
     moe(**FLEX, moe_expert_rank_capacity_factor=1.2), "'deepep'",
     moe(**FLEX, moe_flex_dispatcher_backend="hybridep", moe_expert_rank_capacity_factor=1.2)),
    ("moe.ffn-size-defaults", "warning",
     cfg({**MOE, "moe_ffn_hidden_size": None, "ffn_hidden_size": 512}), "512",
     cfg({**MOE, "ffn_hidden_size": 512})),
    ("moe.bias-needs-etp1", "error",
     moe(add_bias_linear=True, tensor_model_parallel_size=2, expert_model_parallel_size=2),
     "expert_tensor_parallel_size=2",
     moe(add_bias_linear=True, tensor_model_parallel_size=2, expert_model_parallel_size=2,
         expert_tensor_parallel_size=1)),
    ("moe.expert-bias-score-function", "error", moe(moe_router_enable_expert_bias=True),
     "'softmax'",
     moe(moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid")),
    ("moe.topk1-needs-pre-softmax", "error", moe(moe_router_topk=1), "moe_router_topk=1",
     moe(moe_router_topk=1, moe_router_pre_softmax=True)),
    ("moe.group-routing", "error", moe(moe_router_group_topk=2),
     "moe_router_num_groups is not set", moe(moe_router_group_topk=2, moe_router_num_groups=4)),
    ("moe.router-padding-needs-quant", "error",
     moe(moe_router_padding_for_quantization=True, moe_token_dispatcher_type="alltoall"),
     "neither fp8 nor fp4",
     {**moe(moe_router_padding_for_quantization=True, moe_token_dispatcher_type="alltoall"),
      "mixed_precision": "bf16_with_fp8_current_scaling_mixed"}),
    ("moe.allgather-variable-seq", "error", moe(variable_seq_lengths=True),
     "variable_seq_lengths=True",
     moe(variable_seq_lengths=True, moe_token_dispatcher_type="alltoall")),
    ("moe.many-experts-fp32-router", "warning", moe(num_moe_experts=64), "num_moe_experts=64",
     moe(num_moe_experts=64, moe_router_dtype="fp32")),
    ("moe.force-balance-benchmark-only", "warning", moe(moe_router_force_load_balancing=True),
     "moe_router_force_load_balancing=True", moe()),
    # J: EP overlap
    ("moe-overlap.requirements", "error",
     {**moe(moe_token_dispatcher_type="alltoall"), "comm_overlap": EP_OVERLAP,
      "mixed_precision": "bf16_mixed"}, "expert_model_parallel_size=1",
     {**moe(moe_token_dispatcher_type="alltoall", expert_model_parallel_size=2),
      "comm_overlap": EP_OVERLAP, "mixed_precision": "bf16_mixed"}),
    ("moe-overlap.requirements", "error",
     {**moe(moe_token_dispatcher_type="alltoall", expert_model_parallel_size=2,
            pipeline_model_parallel_size=2),
      "comm_overlap": EP_OVERLAP, "mixed_precision": "bf16_mixed"},
     "pipeline_model_parallel_size=2",
     {**moe(moe_token_dispatcher_type="alltoall", expert_model_parallel_size=2,
            pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2),
      "comm_overlap": EP_OVERLAP, "mixed_precision": "bf16_mixed"}),
    ("moe-overlap.bridge-requirements", "error",
     {**moe(expert_model_parallel_size=2, recompute_granularity="selective",
            recompute_modules=["moe"]), "comm_overlap": EP_OVERLAP}, "'moe' in recompute_modules",
     {**moe(expert_model_parallel_size=2, recompute_granularity="selective",
            recompute_modules=["moe_act"]), "comm_overlap": EP_OVERLAP}),
    ("moe-overlap.delay-wgrad-needs-overlap", "error",
     {**moe(), "comm_overlap": {"delay_wgrad_compute": True}}, "delay_wgrad_compute=True",
     {**moe(), "comm_overlap": {"delay_wgrad_compute": True, **EP_OVERLAP}}),
    ("moe-overlap.early-release-needs-overlap", "error",
     moe(ep_overlap_early_attn_memory_release=True), "ep_overlap_early_attn_memory_release=True",
     {**moe(ep_overlap_early_attn_memory_release=True), "comm_overlap": EP_OVERLAP}),
    # K: precision
    ("precision.fp16-bf16-exclusive", "error", cfg({"bf16": True, "fp16": True}),
     "bf16=True and fp16=True", cfg({"bf16": True})),
    ("precision.optimizer-fp16-bf16-exclusive", "error",
     cfg(optimizer={"bf16": True, "fp16": True}), "optimizer.fp16=True",
     cfg(optimizer={"bf16": True})),
    ("precision.aware-optimizer-dtype-match", "error",
     cfg({"bf16": True}, optimizer={"use_precision_aware_optimizer": True,
                                    "use_distributed_optimizer": True}), "optimizer bf16=False",
     cfg({"bf16": True}, optimizer={"use_precision_aware_optimizer": True, "bf16": True,
                                    "use_distributed_optimizer": True})),
    ("precision.aware-optimizer-needs-adam", "error",
     cfg(optimizer={"use_precision_aware_optimizer": True, "optimizer": "sgd",
                    "use_distributed_optimizer": True}), "'sgd'",
     cfg(optimizer={"use_precision_aware_optimizer": True, "use_distributed_optimizer": True})),
    ("precision.aware-optimizer-needs-distopt", "error",
     cfg(optimizer={"use_precision_aware_optimizer": True}), "use_distributed_optimizer=False",
     cfg(optimizer={"use_precision_aware_optimizer": True},
         ddp={"use_distributed_optimizer": True})),
    ("precision.optimizer-dtypes-need-aware", "error",
     cfg(optimizer={"exp_avg_dtype": "bf16"}), "exp_avg_dtype=bf16",
     cfg(optimizer={"exp_avg_dtype": "torch.float32", "main_grads_dtype": "fp32"})),
    ("precision.fp8-recipe-valid", "error", cfg({"fp8": "e5m2"}), "fp8='e5m2'",
     cfg({"fp8": "hybrid"})),
    ("precision.custom-recipe-needs-factory", "error", mp_fp8(fp8_recipe="custom"),
     "fp8_quantizer_factory", mp_fp8(fp8_recipe="custom", fp8_quantizer_factory="pkg.factory")),
    ("precision.fp8-delayed-first-last-bf16", "error", mp_fp8(first_last_layers_bf16=True),
     "fp8_recipe='delayed'", mp_fp8(first_last_layers_bf16=True, fp8_recipe="tensorwise")),
    ("precision.bf16-layer-count-range", "error",
     mp_fp8(fp8_recipe="tensorwise", first_last_layers_bf16=True, pipeline_model_parallel_size=2,
            num_layers_at_start_in_bf16=5), "num_layers_at_start_in_bf16=5",
     mp_fp8(fp8_recipe="tensorwise", first_last_layers_bf16=True, pipeline_model_parallel_size=2,
            num_layers_at_start_in_bf16=4)),
    ("precision.bf16-layer-count-range", "error",
     cfg({"pipeline_model_parallel_size": 2},
         mixed_precision={"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                          "first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 6}),
     "num_layers_at_end_in_bf16=6",
     cfg({"pipeline_model_parallel_size": 2},
         mixed_precision={"bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
                          "first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 2})),
    ("precision.fp8-param-needs-fp8", "error", cfg({"fp8_param": True}), "fp8_param",
     mp_fp8(fp8_param=True)),
    ("precision.fp4-param-needs-fp4", "error", cfg({"fp4_param": True}), "fp4_param=True",
     cfg({"fp4_param": True, "fp4": "e2m1"})),
    ("precision.fp4-fp8-exclusive", "error",
     cfg(mixed_precision={"bf16": True, "fp4": "e2m1", "fp8": "hybrid"}), "fp4='e2m1'",
     cfg(mixed_precision={"bf16": True, "fp4": "e2m1"})),
    ("precision.mxfp8-param-gather-needs-reuse-buf", "error",
     cfg(mixed_precision={"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8",
                          "fp8_param_gather": True}), "reuse_grad_buf_for_mxfp8_param_ag=False",
     cfg(mixed_precision={"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8",
                          "fp8_param_gather": True, "reuse_grad_buf_for_mxfp8_param_ag": True})),
    ("precision.reuse-grad-buf-needs-fp8-param-gather", "error",
     cfg(mixed_precision={"bf16": True, "reuse_grad_buf_for_mxfp8_param_ag": True}),
     "fp8_param_gather=False",
     cfg(mixed_precision={"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8",
                          "fp8_param_gather": True, "reuse_grad_buf_for_mxfp8_param_ag": True})),
    ("precision.recipe-needs-blackwell", "warning",
     cfg(mixed_precision="bf16_with_mxfp8_mixed", cluster={"gpu": "H100"}), "H100",
     cfg(mixed_precision="bf16_with_mxfp8_mixed", cluster={"gpu": "B200"})),
    # L3, M: distributed optimizer, FSDP, checkpoint formats
    ("distopt.flags-out-of-sync", "warning", cfg(ddp={"use_distributed_optimizer": True}),
     "optimizer.use_distributed_optimizer=False",
     cfg(ddp={"use_distributed_optimizer": True}, optimizer={"use_distributed_optimizer": True})),
    ("fsdp.excludes-fsdp2", "error",
     cfg(ddp={"use_megatron_fsdp": True}, dist={"use_torch_fsdp2": True}),
     "use_torch_fsdp2=True",
     cfg(ddp={"use_megatron_fsdp": True}, dist={"use_torch_fsdp2": False})),
    ("fsdp.checkpoint-format", "error",
     cfg(ddp={"use_megatron_fsdp": True}, checkpoint={"save": "/ckpt",
                                                     "ckpt_format": "torch_dist"}),
     "'torch_dist'",
     cfg(ddp={"use_megatron_fsdp": True}, checkpoint={"save": "/ckpt",
                                                     "ckpt_format": "fsdp_dtensor"})),
    ("fsdp.manual-registration-needs-nccl-ub", "error",
     cfg(ddp={"use_megatron_fsdp": True, "fsdp_manual_registration": True}), "nccl_ub=False",
     cfg(ddp={"use_megatron_fsdp": True, "fsdp_manual_registration": True, "nccl_ub": True})),
    ("checkpoint.async-save-format", "error",
     cfg(checkpoint={"async_save": True, "ckpt_format": "torch"}), "'torch'",
     cfg(checkpoint={"async_save": True, "ckpt_format": "torch_dist"})),
    ("checkpoint.no-gloo-needs-dist-format", "error",
     cfg(dist={"use_gloo_process_groups": False}, optimizer={"use_distributed_optimizer": True},
         checkpoint={"ckpt_format": "torch"}), "'torch'",
     cfg(dist={"use_gloo_process_groups": False}, optimizer={"use_distributed_optimizer": True},
         checkpoint={"ckpt_format": "torch_dist"})),
    ("fsdp.v2-restrictions", "error",
     cfg({"tensor_model_parallel_size": 2}, ddp={"megatron_fsdp_version": 2},
         mixed_precision="bf16_mixed"), "TP=2",
     cfg(ddp={"megatron_fsdp_version": 2}, mixed_precision="bf16_mixed")),
    ("fsdp.torch-fsdp2-unsupported", "warning",
     cfg({"pipeline_model_parallel_size": 2}, dist={"use_torch_fsdp2": True}), "PP=2",
     cfg({"pipeline_model_parallel_size": 2}, dist={"use_torch_fsdp2": False})),
    # N: packing
    ("packing.modes-exclusive", "error",
     cfg(dataset={"enable_offline_packing": True, "enable_in_batch_packing": True}),
     "enable_in_batch_packing=True", cfg(dataset={"enable_in_batch_packing": True})),
    ("packing.offline-needs-specs", "error", cfg(dataset={"enable_offline_packing": True}),
     "without offline_packing_specs",
     cfg(dataset={"enable_offline_packing": True,
                  "offline_packing_specs": {"packed_sequence_size": 8192}})),
    ("packing.pad-cu-seqlens-needs-pad", "error",
     cfg(dataset={"offline_packing_specs": {"pad_cu_seqlens": True}}), "pad_cu_seqlens=True",
     cfg(dataset={"offline_packing_specs": {"pad_cu_seqlens": True},
                  "pad_to_max_length": True})),
    ("packing.offline-mbs1", "error",
     cfg(train={"micro_batch_size": 2, "global_batch_size": 64},
         dataset={"packed_sequence_specs": {"packed_sequence_size": 8192}}),
     "micro_batch_size=2",
     cfg(train={"micro_batch_size": 1, "global_batch_size": 32},
         dataset={"packed_sequence_specs": {"packed_sequence_size": 16384}})),
    ("packing.in-batch-mbs", "error", cfg(dataset={"enable_in_batch_packing": True}),
     "micro_batch_size=1",
     cfg(train={"micro_batch_size": 4}, dataset={"enable_in_batch_packing": True})),
    ("packing.seq-padding-multiple", "error",
     cfg({"context_parallel_size": 2, "tensor_model_parallel_size": 4, "sequence_parallel": True},
         dataset={"enable_in_batch_packing": True, "seq_length": 4100}), "seq_length=4100",
     cfg({"context_parallel_size": 2, "tensor_model_parallel_size": 4, "sequence_parallel": True},
         dataset={"enable_in_batch_packing": True, "seq_length": 4096})),
    ("dataset.seq-length-match", "error",
     cfg({"seq_length": 4096}, dataset={"seq_length": 8192}), "dataset.seq_length=8192",
     cfg({"seq_length": 4096}, dataset={"seq_length": 4096})),
    # O: misc
    ("peft.needs-pretrained-checkpoint", "error", cfg(peft={"dim": 8}), "peft",
     cfg(peft={"dim": 8}, checkpoint={"pretrained_checkpoint": "/base"})),
    ("scheduler.samples-vs-iters", "error",
     cfg(train={"train_samples": 1000}, scheduler={"lr_decay_iters": 100}),
     "lr_decay_iters=100",
     cfg(train={"train_samples": 1000}, scheduler={"lr_decay_samples": 1000})),
    ("scheduler.warmup-before-decay", "warning",
     cfg(train={"train_iters": 100}, scheduler={"lr_warmup_iters": 500}), "lr_warmup_iters=500",
     cfg(train={"train_iters": 100}, scheduler={"lr_warmup_iters": 50})),
    ("modelopt.no-grad-accum-fusion", "error",
     cfg({"restore_modelopt_state": True, "gradient_accumulation_fusion": True}),
     "gradient_accumulation_fusion=True", cfg({"restore_modelopt_state": True})),
]


def _params() -> list[Any]:
    seen: dict[str, int] = {}
    out = []
    for case in CASES:
        rule_id = case[0]
        seen[rule_id] = seen.get(rule_id, 0) + 1
        out.append(pytest.param(*case, *([None] * (7 - len(case))),
                                id=f"{rule_id}-{seen[rule_id]}"))
    return out


def _findings(config: dict[str, Any], baseline: dict[str, Any] | None, rule_id: str) -> list:
    report = validate(TrainingConfig.model_validate(config),
                      TrainingConfig.model_validate(baseline) if baseline else None)
    return [f for f in report.findings if f.rule_id == rule_id]


@pytest.mark.parametrize(("rule_id", "severity", "bad", "value", "good", "bad_base",
                          "good_base"), _params())
def test_rule(rule_id: str, severity: str, bad: dict[str, Any], value: str,
              good: dict[str, Any], bad_base: dict[str, Any] | None,
              good_base: dict[str, Any] | None) -> None:
    hits = _findings(bad, bad_base, rule_id)
    assert hits, f"{rule_id} did not fire"
    assert hits[0].severity == severity == get_rule(rule_id).severity
    assert value in hits[0].message, hits[0].message
    assert hits[0].fix and hits[0].fields
    assert not _findings(good, good_base, rule_id), f"{rule_id} fired on the nearby config"


def _mine() -> list[Any]:
    return [r for r in RULES if r.check.__module__.rsplit(".", 1)[-1] in MODULES]


def test_every_rule_has_a_case() -> None:
    tested = {case[0] for case in CASES}
    assert {r.id for r in _mine()} == tested


def test_baseline_rules_quiet_without_baseline() -> None:
    for rule_id in ("tp.raised-for-memory", "pipeline.pp-raised-for-memory",
                    "pipeline.vpp-not-a-memory-fix"):
        assert not _findings(big(tensor_model_parallel_size=8, pipeline_model_parallel_size=8,
                                 virtual_pipeline_model_parallel_size=10), None, rule_id)


ODD: list[dict[str, Any]] = [
    {},
    {"model": {"num_layers": None, "num_attention_heads": None, "seq_length": None}},
    {"model": {**M, "pipeline_model_parallel_layout": "((E|t", "pipeline_model_parallel_size": 3}},
    {"model": {**M, "pipeline_model_parallel_layout": [["nope"]], "mtp_num_layers": 2}},
    {"model": {**M, "pipeline_model_parallel_layout": "",
               "virtual_pipeline_model_parallel_size": 4}},
    {"model": {**MOE, "moe_router_load_balancing_type": [], "moe_router_group_topk": 3,
               "moe_router_num_groups": 5, "moe_expert_capacity_factor": -1.0,
               "moe_deepep_num_sms": "x", "rope_type": None, "linear_num_key_heads": "x",
               "experimental_attention_variant": "gdn", "wgrad_deferral_limit": "x",
               "defer_embedding_wgrad_compute": True}},
    {"model": M, "dataset": "not a dict", "dist": [], "checkpoint": 3, "scheduler": None,
     "peft": None, "train": {"train_samples": None}},
    {"model": M, "dataset": {"packed_sequence_specs": {"packed_sequence_size": True},
                             "seq_length": "long", "offline_packing_specs": 3}},
    {"model": M, "mixed_precision": "no_such_recipe", "cluster": {"gpu": "Z9000"}},
    # a catalogued GPU whose compute capability is unpublished (Rubin: sm null)
    {"model": {**MOE, **FLEX, "moe_flex_dispatcher_backend": "hybridep"},
     "cluster": {"gpu": "VR200"}},
    {"model": {**MOE, **FLEX, "moe_flex_dispatcher_backend": "deepep"},
     "cluster": {"gpu": "VR200"}},
    {"model": M, "mixed_precision": {"fp8_margin": "x", "fp8": "hybrid",
                                     "first_last_layers_bf16": True, "fp8_recipe": "tensorwise"},
     "optimizer": {"main_grads_dtype": object(), "optimizer": "lion"}},
]


@pytest.mark.parametrize("config", ODD)
def test_odd_configs_do_not_raise(config: dict[str, Any]) -> None:
    c = TrainingConfig.model_validate(config)
    from mbridge_perf.config.derived import derive

    d = derive(c, TrainingConfig.model_validate({"model": {"num_layers": 4}}))
    for r in _mine():
        r.check(c, d)
