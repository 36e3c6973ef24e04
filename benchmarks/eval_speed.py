"""Time `eval run` over the whole suite: every recorded answer graded plus our tools' answers.

    .venv/bin/python benchmarks/eval_speed.py [--repeat 5]

Prints the wall time per full run (median of the repeats), answers and expectations graded
and the throughput. Goal: under 5 s for the whole suite.

Then grades 200 KB adversarial answers (repeated knob words, long runs of spaces, deeply nested
lists, one unbroken sentence, arithmetic and arrows everywhere) against every skill's checklist
and misconceptions (`eval grade --skill`) and prints the worst time per shape. Goal: < 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from mbridge_perf.evals.answer import parse_answer
from mbridge_perf.evals.grade import grade_skill
from mbridge_perf.evals.suite import run_suite
from mbridge_perf.skillpack.pack import list_skills

REPO = Path(__file__).resolve().parent.parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="full runs to time")
    args = parser.parse_args()
    times, cpu, report = [], [], None
    with tempfile.TemporaryDirectory() as out:
        for _ in range(max(1, args.repeat)):
            t0, c0 = time.perf_counter(), time.process_time()
            report = run_suite(REPO, out=Path(out))
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    assert report is not None
    n = len(report.outcomes)
    exps = sum(o.grade.summary.total for o in report.outcomes if o.grade is not None)
    med = statistics.median(times)
    print(f"eval run: {med:.2f} s median over {len(times)} runs (min {min(times):.2f} s, "
          f"max {max(times):.2f} s); {n} answers, {exps} expectations, "
          f"{n / med:.0f} answers/s; {statistics.median(cpu):.2f} s CPU median; all as recorded: "
          f"{report.ok}; goal < 5 s")
    worst = adversarial()
    print(f"machine load (1-min average): {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0 if report.ok and worst < 1.0 else 1


ADVERSARIAL_BYTES = 200_000


def shapes() -> dict[str, str]:
    words = ("expandable_segments core_attn TP=8 PP 4→8 mlp recompute_modules=[mlp] "
             "cpu_offloading uniform first layer fp8 halves 28 % 4-way → 8-way ")
    return {
        "repeated knob words": words * (ADVERSARIAL_BYTES // len(words) + 1),
        "runs of spaces": ("TP" + " " * 5000 + "=8 ") * 60,
        "deep lists": "".join("  " * (k % 60) + f"{k}. raise TP 4→8 first; do not use mlp\n"
                              for k in range(6000)),
        "one sentence": "do not raise tp to 8 but set expandable segments " * 5000,
        "arithmetic": "131072 / 4096 = 16 × (4·32) = 128 ÷ 2 = 64; " * 5000,
        "colons and labels": "Recompute: full: offload: graphs: day one: baseline: " * 4000,
        # one comment sentence wrapped over 10,000 lines of a code block
        "wrapped comments": "```yaml\n" + "# and mlp recompute costs 3 % so raise tp\n" * 5000
                            + "```\n",
        # settings the config reader validates, and conversions the unit reader recomputes
        "config lines and units": "```python\n" + "".join(
            f"cfg.model.recompute_num_layers = {k}\ncfg.model.cpu_offloading = True\n"
            for k in range(3000)) + "```\n" + "58.8 GB ≈ 63.1 GiB; " * 2000,
        "json sweep": "```json\n" + json.dumps({"jobs": [
            {"overrides": {"model.recompute_granularity": "selective",
                           "model.cpu_offloading": True, "model.recompute_modules": ["moe"]}}
            for _ in range(1500)]}) + "\n```\n",
        # env exports read into the config, and a sweep whose jobs each build on the one before
        "env exports and sibling chain": "```bash\n" + "".join(
            f"export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # run {k}\n"
            for k in range(2000)) + "```\n\n```json\n" + json.dumps({"candidates": [
                {"id": f"c{k}", "compare_to": f"c{k - 1}",
                 "changes": {"ddp.nccl_ub": k % 2 == 0}} for k in range(1200)]}) + "\n```\n",
        # a YAML config block the config reader loads (under the loader's limits) and validates
        "yaml config block": "```yaml\nmodel:\n  recompute_granularity: selective\n"
                             "  recompute_modules:\n" + "    - moe  # recompute the MoE block\n"
                             * 6000 + "comm_overlap:\n  overlap_moe_expert_parallel_comm: true\n"
                             "```\n",
        # layout arithmetic: sizes, DP / EDP formulas and accumulation counts beside their DP
        "layout arithmetic": "GBS 32, MBS 1, TP=4 PP=8 CP=2 EP=8. DP 1 means 16 accumulation "
                             "steps; EDP = world / (ETP·EP) = 8; DP = world / (TP·PP) = 2. " * 1500,
        # a chat thread of many speakers, and measured pairs whose stated change is recomputed
        "thread and measured pairs": "".join(
            f"**@user{k % 50}** step time dropped by 17.73 %, from 24.7138 s to 20.9920 s.\n\n"
            f"**@perf-bot** 24.7138 s → 20.9920 s (−15.06 %).\n\n" for k in range(1650)),
    }


def adversarial() -> float:
    skills = list_skills(REPO)
    c0 = time.process_time()
    for skill in skills:  # read once per process (eval grade: once per call), not per answer
        _ = skill.card
    print(f"skill cards read: {time.process_time() - c0:.2f} s CPU for {len(skills)}, once, "
          "before the timed grades")
    worst = 0.0
    for name, text in shapes().items():
        text = text[:ADVERSARIAL_BYTES]
        times, cpu = [], []
        for skill in skills:
            t0, c0 = time.perf_counter(), time.process_time()
            grade_skill(skill.card, parse_answer(text), skill.folder_name)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        worst = max(worst, max(cpu))
        print(f"adversarial {name:20s} {len(text.encode()) / 1000:.0f} KB: worst "
              f"{max(cpu):.2f} s CPU ({max(times):.2f} s wall) per grade over {len(skills)} "
              f"skills, parse included (goal < 1 s)")
    return worst


if __name__ == "__main__":
    raise SystemExit(main())
