"""validate(config) -> report: every rule of the catalog over one TrainingConfig."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from mbridge_perf.config.derived import derive
from mbridge_perf.config.model import Section, TrainingConfig
from mbridge_perf.rules.catalog import RULES, Severity


class Finding(BaseModel):
    rule_id: str = Field(description="stable rule id, e.g. offload.cpu-needs-pp1")
    severity: Severity = Field(description="error: Megatron refuses or the job cannot start; "
                                           "warning: documented hazard; info: advice")
    message: str = Field(description="what is wrong with these values")
    fields: list[str] = Field(description="config fields involved (Bridge dotted names)")
    fix: str = Field(description="the config change that resolves it")
    skill: str | None = Field(description="skill that documents the rule")
    ref: str = Field(description="row of the constraint catalog")
    source: str = Field(description="who enforces or documents it")


class ValidationReport(BaseModel):
    ok: bool = Field(description="true when no finding is an error")
    errors: int
    warnings: int
    findings: list[Finding]
    derived: dict[str, Any] = Field(description="DP, EDP, microbatches, layer placement, …")
    not_used: list[str] = Field(description="fields accepted and carried through but not "
                                            "checked by any rule")


def not_used_fields(cfg: TrainingConfig) -> list[str]:
    """Dotted names the user gave that no tool models (kept, reported, never an error)."""
    out: list[str] = []
    for name in type(cfg).model_fields:
        section = getattr(cfg, name)
        if isinstance(section, Section):
            out += [f"{name}.{k}" for k in section.carried()]
    out += sorted(cfg.carried())
    return sorted(out)


def validate(cfg: TrainingConfig, baseline: TrainingConfig | None = None,
             mcore_version: str | None = None) -> ValidationReport:
    """Run every rule; ``baseline`` (the config before the user's change) enables the rules
    about changes, such as raising TP or VPP to fix memory. ``mcore_version`` picks the
    Megatron-Core release whose checks apply (default 0.19.2, the one Bridge 0.6.2 ships)."""
    d = derive(cfg, baseline, mcore_version)
    findings: list[Finding] = []
    for r in RULES:
        v = r.check(cfg, d)
        if v is None:
            continue
        findings.append(Finding(rule_id=r.id, severity=v.severity or r.severity,
                                message=v.message,
                                fields=list(v.fields or r.fields), fix=v.fix, skill=r.skill,
                                ref=r.ref, source=r.source))
    errors = sum(f.severity == "error" for f in findings)
    return ValidationReport(ok=errors == 0, errors=errors,
                            warnings=sum(f.severity == "warning" for f in findings),
                            findings=findings, derived=d.as_dict(),
                            not_used=not_used_fields(cfg))


def format_report(report: ValidationReport) -> str:
    """The readable rendering the CLI prints (the JSON is the model itself)."""
    lines = []
    counts = {s: sum(f.severity == s for f in report.findings) for s in ("error", "warning",
                                                                         "info")}
    verdict = "OK" if report.ok else "NOT OK"
    lines.append(f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), "
                 f"{counts['info']} note(s)")
    for f in report.findings:
        lines.append(f"  {f.severity.upper():7} {f.rule_id} [{f.ref}]  {f.message}")
        lines.append(f"          fix: {f.fix}")
    d = report.derived
    layout = ", ".join(f"{k}={d[k]}" for k in ("data_parallel_size", "expert_data_parallel_size",
                                                  "num_microbatches", "min_gpus")
                       if d.get(k) is not None)
    if layout:
        lines.append(f"derived: {layout}; layers per stage {d.get('layers_per_stage')}")
    if report.not_used:
        shown = ", ".join(report.not_used[:8])
        more = f" (+{len(report.not_used) - 8} more)" if len(report.not_used) > 8 else ""
        lines.append(f"accepted, not checked by any rule: {shown}{more}")
    return "\n".join(lines)
