"""Megatron-Core's reading of the fields every room asks about: which recompute modules are on,
whether attention is fused, which CUDA graphs run and what they cover, and the skills' order of
selective-recompute modules.

Why on the ground floor: the validator, the estimator, the recompute ladder, the planner, the
bench contract and the answers all ask these questions; answered once here, they cannot
disagree (they did: three default rules for ``recompute_modules``, two definitions of fused
attention, three selective orders). Pure functions of the model section (and, for attention,
of whether the run is in half precision); nothing here imports another room.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mbridge_perf.config.layers import LayerKind
from mbridge_perf.config.model import ModelSection, TrainingConfig

# Valid labels at the pinned Megatron-Core. 0.16.1 lacks gdn_norm_out; the pin wins.
RECOMPUTE_LABELS = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe",
                    "shared_experts", "gdn_norm_out")
GRAPH_IMPLS = ("none", "local", "transformer_engine", "full_iteration")
_FUSED_BACKENDS = ("auto", "fused", "flash")
DEFAULT_RECOMPUTE_MODULES = ("core_attn",)
"""What Megatron-Core's TransformerConfig puts in ``recompute_modules`` when it is unset
(``None``); an explicit ``[]`` stays empty."""
LONG_CONTEXT = 32768
"""From here on (the long-context skill's 32K-256K range) attention dominates the step: neither
core_attn nor full recompute is a way to fit (both repeat attention)."""


def bare_name(value: object) -> str:
    """Enum member or string to its bare name: ``AttnBackend.flash`` → ``flash``."""
    if isinstance(value, str):  # the usual case, without the attribute lookup
        return value.rsplit(".", 1)[-1]
    return str(getattr(value, "name", value)).rsplit(".", 1)[-1]


def attention_backend(m: ModelSection) -> str:
    return bare_name(m.attention_backend)


def fused_attention(m: ModelSection, half_precision: bool) -> bool:
    """Attention runs in a Transformer Engine fused / flash kernel, which keeps no s² score
    matrix (so recomputing core_attn frees ≈ 0). Not with the local implementation or the
    unfused / local backends, and not in FP32: TE's fused and flash kernels take FP16 / BF16
    only and fall back to unfused attention otherwise."""
    if m.transformer_impl == "local" or attention_backend(m) not in _FUSED_BACKENDS:
        return False
    return half_precision


# --- recompute ---------------------------------------------------------------------------------


def recompute_modules(m: ModelSection) -> list[str]:
    """recompute_modules as Megatron-Core reads them: unset means ["core_attn"], an explicit
    list (also ``[]``) is kept."""
    return list(DEFAULT_RECOMPUTE_MODULES if m.recompute_modules is None else
                m.recompute_modules)


@dataclass(frozen=True, slots=True)
class Recompute:
    """Activation recompute in effect: the deprecated ``moe_layer_recompute`` folded in
    (selective + ``moe``, as Megatron-Core does after its recompute checks and before its
    CUDA-graph checks); ``modules`` is what ``recompute_modules`` reads as (also when
    granularity is not selective), ``selective`` the modules actually recomputed."""

    granularity: str | None
    method: str | None
    num_layers: int | None
    modules: tuple[str, ...]
    selective: tuple[str, ...]


def recompute(m: ModelSection) -> Recompute:
    mods = m.recompute_modules
    key = (m.recompute_granularity, m.recompute_method, m.recompute_num_layers,
           None if mods is None else tuple(mods), m.moe_layer_recompute)
    try:
        return _recompute(*key)
    except TypeError:  # an unhashable label (a mapping): read it without the cache
        return _recompute.__wrapped__(*key)


@lru_cache(maxsize=256)
def _recompute(granularity: str | None, method: str | None, num_layers: int | None,
               mods: tuple[str, ...] | None, moe_layer_recompute: bool) -> Recompute:
    """recompute() on the recompute fields alone (cached: every estimate reads it)."""
    modules = list(DEFAULT_RECOMPUTE_MODULES if mods is None else mods)
    if moe_layer_recompute and granularity != "full":
        granularity = "selective"
        if "moe" not in modules:
            modules = [*modules, "moe"]
    selective = tuple(modules) if granularity == "selective" else ()
    return Recompute(granularity, method, num_layers, tuple(modules), selective)


def effective_recompute(m: ModelSection) -> tuple[str | None, list[str]]:
    """(granularity, modules) after the deprecated ``moe_layer_recompute`` is folded in."""
    r = recompute(m)
    return r.granularity, list(r.modules)


# --- CUDA graphs ---------------------------------------------------------------------------------


def _names(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [s.strip() for s in value.split(",") if s.strip()]
    if isinstance(value, list | tuple):
        return [bare_name(v) for v in value]
    return [bare_name(value)]


def graph_impl(m: ModelSection) -> str:
    """cuda_graph_impl after the deprecated enable_cuda_graph / external_cuda_graph flags are
    migrated (Megatron-Core does so only when the impl is still "none")."""
    impl = bare_name(m.cuda_graph_impl)
    if impl == "none" and m.enable_cuda_graph:
        return "local"
    if impl == "none" and m.external_cuda_graph:
        return "transformer_engine"
    return impl


def raw_graph_names(m: ModelSection) -> list[str]:
    """Every name the user put in cuda_graph_modules and the deprecated cuda_graph_scope."""
    return _names(m.cuda_graph_modules) + _names(m.cuda_graph_scope)


def full_iteration_graph(m: ModelSection) -> bool:
    """Full-iteration capture, in the pinned spelling or the legacy local + scope one
    (Bridge ``is_full_iteration_cuda_graph``)."""
    impl = graph_impl(m)
    return impl == "full_iteration" or (impl == "local"
                                        and "full_iteration" in raw_graph_names(m))


def graph_modules(m: ModelSection) -> list[str]:
    """Per-layer graph modules in effect: none when graphs are off (Bridge clears them), the
    local impl always graphs moe_router and moe_preprocess together (Megatron-Core)."""
    if graph_impl(m) == "none":
        return []
    mods = [n for n in dict.fromkeys(raw_graph_names(m)) if n not in ("full", "full_iteration")]
    if graph_impl(m) == "local" and {"moe_router", "moe_preprocess"} & set(mods):
        mods += [n for n in ("moe_router", "moe_preprocess") if n not in mods]
    return mods


@dataclass(frozen=True, slots=True)
class Graphs:
    """CUDA graphs in effect. ``te_scopes``: the per-layer Transformer Engine graph modules
    (``()`` = whole layers), None when layers are not graphed by TE (graphs off, ``local`` or
    full-iteration graphs)."""

    impl: str
    modules: tuple[str, ...]
    full_iteration: bool
    te_scopes: tuple[str, ...] | None

    @property
    def on(self) -> bool:
        return self.impl != "none"

    @property
    def per_layer(self) -> bool:
        return self.on and not self.full_iteration

    def describe(self) -> str:
        mods = list(self.modules)
        return f'cuda_graph_impl="{self.impl}"' + (f" with modules {mods}" if mods else "")


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def graphs(m: ModelSection) -> Graphs:
    """The graph view of a model section (cached on the graph fields: the planner reads it for
    thousands of layouts of one model)."""
    key = (m.cuda_graph_impl, m.enable_cuda_graph, m.external_cuda_graph,
           _hashable(m.cuda_graph_modules), _hashable(m.cuda_graph_scope))
    try:
        return _graphs(*key)
    except TypeError:  # an unhashable spelling (a mapping): read it without the cache
        return _graphs.__wrapped__(*key)


@lru_cache(maxsize=256)
def _graphs(impl: Any, enable: bool, external: bool, modules: Any, scope: Any) -> Graphs:
    m = ModelSection.model_construct(
        cuda_graph_impl=impl, enable_cuda_graph=enable, external_cuda_graph=external,
        cuda_graph_modules=list(modules) if isinstance(modules, tuple) else modules,
        cuda_graph_scope=list(scope) if isinstance(scope, tuple) else scope)
    full = full_iteration_graph(m)
    mods = tuple(graph_modules(m))
    the_impl = graph_impl(m)
    te = tuple(sorted(mods)) if the_impl == "transformer_engine" and not full else None
    return Graphs(the_impl, mods, full, te)


# --- the selective-recompute order ---------------------------------------------------------------


def first_selective_modules(m: ModelSection, kinds: tuple[LayerKind, ...],
                            half_precision: bool, *, long_context: bool = False) -> list[str]:
    """The selective modules to try first, in the skills' order: the one source of truth for
    every door that names a first recompute module. core_attn only with unfused attention
    (and never at long context, where it repeats attention); then what the architecture stores
    most cheaply (mla_up_proj, moe_act); else layernorm. mlp is never first."""
    first = [] if fused_attention(m, half_precision) or long_context else ["core_attn"]
    if any(k.mixer == "mla" for k in kinds):
        first.append("mla_up_proj")
    if any(k.mlp == "moe" for k in kinds) and m.moe_grouped_gemm:
        first.append("moe_act")
    return first or ["layernorm"]


def first_selective_hint(mods: list[str]) -> str:
    """The first-module advice as config text, for fix messages."""
    why = "" if "core_attn" in mods else " (core_attn frees ≈ 0 under fused / flash attention)"
    return (f"model.recompute_granularity=selective with model.recompute_modules="
            f"[{', '.join(mods)}]{why}")


def selective_order(m: ModelSection, kinds: tuple[LayerKind, ...], half_precision: bool, *,
                    long_context: bool = False) -> list[str]:
    """Every selective module that applies to this architecture, cheapest memory first: the
    first modules, layernorm, mlp (dense FFNs: the expensive last resort), shared_experts, moe.
    """
    order = first_selective_modules(m, kinds, half_precision, long_context=long_context)
    if "layernorm" not in order:
        order.append("layernorm")
    moe = any(k.mlp == "moe" for k in kinds)
    if any(k.mlp == "dense" for k in kinds):
        order.append("mlp")
    if moe and m.moe_shared_expert_intermediate_size:
        order.append("shared_experts")
    if moe:
        order.append("moe")
    return order


# --- other switches -----------------------------------------------------------------------------


def carried_section(cfg: TrainingConfig, name: str) -> dict[str, Any]:
    """An unmodelled top-level section (rerun_state_machine, rng, dist, …) or {}."""
    section = cfg.carried().get(name)
    return section if isinstance(section, dict) else {}


def model_flag(cfg: TrainingConfig, name: str) -> bool:
    """A model switch Bridge can also receive from ``comm_overlap`` (applied onto the model)."""
    return bool(getattr(cfg.overlap, name, False) or cfg.model.carried().get(name))
