"""MoE core: token dispatcher and flex backends, capacity and padding, router settings
(constraint catalog section I)."""

from __future__ import annotations

from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.gpus import GPUSpec
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import LONG_CONTEXT, WORKFLOW, Violation, rule

DISPATCHER = "model.moe_token_dispatcher_type"
BACKEND = "model.moe_flex_dispatcher_backend"
EXPERTS = "model.num_moe_experts"
CAPACITY = "model.moe_expert_capacity_factor"
PAD = "model.moe_pad_expert_input_to_capacity"
BALANCING = "model.moe_router_load_balancing_type"
SHARED_OVERLAP = "model.moe_shared_expert_overlap"
CAPACITY_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "none")


def _balancing_types(c: TrainingConfig) -> list[str]:
    lb = c.model.moe_router_load_balancing_type
    return [str(t) for t in lb] if isinstance(lb, list) else [str(lb)]


def _deepep(c: TrainingConfig) -> bool:
    """DeepEP is the flex backend: named, or through the deprecated moe_enable_deepep flag."""
    return c.model.moe_flex_dispatcher_backend == "deepep" or \
        c.model.carried().get("moe_enable_deepep") is True


def _capacity(c: TrainingConfig) -> float | None:
    """Capacity factor after MCore's normalisation (negative means dropless, i.e. None)."""
    f = c.model.moe_expert_capacity_factor
    return None if f is None or f < 0 else f


def _flag(c: TrainingConfig, name: str) -> Any:
    return c.model.carried().get(name)


def _backend_supported(backend: str | None, gpu: GPUSpec) -> bool:
    """Bridge's architecture check: DeepEP on sm80 / sm90 and the B200 / B300 boards (not the
    GB200 / GB300 racks); HybridEP on Ampere, Hopper and Blackwell (major 8, 9, 10)."""
    if gpu.sm is None:  # a GPU whose compute capability is unpublished (Rubin): no verdict
        return True
    if backend == "deepep":
        return gpu.sm in (80, 90) or gpu.family in ("b200", "b300")
    if backend == "hybridep":
        return gpu.sm // 10 in (8, 9, 10)
    return True


@rule("moe.flex-needs-backend", "warning", ref="I2", source="megatron-bridge",
      fields=(DISPATCHER, BACKEND), skill=LONG_CONTEXT,
      summary="flex dispatcher without a backend is reset to alltoall at validation")
def _flex_needs_backend(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not d.is_moe or m.moe_token_dispatcher_type != "flex" or m.moe_flex_dispatcher_backend:
        return None
    return Violation("moe_token_dispatcher_type='flex' with moe_flex_dispatcher_backend=None: "
                     "Bridge falls back to alltoall",
                     f"set {BACKEND} = 'deepep' (Ampere/Hopper/B200/B300) or 'hybridep' "
                     f"(GB200/GB300 NVL72), or {DISPATCHER} = 'alltoall'")


@rule("moe.flex-backend-gpu", "error", ref="I1/I2", source="megatron-bridge",
      fields=(DISPATCHER, BACKEND, "cluster.gpu"), skill=LONG_CONTEXT,
      summary="DeepEP runs on Ampere, Hopper, B200 and B300; HybridEP on Ampere, Hopper and "
              "Blackwell (GB200/GB300 NVL72)")
def _flex_backend_gpu(c: TrainingConfig, d: Derived) -> Violation | None:
    # needs a declared cluster.gpu: Bridge checks the live device
    m, gpu = c.model, d.gpu
    if gpu is None or m.moe_token_dispatcher_type != "flex" or \
            _backend_supported(m.moe_flex_dispatcher_backend, gpu):
        return None
    other = "hybridep" if m.moe_flex_dispatcher_backend == "deepep" else "alltoall"
    return Violation(f"moe_flex_dispatcher_backend={m.moe_flex_dispatcher_backend!r} on "
                     f"{gpu.name} ({gpu.sm_version})",
                     f"set {BACKEND} = '{other}' on {gpu.name}, or {DISPATCHER} = 'alltoall'")


@rule("moe.deepep-flag-needs-flex", "error", ref="I3", source="megatron-core",
      fields=("model.moe_enable_deepep", DISPATCHER, BACKEND), skill=WORKFLOW,
      mcore_enforced=True,
      summary="deprecated moe_enable_deepep needs the flex dispatcher and no other backend")
def _deepep_flag_needs_flex(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if _flag(c, "moe_enable_deepep") is not True:
        return None
    if m.moe_token_dispatcher_type != "flex":
        why = f"moe_token_dispatcher_type={m.moe_token_dispatcher_type!r}"
    elif m.moe_flex_dispatcher_backend == "hybridep":
        why = "moe_flex_dispatcher_backend='hybridep'"
    else:
        return None
    return Violation(f"moe_enable_deepep=True with {why}",
                     f"drop model.moe_enable_deepep and set {DISPATCHER} = 'flex', {BACKEND} = "
                     "'deepep'")


@rule("moe.deepep-no-pad", "error", ref="I4", source="megatron-core",
      fields=(DISPATCHER, BACKEND, PAD), skill=LONG_CONTEXT, mcore_enforced=True,
      summary="flex dispatcher with DeepEP cannot pad expert input to capacity")
def _deepep_no_pad(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.moe_token_dispatcher_type != "flex" or not m.moe_pad_expert_input_to_capacity or \
            not _deepep(c):
        return None
    return Violation("moe_pad_expert_input_to_capacity=True with the flex dispatcher on DeepEP",
                     f"set {PAD} = false (dropless), or use {DISPATCHER} = 'alltoall' for "
                     "drop-and-pad")


@rule("moe.ncclep-needs-flex", "error", ref="I5", source="megatron-core",
      fields=(BACKEND, DISPATCHER), skill=WORKFLOW,
      summary="the ncclep backend requires moe_token_dispatcher_type='flex' (pin; not in 0.16.1)")
def _ncclep_needs_flex(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.moe_flex_dispatcher_backend != "ncclep" or m.moe_token_dispatcher_type == "flex":
        return None
    return Violation(f"moe_flex_dispatcher_backend='ncclep' with moe_token_dispatcher_type="
                     f"{m.moe_token_dispatcher_type!r}",
                     f"set {DISPATCHER} = 'flex' (Bridge and the perf harness expose only "
                     "deepep/hybridep)")


@rule("moe.deprecated-num-sms", "error", ref="I6", source="megatron-core",
      fields=("model.moe_deepep_num_sms", "model.moe_hybridep_num_sms",
              "model.moe_flex_dispatcher_num_sms"), skill=WORKFLOW,
      summary="moe_deepep_num_sms / moe_hybridep_num_sms are deprecated for "
              "moe_flex_dispatcher_num_sms (0.19); conflicting values are refused")
def _deprecated_num_sms(c: TrainingConfig, d: Derived) -> Violation | None:
    # 0.19 routes either knob to moe_flex_dispatcher_num_sms with a deprecation warning (info
    # here) and raises only when both differ and the new knob is unset; before 0.19 they are
    # the fields themselves.
    if d.mcore.key < (0, 19):
        return None
    old = {n: _flag(c, n) for n in ("moe_deepep_num_sms", "moe_hybridep_num_sms")
           if _flag(c, n) is not None}
    if not old:
        return None
    conflict = len(set(map(str, old.values()))) > 1 and _flag(
        c, "moe_flex_dispatcher_num_sms") is None
    given = ", ".join(f"{k}={v}" for k, v in old.items())
    return Violation(f"{given} set" + (" with different values (Megatron-Core refuses "
                                        "this)" if conflict else "") + "; these are deprecated",
                     "set model.moe_flex_dispatcher_num_sms once and drop the old knobs",
                     severity=None if conflict else "info")


@rule("moe.shared-overlap-dispatcher", "error", ref="I7", source="megatron-core",
      fields=(SHARED_OVERLAP, DISPATCHER, "model.moe_shared_expert_intermediate_size"),
      skill=WORKFLOW, mcore_enforced=True,
      summary="moe_shared_expert_overlap needs the alltoall or flex dispatcher")
def _shared_overlap_dispatcher(c: TrainingConfig, d: Derived) -> Violation | None:
    # 0.19 accepts alltoall and flex; 0.16.1 accepts only alltoall (flex + overlap raises
    # there). Both check only when shared experts exist.
    m = c.model
    ok = ("alltoall", "flex") if d.mcore.key >= (0, 19) else ("alltoall",)
    if not m.moe_shared_expert_overlap or m.moe_shared_expert_intermediate_size is None or \
            m.moe_token_dispatcher_type in ok:
        return None
    return Violation(f"moe_shared_expert_overlap=True with moe_token_dispatcher_type="
                     f"{m.moe_token_dispatcher_type!r} (Megatron-Core {d.mcore.version})",
                     f"set {DISPATCHER} = {' or '.join(map(repr, ok))}, or "
                     f"{SHARED_OVERLAP} = false")


@rule("moe.shared-expert-size-positive", "error", ref="I8", source="megatron-core",
      fields=("model.moe_shared_expert_intermediate_size",), skill=WORKFLOW, mcore_enforced=True,
      summary="moe_shared_expert_intermediate_size, when set, must be > 0")
def _shared_expert_size_positive(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.model.moe_shared_expert_intermediate_size != 0:
        return None
    return Violation("moe_shared_expert_intermediate_size=0",
                     "set it to num_shared_experts × the shared expert FFN width, or null for no "
                     "shared expert")


@rule("moe.capacity-factor-load-balancing", "error", ref="I9", source="megatron-core",
      fields=(CAPACITY, BALANCING), skill=WORKFLOW, mcore_enforced=True,
      summary="a capacity factor works only with aux_loss / seq_aux_loss / global_aux_loss / "
              "none balancing")
def _capacity_factor_load_balancing(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.model.moe_expert_capacity_factor is None:
        return None
    bad = [t for t in _balancing_types(c) if t not in CAPACITY_BALANCING]
    if not bad:
        return None
    return Violation(f"moe_expert_capacity_factor={c.model.moe_expert_capacity_factor} with "
                     f"moe_router_load_balancing_type={c.model.moe_router_load_balancing_type!r}",
                     f"set {BALANCING} to one of {', '.join(CAPACITY_BALANCING)}, or {CAPACITY} "
                     "= null (dropless)")


@rule("moe.pad-needs-capacity-factor", "error", ref="I10", source="megatron-core",
      fields=(PAD, CAPACITY), skill=WORKFLOW, mcore_enforced=True,
      summary="moe_pad_expert_input_to_capacity needs a capacity factor")
def _pad_needs_capacity(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.model.moe_pad_expert_input_to_capacity or _capacity(c) is not None:
        return None
    return Violation(f"moe_pad_expert_input_to_capacity=True with moe_expert_capacity_factor="
                     f"{c.model.moe_expert_capacity_factor}",
                     f"set {CAPACITY} (e.g. 1.0), or {PAD} = false")


@rule("moe.rank-capacity-needs-backend", "error", ref="I11", source="megatron-core",
      fields=("model.moe_expert_rank_capacity_factor", BACKEND), skill=WORKFLOW,
      summary="moe_expert_rank_capacity_factor needs the hybridep or ncclep backend (pin)")
def _rank_capacity_needs_backend(c: TrainingConfig, d: Derived) -> Violation | None:
    if _flag(c, "moe_expert_rank_capacity_factor") is None or \
            c.model.moe_flex_dispatcher_backend in ("hybridep", "ncclep"):
        return None
    return Violation(f"moe_expert_rank_capacity_factor set with moe_flex_dispatcher_backend="
                     f"{c.model.moe_flex_dispatcher_backend!r}",
                     f"set {BACKEND} = 'hybridep' (with the TE op fuser), or drop "
                     "model.moe_expert_rank_capacity_factor")


@rule("moe.ffn-size-defaults", "warning", ref="I12", source="megatron-core",
      fields=("model.moe_ffn_hidden_size", "model.ffn_hidden_size", EXPERTS), skill=WORKFLOW,
      summary="moe_ffn_hidden_size unset: each expert gets the dense ffn_hidden_size")
def _ffn_size_defaults(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not d.is_moe or m.moe_ffn_hidden_size is not None:
        return None
    width = m.ffn_hidden_size or (4 * m.hidden_size if m.hidden_size else None)
    return Violation(f"num_moe_experts={m.num_moe_experts} without moe_ffn_hidden_size: every "
                     f"expert is {width or 'ffn_hidden_size'} wide",
                     "set model.moe_ffn_hidden_size to the routed expert width of the model")


@rule("moe.bias-needs-etp1", "error", ref="I13", source="megatron-core",
      fields=("model.add_bias_linear", "model.expert_tensor_parallel_size",
              "model.tensor_model_parallel_size", EXPERTS), skill=WORKFLOW, mcore_enforced=True,
      summary="MoE with linear bias needs expert_tensor_parallel_size = 1")
def _bias_needs_etp1(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.num_moe_experts is None or not m.add_bias_linear or d.etp == 1:
        return None
    unset = " (unset, so it follows TP)" if m.expert_tensor_parallel_size is None else ""
    return Violation(f"add_bias_linear=True on an MoE model with expert_tensor_parallel_size="
                     f"{d.etp}{unset}",
                     "set model.expert_tensor_parallel_size = 1, or model.add_bias_linear = "
                     "false")


@rule("moe.expert-bias-score-function", "error", ref="I14", source="megatron-core",
      fields=("model.moe_router_enable_expert_bias", "model.moe_router_score_function"),
      skill=WORKFLOW, mcore_enforced=True,
      summary="aux-loss-free expert bias needs the sigmoid (or sqrtsoftplus) score function")
def _expert_bias_score_function(c: TrainingConfig, d: Derived) -> Violation | None:
    # The pin also accepts sqrtsoftplus; MCore 0.16.1 accepts sigmoid only.
    m = c.model
    if not m.moe_router_enable_expert_bias or \
            m.moe_router_score_function in ("sigmoid", "sqrtsoftplus"):
        return None
    return Violation(f"moe_router_enable_expert_bias=True with moe_router_score_function="
                     f"{m.moe_router_score_function!r}",
                     "set model.moe_router_score_function = 'sigmoid', or "
                     "model.moe_router_enable_expert_bias = false")


@rule("moe.topk1-needs-pre-softmax", "error", ref="I15", source="megatron-core",
      fields=("model.moe_router_topk", "model.moe_router_pre_softmax",
              "model.moe_router_score_function", BALANCING), skill=WORKFLOW, mcore_enforced=True,
      summary="top-1 softmax routing needs moe_router_pre_softmax (else zero gradient)")
def _topk1_needs_pre_softmax(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.moe_router_topk != 1 or m.moe_router_score_function != "softmax" or \
            m.moe_router_pre_softmax or m.moe_router_load_balancing_type == "sinkhorn":
        return None
    return Violation("moe_router_topk=1 with softmax scores and moe_router_pre_softmax=False",
                     "set model.moe_router_pre_softmax = true")


@rule("moe.group-routing", "error", ref="I16", source="megatron-core",
      fields=("model.moe_router_group_topk", "model.moe_router_num_groups", EXPERTS),
      skill=WORKFLOW, mcore_enforced=True,
      summary="group-limited routing needs moe_router_num_groups dividing the experts and ≥ "
              "group_topk")
def _group_routing(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    topk, groups, n = m.moe_router_group_topk, m.moe_router_num_groups, m.num_moe_experts
    if not topk:
        return None
    if not groups:
        why = "moe_router_num_groups is not set"
    elif n is None or n % groups:
        why = f"num_moe_experts={n} is not divisible by moe_router_num_groups={groups}"
    elif topk > groups:
        why = f"it exceeds moe_router_num_groups={groups}"
    else:
        return None
    return Violation(f"moe_router_group_topk={topk}: {why}",
                     "set model.moe_router_num_groups to a divisor of num_moe_experts that is ≥ "
                     "moe_router_group_topk (e.g. the EP size)")


@rule("moe.router-padding-needs-quant", "error", ref="I17", source="megatron-core",
      fields=("model.moe_router_padding_for_quantization", "model.fp8", "model.fp4", DISPATCHER),
      skill=WORKFLOW, mcore_enforced=True,
      summary="router padding for quantization needs fp8/fp4 and not the allgather dispatcher")
def _router_padding_needs_quant(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not (m.moe_router_padding_for_quantization or
            _flag(c, "moe_router_padding_for_fp8") is True):
        return None
    p = d.precision
    if p.fp8 is None and p.fp4 is None:
        why = "neither fp8 nor fp4 is enabled"
    elif m.moe_token_dispatcher_type in ("allgather", "alltoall_seq"):
        why = f"moe_token_dispatcher_type={m.moe_token_dispatcher_type!r}"
    else:
        return None
    return Violation(f"moe_router_padding_for_quantization=True but {why}",
                     "enable FP8/FP4 with the alltoall or flex dispatcher, or set "
                     "model.moe_router_padding_for_quantization = false")


@rule("moe.allgather-variable-seq", "error", ref="I18", source="megatron-core",
      fields=(DISPATCHER, "model.variable_seq_lengths"), skill=WORKFLOW, mcore_enforced=True,
      summary="the allgather dispatcher cannot handle variable sequence lengths")
def _allgather_variable_seq(c: TrainingConfig, d: Derived) -> Violation | None:
    # MCore 0.16.1 checks this on dense models too (allgather is the default dispatcher);
    # Bridge sets variable_seq_lengths only after finalize for that reason.
    if c.model.moe_token_dispatcher_type != "allgather" or \
            _flag(c, "variable_seq_lengths") is not True:
        return None
    dense = "" if d.is_moe else " (the default, checked even on a dense model)"
    return Violation(f"variable_seq_lengths=True with moe_token_dispatcher_type='allgather'"
                     f"{dense}", f"set {DISPATCHER} = 'alltoall'")


@rule("moe.many-experts-fp32-router", "warning", ref="I20", source="megatron-core",
      fields=(EXPERTS, "model.moe_router_dtype"), skill=LONG_CONTEXT,
      summary="32 or more experts without an fp32 router dtype")
def _many_experts_fp32_router(c: TrainingConfig, d: Derived) -> Violation | None:
    n = c.model.num_moe_experts
    if n is None or n < 32 or c.model.moe_router_dtype:
        return None
    return Violation(f"num_moe_experts={n} with moe_router_dtype unset: routing runs in the "
                     "training dtype", "set model.moe_router_dtype = 'fp32'")


@rule("moe.force-balance-benchmark-only", "warning", ref="I22", source="skill",
      fields=("model.moe_router_force_load_balancing",), skill=WORKFLOW,
      summary="forced load balancing changes routing semantics: benchmark-only")
def _force_balance_benchmark_only(c: TrainingConfig, d: Derived) -> Violation | None:
    # A warning, not advice: a real training run with forced routing is silently wrong.
    if not c.model.moe_router_force_load_balancing:
        return None
    return Violation("moe_router_force_load_balancing=True: tokens are routed uniformly, not by "
                     "the router, so throughput and memory are benchmark-only numbers",
                     "set model.moe_router_force_load_balancing = false for training, and label "
                     "results measured with it benchmark-only")
