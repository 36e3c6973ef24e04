"""Layout arithmetic an answer states, recomputed from the sizes it states itself.

Why: a wrong data-parallel formula or accumulation count is the same mistake in any wording,
and the answer's own numbers decide it - no phrase list needed:
- a DP or EDP formula that leaves out a dimension the answer sizes above 1 (dense DP = world /
  (TP·PP) while CP = 16; EDP = world / (ETP·EP) while PP = 2);
- an accumulation count that is not GBS / (MBS · DP) for the GBS and MBS the answer states and
  the DP it names beside the count ("DP 1 means 16 accumulation steps" with GBS 32, MBS 1).
Every scan is one bounded regex pass per unit, linear in the answer.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from mbridge_perf.evals.claims import Arithmetic
from mbridge_perf.evals.text import Unit, clip


@dataclass(frozen=True)
class FormulaError:
    """A layout formula that leaves out a dimension the answer itself uses (dense DP written
    as world / (TP·PP) while CP > 1, EDP as world / (ETP·EP) while PP > 1)."""

    formula: str
    missing: str
    why: str
    unit: Unit

    @property
    def evidence(self) -> str:
        return (f"states {self.formula}, which leaves out {self.missing} — wrong: "
                f"{self.why}, in: {clip(self.unit.text, 200)}")


_DIMS = r"(?:tp|pp|cp|ep|etp|vpp)(?:=?\d+)?"
# "dense DP = world / (TP·PP)", "| dense DP at 512 GPUs | world / (TP·PP) |", "EDP = world /
# (ETP·EP)": the mesh and the symbolic denominator of its data-parallel formula
_DP_FORMULA = re.compile(
    rf"(?<![a-z])(expert dp|e?dp)(?:=\d+)?\b[^=/.;|]{{0,40}}?(?:=|\|) ?"
    rf"(?:world(?:[_ ]size)?|n|gpus|total gpus|\d{{1,6}}) ?/ ?"
    rf"(\(?{_DIMS}(?: ?[·*×x] ?{_DIMS}){{0,4}}\)?(?: ?[·*×x/] ?{_DIMS}){{0,3}})(?![a-z0-9])")
# A size the answer states: "TP=4" (normalised from "TP 4", "4-way TP"), and CP from the
# sequence ("CP = 131072 / 4096 = 32": in a chain the size is the result, not an operand).
_SIZE = re.compile(r"(?<![a-z])(tp|pp|cp|ep|etp)=(\d{1,6})\b(?! ?[/×*·÷])")
_CP_SIZE = re.compile(r"\bcp\b[^.;|=]{0,40}=(?:[^.;|=]{0,40}=)?"
                      r" ?(\d{1,6})\b(?! ?[/×*·÷])")
# each mesh's data-parallel size divides the world by these (Parallel Folding)
_MESH = {"dp": ("tp", "pp", "cp"), "edp": ("etp", "ep", "pp")}
_MESH_WHY = {"dp": "the dense mesh is TP × CP × DP × PP, so dense DP = world / (TP·PP·CP)",
             "edp": "the expert mesh is ETP × EP × EDP × PP, so EDP = world / (ETP·EP·PP)"}


def _sizes(units: list[Unit]) -> dict[str, int]:
    """The largest size the answer states for each parallel dimension."""
    out: dict[str, int] = {}
    for u in units:
        for m in _SIZE.finditer(u.norm):
            out[m.group(1)] = max(out.get(m.group(1), 1), int(m.group(2)))
        for m in _CP_SIZE.finditer(u.norm):
            out["cp"] = max(out.get("cp", 1), int(m.group(1)))
    return out


def formula_errors(units: list[Unit], limit: int = 4) -> list[FormulaError]:
    """DP and EDP formulas that leave out a dimension the answer sizes above 1. One bounded
    regex pass per unit, so the scan is linear in the answer."""
    sizes = _sizes(units)
    if not any(n > 1 for n in sizes.values()):
        return []
    out: list[FormulaError] = []
    for u in units:
        # the raw text: normalising drops "*" as emphasis, and "TP*PP*CP" is a product
        low = u.text.lower()
        if "/" not in low:
            continue
        for m in _DP_FORMULA.finditer(low):
            mesh = "edp" if m.group(1) == "expert dp" else m.group(1)
            missing = _left_out(mesh, set(re.findall(r"[a-z]+", m.group(2))), sizes)
            if missing:
                out.append(FormulaError(f"{mesh.upper()} = world / {m.group(2).strip()}",
                                        missing, _MESH_WHY[mesh], u))
                if len(out) >= limit:
                    return out
    return out


def _left_out(mesh: str, used: set[str], sizes: dict[str, int]) -> str:
    """What a mesh's formula gets wrong: a dimension of its own mesh the answer sizes above 1
    and the formula leaves out, or - for EDP - the attention TP in place of an ETP the answer
    sizes differently ("EDP = world / (TP·EP·PP)" with TP 2, ETP 1)."""
    gone = [f"{d.upper()} (= {sizes[d]})" for d in _MESH[mesh]
            if d not in used and sizes.get(d, 1) > 1]
    if (mesh == "edp" and "tp" in used and "etp" not in used and "etp" in sizes
            and sizes["etp"] != sizes.get("tp", 1)):
        gone.append(f"ETP (= {sizes['etp']}; it divides by the attention TP "
                    f"= {sizes.get('tp', 1)})")
    return ", ".join(gone)


# "GBS 32", "global_batch_size=512", "MBS 1", "micro_batch_size: 2" (normalised text)
_GBS = re.compile(r"\b(?:gbs|global[_ ]batch(?:[_ ]size)?)\s?(?:=|:|of|is)?\s?(\d{1,7})\b")
_MBS = re.compile(r"\b(?:mbs|micro[_ ]batch[_ ]size|micro[_ ]batch)\s?(?:=|:|of|is)?\s?"
                  r"(\d{1,5})\b")
# "16 gradient-accumulation micro-batches", "32 accumulation steps"
_ACCUM = re.compile(r"\b(\d{1,6})\s?(?:gradient[- ]|grad[- ])?accumulation[- ]"
                    r"(?:steps?|micro-?batch(?:es)?)\b")
_DP_IS = re.compile(r"(?<![a-z])dp=(\d{1,6})\b(?! ?->)")
_REACH = 120


def _one(rx: re.Pattern[str], units: list[Unit]) -> int | None:
    """The single value the answer states for a size (None when it states none or several)."""
    seen = {int(m.group(1)) for u in units for m in rx.finditer(u.norm)}
    return seen.pop() if len(seen) == 1 else None


def accumulation_errors(units: list[Unit], limit: int = 2) -> list[Arithmetic]:
    """An accumulation count stated next to its DP ("DP 1 means 16 accumulation steps") that is
    not GBS / (MBS · DP) for the one GBS and MBS the answer states."""
    gbs, mbs = _one(_GBS, units), _one(_MBS, units)
    if not gbs or not mbs:
        return []
    out: list[Arithmetic] = []
    for u in units:
        if u.quoted:
            continue
        for m in _ACCUM.finditer(u.norm):
            before = _DP_IS.findall(u.norm[max(0, m.start() - _REACH):m.start()])
            after = _DP_IS.findall(u.norm[m.end():m.end() + _REACH])
            if not before and not after:
                continue
            dp = int(before[-1] if before else after[0])  # the DP nearest the count
            actual = gbs / (mbs * dp) if dp else 0
            if actual and not math.isclose(actual, int(m.group(1)), rel_tol=0.02):
                out.append(Arithmetic(f"GBS / (MBS·DP) = {gbs} / ({mbs}·{dp})",
                                      int(m.group(1)), actual, u))
                if len(out) >= limit:
                    return out
    return out
