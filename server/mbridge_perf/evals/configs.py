"""The config an answer writes, checked by the project's own validator.

Why: a forbidden combination (pad-to-capacity with flex + DeepEP, EP overlap with ``moe`` in
``recompute_modules``, delayed FP8 with ``layernorm`` recompute) is the same mistake in any
wording, and ``validate_config`` already knows every one of them with Megatron-Core parity. So
the settings an answer assigns in code (a line ``cfg.model.X = value``; an inline mention
such as "`model.cpu_offloading=True` raises" is no setting) are applied to a neutral base
(BF16 mixed precision, as every Bridge recipe; a MoE model when
the answer sets MoE knobs) and validated. An error counts against the answer only when at
least two of the fields it names were set by the answer itself: a combination the answer
wrote, not a default of our base or a field it left unsaid - so every ``field=value`` the
error message names must be one the answer set ("check_for_nan_in_loss=True (the default)" or
an unset EP 1 is an omission, judged elsewhere, not a wrong combination).

Bounded: at most MAX_SETTINGS settings are read, values are Python literals of at most 200
characters (``ast.literal_eval``: no names, no calls), and the validator runs once.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

from mbridge_perf.evals.keys import allowlist
from mbridge_perf.evals.text import Unit, clip, is_recommended

MAX_SETTINGS = 64
_PY_SET = re.compile(r"^\s{0,8}(?:(?:cfg|config|conf|recipe|c)\.)?([a-z_]{2,20})\."
                     r"([a-z][a-z0-9_]{1,60})\s{0,4}=\s{0,4}([^#\n]{1,200}?)\s{0,40}(?:#.*)?$")
_NAMED = re.compile(r"\b([a-z][a-z0-9_]{2,60})=")
_MOE_BASE = {"model.num_moe_experts": 64, "model.moe_router_topk": 8,
             "model.moe_grouped_gemm": True}


@dataclass(frozen=True, slots=True)
class ConfigFinding:
    """A validator error on settings the answer wrote."""

    rule_id: str
    message: str
    unit: Unit

    @property
    def evidence(self) -> str:
        return (f"writes a config validate_config refuses ({self.rule_id}: "
                f"{clip(self.message, 160)}), in: {clip(self.unit.text, 160)}")


def _value(raw: str) -> tuple[bool, Any]:
    raw = raw.strip().rstrip(",;")
    low = raw.lower()
    if low in ("true", "false"):
        return True, low == "true"
    if low in ("none", "null"):
        return True, None
    try:
        return True, ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False, None


def settings(units: list[Unit]) -> dict[str, tuple[Any, Unit]]:
    """``section.field`` -> (value, the unit that set it), for known fields only; a setting
    inside a rejected clause or quoted output is no setting (the last one wins)."""
    al = allowlist()
    out: dict[str, tuple[Any, Unit]] = {}
    for u in units:
        if u.quoted or u.negated_section or len(out) >= MAX_SETTINGS:
            continue
        text = u.text.replace("`", "")
        m = _PY_SET.match(text)
        if m:
            sec, name, raw = m.groups()
            pos = u.norm.find(name)
            ok, value = _value(raw)
            if ok and name in al.sections.get(sec, ()) and (
                    pos < 0 or is_recommended(u, pos, pos + len(name))):
                out[f"{sec}.{name}"] = (value, u)
    return out


def config_errors(units: list[Unit], limit: int = 3) -> list[ConfigFinding]:
    """Validator errors on a combination of at least two settings the answer wrote."""
    from mbridge_perf.advise.changes import apply_changes
    from mbridge_perf.config.errors import ConfigError
    from mbridge_perf.config.load import load_config
    from mbridge_perf.rules.validate import validate

    got = settings(units)
    if len(got) < 2:
        return []
    cfg = load_config(data={"mixed_precision": {"bf16": True, "fp8": None}})
    if any("moe" in k or "expert" in k for k in got):
        cfg = apply_changes(cfg, _MOE_BASE)
    for key, (value, _) in list(got.items()):
        try:
            cfg = apply_changes(cfg, {key: value})
        except (ConfigError, ValueError, TypeError, AttributeError):
            del got[key]  # not applied: not judged either
    out: list[ConfigFinding] = []
    names = {k.rsplit(".", 1)[-1] for k in got}
    for f in validate(cfg).findings:
        mine = [k for k in f.fields if k in got]
        # every value the message names ("X=True with Y=1") is one the answer wrote
        named = set(_NAMED.findall(f.message))
        if f.severity == "error" and len(mine) >= 2 and named <= names:
            out.append(ConfigFinding(f.rule_id, f.message, got[mine[-1]][1]))
            if len(out) >= limit:
                break
    return out
