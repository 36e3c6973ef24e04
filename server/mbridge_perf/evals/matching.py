"""Finding a checklist or claim term in an answer: its synonyms, ``a|b`` / ``a&b`` forms and
whether the answer recommends it (apart from the checks that judge it and the claims that use
it, so both import it one way)."""

from __future__ import annotations

from mbridge_perf.evals.text import Match, Unit, find
from mbridge_perf.evals.vocab import synonyms


def _alternatives(term: str) -> list[list[str]]:
    """``a|b`` = either; ``a&b`` = both in one unit (``|`` binds loosest); ``re:`` = a regex."""
    if term.startswith("re:"):
        return [[term]]
    alts = [[p for p in alt.split("&") if p.strip()] for alt in term.split("|")]
    return [a for a in alts if a]


def find_any(units: list[Unit], term: str) -> list[Match]:
    """Matches of a term and of its synonyms (evals.vocab), one per position, in order."""
    seen: dict[tuple[int, int], Match] = {}
    for t in [term, *synonyms(term)]:
        for m in find(units, t):
            seen.setdefault((m.unit.index, m.start), m)
    return sorted(seen.values(), key=lambda m: (m.unit.index, m.start))


def _matches(units: list[Unit], term: str, want_rec: bool) -> list[Match]:
    out: list[Match] = []
    for parts in _alternatives(term):
        hits = [m for m in find_any(units, parts[0]) if m.recommended or not want_rec]
        for other in parts[1:]:
            with_other = {m.unit.index for m in find_any(units, other)
                          if m.recommended or not want_rec}
            hits = [m for m in hits if m.unit.index in with_other]
        out += hits
    return out


def recommended(units: list[Unit], term: str, *, late_ok: bool = True) -> list[Match]:
    """Recommended matches of a term, best rank first."""
    hits = [m for m in _matches(units, term, True) if late_ok or not m.late]
    return sorted(hits, key=lambda m: (m.rank, m.start))


def mentioned(units: list[Unit], term: str) -> list[Match]:
    return sorted(_matches(units, term, False), key=lambda m: (m.unit.index, m.start))
