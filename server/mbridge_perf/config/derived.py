"""The resolved view of a TrainingConfig (``Derived``), built once and read by every room: parallel
sizes and where the world size came from, micro-batches, effective precision, where each layer
lives in the pipeline, the GPU, and Megatron-Core's reading of recompute, CUDA graphs, fused
attention and the dispatcher (config.semantics). Values are computed, never stored in the
config.

Everything returns ``None`` where the inputs do not determine a value (no world size given, a
size that does not divide): the rules report why, these functions only compute.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from math import lcm

from mbridge_perf.config import semantics as sem
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import GPUSpec, lookup_gpu
from mbridge_perf.config.layers import LayerKind, layer_kinds
from mbridge_perf.config.mcore import McoreFacts, mcore_facts
from mbridge_perf.config.model import ModelSection, TrainingConfig

# Megatron Bridge MixedPrecisionConfig: its defaults, and what each named recipe
# (`mixed_precision: bf16_with_mxfp8_mixed`) sets on top. Bridge copies *every* field of the
# mixed-precision config onto the model, optimizer and DDP configs at setup, so once a
# `mixed_precision` is given these values win over the model's own.
MIXED_PRECISION_DEFAULTS: dict[str, object] = {
    "bf16": False, "fp16": False, "grad_reduce_in_fp32": True, "fp8": None,
    "fp8_recipe": "tensorwise", "first_last_layers_bf16": False, "fp8_param": None,
    "fp8_param_gather": False, "fp4": None, "fp4_recipe": "nvfp4",
    "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 0,
    "reuse_grad_buf_for_mxfp8_param_ag": False,
}
_FP8_DELAYED = {"fp8": "hybrid", "fp8_recipe": "delayed", "fp8_param_gather": True}
_MXFP8 = {"fp8": "e4m3", "fp8_recipe": "mxfp8", "fp8_param_gather": True,
          "reuse_grad_buf_for_mxfp8_param_ag": True}
_FP8_CURRENT = {"fp8": "hybrid", "fp8_recipe": "tensorwise", "first_last_layers_bf16": True,
                "num_layers_at_start_in_bf16": 1, "num_layers_at_end_in_bf16": 1,
                "fp8_param_gather": True}
_FP8_SUBCHANNEL = {"fp8": "hybrid", "fp8_recipe": "blockwise", "fp8_param_gather": False}
_NVFP4 = {"fp4": "e2m1", "fp4_recipe": "nvfp4", "fp8_param_gather": False}
MIXED_PRECISION_RECIPES: dict[str, dict[str, object]] = {
    "bf16_mixed": {"bf16": True},
    "fp16_mixed": {"fp16": True},
    "bf16_with_fp8_delayed_scaling_mixed": {"bf16": True, **_FP8_DELAYED},
    "fp16_with_fp8_delayed_scaling_mixed": {"fp16": True, **_FP8_DELAYED},
    "bf16_with_mxfp8_mixed": {"bf16": True, **_MXFP8},
    "fp16_with_mxfp8_mixed": {"fp16": True, **_MXFP8},
    "bf16_with_fp8_current_scaling_mixed": {"bf16": True, **_FP8_CURRENT},
    "fp16_with_fp8_current_scaling_mixed": {"fp16": True, **_FP8_CURRENT},
    "nemotron_h_bf16_with_fp8_current_scaling_mixed": {
        "bf16": True, **_FP8_CURRENT, "num_layers_at_start_in_bf16": 2,
        "num_layers_at_end_in_bf16": 2},
    "nanov2_bf16_with_fp8_current_scaling_mixed": {
        "bf16": True, **_FP8_CURRENT, "fp8_recipe": "blockwise",
        "num_layers_at_start_in_bf16": 2, "num_layers_at_end_in_bf16": 2},
    "bf16_with_fp8_subchannel_scaling_mixed": {"bf16": True, **_FP8_SUBCHANNEL},
    "fp16_with_fp8_subchannel_scaling_mixed": {"fp16": True, **_FP8_SUBCHANNEL},
    "bf16_with_nvfp4_mixed": {"bf16": True, **_NVFP4},
    "nemotron_3_super_bf16_with_nvfp4_mixed": {
        "bf16": True, **_NVFP4, "first_last_layers_bf16": True, "num_layers_at_end_in_bf16": 14},
    "nemotron_3_ultra_bf16_with_nvfp4_mixed": {
        "bf16": True, **_NVFP4, "first_last_layers_bf16": True,
        "num_layers_at_start_in_bf16": 0, "num_layers_at_end_in_bf16": 16},
}
# Bridge registers each recipe under its hyphenated name too.
MIXED_PRECISION_RECIPES |= {k.replace("_", "-"): v for k, v in MIXED_PRECISION_RECIPES.items()}


@dataclass(frozen=True)
class Precision:
    """What the model runs in once `mixed_precision` has been applied onto it."""

    bf16: bool
    fp16: bool
    fp8: str | None
    fp8_recipe: str
    fp8_param: bool
    fp8_param_gather: bool
    fp4: str | None
    fp4_recipe: str | None
    grad_reduce_in_fp32: bool
    first_last_layers_bf16: bool
    num_layers_at_start_in_bf16: int
    num_layers_at_end_in_bf16: int
    reuse_grad_buf_for_mxfp8_param_ag: bool
    from_mixed_precision: bool  # False: read from the model section alone
    assumed: bool = False
    """No precision was given anywhere: priced as Bridge's recipes train (bf16_mixed)."""


DEFAULT_RECIPE = "bf16_mixed"
"""What a config that names no precision trains in: every Megatron Bridge recipe sets a
mixed-precision recipe, bf16_mixed unless it says otherwise. FP32 only when asked for
(mixed_precision: null, or model.bf16 / fp16 written out)."""
_PRECISION_FIELDS = frozenset(MIXED_PRECISION_DEFAULTS) | {"fp4_param", "params_dtype"}


def precision_unset(cfg: TrainingConfig) -> bool:
    """Neither mixed_precision nor a model precision field was written."""
    return "mixed_precision" not in cfg.model_fields_set and not (
        _PRECISION_FIELDS & cfg.model.model_fields_set)


def resolve_precision(cfg: TrainingConfig) -> Precision:
    m, mp = cfg.model, cfg.mixed_precision
    if mp is None and precision_unset(cfg):
        return _assumed_precision()
    if mp is None:
        return _model_precision(
            m.bf16, m.fp16, m.fp8, m.fp8_recipe, m.fp8_param, m.fp4, m.fp4_recipe,
            cfg.ddp.grad_reduce_in_fp32, m.first_last_layers_bf16,
            m.num_layers_at_start_in_bf16, m.num_layers_at_end_in_bf16)
    if isinstance(mp, str):
        return _recipe_precision(mp)
    values = dict(MIXED_PRECISION_DEFAULTS)
    values |= {k: v for k, v in mp.model_dump(exclude_unset=True).items()
               if k in MIXED_PRECISION_DEFAULTS and v is not None}
    return _precision_from(values)


# Precision is frozen and a pure function of these few values: resolved once per recipe name
# or model-precision tuple, not once per call (estimates price thousands of layouts).
@lru_cache(maxsize=256, typed=True)  # typed: True and 1 must not share an entry
def _model_precision(bf16: bool, fp16: bool, fp8: str | None, fp8_recipe: str, fp8_param: bool,
                     fp4: str | None, fp4_recipe: str | None, grad_reduce_in_fp32: bool,
                     first_last_layers_bf16: bool, num_layers_at_start_in_bf16: int,
                     num_layers_at_end_in_bf16: int) -> Precision:
    return Precision(
        bf16=bf16, fp16=fp16, fp8=fp8, fp8_recipe=fp8_recipe, fp8_param=fp8_param,
        fp8_param_gather=False, fp4=fp4, fp4_recipe=fp4_recipe,
        grad_reduce_in_fp32=grad_reduce_in_fp32, first_last_layers_bf16=first_last_layers_bf16,
        num_layers_at_start_in_bf16=num_layers_at_start_in_bf16,
        num_layers_at_end_in_bf16=num_layers_at_end_in_bf16,
        reuse_grad_buf_for_mxfp8_param_ag=False, from_mixed_precision=False)


@lru_cache(maxsize=1)
def _assumed_precision() -> Precision:
    values = dict(MIXED_PRECISION_DEFAULTS) | MIXED_PRECISION_RECIPES[DEFAULT_RECIPE]
    values["fp8_param"] = values["fp8_param_gather"]
    return Precision(**values, from_mixed_precision=True, assumed=True)  # type: ignore[arg-type]


@lru_cache(maxsize=64)
def _recipe_precision(name: str) -> Precision:
    return _precision_from(dict(MIXED_PRECISION_DEFAULTS) | MIXED_PRECISION_RECIPES.get(name, {}))


def _precision_from(values: dict[str, object]) -> Precision:
    if values["fp8_param"] is None:  # Bridge keeps fp8_param and fp8_param_gather in step
        values["fp8_param"] = values["fp8_param_gather"]
    return Precision(**values, from_mixed_precision=True)  # type: ignore[arg-type]


def _div(a: int | None, b: int) -> int | None:
    if a is None or b <= 0 or a % b:
        return None
    return a // b


# Megatron-Core LayerType names used by the list form of a layout, and their letters.
_LAYER_NAMES = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L", "e": "E", "t": "t",
                "m": "m", "l": "L"}
_LAYOUT_REPEAT = re.compile(r"(\([^()]*\)|[A-Za-z])\*(\d+)")


# Expanded layout length: PP·VPP stages of E/t/m/L symbols, bounded before any repeat is built
MAX_LAYOUT_SYMBOLS = 100_000


def _bounded_repeat(m: re.Match[str]) -> str:
    """`(tt|)*29` → its expansion, refused before building when it would be absurd."""
    body, count = m.group(1).strip("()"), m.group(2)
    if len(count) > 6 or len(body) * int(count) > MAX_LAYOUT_SYMBOLS:
        raise ValueError(f"pipeline_model_parallel_layout: repeat {m.group(0)[:40]!r} expands "
                         f"to more than {MAX_LAYOUT_SYMBOLS:,} symbols; no model has that many "
                         "layers")
    return body * int(count)


def parse_pipeline_layout(layout: str | list) -> list[list[str]]:
    """Expand a `pipeline_model_parallel_layout` into one list of layer symbols per virtual
    stage (PP·VPP stages, in schedule order): `E` embedding, `t` transformer layer, `m` MTP,
    `L` loss. Accepts the string form ("Et*3|(tt|)*29,m|L") or a list of lists."""
    if isinstance(layout, list):
        stages = []
        for stage in layout:
            if not isinstance(stage, list):
                raise ValueError(f"pipeline_model_parallel_layout: stage {stage!r} is not a "
                                 "list of layer names")
            try:
                stages.append([_LAYER_NAMES[str(x).lower()] for x in stage])
            except KeyError as exc:
                raise ValueError(f"pipeline_model_parallel_layout: unknown layer {exc.args[0]!r}"
                                 f"; use {', '.join(sorted(_LAYER_NAMES))}") from None
        return stages
    text = layout.replace(" ", "").replace(",", "")
    for _ in range(64):  # expand innermost repeats first
        new = _LAYOUT_REPEAT.sub(_bounded_repeat, text)
        if new == text:
            break
        text = new
        if len(text) > MAX_LAYOUT_SYMBOLS:
            raise ValueError(f"pipeline_model_parallel_layout expands to more than "
                             f"{MAX_LAYOUT_SYMBOLS:,} symbols; no model has that many layers")
    stages = text.split("|")
    bad = set("".join(stages)) - set("EtmL")
    if bad or "(" in text or "*" in text:
        raise ValueError(f"pipeline_model_parallel_layout {layout!r}: cannot read "
                         f"{''.join(sorted(bad)) or 'a repeat'}; use E, t, m, L, |, (…)*N")
    return [list(s) for s in stages]


def layers_per_chunk(m: ModelSection) -> list[list[int]] | None:
    """Transformer layers on each (PP rank, virtual chunk), the way Megatron-Core places them;
    None when the split is not valid (the pipeline rules explain why)."""
    pp = m.pipeline_model_parallel_size
    vpp = m.virtual_pipeline_model_parallel_size or 1
    if m.pipeline_model_parallel_layout is not None:
        try:
            stages = parse_pipeline_layout(m.pipeline_model_parallel_layout)
        except ValueError:
            return None
        if len(stages) % pp:
            return None
        chunks = len(stages) // pp
        # virtual stage v*PP + r belongs to PP rank r, chunk v
        return [[stages[v * pp + r].count("t") for v in range(chunks)] for r in range(pp)]
    layers = m.num_layers
    if layers is None:
        return None
    first, last = m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage
    if pp == 1:
        per_rank = [layers]
    elif first is not None or last is not None:
        middle_stages = pp - (first is not None) - (last is not None)
        middle_layers = layers - (first or 0) - (last or 0)
        if middle_layers < 0 or (middle_stages == 0 and middle_layers) or (
                middle_stages and middle_layers % middle_stages):
            return None
        mid = middle_layers // middle_stages if middle_stages else 0
        per_rank = [mid] * pp
        if first is not None:
            per_rank[0] = first
        if last is not None:
            per_rank[-1] = last
    else:
        # account_for_*: the embedding and loss count as layers when splitting; each chunk
        # gets (layers + extras) / (PP·VPP), then the first chunk of the first rank and the
        # last chunk of the last rank give one back (Megatron-Core's placement).
        emb = int(m.account_for_embedding_in_pipeline_split)
        loss = int(m.account_for_loss_in_pipeline_split)
        per = _div(layers + emb + loss, pp * vpp)
        if per is None:
            return None
        chunks = [[per] * vpp for _ in range(pp)]
        chunks[0][0] -= emb
        chunks[-1][-1] -= loss
        return chunks
    out = []
    for n in per_rank:
        c = _div(n, vpp)
        if c is None:
            return None
        out.append([c] * vpp)
    return out


def mesh_world(tp: int, pp: int, cp: int, ep: int, etp: int) -> int:
    """Smallest world both meshes divide: PP·lcm(TP·CP, EP·ETP), which is the published
    PP·max(TP·CP, EP·ETP) for power-of-two sizes, never the product of every size."""
    return pp * lcm(tp * cp, ep * etp)


@dataclass(frozen=True)
class Derived:
    """Parallel sizes and batch arithmetic (Megatron's "parallel folding": the expert mesh
    ETP·EP·EDP·PP is independent of the dense mesh TP·CP·DP·PP)."""

    cfg: TrainingConfig
    # the config this one was changed from, for rules about the change itself (e.g. TP raised
    # to fix an OOM); None when validating a config on its own
    baseline: TrainingConfig | None = None
    # the Megatron-Core release whose checks apply (Bridge 0.6.2 ships 0.19.2)
    mcore: McoreFacts = field(default_factory=mcore_facts)

    @property
    def tp(self) -> int:
        return self.cfg.model.tensor_model_parallel_size

    @property
    def pp(self) -> int:
        return self.cfg.model.pipeline_model_parallel_size

    @property
    def cp(self) -> int:
        return self.cfg.model.context_parallel_size

    @property
    def ep(self) -> int:
        return self.cfg.model.expert_model_parallel_size

    @property
    def etp(self) -> int:
        """ETP defaults to TP when unset (Megatron-Core)."""
        m = self.cfg.model
        return m.expert_tensor_parallel_size or m.tensor_model_parallel_size

    @property
    def vpp(self) -> int:
        return self.cfg.model.virtual_pipeline_model_parallel_size or 1

    @property
    def world_size(self) -> int | None:
        return self.cfg.cluster.num_gpus

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def expert_model_parallel_size(self) -> int:
        return self.etp * self.ep * self.pp

    @property
    def min_gpus(self) -> int:
        return mesh_world(self.tp, self.pp, self.cp, self.ep, self.etp)

    @property
    def dp(self) -> int | None:
        return _div(self.world_size, self.model_parallel_size)

    @property
    def edp(self) -> int | None:
        return _div(self.world_size, self.expert_model_parallel_size) if self.is_moe else None

    @property
    def num_microbatches(self) -> int | None:
        t = self.cfg.train
        if self.dp is None or t.global_batch_size is None:
            return None
        return _div(t.global_batch_size, t.micro_batch_size * self.dp)

    @cached_property
    def before(self) -> Derived | None:
        """The baseline's derived values, for rules about the change."""
        return None if self.baseline is None else Derived(self.baseline, mcore=self.mcore)

    def dp_lowered(self) -> tuple[int, int] | None:
        """(DP before, DP after) when the change lowered data parallelism; the world size is
        taken from whichever config states it. The GPUs do not change when a user edits a
        parallel size: where the new config's world is only implied by a Bridge dump
        (comm_overlap.data_parallel_size x TP·PP·CP keeps the old DP, so that "world" grows
        with TP), the baseline's world is the one both run on."""
        b = self.before
        if b is None:
            return None
        old_world, new_world = b.world_size or self.world_size, self.world_size or b.world_size
        if self.world_from_dump and b.world_size is not None:
            new_world = b.world_size
        if old_world is None or new_world is None:
            return None
        old, new = old_world // b.model_parallel_size, new_world // self.model_parallel_size
        return (old, new) if new < old else None

    @property
    def world_from_dump(self) -> bool:
        """The world size is the one a Bridge dump implies (comm_overlap.data_parallel_size
        x TP·PP·CP, what set_data_parallel_size() saw when the dump was written), not
        necessarily the one the job will launch on."""
        dp = self.cfg.overlap.carried().get("data_parallel_size")
        return self.world_size is not None and isinstance(dp, int) and \
            dp * self.model_parallel_size == self.world_size

    @property
    def is_moe(self) -> bool:
        n = self.cfg.model.num_moe_experts
        return n is not None and n > 0

    @cached_property
    def layers_per_chunk(self) -> list[list[int]] | None:
        return layers_per_chunk(self.cfg.model)

    @property
    def layers_per_stage(self) -> list[int] | None:
        chunks = self.layers_per_chunk
        return None if chunks is None else [sum(c) for c in chunks]

    @cached_property
    def precision(self) -> Precision:
        return resolve_precision(self.cfg)

    @property
    def half_precision(self) -> bool:
        p = self.precision
        return p.bf16 or p.fp16

    @property
    def world_source(self) -> str | None:
        """Where the world size came from: the config's cluster.num_gpus, the data-parallel
        size a Bridge dump records, or nowhere (None)."""
        if self.world_size is None:
            return None
        return "implied by the dump" if self.world_from_dump else "cluster.num_gpus"

    @cached_property
    def gpu(self) -> GPUSpec | None:
        """The catalog entry for cluster.gpu; None when unset or not in the catalog (the
        estimator reports an unknown name, the rules skip GPU-specific checks)."""
        try:
            return lookup_gpu(self.cfg.cluster.gpu) if self.cfg.cluster.gpu else None
        except ValueError:
            return None

    # --- Megatron-Core's reading of the model (config.semantics) ---

    @cached_property
    def layer_kinds(self) -> tuple[LayerKind, ...]:
        """Mixer and MLP per decoder layer; () when the layer pattern does not read (the
        rules and the estimator report why)."""
        try:
            return layer_kinds(self.cfg.model)
        except (ValueError, ConfigError):
            return ()

    @cached_property
    def recompute(self) -> sem.Recompute:
        return sem.recompute(self.cfg.model)

    @cached_property
    def graphs(self) -> sem.Graphs:
        return sem.graphs(self.cfg.model)

    @cached_property
    def fused_attention(self) -> bool:
        return sem.fused_attention(self.cfg.model, self.half_precision)

    @property
    def dispatcher(self) -> str:
        return str(self.cfg.model.moe_token_dispatcher_type)

    @property
    def long_context(self) -> bool:
        return (self.cfg.model.seq_length or 0) >= sem.LONG_CONTEXT

    def first_selective_modules(self, *, long_context: bool = False) -> list[str]:
        return sem.first_selective_modules(self.cfg.model, self.layer_kinds,
                                           self.half_precision, long_context=long_context)

    def selective_order(self, *, long_context: bool = False) -> list[str]:
        return sem.selective_order(self.cfg.model, self.layer_kinds, self.half_precision,
                                   long_context=long_context)

    def as_dict(self) -> dict[str, object]:
        """The values a report shows the user."""
        return {
            "world_size": self.world_size,
            "tensor_model_parallel_size": self.tp,
            "pipeline_model_parallel_size": self.pp,
            "virtual_pipeline_model_parallel_size": self.cfg.model.
            virtual_pipeline_model_parallel_size,
            "context_parallel_size": self.cp,
            "expert_model_parallel_size": self.ep,
            "expert_tensor_parallel_size": self.etp,
            "data_parallel_size": self.dp,
            "expert_data_parallel_size": self.edp,
            "min_gpus": self.min_gpus,
            "num_microbatches": self.num_microbatches,
            "layers_per_stage": self.layers_per_stage,
            "layers_per_chunk": self.layers_per_chunk,
        }


def derive(cfg: TrainingConfig, baseline: TrainingConfig | None = None,
           mcore_version: str | None = None) -> Derived:
    return Derived(cfg, baseline, mcore_facts(mcore_version))


def resolved_lines(d: Derived) -> list[str]:
    """What the config means as Megatron-Core reads it, in a few lines for a reader (the
    prompts hand them to the assistant with the config, so it starts from the same reading as
    every tool)."""
    r, g = d.recompute, d.graphs
    if r.granularity == "selective":
        now = f"selective over {', '.join(r.selective) or 'no modules'} (as set)"
    elif r.granularity == "full":
        now = f"full ({r.method}, recompute_num_layers={r.num_layers})"
    else:
        now = "none"
    attn = ("fused / flash (Transformer Engine): core_attn recompute frees about 0"
            if d.fused_attention else "unfused: the s² scores are kept, core_attn recompute "
                                      "drops them")
    if g.te_scopes is not None:
        graphs = (f"per-layer Transformer Engine graphs of {list(g.te_scopes) or 'whole layers'}")
    elif g.on:
        graphs = g.describe() + (" (full iteration)" if g.full_iteration else "")
    else:
        graphs = "none"
    sizes = (f"TP{d.tp} PP{d.pp} VPP{d.vpp} CP{d.cp} EP{d.ep} ETP{d.etp} DP{d.dp}"
             + (f" on {d.world_size} GPUs ({d.world_source})" if d.world_size else ""))
    first = ", ".join(d.first_selective_modules())
    return [f"- Parallel sizes: {sizes}", f"- Recompute in effect: {now}",
            f"- Attention: {attn}", f"- CUDA graphs: {graphs}",
            f"- First selective modules for this architecture: recompute_modules=[{first}]"]
