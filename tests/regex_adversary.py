"""Adversarial inputs for a compiled regular expression, found from the expression itself.

Why a generator: hand-written reproducers only cover the patterns someone thought of. For every
pattern this walks its parse tree, takes each prefix of a minimal match (one string per node
boundary: literals, one character of each class, each repeat at its minimum) and appends long
runs of filler characters (spaces, tabs, word and digit characters, the separators logs and
answers use) or repeats prefix + filler - the shapes that make nested or adjacent unbounded
quantifiers backtrack. Used by tests/test_regex_linear.py and benchmarks/input_limits.py.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

try:  # Python 3.11+
    import re._constants as C
    import re._parser as P
except ImportError:  # pragma: no cover
    import sre_constants as C  # type: ignore[no-redef]
    import sre_parse as P  # type: ignore[no-redef]

FILLERS = (" ", "\t", "a", "0", ".", "|", ": ", "\n", "-", "=", "'", "*", "1 ", "[", "→")
_CATEGORY_CHAR = {C.CATEGORY_DIGIT: "0", C.CATEGORY_SPACE: " ", C.CATEGORY_WORD: "a"}
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", C.MAX_REPEAT))


def _one_char(items: list) -> str:
    """A character of a class ``[...]``."""
    for op, av in items:
        if op is C.LITERAL:
            return chr(av)
        if op is C.RANGE:
            return chr(av[0])
        if op is C.CATEGORY:
            return _CATEGORY_CHAR.get(av, "a")
        if op is C.NEGATE:
            return "a" if (C.LITERAL, ord("a")) not in items else "b"
    return "a"


def _cuts(items: list, acc: str, out: list[str]) -> str:
    """Append to ``out`` the minimal-match prefix at every node boundary; return the whole."""
    for op, av in items:
        out.append(acc)
        if op is C.LITERAL:
            acc += chr(av)
        elif op is C.NOT_LITERAL:
            acc += "a" if av != ord("a") else "b"
        elif op is C.IN:
            acc += _one_char(av)
        elif op is C.ANY:
            acc += "a"
        elif op in _REPEATS:
            lo, _, sub = av
            for _ in range(min(max(lo, 1), 3)):
                acc = _cuts(list(sub), acc, out)
        elif op is C.SUBPATTERN:
            acc = _cuts(list(av[-1]), acc, out)
        elif op is C.BRANCH:
            for branch in av[1][1:]:
                _cuts(list(branch), acc, out)
            acc = _cuts(list(av[1][0]), acc, out)
        elif op is getattr(C, "ATOMIC_GROUP", None):
            acc = _cuts(list(av), acc, out)
    out.append(acc)
    return acc


def shapes(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(prefix, filler) pairs to try: every minimal-match prefix with every filler."""
    prefixes: list[str] = []
    _cuts(list(P.parse(pattern.pattern, pattern.flags)), "", prefixes)
    unique = list(dict.fromkeys(p[:200] for p in prefixes))
    if len(unique) > MAX_PREFIXES:  # evenly spaced, the first and the whole match kept
        step = (len(unique) - 1) / (MAX_PREFIXES - 1)
        unique = [unique[round(i * step)] for i in range(MAX_PREFIXES)]
    return [(p, f) for p in unique for f in FILLERS]


def build(prefix: str, filler: str, size: int, repeat: bool) -> str:
    """``prefix`` then ``filler`` to ``size`` characters, or (prefix + 8 fillers) repeated; a
    character no pattern expects at the end, so nothing matches early."""
    if repeat:
        unit = prefix + filler * 8
        text = unit * (size // len(unit) + 1)
    else:
        text = prefix + filler * (size // len(filler) + 1)
    return text[:size] + "\x00"


def run(pattern: re.Pattern[str], text: str, anchored: bool) -> float:
    """CPU seconds to scan ``text`` as the code does: finditer over it, or one match at 0
    (CPU time of this process, so a loaded machine's waiting does not read as scanning)."""
    start = time.process_time()
    if anchored:
        pattern.match(text)
    else:
        for _ in pattern.finditer(text):
            pass
    return time.process_time() - start


MAX_PREFIXES = 16
SMALL = 4_000
GIVE_UP_S = 0.25
"""A 4 KB input that takes this long already shows super-linear growth: the sweep stops."""


def worst_shapes(pattern: re.Pattern[str], anchored: bool, size: int = SMALL,
                 keep: int = 1) -> list[tuple[float, tuple[str, str, bool]]]:
    """The ``keep`` costliest (seconds at ``size``, (prefix, filler, repeat)) shapes; the
    first one alone once a shape takes GIVE_UP_S."""
    timed = []
    for prefix, filler in shapes(pattern):
        for repeat in (False, True):
            dt = run(pattern, build(prefix, filler, size, repeat), anchored)
            if dt > GIVE_UP_S:
                return [(dt, (prefix, filler, repeat))]
            timed.append((dt, (prefix, filler, repeat)))
    timed.sort(key=lambda t: -t[0])
    return timed[:keep]


def worst_time(pattern: re.Pattern[str], anchored: bool, size: int) -> tuple[float, str]:
    """The slowest of the worst shapes at ``size`` characters, and a label for it."""
    out = (0.0, "")
    for _, (prefix, filler, repeat) in worst_shapes(pattern, anchored):
        dt = run(pattern, build(prefix, filler, size, repeat), anchored)
        if dt >= out[0]:
            label = f"({prefix[:40]!r} + {filler!r}*8)*n" if repeat else \
                f"{prefix[:40]!r} + {filler!r}*n"
            out = (dt, label)
    return out


# patterns only ever .match()ed at a bounded number of candidate positions (oom headers, the
# last torchrun summary, the tokens of a short expression or a JSON path, the start of a short
# lead-in paragraph)
ANCHORED = {"mbridge_perf.advise.oom": {"CURRENT", "LEGACY"},
            "mbridge_perf.bench.executors": {"_ROOT_CAUSE"},
            "mbridge_perf.evals.claims": {"_TOKEN"}, "mbridge_perf.evals.jsonpath": {"_TOKEN"},
            "mbridge_perf.evals.text": {"_NEG_INTRO"}}


def package_patterns() -> list[tuple[str, re.Pattern[str], bool]]:
    """Every compiled pattern of the package (the CPU workload script aside), with whether the
    code only ever anchors it (ANCHORED)."""
    import pkgutil

    import mbridge_perf

    modules = {m.name: ANCHORED.get(m.name, set())
               for m in pkgutil.walk_packages(mbridge_perf.__path__, "mbridge_perf.")
               if not m.name.endswith(("__main__", "workloads.cpu_gpt"))}
    return list(patterns(modules))


def patterns(modules: dict[str, set[str]]) -> Iterator[tuple[str, re.Pattern[str], bool]]:
    """(name, pattern, anchored) for every compiled pattern of the given modules; the set
    names the patterns the module only ever .match()es at bounded candidate positions."""
    import importlib

    for module_name, anchored in modules.items():
        module = importlib.import_module(module_name)
        for name, value in sorted(vars(module).items()):
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                yield f"{module_name}.{name}", value, name in anchored
