"""Activation recompute (constraint catalog section E). What the config means (the modules in
effect, graphs, fused attention, the selective order) is read from the resolved view and
config.semantics; these rules only judge it.
"""

from __future__ import annotations

import difflib

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.semantics import (
    RECOMPUTE_LABELS,
    attention_backend,
    effective_recompute,
    first_selective_hint,
    full_iteration_graph,
    graph_impl,
    graph_modules,
    graphs,
    recompute_modules,
)
from mbridge_perf.rules.catalog import RECOMPUTE, Violation, rule

GRAN = "model.recompute_granularity"
METHOD = "model.recompute_method"
NUM = "model.recompute_num_layers"
MODULES = "model.recompute_modules"
IMPL = "model.cuda_graph_impl"
GRAPH_MODULES = "model.cuda_graph_modules"
SP = "model.sequence_parallel"

_LABEL_HINTS = {"up_proj": "mla_up_proj", "norm": "layernorm", "attention": "core_attn",
                "attn": "core_attn", "core_attention": "core_attn", "moe_layer": "moe",
                "shared_expert": "shared_experts", "act": "moe_act", "ln": "layernorm"}


def _describe_graphs(m: ModelSection) -> str:
    return graphs(m).describe()


# --- rules (catalog order) ------------------------------------------------------------------


@rule("recompute.granularity-valid", "error", ref="E1", source="megatron-core", fields=(GRAN,),
      skill=RECOMPUTE, mcore_enforced=True,
      summary='recompute_granularity must be "full", "selective" or None')
def _granularity_valid(c: TrainingConfig, d: Derived) -> Violation | None:
    g = c.model.recompute_granularity
    if g is None or g in ("full", "selective"):
        return None
    return Violation(f"recompute_granularity={g!r} is not a recompute granularity",
                     f'set {GRAN} to "selective" (submodules) or "full" (whole layers), or null '
                     "for no recompute")


@rule("recompute.full-before-selective", "info", ref="E1", source="skill", fields=(GRAN,),
      skill=RECOMPUTE, summary="full recompute chosen before selective recompute was tried")
def _full_before_selective(c: TrainingConfig, d: Derived) -> Violation | None:
    # Fires for full recompute unless a baseline shows recompute was already on (selective was
    # tried, or full is unchanged): the skill's order is allocator, selective, then full.
    if c.model.recompute_granularity != "full":
        return None
    if d.baseline is not None and d.baseline.model.recompute_granularity is not None:
        return None
    where = " (the baseline had no recompute)" if d.baseline is not None else ""
    return Violation(
        f'recompute_granularity="full"{where}: whole-layer recompute repeats the full forward '
        "of each recomputed layer, the most expensive option",
        f"try {first_selective_hint(d.first_selective_modules())} first, then add layernorm (after "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); go to full only if that cannot fit")


@rule("recompute.method-valid", "error", ref="E2", source="megatron-core", fields=(GRAN, METHOD),
      skill=RECOMPUTE, mcore_enforced=True,
      summary='recompute_method must be "uniform" or "block" when set')
def _method_valid(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity is None or m.recompute_method in (None, "uniform", "block"):
        return None
    return Violation(f"recompute_method={m.recompute_method!r} is not a recompute method",
                     f'set {METHOD} to "uniform" or "block"')


@rule("recompute.full-needs-method", "error", ref="E3", source="megatron-core",
      fields=(GRAN, METHOD), skill=RECOMPUTE, mcore_enforced=True,
      summary="full granularity needs recompute_method uniform or block")
def _full_needs_method(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity != "full" or m.recompute_method is not None:
        return None
    return Violation('recompute_granularity="full" without recompute_method',
                     f'set {METHOD} to "uniform" (recompute every group of N layers) or "block" '
                     "(recompute the first N layers of each stage)")


def _layers_per_chunk_max(d: Derived) -> int | None:
    """Most transformer layers any (PP rank, virtual chunk) holds; block recompute counts
    per chunk."""
    sizes = [n for rank in d.layers_per_chunk or [] for n in rank]
    if sizes:
        return max(sizes)
    n = d.cfg.model.num_layers
    return n // d.pp if n is not None else None


@rule("recompute.full-needs-num-layers", "error", ref="E4", source="megatron-core",
      fields=(GRAN, NUM), skill=RECOMPUTE, mcore_enforced=True,
      summary="full granularity needs recompute_num_layers (1 … layers per pipeline stage)")
def _full_needs_num_layers(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity != "full" or m.recompute_num_layers is not None:
        return None
    top = _layers_per_chunk_max(d)
    span = f"between 1 and {top}" if top else "of at least 1"
    return Violation('recompute_granularity="full" without recompute_num_layers',
                     f"set {NUM} to a value {span} (layers per pipeline stage, per virtual "
                     'chunk); 1 with "uniform" saves the most memory')


@rule("recompute.num-layers-range", "warning", ref="E4", source="megatron-core",
      fields=(GRAN, METHOD, NUM, "model.num_layers", "model.pipeline_model_parallel_size"),
      skill=RECOMPUTE,
      summary="recompute_num_layers outside 1 … layers per stage (Megatron-Core does not "
              "range-check it at config time)")
def _num_layers_range(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    n = m.recompute_num_layers
    if m.recompute_granularity != "full" or n is None:
        return None
    top = _layers_per_chunk_max(d)
    if n == 0:
        effect = ("the uniform loop never advances, so the first step hangs"
                  if m.recompute_method == "uniform" else "no layer is recomputed")
        return Violation(f"recompute_num_layers=0 with full recompute: {effect}",
                         f"set {NUM} between 1 and {top or 'the layers per stage'}, or set "
                         f"{GRAN} to null")
    if top is None or n <= top:
        return None
    return Violation(f"recompute_num_layers={n} exceeds the {top} layers per pipeline stage "
                     f"(num_layers={m.num_layers}, PP={d.pp}, VPP={d.vpp}); every layer is "
                     "recomputed", f"set {NUM} to at most {top}")


@rule("recompute.selective-no-num-layers", "error", ref="E5", source="megatron-core",
      fields=(GRAN, NUM), skill=RECOMPUTE, mcore_enforced=True,
      summary="selective granularity needs recompute_num_layers None")
def _selective_no_num_layers(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity != "selective" or m.recompute_num_layers is None:
        return None
    return Violation(f'recompute_granularity="selective" with recompute_num_layers='
                     f"{m.recompute_num_layers}",
                     f"set {NUM} to null (selective recomputes {MODULES} in every layer), or "
                     f'use {GRAN}="full" with {METHOD}')


@rule("recompute.distribute-saved-vs-sp", "error", ref="E6", source="megatron-core",
      fields=("model.distribute_saved_activations", SP, GRAN), skill=RECOMPUTE,
      mcore_enforced=True,
      summary="distribute_saved_activations is incompatible with sequence parallelism")
def _distribute_saved_vs_sp(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity is None or not (m.distribute_saved_activations
                                               and m.sequence_parallel):
        return None
    return Violation("distribute_saved_activations=True with sequence_parallel=True",
                     "set model.distribute_saved_activations=False (sequence parallelism "
                     "already splits the saved activations over TP)")


def _suggest(label: str, labels: list[str]) -> str | None:
    hint = _LABEL_HINTS.get(label.lower())
    if hint in labels:
        return hint
    close = difflib.get_close_matches(label.lower(), labels, n=1, cutoff=0.5)
    return close[0] if close else None


@rule("recompute.unknown-module", "error", ref="E7", source="megatron-core", fields=(MODULES,),
      skill=RECOMPUTE, mcore_enforced=True,
      summary="recompute_modules labels must be valid at the Megatron-Core release")
def _unknown_module(c: TrainingConfig, d: Derived) -> Violation | None:
    # Checked only for selective granularity, as Megatron-Core does. 0.16.1 also rejects
    # gdn_norm_out, which the pin accepts.
    # The labels are the release's own (d.mcore, read from its wheel).
    m = c.model
    if m.recompute_granularity != "selective":
        return None
    labels = [x for x in RECOMPUTE_LABELS if x in d.mcore.recompute_modules] + [
        x for x in d.mcore.recompute_modules if x not in RECOMPUTE_LABELS]
    bad = [x for x in dict.fromkeys(recompute_modules(m)) if x not in labels]
    if not bad:
        return None
    parts = []
    for x in bad:
        hint = _suggest(x, labels)
        parts.append(f"{x!r} (did you mean {hint!r}?)" if hint else repr(x))
    return Violation(f"recompute_modules has unknown labels at Megatron-Core "
                     f"{d.mcore.version}: {', '.join(parts)}",
                     f"use only {', '.join(labels)} in {MODULES}")


@rule("recompute.mlp-costly", "info", ref="E7", source="skill", fields=(MODULES,),
      skill=RECOMPUTE, summary="mlp recompute on a dense model: large throughput cost, last resort")
def _mlp_costly(c: TrainingConfig, d: Derived) -> Violation | None:
    granularity, modules = effective_recompute(c.model)
    if granularity != "selective" or "mlp" not in modules or d.is_moe:
        return None
    return Violation(
        "recompute_modules contains mlp on a dense model: measured on Llama3 70B it saved "
        "≈ 3 GB for ≈ 16 % lower TFLOP/s/GPU (−16.4 %)",
        "first set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and try cheaper labels "
        f"({', '.join(dict.fromkeys([*d.first_selective_modules(), 'layernorm']))}); keep "
        "mlp only if the throughput loss is accepted, and use it alone rather than with "
        "core_attn")


def _selective_with(m: ModelSection, label: str) -> bool:
    return m.recompute_granularity == "selective" and label in recompute_modules(m)


@rule("recompute.moe-act-needs-grouped-gemm", "error", ref="E8", source="megatron-core",
      fields=(MODULES, "model.moe_grouped_gemm"), skill=RECOMPUTE, mcore_enforced=True,
      summary="moe_act recompute needs moe_grouped_gemm")
def _moe_act_needs_grouped_gemm(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _selective_with(c.model, "moe_act") or c.model.moe_grouped_gemm:
        return None
    return Violation("recompute_modules contains moe_act but moe_grouped_gemm=False",
                     "set model.moe_grouped_gemm=True, or drop moe_act from "
                     f"{MODULES}")


@rule("recompute.mla-up-proj-needs-mla", "error", ref="E9", source="megatron-core",
      fields=(MODULES, "model.multi_latent_attention"), skill=RECOMPUTE, mcore_enforced=True,
      summary="mla_up_proj recompute needs multi_latent_attention")
def _mla_up_proj_needs_mla(c: TrainingConfig, d: Derived) -> Violation | None:
    if not _selective_with(c.model, "mla_up_proj") or c.model.multi_latent_attention:
        return None
    return Violation("recompute_modules contains mla_up_proj on a model with "
                     "multi_latent_attention=False",
                     f"drop mla_up_proj from {MODULES} (it only exists in MLA attention); "
                     f"use {', '.join(d.first_selective_modules())} instead")


@rule("recompute.gdn-norm-out-needs-gdn", "error", ref="E10", source="megatron-core",
      fields=(MODULES, "model.experimental_attention_variant"), skill=RECOMPUTE,
      mcore_enforced=True,  # 0.16.1 rejects the label itself, so it raises here too
      summary="gdn_norm_out recompute needs experimental_attention_variant gdn or gdn2")
def _gdn_norm_out_needs_gdn(c: TrainingConfig, d: Derived) -> Violation | None:
    variant = c.model.experimental_attention_variant
    if not _selective_with(c.model, "gdn_norm_out") or variant in ("gdn", "gdn2"):
        return None
    return Violation("recompute_modules contains gdn_norm_out with experimental_attention_"
                     f"variant={variant!r}",
                     f"drop gdn_norm_out from {MODULES}; it only exists in gated delta net "
                     'layers (experimental_attention_variant "gdn" or "gdn2")')


@rule("recompute.core-attn-fused", "warning", ref="E11", source="megatron-core",
      fields=(MODULES, "model.attention_backend", "model.transformer_impl"), skill=RECOMPUTE,
      summary="core_attn recompute with TE fused / flash attention saves ≈ 0")
def _core_attn_fused(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    granularity, modules = effective_recompute(m)
    backend = attention_backend(m)
    if granularity != "selective" or "core_attn" not in modules or not d.fused_attention:
        return None
    implicit = " (the default when recompute_modules is unset)" \
        if m.recompute_modules is None else ""
    return Violation(
        f"core_attn recompute{implicit} with attention_backend={backend!r} on Transformer "
        "Engine: fused / flash attention keeps no score matrix, so this saves ≈ 0 "
        "(Moonlight 16B: −0.01 % memory, +3.85 % step time)",
        f"drop core_attn from {MODULES}; recompute what the architecture stores instead: "
        f"[{', '.join(d.first_selective_modules())}] (or [] for none); core_attn only with "
        'attention_backend="unfused"')


@rule("recompute.shared-experts-vs-overlap", "error", ref="E12", source="megatron-core",
      fields=(MODULES, "model.moe_shared_expert_overlap",
              "model.moe_shared_expert_intermediate_size"), skill=RECOMPUTE,
      mcore_enforced=True,
      summary="shared_experts recompute is incompatible with moe_shared_expert_overlap")
def _shared_experts_vs_overlap(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not _selective_with(m, "shared_experts") or m.moe_shared_expert_intermediate_size \
            is None or not m.moe_shared_expert_overlap:
        return None
    return Violation("recompute_modules contains shared_experts while "
                     "moe_shared_expert_overlap=True",
                     f"set model.moe_shared_expert_overlap=False, or drop shared_experts from "
                     f"{MODULES}")


@rule("recompute.fp8-delayed-modules", "error", ref="E13", source="megatron-core",
      fields=(MODULES, "model.fp8", "model.fp8_recipe", "mixed_precision"), skill=RECOMPUTE,
      mcore_enforced=True,
      summary="FP8 delayed scaling forbids moe_act / layernorm recompute")
def _fp8_delayed_modules(c: TrainingConfig, d: Derived) -> Violation | None:
    m, p = c.model, d.precision
    if m.recompute_granularity != "selective" or not p.fp8 or p.fp8_recipe != "delayed":
        return None
    hit = [x for x in ("moe_act", "layernorm") if x in recompute_modules(m)]
    if not hit:
        return None
    return Violation(f"recompute_modules contains {' and '.join(hit)} with FP8 "
                     f"fp8={p.fp8!r}, fp8_recipe='delayed'",
                     f"drop {', '.join(hit)} from {MODULES}, or switch to an FP8 recipe with "
                     'per-tensor/block scaling (e.g. fp8_recipe="tensorwise"; needs Transformer '
                     "Engine >= 2.6)")


@rule("recompute.moe-layer-recompute-vs-full", "error", ref="E14", source="megatron-core",
      fields=("model.moe_layer_recompute", GRAN), skill=RECOMPUTE, mcore_enforced=True,
      summary="deprecated moe_layer_recompute cannot be combined with full recompute")
def _moe_layer_recompute_vs_full(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.moe_layer_recompute or m.recompute_granularity != "full":
        return None
    return Violation('moe_layer_recompute=True with recompute_granularity="full"',
                     "set model.moe_layer_recompute=False (full recompute already covers the "
                     "MoE layer)")


@rule("recompute.moe-layer-recompute-deprecated", "warning", ref="E14", source="megatron-core",
      fields=("model.moe_layer_recompute", GRAN, MODULES), skill=RECOMPUTE,
      summary="moe_layer_recompute is deprecated and rewritten to selective + moe")
def _moe_layer_recompute_deprecated(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.moe_layer_recompute or m.recompute_granularity == "full":
        return None
    granularity, modules = effective_recompute(m)
    return Violation(f"moe_layer_recompute=True is deprecated; it is silently turned into "
                     f'recompute_granularity="{granularity}" with recompute_modules {modules}',
                     f'set model.moe_layer_recompute=False, {GRAN}="selective" and {MODULES} '
                     f"{modules}")


@rule("recompute.full-needs-full-iteration-graph", "error", ref="E15", source="megatron-core",
      fields=(GRAN, IMPL, GRAPH_MODULES, "model.cuda_graph_scope"), skill=RECOMPUTE,
      mcore_enforced=True,
      summary="full recompute with CUDA graphs needs cuda_graph_impl=full_iteration")
def _full_needs_full_iteration_graph(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.recompute_granularity != "full" or graph_impl(m) not in ("local",
                                                                  "transformer_engine") \
            or full_iteration_graph(m):
        return None
    return Violation(f'recompute_granularity="full" with {_describe_graphs(m)}',
                     f'use {GRAN}="selective" with {MODULES} to keep these graphs, or set '
                     f'{IMPL}="full_iteration" (with {GRAPH_MODULES}=[]) or "none"')


@rule("recompute.moe-vs-router-graph", "error", ref="E16", source="megatron-core",
      fields=(MODULES, IMPL, GRAPH_MODULES), skill=RECOMPUTE, mcore_enforced=True,
      summary="TE graphs: moe recompute cannot be combined with the moe_router graph module")
def _moe_vs_router_graph(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    granularity, modules = effective_recompute(m)
    if graph_impl(m) != "transformer_engine" or granularity != "selective" or \
            "moe" not in modules or "moe_router" not in graph_modules(m):
        return None
    return Violation('recompute_modules contains moe with cuda_graph_impl="transformer_engine" '
                     "graphing moe_router (the recompute would span the graphed router)",
                     f"drop moe from {MODULES} (e.g. use moe_act), or drop moe_router from "
                     f"{GRAPH_MODULES}")


def _graphed_dropout(m: ModelSection) -> list[str]:
    """The graphed recompute labels Megatron-Core rejects, with the random source each draws
    from (a graphed recompute region must replay the same random numbers)."""
    granularity, modules = effective_recompute(m)
    if graph_impl(m) == "none" or granularity != "selective":
        return []
    gmods = graph_modules(m)
    whole = full_iteration_graph(m) or not gmods

    def graphed(label: str, module: str) -> bool:
        return label in modules and (whole or module in gmods)

    out = []
    if m.attention_dropout != 0 and graphed("core_attn", "attn"):
        out.append(f"core_attn with attention_dropout={m.attention_dropout}")
    for label in ("mlp", "moe"):
        if m.hidden_dropout != 0 and graphed(label, label):
            out.append(f"{label} with hidden_dropout={m.hidden_dropout}")
    if m.carried().get("moe_input_jitter_eps") is not None and graphed("moe", "moe"):
        out.append(f"moe with moe_input_jitter_eps={m.carried()['moe_input_jitter_eps']}")
    return out


@rule("recompute.graphed-dropout", "error", ref="E17", source="megatron-core",
      fields=(MODULES, IMPL, GRAPH_MODULES, "model.attention_dropout", "model.hidden_dropout"),
      skill=RECOMPUTE, mcore_enforced=True,
      summary="recompute inside a CUDA graph cannot use dropout / input jitter")
def _graphed_dropout_rule(c: TrainingConfig, d: Derived) -> Violation | None:
    hits = _graphed_dropout(c.model)
    if not hits:
        return None
    return Violation(f"graphed recompute of {'; '.join(hits)} under {_describe_graphs(c.model)}",
                     "set the dropout to 0.0 (model.attention_dropout / model.hidden_dropout; "
                     "moe_input_jitter_eps to null), drop those labels from "
                     f"{MODULES}, or leave their module out of {GRAPH_MODULES}")
