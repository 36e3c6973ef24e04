"""Byte-unit conversions an answer states ("58.8 GB ≈ 54.8 GiB"), recomputed.

Why: Megatron's memory log lines are decimal GB and the estimators speak binary GiB, so every
memory answer converts - and the classic slip (58.8 GB "is about 63.1 GiB": multiplied where it
should divide) is a wrong number the user then compares against capacity. It is judged as
arithmetic, not as a phrasing: whatever the words around it, a conversion whose result is off
the other unit's value by more than CONVERSION_TOL is an error.

What counts as a conversion: two quantities in different units (GB / GiB, MB / MiB, TB / TiB)
joined only by link words ("=", "≈", "is about", "(", "i.e.", は約, に直すと), whose values lie
within NEAR of each other and the first of which is no product name ("H100-80GB (79.1 GiB)"
is the card's name and its usable capacity) - "20 GB (73.8 GiB estimated)" or "73.8 GiB に対して
58.8 GB" are comparisons, not conversions, and are not judged. One bounded regex pass per unit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from mbridge_perf.evals.text import Unit, clip

CONVERSION_TOL = 0.015
NEAR = 0.15
_SCALE = {"k": 1, "m": 2, "g": 3, "t": 4}
_QTY = r"(?<![\d.,])(\d[\d,]{0,12}(?:\.\d{1,6})?) ?([kmgt])(i?)b\b"
_PAIR = re.compile(_QTY + r"([^\d\n]{0,32}?)" + _QTY.replace("(?<![\\d.,])", ""))
# "H100-80GB (79.1 GiB)", "A100 80GB": a product's name, not an amount converted
_PRODUCT = re.compile(r"(?:\b[a-z]{1,3}\d{2,4}[a-z]?[ -]?|-)$")
_LINK = re.compile(r"(?:[\s(,:=≈≒~→*、]|->|\bis\b|\bare\b|\bor\b|\bwhich\b|\bthat(?:'s)?\b|\bso\b"
                   r"|\bequals?\b|\b(?:works out|comes) to\b|\babout\b|\broughly\b|\baround\b"
                   r"|\bapprox(?:imately|\.)?|\bi\.e\.|\bca\.|は|約|およそ|つまり|すなわち|に直すと"
                   r"|10 ?進|2 ?進|で|では)*")


@dataclass(frozen=True, slots=True)
class UnitError:
    """A decimal / binary conversion stated wrongly."""

    stated: str
    correct: str
    unit: Unit

    @property
    def evidence(self) -> str:
        return (f"states {self.stated}, it is {self.correct} (1 GiB = 1.0737 GB; Megatron's "
                f"memory (GB) log lines are decimal), in: {clip(self.unit.text, 200)}")


def _num(tok: str) -> float:
    return float(tok.replace(",", ""))


def _bytes(v: float, prefix: str, binary: str) -> float:
    return v * (1024.0 if binary else 1000.0) ** _SCALE[prefix]


def _spell(v: float, prefix: str, binary: str) -> str:
    x = v / (1024.0 if binary else 1000.0) ** _SCALE[prefix]
    return f"{x:.3g} {prefix.upper()}{'i' if binary else ''}B"


def unit_errors(units: list[Unit], limit: int = 4) -> list[UnitError]:
    """Conversions between decimal and binary byte units whose result is wrong."""
    out: list[UnitError] = []
    for u in units:
        if "b" not in u.norm:
            continue
        for m in _PAIR.finditer(u.norm):
            n1, p1, b1, gap, n2, p2, b2 = m.groups()
            if b1 == b2 or p1 != p2 or not _LINK.fullmatch(gap) \
                    or _PRODUCT.search(u.norm, max(0, m.start() - 12), m.start()):
                continue
            v1, v2 = _num(n1), _num(n2)
            # a conversion's two numbers differ by the unit ratio (7 % for G): far apart,
            # they are two amounts compared
            if not v1 or not v2 or abs(v2 / v1 - 1) > NEAR:
                continue
            x, y = _bytes(v1, p1, b1), _bytes(v2, p2, b2)
            if abs(y / x - 1) > CONVERSION_TOL:
                out.append(UnitError(f"{n1} {p1.upper()}{b1}B ≈ {n2} {p2.upper()}{b2}B",
                                     _spell(x, p2, b2), u))
                if len(out) >= limit:
                    return out
    return out
