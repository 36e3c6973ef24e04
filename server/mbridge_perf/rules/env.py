"""Allocator and NCCL environment (constraint catalog section H, row G17, project check X3).

``cfg.env`` holds the job's environment variables. ``PYTORCH_CUDA_ALLOC_CONF`` is read as
comma-separated ``key:value`` pairs. The Megatron-Core checks (H1, G17) read only that variable,
as Megatron-Core does; the advisory rules also accept PyTorch's newer ``PYTORCH_ALLOC_CONF``.
Rules run in Bridge's evaluation order: H1 (DDP config), H3–H4 (container checks), then G17
(graph capture) and the advisory X3 rules.
"""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.semantics import attention_backend, carried_section, graph_impl
from mbridge_perf.rules.catalog import MEM, RECOMPUTE, Violation, rule

ALLOC = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_FIELD = f"env.{ALLOC}"
_ALLOC_NAMES = (ALLOC, "PYTORCH_ALLOC_CONF")
_NCCL_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")


def _alloc_conf(c: TrainingConfig, names: tuple[str, ...] = (ALLOC,)) -> dict[str, str]:
    """key → value of the allocator settings ("expandable_segments:True,max_split_size_mb:512")
    from the first of ``names`` that is set."""
    raw = next((c.env[n] for n in names if n in c.env), "")
    pairs = (item.split(":", 1) for item in str(raw).split(",") if ":" in item)
    return {k.strip(): v.strip() for k, v in pairs}


def _expandable(c: TrainingConfig, names: tuple[str, ...] = (ALLOC,)) -> bool:
    return _alloc_conf(c, names).get("expandable_segments") == "True"


def _expandable_advice_applies(c: TrainingConfig) -> bool:
    """Recommending expandable segments makes sense: not already on, not the cudaMallocAsync
    backend (which has no segments), and no NCCL user buffers (H1 would reject it)."""
    conf = _alloc_conf(c, _ALLOC_NAMES)
    return not _expandable(c, _ALLOC_NAMES) and conf.get("backend") != "cudaMallocAsync" \
        and not c.ddp.nccl_ub


@rule("env.expandable-vs-nccl-ub", "error", ref="H1", source="megatron-core",
      fields=(ALLOC_FIELD, "ddp.nccl_ub"), skill=MEM, mcore_enforced=True,
      summary="expandable_segments:True is incompatible with NCCL user buffers (torch < 2.11)")
def _expandable_vs_nccl_ub(c: TrainingConfig, d: Derived) -> Violation | None:
    # An error although the pin skips the check on torch >= 2.11: the torch version is unknown
    # here, 0.16.1 raises unconditionally, and the skills call the pair incompatible.
    # (Megatron-Core matches the exact token; spaces around it are tolerated here, as PyTorch's
    # own parser does.)
    if not c.ddp.nccl_ub or not _expandable(c):
        return None
    return Violation(f"{ALLOC}={c.env.get(ALLOC)!r} with ddp.nccl_ub=True (rejected on "
                     "PyTorch < 2.11: NCCL user buffers use the torch.cuda.MemPool API)",
                     f"remove expandable_segments:True from {ALLOC}, or set ddp.nccl_ub=False")


@rule("env.fsdp-device-connections", "error", ref="H3", source="megatron-bridge",
      fields=("ddp.use_megatron_fsdp", "env.CUDA_DEVICE_MAX_CONNECTIONS"), skill=MEM,
      summary="Megatron-FSDP needs CUDA_DEVICE_MAX_CONNECTIONS unset or > 1")
def _fsdp_device_connections(c: TrainingConfig, d: Derived) -> Violation | None:
    fsdp = c.ddp.use_megatron_fsdp or carried_section(c, "dist").get("use_megatron_fsdp")
    if not fsdp or c.env.get("CUDA_DEVICE_MAX_CONNECTIONS") != "1":
        return None
    return Violation("Megatron-FSDP with CUDA_DEVICE_MAX_CONNECTIONS='1'",
                     "unset CUDA_DEVICE_MAX_CONNECTIONS (or set it above 1, e.g. 8) for "
                     "Megatron-FSDP")


@rule("env.deterministic-nccl-algo", "error", ref="H4", source="megatron-bridge",
      fields=("model.deterministic_mode", "env.NCCL_ALGO"), skill=MEM,
      summary="deterministic mode needs NCCL_ALGO Tree, Ring, CollnetDirect, CollnetChain or "
              "^NVLS")
def _deterministic_nccl_algo(c: TrainingConfig, d: Derived) -> Violation | None:
    algo = c.env.get("NCCL_ALGO")
    if not c.model.deterministic_mode or algo in _NCCL_ALGOS:
        return None
    shown = "unset" if algo is None else repr(algo)
    return Violation(f"deterministic_mode=True with NCCL_ALGO {shown}",
                     f"export NCCL_ALGO to one of {', '.join(_NCCL_ALGOS)} (e.g. Ring)")


@rule("env.deterministic-no-ce-fusion", "error", ref="H4", source="megatron-bridge",
      fields=("model.deterministic_mode", "model.cross_entropy_loss_fusion"), skill=MEM,
      summary="deterministic mode forbids cross-entropy loss fusion")
def _deterministic_no_ce_fusion(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if not m.deterministic_mode or not m.cross_entropy_loss_fusion:
        return None
    return Violation("deterministic_mode=True with cross_entropy_loss_fusion=True (the default)",
                     "set model.cross_entropy_loss_fusion=False")


@rule("env.deterministic-no-flash", "error", ref="H4", source="megatron-bridge",
      fields=("model.deterministic_mode", "model.attention_backend"), skill=MEM,
      summary="deterministic mode forbids the flash attention backend")
def _deterministic_no_flash(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.model.deterministic_mode or attention_backend(c.model) != "flash":
        return None
    return Violation('deterministic_mode=True with attention_backend="flash"',
                     'set model.attention_backend to "fused" or "unfused"')


@rule("env.graph-register", "error", ref="G17", source="megatron-core",
      fields=("model.cuda_graph_impl", ALLOC_FIELD, "env.NCCL_GRAPH_REGISTER"), skill=RECOMPUTE,
      summary="TE-impl CUDA graphs with expandable_segments need NCCL_GRAPH_REGISTER=0")
def _graph_register(c: TrainingConfig, d: Derived) -> Violation | None:
    value = c.env.get("NCCL_GRAPH_REGISTER")
    if graph_impl(c.model) != "transformer_engine" or not _expandable(c) or value == "0":
        return None
    shown = "unset" if value is None else repr(value)
    return Violation(f'cuda_graph_impl="transformer_engine" with {ALLOC} expandable_segments:'
                     f"True and NCCL_GRAPH_REGISTER {shown} (illegal memory access risk)",
                     "export NCCL_GRAPH_REGISTER=0 in the job environment")


@rule("env.graphs-want-expandable", "warning", ref="X3", source="project",
      fields=("model.cuda_graph_impl", ALLOC_FIELD), skill=MEM,
      summary="CUDA graphs on without expandable_segments: capture-time fragmentation")
def _graphs_want_expandable(c: TrainingConfig, d: Derived) -> Violation | None:
    # Skipped with ddp.nccl_ub (H1 forbids the fix) and with the cudaMallocAsync backend.
    impl = graph_impl(c.model)
    if impl == "none" or not _expandable_advice_applies(c):
        return None
    current = repr(c.env[ALLOC]) if ALLOC in c.env else "not set"
    return Violation(f'cuda_graph_impl="{impl}" without expandable_segments:True in {ALLOC} '
                     f"({current}): graph pools fragment memory and can OOM a run that "
                     "otherwise fits (a launch that bypasses the perf env plugin loses it)",
                     f"export {ALLOC}=expandable_segments:True"
                     + (" and NCCL_GRAPH_REGISTER=0" if impl == "transformer_engine" else ""))


@rule("env.expandable-segments-missing", "info", ref="X3", source="skill",
      fields=(ALLOC_FIELD,), skill=MEM,
      summary="expandable_segments:True is the first, free fix for near-limit OOMs")
def _expandable_segments_missing(c: TrainingConfig, d: Derived) -> Violation | None:
    # With graphs on, env.graphs-want-expandable (a warning) says this instead.
    if graph_impl(c.model) != "none" or not _expandable_advice_applies(c):
        return None
    current = next((f"{n}={c.env[n]!r}" for n in _ALLOC_NAMES if n in c.env),
                   f"{ALLOC} is not set")
    return Violation(f"{current}: without expandable_segments:True, allocator fragmentation "
                     "can cause OOMs near the memory limit (it alone fixed the Llama3 70B SFT "
                     "OOM at 58.8 GB)",
                     f"export {ALLOC}=expandable_segments:True (Bridge Slurm templates usually "
                     "set it) before changing recompute or parallelism")
