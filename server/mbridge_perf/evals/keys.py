"""The knob allowlist: config keys, perf flags and label values an answer may recommend, taken
from the validator's known fields and label sets so an invented knob fails the answer."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from importlib import resources

from mbridge_perf.evals.text import Unit, is_recommended

# (a Python recipe's "cfg.model.X": the config object's name before the section is no section)
_DOTTED = re.compile(r"(?<![A-Za-z0-9_.])(?:(?:cfg|config|conf|recipe|c)\.)?([a-z_]+)\."
                     r"([A-Za-z_][A-Za-z0-9_]*)\b")
# ("up_proj: not a recompute label" is a verdict on the name, not a setting)
# (a script's variable computed from others - "hidden_share = hidden / sum(...)", "comm_u =
# union(...)" - is no knob: its value is a call or an expression of names)
_ASSIGN = re.compile(r"(?<![A-Za-z0-9_.\-])([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\s*"
                     r"(?:=(?!=|\s{0,4}[a-z_][\w.]{0,60}\s{0,4}(?:\(|[-+*/%] ))"
                     r"|:\s(?!\s*(?:not|no|invalid|unknown|wrong|does not|doesn't)\b))")
_LIST_VALUE = re.compile(r"\b(recompute_modules|cuda_graph_modules)\s{0,8}[=:]\s{0,8}"
                         r"\[([^\]]{0,400})\]")
# the perf-harness flag form: "--recompute_modules mla_up_proj,moe_act" (comma-separated)
_FLAG_LIST = re.compile(r"--(recompute_modules|cuda_graph_modules)(?:=|\s{1,8})"
                        r"[\"']?([a-z_]{1,40}(?:,[a-z_]{1,40}){0,9})\b")
# a second label after a space ("--recompute_modules layernorm moe_act"): argparse keeps the
# first and rejects the second as an unrecognised argument
_NEXT_WORD = re.compile(r" {1,8}([a-z_]{2,40})\b(?![=:(])")
# what follows a flag's value on a command line: the next flag, a continuation, the end
_FLAG_END = re.compile(r"[\"']?\s{0,40}(?:$|-|\\|[;&|#])")  # bounded: linear under search too
_ENUM_VALUE = re.compile(r"\b(recompute_granularity|recompute_method|cuda_graph_impl)\s*[=:]\s*"
                         r"[\"'`]?([A-Za-z_]+)")
_STRIP = re.compile(r"[`*]")
# "train.log", "model.yaml": a file a command reads or writes, not section.field
_FILE_EXT = frozenset({"yaml", "yml", "log", "txt", "out", "err", "json", "jsonl", "csv", "md",
                       "py", "sh", "sqlite", "qdrep", "nsys", "pt", "pkl"})

# Keys that are not config fields but legitimately appear as key=value in answers.
_EXTRA = {"expandable_segments", "garbage_collection_threshold", "max_split_size_mb",
          "num_gpus", "gpus_per_node", "tool_calls", "seq_len",
          # our tools' own arguments, which their answers name
          "target_gib", "golden_tflops", "regression_pct", "dry_run", "run_id", "wait_s",
          # the argument of Bridge's estimate_training_memory(cfg, num_microbatches=...), which
          # the memory-tuning skill tells answers to call
          "num_microbatches"}
# our MCP tools, which answers name with a colon ("`validate_config`: recompute.full-needs-...");
# tests/evals/test_round35.py keeps it equal to server_tools.TOOLS
OUR_TOOLS = frozenset({
    "validate_config", "estimate_memory", "estimate_step_time", "recommend_recompute",
    "diagnose_oom", "plan_parallelism", "list_presets", "grade_answer", "submit_benchmark",
    "benchmark_status", "benchmark_result", "cancel_benchmark", "compare_benchmarks"})


@dataclass(frozen=True)
class Allowlist:
    sections: dict[str, frozenset[str]]
    fields: frozenset[str]
    enums: dict[str, frozenset[str]]

    @property
    def labels(self) -> frozenset[str]:
        """Every label value ("core_attn", "moe_act"): a label leading a line ("core_attn: ~0
        with fused attention") is a label, not an invented key."""
        return frozenset().union(*self.enums.values())


@cache
def allowlist() -> Allowlist:
    from mbridge_perf.config.flags import flag_names
    from mbridge_perf.config.semantics import GRAPH_IMPLS, RECOMPUTE_LABELS
    from mbridge_perf.rules.cudagraph import GRAPH_MODULE_NAMES

    text = resources.files("mbridge_perf.config").joinpath("known_fields.json").read_text(
        encoding="utf-8")
    data = json.loads(text)
    sections = {k: frozenset(v) for k, v in data["sections"].items()}
    sections["cluster"] = frozenset({"num_gpus", "gpus_per_node", "gpu"})
    flags = {f.lstrip("-").replace("-", "_") for f in flag_names()}
    fields = frozenset(set().union(*sections.values()) | flags | _EXTRA | OUR_TOOLS)
    enums = {
        "recompute_modules": frozenset(RECOMPUTE_LABELS),
        "cuda_graph_modules": frozenset(GRAPH_MODULE_NAMES),
        "recompute_granularity": frozenset({"full", "selective", "none", "null"}),
        "recompute_method": frozenset({"uniform", "block", "none", "null"}),
        "cuda_graph_impl": frozenset(GRAPH_IMPLS),
    }
    return Allowlist(sections, fields, enums)


def is_known_key(name: str) -> bool:
    """A Megatron Bridge config field, section, perf-harness flag or our tools' argument."""
    al = allowlist()
    return name in al.fields or name in al.sections


@dataclass(frozen=True)
class BadKey:
    what: str
    unit: Unit


def _bad_labels(key: str, labels: Iterable[str], allowed: frozenset[str]) -> list[tuple[str, str]]:
    """The labels of a list-valued key (or its harness flag) that the key does not accept;
    "[...]" is a placeholder, and so is a list of one-letter names ("--recompute_modules a,b")."""
    names = [label for label in labels if label.strip(".…")]
    if names and all(len(n) == 1 for n in names):
        return []
    return [(label, f"{key} label {label!r} (valid: {', '.join(sorted(allowed))})")
            for label in names if label not in allowed]


def invented_keys(units: list[Unit]) -> list[BadKey]:
    """Knobs the answer recommends that the pinned Megatron Bridge / Megatron-Core do not have."""
    al = allowlist()
    bad: list[BadKey] = []
    for u in units:
        if u.quoted:     # quoted program output names no knob the answer recommends
            continue
        raw = " ".join(_STRIP.sub("", u.text).split())
        low = raw.lower()
        found: list[tuple[str, str]] = []
        for m in _DOTTED.finditer(raw):
            sec, name = m.group(1), m.group(2)
            if sec in al.sections and name not in al.sections[sec] and name not in _FILE_EXT:
                found.append((name, f"{sec}.{name} (no such field in {sec})"))
        for m in _ASSIGN.finditer(raw):
            if (m.group(1) not in al.fields and m.group(1) not in al.sections
                    and m.group(1) not in al.labels and not _after_dot(raw, m.start())):
                found.append((m.group(1), f"{m.group(1)} (no such config field or flag)"))
        for m in _LIST_VALUE.finditer(low):
            found += _bad_labels(m.group(1), (x.strip(" \"'") for x in m.group(2).split(",")),
                                 al.enums[m.group(1)])
        for m in _FLAG_LIST.finditer(low):
            found += _flag_list_errors(m, low, al.enums[m.group(1)])
        for m in _ENUM_VALUE.finditer(low):
            if m.group(2) not in al.enums[m.group(1)]:
                found.append((m.group(2), f"{m.group(1)}={m.group(2)} (valid: "
                                          f"{', '.join(sorted(al.enums[m.group(1)]))})"))
        bad.extend(BadKey(what, u) for name, what in found if _recommended_at(u, name))
    return bad


def _flag_list_errors(m: re.Match[str], low: str, allowed: frozenset[str]) -> list[tuple[str, str]]:
    """A harness list flag's bad labels, or its labels split by a space (argparse keeps the
    first and rejects the rest); a single plain word after the flag in prose
    ("--recompute_modules takes a list") is no value."""
    flag, value = m.group(1), m.group(2)
    nxt = _NEXT_WORD.match(low, m.end())
    if nxt and "," not in value and value in allowed and nxt.group(1) in allowed:
        return [(flag, f"--{flag} {value} {nxt.group(1)} (the perf harness takes one "
                       f"comma-separated value: {value},{nxt.group(1)})")]
    if "," not in value and "_" not in value and not _FLAG_END.match(low, m.end()):
        return []
    return _bad_labels(f"--{flag}", value.split(","), allowed)


def _after_dot(raw: str, start: int) -> bool:
    return start > 0 and raw[start - 1] == "."


def _recommended_at(u: Unit, name: str) -> bool:
    """A key inside a rejected or reported clause ("not recompute_modules=[up_proj]") is a
    mention, not advice."""
    pos = u.norm.find(name.lower())
    return is_recommended(u, max(pos, 0), max(pos, 0) + len(name))
