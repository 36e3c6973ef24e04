"""``answer_markdown`` for a recommend plan and an OOM diagnosis: the skills' first-answer
checklists (memory-tuning, activation-recompute) in their order - allocator, the selective
module for the architecture, layernorm then mlp, full recompute with its fields, the FP8 /
CUDA-graph warning, offload - then what is not a memory fix."""

from __future__ import annotations

from mbridge_perf.advise.oom_result import OOMDiagnosis
from mbridge_perf.advise.recommend_result import RecomputePlan, RecomputeStep
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.semantics import full_iteration_graph, graph_impl

GRAPH_WARNING = (
    "**FP8 / CUDA graphs:** full (layer-level) recompute asserts with per-layer CUDA graphs "
    '("full recompute is only supported with full iteration CUDA graph"); FP8 recipes often '
    'turn on Transformer Engine graphs (LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1: cuda_graph_impl='
    '"transformer_engine", scope mlp). Valid ways out: selective recompute, '
    'cuda_graph_impl="none", or cuda_graph_impl="full_iteration" (graph modules empty, '
    "rerun_state_machine.check_for_nan_in_loss=False).")

NOT_FIXES = (
    "**Not memory fixes** (memory-tuning skill): do not raise TP for memory - TP 4 -> 8 cost "
    "-28.4 % on Llama3 70B (NVLink all-reduce volume); do not trade DP for PP - halving DP "
    "doubles the gradient-accumulation steps (-5.9 %); VPP does not cut memory (VPP 10 used "
    "more: 60.2 vs 58.8 GB).")


def _verdict(plan: RecomputePlan) -> str:
    b = plan.baseline
    lo, hi = b.reserved_band_gib
    head = (f"**Verdict: {b.verdict.replace('_', ' ')}** - {b.verdict_term}. Estimated peak "
            f"allocated {b.est_peak_gib:.1f} GiB on the most-loaded stage, "
            f"+ {b.overheads_gib:.1f} GiB outside the allocator, + {lo:.1f}-{hi:.1f} GiB "
            f"reserved-but-unallocated band = up to {b.est_need_gib:.1f} GiB of "
            f"{plan.budget_gib:.1f} GiB ({plan.budget_source}).")
    why = {"fragmentation": "The peak itself fits; the risk is the allocator's reserved band "
                            "(fragmentation), so the allocator setting comes first.",
           "capacity": "The peak itself does not fit: this is a capacity problem.",
           "tight": "It fits with the band's high end but inside the estimator's margin; the "
                    "first step below buys margin.",
           "fits": "It already fits with margin: nothing to change for memory."}
    return f"{head} **Scenario: {plan.scenario}.** {why[plan.scenario]}"


def _step(s: RecomputeStep) -> str:
    mark = {"fits": "fits", "tight": "tight (fits inside the estimate's uncertainty)",
            "does_not_fit": "does not fit yet"}[s.verdict]
    if s.optional:
        mark = f"optional margin, {mark}"
    cost = s.throughput_cost
    cost_txt = cost.text + ("" if cost.basis == "none" else f" [{cost.basis}]")
    return (f"{s.index + 1}. **{s.action}** - {mark}: peak {s.est_peak_gib:.1f} GiB "
            f"(saves {s.est_saving_gib:.1f} GiB), need {s.est_need_gib:.1f} GiB; cost: "
            f"{cost_txt}. {s.rationale}\n   Overrides: "
            + ", ".join(f"`{o}`" for o in s.overrides))


def plan_markdown(plan: RecomputePlan, cfg: TrainingConfig) -> str:
    """The whole answer for a recommend plan."""
    lines = ["## Memory plan", "", _verdict(plan), ""]
    if plan.baseline.findings:
        lines += ["Validator errors in the config as given (fix these too): "
                  + "; ".join(plan.baseline.findings), ""]
    first = plan.first_fitting_step
    if plan.scenario == "fits":
        lines += [f"- {n}" for n in plan.notes]
        lines += ["", NOT_FIXES]
        return "\n".join(lines)
    lines += ["Apply the steps in order and stop at the first that fits or is tight"
              + (f" (step {first + 1}: {plan.steps[first].verdict}); the steps after it are "
                 "optional margin, not needed." if first is not None else "; none fits here."),
              ""]
    allocator_notes = [n for n in plan.notes if "expandable_segments" in n]
    lines += [f"- {n}" for n in allocator_notes]
    shown_attn = False
    for s in plan.steps:
        if s.rung != "allocator" and not shown_attn:
            lines += [f"- {n}" for n in plan.notes if "core_attn" in n]
            shown_attn = True
        lines.append(_step(s))
    if not shown_attn:
        lines += [f"- {n}" for n in plan.notes if "core_attn" in n]
    m = cfg.model
    if m.recompute_granularity == "full" or any(s.rung == "full" for s in plan.steps) or (
            graph_impl(m) != "none" and not full_iteration_graph(m)):
        lines += ["", GRAPH_WARNING]
    rest = [n for n in plan.notes if "expandable_segments" not in n and "core_attn" not in n]
    lines += [""] + [f"- {n}" for n in rest]
    if plan.skipped:
        lines += ["", "Not applicable here: " + "; ".join(plan.skipped) + "."]
    lines += ["", NOT_FIXES]
    return "\n".join(lines).replace("\n\n\n", "\n\n")


def oom_markdown(diag: OOMDiagnosis, notes: list[str]) -> str:
    """The answer for a diagnosis: verdict, the numbers read, the failure-table row, then the
    plan's answer when a config was given."""
    n = diag.numbers
    lines = ["## OOM diagnosis", "", f"**{diag.classification}**: {diag.reason}."]
    read = [f"{label} {value:.2f} GiB" for label, value in (
        ("requested", n.requested_gib), ("allocated", n.allocated_gib),
        ("reserved", n.reserved_gib), ("reserved but unallocated", n.reserved_unallocated_gib),
        ("free", n.free_gib), ("capacity", n.total_capacity_gib)) if value is not None]
    if n.rank is not None:
        read.append(f"failing rank {n.rank}")
    if read:
        lines += ["", f"Read from the message ({diag.message_format}): " + ", ".join(read) + "."]
    if diag.ranks:
        lines += ["", "Per-rank memory lines (last per rank, GiB): " + "; ".join(
            f"rank {r.rank}: max allocated {r.max_allocated_gib}, max reserved "
            f"{r.max_reserved_gib}" for r in diag.ranks[:16])
            + (" ..." if len(diag.ranks) > 16 else "")]
    if diag.failure_mode is not None:
        f = diag.failure_mode
        lines += ["", f"Skill {f.skill}, failure `{f.name}` ({f.symptom}) - fix: {f.fix}"]
    lines += _reconciliation(diag)
    lines += [f"- {x}" for x in notes]
    if diag.plan is not None:
        lines += ["", diag.plan.answer_markdown]
    return "\n".join(lines)


_TERMS = {"allocated": "allocated by PyTorch", "reserved_unallocated": "reserved but unallocated",
          "outside_pytorch": "outside PyTorch", "in_use": "in use (capacity - free)",
          "capacity": "GPU capacity"}


def _reconciliation(diag: OOMDiagnosis) -> list[str]:
    """The message's numbers next to the estimate, term by term, and the budget the plan was
    priced against."""
    if not diag.reconciliation:
        return []
    lines = ["", f"**Measured vs estimated** (GiB; estimate: {diag.estimate_phase}):", "",
             "| term | measured | estimated | difference |", "|---|---|---|---|"]
    for r in diag.reconciliation:
        est = (f"{r.estimated_range_gib[0]:.2f}-{r.estimated_range_gib[1]:.2f}"
               if r.estimated_range_gib else f"{r.estimated_gib:.2f}")
        lines.append(f"| {_TERMS[r.term]} | {r.measured_gib:.2f} | {est} | "
                     f"{r.difference_gib:+.2f} |")
    lines += [""] + [f"- {_TERMS[r.term]}: {r.note}." for r in diag.reconciliation]
    b = diag.plan_budget
    if b is not None:
        lines += ["", f"The plan below is judged on the measured state: its budget is "
                      f"{b.target_gib:.2f} GiB = capacity {b.capacity_gib:.2f} - "
                      f"{b.measured_outside_gib:.2f} measured outside PyTorch + "
                      f"{b.estimated_outside_gib:.2f} the estimate's own outside term (which "
                      "every step's need already counts), so a step fits when its allocated + "
                      f"graph pool + reserved band fit in the {b.pytorch_budget_gib:.2f} GiB "
                      "PyTorch can have."]
    if diag.plan is not None and diag.plan.scenario == "fits" and \
            diag.classification != "none":
        lines += ["", "The estimate fits this config, yet the run ran out of memory: the "
                      "estimate is low for this run - go by the measured terms above."]
    return lines
