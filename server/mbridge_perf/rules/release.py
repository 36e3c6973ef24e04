"""Values newer than the Megatron-Core release the config is judged by (0.19.2 by default).

A Literal-typed TransformerConfig field whose value another release we read accepts but this one
does not (``moe_router_score_function: sqrtsoftplus``, ``moe_flex_dispatcher_backend: ncclep``
on 0.16.1) is a version gap: one error naming the release that has it. Values no release knows
are left to the area rules and the config types.
"""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.mcore import mcore_facts, supported_versions
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import Violation, rule

# Fields with a rule of their own for their values.
_OWN_RULE = frozenset({"cuda_graph_impl"})


def _gaps(c: TrainingConfig, d: Derived) -> list[tuple[str, object, list[str]]]:
    """(field, value, releases that accept it) for every modelled value this release lacks."""
    out = []
    for name, allowed in d.mcore.choices.items():
        value = getattr(c.model, name, None)
        if name in _OWN_RULE or value is None or value in allowed:
            continue
        newer = [v for v in supported_versions() if value in mcore_facts(v).choices.get(name, ())]
        if newer:
            out.append((name, value, newer))
    return out


@rule("release.value-not-in-release", "error", ref="P", source="megatron-core",
      fields=("model.moe_router_score_function", "model.moe_flex_dispatcher_backend"),
      skill=None, summary="a value the chosen Megatron-Core release does not accept yet "
                          "(e.g. sqrtsoftplus routing or the ncclep backend on 0.16.1)")
def _value_not_in_release(c: TrainingConfig, d: Derived) -> Violation | None:
    gaps = _gaps(c, d)
    if not gaps:
        return None
    said = "; ".join(f"{n}={v!r} needs Megatron-Core {' or '.join(r)} (accepted by "
                     f"{d.mcore.version}: {', '.join(map(str, d.mcore.choices[n]))})"
                     for n, v, r in gaps)
    return Violation(said, "upgrade Megatron-Core, or choose a value this release accepts",
                     fields=tuple(f"model.{n}" for n, _, _ in gaps))
