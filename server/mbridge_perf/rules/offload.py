"""CPU offloading: layer offload, fine-grained activation offload and optimizer offload
(constraint catalog section F, project checks X1–X2). The three mechanisms are independent."""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.config.semantics import (
    effective_recompute,
    full_iteration_graph,
    graph_impl,
    graph_modules,
)
from mbridge_perf.rules.catalog import MEM, Violation, rule

CPU = "model.cpu_offloading"
CPU_LAYERS = "model.cpu_offloading_num_layers"
CPU_ACT = "model.cpu_offloading_activations"
CPU_W = "model.cpu_offloading_weights"
FG = "model.fine_grained_activation_offloading"
OFFLOAD_MODULES = "model.offload_modules"
IMPL = "model.cuda_graph_impl"
OPT_OFFLOAD = "optimizer.optimizer_cpu_offload"

# Fine-grained offload labels at the pin (0.16.1 lacks fused_group_mlp; the pin wins).
OFFLOAD_LABELS = ("core_attn", "attn_proj", "expert_fc1", "fused_group_mlp", "moe_act",
                  "attn_norm", "mlp_norm", "qkv_linear")
_MOE_INTERNAL = ("expert_fc1", "moe_act", "fused_group_mlp")


def _offload_modules(m: ModelSection) -> list[str]:
    return list(m.offload_modules or [])


def _fine_grained(m: ModelSection) -> list[str] | None:
    """The fine-grained offload modules when that mechanism is on, else None."""
    return _offload_modules(m) if m.fine_grained_activation_offloading else None


@rule("offload.cpu-num-layers-range", "error", ref="F1", source="megatron-core",
      fields=(CPU, CPU_LAYERS, "model.num_layers"), skill=MEM, mcore_enforced=True,
      summary="cpu_offloading_num_layers must lie in [0, num_layers)")
def _cpu_num_layers_range(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.cpu_offloading or m.num_layers is None or m.cpu_offloading_num_layers < \
            m.num_layers:
        return None
    return Violation(f"cpu_offloading_num_layers={m.cpu_offloading_num_layers} with "
                     f"num_layers={m.num_layers}: at most {m.num_layers - 1} layers can be "
                     "offloaded", f"set {CPU_LAYERS} between 1 and {m.num_layers - 1}")


@rule("offload.cpu-needs-pp1", "error", ref="F2", source="megatron-core",
      fields=(CPU, "model.pipeline_model_parallel_size"), skill=MEM, mcore_enforced=True,
      summary="layer CPU offloading needs pipeline_model_parallel_size = 1")
def _cpu_needs_pp1(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.model.cpu_offloading or d.pp == 1:
        return None
    return Violation(f"cpu_offloading=True with pipeline_model_parallel_size={d.pp}",
                     f"set {CPU}=False (use recompute or fine-grained activation offloading "
                     "with PP), or train with model.pipeline_model_parallel_size=1")


@rule("offload.cpu-excludes-recompute", "error", ref="F3", source="megatron-core",
      fields=(CPU, "model.recompute_granularity"), skill=MEM, mcore_enforced=True,
      summary="layer CPU offloading forbids activation recompute")
def _cpu_excludes_recompute(c: TrainingConfig, d: Derived) -> Violation | None:
    g = c.model.recompute_granularity
    if not c.model.cpu_offloading or g is None:
        return None
    return Violation(f"cpu_offloading=True with recompute_granularity={g!r}",
                     f"pick one: set model.recompute_granularity to null, or set {CPU}=False")


@rule("offload.cpu-excludes-cuda-graphs", "error", ref="F4", source="megatron-core",
      fields=(CPU, IMPL, "model.cuda_graph_modules"), skill=MEM, mcore_enforced=True,
      summary="layer CPU offloading vs CUDA graphs (full_iteration exempt at the pin)")
def _cpu_excludes_cuda_graphs(c: TrainingConfig, d: Derived) -> Violation | None:
    # 0.16.1 also rejects the legacy local + scope full_iteration spelling; the pin migrates it
    # to cuda_graph_impl="full_iteration", which is allowed.
    m = c.model
    impl = graph_impl(m)
    if not m.cpu_offloading or impl == "none" or full_iteration_graph(m):
        return None
    return Violation(f'cpu_offloading=True with cuda_graph_impl="{impl}"',
                     f'set {IMPL}="full_iteration" (the only graph mode allowed with layer '
                     f'offloading) or "none", or set {CPU}=False')


@rule("offload.fine-grained-excludes-cpu", "error", ref="F6", source="megatron-core",
      fields=(FG, CPU), skill=MEM, mcore_enforced=True,
      summary="fine-grained activation offloading excludes layer cpu_offloading")
def _fine_grained_excludes_cpu(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not (m.fine_grained_activation_offloading and m.cpu_offloading):
        return None
    return Violation("fine_grained_activation_offloading=True with cpu_offloading=True",
                     f"keep one offload mechanism: set {CPU}=False (fine-grained also works "
                     f"with PP and recompute) or {FG}=False")


def _fine_grained_module_problem(mods: list[str]) -> tuple[str, str] | None:
    """(problem, fix) for an offload_modules list Megatron-Core rejects, or None."""
    if not mods:
        return ("fine_grained_activation_offloading=True with no offload_modules",
                f'set {OFFLOAD_MODULES}, e.g. ["core_attn", "attn_proj"] or '
                '["expert_fc1", "moe_act"]')
    # 0.16.1 also rejects fused_group_mlp, which the pin accepts.
    bad = [x for x in mods if x not in OFFLOAD_LABELS]
    if bad:
        return (f"offload_modules has unknown labels: {', '.join(map(repr, bad))}",
                f"use only {', '.join(OFFLOAD_LABELS)} in {OFFLOAD_MODULES} (these differ "
                "from the recompute_modules labels)")
    if "attn_proj" in mods and "core_attn" not in mods:
        return (f"offload_modules {mods} has attn_proj without core_attn (attn_proj's input "
                "is core_attn's output)", f"add core_attn to {OFFLOAD_MODULES}, or drop "
                "attn_proj")
    return None


@rule("offload.fine-grained-modules", "error", ref="F7", source="megatron-core",
      fields=(FG, OFFLOAD_MODULES), skill=MEM, mcore_enforced=True,
      summary="offload_modules must be a non-empty list of valid labels; attn_proj needs "
              "core_attn")
def _fine_grained_modules(c: TrainingConfig, d: Derived) -> Violation | None:
    mods = _fine_grained(c.model)
    problem = None if mods is None else _fine_grained_module_problem(mods)
    return None if problem is None else Violation(*problem)


@rule("offload.fine-grained-vs-moe-recompute", "error", ref="F7", source="megatron-core",
      fields=(OFFLOAD_MODULES, "model.recompute_modules"), skill=MEM,
      summary="MoE-internal offload modules conflict with recomputing the whole moe module")
def _fine_grained_vs_moe_recompute(c: TrainingConfig, d: Derived) -> Violation | None:
    granularity, modules = effective_recompute(c.model)
    hit = [x for x in _fine_grained(c.model) or [] if x in _MOE_INTERNAL]
    if not hit or granularity != "selective" or "moe" not in modules:
        return None
    return Violation(f"offload_modules {hit} inside the moe module while recompute_modules "
                     "contains moe", f"drop moe from model.recompute_modules (e.g. recompute "
                     f"moe_act instead), or drop {', '.join(hit)} from {OFFLOAD_MODULES}")


@rule("offload.fused-group-mlp", "error", ref="F7", source="megatron-core",
      fields=(OFFLOAD_MODULES, "model.use_transformer_engine_op_fuser"), skill=MEM,
      summary="fused_group_mlp offload needs the TE op fuser and excludes expert_fc1 / moe_act")
def _fused_group_mlp(c: TrainingConfig, d: Derived) -> Violation | None:
    mods = _fine_grained(c.model) or []
    if "fused_group_mlp" not in mods:
        return None
    clash = [x for x in ("expert_fc1", "moe_act") if x in mods]
    if clash:
        return Violation(f"offload_modules contains fused_group_mlp together with "
                         f"{' and '.join(clash)}", f"drop {', '.join(clash)} from "
                         f"{OFFLOAD_MODULES} (fused_group_mlp covers the whole expert MLP)")
    if c.model.carried().get("use_transformer_engine_op_fuser"):
        return None
    return Violation("offload_modules contains fused_group_mlp without "
                     "use_transformer_engine_op_fuser=True",
                     "set model.use_transformer_engine_op_fuser=True, or offload "
                     '["expert_fc1", "moe_act"] instead')


def _fine_grained_graph_problems(m: ModelSection) -> list[str]:
    mods = _fine_grained(m)
    impl = graph_impl(m)
    if mods is None or impl == "none":
        return []
    out = []
    moe_only = bool(mods) and set(mods) <= set(_MOE_INTERNAL)
    if impl not in ("transformer_engine", "full_iteration") and not (impl == "local"
                                                                     and moe_only):
        out.append(f'cuda_graph_impl="{impl}"' + (" (local only for expert_fc1 / moe_act / "
                                                  "fused_group_mlp)" if impl == "local" else ""))
    if "moe" in graph_modules(m):
        out.append("the moe graph module")
    if m.cuda_graph_warmup_steps <= 0:
        out.append(f"cuda_graph_warmup_steps={m.cuda_graph_warmup_steps}")
    return out


@rule("offload.fine-grained-graphs", "error", ref="F8", source="megatron-core",
      fields=(FG, IMPL, "model.cuda_graph_modules", "model.cuda_graph_warmup_steps"), skill=MEM,
      summary="fine-grained offloading with graphs: TE or full_iteration impl, no moe module, "
              "warmup > 0")
def _fine_grained_graphs(c: TrainingConfig, d: Derived) -> Violation | None:
    problems = _fine_grained_graph_problems(c.model)
    if not problems:
        return None
    return Violation(f"fine_grained_activation_offloading=True with {'; '.join(problems)}",
                     f'use {IMPL}="transformer_engine" or "full_iteration", leave moe out of '
                     "model.cuda_graph_modules and keep model.cuda_graph_warmup_steps >= 1")


@rule("offload.fine-grained-needs-te", "error", ref="F9", source="megatron-bridge",
      fields=(FG, "model.transformer_impl"), skill=MEM,
      summary="fine-grained activation offloading needs transformer_impl=transformer_engine")
def _fine_grained_needs_te(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.fine_grained_activation_offloading or m.transformer_impl == "transformer_engine":
        return None
    return Violation(f'fine_grained_activation_offloading=True with transformer_impl='
                     f'"{m.transformer_impl}"',
                     'set model.transformer_impl="transformer_engine"')


@rule("offload.fine-grained-cpu-offload-v1", "warning", ref="F9", source="megatron-bridge",
      fields=(FG, "env.NVTE_CPU_OFFLOAD_V1"), skill=MEM,
      summary="fine-grained offloading on Transformer Engine >= 2.10 needs NVTE_CPU_OFFLOAD_V1=1")
def _fine_grained_cpu_offload_v1(c: TrainingConfig, d: Derived) -> Violation | None:
    # Bridge checks this only on TE >= 2.10; the TE version is unknown here (only the installed
    # Transformer Engine settles it), so a warning: every container with Bridge 0.6.2 ships a
    # newer TE, where the launch stops.
    value = c.env.get("NVTE_CPU_OFFLOAD_V1")
    if not c.model.fine_grained_activation_offloading or value == "1":
        return None
    shown = "is not set" if value is None else f"is {value!r}"
    return Violation(f"fine_grained_activation_offloading=True but NVTE_CPU_OFFLOAD_V1 {shown} "
                     "(required on Transformer Engine >= 2.10, else weights are offloaded too)",
                     "export NVTE_CPU_OFFLOAD_V1=1 in the job environment")


@rule("offload.optimizer-needs-adamw", "error", ref="F10", source="megatron-core",
      fields=(OPT_OFFLOAD, "optimizer.decoupled_weight_decay"), skill=MEM,
      summary="optimizer CPU offload needs AdamW mode (decoupled_weight_decay)")
def _optimizer_needs_adamw(c: TrainingConfig, d: Derived) -> Violation | None:
    o = c.optimizer
    if not o.optimizer_cpu_offload or o.decoupled_weight_decay:
        return None
    return Violation("optimizer_cpu_offload=True with decoupled_weight_decay=False",
                     "set optimizer.decoupled_weight_decay=True (AdamW), or "
                     f"{OPT_OFFLOAD}=False")


@rule("offload.optimizer-without-distopt", "info", ref="F11", source="skill",
      fields=(OPT_OFFLOAD, "ddp.use_distributed_optimizer",
              "optimizer.use_distributed_optimizer"), skill=MEM,
      summary="optimizer CPU offload is meant to run with the distributed optimizer")
def _optimizer_without_distopt(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.optimizer.optimizer_cpu_offload or c.optimizer.use_distributed_optimizer or \
            c.ddp.use_distributed_optimizer:
        return None
    return Violation("optimizer_cpu_offload=True without the distributed optimizer: every DP "
                     "rank offloads a full copy of the optimizer state",
                     "set ddp.use_distributed_optimizer=True and "
                     "optimizer.use_distributed_optimizer=True (Megatron-LM's own launcher also "
                     "requires use_precision_aware_optimizer)")


@rule("offload.optimizer-fraction-zero", "info", ref="F12", source="skill",
      fields=(OPT_OFFLOAD, "optimizer.optimizer_offload_fraction"), skill=MEM,
      summary="optimizer_offload_fraction 0.0 offloads nothing")
def _optimizer_fraction_zero(c: TrainingConfig, d: Derived) -> Violation | None:
    o = c.optimizer
    if not o.optimizer_cpu_offload or o.optimizer_offload_fraction > 0:
        return None
    return Violation("optimizer_cpu_offload=True with optimizer_offload_fraction=0.0: no "
                     "optimizer state moves to the CPU",
                     "set optimizer.optimizer_offload_fraction to the share to offload (e.g. "
                     "0.5; 1.0 moves all of it)")


@rule("offload.paged-stash-requirements", "error", ref="F15", source="megatron-core",
      fields=("model.moe_paged_stash", CPU, "model.moe_expert_rank_capacity_factor"),
      skill=MEM, summary="moe_paged_stash excludes cpu_offloading and needs "
                         "moe_expert_rank_capacity_factor")
def _paged_stash(c: TrainingConfig, d: Derived) -> Violation | None:
    extra = c.model.carried()
    if not extra.get("moe_paged_stash"):
        return None
    if c.model.cpu_offloading:
        return Violation("moe_paged_stash=True with cpu_offloading=True",
                         f"set {CPU}=False, or model.moe_paged_stash=False")
    if extra.get("moe_expert_rank_capacity_factor") is None:
        return Violation("moe_paged_stash=True without moe_expert_rank_capacity_factor",
                         "set model.moe_expert_rank_capacity_factor (headroom over a perfectly "
                         "balanced expert load, e.g. 1.5)")
    return None


@rule("offload.cpu-needs-target", "error", ref="X1", source="project",
      fields=(CPU, CPU_ACT, CPU_W), skill=MEM,
      summary="cpu_offloading with neither activations nor weights selected")
def _cpu_needs_target(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.cpu_offloading or m.cpu_offloading_activations or m.cpu_offloading_weights:
        return None
    return Violation("cpu_offloading=True with cpu_offloading_activations=False and "
                     "cpu_offloading_weights=False (fails inside Transformer Engine at model "
                     "build)", f"set {CPU_ACT}=True (and/or {CPU_W}=True), or {CPU}=False")


@rule("offload.activation-layers-zero-means-off", "warning", ref="X2", source="project",
      fields=(CPU, CPU_LAYERS), skill=MEM,
      summary="cpu_offloading with 0 layers offloads nothing yet keeps its restrictions")
def _activation_layers_zero(c: TrainingConfig, d: Derived) -> Violation | None:
    # A warning, not an info note: the user asked for offloading and gets none, while
    # cpu_offloading=True still imposes PP=1, no recompute and no CUDA graphs (F2–F4).
    m = c.model
    if not m.cpu_offloading or m.cpu_offloading_num_layers != 0:
        return None
    return Violation("cpu_offloading=True with cpu_offloading_num_layers=0: no layer is "
                     "offloaded", f"set {CPU_LAYERS} to the number of layers to offload "
                     f"(1 … num_layers−1), or set {CPU}=False, which also lifts the PP=1 / "
                     "no-recompute / no-CUDA-graph restrictions")
