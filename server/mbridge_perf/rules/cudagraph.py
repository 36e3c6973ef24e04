"""CUDA graphs (constraint catalog section G; the allocator / NCCL rows G17 and X3 are in
``env``). The pinned API is ``cuda_graph_impl`` ∈ {none, local, transformer_engine,
full_iteration} plus ``cuda_graph_modules``; ``cuda_graph_scope`` is the deprecated spelling and
is read as modules here, as Megatron-Core migrates it."""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.semantics import (
    GRAPH_IMPLS,
    carried_section,
    full_iteration_graph,
    graph_impl,
    graph_modules,
    model_flag,
    raw_graph_names,
)
from mbridge_perf.rules.catalog import RECOMPUTE, WORKFLOW, Violation, rule

IMPL = "model.cuda_graph_impl"
MODS = "model.cuda_graph_modules"
SCOPE = "model.cuda_graph_scope"
EXPERTS = "model.num_moe_experts"
GRAPH_MODULE_NAMES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba")


def _moe(m: ModelSection) -> bool:
    """Megatron-Core's MoE test for graphs: more than one routed expert."""
    return m.num_moe_experts is not None and m.num_moe_experts > 1


def _drop_pad(m: ModelSection) -> bool:
    """Drop-and-pad MoE: a capacity factor (negative means dropless) and padding to it."""
    cf = m.moe_expert_capacity_factor
    return cf is not None and cf >= 0 and m.moe_pad_expert_input_to_capacity


def _graphed(m: ModelSection, module: str) -> bool:
    return module in graph_modules(m)


@rule("cudagraph.te-rng-tracker", "error", ref="G1", source="megatron-bridge",
      fields=(IMPL, "model.use_te_rng_tracker", "rng.te_rng_tracker"), skill=RECOMPUTE,
      summary="CUDA graphs need the Transformer Engine RNG tracker")
def _te_rng_tracker(c: TrainingConfig, d: Derived) -> Violation | None:
    impl = graph_impl(c.model)
    if impl == "none" or c.model.use_te_rng_tracker or \
            carried_section(c, "rng").get("te_rng_tracker"):
        return None
    return Violation(f'cuda_graph_impl="{impl}" with use_te_rng_tracker=False',
                     "set model.use_te_rng_tracker=True (Bridge keeps rng.te_rng_tracker in "
                     "sync)")


@rule("cudagraph.local-full-iteration-only", "error", ref="G2", source="megatron-bridge",
      fields=(IMPL, MODS, SCOPE), skill=RECOMPUTE,
      summary='Bridge supports cuda_graph_impl="local" only for full-iteration graphs')
def _local_full_iteration_only(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.cuda_graph_impl != "local" or full_iteration_graph(m):
        return None
    mods = graph_modules(m)
    scoped = f" with modules {mods}" if mods else " (per-layer capture)"
    return Violation(f'cuda_graph_impl="local"{scoped}',
                     f'set {IMPL}="transformer_engine" to keep per-layer capture of these '
                     f'modules, or {IMPL}="full_iteration" with {MODS}=[] for whole-iteration '
                     "capture")


@rule("cudagraph.full-iteration-nan-check", "error", ref="G3", source="megatron-bridge",
      fields=(IMPL, "rerun_state_machine.check_for_nan_in_loss"), skill=RECOMPUTE,
      summary="full-iteration graphs need rerun_state_machine.check_for_nan_in_loss=False")
def _full_iteration_nan_check(c: TrainingConfig, d: Derived) -> Violation | None:
    check = carried_section(c, "rerun_state_machine").get("check_for_nan_in_loss", True)
    if not full_iteration_graph(c.model) or check is False:
        return None
    shown = "True" if "check_for_nan_in_loss" in carried_section(c, "rerun_state_machine") \
        else "True (the default)"
    return Violation(f"full-iteration CUDA graph with check_for_nan_in_loss={shown}",
                     "set rerun_state_machine.check_for_nan_in_loss=False (the perf harness "
                     "does this for full-iteration graphs)")


@rule("cudagraph.impl-valid", "error", ref="G5", source="megatron-core", fields=(IMPL,),
      skill=RECOMPUTE, mcore_enforced=True,
      summary="cuda_graph_impl must be none, local, transformer_engine or full_iteration")
def _impl_valid(c: TrainingConfig, d: Derived) -> Violation | None:
    # The release's own Literal (0.16.1: none / local / transformer_engine; 0.19.2 adds
    # full_iteration).
    impl = graph_impl(c.model)
    impls = d.mcore.choices.get("cuda_graph_impl", list(GRAPH_IMPLS))
    if impl in impls:
        return None
    whole = ('"full_iteration" (whole step)' if "full_iteration" in impls else
             '"local" with cuda_graph_scope="full_iteration" (whole step)')
    return Violation(f"cuda_graph_impl={impl!r} is not a CUDA graph implementation of "
                     f"Megatron-Core {d.mcore.version}",
                     f'set {IMPL} to "transformer_engine" (per-layer graphs), {whole} or "none"')


@rule("cudagraph.full-iteration-no-modules", "error", ref="G6", source="megatron-core",
      fields=(IMPL, MODS, SCOPE), skill=RECOMPUTE,
      summary="cuda_graph_impl=full_iteration needs cuda_graph_modules empty")
def _full_iteration_no_modules(c: TrainingConfig, d: Derived) -> Violation | None:
    # Pin only: 0.16.1 has neither the impl nor cuda_graph_modules, so not mcore_enforced.
    mods = graph_modules(c.model)
    if graph_impl(c.model) != "full_iteration" or not mods:
        return None
    return Violation(f'cuda_graph_impl="full_iteration" with modules {mods}',
                     f"set {MODS}=[] (the whole step is captured), or use "
                     f'{IMPL}="transformer_engine" for per-module graphs')


@rule("cudagraph.legacy-flags", "error", ref="G7", source="megatron-core",
      fields=(IMPL, "model.enable_cuda_graph", "model.external_cuda_graph"), skill=RECOMPUTE,
      mcore_enforced=True,
      summary="deprecated enable_cuda_graph / external_cuda_graph cannot be mixed")
def _deprecated_flags_mixed(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.enable_cuda_graph and m.external_cuda_graph:
        return Violation("enable_cuda_graph=True and external_cuda_graph=True",
                         f'drop both and set {IMPL} ("local" or "transformer_engine")')
    old = "enable_cuda_graph" if m.enable_cuda_graph else "external_cuda_graph" \
        if m.external_cuda_graph else None
    if old is None or m.cuda_graph_impl == "none":
        return None
    return Violation(f'{old}=True with cuda_graph_impl="{m.cuda_graph_impl}"',
                     f"drop model.{old} and keep only {IMPL}")


@rule("cudagraph.scope-and-modules", "error", ref="G7", source="megatron-core",
      fields=(SCOPE, MODS), skill=RECOMPUTE,
      summary="cuda_graph_scope and cuda_graph_modules cannot both be set")
def _scope_and_modules(c: TrainingConfig, d: Derived) -> Violation | None:
    # 0.19.2 migrates a scope (even []) onto modules still at "full" / None / [] (what Bridge
    # dumps); 0.16.1 has no cuda_graph_modules, so a module choice there has nowhere to go.
    m = c.model
    unset_modules = m.cuda_graph_modules in ("full", None, [])
    if not d.mcore.has_cuda_graph_modules_field:
        if unset_modules:
            return None
        return Violation(f"cuda_graph_modules={m.cuda_graph_modules!r}: Megatron-Core "
                         f"{d.mcore.version} has no such field",
                         f"give the modules as {SCOPE} (this release's field) and drop {MODS}")
    if m.cuda_graph_scope is None or unset_modules:
        return None
    return Violation(f"cuda_graph_scope={m.cuda_graph_scope!r} and cuda_graph_modules="
                     f"{m.cuda_graph_modules!r} are both set",
                     f"drop {SCOPE} (deprecated; null it) and keep {MODS}")


@rule("cudagraph.deprecated-fields", "info", ref="G7", source="megatron-core",
      fields=(SCOPE, "model.enable_cuda_graph", "model.external_cuda_graph"), skill=RECOMPUTE,
      summary="cuda_graph_scope, enable_cuda_graph and external_cuda_graph are deprecated")
def _deprecated_fields(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    moves = []
    if m.enable_cuda_graph:
        moves.append('enable_cuda_graph=True → cuda_graph_impl="local"')
    if m.external_cuda_graph:
        moves.append('external_cuda_graph=True → cuda_graph_impl="transformer_engine"')
    if d.mcore.has_cuda_graph_modules_field:  # before 0.19 the scope is the field itself
        moves += _old_graph_spellings(m)
    if not moves:
        return None
    return Violation(f"deprecated CUDA graph fields at Megatron-Core {d.mcore.version}: "
                     f"{'; '.join(moves)}",
                     f"rewrite as shown ({IMPL} + {MODS}; Megatron-Core migrates them with a "
                     "deprecation warning)")


def _old_graph_spellings(m: ModelSection) -> list[str]:
    """What 0.19's __post_init__ migrates: a non-empty cuda_graph_scope, and the
    "full_iteration" module name (→ cuda_graph_impl="full_iteration")."""
    scope = m.cuda_graph_scope
    if scope:
        names = raw_graph_names(m)
        if "full_iteration" in names:
            return [f'cuda_graph_scope={scope!r} → cuda_graph_impl="full_iteration", '
                    "cuda_graph_modules=[]"]
        return [f"cuda_graph_scope={scope!r} → cuda_graph_modules="
                f"{[n for n in names if n != 'full']}"]
    if "full_iteration" in raw_graph_names(m):
        return ['cuda_graph_modules="full_iteration" → cuda_graph_impl="full_iteration", '
                "cuda_graph_modules=[]"]
    return []


@rule("cudagraph.unknown-module", "error", ref="G7", source="megatron-core",
      fields=(MODS, SCOPE), skill=RECOMPUTE, mcore_enforced=True,
      summary="cuda_graph_modules names must be attn, mlp, moe, moe_router, moe_preprocess "
              "or mamba")
def _unknown_module(c: TrainingConfig, d: Derived) -> Violation | None:
    # Megatron-Core fails with a bare KeyError from its scope enum lookup; with graphs off
    # Bridge clears the modules first (G4), which graph_modules() mirrors.
    known = d.mcore.cuda_graph_modules or GRAPH_MODULE_NAMES
    bad = [n for n in graph_modules(c.model) if n not in known
           and n not in d.mcore.cuda_graph_deprecated_modules]
    if not bad:
        return None
    return Violation(f"unknown CUDA graph modules: {', '.join(map(repr, bad))}",
                     f"use only {', '.join(known)} in {MODS} ([] graphs the "
                     f'whole layer; whole-step capture is {IMPL}="full_iteration")')


@rule("cudagraph.moe-router-exclusive", "error", ref="G8", source="megatron-core",
      fields=(MODS,), skill=WORKFLOW, mcore_enforced=True,
      summary="moe and moe_router graph modules are mutually exclusive")
def _moe_and_router(c: TrainingConfig, d: Derived) -> Violation | None:
    if not (_graphed(c.model, "moe") and _graphed(c.model, "moe_router")):
        return None
    return Violation(f"CUDA graph modules {graph_modules(c.model)} contain both moe and "
                     "moe_router", f"keep moe (drop-and-pad MoE) or moe_router in {MODS}, "
                     "not both")


@rule("cudagraph.preprocess-needs-router", "error", ref="G9", source="megatron-core",
      fields=(MODS,), skill=WORKFLOW, mcore_enforced=True,
      summary="moe_preprocess graph module needs moe_router")
def _preprocess_needs_router(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _graphed(c.model, "moe_preprocess") or _graphed(c.model, "moe_router"):
        return None
    return Violation(f"CUDA graph modules {graph_modules(c.model)} have moe_preprocess "
                     "without moe_router", f'add moe_router to {MODS} (e.g. ["moe_router", '
                     '"moe_preprocess"])')


@rule("cudagraph.moe-needs-moe", "error", ref="G10", source="megatron-core",
      fields=(MODS, EXPERTS), skill=WORKFLOW, mcore_enforced=True,
      summary="moe / moe_router graph modules only for MoE models")
def _moe_modules_need_moe(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    hit = [x for x in ("moe", "moe_router") if _graphed(m, x)]
    if not hit or _moe(m):
        return None
    return Violation(f"CUDA graph modules {hit} on a model with num_moe_experts="
                     f"{m.num_moe_experts}", f'drop {", ".join(hit)} from {MODS}; graph "mlp" '
                     "or the whole layer on a dense model")


@rule("cudagraph.mlp-needs-dense", "error", ref="G11", source="megatron-core",
      fields=(MODS, "model.moe_layer_freq"), skill=WORKFLOW, mcore_enforced=True,
      summary="mlp graph module needs dense layers (not every layer MoE)")
def _mlp_needs_dense_layers(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    freq = m.moe_layer_freq
    all_moe = freq == 1 or (isinstance(freq, list) and 0 not in freq)
    if not _moe(m) or not all_moe or not _graphed(m, "mlp"):
        return None
    return Violation(f"CUDA graph module mlp with moe_layer_freq={freq!r}: every layer is MoE, "
                     "there is no dense MLP to capture",
                     f'drop mlp from {MODS}; for MoE layers graph ["moe_router", '
                     '"moe_preprocess"] (dropless) or moe (drop-and-pad)')


@rule("cudagraph.moe-needs-drop-pad", "error", ref="G12", source="megatron-core",
      fields=(MODS, "model.moe_expert_capacity_factor", "model.moe_pad_expert_input_to_capacity"),
      skill=WORKFLOW, mcore_enforced=True,
      summary="moe graph module only for drop-and-pad MoE")
def _moe_needs_drop_pad(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not _moe(m) or _drop_pad(m) or not _graphed(m, "moe"):
        return None
    return Violation(f"CUDA graph module moe on MoE that is not drop-and-pad "
                     f"(moe_expert_capacity_factor="
                     f"{m.moe_expert_capacity_factor}, moe_pad_expert_input_to_capacity="
                     f"{m.moe_pad_expert_input_to_capacity})",
                     'graph ["moe_router", "moe_preprocess"] instead of moe, or make the MoE '
                     "drop-and-pad (model.moe_expert_capacity_factor set and "
                     "model.moe_pad_expert_input_to_capacity=True)")


@rule("cudagraph.preprocess-dtoh", "error", ref="G13", source="megatron-core",
      fields=(MODS, "model.moe_token_dispatcher_type", "model.moe_expert_capacity_factor",
              "model.moe_router_padding_for_quantization"), skill=WORKFLOW, mcore_enforced=True,
      summary="moe_preprocess graph not allowed with alltoall + capacity factor / router "
              "padding (host syncs)")
def _preprocess_d2h_sync(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    cf = m.moe_expert_capacity_factor
    padding = m.moe_router_padding_for_quantization or bool(
        m.carried().get("moe_router_padding_for_fp8"))
    causes = ([f"moe_expert_capacity_factor={cf}"] if cf is not None and cf >= 0 else []) + \
        (["router padding for quantization"] if padding else [])
    if not _moe(m) or _drop_pad(m) or m.moe_token_dispatcher_type != "alltoall" or \
            not causes or not _graphed(m, "moe_preprocess"):
        return None
    return Violation(f"CUDA graph module moe_preprocess with the alltoall dispatcher and "
                     f"{' and '.join(causes)}: its preprocessing copies to the host",
                     f'graph only ["moe_router"] in {MODS}, or remove the capacity factor / '
                     "router padding")


@rule("cudagraph.ep-overlap-modules", "error", ref="G18", source="megatron-core",
      fields=("comm_overlap.overlap_moe_expert_parallel_comm", IMPL, MODS), skill=WORKFLOW,
      mcore_enforced=True, summary="EP comm overlap with TE graphs: no moe or mlp graph modules")
def _ep_overlap_modules(c: TrainingConfig, d: Derived) -> Violation | None:
    # Follows the catalog row (TE graphs); a non-TE impl with EP overlap, which Megatron-Core
    # rejects with the same message, is moe-overlap.requirements (J1).
    m = c.model
    hit = [x for x in ("moe", "mlp") if _graphed(m, x)]
    if not model_flag(c, "overlap_moe_expert_parallel_comm") or \
            graph_impl(m) != "transformer_engine" or not hit:
        return None
    return Violation(f"overlap_moe_expert_parallel_comm=True with CUDA graph modules {hit}",
                     f'drop {", ".join(hit)} from {MODS} (graph attn / moe_router / '
                     "moe_preprocess), or turn EP overlap off")


def _delay_wgrad_graph_problems(c: TrainingConfig) -> list[str]:
    """What Bridge rejects when delayed wgrad meets a graph that holds a weight-gradient
    producer (attn, or moe_router with non-overlapped shared experts)."""
    m = c.model
    if not model_flag(c, "delay_wgrad_compute") or graph_impl(m) == "none":
        return []
    attn = _graphed(m, "attn")
    shared = _graphed(m, "moe_router") and m.moe_shared_expert_intermediate_size is not None \
        and not m.moe_shared_expert_overlap
    if not (attn or shared):
        return []
    out = [] if m.gradient_accumulation_fusion else ["gradient_accumulation_fusion=False"]
    if attn and (m.add_bias_linear or m.add_qkv_bias):
        out.append(f"attention bias (add_bias_linear={m.add_bias_linear}, "
                   f"add_qkv_bias={m.add_qkv_bias})")
    return out


@rule("cudagraph.delay-wgrad-graph", "error", ref="G19", source="megatron-bridge",
      fields=("comm_overlap.delay_wgrad_compute", MODS, "model.gradient_accumulation_fusion",
              "model.add_bias_linear", "model.add_qkv_bias"), skill=WORKFLOW,
      summary="delayed wgrad with graphed attn / router: gradient accumulation fusion, no "
              "attention bias, TE >= 2.12")
def _delay_wgrad_graph(c: TrainingConfig, d: Derived) -> Violation | None:
    problems = _delay_wgrad_graph_problems(c)
    if not problems:
        return None
    return Violation(f"delay_wgrad_compute=True with graphed {graph_modules(c.model)} and "
                     f"{'; '.join(problems)}",
                     "set model.gradient_accumulation_fusion=True and, when attn is graphed, "
                     "model.add_bias_linear=False and model.add_qkv_bias=False (Transformer "
                     "Engine >= 2.12 is also required); or leave attn / moe_router out of "
                     f"{MODS}")


@rule("cudagraph.mamba-module-for-gdn", "info", ref="G24", source="skill",
      fields=(MODS, "model.experimental_attention_variant"), skill=RECOMPUTE,
      summary="gated delta net layers are graphed with attn, not mamba")
def _mamba_module_for_gdn(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    variant = m.experimental_attention_variant
    if not _graphed(m, "mamba") or variant not in ("gdn", "gdn2", "gated_delta_net"):
        return None
    return Violation(f"CUDA graph module mamba with experimental_attention_variant={variant!r}: "
                     "gated delta net lives under self_attention, so mamba captures nothing",
                     f"use attn instead of mamba in {MODS}")
