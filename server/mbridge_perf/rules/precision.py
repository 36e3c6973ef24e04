"""Precision: BF16/FP16, FP8 and FP4 recipes, FP8 parameters and the precision-aware optimizer
(constraint catalog section K).

Bridge applies `mixed_precision` onto the model, optimizer and DDP configs before Megatron-Core
checks them, so model-side rules read the effective precision (`Derived.precision`).
"""

from __future__ import annotations

from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import MixedPrecisionSection, TrainingConfig
from mbridge_perf.rules.catalog import WORKFLOW, Violation, rule

AWARE = "optimizer.use_precision_aware_optimizer"
DISTOPT = "optimizer.use_distributed_optimizer"
FP8 = "mixed_precision.fp8"
RECIPE = "mixed_precision.fp8_recipe"
FP8_RECIPES = ("tensorwise", "delayed", "mxfp8", "blockwise", "custom")
FP8_FORMATS = ("e4m3", "hybrid")


def _is_fp32(dtype: Any) -> bool:
    """A dtype given as None (the fp32 default), torch.float32, 'fp32', 'float32', …"""
    if dtype is None:
        return True
    name = str(dtype).lower().removeprefix("torch.")
    return name in ("fp32", "float32", "float")


def _mp_section(c: TrainingConfig) -> MixedPrecisionSection | None:
    mp = c.mixed_precision
    return mp if isinstance(mp, MixedPrecisionSection) else None


def _megatron_fsdp(c: TrainingConfig) -> bool:
    dist = c.carried().get("dist")
    return c.ddp.use_megatron_fsdp or (isinstance(dist, dict) and
                                       dist.get("use_megatron_fsdp") is True)


@rule("precision.fp16-bf16-exclusive", "error", ref="K1", source="megatron-core",
      fields=("model.bf16", "model.fp16", "mixed_precision"), skill=None, mcore_enforced=True,
      summary="bf16 and fp16 are mutually exclusive")
def _fp16_bf16_exclusive(c: TrainingConfig, d: Derived) -> Violation | None:
    if not (d.precision.bf16 and d.precision.fp16):
        return None
    return Violation("bf16=True and fp16=True on the model (after mixed_precision is applied)",
                     "keep one: mixed_precision: bf16_mixed (or set model.fp16 = false)")


@rule("precision.optimizer-fp16-bf16-exclusive", "error", ref="K1", source="megatron-bridge",
      fields=("optimizer.bf16", "optimizer.fp16"), skill=None,
      summary="optimizer bf16 and fp16 are mutually exclusive")
def _optimizer_fp16_bf16_exclusive(c: TrainingConfig, d: Derived) -> Violation | None:
    # with a mixed_precision section or recipe Bridge overwrites both from it
    o = c.optimizer
    if c.mixed_precision is not None or not (o.bf16 and o.fp16):
        return None
    return Violation("optimizer.bf16=True and optimizer.fp16=True",
                     "set only the one matching the model precision")


@rule("precision.aware-optimizer-dtype-match", "error", ref="K2", source="megatron-bridge",
      fields=(AWARE, "optimizer.bf16", "optimizer.fp16", "model.bf16", "model.fp16"),
      skill=None,
      summary="precision-aware optimizer: optimizer bf16/fp16 must match the model (both false "
              "for fp32)")
def _aware_optimizer_dtype_match(c: TrainingConfig, d: Derived) -> Violation | None:
    # mixed_precision, when given, sets the optimizer's flags from the same values
    o, m = c.optimizer, c.model
    if not o.use_precision_aware_optimizer or c.mixed_precision is not None:
        return None
    if (m.bf16 and not o.bf16) or (m.fp16 and not o.fp16) or (
            not m.bf16 and not m.fp16 and (o.bf16 or o.fp16)):
        return Violation(f"use_precision_aware_optimizer=True with model bf16={m.bf16} fp16="
                         f"{m.fp16} but optimizer bf16={o.bf16} fp16={o.fp16}",
                         "set optimizer.bf16 / optimizer.fp16 equal to the model's, or use a "
                         "mixed_precision recipe (it sets both)")
    return None


@rule("precision.aware-optimizer-needs-adam", "error", ref="K3", source="megatron-core",
      fields=(AWARE, "optimizer.optimizer"), skill=None, mcore_enforced=True,
      summary="precision-aware optimizer is only supported with adam")
def _aware_optimizer_needs_adam(c: TrainingConfig, d: Derived) -> Violation | None:
    o = c.optimizer
    if not o.use_precision_aware_optimizer or o.optimizer == "adam":
        return None
    return Violation(f"use_precision_aware_optimizer=True with optimizer={o.optimizer!r}",
                     f"set optimizer.optimizer = 'adam', or {AWARE} = false")


@rule("precision.aware-optimizer-needs-distopt", "error", ref="K3", source="megatron-core",
      fields=(AWARE, DISTOPT), skill=None, mcore_enforced=True,
      summary="precision-aware optimizer needs the distributed optimizer")
def _aware_optimizer_needs_distopt(c: TrainingConfig, d: Derived) -> Violation | None:
    # Bridge turns the distributed optimizer on in both sections when either asks for it (L3)
    o = c.optimizer
    if not o.use_precision_aware_optimizer or o.use_distributed_optimizer or \
            c.ddp.use_distributed_optimizer:
        return None
    return Violation("use_precision_aware_optimizer=True without the distributed optimizer "
                     "(use_distributed_optimizer=False in optimizer and ddp)",
                     f"set {DISTOPT} = true and ddp.use_distributed_optimizer = true")


@rule("precision.optimizer-dtypes-need-aware", "error", ref="K3", source="megatron-core",
      fields=("optimizer.main_grads_dtype", "optimizer.main_params_dtype",
              "optimizer.exp_avg_dtype", "optimizer.exp_avg_sq_dtype", AWARE), skill=None,
      mcore_enforced=True,
      summary="non-fp32 main grads / main params / Adam moments need the precision-aware "
              "optimizer")
def _optimizer_dtypes_need_aware(c: TrainingConfig, d: Derived) -> Violation | None:
    o = c.optimizer
    bad = [f"{n}={getattr(o, n)}" for n in ("main_grads_dtype", "main_params_dtype",
                                            "exp_avg_dtype", "exp_avg_sq_dtype")
           if not _is_fp32(getattr(o, n))]
    if o.use_precision_aware_optimizer or not bad:
        return None
    return Violation(f"{', '.join(bad)} without use_precision_aware_optimizer",
                     f"set {AWARE} = true (with the distributed optimizer), or keep these fp32")


@rule("precision.fp8-recipe-valid", "error", ref="K4", source="megatron-core",
      fields=(FP8, RECIPE, "model.fp8", "model.fp8_recipe"), skill=WORKFLOW,
      summary="fp8 format in {e4m3, hybrid} and fp8_recipe in {tensorwise, delayed, mxfp8, "
              "blockwise, custom}")
def _fp8_recipe_valid(c: TrainingConfig, d: Derived) -> Violation | None:
    p = d.precision
    if not p.fp8:
        return None
    bad = ([f"fp8={p.fp8!r}"] if p.fp8 not in FP8_FORMATS else []) + (
        [f"fp8_recipe={p.fp8_recipe!r}"] if p.fp8_recipe not in FP8_RECIPES else [])
    if not bad:
        return None
    return Violation(f"{', '.join(bad)} is not a known FP8 setting",
                     f"use fp8 in {{{', '.join(FP8_FORMATS)}}} and fp8_recipe in "
                     f"{{{', '.join(FP8_RECIPES)}}} (or a Bridge mixed_precision recipe)")


@rule("precision.custom-recipe-needs-factory", "error", ref="K4", source="megatron-core",
      fields=(RECIPE, "model.fp8_quantizer_factory", "model.fp4_recipe",
              "model.fp4_quantizer_factory"), skill=None, mcore_enforced=True,
      summary="a custom fp8/fp4 recipe needs its quantizer factory")
def _custom_recipe_needs_factory(c: TrainingConfig, d: Derived) -> Violation | None:
    p, extra = d.precision, c.model.carried()
    mp = _mp_section(c)
    fp4_recipe = (mp.fp4_recipe if mp and mp.fp4_recipe else None) or c.model.fp4_recipe
    bad = (["fp8_recipe='custom' without fp8_quantizer_factory"]
           if p.fp8 and p.fp8_recipe == "custom" and not extra.get("fp8_quantizer_factory")
           else []) + (["fp4_recipe='custom' without fp4_quantizer_factory"]
                       if p.fp4 and fp4_recipe == "custom" and
                       not extra.get("fp4_quantizer_factory") else [])
    if not bad:
        return None
    return Violation("; ".join(bad), "set model.fp8_quantizer_factory / fp4_quantizer_factory to "
                                     "an import path, or pick a built-in recipe")


@rule("precision.fp8-delayed-first-last-bf16", "error", ref="K5", source="megatron-core",
      fields=(RECIPE, "mixed_precision.first_last_layers_bf16"), skill=None,
      mcore_enforced=True,
      summary="delayed FP8 scaling cannot keep the first/last layers in BF16")
def _delayed_no_bf16_edges(c: TrainingConfig, d: Derived) -> Violation | None:
    p = d.precision
    if not p.fp8 or not p.first_last_layers_bf16 or p.fp8_recipe != "delayed":
        return None
    return Violation("first_last_layers_bf16=True with fp8_recipe='delayed'",
                     "use fp8_recipe 'tensorwise' (bf16_with_fp8_current_scaling_mixed), or set "
                     "first_last_layers_bf16 = false")


@rule("precision.bf16-layer-count-range", "error", ref="K5", source="megatron-core",
      fields=("model.num_layers_at_start_in_bf16", "model.num_layers_at_end_in_bf16",
              "model.num_layers", "model.pipeline_model_parallel_size"), skill=None,
      mcore_enforced=True,
      summary="BF16 start/end layer counts within [0, num_layers / PP]")
def _bf16_edge_layers_range(c: TrainingConfig, d: Derived) -> Violation | None:
    p, layers = d.precision, c.model.num_layers
    if not p.fp8 or not p.first_last_layers_bf16 or layers is None:
        return None
    top = layers // d.pp
    bad = [f"{n}={v}" for n, v in zip(("num_layers_at_start_in_bf16",
                                       "num_layers_at_end_in_bf16"),
                                      (p.num_layers_at_start_in_bf16, p.num_layers_at_end_in_bf16),
                                      strict=True) if v < 0 or v > top]
    if not bad:
        return None
    return Violation(f"{', '.join(bad)} outside 0…{top} (num_layers {layers} / PP {d.pp})",
                     f"keep each count between 0 and {top}")


@rule("precision.fp8-param-needs-fp8", "error", ref="K6", source="megatron-core",
      fields=("mixed_precision.fp8_param", "mixed_precision.fp8_param_gather", FP8,
              "model.fp8_param"), skill=None, mcore_enforced=True,
      summary="fp8_param (FP8 weights) needs fp8")
def _fp8_param_needs_fp8(c: TrainingConfig, d: Derived) -> Violation | None:
    p = d.precision
    # Bridge keeps fp8_param and fp8_param_gather in sync
    if not (p.fp8_param or p.fp8_param_gather) or p.fp8:
        return None
    return Violation("fp8_param / fp8_param_gather=True without fp8",
                     "enable FP8 (e.g. mixed_precision: bf16_with_fp8_current_scaling_mixed), or "
                     "set fp8_param and fp8_param_gather = false")


@rule("precision.fp4-param-needs-fp4", "error", ref="K6", source="megatron-core",
      fields=("model.fp4_param", "model.fp4"), skill=None, mcore_enforced=True,
      summary="fp4_param needs fp4")
def _fp4_param_needs_fp4(c: TrainingConfig, d: Derived) -> Violation | None:
    # only the model's own flag: any mixed_precision overwrites it (Bridge rejects fp4_param there)
    if c.mixed_precision is not None or not c.model.fp4_param or c.model.fp4:
        return None
    return Violation("fp4_param=True without fp4", "set model.fp4 (e.g. 'e2m1'), or model."
                                                   "fp4_param = false")


@rule("precision.fp4-fp8-exclusive", "error", ref="K6", source="megatron-core",
      fields=(FP8, "mixed_precision.fp4", "model.fp8", "model.fp4"), skill=None,
      mcore_enforced=True, summary="fp4 and fp8 cannot be used together")
def _fp4_fp8_exclusive(c: TrainingConfig, d: Derived) -> Violation | None:
    p = d.precision
    if not (p.fp4 and p.fp8):
        return None
    return Violation(f"fp4={p.fp4!r} and fp8={p.fp8!r} both set",
                     "choose one: bf16_with_nvfp4_mixed or an FP8 recipe")


@rule("precision.mxfp8-param-gather-needs-reuse-buf", "error", ref="K9",
      source="megatron-bridge",
      fields=("mixed_precision.fp8_param_gather", RECIPE,
              "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag"), skill=None,
      summary="MXFP8 with fp8_param_gather (without Megatron-FSDP) needs "
              "reuse_grad_buf_for_mxfp8_param_ag")
def _mxfp8_param_gather_needs_reuse_buf(c: TrainingConfig, d: Derived) -> Violation | None:
    mp = _mp_section(c)
    if mp is None or _megatron_fsdp(c) or d.precision.fp8_recipe != "mxfp8":
        return None
    if not (mp.fp8_param_gather or mp.fp8_param) or mp.reuse_grad_buf_for_mxfp8_param_ag:
        return None
    return Violation("fp8_param_gather=True with fp8_recipe='mxfp8' and "
                     "reuse_grad_buf_for_mxfp8_param_ag=False",
                     "set mixed_precision.reuse_grad_buf_for_mxfp8_param_ag = true (as "
                     "bf16_with_mxfp8_mixed does)")


@rule("precision.reuse-grad-buf-needs-fp8-param-gather", "error", ref="K10", source="megatron-core",
      fields=("mixed_precision.reuse_grad_buf_for_mxfp8_param_ag",
              "mixed_precision.fp8_param_gather", "ddp.reuse_grad_buf_for_mxfp8_param_ag",
              "ddp.fp8_param_gather"), skill=None, mcore_enforced=True,
      summary="reuse_grad_buf_for_mxfp8_param_ag needs fp8_param_gather (DDP config)")
def _reuse_buf_needs_param_gather(c: TrainingConfig, d: Derived) -> Violation | None:
    mp = _mp_section(c)
    if mp is not None:  # Bridge copies the section's values onto the DDP config
        reuse, gather = mp.reuse_grad_buf_for_mxfp8_param_ag, mp.fp8_param_gather or bool(
            mp.fp8_param)
    elif c.mixed_precision is None:
        extra = c.ddp.carried()
        reuse, gather = extra.get("reuse_grad_buf_for_mxfp8_param_ag") is True, \
            extra.get("fp8_param_gather") is True
    else:
        return None  # a recipe sets both together
    if not reuse or gather:
        return None
    return Violation("reuse_grad_buf_for_mxfp8_param_ag=True with fp8_param_gather=False",
                     "set fp8_param_gather = true (MXFP8 weights), or drop "
                     "reuse_grad_buf_for_mxfp8_param_ag")


@rule("precision.recipe-needs-blackwell", "warning", ref="K12", source="skill",
      fields=(RECIPE, "mixed_precision.fp4", "cluster.gpu"), skill=WORKFLOW,
      summary="MXFP8 and NVFP4 need Blackwell; on Hopper use blockwise or tensorwise FP8")
def _recipe_needs_blackwell(c: TrainingConfig, d: Derived) -> Violation | None:
    p = d.precision
    wants = "fp4" if p.fp4 else ("fp8_recipe='mxfp8'" if p.fp8 and p.fp8_recipe == "mxfp8"
                                 else None)
    gpu = d.gpu if wants else None
    if gpu is None or gpu.architecture in ("blackwell", "rubin"):
        return None
    return Violation(f"{wants} on {gpu.name} ({gpu.architecture}): these formats need "
                     "Blackwell (or later) tensor cores",
                     "use mixed_precision: bf16_with_fp8_subchannel_scaling_mixed (blockwise) "
                     "or bf16_with_fp8_current_scaling_mixed (tensorwise) on Hopper")
