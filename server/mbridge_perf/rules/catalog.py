"""The rule catalog: each rule is a pure check over (TrainingConfig, Derived) with a stable id.

Rules register themselves with ``@rule(...)`` in the area modules (``world.py``,
``recompute.py``, …); ``validate()`` runs them in registration order, which follows Megatron
Bridge's own evaluation order so the first error matches what a real launch reports.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig

Severity = Literal["error", "warning", "info"]
Source = Literal["megatron-core", "megatron-bridge", "perf-harness", "skill", "project"]

MEM = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"
LONG_CONTEXT = "nemo-mbridge-perf-moe-long-context"
WORKFLOW = "nemo-mbridge-perf-moe-optimization-workflow"

_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*\.[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class Violation:
    """What a check returns when the rule is broken: the problem in the user's own values
    and the config change that fixes it."""

    message: str
    fix: str
    fields: tuple[str, ...] | None = None  # defaults to the rule's fields
    # softer than the rule's own severity when this instance is not certain to fail (e.g. the
    # world size is only the one a dump implies); never harsher
    severity: Severity | None = None


Check = Callable[[TrainingConfig, Derived], "Violation | None"]


@dataclass(frozen=True)
class Rule:
    id: str
    severity: Severity
    ref: str  # row in the constraint catalog (A1 … X4)
    source: Source
    fields: tuple[str, ...]
    summary: str
    skill: str | None
    check: Check = field(repr=False)
    # Megatron-Core itself raises for this rule when its config dataclasses are built (used by
    # the parity test against the real package).
    mcore_enforced: bool = False


RULES: list[Rule] = []


def rule(rule_id: str, severity: Severity, *, ref: str, source: Source,
         fields: tuple[str, ...], summary: str, skill: str | None = None,
         mcore_enforced: bool = False) -> Callable[[Check], Check]:
    """Register a check under a stable id."""
    if not _ID.match(rule_id):
        raise ValueError(f"rule id {rule_id!r} must look like 'area.slug'")
    if any(r.id == rule_id for r in RULES):
        raise ValueError(f"duplicate rule id {rule_id!r}")

    def register(fn: Check) -> Check:
        RULES.append(Rule(rule_id, severity, ref, source, fields, summary, skill, fn,
                          mcore_enforced))
        return fn

    return register


def get_rule(rule_id: str) -> Rule:
    for r in RULES:
        if r.id == rule_id:
            return r
    raise KeyError(rule_id)


def describe_rules() -> list[dict[str, object]]:
    """The catalog as plain data (the MCP rules resource and `validate --list-rules`)."""
    return [{"id": r.id, "severity": r.severity, "ref": r.ref, "source": r.source,
             "fields": list(r.fields), "summary": r.summary, "skill": r.skill,
             "mcore_enforced": r.mcore_enforced} for r in RULES]
