"""Real Megatron-Core as an oracle for the validator (a helper for test_parity.py, not a test).

Given a TrainingConfig, build the Megatron-Core config objects the way Megatron Bridge would
and report what Megatron-Core itself says about them:

* ``TransformerConfig`` (``MLATransformerConfig`` when ``model.multi_latent_attention``) from
  every model-section field the installed dataclass has (Bridge-only fields such as seq_length
  are dropped; the pass-through set comes from ``dataclasses.fields``), with the effective
  precision (``resolve_precision``) and the ``comm_overlap`` switches applied onto it, and
  ``pipeline_dtype`` derived from that precision when PP > 1 and none is given;
* ``OptimizerConfig`` from ``optimizer`` (+ bf16/fp16 from the precision) and
  ``DistributedDataParallelConfig`` from ``ddp`` (+ grad_reduce_in_fp32 / fp8_param_gather from
  the precision; built with ``env`` applied, since it reads PYTORCH_CUDA_ALLOC_CONF);
  ``use_distributed_optimizer`` is synced between the two sections as Bridge does;
* the model-build layer placement ``get_num_layers_to_build`` for every PP rank and VPP
  chunk: Megatron-Core checks VPP (and plain PP) divisibility only there, not in the config.

Bridge behaviour reproduced on the way: a ``mixed_precision`` section's other
MixedPrecisionConfig fields (num_layers_at_start_in_bf16, …) land on the model, a recipe name
sets the BF16 edge-layer counts (1 + 1 for current scaling, else 0), fp8_param follows
fp8_param_gather, graph modules are cleared when ``cuda_graph_impl`` is "none" (G4). The newer
CUDA-graph spelling is translated for 0.16.1: ``cuda_graph_modules`` becomes
``cuda_graph_scope`` and ``cuda_graph_impl="full_iteration"`` becomes impl "local" with scope
``full_iteration`` (Verdict.notes says when).

The answer is a ``Verdict``: ``accepted`` (with the layers per rank and chunk), ``raised``
(exception type, message, stage, and the rule id of our catalog that covers the message) or
``environment_limited`` (the check could not run because Transformer Engine / Apex / CUDA is
absent: such a verdict is never evidence either way).

Written against megatron-core 0.16.1 (the version the ``megatron`` extra pins on Python
3.11); nothing here is copied from Megatron, it only calls the installed package.
"""

from __future__ import annotations

import dataclasses
import os
import re
import traceback
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from mbridge_perf.config.derived import resolve_precision
from mbridge_perf.config.model import CommOverlapSection, MixedPrecisionSection, TrainingConfig

Stage = Literal["optimizer_config", "ddp_config", "transformer_config", "layer_placement"]
Status = Literal["accepted", "raised", "environment_limited"]

# Model-section fields that are Megatron Bridge's (GPTModelProvider / dataset) and not
# TransformerConfig's, even where a future Megatron-Core might grow a field of the same name.
BRIDGE_ONLY = frozenset({
    "seq_length", "vocab_size", "make_vocab_size_divisible_by",
    "share_embeddings_and_output_weights", "position_embedding_type",
    "max_position_embeddings", "cuda_graph_modules",
})

# Warnings every config emits on a CPU-only install; dropped from Verdict.warnings.
NOISE = re.compile(
    r"Transformer Engine and Apex are not installed|Apex is not installed|"
    r"full scope is deprecated|No CUDA runtime is found|CUDA initialization|"
    r"moe_ffn_hidden_size is not set"
)

# Failures that only say Transformer Engine / Apex / CUDA is missing on this machine.
ENV_LIMITED: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p, re.I), reason) for p, reason in (
        (r"not supported between instances of 'NoneType' and 'Version'",
         "a Transformer Engine version check (is_te_min_version) ran without Transformer "
         "Engine installed"),
        # messages that ask for a Transformer Engine version or component (not those that
        # merely name the transformer_engine impl, or "TransformerEngine only supports …")
        (r"transformer-engine\s*>=|\bTE\s*(?:>=|<)\s*\d|\bTE version\b|FusedAdam|"
         r"Transformer ?Engine (?:is )?not (?:installed|available|found)",
         "the check needs Transformer Engine, which is not installed"),
        (r"apex (?:is )?not (?:installed|available)|requires apex|install apex",
         "the check needs Apex, which is not installed"),
        (r"CUDA (?:support|runtime|device|is not available)|not compiled with CUDA|"
         r"No CUDA GPUs", "the check needs a CUDA device"),
        (r"No module named '(?:transformer_engine|apex|grouped_gemm|flash_attn)",
         "an optional CUDA-only package is not installed"),
        (r"cannot import name '(?:fused_|te_)\w*' from 'megatron\.core",
         "a fused kernel Megatron-Core only defines when Transformer Engine imports"),
    ))

# Megatron-Core message (regex, searched) -> the rule id of our catalog that covers it, or a
# tuple of ids when one message covers several rules (any of them counts; the first is the
# one the corpus names).
RULE_MAP: tuple[tuple[str, str | tuple[str, ...]], ...] = (
    # C: tensor / sequence parallel (TransformerConfig, ModelParallelConfig)
    (r"Cannot use sequence parallelism without tensor parallelism", "tp.sp-needs-tp"),
    (r"num_attention_heads \(\d+\) must be a multiple of tensor_model_parallel_size",
     "tp.heads-divisible"),
    (r"num_query_groups \(\d+\) must be a multiple or divisor of tensor_model_parallel_size",
     "tp.query-groups-divisible"),  # C3
    (r"rotary_interleaved does not work with multi_latent_attention",
     "attention.mla-rotary-interleaved"),  # C7
    (r"apply_rope_fusion for MLA only works with YARN RoPE",
     "attention.mla-rope-fusion-needs-yarn"),  # C7
    # A: world / expert parallel
    (r"num_moe_experts must be non None to use expert-parallel", "world.ep-needs-moe"),
    # B: pipeline
    (r"num_layers_in_(?:first|last)_pipeline_stage must be larger than 0",
     "pipeline.uneven-stage-positive"),  # B4
    (r"number of layers at (?:first|last) stage: \d+\s*must be divisible by virtual pipeline",
     "pipeline.vpp-layers-divisible"),  # B5
    (r"Mismatch: \d+ middle layers remaining but \d+ middle PP stages",
     "pipeline.uneven-middle-divisible"),  # B6
    (r"number of layers at middle stage: \d+ must be divisible by",
     "pipeline.uneven-middle-divisible"),  # B6
    (r"left over layers must be divisible by left over stages",
     "pipeline.uneven-middle-divisible"),  # B6, model build
    (r"number of layers on each middle pipeline rank:\s*\d+ must be divisible by virtual",
     "pipeline.vpp-layers-divisible"),  # B7
    (r"cannot be\s*set at the same time with account_for_embedding_in_pipeline_split",
     "pipeline.uneven-vs-account-for"),  # B9
    (r"number of middle layers: \d+ must be divisible by middle pipeline_model_parallel_size",
     "pipeline.layers-divisible-by-pp"),  # B2/B8
    (r"after enable\s*account_for_embedding_in_pipeline_split or .* must be divisible\s*by "
     r"pipeline_model_parallel_size", "pipeline.layers-divisible-by-pp"),  # B8
    (r"number of layers on each pipeline rank: \d+\s*\(after enable account_for",
     "pipeline.vpp-layers-divisible"),  # B8
    (r"num_layers should be divisible by pipeline_model_parallel_size",
     "pipeline.layers-divisible-by-pp"),  # B2 (model build)
    (r"num_layers_per_pipeline_rank \d+\s+should be divisible by vp_size",
     "pipeline.vpp-layers-divisible"),  # B3 (model build)
    (r"pipeline_model_parallel_layout cannot be set\s*with other pipeline layout arguments",
     "pipeline.layout-conflict"),  # B10
    (r"virtual_pipeline_model_parallel_size conflicts with\s*pipeline_model_parallel_layout",
     "pipeline.layout-conflict"),  # B10
    (r"pipeline_model_parallel_layout must be divisible\s*by pipeline_model_parallel_size|"
     r"The (?:first|last) layer must be (?:embedding|loss)|must be specified exactly once|"
     r"Number of decoder layers \d+\s*must match num_layers|is not a valid LayerType|"
     r"Number of mtp layers in layout", "pipeline.layout-valid"),  # B10
    (r"Cannot defer embedding wgrad compute|Wgrad deferral limit should be",
     "pipeline.defer-embedding-wgrad"),  # B12
    # E: recompute
    (r"recompute_granuarlity: .* must be \"full\"\s*or \"selective\"",
     "recompute.granularity-valid"),
    (r"^recompute_method: \S+ must be \"block\" or \"uniform\"", "recompute.method-valid"),
    (r"so recompute_method must be \"block\" or \"uniform\"", "recompute.full-needs-method"),
    (r"recompute_num_layers must be between 1 and num_layers_per_pipeline_rank",
     "recompute.full-needs-num-layers"),
    (r"selective recompute_num_layers must be None", "recompute.selective-no-num-layers"),
    (r"distribute_saved_activations: \w+ must be false when sequence parallel",
     "recompute.distribute-saved-vs-sp"),
    (r"Invalid choices for recompute_modules: \{'gdn_norm_out'\}",
     "recompute.gdn-norm-out-needs-gdn"),  # E10: 0.16.1 does not know the label at all
    (r"Invalid choices for recompute_modules", "recompute.unknown-module"),
    (r"moe_act in recompute_modules is only supported with moe_grouped_gemm",
     "recompute.moe-act-needs-grouped-gemm"),
    (r"mla_up_proj in recompute_modules is only supported with multi_latent_attention",
     "recompute.mla-up-proj-needs-mla"),
    (r"shared_experts recompute cannot work with --moe-shared-expert-overlap",
     "recompute.shared-experts-vs-overlap"),
    (r"Delayed scaling does not support moe_act and layernorm recompute",
     "recompute.fp8-delayed-modules"),
    (r"Do not set --moe-layer-recompute with full recompute granularity",
     "recompute.moe-layer-recompute-vs-full"),  # E14
    (r"full recompute is only supported with full iteration CUDA graph",
     "recompute.full-needs-full-iteration-graph"),
    (r"moe recompute is not supported with moe_router CUDA graph",
     "recompute.moe-vs-router-graph"),
    (r"dropout is not supported with graphed (?:attention|MLP/MoE) recomputation|"
     r"moe_input_jitter_eps is not supported with graphed moe recomputation",
     "recompute.graphed-dropout"),  # E17
    # F: offloading
    (r"CPU offloading can be done only for layers less than", "offload.cpu-num-layers-range"),
    (r"no support for Pipeline parallelism with CPU offloading", "offload.cpu-needs-pp1"),
    (r"CPU offloading does not work when activation recomputation is enabled",
     "offload.cpu-excludes-recompute"),
    (r"CUDA graphs not supported with CPU offloading", "offload.cpu-excludes-cuda-graphs"),
    (r"fine_grained_activation_offloading cannot be enabled with cpu_offloading",
     "offload.fine-grained-excludes-cpu"),
    (r"Invalid choices for offload_modules|attn_proj cannot be set to offload_modules alone|"
     r"offload_modules is not None and len\(self\.offload_modules\) > 0",
     "offload.fine-grained-modules"),  # F7
    # G: CUDA graphs
    (r"Invalid cuda graph implementation", "cudagraph.impl-valid"),  # G5
    (r"unknown name .* in: .*CudaGraphScope\[", "cudagraph.unknown-module"),  # G7
    (r"Do not use enable_cuda_graph or external_cuda_graph with cuda_graph_impl|"
     r"enable_cuda_graph and external_cuda_graph cannot be enabled at the same time",
     "cudagraph.legacy-flags"),  # G7
    (r"cuda_graph_scope must not contain both moe and moe_router",
     "cudagraph.moe-router-exclusive"),  # G8
    (r"moe_preprocess cuda graph is only supported with moe_router cuda graph",
     "cudagraph.preprocess-needs-router"),  # G9
    (r"moe cuda graph is only supported for MoE\.", "cudagraph.moe-needs-moe"),  # G10
    (r"mlp cuda graph is only supported for dense layers", "cudagraph.mlp-needs-dense"),
    (r"moe cuda graph is only supported with drop-padding MoE", "cudagraph.moe-needs-drop-pad"),
    (r"moe_preprocess cuda graph is not supported when there are DtoH",
     "cudagraph.preprocess-dtoh"),  # G13
    # I: MoE
    (r"Flex token dispatcher with deepep backend does not support "
     r"moe_pad_expert_input_to_capacity", "moe.deepep-no-pad"),
    (r"moe_shared_expert_overlap only works with alltoall", "moe.shared-overlap-dispatcher"),
    (r"DeepEP backend is only supported with flex token dispatcher|"
     r"Only one backend is supported for flex token dispatcher",
     "moe.deepep-flag-needs-flex"),  # I3
    (r"Token dispatcher type: allgather does not support variable sequence length",
     "moe.allgather-variable-seq"),  # I18
    (r"moe_shared_expert_intermediate_size must be num_shared_experts",
     "moe.shared-expert-size-positive"),  # I8
    (r"moe_expert_capacity_factor only works with aux_loss",
     "moe.capacity-factor-load-balancing"),  # I9
    (r"moe_expert_capacity_factor must be set to use moe_pad_expert_input_to_capacity",
     "moe.pad-needs-capacity-factor"),  # I10
    (r"Bias in Moe is only supported when ETP==1", "moe.bias-needs-etp1"),  # I13
    (r"Expert bias for aux-loss-free routing only supports",
     "moe.expert-bias-score-function"),  # I14
    (r"Please use --moe-router-pre-softmax when topk is 1",
     "moe.topk1-needs-pre-softmax"),  # I15
    (r"When using group limited routing, moe_router_num_groups must be specified|"
     r"should be divisible by moe_router_num_groups|"
     r"moe_router_group_topk \(\d+\) should be smaller than moe_router_num_groups",
     "moe.group-routing"),  # I16
    (r"fp8/fp4 must be specified when moe_router_padding_for_quantization|"
     r"dispatcher does not support moe_router_padding_for_quantization",
     "moe.router-padding-needs-quant"),  # I17
    # J: EP overlap
    (r"overlap_moe_expert_parallel_comm must be enabled when enabling delay_wgrad_compute",
     "moe-overlap.delay-wgrad-needs-overlap"),
    (r"overlap_moe_expert_parallel_comm must be enabled when enabling "
     r"ep_overlap_early_attn_memory_release", "moe-overlap.early-release-needs-overlap"),
    # 0.16.1 raises this one message for moe/mlp graph modules (G18) and for any impl other
    # than transformer_engine (part of J1 there)
    (r"CUDA graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm",
     ("cudagraph.ep-overlap-modules", "moe-overlap.requirements")),  # G18 / J1
    (r"overlap_moe_expert_parallel_comm|EP A2A overlap", "moe-overlap.requirements"),
    # K: precision
    (r"Only one of self\.fp16: \w+ and self\.bf16 \w+ should be True",
     "precision.fp16-bf16-exclusive"),  # K1
    (r"fp8_param must be used together with fp8 mode", "precision.fp8-param-needs-fp8"),
    (r"fp4_param must be used together with fp4 mode",
     "precision.fp4-param-needs-fp4"),  # K6
    (r"fp4 and fp8 cannot be used simultaneously", "precision.fp4-fp8-exclusive"),  # K6
    (r"Delayed scaling does not support first / last layer in BF16",
     "precision.fp8-delayed-first-last-bf16"),  # K5
    (r"num_layers_at_(?:start|end)_in_bf16 \(-?\d+\) must be between 0 and number of layers",
     "precision.bf16-layer-count-range"),  # K5
    (r"fp[48]_quantizer_factory must be provided", "precision.custom-recipe-needs-factory"),
    (r"--use-precision-aware-optimizer only supported with distributed optimizer",
     "precision.aware-optimizer-needs-distopt"),
    (r"--use-precision-aware-optimizer only supported with adam",
     "precision.aware-optimizer-needs-adam"),  # K3
    (r"(?:main_grads|main_params|exp_avg|exp_avg_sq)_dtype can only be fp32 when not using "
     r"precision-aware optimizer", "precision.optimizer-dtypes-need-aware"),  # K3
    (r"Reuse grad buffer only when keeping params in MXFP8",
     "precision.reuse-grad-buf-needs-fp8-param-gather"),  # K10
    # D: context parallel
    (r"Length of cp_comm_type \(\d+\) should equal", "cp.comm-type-length"),  # D5
    # H: environment
    (r"expandable_segments:True is currently not supported with nccl_ub",
     "env.expandable-vs-nccl-ub"),
)
_RULE_MAP = tuple((re.compile(p, re.S), (rid,) if isinstance(rid, str) else rid)
                  for p, rid in RULE_MAP)


def mapped_rule_ids() -> frozenset[str]:
    """Every rule id RULE_MAP names."""
    return frozenset(rid for _, ids in _RULE_MAP for rid in ids)


def map_rules(message: str) -> tuple[str, ...]:
    """The rule ids of our catalog covering a Megatron-Core message (first matching pattern;
    the first id is the primary one), or () when no pattern matches."""
    for pattern, rule_ids in _RULE_MAP:
        if pattern.search(message):
            return rule_ids
    return ()


def map_rule(message: str) -> str | None:
    """The primary rule id covering a Megatron-Core message, or None."""
    ids = map_rules(message)
    return ids[0] if ids else None


def env_limited_reason(exc_type: str, message: str) -> str | None:
    """Why a failure says nothing about the config (TE/Apex/CUDA absent), or None."""
    if exc_type in {"ModuleNotFoundError", "ImportError"} and re.search(
            r"transformer_engine|apex|grouped_gemm|flash_attn", message):
        return "an optional CUDA-only package is not installed"
    if exc_type == "NameError":  # a TE/Apex symbol that only exists when they import
        return f"a Transformer Engine / Apex symbol is undefined: {message}"
    for pattern, reason in ENV_LIMITED:
        if pattern.search(message):
            return reason
    return None


@dataclass(frozen=True)
class Raise:
    stage: Stage
    exc_type: str
    message: str
    rule_id: str | None  # primary mapped rule
    covered_by: tuple[str, ...] = ()  # every rule whose error accounts for this raise

    def __str__(self) -> str:
        return f"{self.stage}: {self.exc_type}: {self.message}"


@dataclass(frozen=True)
class Verdict:
    status: Status
    raises: tuple[Raise, ...] = ()
    reason: str | None = None  # environment_limited: why the check could not run
    # transformer layers per PP rank, per VPP chunk (accepted configs only)
    layers: tuple[tuple[int, ...], ...] | None = None
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # how the config was translated for this Megatron-Core

    @property
    def rule_ids(self) -> tuple[str | None, ...]:
        return tuple(r.rule_id for r in self.raises)

    @property
    def expect_label(self) -> str:
        """The corpus ``expect`` this verdict satisfies: "ok", "env-limited" or a rule id."""
        if self.status == "accepted":
            return "ok"
        if self.status == "environment_limited":
            return "env-limited"
        return self.raises[0].rule_id or f"<unmapped: {self.raises[0].message[:80]}>"

    def summary(self, width: int = 140) -> str:
        if self.status == "accepted":
            return "accepted"
        if self.status == "environment_limited":
            return f"environment_limited ({self.reason})"
        text = "; ".join(f"{r} -> {r.rule_id}" for r in self.raises)
        return "raised " + (text if len(text) <= width else text[: width - 1] + "…")


# --------------------------------------------------------------------------------------------
# Megatron-Core access (imported lazily: the package is an optional extra)


@dataclass(frozen=True)
class _MCore:
    TransformerConfig: type
    MLATransformerConfig: type
    OptimizerConfig: type
    DDPConfig: type
    AttnBackend: Any
    LayerType: Any
    get_num_layers_to_build: Callable[..., int]
    parallel_state: Any
    tc_fields: frozenset[str]
    mla_fields: frozenset[str]
    oc_fields: frozenset[str]
    ddp_fields: frozenset[str]


@cache
def mcore() -> _MCore:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core import parallel_state
        from megatron.core.distributed.distributed_data_parallel_config import (
            DistributedDataParallelConfig,
        )
        from megatron.core.optimizer.optimizer_config import OptimizerConfig
        from megatron.core.transformer.enums import AttnBackend, LayerType
        from megatron.core.transformer.transformer_block import get_num_layers_to_build
        from megatron.core.transformer.transformer_config import (
            MLATransformerConfig,
            TransformerConfig,
        )

    def names(cls: type) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls))

    return _MCore(TransformerConfig, MLATransformerConfig, OptimizerConfig,
                  DistributedDataParallelConfig, AttnBackend, LayerType, get_num_layers_to_build,
                  parallel_state, names(TransformerConfig), names(MLATransformerConfig),
                  names(OptimizerConfig), names(DistributedDataParallelConfig))


def mcore_version() -> str:
    from importlib.metadata import version

    return version("megatron-core")


# --------------------------------------------------------------------------------------------
# TrainingConfig -> keyword arguments of the Megatron-Core dataclasses

_DTYPE_NAMES = {
    "bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16", "float16": "float16",
    "half": "float16", "fp32": "float32", "float32": "float32", "float": "float32",
    "fp8": "uint8", "uint8": "uint8",
}
# model fields where our None means "unset" (Megatron-Core's default applies) rather than a
# value of its own (q_lora_rank None, by contrast, means "no query compression")
_NONE_IS_DEFAULT = frozenset({"activation_func", "params_dtype", "pipeline_dtype", "fp4_recipe",
                              "offload_modules", "distribute_saved_activations"})
# MixedPrecisionConfig fields that are not the model's even where the names match
_MP_NOT_MODEL = frozenset({"grad_reduce_in_fp32", "fp8_param_gather",
                           "reuse_grad_buf_for_mxfp8_param_ag"})
_DTYPE_FIELDS = frozenset({"params_dtype", "pipeline_dtype", "autocast_dtype", "main_grads_dtype",
                           "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype"})


def to_dtype(value: Any) -> Any:
    """'bf16' / 'torch.bfloat16' / torch.bfloat16 -> torch.bfloat16 (other values unchanged)."""
    import torch

    if isinstance(value, str):
        name = _DTYPE_NAMES.get(value.removeprefix("torch.").lower())
        if name is not None:
            return getattr(torch, name)
    return value


def _activation(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    import torch.nn.functional as F

    name = value.removeprefix("torch.nn.functional.").removeprefix("F.")
    return getattr(F, name, value)


def model_kwargs(cfg: TrainingConfig) -> tuple[type, dict[str, Any], list[str]]:
    """The TransformerConfig class and keyword arguments Bridge would finalize, plus notes on
    what was translated for the installed Megatron-Core."""
    mc = mcore()
    m = cfg.model
    mla = bool(m.multi_latent_attention)
    cls = mc.MLATransformerConfig if mla else mc.TransformerConfig
    allowed = (mc.mla_fields if mla else mc.tc_fields) - BRIDGE_ONLY
    notes: list[str] = []
    given = {**m.model_dump(exclude={"model_config"}), **m.carried()}
    kw: dict[str, Any] = {}
    for name, value in given.items():
        if name not in allowed:
            continue
        if value is None and name in _NONE_IS_DEFAULT:
            continue  # None = unset: Megatron-Core's own default applies
        kw[name] = value

    # values Megatron-Core wants as objects, not the strings a YAML config holds
    for name in _DTYPE_FIELDS & kw.keys():
        kw[name] = to_dtype(kw[name])
    if "activation_func" in kw:
        kw["activation_func"] = _activation(kw["activation_func"])
    backend = kw.get("attention_backend")
    if isinstance(backend, str) and backend in mc.AttnBackend.__members__:
        kw["attention_backend"] = mc.AttnBackend[backend]
    if isinstance(kw.get("recompute_modules"), list):
        kw["recompute_modules"] = list(kw["recompute_modules"])

    # CUDA graph API drift: newer Bridge/MCore spell scopes `cuda_graph_modules` and the
    # full-iteration graph `cuda_graph_impl="full_iteration"`; the installed version has only
    # `cuda_graph_scope` and spells the full-iteration graph impl=local + scope full_iteration.
    if "cuda_graph_modules" not in allowed and m.cuda_graph_modules is not None \
            and m.cuda_graph_scope is None:
        kw["cuda_graph_scope"] = list(m.cuda_graph_modules)
        notes.append("cuda_graph_modules passed as cuda_graph_scope")
    if kw.get("cuda_graph_impl") == "full_iteration" and not _impl_supported("full_iteration"):
        scope = kw.get("cuda_graph_scope")
        given = [scope] if isinstance(scope, str) else list(scope or [])
        kw["cuda_graph_impl"] = "local"
        kw["cuda_graph_scope"] = ["full_iteration", *(s for s in given if s != "full_iteration")]
        notes.append('cuda_graph_impl="full_iteration" passed as impl=local, '
                     f"scope={kw['cuda_graph_scope']}")
    graphs_off = kw.get("cuda_graph_impl", "none") == "none" and not (
        kw.get("enable_cuda_graph") or kw.get("external_cuda_graph"))
    if graphs_off and kw.get("cuda_graph_scope"):
        notes.append("graphs off: Bridge clears the graph modules (G4)")
    if (graphs_off or kw.get("cuda_graph_scope") is None) and "cuda_graph_scope" in allowed:
        kw["cuda_graph_scope"] = []  # unset = whole layer (avoids the deprecated "full")

    # precision: Bridge copies its mixed-precision config onto the model at setup;
    # resolve_precision is the project's reading of that (every Precision field the model
    # dataclass has), plus any other MixedPrecisionConfig field the section carries
    p = resolve_precision(cfg)
    for name, value in _precision_values(cfg).items():
        if name in allowed and name not in _MP_NOT_MODEL and not (
                value is None and name in _NONE_IS_DEFAULT):
            kw[name] = value
    mp = cfg.mixed_precision
    if isinstance(mp, MixedPrecisionSection):
        for name, value in mp.carried().items():
            if name in allowed and name not in _MP_NOT_MODEL:
                kw[name] = to_dtype(value) if name in _DTYPE_FIELDS else value
    import torch

    half = torch.bfloat16 if p.bf16 else torch.float16 if p.fp16 else None
    if half is not None and "params_dtype" not in kw:
        kw["params_dtype"] = half
    if m.pipeline_model_parallel_size > 1 and kw.get("pipeline_dtype") is None:
        kw["pipeline_dtype"] = half or torch.float32
        notes.append(f"pipeline_dtype derived: {kw['pipeline_dtype']}")

    # comm_overlap switches Bridge's CommOverlapConfig.setup() writes onto the model
    if isinstance(cfg.comm_overlap, CommOverlapSection):
        for name, value in cfg.comm_overlap.model_dump(exclude_unset=True).items():
            if value is not None and name in allowed:
                kw[name] = value
    return cls, kw, notes


@cache
def _impl_supported(impl: str) -> bool:
    """Whether the installed TransformerConfig lists this cuda_graph_impl value."""
    mc = mcore()
    hint = next(f.type for f in dataclasses.fields(mc.TransformerConfig)
                if f.name == "cuda_graph_impl")
    return repr(impl) in str(hint)


def _precision_values(cfg: TrainingConfig) -> dict[str, Any]:
    """resolve_precision(cfg) as a dict of whatever fields Precision has."""
    p = resolve_precision(cfg)
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p)}


def optimizer_kwargs(cfg: TrainingConfig) -> dict[str, Any]:
    mc = mcore()
    o = cfg.optimizer
    kw = {k: v for k, v in {**o.model_dump(), **o.carried()}.items()
          if k in mc.oc_fields and v is not None}
    for name in _DTYPE_FIELDS & kw.keys():
        kw[name] = to_dtype(kw[name])
    # Bridge keeps the distributed-optimizer flag in sync between ddp and optimizer (either on
    # turns both on)
    kw["use_distributed_optimizer"] = bool(o.use_distributed_optimizer
                                           or cfg.ddp.use_distributed_optimizer)
    if cfg.mixed_precision is not None:  # Bridge copies these onto the optimizer config too
        pv = _precision_values(cfg)
        for name in ("bf16", "fp16", "fp8_recipe", "reuse_grad_buf_for_mxfp8_param_ag"):
            if name in pv and name in mc.oc_fields and pv[name] is not None:
                kw[name] = pv[name]
    return kw


def ddp_kwargs(cfg: TrainingConfig) -> dict[str, Any]:
    mc = mcore()
    d = cfg.ddp
    kw = {k: v for k, v in {**d.model_dump(), **d.carried()}.items()
          if k in mc.ddp_fields and v is not None}
    kw["use_distributed_optimizer"] = bool(d.use_distributed_optimizer
                                           or cfg.optimizer.use_distributed_optimizer)
    pv = _precision_values(cfg)
    kw["grad_reduce_in_fp32"] = pv["grad_reduce_in_fp32"]
    if cfg.mixed_precision is not None:  # Bridge copies these onto the DDP config
        for name in ("fp8_param_gather", "reuse_grad_buf_for_mxfp8_param_ag"):
            if name in pv and name in mc.ddp_fields:
                kw[name] = bool(pv[name])
    return kw


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """os.environ as the job would see it for the keys the config sets or that Megatron-Core's
    config checks read (so this machine's own environment does not leak in)."""
    keys = set(env) | {"PYTORCH_CUDA_ALLOC_CONF"}
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for k in keys:
            if k in env:
                os.environ[k] = env[k]
            else:
                os.environ.pop(k, None)
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# --------------------------------------------------------------------------------------------
# Running the checks


def _megatron_line(exc: BaseException) -> str:
    """The source line of the innermost Megatron-Core frame that raised."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if f"{os.sep}megatron{os.sep}" in f.filename]
    return (frames[-1].line or "") if frames else ""


class _Failure(Exception):
    def __init__(self, stage: Stage, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.stage = stage
        self.exc_type = type(exc).__name__
        message = str(exc).strip()
        if isinstance(exc, AssertionError) and not message:
            # a bare `assert`: name the condition from the failing source line instead
            message = f"assert failed: {_megatron_line(exc)}"
        if isinstance(exc, KeyError):
            # an enum lookup by name: say which name, and where
            message = f"unknown name {message} in: {_megatron_line(exc)}"
        self.message = re.sub(r"\s+", " ", message)


def _stage(stage: Stage, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # every failure is a verdict, none is a test error
        raise _Failure(stage, exc) from exc


def placement(tc: Any) -> tuple[tuple[int, ...], ...]:
    """Transformer layers each (PP rank, VPP chunk) builds, from Megatron-Core's model-build
    function (no process group needed)."""
    mc = mcore()
    pp = tc.pipeline_model_parallel_size
    vpp = tc.virtual_pipeline_model_parallel_size
    layout = tc.pipeline_model_parallel_layout
    if layout is not None:
        # the layout path of get_num_layers_to_build asks parallel_state for the rank and the
        # VPP size; ask the layout object itself with both given (the VPP size is set only
        # for the call and restored)
        ps = mc.parallel_state
        saved = ps.get_virtual_pipeline_model_parallel_world_size()
        ps.set_virtual_pipeline_model_parallel_world_size(layout.virtual_pipeline_model_parallel_size)
        try:
            return tuple(
                tuple(layout.get_num_layers_to_build(layer_type=mc.LayerType.decoder,
                                                     vp_stage=v, pp_rank=r)
                      for v in range(layout.virtual_pipeline_model_parallel_size))
                for r in range(pp))
        finally:
            ps.set_virtual_pipeline_model_parallel_world_size(saved)
    chunks = vpp if (vpp is not None and pp > 1) else None
    return tuple(
        tuple(mc.get_num_layers_to_build(tc, vp_stage=v if chunks else None, pp_rank=r)
              for v in range(chunks or 1))
        for r in range(pp))


def run_oracle(cfg: TrainingConfig) -> Verdict:
    """What the installed Megatron-Core says about this config (see the module docstring)."""
    mc = mcore()
    failures: list[_Failure] = []
    layers = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls, kw, notes = model_kwargs(cfg)
        try:
            _stage("optimizer_config", lambda: mc.OptimizerConfig(**optimizer_kwargs(cfg)))
        except _Failure as f:
            failures.append(f)
        try:
            with _environment(cfg.env):
                _stage("ddp_config", lambda: mc.DDPConfig(**ddp_kwargs(cfg)))
        except _Failure as f:
            failures.append(f)
        try:
            tc = _stage("transformer_config", lambda: cls(**kw))
            layers = _stage("layer_placement", lambda: placement(tc))
        except _Failure as f:
            failures.append(f)
    seen: dict[str, None] = {}
    for w in caught:
        text = re.sub(r"\s+", " ", str(w.message)).strip()
        if not NOISE.search(text):
            seen.setdefault(text)
    warned = tuple(seen)

    real: list[Raise] = []
    limited: list[str] = []
    for f in failures:
        why = env_limited_reason(f.exc_type, f.message)
        if why is not None:
            limited.append(f"{f.stage}: {why} ({f.exc_type}: {f.message[:120]})")
        else:
            ids = map_rules(f.message)
            real.append(Raise(f.stage, f.exc_type, f.message, ids[0] if ids else None, ids))
    if real:
        return Verdict("raised", tuple(real), warnings=warned, notes=tuple(notes))
    if limited:
        return Verdict("environment_limited", reason="; ".join(limited), warnings=warned,
                       notes=tuple(notes))
    return Verdict("accepted", layers=layers, warnings=warned, notes=tuple(notes))


__all__ = ["BRIDGE_ONLY", "RULE_MAP", "Raise", "Verdict", "ddp_kwargs", "env_limited_reason",
           "map_rule", "map_rules", "mapped_rule_ids", "mcore", "mcore_version", "model_kwargs",
           "optimizer_kwargs", "placement", "run_oracle"]
