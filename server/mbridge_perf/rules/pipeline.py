"""Pipeline parallelism: PP / VPP, uneven first and last stages, split accounting and explicit
layouts (constraint catalog section B).

Megatron-Core places layers in one of four mutually exclusive ways: an explicit
`pipeline_model_parallel_layout`, uneven first/last stage counts,
`account_for_*_in_pipeline_split`, or an even split. `TransformerConfig` checks the first three
when it is built; the even split (B2, B3) only when the model is built
(`get_num_layers_to_build`), which counts as Megatron-Core enforcing it.
"""

from __future__ import annotations

from mbridge_perf.config.derived import Derived, parse_pipeline_layout
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.rules.catalog import MEM, Violation, rule

LAYERS = "model.num_layers"
PP = "model.pipeline_model_parallel_size"
VPP = "model.virtual_pipeline_model_parallel_size"
FIRST = "model.num_layers_in_first_pipeline_stage"
LAST = "model.num_layers_in_last_pipeline_stage"
ACC_EMB = "model.account_for_embedding_in_pipeline_split"
ACC_LOSS = "model.account_for_loss_in_pipeline_split"
LAYOUT = "model.pipeline_model_parallel_layout"

# list-form layouts name MCore LayerType members; the string form uses their letters
_LAYER_SYMBOL = {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L", "encoder": "encoder"}


def _mode(m: ModelSection) -> str:
    """Which of MCore's mutually exclusive placement paths applies (its if/elif order)."""
    if m.pipeline_model_parallel_layout is not None:
        return "layout"
    if m.num_layers_in_first_pipeline_stage is not None or \
            m.num_layers_in_last_pipeline_stage is not None:
        return "uneven"
    if m.account_for_embedding_in_pipeline_split or m.account_for_loss_in_pipeline_split:
        return "accounting"
    return "even"


def _layout(m: ModelSection) -> tuple[list[list[str]] | None, str | None]:
    """The layout as one list of E/t/m/L symbols per virtual stage, or why it cannot be read."""
    raw = m.pipeline_model_parallel_layout
    if isinstance(raw, str):
        try:
            return parse_pipeline_layout(raw), None
        except ValueError as e:
            return None, str(e)
    if not isinstance(raw, list):
        return None, None if raw is None else f"{LAYOUT} must be a string or a list of lists"
    stages: list[list[str]] = []
    for row in raw:
        if not isinstance(row, list):
            return None, f"{LAYOUT} given as a list must hold one list per stage, got {row!r}"
        stage = []
        for item in row:
            name = str(item).strip().lower()
            if name not in _LAYER_SYMBOL:
                return None, (f"{item!r} in {LAYOUT} is not a layer type (embedding, decoder, "
                              "mtp, loss)")
            stage.append(_LAYER_SYMBOL[name])
        stages.append(stage)
    return stages, None


def _uneven_middle(m: ModelSection) -> tuple[int, int]:
    """(layers, stages) left for the middle ranks once the first/last counts are taken, exactly
    as MCore subtracts them (negative layers are possible and checked separately)."""
    layers, stages = m.num_layers or 0, m.pipeline_model_parallel_size
    for n in (m.num_layers_in_first_pipeline_stage, m.num_layers_in_last_pipeline_stage):
        if n is not None:
            layers -= n
            stages -= 1
    return layers, stages


def _divisors(n: int, upto: int) -> list[int]:
    return [k for k in range(1, min(n, upto) + 1) if n % k == 0]


def _split_options(layers: int, pp: int, vpp: int) -> str:
    """Concrete alternatives for a split that does not divide: other PP sizes, split accounting,
    or uneven first/last stages whose counts all divide by VPP."""
    opts: list[str] = []
    pps = [k for k in _divisors(layers, 4 * pp) if k > 1 and (layers // k) % vpp == 0]
    if pps:
        opts.append(f"set {PP} to one of {', '.join(map(str, pps[:6]))}")
    for extra, which in ((2, f"{ACC_EMB} and {ACC_LOSS}"), (1, f"{ACC_EMB} (or {ACC_LOSS})")):
        if (layers + extra) % pp == 0 and (layers + extra) // pp % vpp == 0:
            opts.append(f"set {which} = true ({(layers + extra) // pp} per stage, "
                        f"{extra} of them embedding/loss)")
            break
    if pp > 2:
        base = layers // pp
        for edge in sorted(range(1, layers), key=lambda f: abs(f - base)):
            mid, rest = pp - 2, layers - 2 * edge
            if rest > 0 and rest % mid == 0 and edge % vpp == 0 and rest // mid % vpp == 0:
                opts.append(f"set {FIRST} = {LAST} = {edge} ({rest // mid} on each middle stage)")
                break
    return "; or ".join(opts) if opts else f"change {LAYERS} or {PP}"


def _layout_vpp(m: ModelSection) -> int | None:
    stages, _ = _layout(m)
    pp = m.pipeline_model_parallel_size
    if stages is None or len(stages) % pp:
        return None
    return len(stages) // pp


@rule("pipeline.vpp-needs-pp", "error", ref="B1", source="megatron-core",
      fields=(VPP, PP, LAYOUT), skill=MEM,
      summary="virtual pipeline (interleaved schedule) needs pipeline_model_parallel_size > 1")
def _vpp_needs_pp(c: TrainingConfig, d: Derived) -> Violation | None:
    # raised by parallel_state at process-group init, not by the config dataclasses
    m = c.model
    if d.pp > 1:
        return None
    fix = f"unset {VPP} (null), or set {PP} to 2 or more"
    if m.virtual_pipeline_model_parallel_size is not None:
        return Violation(f"virtual_pipeline_model_parallel_size="
                         f"{m.virtual_pipeline_model_parallel_size} with "
                         f"pipeline_model_parallel_size={d.pp}", fix)
    implied = _layout_vpp(m)
    if implied is not None and implied > 1:
        return Violation(f"{LAYOUT} has {implied} stages with pipeline_model_parallel_size={d.pp}"
                         f", which implies VPP={implied}",
                         f"give the layout one stage per PP rank, or set {PP} to 2 or more",
                         (LAYOUT, PP))
    return None


def _per_stage(m: ModelSection) -> tuple[int, str] | None:
    """(layers + embedding/loss stages, how they were counted) for the even and the
    split-accounting placements; None for the others."""
    mode = _mode(m)
    if m.num_layers is None or mode not in ("even", "accounting"):
        return None
    extra = int(m.account_for_embedding_in_pipeline_split) + int(
        m.account_for_loss_in_pipeline_split)
    how = f"num_layers={m.num_layers}" + (f" + {extra} embedding/loss = {m.num_layers + extra}"
                                          if extra else "")
    return m.num_layers + extra, how


@rule("pipeline.layers-divisible-by-pp", "error", ref="B2/B8", source="megatron-core",
      fields=(LAYERS, PP, ACC_EMB, ACC_LOSS), skill=MEM, mcore_enforced=True,
      summary="num_layers (plus embedding/loss when accounted) divisible by PP")
def _layers_divisible_by_pp(c: TrainingConfig, d: Derived) -> Violation | None:
    # TransformerConfig checks the account_for_* case (B8); the plain even split (B2) fails in
    # MCore's model-build layer placement (get_num_layers_to_build), which the parity oracle
    # runs too, hence mcore_enforced.
    counted = _per_stage(c.model)
    if counted is None or d.pp == 1 or counted[0] % d.pp == 0:
        return None
    return Violation(
        f"{counted[1]} is not divisible by pipeline_model_parallel_size={d.pp} "
        f"({counted[0] / d.pp:g} per stage)",
        _split_options(c.model.num_layers or 0, d.pp, d.vpp))


def _vpp_gaps(m: ModelSection, vpp: int) -> list[str]:
    """Stage layer counts that VPP does not divide, for every placement but a layout."""
    counted = _per_stage(m)
    pp = m.pipeline_model_parallel_size
    if counted is not None:
        total = counted[0]
        return [f"{total // pp} layers per stage ({counted[1]} over PP {pp})"] if (
            total % pp == 0 and (total // pp) % vpp) else []
    if _mode(m) != "uneven":
        return []
    gaps = [f"{label} stage {n}" for label, n in (
        ("first", m.num_layers_in_first_pipeline_stage),
        ("last", m.num_layers_in_last_pipeline_stage)) if n is not None and n > 0 and n % vpp]
    layers, stages = _uneven_middle(m)
    if stages > 0 and layers % stages == 0 and (layers // stages) % vpp:
        gaps.append(f"{layers // stages} on each middle stage")
    return gaps


@rule("pipeline.vpp-layers-divisible", "error", ref="B3/B5/B7/B8", source="megatron-core",
      fields=(LAYERS, PP, VPP, FIRST, LAST, ACC_EMB, ACC_LOSS), skill=MEM, mcore_enforced=True,
      summary="layers on every PP stage (first, middle, last) divisible by VPP")
def _vpp_layers_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    # Uneven (B5, B7) and account_for_* (B8) splits are checked by TransformerConfig; the even
    # split (B3) only at model build (get_num_layers_to_build), which the parity oracle runs.
    m = c.model
    vpp = m.virtual_pipeline_model_parallel_size
    if vpp is None or vpp == 1 or (d.pp == 1 and _mode(m) == "even"):
        return None
    gaps = _vpp_gaps(m, vpp)
    if not gaps:
        return None
    per = _per_stage(m)
    ok = [v for v in _divisors(per[0] // d.pp, per[0] // d.pp) if v > 1] if per else []
    alt = f"set {VPP} to one of {', '.join(map(str, ok[:6]))}; or " if ok else ""
    return Violation(f"{', '.join(gaps)}: not divisible by virtual_pipeline_model_parallel_size="
                     f"{vpp}",
                     alt + (_split_options(m.num_layers, d.pp, vpp) if m.num_layers else
                            f"make every stage's layer count a multiple of {vpp}"))


@rule("pipeline.uneven-stage-positive", "error", ref="B4", source="megatron-core",
      fields=(FIRST, LAST), skill=MEM, mcore_enforced=True,
      summary="uneven PP: first/last stage layer counts must be larger than 0")
def _uneven_stage_positive(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if _mode(m) != "uneven":
        return None
    bad = [f"{name}={n}" for name, n in (
        ("num_layers_in_first_pipeline_stage", m.num_layers_in_first_pipeline_stage),
        ("num_layers_in_last_pipeline_stage", m.num_layers_in_last_pipeline_stage))
        if n is not None and n <= 0]
    if not bad:
        return None
    return Violation(f"{', '.join(bad)}: a stage cannot hold zero layers",
                     f"give {FIRST}/{LAST} at least 1 layer, or unset them (null)")


@rule("pipeline.uneven-middle-divisible", "error", ref="B6", source="megatron-core",
      fields=(LAYERS, PP, FIRST, LAST), skill=MEM, mcore_enforced=True,
      summary="uneven PP: remaining layers divide evenly over the middle stages (both present or "
              "both absent)")
def _uneven_middle_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if _mode(m) != "uneven" or m.num_layers is None:
        return None
    layers, stages = _uneven_middle(m)
    if bool(layers) != bool(stages):
        msg = f"{layers} layers left for {stages} middle stages"
    elif stages and layers % stages:
        msg = f"{layers} middle layers do not divide over {stages} middle stages"
    else:
        return None
    return Violation(
        f"num_layers={m.num_layers}, PP={d.pp}, first={m.num_layers_in_first_pipeline_stage}, "
        f"last={m.num_layers_in_last_pipeline_stage}: {msg}",
        f"choose {FIRST}/{LAST} so that the layers left divide over the {max(stages, 0)} "
        f"middle stage(s); or {_split_options(m.num_layers, d.pp, d.vpp)}")


@rule("pipeline.uneven-exceeds-layers", "error", ref="B6", source="megatron-core",
      fields=(LAYERS, FIRST, LAST), skill=MEM,
      summary="uneven PP: first + last stage counts cannot exceed num_layers (MCore accepts the "
              "config and builds the wrong number of layers)")
def _uneven_exceeds_layers(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if _mode(m) != "uneven" or m.num_layers is None:
        return None
    layers, _ = _uneven_middle(m)
    if layers >= 0:
        return None
    return Violation(
        f"first={m.num_layers_in_first_pipeline_stage} and "
        f"last={m.num_layers_in_last_pipeline_stage} stage layers exceed num_layers="
        f"{m.num_layers}",
        f"lower {FIRST}/{LAST} so that together they stay at or below {m.num_layers}")


@rule("pipeline.uneven-vs-account-for", "error", ref="B9", source="megatron-core",
      fields=(FIRST, LAST, ACC_EMB, ACC_LOSS), skill=MEM, mcore_enforced=True,
      summary="uneven first/last stage counts cannot be combined with account_for_*_in_pipeline_"
              "split")
def _uneven_vs_account_for(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    uneven = m.num_layers_in_first_pipeline_stage is not None or \
        m.num_layers_in_last_pipeline_stage is not None
    acc = [n for n, on in (("account_for_embedding_in_pipeline_split",
                            m.account_for_embedding_in_pipeline_split),
                           ("account_for_loss_in_pipeline_split",
                            m.account_for_loss_in_pipeline_split)) if on]
    if not uneven or not acc:
        return None
    return Violation(
        f"num_layers_in_first/last_pipeline_stage set together with {' and '.join(acc)}",
        f"use one placement: either {FIRST}/{LAST}, or the account_for_* flags (set the other "
        "to null / false)")


@rule("pipeline.layout-conflict", "error", ref="B10", source="megatron-core",
      fields=(LAYOUT, VPP, FIRST, LAST, ACC_EMB, ACC_LOSS), skill=MEM, mcore_enforced=True,
      summary="pipeline_model_parallel_layout excludes the other placement arguments and fixes "
              "VPP")
def _layout_conflict(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.pipeline_model_parallel_layout is None:
        return None
    others = [f"{n}={v}" for n, v in (
        ("num_layers_in_first_pipeline_stage", m.num_layers_in_first_pipeline_stage),
        ("num_layers_in_last_pipeline_stage", m.num_layers_in_last_pipeline_stage))
        if v is not None] + [f"{n}=True" for n, v in (
            ("account_for_embedding_in_pipeline_split", m.account_for_embedding_in_pipeline_split),
            ("account_for_loss_in_pipeline_split", m.account_for_loss_in_pipeline_split)) if v]
    if others:
        return Violation(f"{LAYOUT} is set together with {', '.join(others)}",
                         "express the placement in the layout alone and unset the other "
                         "arguments")
    implied, vpp = _layout_vpp(m), m.virtual_pipeline_model_parallel_size
    if implied is None or vpp is None or vpp == implied:
        return None
    return Violation(f"virtual_pipeline_model_parallel_size={vpp} but {LAYOUT} implies {implied} "
                     f"(stages / PP {d.pp})",
                     f"unset {VPP} (the layout sets it) or make them agree")


def _layout_problems(m: ModelSection, stages: list[list[str]]) -> list[str]:
    """What MCore's layout validation would reject, in its order (VPP agreement aside)."""
    pp, flat = m.pipeline_model_parallel_size, [s for st in stages for s in st]
    if len(stages) % pp:
        return [f"{len(stages)} stages do not divide over pipeline_model_parallel_size={pp}"]
    problems = []
    if "encoder" in flat:
        problems.append("encoder layers are not supported in a layout")
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        problems.append("the embedding E must appear exactly once, as the first layer")
    if not flat or flat[-1] != "L" or flat.count("L") != 1:
        problems.append("the loss L must appear exactly once, as the last layer")
    if m.num_layers is not None and flat.count("t") != m.num_layers:
        problems.append(f"{flat.count('t')} decoder layers (t) but num_layers={m.num_layers}")
    if flat.count("m") != (m.mtp_num_layers or 0):
        problems.append(f"{flat.count('m')} MTP layers (m) but mtp_num_layers={m.mtp_num_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        problems.append("decoder layers must come before the MTP layers")
    return problems


@rule("pipeline.layout-valid", "error", ref="B10", source="megatron-core",
      fields=(LAYOUT, PP, LAYERS, "model.mtp_num_layers"), skill=MEM, mcore_enforced=True,
      summary="pipeline_model_parallel_layout parses, divides over PP and matches num_layers / "
              "mtp_num_layers")
def _layout_valid(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    if m.pipeline_model_parallel_layout is None:
        return None
    stages, error = _layout(m)
    problems = [error] if stages is None and error else (
        _layout_problems(m, stages) if stages is not None else [])
    if not problems:
        return None
    return Violation(f"{LAYOUT} {m.pipeline_model_parallel_layout!r}: {'; '.join(problems[:3])}",
                     f"write PP·VPP '|'-separated stages (PP={d.pp}) that start with E, end "
                     "with L and hold exactly num_layers t and mtp_num_layers m")


@rule("pipeline.defer-embedding-wgrad", "error", ref="B12", source="megatron-core",
      fields=("model.defer_embedding_wgrad_compute", PP, "model.gradient_accumulation_fusion",
              "model.wgrad_deferral_limit"), skill=None, mcore_enforced=True,
      summary="defer_embedding_wgrad_compute needs PP > 1, gradient_accumulation_fusion and a "
              "non-negative wgrad_deferral_limit")
def _defer_embedding_wgrad(c: TrainingConfig, d: Derived) -> Violation | None:
    extra = c.model.carried()
    if extra.get("defer_embedding_wgrad_compute") is not True:
        return None
    limit = extra.get("wgrad_deferral_limit", 0)
    bad = ([f"pipeline_model_parallel_size={d.pp}"] if d.pp == 1 else []) + (
        ["gradient_accumulation_fusion=False"] if not c.model.gradient_accumulation_fusion
        else []) + ([f"wgrad_deferral_limit={limit}"] if isinstance(limit, int) and limit < 0
                    else [])
    if not bad:
        return None
    return Violation(f"defer_embedding_wgrad_compute=True with {', '.join(bad)}",
                     "set model.defer_embedding_wgrad_compute=false, or use PP > 1 with "
                     "model.gradient_accumulation_fusion=true and wgrad_deferral_limit >= 0")


@rule("pipeline.vpp-not-a-memory-fix", "info", ref="B15", source="skill", fields=(VPP,),
      skill=MEM, summary="VPP is a pipeline-bubble (throughput) knob, not a memory fix")
def _vpp_not_memory_fix(c: TrainingConfig, d: Derived) -> Violation | None:
    if d.baseline is None:
        return None
    old = d.baseline.model.virtual_pipeline_model_parallel_size or 1
    if old == d.vpp:
        return None
    return Violation(
        f"virtual_pipeline_model_parallel_size changed {old} → {d.vpp}: VPP trades pipeline "
        "bubble for a little more activation memory; on Llama3 70B VPP 5 → 10 peaked higher "
        "(60.2 vs 58.8 GB)",
        "to fix memory, set env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and selective "
        "recompute first; tune VPP only for the bubble")


@rule("pipeline.pp-raised-for-memory", "warning", ref="B15", source="skill",
      fields=(PP, "cluster.num_gpus"), skill=MEM,
      summary="raising PP at the cost of DP lengthens gradient accumulation (−5.9 % measured)")
def _pp_raised_for_memory(c: TrainingConfig, d: Derived) -> Violation | None:
    change = d.dp_lowered()
    if change is None or d.baseline is None:
        return None
    old_pp = d.baseline.model.pipeline_model_parallel_size
    if d.pp <= old_pp:
        return None
    return Violation(
        f"pipeline_model_parallel_size raised {old_pp} → {d.pp} with DP {change[0]} → "
        f"{change[1]}: fewer DP replicas mean more accumulation steps; on Llama3 70B PP 4 → 8 "
        "(DP 2 → 1) measured −5.9 %",
        "keep DP: set env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True and "
        "model.recompute_granularity=selective first, and raise PP only if it still does not fit")

