"""Misconceptions: the wrong claims and wrong first steps a skill warns against (its card's
``misconceptions``), found in an answer with their polarity.

A card entry::

    - id: tp-raise-first
      kind: action            # action: wrong advice (judged by the recommendation's polarity)
                              # claim: a wrong statement of fact (judged by correction cues)
      first: true             # only wrong as the first recommendation (action only)
      claim: Raising TP (4→8) is the first fix for a borderline OOM.
      wrong_because: ...      # what makes it wrong, quoted in the verdict
      source: ...             # where the skill says so
      match: [<regex>, ...]   # every regex must hit one sentence / list item (normalised text:
                              # lower case, sizes as tp=8, changes as "tp=4 -> tp=8", "28%")
      unless: [<regex>, ...]  # any hit in that sentence rejects or corrects the claim
      number: {expect: 28.4, rel_tol: 0.2}   # claim = the first group of match[0] is a number
                              # outside this tolerance ("TP 4→8 costs about 5 %")
      first_among: [<regex>]  # with first: wrong only when none of these is recommended before
                              # it ("mlp" before any other recompute module)
      context: [<regex>]      # every regex must hit somewhere in the answer (its layout:
                              # "PP=4"), e.g. for "enable cpu_offloading" with PP > 1
      negative: true          # a claim that something is refused ("an empty list fails"):
                              # only unless / correction cues reject it, not its own "fails"
      absent: [<regex>]       # no regex may hit anywhere in the answer: wrong only when the
                              # answer never says it ("recompute_granularity=full" with no
                              # recompute_method / recompute_num_layers anywhere)
    kind: omission            # wrong by leaving out: no unit says any of match
      examples: {asserts: [...], rejects: [...]}   # sentences the tests run through the grader

An answer asserts a claim in a unit when every ``match`` regex hits, no ``unless`` regex or
generic correction cue ("myth", "is wrong", "not true") hits, the unit is not a reported view
("your teammate says ...", "the review bot claims ...") nor under a negated heading, and — for an
action — the first regex's hit is a recommendation (not "do not", not conditional). Every scan is
one regex pass over a bounded unit.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from mbridge_perf.evals.matching import recommended
from mbridge_perf.evals.text import (
    Unit,
    clip,
    is_hypothetical,
    is_negated,
    is_question,
    is_recommended,
)

# ("delay_wgrad_compute=false" is a config value, not a verdict)
_CORRECTION = re.compile(
    r"\b(?:myths?|misconceptions?|is wrong|are wrong|wrongly|not true|untrue|incorrect|"
    r"(?<![=:])(?<![=:] )false|mistaken|a mistake|common mistake|contrary to|debunk\w*|"
    r"misread\w*|misleading|the trap)\b")
_REPORTED = re.compile(
    r"\b(?:teammate|colleague|someone|review bot|the bot|claims?|claimed|suggests?|suggested|"
    r"proposes?|proposed|the runbook|people say|you may have read|you might think|"
    r"you (?:read|heard)|is often said|it is tempting)\b")
# Every alternative starts with a literal letter (the regex engine skips to those letters
# instead of trying 14 alternatives at each position); "(?<!\w.)" after that letter is the
# word boundary before it. Same cues as "(?:^|[.:;!] )first\b|\bfirst(?:,| step|…)|…".
_B = r"(?<!\w.)"
_FIRST_CUE = re.compile(
    r"f(?:(?<=^f)|(?<=[.:;!] f))irst\b"
    rf"|f{_B}irst(?:,| step| fix| lever| thing| move| option| change| try)"
    rf"|f{_B}irst(?= ?(?:[.;!:)]|$| and | then | before ))"
    rf"|s{_B}tart (?:with|by)\b|q{_B}uickest\b|f{_B}astest fix\b|g{_B}o straight\b"
    rf"|s{_B}traight to\b|b{_B}efore anything\b|s{_B}tep 1\b|r{_B}ight away\b"
    rf"|i{_B}mmediately\b")
# An action is advice when its sentence tells the reader to do something (a row of a table of
# levers counts: its negative rows carry their own cues, "✗", "not at PP=8").
_ADVICE = re.compile(
    r"^\||(?:^(?:\d+[.)] ?)?(?:\w+[:.,] )?|[,:;] |\b(?:so|then|and|just|simply) )"
    r"(?:set|use|enable|add|append|switch|turn|go|move|raise|increase|double|bump|try|apply|start|prefer|put|export|change|make|lower|reduce|flip|"
    r"jump|give|bring|run|offload|push|keep|recompute|shard|split|pin|drop|cut|combine|"
    r"bundle|merge|stack)\b"
    r"|\b(?:should|must|recommend\w*|suggest\w*|i'd|i would|let's|you can|"
    r"you could|need to|go straight|straight to|first step|start with|start by|the fix is|"
    r"answer is|best (?:fix|option|lever)|quickest|fastest|easiest|cheapest|simplest|would be|"
    r"my first|first move|first thing|would try|go for|opt for|pick|choose|turn on|consider|"
    r"worth (?:trying|enabling)|we would|you will want|the way to go|you want to|plan)\b"
    # Japanese requests and recommendations ("上げてください", "入れましょう", "がおすすめ")
    r"|てください|て下さい|ましょう|(?:おすすめ|お勧め|推奨し)(?!(?:し|でき)?(?:ません|ない))|すべき"
    r"|べきです|のが(?:よい|良い|いい)"
    # a slide's or runbook's step in the plain form, led by its place in the sequence ("まず
    # core_attn を recompute して…", "次に moe_act を足す")
    r"|(?:^|、)(?:まず|最初に|次に)(?:は)?(?:、| )?[^。]{0,60}?を"
    # a numbered step that ends in its verb's plain form ("2. まだ足りなければ TP を 8 に上げる。")
    r"|^\d+[.)] ?[^。]{0,80}?(?:上げ|増や|下げ|減ら|設定|追加|有効に|入れ|足|使|切り替え|変更)"
    r"(?:る|す|う|する)?。?$"
    # a config line of a code block that sets a key ("cfg.model.cpu_offloading = true"); a
    # key set to none / false / 0 turns it off
    r"|^[a-z_]\w{0,20}(?:\.\w{1,60}){1,4} ?=(?! ?(?:none|false|0)\b| ?\[\]) ?")
# "Recompute: full, recompute_granularity=full" — a terse label line is advice for what follows
# its colon closely.
_LABEL_LEAD = re.compile(r"^(?:\d+[.)] ?)?[a-z][\w /-]{0,30}: ")
# A table row of measured results: no cell says what to do, most are numbers or dashes.
_ROW_VERDICT = re.compile(r"\b(?:do|first|use|set|add|apply|enable|try|recommend\w*|next|then|pick|"
                          r"go|keep|ship|adopt|winner|best|start)\b")
_RESULT_CELL = re.compile(r"^[-—–~≈+]?\s?(?:\d[\d.,]*\s?(?:%|s|ms|gb|gib|x|tflop/s)?)?$")


def _results_row(s: str) -> bool:
    """A table row of measured results ("| baseline: flex + HybridEP | — | 244.039 | — |"):
    most cells after the first are numbers or dashes and none says what to do - a run
    reported, not a step advised."""
    if not s.startswith("|") or _ROW_VERDICT.search(s):
        return False
    cells = [c.strip() for c in s.strip("| ").split("|")[1:]]
    filled = [c for c in cells if c]
    numeric = sum(bool(_RESULT_CELL.match(c)) for c in filled)
    return len(filled) >= 2 and 2 * numeric >= len(filled)


# A search command line ("$ grep -E 'core_attn|...' train.log", "... | rg moe_act").
_SEARCH = re.compile(r"(?:^|\$ |\| ?)(?:grep|egrep|zgrep|rg)\b")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
# A validator rule id cited as a reference - in parentheses, a code span or its own table cell
# ("(`offload.cpu-needs-target`)"): section, dot, hyphenated name ("model.cpu_offloading", a
# config field, has no hyphen).
_RULE_ID = re.compile(r"[(`|] ?`?[a-z][a-z0-9]*(?:-[a-z0-9]+)*\.[a-z0-9]+(?:-[a-z0-9]+)+`? ?[)`|]")
# A unit that opens by telling the reader to change something.
_IMPERATIVE = re.compile(r"^(?:\d+[.)] ?)?(?:raise|increase|set|add|use|enable|switch|move|"
                         r"turn on|double|bump|lower|reduce|export|go to)\b")
# "X, not Y" / "X — never Y" / "X rather than Y": a contrast that negates what follows it.
_CONTRAST = re.compile(r"(?:[,;]|\s[—–-]) (?:but |and )?(?:not|never|rather than|instead of)\b")


@dataclass(frozen=True)
class Misconception:
    id: str
    kind: str
    claim: str
    wrong_because: str
    source: str
    match: tuple[re.Pattern[str], ...]
    unless: tuple[re.Pattern[str], ...]
    first: bool = False
    number: tuple[float, float] | None = None
    first_among: tuple[re.Pattern[str], ...] = ()
    context: tuple[re.Pattern[str], ...] = ()
    absent: tuple[re.Pattern[str], ...] = ()
    negative: bool = False  # a claim that something is refused: no negation cue rejects it


@dataclass(frozen=True)
class Finding:
    misconception: Misconception
    unit: Unit | None      # None: an omission (nothing in the answer says it)
    at: int = 0            # where in the unit's normalised text the claim starts

    @property
    def evidence(self) -> str:
        m = self.misconception
        if self.unit is None:
            return f"asserts '{m.claim}' by leaving it out — wrong: {m.wrong_because}"
        return f"asserts '{m.claim}' in: {self.quote} — wrong: {m.wrong_because}"

    @property
    def quote(self) -> str:
        """The unit as written; in a long unit, the normalised clause around the claim."""
        u = self.unit
        assert u is not None
        if len(u.text) <= 200:
            return clip(u.text, 200)
        lo = max(0, self.at - 80)
        return ("…" if lo else "") + clip(u.norm[lo:lo + 200], 200).rstrip("…") + "…"


@dataclass(frozen=True)
class Arithmetic:
    """A calculation the answer states wrongly ("131072 / 4096 = 16")."""

    expression: str
    stated: float
    actual: float
    unit: Unit

    @property
    def evidence(self) -> str:
        return (f"states {self.expression} = {self.stated:g}, it is {self.actual:g}, in: "
                f"{clip(self.unit.text, 200)}")


_CACHE: dict[str, tuple[Misconception, ...]] = {}


def _one(e: dict[str, Any]) -> Misconception:
    num = e.get("number")
    return Misconception(
        id=e["id"], kind=e.get("kind", "claim"), claim=e["claim"],
        wrong_because=e["wrong_because"], source=e["source"],
        match=tuple(re.compile(r) for r in e["match"]),
        unless=tuple(re.compile(r) for r in e.get("unless", [])),
        first=bool(e.get("first", False)),
        number=(float(num["expect"]), float(num.get("rel_tol", 0.1))) if num else None,
        first_among=tuple(re.compile(r) for r in e.get("first_among", [])),
        context=tuple(re.compile(r) for r in e.get("context", [])),
        absent=tuple(re.compile(r) for r in e.get("absent", [])),
        negative=bool(e.get("negative", False)))


def misconceptions(card: dict[str, Any]) -> tuple[Misconception, ...]:
    """The card's misconceptions, compiled (cached per card content)."""
    raw = card.get("misconceptions") or []
    key = json.dumps(raw, sort_keys=True)
    if key not in _CACHE:
        _CACHE[key] = tuple(_one(e) for e in raw)
    return _CACHE[key]


def _omitted(m: Misconception, units: list[Unit]) -> bool:
    """An ``omission``: no unit says any of ``match`` (the step the answer skipped)."""
    return not any(rx.search(u.norm) for u in units for rx in m.match)


def _asserted_in(m: Misconception, u: Unit, body: str = "") -> bool:
    """``body``: the rest of the plan step a lead sentence heads ("6. **CPU offloading.**
    Legal because PP=1, ..."): its qualifiers count for the head. A question asserts nothing,
    nor does a claim standing wholly inside a condition or an open alternative ("whether X or
    Y", "only if X: ...")."""
    if u.negated_section or u.quoted or is_question(u):
        return False
    s = u.norm
    hits = []
    for rx in m.match:
        hit = rx.search(s)
        if hit is None:
            return False
        hits.append(hit)
    if any(rx.search(s) for rx in m.unless) or _CORRECTION.search(s) or _REPORTED.search(s):
        return False
    if body and m.kind == "action" and (any(rx.search(body) for rx in m.unless)
                                        or _CORRECTION.search(body)):
        return False
    if m.number is not None and not _wrong_number(m, hits[0]):
        return False
    if m.kind == "claim":
        if all(is_hypothetical(u, h.start(), h.end()) for h in hits):
            return False
        if m.negative:
            return True
        # the claim's subject and its predicate both stand unnegated ("core_attn does not save
        # much" negates the predicate; "not core_attn" the subject), and no contrast inside
        # the match negates its tail ("the mean over 41-50, not from iteration 1")
        return not (any(is_negated(u, h.start(), h.end()) for h in (hits[0], hits[-1]))
                    or _CONTRAST.search(s, hits[-1].start(), hits[-1].end()))
    if m.kind == "action":
        if (_SEARCH.search(s) or _results_row(s)
                or (_RULE_ID.search(u.text) and not _IMPERATIVE.match(s))):
            return False    # a term searched for ("$ grep core_attn"), a row of results, a
            # constraint cited by its rule ("(`offload.cpu-needs-target`): ... must be set"),
            # not a step that names the rule it checks ("Raise VPP 5 -> 10 after checking
            # pipeline.vpp-layers-divisible")
        label = _LABEL_LEAD.match(s)
        # the head of a numbered plan step is advice ("2. **Selective recompute with mlp.**")
        advice = (u.lead or bool(_ADVICE.search(s))
                  or bool(label and hits[0].start() - label.end() <= 40))
        return advice and is_recommended(u, hits[0].start(), hits[0].end())
    return True


def _wrong_number(m: Misconception, hit: re.Match[str]) -> bool:
    assert m.number is not None
    text = next((g for g in hit.groups() if g), None) if hit.groups() else hit.group(0)
    num = _NUMBER.search(text or "")
    if num is None:
        return False
    expect, tol = m.number
    return not math.isclose(abs(float(num.group(0))), abs(expect), rel_tol=tol)


def find_misconceptions(card: dict[str, Any], units: list[Unit],
                        action_terms: list[str] | None = None, *,
                        omissions: bool = True, whole: bool = True) -> list[Finding]:
    """Misconceptions the answer asserts, in the order of the card. ``action_terms`` are the
    terms of every recommendation the skill knows (for ``first`` misconceptions: a wrong step
    is only wrong when nothing else is recommended before it). ``omissions``: also report the
    steps a whole answer must not leave out (off for a case's narrower question). ``whole``:
    ``units`` are the whole answer (else a claim wrong only by what the answer never says,
    ``absent``, is not judged)."""
    out: list[Finding] = []
    items = misconceptions(card)
    first_unit, first_pos = _first_action(units, items, action_terms or [])
    bodies = _step_bodies(units)
    for m in items:
        if m.context and not all(any(rx.search(u.norm) for u in units) for rx in m.context):
            continue
        # judged on the whole answer: not when its end was left unread
        if m.absent and (not whole or any(rx.search(u.norm) for u in units
                                          for rx in m.absent)):
            continue
        if m.kind == "omission":
            if omissions and units and _omitted(m, units):
                out.append(Finding(m, None))
            continue
        for u in units:
            if not _asserted_in(m, u, bodies.get(u.index, "")):
                continue
            if m.first_among:
                if not _first_among(m, u, units):
                    continue
            elif m.first and not (_first_cue(u) or (
                    u is first_unit and _anchor(m, u) <= first_pos)):
                continue
            out.append(Finding(m, u, _anchor(m, u)))
            break
        else:
            pair = _across(m, units)
            if pair is not None:
                out.append(Finding(m, pair))
    return out


# A sentence that points back at the one before ("Recompute core_attn. It frees 8 GB.").
_ANAPHOR = re.compile(r"\b(?:it|its|them|they|this|that|these|those)\b")


def _across(m: Misconception, units: list[Unit]) -> Unit | None:
    """A claim whose subject stands in one sentence and whose predicate in the next sentence of
    the same paragraph, which refers back to it; the two read as one unit (quoted together)."""
    if m.kind != "claim" or len(m.match) < 2:
        return None
    if m.number is not None:
        return _figure_across(m, units)
    for u, v in pairwise(units):
        if (u.block < 0 or v.block != u.block or u.negated_section or u.quoted
                or is_question(u) or is_question(v)):
            continue
        h0 = m.match[0].search(u.norm)
        if h0 is None or m.match[0].search(v.norm) or not _ANAPHOR.search(v.norm):
            continue
        rest = [rx.search(v.norm) for rx in m.match[1:]]
        if any(h is None for h in rest) or is_negated(u, h0.start(), h0.end()):
            continue
        both = f"{u.norm} {v.norm}"
        if (any(rx.search(both) for rx in m.unless) or _CORRECTION.search(both)
                or _REPORTED.search(both)):
            continue
        last = rest[-1]
        if last is not None and not is_negated(v, last.start(), last.end()):
            return _joined(u, v)
    return None


def _joined(u: Unit, v: Unit) -> Unit:
    """Two sentences of one paragraph read (and quoted) as one unit."""
    return Unit(f"{clip(u.text, 120)} {clip(v.text, 150)}", f"{u.norm} {v.norm}", u.index,
                u.late, u.negated_section, block=u.block)


# A sentence that opens by pointing back ("That saves about 3 GB for 2 %.", "It costs ...").
_BACK = re.compile(r"^(?:that|this|it|these|they)\b")


def _figure_across(m: Misconception, units: list[Unit]) -> Unit | None:
    """A figure claim whose subject ends one sentence of a paragraph and whose figure opens the
    next by pointing back ("... add mlp. That costs about 2 %."): judged on the two as one."""
    for u, v in pairwise(units):
        if (u.block < 0 or v.block != u.block or u.quoted or v.quoted
                or not _BACK.match(v.norm)):
            continue
        both = _joined(u, v)
        hit = m.match[0].search(both.norm)
        if hit and hit.end() > len(u.norm) and _asserted_in(m, both):
            return both
    return None


_BODY_CHARS = 1_000


def _step_bodies(units: list[Unit]) -> dict[int, str]:
    """For each lead sentence of a numbered plan step, the sentences after it in the same step
    (at most 1,000 characters: the qualifiers of a step's head sit right after it)."""
    out: dict[int, str] = {}
    for k, u in enumerate(units):
        if not u.lead:
            continue
        parts, size = [], 0
        for v in units[k + 1:]:
            if v.block != u.block or size >= _BODY_CHARS:
                break
            parts.append(v.norm[:_BODY_CHARS - size])
            size += len(parts[-1]) + 1
        out[u.index] = " ".join(parts)
    return out


def _first_among(m: Misconception, u: Unit, units: list[Unit]) -> bool:
    """No competing action (``first_among``) is recommended before the anchor of ``m``."""
    key = (1 if u.late else 0, u.index, _anchor(m, u))
    for v in units:
        for rx in m.first_among:
            for h in rx.finditer(v.norm):
                if (1 if v.late else 0, v.index, h.start()) < key and is_recommended(
                        v, h.start(), h.end()):
                    return False
    return True


def _anchor(m: Misconception, u: Unit) -> int:
    hit = m.match[0].search(u.norm)
    return hit.start() if hit else 1 << 30


def _first_cue(u: Unit) -> bool:
    return bool(_FIRST_CUE.search(u.norm))


def _first_action(units: list[Unit], items: tuple[Misconception, ...],
                  terms: list[str]) -> tuple[Unit | None, int]:
    """The first unit (late advice last) that recommends anything, and where in it the first
    recommendation starts. One pass over the answer per term."""
    firsts = [m for m in items if m.first]
    if not firsts:
        return None, 0
    best: tuple[int, int, int] | None = None
    by_index = {}
    for m in firsts:
        for u in units:
            for h in m.match[0].finditer(u.norm):
                if is_recommended(u, h.start(), h.end()):
                    key = (1 if u.late else 0, u.index, h.start())
                    if best is None or key < best:
                        best, by_index[u.index] = key, u
                    break
    for t in dict.fromkeys(terms):
        hits = recommended(units, t)
        if hits:
            h = hits[0]
            key = (h.rank[0], h.unit.index, h.start)
            if best is None or key < best:
                best, by_index[h.unit.index] = key, h.unit
    if best is None:
        return None, 0
    return by_index[best[1]], best[2]


# ---------------------------------------------------------------- stated arithmetic

_EXPR_CHARS = frozenset("0123456789.,k()×x*·/÷ ")
_RESULT = re.compile(r"\s{0,8}(?:=|≈|->)\s{0,8}(\d[\d,]{0,24}(?:\.\d{1,12})?k?)")
_EXPR_REACH = 60


def arithmetic_errors(units: list[Unit], limit: int = 8) -> list[Arithmetic]:
    """Products and quotients of plain numbers written with their result ("4 × 32 = 128",
    "131072 / 4096 = 16"), recomputed; a result off by more than 2 % is an error. Each "="
    looks back at most 60 characters, so the scan is linear in the answer; it stops at
    ``limit`` errors (a verdict quotes the first three)."""
    out: list[Arithmetic] = []
    for u in units:
        if len(out) >= limit:
            break
        s = u.norm
        for res in _RESULT.finditer(s):
            k = res.start()
            lo = k
            while lo > 0 and k - lo < _EXPR_REACH and s[lo - 1] in _EXPR_CHARS:
                lo -= 1
            before = s[:lo].rstrip()[-3:]
            if before.endswith(("%", "+", "-", "^", "mod")):
                continue
            expr = s[lo:k].strip(" ,.")
            while expr and not (expr[0].isdigit() or expr[0] == "("):
                expr = expr[1:].lstrip()
            if not any(op in expr for op in "×*·/÷") and " x " not in expr:
                continue
            actual = _evaluate(expr)
            stated = _number(res.group(1))
            if actual is None or stated is None or actual == 0:
                continue
            if not math.isclose(actual, stated, rel_tol=0.02):
                out.append(Arithmetic(expr, stated, round(actual, 4), u))
    return out


# A measured pair with its stated change: "dropped by 17.73%, from 24.7138 s to 20.9920 s",
# "24.7138 s -> 20.9920 s (-15.06%)". Both values carry decimals (measurements, not a layout's
# "TP 4 -> 8"); "fell / dropped by x%" and a signed "(-x%)" are read relative to the first value.
_FALL = r"(?:dropp\w*|drops?|fell|falls?|reduc\w*|decreas\w*|cut|down|lower\w*|shrank|shrinks?)"
_MEAS = r"(\d{1,7}\.\d{1,6}) ?(?:s|ms|sec|seconds|gb|gib|tflop/s(?:/gpu)?|tokens/s)?"
_CHANGE = re.compile(
    rf"\b{_FALL} (?:by )?(?:about |~)?(\d{{1,3}}(?:\.\d{{1,4}})?) ?%[^.;%]{{0,24}}?\bfrom {_MEAS} "
    rf"(?:to|->) {_MEAS}"
    rf"|(?<![\d.]){_MEAS} ?(?:->|to) ?{_MEAS}[ ,]{{0,3}}\(([-+])(\d{{1,3}}(?:\.\d{{1,4}})?) ?%\)")


def _change_error(hit: re.Match[str], u: Unit) -> Arithmetic | None:
    """The stated relative change of a measured pair, when it is not the change of the pair."""
    if hit.group(1) is not None:
        pct, a, b, falls = float(hit.group(1)), float(hit.group(2)), float(hit.group(3)), True
    else:
        a, b, falls = float(hit.group(4)), float(hit.group(5)), hit.group(6) == "-"
        pct = float(hit.group(7))
    if a == 0 or (falls != (b < a)):
        return None
    actual = abs(b - a) / a * 100
    if math.isclose(pct, actual, rel_tol=0.02, abs_tol=0.06):
        return None
    return Arithmetic(f"the change from {a:g} to {b:g} (%)", pct, round(actual, 2), u)


def change_errors(units: list[Unit], limit: int = 4) -> list[Arithmetic]:
    """Relative changes stated wrongly for a measured pair (see ``_CHANGE``)."""
    out: list[Arithmetic] = []
    for u in units:
        for hit in _CHANGE.finditer(u.norm):
            err = _change_error(hit, u)
            if err is not None:
                out.append(err)
                if len(out) >= limit:
                    return out
    return out


def _number(tok: str) -> float | None:
    tok = tok.replace(",", "")
    mult = 1024.0 if tok.endswith("k") else 1.0
    try:
        return float(tok.rstrip("k")) * mult
    except ValueError:
        return None


_TOKEN = re.compile(r"\s{0,8}(?:(\d[\d,]{0,24}(?:\.\d{1,12})?k?)|([×x*·/÷()]))")


def _evaluate(expr: str) -> float | None:
    """A product / quotient of numbers with parentheses; None when it is anything else."""
    toks: list[str] = []
    pos = 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None:
            if expr[pos:].strip():
                return None
            break
        toks.append(m.group(1) or m.group(2))
        pos = m.end()
    try:
        val, rest = _product(toks, 0, 0)
    except (ZeroDivisionError, IndexError, ValueError):
        return None
    return val if rest == len(toks) else None


def _product(toks: list[str], i: int, depth: int) -> tuple[float, int]:
    if depth > 8:
        raise ValueError("too deep")
    val, i = _factor(toks, i, depth)
    while i < len(toks) and toks[i] in "×x*·/÷":
        op = toks[i]
        rhs, i = _factor(toks, i + 1, depth)
        val = val / rhs if op in "/÷" else val * rhs
    return val, i


def _factor(toks: list[str], i: int, depth: int) -> tuple[float, int]:
    if toks[i] == "(":
        val, i = _product(toks, i + 1, depth + 1)
        if toks[i] != ")":
            raise ValueError("unbalanced")
        return val, i + 1
    num = _number(toks[i])
    if num is None:
        raise ValueError("not a number")
    return num, i + 1
