"""One function per kind of check in an evals.json ``checks`` block; each returns expectations
that carry the span (or JSON value) they were judged on."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, NamedTuple

from mbridge_perf.evals.answer import Answer
from mbridge_perf.evals.claims import (
    arithmetic_errors,
    change_errors,
    find_misconceptions,
    misconceptions,
)
from mbridge_perf.evals.configs import config_errors
from mbridge_perf.evals.jsonpath import PathError, query
from mbridge_perf.evals.keys import invented_keys
from mbridge_perf.evals.layout import accumulation_errors, formula_errors
from mbridge_perf.evals.matching import mentioned, recommended
from mbridge_perf.evals.text import Match, Unit, clip, find, is_question
from mbridge_perf.evals.units import unit_errors


@dataclass
class Expectation:
    """A single graded statement; ``check`` names its kind for the critical list."""

    text: str
    passed: bool
    evidence: str
    check: str
    critical: bool = False


def _rank(u: Unit) -> tuple[int, int]:
    return (1 if u.late else 0, u.index)


def _quote(terms: Iterable[str]) -> str:
    return ", ".join(f"'{t}'" for t in terms)


def include_all(a: Answer, groups: list[list[str]]) -> list[Expectation]:
    out = []
    for group in groups:
        for term in group:
            hits = mentioned(a.units, term)
            out.append(Expectation(f"must include '{term}'", bool(hits),
                                   hits[0].evidence if hits else f"'{term}' not found",
                                   "must_include_all"))
    return out


def include_any(a: Answer, groups: list[list[str]]) -> list[Expectation]:
    out = []
    for group in groups:
        hit = next((m for t in group for m in mentioned(a.units, t)), None)
        out.append(Expectation(f"must include one of {_quote(group)}", hit is not None,
                               hit.evidence if hit else "none found", "must_include_any"))
    return out


def not_include(a: Answer, terms: list[str]) -> list[Expectation]:
    out = []
    for term in terms:
        hits = mentioned(a.units, term)
        out.append(Expectation(f"must not include '{term}'", not hits,
                               hits[0].evidence if hits else "absent", "must_not_include"))
    return out


def not_recommend(a: Answer, terms: list[str]) -> list[Expectation]:
    """Mentions ("do not raise TP=8") and last-resort advice are fine; advice is not."""
    out = []
    for term in terms:
        hits = recommended(a.units, term, late_ok=False)
        evidence = (hits[0].evidence if hits else
                    _mention_note(mentioned(a.units, term), term))
        out.append(Expectation(f"must not recommend '{term}'", not hits, evidence,
                               "must_not_recommend"))
    return out


def _mention_note(hits: list[Match], term: str) -> str:
    if not hits:
        return f"'{term}' not recommended (absent)"
    return f"mentioned, not recommended: {hits[0].evidence}"


def first_recommendation(a: Answer, wanted: list[str], vocab: list[str]) -> Expectation:
    """The first unit that recommends any known knob must recommend one of ``wanted``."""
    seq = sorted(a.units, key=_rank)
    first = None
    for u in seq:
        if any(recommended([u], t) for t in vocab):
            first = u
            break
    text = f"first recommendation is one of {_quote(wanted)}"
    if first is None:
        return Expectation(text, False, "no recommendation found", "first_recommendation_in")
    ok = any(recommended([first], t) for t in wanted)
    return Expectation(text, ok, ("" if ok else "first recommendation: ") + clip(first.text),
                       "first_recommendation_in")


def order(a: Answer, pairs: list[list[str]]) -> list[Expectation]:
    out = []
    for before, after in pairs:
        text = f"'{before}' recommended before '{after}'"
        hb, ha = recommended(a.units, before), recommended(a.units, after)
        if not hb or not ha:
            missing = before if not hb else after
            out.append(Expectation(text, False, f"'{missing}' is not recommended", "order"))
            continue
        ok = hb[0].rank <= ha[0].rank and hb[0].unit.index != -1
        if hb[0].rank == ha[0].rank:
            ok = hb[0].start <= ha[0].start
        out.append(Expectation(text, ok, f"first '{before}': {hb[0].evidence} | first "
                                         f"'{after}': {ha[0].evidence}", "order"))
    return out


# A recommendation that says it goes before everything else, wherever it stands in the text
# ("Before any of these, set X", "Before any of that: check X", "set X first."): for the lenient
# order it comes first.
_PUT_FIRST = re.compile(
    r"\bbefore (?:any|all|each|either|every one) of (?:these|this|that|them|those|"
    r"the (?:above|options|steps|three|two))\b"
    r"|\bbefore (?:anything|everything) else\b|\bfirst of all\b"
    r"|\bbefore (?:you )?(?:touch|try|chang|pick|reach)\w* (?:any|anything|a |the |for )"
    r"|\b(?:set|export|fix|check|apply|enable|confirm|add|try) [^.;]{1,120} first"
    r"(?= ?(?:[.;:!)(,—–]|$))"
    # "first check that X is set", "first try X", "try that before any recompute change"
    r"|\bfirst,? (?:check|try|set|export|apply|enable|confirm|make sure)\b"
    r"|\bbefore any (?:other )?\w+ (?:change|lever|knob|step)s?\b"
    # "make sure X is set first"
    r"|\b(?:make sure|ensure)\b[^.;]{1,80}\b(?:is|are) (?:set|exported|in place|on) first\b"
    # Japanese: "先に X を試す / 設定する" (X before the rest), "何よりも先に", "まず最初に"
    r"|先に[^。;]{1,80}?(?:試|設定|入れ|適用|有効|export)|何よりも先に|まず最初に"
    # "モジュールを追加する前に X を試してください" (try X before adding modules)
    r"|(?:する|追加する|変える|触る|入れる)前に[^。;]{1,80}?(?:試|設定|適用|有効|export)"
    # a step that opens with "その前に" (before that) is placed ahead of the steps above it
    r"|(?:^(?:\d+[.)] ?)?|。 ?)その前に")


def _put_first(m: Match) -> bool:
    return bool(_PUT_FIRST.search(m.unit.norm))


# A config line of a code block ("cfg.model.recompute_modules = [...]", "seq_length: 131072"):
# the lines of one config block set keys together, in no order of advice.
_CONFIG_LINE = re.compile(r"^(?:export )?[a-z]\w{0,40}[_.][\w.\[\]]{0,80} ?[=:] ?\S")


def _one_config_block(a: Match, b: Match) -> bool:
    """Both matches stand on config lines of the same code block."""
    return (a.unit.block == b.unit.block and bool(_CONFIG_LINE.match(a.unit.norm))
            and bool(_CONFIG_LINE.match(b.unit.norm)))


# A statement that checks evidence ("grep ... must return nothing", "confirm the kernels ran",
# "re-validate on a training-equivalent run", "確認してください"): the terms it names are what
# is proved, not steps of the plan.
_VERIFY = re.compile(
    r"\bgrep\b|\b(?:confirm|verify|make sure|ensure|prove|re-?validat\w*|re-?measur\w*)\b"
    r"|\bvalidat(?:e|es|ed|ing|ion)\b|\bcheck (?:that|there|for|the log)\b|returns? nothing"
    r"|must be empty|確認|検証|取り直|測り直"
    # a diff of two finished runs for contract mismatches (SKILL.md Phases 4-5, compare_benchmarks)
    r"|\bcompare_benchmarks\b|\bflags? (?:contract |any )?mismatch\w*"
    # a review's demand on runs already made ("show that ...", "the baseline must match ...")
    r"|^(?:\d+[.)] ?)?show\b|\bshow (?:that|me)\b|\b(?:must|should|has to|have to|needs? to) "
    r"(?:share|match)\b|一致し")
# "Stay with selective recompute", "keep using alltoall": a setting kept as it is, not a step.
_RETAIN = re.compile(r"\b(?:stay|stays|stick|sticks|remain|remains|continue)(?: to use| using|"
                     r" with| on| at)\b|\bkeep (?:using|running)\b")


# A step already taken or a precondition checked, not placed in the sequence: "X alone fixed
# it", "make sure the job exports X", "# keep the allocator fix on".
_IN_PLACE = re.compile(
    r"\balone (?:fixed|cleared|solved|removed)\b|\b(?:fixed|cleared) it on its own\b"
    r"|\b(?:make sure|ensure|confirm|check) (?:that )?(?:the job |your job |it |you )?"
    r"(?:exports?|sets?|has|keeps?|still)\b|\bkeep (?:the |your |this )?[\w ]{0,30}"
    r"\b(?:on|set|in place|exported)\b|\balready (?:set|exported|on|in place)\b"
    # the setup a measured figure was taken on ("Tracked runs: 32 GB200, BF16, HybridEP")
    r"|\b(?:tracked|measured|reference|recorded) runs?\b|\bfigures we have\b"
    r"|\b(?:measured|taken|recorded) (?:on|with)\b"
    # a setting made whatever else happens ("Export X regardless"), or checked in place
    r"|\bregardless\b|\bin any case\b|\beither way\b"
    r"|\b(?:make sure|ensure)\b[^.;]{0,80}\b(?:is|are) (?:exported|set|on|in place)\b(?! first)"
    # "keep X and Y in the job env"
    r"|\bkeep\b[^.;]{0,120}\bin (?:the |your )?(?:job(?:'s)? )?env(?:ironment)?\b"
    # a result labelled with the contract's labels ("label each result training-equivalent or
    # benchmark-only"): reporting a run, not the step that freezes the contract
    r"|\blabel\w*\b[^.;]{0,80}\btraining[- ]equivalent"
    r"|training[- ]equivalent(?: or | ?/ ?)benchmark[- ]only"
    r"|\b(?:report\w*|count\w*|treat\w*|mark\w*) (?:it |them |this |the result )?as (?:a )?"
    r"training[- ]equivalent|\bneeds? an? training[- ]equivalent run")


# "It only belongs to full (with recompute_method)", "this applies only to selective": where a
# field belongs, stated - not a step taken.
_WHERE_IT_BELONGS = re.compile(r"\b(?:only )?belongs? (?:only )?to\b|\bappl(?:y|ies) only to\b"
                               r"|\bonly appl(?:y|ies) to\b|\bis only (?:for|meaningful|valid) "
                               # a constraint stated: "full is only accepted with a full-iteration
                               # graph"
                               r"|\b(?:is|are) only (?:accepted|allowed|supported|legal) "
                               r"(?:with|when|under|for|on)\b"
                               # how a field works, stated: "MCore treats full as a different
                               # mechanism", "the check only allows it with ...", "full cannot
                               # coexist with TE graphs", "the fields are complete"
                               r"|\bonly allows?\b|\b(?:different|separate) mechanism\b"
                               r"|\bcannot coexist\b"
                               r"|\bfields? (?:themselves )?(?:is|are) complete\b"
                               # an alternative offered, not a step: "if you'd rather use block"
                               r"|\bif you(?:'d| would) rather\b")


# A list of the facts to gather before any change ("Gather facts: TP/PP/..., the current
# recompute_*, PYTORCH_CUDA_ALLOC_CONF"): what is read, not a step taken.
_INVENTORY = re.compile(r"^(?:\d+[.)] ?)?(?:\[[ x]\] ?)?(?:(?:gather|collect|record|note down) "
                        r"(?:the |these )?(?:facts|inputs|details|current)\b|(?:facts|inputs) to "
                        r"(?:gather|collect)\b|(?:事実|情報|現状)を(?:集め|確認|記録))")


def _placed(m: Match, verify: set[int]) -> bool:
    """Whether a recommendation places its checklist step in the answer's sequence: not a
    setting kept as it is (nor an item under a "Leave as is" lead-in), not a question back to
    the user ("has the job run with X?", unless it says it comes first), not a statement of
    where a field belongs, and not evidence named in a verification statement (``verify``: the
    units that verify, when the card marks its verification step)."""
    if (m.unit.index in verify or m.unit.kept or _INVENTORY.match(m.unit.norm)
            or (is_question(m.unit) and not _put_first(m))):
        return False
    s = m.unit.norm
    if _WHERE_IT_BELONGS.search(s) or _IN_PLACE.search(s, max(0, m.start - 90), m.end + 90):
        return False
    return _RETAIN.search(s, max(0, m.start - 30), m.start) is None


def _steps(units: list[Unit]) -> list[int]:
    """For each unit, the number of the numbered plan step it stands in (the last step head at
    or before it), -1 before the first."""
    out, step = [], -1
    for u in units:
        step += u.lead
        out.append(step)
    return out


# A step head that says its step comes first ("1. **Selective recompute first.**").
_CLAIMS_FIRST = re.compile(r"\bfirst\b|\bstart (?:with|by)\b|まず|最初に|から(?:入る|始め)")


def _first_step(hits: list[Match], steps: list[int], claiming: set[int] | None = None) -> int:
    """The first numbered step a hit stands in, -1 if none (``claiming``: only those steps, the
    ones whose head says they come first - "1. **Swap the recompute module first.** ... Add
    layernorm": the step's advice comes first, whether its head or its body names the item)."""
    return min((steps[m.unit.index] for m in hits
                if 0 <= m.unit.index < len(steps) and steps[m.unit.index] >= 0
                and (claiming is None or steps[m.unit.index] in claiming)),
               default=-1)


def _claiming_steps(units: list[Unit], steps: list[int]) -> set[int]:
    """The numbered steps whose head says the step comes first."""
    return {steps[u.index] for u in units
            if u.lead and 0 <= u.index < len(steps) and _CLAIMS_FIRST.search(u.norm)}


class _Ranked(NamedTuple):
    """Where one checklist item stands in the answer, for the order check."""

    id: str
    first: tuple[int, int]      # its earliest placed recommendation; (-1, -1) when put first
    first_hit: Match
    last: tuple[int, int]       # its latest placed recommendation
    last_hit: Match
    step: int = -1              # the first numbered plan step naming it
    claimed_step: int = -1      # the first step whose head names it and says it comes first


def _later_step(x: _Ranked, y: _Ranked) -> bool:
    """A numbered plan whose step head puts the card's later item ``y`` first, in a step before
    every step that names ``x`` ("1. **Selective recompute first.** 2. Then set the
    allocator"): out of order, unless ``x`` says it goes first."""
    return y.claimed_step >= 0 and x.step > y.claimed_step and x.first != (-1, -1)


def checklist(a: Answer, items: list[dict[str, Any]], check: str = "checklist", *,
              lenient_order: bool = False) -> list[Expectation]:
    """Each item present (recommended when kind=recommend), recommendations in card order.
    ``lenient_order``: an item is in order when it is recommended somewhere after the earliest
    recommendation of the item before it (an early passing mention — "window 41–50" in the
    contract — does not make it come first); only recommendations that place a step count
    (``_placed``: not a setting kept as is; when the card marks an item ``verification``,
    not another step's term inside a statement that verifies); an item ``ordered: false`` is
    judged present but in no order."""
    out: list[Expectation] = []
    ranks: list[_Ranked] = []
    verify: set[int] = set()
    steps = _steps(a.units) if lenient_order else []
    claiming = _claiming_steps(a.units, steps)
    if lenient_order and any(i.get("verification") for i in items):
        # (a contract that names the window, "iterations 41-50", is still the contract)
        verify = {u.index for u in a.units if _VERIFY.search(u.norm)}
    by_id: dict[str, list[Match]] = {}
    for item in items:
        rec = item.get("kind", "recommend") == "recommend"
        hits = [m for t in item["match"] for m in
                (recommended(a.units, t) if rec else mentioned(a.units, t))]
        hits.sort(key=lambda m: (m.rank, m.start))
        verb, miss = ("recommends", "recommended") if rec else ("states", "found")
        out.append(Expectation(f"checklist {item['id']}: {verb} {clip(item['text'], 120)}",
                               bool(hits), hits[0].evidence if hits else
                               f"none of {_quote(item['match'])} {miss}", check))
        if rec:
            by_id[item["id"]] = hits
    for item in items:
        # a rule the answer may state anywhere (SKILL.md lists "bring up on alltoall" after
        # validate; the loop runs it before profile; a plan names it at either place)
        hits = [] if item.get("ordered") is False else by_id.get(item["id"], [])
        if lenient_order:
            own = {m.unit.index for m in hits} if item.get("verification") else set()
            hits = [m for m in hits if _placed(m, verify - own)]
        if not hits:
            continue
        first, first_hit = hits[0].rank, hits[0]
        if not lenient_order:
            ranks.append(_Ranked(item["id"], first, first_hit, hits[-1].rank, hits[-1]))
            continue
        put = next((m for m in hits if _put_first(m)), None)
        if put is not None:
            first, first_hit = (-1, -1), put
        ranks.append(_Ranked(item["id"], first, first_hit, hits[-1].rank, hits[-1],
                             _first_step(hits, steps), _first_step(hits, steps, claiming)))
    if lenient_order and len(ranks) > 1:
        bad = [(x, y) for x, y in pairwise(ranks)
               if (x.first > y.last or _later_step(x, y))
               and not _one_config_block(x.first_hit, y.last_hit)]
        evidence = ("; ".join(f"'{y.id}' ({y.last_hit.evidence}) comes before '{x.id}' "
                              f"({x.first_hit.evidence})" for x, y in bad) if bad
                    else " < ".join(f"{r.id} ({clip(r.first_hit.unit.text, 60)})"
                                    for r in ranks))
        out.append(Expectation("checklist recommendations follow the card's order", not bad,
                               evidence, f"{check}.order"))
    elif len(ranks) > 1:
        bad = [(x, y) for x, y in pairwise(ranks) if x.first > y.first]
        evidence = ("; ".join(f"'{y.id}' ({y.first_hit.evidence}) comes before '{x.id}'"
                              for x, y in bad) if bad else " < ".join(r.id for r in ranks))
        out.append(Expectation("checklist recommendations follow the card's order", not bad,
                               evidence, f"{check}.order"))
    return out


# Claims are read in an answer's first this-many characters: every card's ~100 claim patterns
# over the whole text is what a 200 KB answer spends its time on, and no real answer is near.
CLAIM_WINDOW_CHARS = 32_000


def _claim_window(units: list[Any]) -> tuple[list[Any], bool]:
    """The units inside the claim window, and whether any were left out."""
    total = 0
    for k, u in enumerate(units):
        total += len(u.norm)
        if total > CLAIM_WINDOW_CHARS:
            return units[:k], True
    return units, False


def no_misconceptions(a: Answer, card: dict[str, Any] | None, terms: list[str], *,
                      omissions: bool = True) -> Expectation:
    """The answer asserts none of the wrong claims / wrong first steps the card lists."""
    items = misconceptions(card or {})
    terms = terms + [t for i in (card or {}).get("answer_checklist", [])
                     if i.get("kind", "recommend") == "recommend" for t in i["match"]]
    units, cut = _claim_window(a.units)
    # an omission is judged on the whole answer, so not when its end was left unread
    found: list[Any] = find_misconceptions(card or {}, units, terms,
                                           omissions=omissions and not cut, whole=not cut)
    found += arithmetic_errors(units) + change_errors(units)
    found += formula_errors(units)
    found += accumulation_errors(units)
    found += unit_errors(units)
    found += config_errors(units, a.json_blocks + a.yaml_configs)
    text = "asserts none of the skill's misconceptions and no wrong arithmetic"
    if not found:
        read = f" (read in its first {CLAIM_WINDOW_CHARS:,} characters)" if cut else ""
        return Expectation(text, True, f"none of {len(items)} misconceptions asserted{read}; "
                                       "stated arithmetic checks out", "misconceptions",
                           critical=True)
    return Expectation(text, False, " | ".join(f.evidence for f in found[:3]),
                       "misconceptions", critical=True)


def tool_calls(a: Answer, spec: dict[str, list[str]]) -> list[Expectation]:
    out = []
    calls = a.tool_calls
    seen = "none recorded" if calls is None else (", ".join(calls) or "no tools called")
    for tool in spec.get("required", []):
        ok = calls is not None and tool in calls
        out.append(Expectation(f"calls the tool {tool}", ok, f"tool calls: {seen}",
                               "tool_calls.required"))
    for tool in spec.get("forbidden", []):
        ok = calls is None or tool not in calls
        out.append(Expectation(f"does not call the tool {tool}", ok, f"tool calls: {seen}",
                               "tool_calls.forbidden"))
    return out


def valid_keys(a: Answer) -> Expectation:
    bad = invented_keys(a.units)
    evidence = ("; ".join(f"{b.what}: {clip(b.unit.text, 120)}" for b in bad[:3]) if bad
                else "every recommended key is a known Megatron Bridge field, flag or label")
    return Expectation("recommends only knobs that exist (known fields and labels)", not bad,
                       evidence, "valid_keys_only")


def numeric(a: Answer, spec: dict[str, Any]) -> Expectation:
    expect = float(spec["expect"])
    rel, abs_ = float(spec.get("rel_tol", 0.0)), float(spec.get("abs_tol", 1e-9))
    text = f"{spec['extract']} ≈ {spec['expect']}" + (f" (±{rel:.0%})" if rel else "")
    values = _extract(a, spec["extract"])
    if isinstance(values, str):
        return Expectation(text, False, values, "numeric")
    for v in values:
        if math.isclose(v, expect, rel_tol=rel, abs_tol=abs_):
            return Expectation(text, True, f"value {v:g}", "numeric")
    got = ", ".join(f"{v:g}" for v in values[:5]) or "no number"
    return Expectation(text, False, f"found {got}", "numeric")


def _extract(a: Answer, extract: str) -> list[float] | str:
    kind, _, expr = extract.partition(":")
    if kind == "json":
        try:
            vals = [v for block in a.json_blocks for v in query(block, expr)]
        except PathError as exc:
            return str(exc)
        nums = [float(v) for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]
        return nums if nums else f"{expr}: no numeric value in the answer's JSON"
    if kind == "text":
        rx = re.compile(expr, re.IGNORECASE)
        nums = []
        for m in rx.finditer(a.text):
            groups = [g for g in m.groups() if g is not None] if m.groups() else [m.group(0)]
            try:
                nums.append(float(groups[0].replace(",", "")))
            except (ValueError, IndexError, TypeError):
                continue
        return nums if nums else f"text /{expr}/: no match"
    return f"extract {extract!r} must start with 'json:' or 'text:'"


def required_fields(a: Answer, spec: dict[str, Any]) -> list[Expectation]:
    """Paths in the tool's JSON when the answer carries it (a prose answer has none to check)."""
    out: list[Expectation] = []
    if not a.json_blocks:
        return out
    for path in spec["json_paths"]:
        try:
            vals = [v for block in a.json_blocks for v in query(block, path)]
        except PathError as exc:
            vals, note = [], str(exc)
        else:
            note = f"{path} absent from the {spec['tool']} output"
        ok = bool(vals) and any(v not in (None, "", []) for v in vals)
        out.append(Expectation(f"{spec['tool']} output has {path}", ok,
                               clip(repr(vals[0])) if ok else note, "required_fields"))
    return out


def no_skill_claim(a: Answer, skill: str) -> Expectation:
    """A negative case: the answer must not load, cite or lean on the skill it does not need."""
    short = skill.removeprefix("nemo-mbridge-perf-")
    hits = [m for t in (skill, f"{short} skill") for m in find(a.units, t) if m.recommended]
    calls = a.tool_calls or []
    claimed = [c for c in calls if skill in c]
    ok = not hits and not claimed
    evidence = (hits[0].evidence if hits else f"tool calls: {', '.join(claimed)}" if claimed
                else f"{skill} not claimed")
    return Expectation(f"does not claim the {skill} skill (out of its scope)", ok, evidence,
                       "skill_claim", critical=True)
