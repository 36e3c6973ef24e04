"""Rules of the memory areas: recompute (E), offloading (F, X1–X2), CUDA graphs (G), allocator
and NCCL environment (H, G17, X3) and attention backend (X4).

Every rule has one config that triggers it (id, severity and the user's value in the message)
and one nearby config that does not."""

from __future__ import annotations

from typing import Any

import pytest

import mbridge_perf.rules.attention
import mbridge_perf.rules.cudagraph
import mbridge_perf.rules.env
import mbridge_perf.rules.offload
import mbridge_perf.rules.recompute
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import RULES, get_rule
from mbridge_perf.rules.validate import Finding, validate

MODULES = (mbridge_perf.rules.recompute, mbridge_perf.rules.offload,
           mbridge_perf.rules.cudagraph, mbridge_perf.rules.env, mbridge_perf.rules.attention)
BASE = {"num_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 1024,
        "bf16": True}
MOE = {"num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
       "add_bias_linear": False}
GRAPHS = {"use_te_rng_tracker": True, "cuda_graph_impl": "transformer_engine"}
FULL = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
SEL = {"recompute_granularity": "selective"}
CPU = {"cpu_offloading": True, "cpu_offloading_num_layers": 2}
FG = {"fine_grained_activation_offloading": True, "offload_modules": ["core_attn"]}
EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def cfg(model: dict[str, Any] | None = None, **sections: Any) -> TrainingConfig:
    return TrainingConfig.model_validate({"model": {**BASE, **(model or {})}, **sections})


def findings(c: TrainingConfig, rule_id: str, baseline: TrainingConfig | None = None
             ) -> list[Finding]:
    return [f for f in validate(c, baseline).findings if f.rule_id == rule_id]


# (rule id, triggering config, nearby config that does not trigger, text the message contains)
CASES: list[tuple[str, TrainingConfig, TrainingConfig, str]] = [
    # E: recompute
    ("recompute.granularity-valid", cfg({"recompute_granularity": "partial"}), cfg(SEL),
     "'partial'"),
    ("recompute.method-valid", cfg({**FULL, "recompute_method": "every"}), cfg(FULL), "'every'"),
    ("recompute.full-needs-method", cfg({"recompute_granularity": "full",
                                         "recompute_num_layers": 1}), cfg(FULL), '"full"'),
    ("recompute.full-needs-num-layers", cfg({"recompute_granularity": "full",
                                             "recompute_method": "uniform"}), cfg(FULL),
     "recompute_num_layers"),
    ("recompute.num-layers-range", cfg({**FULL, "recompute_method": "block",
                                        "recompute_num_layers": 9}),
     cfg({**FULL, "recompute_num_layers": 4}), "recompute_num_layers=9"),
    ("recompute.selective-no-num-layers", cfg({**SEL, "recompute_num_layers": 2}), cfg(SEL),
     "recompute_num_layers=2"),
    ("recompute.distribute-saved-vs-sp",
     cfg({**FULL, "distribute_saved_activations": True, "sequence_parallel": True,
          "tensor_model_parallel_size": 2}),
     cfg({"distribute_saved_activations": True, "sequence_parallel": True,
          "tensor_model_parallel_size": 2}), "sequence_parallel=True"),
    ("recompute.unknown-module", cfg({**SEL, "recompute_modules": ["up_proj"]}),
     cfg({**SEL, "recompute_modules": ["mla_up_proj"], "multi_latent_attention": True}),
     "'up_proj' (did you mean 'mla_up_proj'?)"),
    ("recompute.moe-act-needs-grouped-gemm", cfg({**MOE, **SEL, "recompute_modules": ["moe_act"]}),
     cfg({**MOE, **SEL, "recompute_modules": ["moe_act"], "moe_grouped_gemm": True}),
     "moe_grouped_gemm=False"),
    ("recompute.mla-up-proj-needs-mla", cfg({**SEL, "recompute_modules": ["mla_up_proj"]}),
     cfg({**SEL, "recompute_modules": ["mla_up_proj"], "multi_latent_attention": True}),
     "multi_latent_attention=False"),
    ("recompute.gdn-norm-out-needs-gdn", cfg({**SEL, "recompute_modules": ["gdn_norm_out"]}),
     cfg({**SEL, "recompute_modules": ["gdn_norm_out"], "experimental_attention_variant": "gdn"}),
     "experimental_attention_variant=None"),
    ("recompute.core-attn-fused", cfg({**SEL, "attention_backend": "flash"}),
     cfg({**SEL, "attention_backend": "unfused"}), "attention_backend='flash'"),
    ("recompute.mlp-costly", cfg({**SEL, "recompute_modules": ["mlp"]}),
     cfg({**MOE, **SEL, "recompute_modules": ["mlp"]}), "mlp on a dense model"),
    ("recompute.full-before-selective", cfg(FULL), cfg(SEL), 'recompute_granularity="full"'),
    ("recompute.shared-experts-vs-overlap",
     cfg({**MOE, **SEL, "recompute_modules": ["shared_experts"], "moe_shared_expert_overlap": True,
          "moe_shared_expert_intermediate_size": 32}),
     cfg({**MOE, **SEL, "recompute_modules": ["shared_experts"],
          "moe_shared_expert_intermediate_size": 32}), "moe_shared_expert_overlap=True"),
    ("recompute.fp8-delayed-modules",
     cfg({**SEL, "recompute_modules": ["layernorm"], "fp8": "hybrid"}),
     cfg({**SEL, "recompute_modules": ["layernorm"], "fp8": "hybrid",
          "fp8_recipe": "tensorwise"}), "fp8_recipe='delayed'"),
    ("recompute.moe-layer-recompute-vs-full", cfg({**MOE, **FULL, "moe_layer_recompute": True}),
     cfg({**MOE, **FULL}), 'recompute_granularity="full"'),
    ("recompute.moe-layer-recompute-deprecated", cfg({**MOE, "moe_layer_recompute": True}),
     cfg({**MOE, **SEL, "recompute_modules": ["moe"]}), "['core_attn', 'moe']"),
    ("recompute.full-needs-full-iteration-graph", cfg({**FULL, **GRAPHS}),
     cfg({**FULL, **GRAPHS, "cuda_graph_impl": "full_iteration"}),
     'cuda_graph_impl="transformer_engine"'),
    ("recompute.moe-vs-router-graph",
     cfg({**MOE, **SEL, **GRAPHS, "recompute_modules": ["moe"], "hidden_dropout": 0.0,
          "cuda_graph_modules": ["moe_router"]}),
     cfg({**MOE, **SEL, **GRAPHS, "recompute_modules": ["moe"], "hidden_dropout": 0.0,
          "cuda_graph_modules": ["attn"]}), "moe_router"),
    ("recompute.graphed-dropout",
     cfg({**SEL, **GRAPHS, "recompute_modules": ["mlp"], "hidden_dropout": 0.2,
          "cuda_graph_modules": ["mlp"]}),
     cfg({**SEL, **GRAPHS, "recompute_modules": ["mlp"], "hidden_dropout": 0.2,
          "cuda_graph_modules": ["attn"]}), "hidden_dropout=0.2"),
    # F: offloading
    ("offload.cpu-num-layers-range", cfg({**CPU, "cpu_offloading_num_layers": 4}), cfg(CPU),
     "cpu_offloading_num_layers=4"),
    ("offload.cpu-needs-pp1", cfg({**CPU, "pipeline_model_parallel_size": 4}), cfg(CPU),
     "pipeline_model_parallel_size=4"),
    ("offload.cpu-excludes-recompute", cfg({**CPU, **SEL}), cfg(CPU), "'selective'"),
    ("offload.cpu-excludes-cuda-graphs", cfg({**CPU, **GRAPHS}),
     cfg({**CPU, **GRAPHS, "cuda_graph_impl": "full_iteration"}),
     'cuda_graph_impl="transformer_engine"'),
    ("offload.fine-grained-excludes-cpu", cfg({**FG, **CPU}), cfg(FG), "cpu_offloading=True"),
    ("offload.fine-grained-modules", cfg({**FG, "offload_modules": ["attn_proj"]}),
     cfg({**FG, "offload_modules": ["core_attn", "attn_proj"]}), "['attn_proj']"),
    ("offload.fine-grained-vs-moe-recompute",
     cfg({**MOE, **SEL, **FG, "recompute_modules": ["moe"], "offload_modules": ["expert_fc1"]}),
     cfg({**MOE, **SEL, **FG, "recompute_modules": ["moe_act"], "moe_grouped_gemm": True,
          "offload_modules": ["expert_fc1"]}), "['expert_fc1']"),
    ("offload.fused-group-mlp", cfg({**MOE, **FG, "offload_modules": ["fused_group_mlp"]}),
     cfg({**MOE, **FG, "offload_modules": ["fused_group_mlp"],
          "use_transformer_engine_op_fuser": True}), "use_transformer_engine_op_fuser"),
    ("offload.fine-grained-graphs", cfg({**FG, **GRAPHS, "cuda_graph_warmup_steps": 0}),
     cfg({**FG, **GRAPHS}), "cuda_graph_warmup_steps=0"),
    ("offload.fine-grained-needs-te", cfg({**FG, "transformer_impl": "local"}), cfg(FG),
     '"local"'),
    ("offload.fine-grained-cpu-offload-v1", cfg(FG, env={"NVTE_CPU_OFFLOAD_V1": "0"}),
     cfg(FG, env={"NVTE_CPU_OFFLOAD_V1": "1"}), "is '0'"),
    ("offload.optimizer-needs-adamw",
     cfg(optimizer={"optimizer_cpu_offload": True, "decoupled_weight_decay": False}),
     cfg(optimizer={"optimizer_cpu_offload": True}), "decoupled_weight_decay=False"),
    ("offload.optimizer-without-distopt",
     cfg(optimizer={"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0}),
     cfg(optimizer={"optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0},
         ddp={"use_distributed_optimizer": True}), "optimizer_cpu_offload=True"),
    ("offload.optimizer-fraction-zero", cfg(optimizer={"optimizer_cpu_offload": True}),
     cfg(optimizer={"optimizer_cpu_offload": True, "optimizer_offload_fraction": 0.5}),
     "optimizer_offload_fraction=0.0"),
    ("offload.paged-stash-requirements", cfg({**MOE, **CPU, "moe_paged_stash": True}),
     cfg({**MOE, "moe_paged_stash": True, "moe_expert_rank_capacity_factor": 1.5}),
     "cpu_offloading=True"),
    ("offload.cpu-needs-target", cfg({**CPU, "cpu_offloading_activations": False}),
     cfg({**CPU, "cpu_offloading_activations": False, "cpu_offloading_weights": True}),
     "cpu_offloading_weights=False"),
    ("offload.activation-layers-zero-means-off", cfg({"cpu_offloading": True}), cfg(CPU),
     "cpu_offloading_num_layers=0"),
    # G: CUDA graphs
    ("cudagraph.te-rng-tracker", cfg({"cuda_graph_impl": "transformer_engine"}),
     cfg({"cuda_graph_impl": "transformer_engine"}, rng={"te_rng_tracker": True}),
     "use_te_rng_tracker=False"),
    ("cudagraph.local-full-iteration-only",
     cfg({**GRAPHS, "cuda_graph_impl": "local", "cuda_graph_modules": ["attn"]}),
     cfg({**GRAPHS, "cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}),
     "['attn']"),
    ("cudagraph.full-iteration-nan-check", cfg({**GRAPHS, "cuda_graph_impl": "full_iteration"}),
     cfg({**GRAPHS, "cuda_graph_impl": "full_iteration"},
         rerun_state_machine={"check_for_nan_in_loss": False}), "check_for_nan_in_loss=True"),
    ("cudagraph.impl-valid", cfg({**GRAPHS, "cuda_graph_impl": "te"}), cfg(GRAPHS), "'te'"),
    ("cudagraph.full-iteration-no-modules",
     cfg({**GRAPHS, "cuda_graph_impl": "full_iteration", "cuda_graph_modules": ["attn"]}),
     cfg({**GRAPHS, "cuda_graph_impl": "full_iteration", "cuda_graph_modules": []}), "['attn']"),
    ("cudagraph.legacy-flags", cfg({**GRAPHS, "enable_cuda_graph": True}),
     cfg({"use_te_rng_tracker": True, "enable_cuda_graph": True}), "enable_cuda_graph=True"),
    ("cudagraph.scope-and-modules",
     cfg({**GRAPHS, "cuda_graph_scope": ["attn"], "cuda_graph_modules": ["mlp"]}),
     cfg({**GRAPHS, "cuda_graph_modules": ["mlp"]}), "['attn']"),
    ("cudagraph.deprecated-fields", cfg({**GRAPHS, "cuda_graph_scope": "attn,mlp"}),
     cfg({**GRAPHS, "cuda_graph_modules": ["attn", "mlp"]}), "'attn,mlp'"),
    ("cudagraph.unknown-module", cfg({**GRAPHS, "cuda_graph_modules": ["attention"]}),
     cfg({**GRAPHS, "cuda_graph_modules": ["attn"]}), "'attention'"),
    ("cudagraph.moe-router-exclusive",
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe", "moe_router"]}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router"]}), "['moe', 'moe_router']"),
    ("cudagraph.preprocess-needs-router",
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_preprocess"]}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router", "moe_preprocess"]}),
     "['moe_preprocess']"),
    ("cudagraph.moe-needs-moe", cfg({**GRAPHS, "cuda_graph_modules": ["moe_router"]}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router"]}), "num_moe_experts=None"),
    ("cudagraph.mlp-needs-dense", cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["mlp"]}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["mlp"], "moe_layer_freq": [0, 1, 1, 1]}),
     "moe_layer_freq=1"),
    ("cudagraph.moe-needs-drop-pad", cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe"]}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe"], "moe_expert_capacity_factor": 1.0,
          "moe_pad_expert_input_to_capacity": True}), "moe_pad_expert_input_to_capacity=False"),
    ("cudagraph.preprocess-dtoh",
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router", "moe_preprocess"],
          "moe_token_dispatcher_type": "alltoall", "moe_expert_capacity_factor": 1.25}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router"],
          "moe_token_dispatcher_type": "alltoall", "moe_expert_capacity_factor": 1.25}),
     "moe_expert_capacity_factor=1.25"),
    ("cudagraph.ep-overlap-modules",
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["mlp"]},
         comm_overlap={"overlap_moe_expert_parallel_comm": True}),
     cfg({**MOE, **GRAPHS, "cuda_graph_modules": ["moe_router"]},
         comm_overlap={"overlap_moe_expert_parallel_comm": True}), "['mlp']"),
    ("cudagraph.delay-wgrad-graph",
     cfg({**GRAPHS, "cuda_graph_modules": ["attn"], "gradient_accumulation_fusion": True},
         comm_overlap={"delay_wgrad_compute": True}),
     cfg({**GRAPHS, "cuda_graph_modules": ["attn"], "gradient_accumulation_fusion": True,
          "add_bias_linear": False}, comm_overlap={"delay_wgrad_compute": True}),
     "add_bias_linear=True"),
    ("cudagraph.mamba-module-for-gdn",
     cfg({**GRAPHS, "cuda_graph_modules": ["mamba"], "experimental_attention_variant": "gdn"}),
     cfg({**GRAPHS, "cuda_graph_modules": ["attn"], "experimental_attention_variant": "gdn"}),
     "'gdn'"),
    # H: environment
    ("env.expandable-vs-nccl-ub", cfg(ddp={"nccl_ub": True},
                                      env={"PYTORCH_CUDA_ALLOC_CONF":
                                           "max_split_size_mb:512,expandable_segments:True"}),
     cfg(ddp={"nccl_ub": True}, env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:512"}),
     "'max_split_size_mb:512,expandable_segments:True'"),
    ("env.graph-register", cfg(GRAPHS, env={**EXPANDABLE, "NCCL_GRAPH_REGISTER": "1"}),
     cfg(GRAPHS, env={**EXPANDABLE, "NCCL_GRAPH_REGISTER": "0"}), "NCCL_GRAPH_REGISTER '1'"),
    ("env.graphs-want-expandable",
     cfg(GRAPHS, env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}),
     cfg(GRAPHS, env={**EXPANDABLE, "NCCL_GRAPH_REGISTER": "0"}), "'expandable_segments:False'"),
    ("env.expandable-segments-missing",
     cfg(env={"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}),
     cfg(env={"PYTORCH_ALLOC_CONF": "expandable_segments:True"}), "'max_split_size_mb:256'"),
    ("env.fsdp-device-connections",
     cfg(ddp={"use_megatron_fsdp": True}, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}),
     cfg(ddp={"use_megatron_fsdp": True}, env={"CUDA_DEVICE_MAX_CONNECTIONS": "8"}),
     "CUDA_DEVICE_MAX_CONNECTIONS='1'"),
    ("env.deterministic-nccl-algo",
     cfg({"deterministic_mode": True, "cross_entropy_loss_fusion": False},
         env={"NCCL_ALGO": "NVLS"}),
     cfg({"deterministic_mode": True, "cross_entropy_loss_fusion": False},
         env={"NCCL_ALGO": "Ring"}), "'NVLS'"),
    ("env.deterministic-no-ce-fusion", cfg({"deterministic_mode": True}, env={"NCCL_ALGO": "Ring"}),
     cfg({"deterministic_mode": True, "cross_entropy_loss_fusion": False},
         env={"NCCL_ALGO": "Ring"}), "cross_entropy_loss_fusion=True"),
    ("env.deterministic-no-flash", cfg({"deterministic_mode": True, "attention_backend": "flash"}),
     cfg({"deterministic_mode": True, "attention_backend": "fused"}), '"flash"'),
    # X4: attention
    ("attention.unfused-long-seq", cfg({"attention_backend": "unfused", "seq_length": 8192}),
     cfg({"attention_backend": "unfused", "seq_length": 1024}), "seq_length=8192"),
]


@pytest.mark.parametrize(("rule_id", "bad", "good", "text"), CASES, ids=[c[0] for c in CASES])
def test_rule_triggers_and_nearby_config_passes(rule_id: str, bad: TrainingConfig,
                                                good: TrainingConfig, text: str) -> None:
    hits = findings(bad, rule_id)
    assert len(hits) == 1, f"{rule_id} did not fire: {validate(bad).findings}"
    assert hits[0].severity == get_rule(rule_id).severity
    assert text in hits[0].message, hits[0].message
    assert hits[0].fix
    assert not findings(good, rule_id), findings(good, rule_id)


def test_every_rule_of_these_modules_is_covered() -> None:
    mine = {r.id for r in RULES if r.check.__module__ in {m.__name__ for m in MODULES}}
    assert mine == {c[0] for c in CASES}


def test_required_ids_and_severities() -> None:
    required = {
        "recompute.granularity-valid": "error", "recompute.full-needs-method": "error",
        "recompute.full-needs-num-layers": "error", "recompute.selective-no-num-layers": "error",
        "recompute.distribute-saved-vs-sp": "error", "recompute.unknown-module": "error",
        "recompute.moe-act-needs-grouped-gemm": "error",
        "recompute.mla-up-proj-needs-mla": "error", "recompute.core-attn-fused": "warning",
        "recompute.shared-experts-vs-overlap": "error",
        "recompute.fp8-delayed-modules": "error",
        "recompute.full-needs-full-iteration-graph": "error",
        "recompute.moe-vs-router-graph": "error", "offload.cpu-num-layers-range": "error",
        "offload.cpu-needs-pp1": "error", "offload.cpu-excludes-recompute": "error",
        "offload.cpu-excludes-cuda-graphs": "error", "offload.fine-grained-excludes-cpu": "error",
        "offload.optimizer-needs-adamw": "error", "offload.cpu-needs-target": "error",
        "cudagraph.te-rng-tracker": "error", "cudagraph.local-full-iteration-only": "error",
        "cudagraph.moe-needs-drop-pad": "error", "env.expandable-vs-nccl-ub": "error",
        "env.graph-register": "error", "env.graphs-want-expandable": "warning",
        "attention.unfused-long-seq": "warning", "env.expandable-segments-missing": "info",
        "recompute.mlp-costly": "info", "recompute.full-before-selective": "info",
    }
    assert {rid: get_rule(rid).severity for rid in required} == required


def test_unknown_label_hints() -> None:
    msg = findings(cfg({**SEL, "recompute_modules": ["norm", "attention", "core_atn", "xyz"]}),
                   "recompute.unknown-module")[0].message
    assert "'norm' (did you mean 'layernorm'?)" in msg
    assert "'attention' (did you mean 'core_attn'?)" in msg
    assert "'core_atn' (did you mean 'core_attn'?)" in msg
    assert "'xyz'" in msg and "'xyz' (did" not in msg


def test_unknown_label_only_checked_for_selective() -> None:
    assert not findings(cfg({**FULL, "recompute_modules": ["bogus"]}), "recompute.unknown-module")
    assert not findings(cfg({"recompute_modules": []}), "recompute.unknown-module")
    assert not findings(cfg({**SEL, "recompute_modules": []}), "recompute.unknown-module")


def test_full_recompute_num_layers_not_range_checked_as_error() -> None:
    """Megatron-Core only requires a value (cpu-ground-truth §8: block, 9 > layers/PP passes);
    the range is a separate warning."""
    c = cfg({**FULL, "recompute_method": "block", "recompute_num_layers": 9,
             "pipeline_model_parallel_size": 2, "pipeline_dtype": "bf16"})
    assert not findings(c, "recompute.full-needs-num-layers")
    assert "2 layers per pipeline stage" in findings(c, "recompute.num-layers-range")[0].message
    zero = cfg({**FULL, "recompute_num_layers": 0})
    assert "hangs" in findings(zero, "recompute.num-layers-range")[0].message


def test_core_attn_default_modules_count() -> None:
    """Selective with recompute_modules unset means ["core_attn"]."""
    hit = findings(cfg(SEL), "recompute.core-attn-fused")
    assert hit and "default" in hit[0].message
    assert not findings(cfg({**SEL, "transformer_impl": "local"}), "recompute.core-attn-fused")


def test_full_before_selective_uses_baseline() -> None:
    full = cfg(FULL)
    assert findings(full, "recompute.full-before-selective", baseline=cfg())
    assert "baseline" in findings(full, "recompute.full-before-selective", cfg())[0].message
    assert not findings(full, "recompute.full-before-selective", baseline=cfg(SEL))


def test_legacy_full_iteration_spelling_is_full_iteration() -> None:
    legacy = {**GRAPHS, "cuda_graph_impl": "local", "cuda_graph_scope": ["full_iteration"]}
    assert not findings(cfg({**FULL, **legacy}), "recompute.full-needs-full-iteration-graph")
    assert not findings(cfg({**CPU, **legacy}), "offload.cpu-excludes-cuda-graphs")
    assert findings(cfg(legacy), "cudagraph.full-iteration-nan-check")


def test_deprecated_flags_enable_graphs() -> None:
    """enable_cuda_graph / external_cuda_graph turn graphs on (local / transformer_engine)."""
    c = cfg({"external_cuda_graph": True}, env=EXPANDABLE)
    assert findings(c, "cudagraph.te-rng-tracker")
    assert findings(c, "env.graph-register")
    assert "external_cuda_graph=True → cuda_graph_impl" in findings(
        c, "cudagraph.deprecated-fields")[0].message


def test_graphs_off_clears_modules() -> None:
    """cuda_graph_impl none: modules are cleared (Bridge), so no module rule fires."""
    c = cfg({"cuda_graph_modules": ["moe", "moe_router", "bogus"]})
    ids = {f.rule_id for f in validate(c).findings}
    assert not ids & {"cudagraph.moe-router-exclusive", "cudagraph.moe-needs-moe",
                      "cudagraph.unknown-module"}


def test_local_impl_adds_router_and_preprocess() -> None:
    c = cfg({**MOE, **GRAPHS, "cuda_graph_impl": "local", "cuda_graph_modules": ["moe_preprocess"]})
    assert not findings(c, "cudagraph.preprocess-needs-router")
    assert findings(c, "cudagraph.local-full-iteration-only")


def test_moe_layer_recompute_feeds_graph_checks() -> None:
    c = cfg({**MOE, **GRAPHS, "moe_layer_recompute": True, "hidden_dropout": 0.0,
             "cuda_graph_modules": ["moe_router"]})
    assert findings(c, "recompute.moe-vs-router-graph")


def test_expandable_rules_do_not_double_fire() -> None:
    graphs = cfg(GRAPHS)
    ids = {f.rule_id for f in validate(graphs).findings}
    assert "env.graphs-want-expandable" in ids
    assert "env.expandable-segments-missing" not in ids
    plain = cfg()
    assert "PYTORCH_CUDA_ALLOC_CONF is not set" in findings(
        plain, "env.expandable-segments-missing")[0].message
    for c in (cfg(ddp={"nccl_ub": True}), cfg(GRAPHS, ddp={"nccl_ub": True}),
              cfg(env={"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"})):
        ids = {f.rule_id for f in validate(c).findings}
        assert not ids & {"env.graphs-want-expandable", "env.expandable-segments-missing"}


def test_alloc_conf_parsing() -> None:
    spaced = cfg(GRAPHS, env={"PYTORCH_CUDA_ALLOC_CONF":
                              "max_split_size_mb:512, expandable_segments:True"})
    assert findings(spaced, "env.graph-register")
    other = cfg(GRAPHS, env={"PYTORCH_CUDA_ALLOC_CONF": "garbage,,:,expandable_segments"})
    assert not findings(other, "env.graph-register")
    assert findings(other, "env.graphs-want-expandable")


def test_attention_fp32_falls_back_to_unfused() -> None:
    c = cfg({"bf16": False, "seq_length": 8192})
    msg = findings(c, "attention.unfused-long-seq")[0].message
    assert "FP32" in msg and "GiB" in msg
    assert not findings(cfg({"seq_length": 8192}), "attention.unfused-long-seq")


def test_x2_zero_layers_and_f2_both_reported() -> None:
    c = cfg({"cpu_offloading": True, "pipeline_model_parallel_size": 2, "pipeline_dtype": "bf16"})
    ids = [f.rule_id for f in validate(c).findings]
    assert "offload.activation-layers-zero-means-off" in ids and "offload.cpu-needs-pp1" in ids


ODD = [
    {},
    {"model": {}},
    {"model": {"recompute_granularity": "", "recompute_modules": [], "cuda_graph_impl": ""}},
    {"model": {"recompute_granularity": "full", "num_layers": None, "cuda_graph_scope": ["full"],
               "cuda_graph_modules": ["CudaGraphModule.attn"], "attention_backend": None,
               "cuda_graph_impl": "transformer_engine", "moe_input_jitter_eps": 0.1}},
    {"model": {"cpu_offloading": True, "num_layers": None, "fine_grained_activation_offloading":
               True, "offload_modules": None, "moe_paged_stash": "yes"},
     "rerun_state_machine": "off", "rng": None, "dist": [1]},
    {"model": {"pipeline_model_parallel_layout": "Et|(tt|)*2,L", "pipeline_model_parallel_size":
               2, "recompute_granularity": "full", "recompute_method": "block",
               "recompute_num_layers": 3}},
    {"model": {"num_moe_experts": 1, "cuda_graph_impl": "local", "cuda_graph_scope": "full",
               "moe_expert_capacity_factor": -1.0, "moe_layer_freq": [1, 1]},
     "env": {"PYTORCH_CUDA_ALLOC_CONF": ""},
     "mixed_precision": "bf16_with_fp8_delayed_scaling_mixed"},
]


@pytest.mark.parametrize("raw", ODD)
def test_checks_never_raise(raw: dict[str, Any]) -> None:
    validate(TrainingConfig.model_validate(raw))
