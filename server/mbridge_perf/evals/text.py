"""Normalised, negation-aware matching of terms in an answer.

An answer is split into units (sentences, list items, table rows, code lines). A term match in a
unit is a *recommendation* unless a negation cue scopes over it ("do not X", "X is blocked"),
it sits in a condition ("if X ..."), or it reports someone else's plan ("your teammate wants
X") — then it is only a *mention*. "Only as a last resort" marks the whole unit *late*: still a
recommendation, ranked after every other one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# Parallel sizes: every spelling becomes one token ("tp=8"), so TP=8, TP8, "tensor parallel
# size 8" and tensor_model_parallel_size=8 match each other and PP=8 never matches VPP=8.
_SIZES = [
    (r"virtual[_ ]pipeline[_ ]model[_ ]parallel[_ ]size|virtual[ -]pipeline(?:[ -]parallel"
     r"(?:ism)?)?(?: size)?|\bvpp", "vpp"),
    (r"tensor[_ ]model[_ ]parallel[_ ]size|tensor[ -]parallel(?:ism)?(?: size)?|\btp", "tp"),
    (r"pipeline[_ ]model[_ ]parallel[_ ]size|pipeline[ -]parallel(?:ism)?(?: size)?|\bpp", "pp"),
    (r"context[_ ]parallel[_ ]size|context[ -]parallel(?:ism)?(?: size)?|\bcp", "cp"),
    (r"expert[_ ]tensor[_ ]parallel[_ ]size|\betp", "etp"),
    (r"expert[_ ]model[_ ]parallel[_ ]size|expert[ -]parallel(?:ism)?(?: size)?|\bep", "ep"),
    (r"expert[ -]data[ -]parallel(?:ism)?(?: size)?|\bedp", "edp"),
    (r"data[ -]parallel(?:ism)?(?: size)?|\bdp", "dp"),
]
_SIZE_RE = [(re.compile(rf"(?<![a-z0-9_.])(?:{pat})(?![a-z_])"), tok) for pat, tok in _SIZES]
_SIZE_TOK = "vpp|etp|edp|tp|pp|cp|ep|dp"
_SIZE_VALUE = re.compile(rf"(?<![a-z0-9_])({_SIZE_TOK})\s*(?:=|:|of|to|is|at|from|size)?\s*(\d+)"
                         r"(?!\d|\.\d)")
_SIZE_ARROW = re.compile(rf"(?<![a-z0-9_])({_SIZE_TOK})=(\d+)\s*(?:->|→|to)\s*(\d+)")
_FLAG_VALUE = re.compile(r"(--?[a-z][a-z0-9_\-]*)\s+(\d+|true|false)\b")
_DROP = re.compile(r"[`*\"'“”‘’]")


def normalise(text: str) -> str:
    """Lower-case, drop quotes and emphasis, one spelling per parallel size, flags as flag=v."""
    s = _DROP.sub("", text.lower())
    for rx, tok in _SIZE_RE:
        s = rx.sub(tok, s)
    s = _SIZE_VALUE.sub(r"\1=\2", s)
    s = _SIZE_ARROW.sub(r"\1=\2 -> \1=\3", s)
    return _FLAG_VALUE.sub(r"\1=\2", s)


@lru_cache(maxsize=4096)
def term_regex(term: str) -> re.Pattern[str]:
    """A term as a regex over normalised text: `_`, `-` and spaces interchangeable, `:` = `=`,
    whole words only (``moe`` does not match ``moe_act``, ``mlp`` matches ``mlp recompute``)."""
    t = normalise(term.strip())
    out: list[str] = []
    for ch in t:
        if ch in "_- ":
            if not out or out[-1] != r"[_\-\s]+":
                out.append(r"[_\-\s]+")
        elif ch in ":=":
            out.append(r"\s*[:=]\s*")
        else:
            out.append(re.escape(ch))
    body = "".join(out)
    left = r"(?<![a-z0-9_])" if t[:1].isalnum() else ""
    right = (r"s?(?![a-z0-9_])" if t[-1:].isalpha() else
             r"(?![a-z0-9_])" if t[-1:].isdigit() else "")
    return re.compile(left + body + right)


# ---------------------------------------------------------------- cues

_BREAK = re.compile(r";|\.\s|\?\s|!\s|\s[—–]\s|\s-\s|\)|\bbut\b|\bhowever\b|\bwhereas\b"
                    r"|,\s*(?:then|so|and then|which|while|instead|it|this|that)\b|:\s")
_PREFIX = re.compile(
    r"\b(?:do not|don't|dont|does not|doesn't|never|avoid(?:ing)?|instead of|rather than|not|no|"
    r"without|nor|neither|reject(?:ed)?|against|stop|drop|disable|turn off|switch off|remove|"
    r"skip|cannot|can't|won't|will not|wrong|myth|bad idea|refuse[sd]?|forbid(?:den)?|"
    r"do not use|unsafe)\b|[❌✗🚫]")
_SUFFIX = re.compile(
    r"\b(?:blocked|incompatible|unsupported|not supported|not possible|impossible|is not|are not|"
    r"isn't|aren't|should not|shouldn't|must not|does not|doesn't|do not|did not|didn't|won't|"
    r"will not|cannot|can't|fails?|failed|refuses?|refused|rejected|is wrong|are wrong|wrong|"
    r"not first|not the first|is not needed|not needed|not a memory|asserts|is refused|"
    r"is a myth|would fail|breaks|crash(?:es)?|no effect|not help|not valid|invalid|"
    r"does not exist|do not exist|not allowed|out of scope|deprecated|costs? -?\d|"
    r"(?:frees|saves|saved|freed) (?:about |almost |only |≈ ?|~)?(?:0\b|nothing|little))")
_SUFFIX_REACH = 110
_NOT_FIRST = re.compile(r"\bnot\b[^;.]{0,60}\bfirst\b")
_COND = re.compile(r"\b(?:if|when|whenever|unless|until|once|whether)\b[^,;.:]*")
_REPORTED = re.compile(
    r"\b(?:you plan|you are planning|planning to|plans? to|teammate|colleague|someone|he wants|"
    r"she wants|wants to|proposes?|proposed|suggests?|suggested|claims?|claimed|the question|"
    r"your current|you currently|currently|you tried|was tried|you set|you have|your config|"
    r"the review bot|review bot|asked|runbook says|already)\b")
_LATE = re.compile(
    r"only as a last resort|as a last resort|last resort|only if (?:it |the oom |the job |you |"
    r"that |this )?still|only if the oom persists|(?:a |as a )later step|as a last step|"
    r"only when selective (?:recompute )?(?:cannot|can't) fit|only if selective (?:recompute )?"
    r"(?:cannot|can't|still)|only after")
_NEG_HEADING = re.compile(r"\b(?:not|avoid|don't|do not|reject(?:ed)?|wrong|mistakes?|myths?|"
                          r"pitfalls?|never|incompatible|blocked|what not)\b")


@dataclass(frozen=True)
class Unit:
    """One sentence / list item / row: its text, normalised text and how it may recommend."""

    text: str
    norm: str
    index: int
    late: bool = False
    negated_section: bool = False


@dataclass(frozen=True)
class Match:
    unit: Unit
    start: int
    end: int
    recommended: bool

    @property
    def evidence(self) -> str:
        return clip(self.unit.text)


def clip(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _spans(rx: re.Pattern[str], s: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in rx.finditer(s)]


def _clause(s: str, start: int, end: int) -> tuple[int, int]:
    lo, hi = 0, len(s)
    for b in _BREAK.finditer(s):
        if b.end() <= start:
            lo = b.end()
        elif b.start() >= end:
            hi = b.start()
            break
    return lo, hi


def _inside(spans: list[tuple[int, int]], a: int, b: int) -> bool:
    return any(x <= a and b <= y for x, y in spans)


def _masked(spans: list[tuple[int, int]], a: int, b: int) -> bool:
    return any(x <= a < y or x < b <= y for x, y in spans)


def is_recommended(unit: Unit, start: int, end: int) -> bool:
    """Whether the match [start, end) of a unit is advice rather than a mention."""
    if unit.negated_section:
        return False
    s = unit.norm
    lo, hi = _clause(s, start, end)
    late, cond = _spans(_LATE, s), _spans(_COND, s)
    if _inside(cond, start, end) and not _inside(late, start, end):
        return False
    if _REPORTED.search(s, lo, hi) or _under_label(s, start):
        return False
    skip = late + cond
    for cue in _PREFIX.finditer(s, lo, start):
        if not _masked(skip, cue.start(), cue.end()):
            return False
    for cue in _SUFFIX.finditer(s, end, min(hi, end + _SUFFIX_REACH)):
        if not _masked(skip, cue.start(), cue.end()) and not _own_subject(s, end, cue.start()):
            return False
    nf = _NOT_FIRST.search(s, end, hi)
    return not (nf and not _masked(skip, nf.start(), nf.end()))


# "Avoid: TP=8, PP=8" — a cue used as a label negates the rest of the unit up to a ";".
_LABEL = re.compile(r"\b(?:avoid|do not|don't|never|rejected|not recommended|what not to do|"
                    r"wrong|mistakes?|claims to avoid)\s*:")


def _under_label(s: str, start: int) -> bool:
    return any(";" not in s[m.end():start] for m in _LABEL.finditer(s, 0, start))


_PAREN_LEAD = re.compile(r"\(\s*(?:it |is |are |both |all |now |currently |still )*$")


def _own_subject(s: str, end: int, cue: int) -> bool:
    """A suffix cue inside a parenthesis that has its own subject ("layernorm (core_attn frees
    about 0)") judges that subject, not the match before the parenthesis."""
    paren = s.rfind("(", end, cue)
    return paren >= 0 and not _PAREN_LEAD.match(s, paren, cue)


def find(units: list[Unit], term: str) -> list[Match]:
    """Every match of a term (alternatives split on `|`) in the units, in document order."""
    found: list[Match] = []
    for alt in (t for t in term.split("|") if t.strip()):
        rx = term_regex(alt)
        for u in units:
            for m in rx.finditer(u.norm):
                found.append(Match(u, m.start(), m.end(), is_recommended(u, m.start(), m.end())))
    found.sort(key=lambda m: (m.unit.index, m.start))
    return found


def heading_flags(heading: str) -> tuple[bool, bool]:
    """(negated, late) for the units of a section with this heading."""
    h = normalise(heading)
    return bool(_NEG_HEADING.search(h)), bool(_LATE.search(h))


def unit_is_late(norm: str) -> bool:
    return bool(_LATE.search(norm))
