"""Time `eval run` over the whole suite: every recorded answer graded plus our tools' answers.

    .venv/bin/python benchmarks/eval_speed.py [--repeat 5]

Prints the wall time per full run (median of the repeats), answers and expectations graded
and the throughput. Goal: under 5 s for the whole suite.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from mbridge_perf.evals.suite import run_suite

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="full runs to time")
    args = parser.parse_args()
    times, report = [], None
    with tempfile.TemporaryDirectory() as out:
        for _ in range(max(1, args.repeat)):
            t0 = time.perf_counter()
            report = run_suite(REPO, out=Path(out))
            times.append(time.perf_counter() - t0)
    assert report is not None
    n = len(report.outcomes)
    exps = sum(o.grade.summary.total for o in report.outcomes if o.grade is not None)
    med = statistics.median(times)
    print(f"eval run: {med:.2f} s median over {len(times)} runs (min {min(times):.2f} s, "
          f"max {max(times):.2f} s); {n} answers, {exps} expectations, "
          f"{n / med:.0f} answers/s; all as recorded: {report.ok}; goal < 5 s")
    return 0 if report.ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
