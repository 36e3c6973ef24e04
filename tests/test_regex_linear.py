"""Every regular expression in the package scans untrusted text (OOM messages, logs, answers,
configs) in time linear in its length: for each pattern, inputs found from the pattern itself
(tests/regex_adversary.py) grow from 200 KB to 2 MB and the time grows about tenfold, not a
hundredfold. benchmarks/input_limits.py prints the 2 MB times."""

from __future__ import annotations

import pytest

from regex_adversary import GIVE_UP_S, build, package_patterns, run, worst_shapes

ALL = package_patterns()


def test_the_package_has_patterns_to_check() -> None:
    names = {name for name, _, _ in ALL}
    assert {"mbridge_perf.advise.oom.MLM_MEM", "mbridge_perf.advise.oom.NCCL_TIMEOUT",
            "mbridge_perf.advise.oom.ALLOC_SET"} <= names
    assert len(ALL) >= 40


@pytest.mark.parametrize(("name", "pattern", "anchored"), ALL, ids=[n for n, _, _ in ALL])
def test_scanning_time_grows_linearly(name: str, pattern, anchored: bool) -> None:
    for at_small, (prefix, filler, repeat) in worst_shapes(pattern, anchored):
        shape = f"{prefix[:40]!r} + {filler!r}{' repeated' if repeat else ''}"
        assert at_small <= GIVE_UP_S, f"{name}: {shape}: {at_small:.2f} s for 4 KB"
        # grow the text tenfold at a time, up to 2 MB: linear scanning takes about ten times
        # as long, quadratic about a hundred (stop there, before it takes minutes)
        before = min(run(pattern, build(prefix, filler, 4_000, repeat), anchored)
                     for _ in range(3))
        for size in (40_000, 400_000, 2_000_000):
            now = min(run(pattern, build(prefix, filler, size, repeat), anchored)
                      for _ in range(1 if size > 400_000 else 2))
            growth = size / (size // 10 if size != 2_000_000 else 400_000)
            assert now < 0.05 or now < 3 * growth * before, (
                f"{name}: {shape}: {before:.4f} s -> {now:.4f} s for {growth:.0f}x the text "
                f"({size:,} characters)")
            before = now
