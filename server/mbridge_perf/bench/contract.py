"""The measurement contract: the frozen conditions under which a benchmark number means anything.

Why: a step time is only evidence together with what produced it, and two runs compare only when
everything except the one variable under test is held fixed (moe-optimization-workflow skill,
Phase 0; log-formats.md §11). ``contract_from_config`` records those conditions from a
TrainingConfig, ``diff`` names every field that differs between two contracts, and
``variables`` groups those fields into the variables an A/B may change (one at a time).
Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from mbridge_perf.bench.envpolicy import refusal
from mbridge_perf.config.derived import Derived, derive
from mbridge_perf.config.derived import Precision as DerivedPrecision
from mbridge_perf.config.model import ModelSection, TrainingConfig

Label = Literal["training-equivalent", "benchmark-only"]
TRAINING_EQUIVALENT: Label = "training-equivalent"
BENCHMARK_ONLY: Label = "benchmark-only"

# Perf recipes run 50 iterations and time 41–50 (log-formats.md §11 rules 1–2); a shorter run is
# a screening run and must say so.
DEFAULT_WINDOW = (41, 50)
MIN_FINAL_STEPS = 50
DEFAULT_LAUNCHER = "srun + torchrun scripts/training/run_recipe.py"

# The environment the contract records is exactly what the job-environment allowlist
# (bench/envpolicy.py) passes: the performance settings a config may set. One source of truth,
# so a knob the allowlist accepts is never missing from the record, and a secret such as
# HF_TOKEN (or anything else a profile sets outside the allowlist) never lands in one.

VERSION_KEYS = ("megatron_bridge", "megatron_core", "transformer_engine", "torch", "container",
                "cuda", "nccl")


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Versions(_Part):
    """Software the numbers depend on; None = not recorded (never assumed equal to a value)."""

    megatron_bridge: str | None = Field(None, description="Bridge commit or version")
    megatron_core: str | None = Field(None, description="Megatron-Core commit or version")
    transformer_engine: str | None = None
    torch: str | None = None
    container: str | None = Field(None, description="image, e.g. nvcr.io/nvidia/nemo:26.04")
    cuda: str | None = None
    nccl: str | None = None


class Job(_Part):
    """How the job was started, from the cluster profile: two runs whose setup lines or
    launcher arguments differ are not an A/B of anything else."""

    executor: str | None = Field(None, description="local or slurm")
    setup_sha256: str | None = Field(None, description="hash of the profile's setup lines "
                                                       "(None: no setup lines)")
    env_sha256: str | None = Field(None, description="hash of the profile's env variables the "
                                                     "environment does not record by value "
                                                     "(cluster wiring, credentials; None: none)")
    launcher_args: list[str] = Field(default_factory=list)
    srun_args: list[str] = Field(default_factory=list)


class Hardware(_Part):
    num_gpus: int | None = Field(None, description="world size")
    gpu: str | None = Field(None, description="GPU SKU, e.g. H100")
    gpus_per_node: int | None = None
    nodes: int | None = Field(None, description="ceil(num_gpus / gpus_per_node), derived")
    topology: str | None = Field(None, description="interconnect, e.g. 'NVL8 + 8x400G IB'")


class Workload(_Part):
    model: str | None = Field(None, description="model / recipe name")
    architecture: dict[str, Any] = Field(
        default_factory=dict, description="shape fields that set the FLOPs per token")
    task: str | None = Field(None, description="pretrain | sft | peft | …")
    data: str | None = Field(None, description="data path or 'mock'")
    seq_length: int | None = None
    micro_batch_size: int = 1
    global_batch_size: int | None = None
    optimizer: str = "adam"
    use_distributed_optimizer: bool = False
    optimizer_cpu_offload: bool = False
    use_precision_aware_optimizer: bool = False


class Layout(_Part):
    """Attention mesh TP·CP·DP·PP and MoE mesh ETP·EP·EDP·PP (Parallel Folding)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    cp: int = 1
    ep: int = 1
    etp: int = 1
    dp: int | None = Field(None, description="derived from the world size")
    edp: int | None = Field(None, description="derived; MoE only")
    sequence_parallel: bool = False
    pipeline_layout: str | None = None


class Routing(_Part):
    """MoE routing semantics; forcing the load balance makes a run benchmark-only (§11 rule 8)."""

    force_load_balancing: bool = False
    load_balancing_type: str = "aux_loss"
    topk: int = 2
    score_function: str = "softmax"
    capacity_factor: float | None = None
    pad_expert_input_to_capacity: bool = False
    router_dtype: str | None = None
    enable_expert_bias: bool = False


class Precision(_Part):
    recipe: str | None = Field(None, description="mixed_precision recipe name; 'custom' for a "
                                                 "section; None = model flags only")
    compute: Literal["bf16", "fp16", "fp32"] = "fp32"
    fp8: str | None = None
    fp8_recipe: str | None = Field(None, description="None unless fp8 is on")
    fp8_param: bool = False
    fp4: str | None = None
    fp4_recipe: str | None = Field(None, description="None unless fp4 is on")
    first_last_layers_bf16: bool = False
    grad_reduce_in_fp32: bool = False


class Recompute(_Part):
    granularity: str | None = None
    method: str | None = None
    num_layers: int | None = None
    modules: list[str] | None = None


class Dispatcher(_Part):
    type: str | None = Field(None, description="None for a dense model")
    backend: str | None = Field(None, description="flex backend (deepep, hybridep); None "
                                                  "unless type is flex")


class Overlap(_Part):
    tp_comm_overlap: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    moe_shared_expert_overlap: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    overlap_p2p_comm: bool | None = None


class CudaGraphs(_Part):
    impl: str = "none"
    modules: list[str] | None = None
    warmup_steps: int = 3


class Offload(_Part):
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    fine_grained_activation_offloading: bool = False
    offload_modules: list[str] | None = None


class Kernels(_Part):
    """Implementation switches that change speed without changing the model."""

    transformer_impl: str = "transformer_engine"
    attention_backend: str = "auto"
    moe_grouped_gemm: bool = False
    moe_permute_fusion: bool = False
    apply_rope_fusion: bool = False
    cross_entropy_loss_fusion: bool = True
    gradient_accumulation_fusion: bool = False


class Window(_Part):
    """Steady-state window, 1-based iterations as printed; warm-up = iterations before it."""

    start: int = Field(DEFAULT_WINDOW[0], ge=1)
    end: int = Field(DEFAULT_WINDOW[1], ge=1)
    steps: int | None = Field(None, ge=1, description="train iterations requested")

    @model_validator(mode="after")
    def _ordered(self) -> Window:
        if self.end < self.start:
            raise ValueError(f"window {self.start}-{self.end}: the end is before the start")
        if self.steps is not None and self.steps < self.end:
            raise ValueError(f"window ends at iteration {self.end} but the run has only "
                             f"{self.steps} steps; raise train.train_iters to >= {self.end}")
        return self

    @property
    def warmup(self) -> int:
        return self.start - 1

    @property
    def screening(self) -> bool:
        """Shorter than the 50 steps a final measurement needs (§11 rule 1)."""
        return self.end < MIN_FINAL_STEPS


class MeasurementContract(_Part):
    """Everything a benchmark number depends on. Two runs are an A/B only when their contracts
    differ in exactly one variable (``variables(diff(a, b))``)."""

    versions: Versions = Field(default_factory=Versions)
    hardware: Hardware = Field(default_factory=Hardware)
    launcher: str = DEFAULT_LAUNCHER
    job: Job = Field(default_factory=Job)
    environment: dict[str, str] = Field(default_factory=dict,
                                        description="performance-relevant env vars only")
    workload: Workload = Field(default_factory=Workload)
    layout: Layout = Field(default_factory=Layout)
    routing: Routing | None = Field(None, description="None for a dense model")
    precision: Precision = Field(default_factory=Precision)
    recompute: Recompute = Field(default_factory=Recompute)
    dispatcher: Dispatcher = Field(default_factory=Dispatcher)
    overlap: Overlap = Field(default_factory=Overlap)
    cuda_graphs: CudaGraphs = Field(default_factory=CudaGraphs)
    offload: Offload = Field(default_factory=Offload)
    kernels: Kernels = Field(default_factory=Kernels)
    window: Window = Field(default_factory=Window)
    label: Label = TRAINING_EQUIVALENT
    label_reasons: list[str] = Field(default_factory=list,
                                     description="why the run is benchmark-only")

    @model_validator(mode="after")
    def _label_matches_routing(self) -> MeasurementContract:
        if self.label == TRAINING_EQUIVALENT and routing_changed(self.routing):
            raise ValueError(
                "moe_router_force_load_balancing changes routing semantics, so the run is "
                "benchmark-only (log-formats.md §11 rule 8); use label='benchmark-only'")
        return self


def routing_changed(routing: Routing | None) -> bool:
    """True when the routing is not what training would use (forced load balancing)."""
    return routing is not None and routing.force_load_balancing


def performance_env(env: Mapping[str, str]) -> dict[str, str]:
    """The subset of ``env`` that changes performance (the names the job-environment allowlist
    passes), sorted by name."""
    return {k: str(env[k]) for k in sorted(env) if refusal(str(k)) is None}


_ARCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                "num_query_groups", "kv_channels", "vocab_size", "gated_linear_unit",
                "normalization", "position_embedding_type", "share_embeddings_and_output_weights",
                "mtp_num_layers", "multi_latent_attention")
_MOE_ARCH_FIELDS = ("num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size",
                    "moe_shared_expert_intermediate_size", "moe_layer_freq")
_MLA_ARCH_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim",
                    "v_head_dim")


def _architecture(cfg: TrainingConfig, moe: bool) -> dict[str, Any]:
    m = cfg.model
    names = _ARCH_FIELDS + (_MOE_ARCH_FIELDS if moe else ()) + (
        _MLA_ARCH_FIELDS if m.multi_latent_attention else ())
    return {n: getattr(m, n) for n in names if getattr(m, n) is not None}


def _versions(versions: Mapping[str, str] | None) -> Versions:
    if not versions:
        return Versions()
    unknown = sorted(set(versions) - set(VERSION_KEYS))
    if unknown:
        raise ValueError(f"unknown version key(s) {', '.join(unknown)}; use "
                         f"{', '.join(VERSION_KEYS)}")
    return Versions(**{k: str(v) for k, v in versions.items()})


def _hardware(cfg: TrainingConfig, gpu: str | None, topology: str | None) -> Hardware:
    """The world size and GPU; nodes are derived so a layout change shows as one variable."""
    num_gpus = cfg.cluster.num_gpus
    gpn = cfg.cluster.gpus_per_node
    nodes = math.ceil(num_gpus / gpn) if num_gpus and gpn else None
    return Hardware(num_gpus=num_gpus, gpu=gpu or cfg.cluster.gpu, gpus_per_node=gpn,
                    nodes=nodes, topology=topology)


def _routing(m: ModelSection, moe: bool) -> Routing | None:
    """MoE routing semantics (None for a dense model): forced balance decides the label."""
    if not moe:
        return None
    return Routing(
        force_load_balancing=m.moe_router_force_load_balancing,
        load_balancing_type=str(m.moe_router_load_balancing_type),
        topk=m.moe_router_topk, score_function=m.moe_router_score_function,
        capacity_factor=m.moe_expert_capacity_factor,
        pad_expert_input_to_capacity=m.moe_pad_expert_input_to_capacity,
        router_dtype=m.moe_router_dtype, enable_expert_bias=m.moe_router_enable_expert_bias,
    )


def _label(routing: Routing | None, label: Label | None) -> tuple[Label, list[str]]:
    """The label (benchmark-only when routing is forced, unless the caller chose) and why."""
    reasons = []
    if routing_changed(routing):
        reasons.append("model.moe_router_force_load_balancing=true: routing is forced, not "
                       "learned (benchmark-only, never convergence evidence)")
    if label is None:
        label = BENCHMARK_ONLY if reasons else TRAINING_EQUIVALENT
    return label, reasons


def _workload(cfg: TrainingConfig, moe: bool, model: str | None, task: str | None,
              data: str | None) -> Workload:
    """What is trained: the shape that sets FLOPs per token, batch sizes and the optimizer."""
    m = cfg.model
    return Workload(
        model=model, architecture=_architecture(cfg, moe), task=task, data=data,
        seq_length=m.seq_length, micro_batch_size=cfg.train.micro_batch_size,
        global_batch_size=cfg.train.global_batch_size, optimizer=cfg.optimizer.optimizer,
        use_distributed_optimizer=(cfg.optimizer.use_distributed_optimizer
                                   or cfg.ddp.use_distributed_optimizer),
        optimizer_cpu_offload=cfg.optimizer.optimizer_cpu_offload,
        use_precision_aware_optimizer=cfg.optimizer.use_precision_aware_optimizer)


def _layout(m: ModelSection, d: Derived) -> Layout:
    """The parallel layout as derived (DP and EDP follow from the world size)."""
    return Layout(
        tp=d.tp, pp=d.pp, vpp=m.virtual_pipeline_model_parallel_size, cp=d.cp, ep=d.ep,
        etp=d.etp, dp=d.dp, edp=d.edp, sequence_parallel=m.sequence_parallel,
        pipeline_layout=(None if m.pipeline_model_parallel_layout is None
                         else str(m.pipeline_model_parallel_layout)))


def _precision(cfg: TrainingConfig, p: DerivedPrecision) -> Precision:
    """The effective precision after the mixed-precision recipe; recipes of a format that is
    off are not recorded, so they cannot show up as a difference."""
    mp = cfg.mixed_precision
    recipe = mp if isinstance(mp, str) else ("custom" if mp is not None else None)
    compute: Literal["bf16", "fp16", "fp32"] = "bf16" if p.bf16 else "fp16" if p.fp16 else "fp32"
    return Precision(
        recipe=recipe, compute=compute, fp8=p.fp8,
        fp8_recipe=p.fp8_recipe if p.fp8 else None, fp8_param=bool(p.fp8 and p.fp8_param),
        fp4=p.fp4, fp4_recipe=p.fp4_recipe if p.fp4 else None,
        first_last_layers_bf16=p.first_last_layers_bf16,
        grad_reduce_in_fp32=p.grad_reduce_in_fp32)


def _recompute(d: Derived) -> Recompute:
    """Recompute in effect (the resolved view: default modules and the deprecated
    moe_layer_recompute folded in), each setting kept only under the granularity that reads
    it, so an unset recompute_modules and an explicit ["core_attn"] freeze alike."""
    r = d.recompute
    full = r.granularity == "full"
    return Recompute(
        granularity=r.granularity,
        method=r.method if full else None,
        num_layers=r.num_layers if full else None,
        modules=list(r.selective) if r.granularity == "selective" else None)


def _dispatcher(m: ModelSection, moe: bool) -> Dispatcher:
    """The token dispatcher (None for a dense model) and its backend when it is flex."""
    return Dispatcher(
        type=m.moe_token_dispatcher_type if moe else None,
        backend=(m.moe_flex_dispatcher_backend
                 if moe and m.moe_token_dispatcher_type == "flex" else None))


def _overlap(cfg: TrainingConfig) -> Overlap:
    """Communication overlap; comm_overlap's grad/param switches win over the DDP section's."""
    ov = cfg.overlap
    return Overlap(
        tp_comm_overlap=ov.tp_comm_overlap,
        overlap_moe_expert_parallel_comm=ov.overlap_moe_expert_parallel_comm,
        delay_wgrad_compute=ov.delay_wgrad_compute,
        moe_shared_expert_overlap=cfg.model.moe_shared_expert_overlap,
        overlap_grad_reduce=(ov.overlap_grad_reduce if ov.overlap_grad_reduce is not None
                             else cfg.ddp.overlap_grad_reduce),
        overlap_param_gather=(ov.overlap_param_gather if ov.overlap_param_gather is not None
                              else cfg.ddp.overlap_param_gather),
        overlap_p2p_comm=ov.overlap_p2p_comm)


def _cuda_graphs(m: ModelSection, d: Derived) -> CudaGraphs:
    """CUDA graphs in effect (the resolved view: deprecated flags migrated, "attn,mlp" and the
    legacy scope read as Megatron-Core reads them, "full" = whole layers); modules only when
    graphs are on and name some."""
    g = d.graphs
    return CudaGraphs(impl=g.impl, modules=list(g.modules) if g.on and g.modules else None,
                      warmup_steps=m.cuda_graph_warmup_steps)


def _offload(m: ModelSection) -> Offload:
    """CPU offloading; the layer count only when offloading is on."""
    return Offload(
        cpu_offloading=m.cpu_offloading,
        cpu_offloading_num_layers=m.cpu_offloading_num_layers if m.cpu_offloading else 0,
        fine_grained_activation_offloading=m.fine_grained_activation_offloading,
        offload_modules=list(m.offload_modules) if m.offload_modules else None)


def _kernels(m: ModelSection, moe: bool) -> Kernels:
    """Kernel switches; the MoE ones count only for a MoE model."""
    return Kernels(
        transformer_impl=m.transformer_impl, attention_backend=str(m.attention_backend),
        moe_grouped_gemm=m.moe_grouped_gemm and moe,
        moe_permute_fusion=m.moe_permute_fusion and moe,
        apply_rope_fusion=m.apply_rope_fusion,
        cross_entropy_loss_fusion=m.cross_entropy_loss_fusion,
        gradient_accumulation_fusion=m.gradient_accumulation_fusion)


def contract_from_config(
    cfg: TrainingConfig,
    *,
    versions: Mapping[str, str] | None = None,
    launcher: str = DEFAULT_LAUNCHER,
    model: str | None = None,
    task: str | None = None,
    data: str | None = None,
    topology: str | None = None,
    env: Mapping[str, str] | None = None,
    window: tuple[int, int] = DEFAULT_WINDOW,
    label: Label | None = None,
    gpu: str | None = None,
    job: Job | None = None,
) -> MeasurementContract:
    """Freeze the conditions of a run of ``cfg``. ``env`` (e.g. the launcher's defaults) is laid
    under ``cfg.env`` (the config wins); ``label=None`` picks benchmark-only when routing is
    forced, training-equivalent otherwise. Raises ValueError for a contradiction (a
    training-equivalent label on forced routing, a window past train_iters, unknown versions)."""
    d = derive(cfg)
    m = cfg.model
    moe = d.is_moe
    routing = _routing(m, moe)
    label, reasons = _label(routing, label)
    return MeasurementContract(
        versions=_versions(versions),
        hardware=_hardware(cfg, gpu, topology),
        launcher=launcher,
        job=job or Job(),
        environment=performance_env({**(env or {}), **cfg.env}),
        workload=_workload(cfg, moe, model, task, data),
        layout=_layout(m, d),
        routing=routing,
        precision=_precision(cfg, d.precision),
        recompute=_recompute(d),
        dispatcher=_dispatcher(m, moe),
        overlap=_overlap(cfg),
        cuda_graphs=_cuda_graphs(m, d),
        offload=_offload(m),
        kernels=_kernels(m, moe),
        window=Window(start=window[0], end=window[1], steps=cfg.train.train_iters),
        label=label,
        label_reasons=reasons,
    )


# What a flattened contract field can hold (a leaf of the contract).
ContractValue = str | int | float | bool | list[str | int | float | bool | None] | None


class ContractDifference(BaseModel):
    """One field whose value differs between two contracts."""

    field: str = Field(description="dotted name, e.g. layout.tp or environment.NCCL_GRAPH_REGISTER")
    a: ContractValue = Field(None, description="value in the first contract (None: unset)")
    b: ContractValue = Field(None, description="value in the second contract (None: unset)")


# Fields that explain, rather than set, a condition: they change only when something else did.
DERIVED_FIELDS = frozenset({"layout.dp", "layout.edp", "hardware.nodes", "label"})
_NOT_COMPARED = frozenset({"label_reasons"})
# Sections whose fields move together and count as one variable of an A/B (a precision recipe
# sets several fields; a flex backend needs the flex type; a graph scope needs an impl).
GROUPED_SECTIONS = ("precision", "dispatcher", "cuda_graphs", "recompute", "offload", "routing",
                    "window", "workload.architecture")


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):  # an empty mapping has no leaves (nothing set, nothing differs)
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def flatten(contract: MeasurementContract) -> dict[str, Any]:
    """Every leaf of the contract under its dotted name (lists are leaves)."""
    out: dict[str, Any] = {}
    data = contract.model_dump(mode="json", exclude=set(_NOT_COMPARED))
    _flatten(data, "", out)
    return out


def diff(a: MeasurementContract, b: MeasurementContract) -> list[ContractDifference]:
    """Every differing field, in contract order; a field present on one side only (a routing
    section of a MoE run against a dense one, an env var set in one run) compares to None."""
    fa, fb = flatten(a), flatten(b)
    names = list(fa) + [k for k in fb if k not in fa]
    out = []
    for name in names:
        va, vb = fa.get(name), fb.get(name)
        if va != vb:
            out.append(ContractDifference(field=name, a=va, b=vb))
    return out


def variable_of(field: str) -> str | None:
    """The A/B variable a differing field belongs to; None for derived fields."""
    if field in DERIVED_FIELDS:
        return None
    for section in GROUPED_SECTIONS:
        if field == section or field.startswith(section + "."):
            return section
    return field


def variables(differences: list[ContractDifference]) -> list[str]:
    """The independent variables behind ``differences`` (grouped, derived fields dropped), in
    order of first appearance."""
    out: list[str] = []
    for d in differences:
        v = variable_of(d.field)
        if v is not None and v not in out:
            out.append(v)
    return out
