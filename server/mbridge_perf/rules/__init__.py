"""Constraint catalog and validate(config). Importing this package registers every rule."""

# Area modules, imported to register their rules; the order follows Megatron Bridge's own
# evaluation order (precision, recompute and graph checks, then Megatron-Core's config checks,
# then the world-size, FSDP, CP and packing checks) so the first error is the one a launch would
# hit. (recompute registered right after precision ever since the graph rules imported their
# shared views from it; those views now live in config.semantics, so the order is said here.)
from mbridge_perf.rules import (  # noqa: F401, I001
    precision,
    recompute,
    cudagraph,
    tp,
    pipeline,
    offload,
    moe,
    moe_overlap,
    attention,
    env,
    world,
    fsdp,
    cp,
    packing,
    misc,
    release,
)
from mbridge_perf.rules.catalog import RULES, Rule, get_rule
from mbridge_perf.rules.validate import Finding, ValidationReport, validate


def rule_ids() -> set[str]:
    """Every rule id of the catalog (the skill linter checks cards against it)."""
    return {r.id for r in RULES}


__all__ = ["RULES", "Finding", "Rule", "ValidationReport", "get_rule", "rule_ids", "validate"]
