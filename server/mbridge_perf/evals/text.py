"""Normalised, negation-aware matching of terms in an answer.

An answer is split into units (sentences, list items, table rows, code lines). A term match in a
unit is a *recommendation* unless a negation cue scopes over it ("do not X", "X is blocked"),
it sits in a condition ("if X ..."), or it reports someone else's plan ("your teammate wants
X") — then it is only a *mention*. "Only as a last resort" marks the whole unit *late*: still a
recommendation, ranked after every other one.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import lru_cache

from mbridge_perf.evals.vocab import SIZE_TOKENS, SIZES

# Parallel sizes: every spelling becomes one token ("tp=8"), so TP=8, TP8, "tensor parallel
# size 8" and tensor_model_parallel_size=8 match each other and PP=8 never matches VPP=8.
_SIZES = SIZES
# (a config path's "model." is no word boundary: model.pipeline_model_parallel_size is PP)
_SIZE_RE = [(re.compile(rf"(?:(?<![a-z0-9_.])|(?<=model\.))(?:{pat})(?![a-z_])"), tok)
            for pat, tok in _SIZES]
_SIZE_TOK = SIZE_TOKENS
# (normalise applies it after white space runs became one space: one optional space a side)
# (Japanese puts a particle between the size and its value: "PP を 4 → 8", "TP は 8"; "TP を 2 倍"
# is a factor, not a size)
# (a table row puts the value in the next cell: "| pp | 4 -> 8 |")
_SIZE_VALUE = re.compile(rf"(?<![a-z0-9_])({_SIZE_TOK}) ?(?:=|:|\||of|to|is|at|from|size|を|は|が)?"
                         r" ?(\d{1,9})(?!\d|\.\d| ?倍)")
_SIZE_ARROW = re.compile(rf"(?<![a-z0-9_])({_SIZE_TOK})=(\d+)\s*(?:->|→|to)\s*(\d+)")
_FLAG_VALUE = re.compile(r"(?<![\w\-])(--?[a-z][a-z0-9_\-]{0,63})\s{1,8}(\d{1,12}|true|false)\b")
_DROP = re.compile(r"[`*\"'“”‘’]")
_SPACE = re.compile(r"\s+")
# Numbers with units: "28 %", "28 percent", "−28 pct" -> "28%"; unicode minus and dashes -> "-".
_MINUS = re.compile(r"[−‒–—](?=\d)")
_PERCENT = re.compile(r"(\d)\s*(?:%|percent\b|per cent\b|pct\b)")
# "4-way → 8-way TP", "TP 4-way -> 8-way", "8-way TP": sizes as tp=4 -> tp=8 / tp=8.
_WAY_PAIR = re.compile(rf"(?:\b({_SIZE_TOK})\s{{1,8}})?(\d{{1,6}})-way\s{{0,8}}(?:->|→|to)"
                       rf"\s{{0,8}}(\d{{1,6}})-way(?:\s{{1,8}}({_SIZE_TOK})\b)?")
_WAY_ONE = re.compile(rf"(?<!\d)(\d{{1,6}})-way\s{{1,8}}({_SIZE_TOK})\b"
                      rf"|\b({_SIZE_TOK})\s{{1,8}}(\d{{1,6}})-way")
_FROM_TO = re.compile(rf"(?<![a-z0-9_])({_SIZE_TOK})\s+from\s+(\d+)\s+to\s+(\d+)(?!\d)")
# Applied after white space runs are one space each (normalise), so one optional space a side.
_ARROW = re.compile(r" ?(?:->|→|=>|⇒) ?")


def _way_pair(m: re.Match[str]) -> str:
    tok = m.group(1) or m.group(4)
    if not tok:
        return m.group(0)
    return f"{tok}={m.group(2)} -> {tok}={m.group(3)}"


def _way_one(m: re.Match[str]) -> str:
    if m.group(1):
        return f"{m.group(2)}={m.group(1)}"
    return f"{m.group(3)}={m.group(4)}"


# Contractions before the apostrophes go: "isn't" -> "is not", "can't" -> "cannot".
_NOT = re.compile(r"\b(?:(can|won|shan|ain)|(\w+)n)['’]t\b")
_NOT_IRREGULAR = {"ca": "cannot", "wo": "will not", "sha": "shall not", "ai": "is not",
                  "can": "cannot", "won": "will not", "shan": "shall not", "ain": "is not"}


def _not(m: re.Match[str]) -> str:
    if m.group(1):
        return _NOT_IRREGULAR[m.group(1)]
    stem = m.group(2)
    return _NOT_IRREGULAR.get(stem, f"{stem} not")


_CONTRACTION = re.compile(r"\b(i|we|you|they|he|she|it|that|there|let)['’](d|ll|s|re|ve|m)\b")
_EXPAND = {"d": "would", "ll": "will", "re": "are", "ve": "have", "m": "am"}


def _contraction(m: re.Match[str]) -> str:
    who, tail = m.group(1), m.group(2)
    if tail == "s":
        return "let us" if who == "let" else f"{who} is"
    return f"{who} {_EXPAND[tail]}"


def normalise(text: str) -> str:
    """Lower-case, drop quotes and emphasis, one space per run of white space, one spelling per
    parallel size and size change (TP 4→8, "from 4 to 8", "4-way → 8-way" all read
    ``tp=4 -> tp=8``), percentages as ``28%``, flags as flag=v."""
    s = _CONTRACTION.sub(_contraction, _NOT.sub(_not, text.lower()))
    s = _SPACE.sub(" ", _DROP.sub("", s))
    s = _PERCENT.sub(r"\1%", _MINUS.sub("-", s))
    s = _ARROW.sub(" -> ", s)
    for rx, tok in _SIZE_RE:
        s = rx.sub(tok, s)
    s = _WAY_PAIR.sub(_way_pair, s)
    s = _WAY_ONE.sub(_way_one, s)
    s = _FROM_TO.sub(r"\1=\2 -> \1=\3", s)
    s = _SIZE_VALUE.sub(r"\1=\2", s)
    s = _SIZE_ARROW.sub(r"\1=\2 -> \1=\3", s)
    return _FLAG_VALUE.sub(r"\1=\2", s)


@lru_cache(maxsize=4096)
def term_regex(term: str) -> re.Pattern[str]:
    """A term as a regex over normalised text: `_`, `-` and spaces interchangeable, `:` = `=`,
    whole words only (``moe`` does not match ``moe_act``, ``mlp`` matches ``mlp recompute``).
    A term ``re:<regex>`` is that regular expression over normalised text."""
    if term.startswith("re:"):
        return re.compile(term[3:], re.MULTILINE)
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
    return re.compile(left + body + right, re.MULTILINE)


# ---------------------------------------------------------------- cues

_BREAK = re.compile(r";|\.\s|\?\s|!\s|\s[—–]\s|\s-\s|\)|\bbut\b|\bhowever\b|\bwhereas\b"
                    # a purpose clause with its own subject: "set X so attention does not ..."
                    r"|\sso (?:that )?(?=(?:[\w-]+ ){1,4}"
                    r"(?:does|do|did|is|are|will|would|can|cannot)\b)"
                    r"|,\s*(?:then|so|and then|which|while|instead|it|this|that)\b|:\s|。"
                    # "skip the warm-up and average 11-20": a second imperative is its own clause
                    r"|\band (?=(?:then )?(?:average|take|compute|use|set|add|run|compare|read|"
                    r"enable|keep|export|measure|check)\b)")
_PREFIX = re.compile(
    r"\b(?:do not|don't|dont|does not|doesn't|never|avoid(?:ing)?|instead of|rather than|not|no|"
    r"none of|"
    r"without|nor|neither|reject(?:ed)?|against|stop|drop|disable|turn off|switch off|remove|"
    r"clear|delete|"
    r"skip|cannot|can't|won't|will not|wrong|myth|bad idea|refuse[sd]?|forbid(?:den)?|"
    r"do not use|unsafe)\b|[❌✗🚫🔴]"
    # "leave core_attn out", "keep X out of the list": the object sits between verb and "out"
    r"|\b(?:leave|keep)\b(?=(?: [^ ;.,]{1,40}){1,3} out\b)")
_SUFFIX = re.compile(
    r"\b(?:blocked|incompatible|unsupported|not supported|not possible|impossible|is not|are not|"
    r"isn't|aren't|should not|shouldn't|must not|does not|doesn't|do not|did not|didn't|won't|"
    r"will not|cannot|can't|fails?|failed|refuses?|refused|rejected|is wrong|are wrong|wrong|"
    r"not first|not the first|is not needed|not needed|not a memory|asserts|is refused|"
    r"is a myth|would fail|breaks|crash(?:es)?|no effect|not help|not valid|invalid|"
    r"does not exist|do not exist|not allowed|out of scope|deprecated|costs? -?\d|"
    # "up_proj: not a recompute label", "not a valid field"
    r"not an? (?:valid |real |known |supported |recompute |config )?(?:label|field|flag|key|"
    r"option|choice|module)|"
    r"(?:frees|saves|saved|freed|buys|bought) (?:about |almost |only |roughly |around |nearly |"
    r"close to |essentially |practically |virtually |≈ ?|~)?(?:0\b|nothing|little|zero))"
    # Japanese puts the verdict after its subject ("X は … と組み合わせるとアサートします",
    # "X は使えません", "X ではなく Y")
    r"|アサート|アサーション|できません|できない|使えません|使えない|効きません|効かない|減りません|"
    r"減らない|非対応|未対応|サポートされ(?:ない|ません|ていない|ていません)|拒否|禁止|不可|"
    r"共存できない|併用できない|エラーにな|(?:おすすめ|お勧め|推奨)(?:し|でき)?(?:ません|ない)|避け|やめ"
    # "X は存在しません" (no such label), "受け付けられません", "X を勧めない"
    r"|存在し(?:ない|ません)|受け付け(?:られ)?(?:ない|ません)|勧め(?:ない|ません)|無効"
    # "core_attn は効いていない", "メモリを減らす効果はありません", "mla_up_proj は使わない"
    r"|効いてい(?:ない|ません)|効果(?:は|が)(?:ない|ありません)|使わ(?:ない|ず)|使いません"
    r"|意味(?:は|が)(?:ない|ありません)"
    # "core_attn には期待しない" (expect nothing of it), "X は入れません / 含めません" (left out)
    r"|期待(?:し|でき)(?:ない|ません)|入れ(?:ない|ません)|含め(?:ない|ません)"
    # prohibitions: "X で比べてはいけません", "X すべきではない", "X しないでください"
    r"|[てで]はいけ(?:ない|ません)|[てで]はなりません|べきで(?:は)?(?:ない|ありません)|ないでください"
    # "ログに X の警告が出ていないこと" (X's warning does not appear): a check, not advice
    r"|出(?:てい)?(?:ない|ません)"
    # "X は使えなくなります" (X stops working): the verdict of a change
    r"|(?:使え|でき|効か)なくな"
    # "X ではない", "X とは限りません" (not necessarily X), "X わけではない"
    r"|ではない|ではありません|じゃない|とは限(?:らない|らず|りません)|わけではな|わけではありません"
    # "cpu_offloading raises a ValueError": refused at startup
    r"|\braises (?:a |an )?(?:valueerror|assertionerror|error|assertion)")
# "X ではなく Y" negates the word right before it, not the clause's subject.
_JA_NOT_AFTER = re.compile(r" ?(?:ではなく|じゃなく|でなく|でもなく)")
_SUFFIX_REACH = 110
_NOT_FIRST = re.compile(r"\bnot\b[^;.]{0,60}\bfirst\b")
_COND = re.compile(r"\b(?:if|when|whenever|unless|until|once|whether)\b[^,;.:]*")
# "With TE graphs plus X you need Y": the with-phrase before "you need" is the condition Y
# answers, not advice to set X.
_WITH_NEED = re.compile(r"\bwith\b[^,;.\n]{1,80}?(?=,? (?:you |we )?(?:also )?(?:need|must|"
                        r"have to|require)\b)")
# Japanese puts the condition before its cue ("X を併用する場合は、Y も必要です"): the span runs
# back from the cue to the clause start, at most 80 characters (one bounded look-back per cue).
_JA_COND = re.compile(r"場合|(?:とき|時)(?=[はに、])")
_JA_STOP = "、。，,;：!?"


def _conditions(s: str) -> list[tuple[int, int]]:
    spans = [(m.start(), m.end()) for m in _COND.finditer(s)]
    spans += [(m.start(), m.end()) for m in _WITH_NEED.finditer(s)]
    for m in _JA_COND.finditer(s):
        lo = max(0, m.start() - 80)
        cut = max(s.rfind(c, lo, m.start()) for c in _JA_STOP)
        spans.append((max(lo, cut + 1), m.end()))
    return _merge(spans)
# "if X is not already in the env, add it": a condition on the user's current state whose main
# clause does X is advice to do X (the condition only spares those who already have it).
_IF_MISSING = re.compile(
    r"\b(?:is|are|has|have|was) not (?:already |yet )?(?:set|there|in|on|enabled|exported|"
    r"present|configured|been set)\b[^,;.:]{0,60}, (?:then )?(?:add|set|export|enable|put|"
    r"turn on|include|do)\b")
_IF_WORD = re.compile(r"\b(?:if|in case)\b")
_LEAD_BREAK = re.compile(r"[,;]|[.:] ")


def _if_missing(s: str) -> list[tuple[int, int]]:
    """Spans "if X is not already set, add it": the state clause is found first, then its
    "if" at most 160 characters back with no clause break between (one bounded look-back per
    hit: the last break, then the first "if" after it, so the scan is linear)."""
    out = []
    for m in _IF_MISSING.finditer(s):
        lo = max(0, m.start() - 160)
        for brk in _LEAD_BREAK.finditer(s, lo, m.start()):
            lo = brk.end()
        lead = _IF_WORD.search(s, lo, m.start())
        if lead is not None:
            out.append((lead.start(), m.end()))
    return out


_REPORTED = re.compile(
    r"\b(?:you plan|you are planning|planning to|plans? to|teammate|colleague|someone|he wants|"
    r"she wants|wants to|proposes?|proposed|suggests?|suggested|claims?|claimed|the question|"
    r"your current|you currently|currently|you tried|was tried|you set|you have|your config|"
    r"the review bot|review bot|asked|runbook says|already)\b"
    # a record being read out ("here is what the tracker shows: ...")
    r"|\bwhat (?:the |our |your )?[\w-]{1,20} (?:shows|showed|says|said|reports|reported)\b"
    # Japanese: results so far, what was measured ("これまでの傾向", "今までの実測")
    r"|(?:これまで|今まで)(?:の|に|で)|実測(?:では|値|結果)|測定結果")
_LATE = re.compile(
    r"only as a last resort|as a last resort|last resort|only if (?:it |the oom |the job |you |"
    r"that |this )?still|only if the oom persists|(?:a |as a )later step|as a last step|"
    r"only when selective (?:recompute )?(?:cannot|can't) fit|only if selective (?:recompute )?"
    r"(?:cannot|can't|still)|only after|(?:a |as a )?later (?:candidates?|a/?bs?|steps?|options?)"
    r"|(?:comes?|are|is) later\b|\blater,? once\b")
# (a heading that narrates an event - "Postmortem: the speedup did not reach production" - is
# no rejection; "what did not work" still is)
_NEG_HEADING = re.compile(r"\b(?:(?<!did )(?<!was )(?<!were )not|did not (?:work|help|fit|pay)|"
                          r"avoid|don't|do not|reject(?:ed)?|wrong|mistakes?|myths?|"
                          r"pitfalls?|never|incompatible|blocked|what not)\b")


@dataclass(frozen=True)
class Unit:
    """One sentence / list item / row: its text, normalised text and how it may recommend."""

    text: str
    norm: str
    index: int
    late: bool = False
    negated_section: bool = False
    lead: bool = False      # the first sentence of an ordered list item (a plan step's head)
    block: int = -1         # the paragraph / list item it belongs to (-1: none known)
    quoted: bool = False    # a line of quoted program output (a log or error message)
    kept: bool = False      # a list item under "Leave as is:" - a setting kept, not a step


@dataclass(frozen=True)
class Match:
    unit: Unit
    start: int
    end: int
    recommended: bool
    late: bool = False      # the unit, or the clause of the match, defers it ("FP8 later")

    @property
    def rank(self) -> tuple[int, int]:
        return (1 if self.late else 0, self.unit.index)

    @property
    def evidence(self) -> str:
        return clip(self.unit.text)


def clip(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


class _Scan:
    """Everything about a unit that judging a match needs, found in one pass per cue kind, so
    judging each of its matches costs a few bisections (linear in the unit, not quadratic)."""

    def __init__(self, s: str) -> None:
        self.breaks = [(m.start(), m.end()) for m in _BREAK.finditer(s)]
        self.break_starts = [b[0] for b in self.breaks]
        self.break_ends = [b[1] for b in self.breaks]
        self.late = [(m.start(), m.end()) for m in _LATE.finditer(s)]
        self.cond = _conditions(s)
        self.if_missing = _if_missing(s)
        self.skip = _merge(self.late + self.cond)
        self.reported = [m.start() for m in _REPORTED.finditer(s)]
        self.label_ends = [m.end() for m in _LABEL.finditer(s)]
        lead = _LIST_LABEL.match(s)
        self.list_label_end = lead.end() if lead else -1
        self.semis = [k for k, ch in enumerate(s) if ch == ";"]
        self.prefix = [(m.start(), m.end()) for m in _PREFIX.finditer(s)
                       if not self.masked(m.start(), m.end())]
        self.prefix_starts = [p[0] for p in self.prefix]
        self.suffix = [(m.start(), m.end()) for m in _SUFFIX.finditer(s)
                       if not self.masked(m.start(), m.end())]
        self.suffix_starts = [p[0] for p in self.suffix]
        self.not_first = [(m.start(), m.end()) for m in _NOT_FIRST.finditer(s)
                          if not self.masked(m.start(), m.end())]
        self.not_first_starts = [p[0] for p in self.not_first]
        self.graph_lists = [(m.start(), m.end()) for m in _GRAPH_LIST.finditer(s)]
        bar = s.find("|", 1) if s.startswith("|") else -1
        self.row_rejected = (bar > 0 and bool(_ROW_NO.search(s, bar))) or bool(
            _VERDICT_TAIL.search(s))

    def clause(self, start: int, end: int, n: int) -> tuple[int, int]:
        k = bisect_right(self.break_ends, start) - 1
        lo = self.break_ends[k] if k >= 0 else 0
        j = bisect_left(self.break_starts, end)
        hi = self.break_starts[j] if j < len(self.break_starts) else n
        return lo, hi

    def masked(self, a: int, b: int) -> bool:
        return _hits(self.skip, a) or _hits(self.skip, b - 1)


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for x, y in sorted(spans):
        if out and x <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], y))
        else:
            out.append((x, y))
    return out


def _hits(spans: list[tuple[int, int]], pos: int) -> bool:
    """Whether pos lies inside one of the sorted, disjoint spans."""
    k = bisect_right(spans, (pos, 1 << 60)) - 1
    return k >= 0 and spans[k][0] <= pos < spans[k][1]


def _inside(spans: list[tuple[int, int]], a: int, b: int) -> bool:
    k = bisect_right(spans, (a, 1 << 60)) - 1
    return k >= 0 and spans[k][0] <= a and b <= spans[k][1]


@lru_cache(maxsize=8192)
def _scan(s: str) -> _Scan:
    return _Scan(s)


def _first_at(starts: list[int], spans: list[tuple[int, int]], lo: int, hi: int
              ) -> tuple[int, int] | None:
    k = bisect_left(starts, lo)
    if k < len(spans) and spans[k][1] <= hi:
        return spans[k]
    return None


_SUBSTITUTE = ("instead of", "rather than")
# "recompute_num_layers=None": a key set to none is reset, not recommended.
_RESET = re.compile(r" ?(?:[:=]|(?:must|should|has to|needs to) (?:be|stay|remain)|(?:is )?set to)"
                    r" ?(?:none|null)\b")


def _prefixed(sc: _Scan, s: str, lo: int, start: int) -> bool:
    """A negation cue between the clause start and the match scopes over it; "instead of X,
    Y" / "rather than X, Y" negate X only, not what follows the comma (at most 8 cues read)."""
    k = bisect_left(sc.prefix_starts, lo)
    for a, b in sc.prefix[k:k + 8]:
        if b > start:
            return False
        if not (s[a:b] in _SUBSTITUTE and "," in s[b:start]):
            return True
    return False


def is_recommended(unit: Unit, start: int, end: int) -> bool:
    """Whether the match [start, end) of a unit is advice rather than a mention (a quoted line -
    program output, the user's diff in a review - is never the answer's advice)."""
    if unit.negated_section or unit.quoted:
        return False
    s = unit.norm
    sc = _scan(s)
    if sc.row_rejected or _RESET.match(s, end):
        return False
    if _inside(sc.if_missing, start, end):
        return True
    lo, hi = sc.clause(start, end, len(s))
    if _inside(sc.cond, start, end):
        return False
    k = bisect_left(sc.reported, lo)
    if (k < len(sc.reported) and sc.reported[k] < hi) or _under_label(sc, start):
        return False
    if _prefixed(sc, s, lo, start) or _JA_NOT_AFTER.match(s, end):
        return False
    limit = min(hi, end + _SUFFIX_REACH)
    k = bisect_left(sc.suffix_starts, end)
    while k < len(sc.suffix) and sc.suffix[k][1] <= limit:
        if not _own_subject(s, end, sc.suffix[k][0]):
            return False
        k += 1
    return _first_at(sc.not_first_starts, sc.not_first, end, hi) is None


def is_negated(unit: Unit, start: int, end: int) -> bool:
    """Whether a negation cue in its clause scopes over the match ("does not save much",
    "X is not supported") — polarity only, without the reported / conditional readings."""
    s = unit.norm
    sc = _scan(s)
    lo, hi = sc.clause(start, end, len(s))
    if (sc.row_rejected or _prefixed(sc, s, lo, start) or _under_label(sc, start)
            or _JA_NOT_AFTER.match(s, end)):
        return True
    limit = min(hi, end + _SUFFIX_REACH)
    k = bisect_left(sc.suffix_starts, end)
    while k < len(sc.suffix) and sc.suffix[k][1] <= limit:
        cue = sc.suffix[k][0]
        # "X costs some gain rather than failing": the failure is the alternative set aside
        if (not _own_subject(s, end, cue)
                and not s[max(0, cue - 32):cue].rstrip().endswith(_SUBSTITUTE)):
            return True
        k += 1
    return False


# "Avoid: TP=8, PP=8", "Do not trade DP for PP: PP 4→8 ..." — a cue used as a label (or a
# negated lead-in ending in a colon) negates the rest of the unit up to a ";".
_LABEL = re.compile(r"\b(?:avoid|do not|don't|never|rejected|not recommended|what not to do|"
                    r"wrong|mistakes?|claims to avoid|not (?:available|applicable|an option|"
                    r"options|possible|usable)|unavailable|ruled out|off the table)\s*:|"
                    r"(?:(?:やって|して)はいけないこと|やらないこと|避けること|禁止事項)\W{0,3}[:：]|"
                    r"^\s*(?:\d+[.)]\s*)?(?:do not|don't|never|avoid|no)\b[^:;.]{0,80}:")
# A table row whose verdict cell (any cell after the first) opens with a rejection: "| TP 4→8 |
# no (-28.4 %) |", "| CPU offload | ✗ at PP=4 |". A cell that opens with "no" and a noun ("| no
# throughput cost |") quantifies; only a bare "no" is a verdict.
_ROW_NO = re.compile(r"\| ?(?:no(?= ?(?:[(,;.:|—–-]|go\b|$))|"
                     r"(?:not|never|avoid|do not|skip|rejected|out)\b|[✗❌🚫])")
# A review's verdict closing the line it judges ("`recompute_modules: [up_proj]` — blocking."):
# the whole unit is the rejected item.
_VERDICT_TAIL = re.compile(r"[—–] ?(?:blocking|rejected|invalid|wrong|not valid)[^a-z]{0,3}$"
                           # or a label's verdict after its colon ("CPU offloading: impossible
                           # with PP > 1")
                           r"|^[^:|]{1,60}: (?:impossible|not possible|unavailable|not available|"
                           r"not allowed|forbidden|rejected|invalid|blocked|ruled out)\b"
                           r"|^[^:|]{1,60}: [^;]{0,80}\b(?:raises (?:a |an )?(?:valueerror|error|"
                           r"assertion)|(?:is )?not (?:possible|allowed|supported|available)"
                           r"|not (?:\w+ ){0,2}(?:labels?|fields?|flags?))\b")
# A graph scope list names modules that are captured, not recomputed.
_GRAPH_LIST = re.compile(r"cuda[_ ]graph[_ ](?:modules|scope)\s*[:=]?\s*\[[^\]]{0,200}\]|"
                         r"(?:graph(?:s|ed)?|capture[sd]?)\s+(?:scope|modules?)\s*[:=]?\s*"
                         r"(?:(?:attn|mlp|moe|moe_router|moe_preprocess|mamba|layernorm)"
                         r"(?:,\s*|\s+and\s+|\s+)?){1,6}")


# A unit led by a label that rejects a list ("Not options: layer offloading (PP 4); VPP (a
# bubble knob); FP8 as a memory fix"): every item after it, past the semicolons, is rejected.
_LIST_LABEL = re.compile(r"^\W{0,3}(?:not (?:available|applicable|an option|options|possible|"
                         r"usable)|unavailable|ruled out|off the table|rejected|excluded)\s*:")


def _under_label(sc: _Scan, start: int) -> bool:
    if 0 <= sc.list_label_end <= start:
        return True
    k = bisect_left(sc.label_ends, start + 1) - 1
    if k < 0:
        return False
    j = bisect_left(sc.semis, start) - 1
    return j < 0 or sc.semis[j] < sc.label_ends[k]


def is_hypothetical(unit: Unit, start: int, end: int) -> bool:
    """Whether a match lies inside a condition or an open alternative ("if X", "whether X or
    Y", "only if selective cannot fit"): such a clause asserts neither X nor Y."""
    return _inside(_scan(unit.norm).cond, start, end)


# A question asserts nothing ("Q: could I offload to CPU?", "is it fragmentation?").
_QUESTION_LEAD = re.compile(r"^(?:\d+[.)] ?)?q ?[:.] ")


def is_question(unit: Unit) -> bool:
    """A unit that asks rather than states: it ends in '?' or is the question of a Q&A pair."""
    s = unit.norm.rstrip(" *_`)")
    return s.endswith("?") or bool(_QUESTION_LEAD.match(s))


def is_late(unit: Unit, start: int, end: int) -> bool:
    """Whether the clause of a match defers it ("FP8 is a later candidate")."""
    sc = _scan(unit.norm)
    lo, hi = sc.clause(start, end, len(unit.norm))
    k = bisect_left(sc.late, (lo, -1))
    return k < len(sc.late) and sc.late[k][0] < hi


def in_graph_scope(unit: Unit, start: int, end: int) -> bool:
    """Whether a match sits in a CUDA-graph module list ("cuda_graph_modules: [mlp]")."""
    return _inside(_scan(unit.norm).graph_lists, start, end)


_PAREN_LEAD = re.compile(r"\(\s*(?:it |is |are |both |all |now |currently |still )*$")


def _own_subject(s: str, end: int, cue: int) -> bool:
    """A suffix cue inside a parenthesis that has its own subject ("layernorm (core_attn frees
    about 0)") judges that subject, not the match before the parenthesis."""
    paren = s.rfind("(", end, cue)
    return paren >= 0 and not _PAREN_LEAD.match(s, paren, cue)


_CORPUS: dict[int, tuple[list[Unit], str, list[int]]] = {}
# Matches judged per spelling of a term: an answer that repeats a knob word thousands of times
# is judged on its first occurrences (advice that only appears after 256 mentions is not read).
MAX_MATCHES = 256


def _corpus(units: list[Unit]) -> tuple[str, list[int]]:
    """The units' normalised texts joined by newlines (normalised text has none), and where
    each starts: one regex pass over an answer instead of one per unit."""
    hit = _CORPUS.get(id(units))
    if hit is not None and hit[0] is units and len(hit[2]) == len(units):
        return hit[1], hit[2]
    starts, pos = [], 0
    for u in units:
        starts.append(pos)
        pos += len(u.norm) + 1
    joined = "\n".join(u.norm for u in units)
    if len(_CORPUS) >= 16:
        _CORPUS.clear()
    _CORPUS[id(units)] = (units, joined, starts)
    return joined, starts


def find(units: list[Unit], term: str) -> list[Match]:
    """Every match of a term (alternatives split on `|`) in the units, in document order."""
    found: list[Match] = []
    alts = [term] if term.startswith("re:") else [t for t in term.split("|") if t.strip()]
    joined, starts = _corpus(units) if len(units) > 8 else ("", [])
    for alt in alts:
        rx = term_regex(alt)
        graph_term = "graph" in alt.lower()
        if starts:
            pairs = []
            for n, m in enumerate(rx.finditer(joined)):
                if n >= MAX_MATCHES:
                    break
                k = bisect_right(starts, m.start()) - 1
                a, b = m.start() - starts[k], m.end() - starts[k]
                if b <= len(units[k].norm) and a < b:
                    pairs.append((units[k], a, b))
        else:
            pairs = [(u, m.start(), m.end()) for u in units for m in rx.finditer(u.norm)]
            del pairs[MAX_MATCHES:]
        for u, a, b in pairs:
            if not graph_term and in_graph_scope(u, a, b):
                continue
            found.append(Match(u, a, b, is_recommended(u, a, b), u.late or is_late(u, a, b)))
    found.sort(key=lambda m: (m.unit.index, m.start))
    return found


def heading_flags(heading: str) -> tuple[bool, bool]:
    """(negated, late) for the units of a section with this heading."""
    h = normalise(heading)
    return bool(_NEG_HEADING.search(h)), bool(_LATE.search(h))


# A lead-in paragraph that ends in a colon and rejects what it introduces ("Things I would not
# do:", "Avoid these:", "What not to do:"): the list after it is negated like a heading's.
# Only ever .match()ed at the start of a paragraph of at most 160 characters.
_NEG_INTRO = re.compile(
    r"(?:avoid|do not|never|not recommended|rejected|what not to do|pitfalls|mistakes|wrong|"
    r"dead ends)\b|.{0,160}?(?:\b(?:would|should|will|do|did) not (?:do|try|use|recommend|"
    r"touch|bother)\b|\bnot to do\b|\b(?:things|levers|options|steps) to avoid\b)")


def negated_intro(paragraph: str) -> bool:
    """A short paragraph ending in ':' that rejects the list it introduces."""
    text = paragraph.strip()
    return (text.endswith(":") and len(text) <= 160
            and bool(_NEG_INTRO.match(normalise(text))))


# A short lead-in that keeps what it lists ("**Leave as is / please confirm**", "Unchanged:",
# "Keep these:"): the items are settings kept as they are, not steps of the plan.
_KEPT_INTRO = re.compile(r"\W{0,4}(?:(?:leave|keep)(?: (?:these|this|them|it|the rest))? "
                         r"(?:as[ -]is|unchanged|alone)|unchanged\b|no change|fine as[ -]is|"
                         r"what is (?:fine|right|correct)|already (?:right|fine|correct))")


def kept_intro(paragraph: str) -> bool:
    """A short paragraph (at most 80 characters) that keeps the list it introduces."""
    text = paragraph.strip()
    return len(text) <= 80 and bool(_KEPT_INTRO.match(normalise(text)))


_UNIT_LATE = re.compile(
    r"only as a last resort|as a last resort|last resort|only if (?:it |the oom |the job |you |"
    r"that |this )?still|only if the oom persists|(?:a |as a )later step|as a last step|"
    r"only when selective (?:recompute )?(?:cannot|can't) fit|only if selective (?:recompute )?"
    r"(?:cannot|can't|still)|only after")


# A config line with a trailing comment ("recompute_modules = [layernorm]  # mlp only as a last
# resort"): the comment's cue defers what the comment names (clause-level), not the line's key.
_CODE_COMMENT = re.compile(r"^[a-z_][\w.\[\]]{0,80} ?= ?[^#]{0,200}?(?= #)")


def unit_is_late(norm: str) -> bool:
    """A whole unit is late advice ("only as a last resort: add mlp"); a clause-level cue
    ("FP8 is a later candidate") defers only its own matches (``is_late``)."""
    code = _CODE_COMMENT.match(norm)
    return bool(_UNIT_LATE.search(code.group(0) if code else norm))
