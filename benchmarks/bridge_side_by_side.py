"""Our most-loaded-stage peak next to Megatron Bridge's own ``estimate_training_memory`` total,
for every Bridge 0.6.2 recipe dump Bridge could estimate, and which term explains each row
where the two differ by more than the threshold (default 30 %). The per-config terms come from
mbridge_perf.memory.bridge_compare, the comparison estimate_memory shows.

Bridge's formula (``training/utils/theoretical_memory_utils.py``) is Korthikanti's per-layer
``s·b·h·(18 + 4·FFN/h)`` with sequence parallelism and selective recompute assumed, plus Adam at
18 B/parameter (6 + 12/DP with the distributed optimizer). It leaves out what this reports per
row: Megatron-FSDP sharding, FP8 parameters and BF16 gradient buffers, the precision-aware
optimizer's BF16 state, GLU activations other than SiLU, hybrid Mamba / GDN layers, MLA, full
recompute, sequence parallelism being off, attention wider than the hidden size, MoE token
dispatch, context-parallel buffers, one layer's backward working set and the last stage's
logits. LoRA-frozen weights are counted with full Adam state by both (noted per row). CUDA
graphs, the allocator and NCCL are in neither peak; the launch column adds them to ours.

Data: ../shared/data/bridge-recipes (dumps, bridge_estimates.csv), else the copy in
tests/data/bridge-recipes.tar.xz. Each dump is read as is, sized on the GPU count Bridge's
estimate used. Not a test: it prints and asserts nothing.

    python benchmarks/bridge_side_by_side.py [--threshold 0.3] [--all] [--family NAME]
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
import tarfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import yaml

from mbridge_perf.config.derived import derive
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.bridge_compare import activation_terms, state_terms
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "bridge-recipes"
ARCHIVE = ROOT / "tests" / "data" / "bridge-recipes.tar.xz"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_corpus() -> tuple[dict[str, str], list[dict[str, str]]]:
    """(recipe → dump text, bridge_estimates rows), from ../shared or the tests' archive."""
    if (SHARED / "bridge_estimates.csv").exists():
        texts = {p.stem: p.read_text() for p in sorted((SHARED / "yaml").glob("*.yaml"))}
        rows = (SHARED / "bridge_estimates.csv").read_text()
    else:
        with tarfile.open(ARCHIVE) as tf:
            files = {m.name: tf.extractfile(m).read().decode()  # type: ignore[union-attr]
                     for m in tf.getmembers() if m.isfile()}
        texts = {Path(n).stem: t for n, t in files.items() if n.startswith("yaml/")}
        rows = files["bridge_estimates.csv"]
    return texts, list(csv.DictReader(io.StringIO(rows)))


def family(recipe: str) -> str:
    """llama3_70b_pretrain_64gpu_h100_bf16_config → llama3_70b."""
    for task in ("_pretrain", "_sft", "_peft", "_text2", "_finetune"):
        if task in recipe:
            return recipe.split(task)[0]
    return recipe.rsplit("_config", 1)[0]


@dataclass
class Row:
    recipe: str
    ours: float  # most-loaded stage peak allocated, GiB
    launch: float  # + CUDA context, NCCL, CUDA-graph pool and the low end of the reserved band
    bridge: float
    ours_state: float
    bridge_state: float
    ours_act: float
    bridge_act: float
    world_note: str
    why: str = ""

    @property
    def diff(self) -> float:
        return (self.ours - self.bridge) / self.bridge


def sized(cfg: TrainingConfig, world: int) -> tuple[MemoryReport, str]:
    """Estimate on Bridge's GPU count; where that world cannot hold the expert mesh
    (ETP·EP·PP does not divide it), on the smallest one that can, and say so."""
    d = derive(cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"num_gpus": world})}))
    note = ""
    if d.is_moe and world % d.expert_model_parallel_size:
        world = math.lcm(world, d.min_gpus)
        note = f"world {d.world_size}→{world}"
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"num_gpus": world})})
    return estimate_memory(cfg), note


def explain(row: Row, cfg: TrainingConfig, report: MemoryReport) -> str:
    state_gap = row.ours_state - row.bridge_state
    act_gap = row.ours_act - row.bridge_act
    side, terms = ("weights+optimizer", state_terms(cfg)) if abs(state_gap) >= abs(act_gap) \
        else ("activations", activation_terms(cfg, report))
    gap = state_gap if side == "weights+optimizer" else act_gap
    if not terms:
        terms = ["no omitted term found: investigate"]
    return f"{side} {gap:+.1f} GiB: " + "; ".join(terms[:3])


def compare(texts: dict[str, str], rows: list[dict[str, str]]) -> tuple[list[Row], list[str]]:
    out, skipped = [], []
    for r in rows:
        name = r["recipe"]
        if not r["total_gib"] or name not in texts:
            skipped.append(f"{name}: Bridge's estimate failed ({r['notes'][:60]})")
            continue
        data = yaml.load(texts[name], Loader=LOADER)
        try:
            cfg = load_config(data=data)
            report, note = sized(cfg, int(r["num_gpus"]))
        except ConfigError as exc:
            skipped.append(f"{name}: {exc}")
            continue
        s = report.per_stage[report.most_loaded_stage]
        o = report.overheads
        row = Row(name, report.peak_allocated_gib,
                  report.peak_allocated_gib + o.total_gib + report.reserved_band_gib[0],
                  float(r["total_gib"]), s.static_gib, float(r["weights_optimizer_gib"]),
                  report.peak_allocated_gib - s.static_gib, float(r["activations_gib"]), note)
        row.why = explain(row, cfg, report)
        out.append(row)
    return out, skipped


def print_families(rows: list[Row], threshold: float) -> None:
    by: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        by[family(r.recipe)].append(r)
    print(f"{'family':22} {'n':>3} {'ours GiB':>9} {'Bridge GiB':>10} {'median Δ':>9} "
          f"{'>' + format(threshold, '.0%'):>5}")
    for fam, rs in sorted(by.items()):
        print(f"{fam:22} {len(rs):3d} {statistics.median(r.ours for r in rs):9.1f} "
              f"{statistics.median(r.bridge for r in rs):10.1f} "
              f"{statistics.median(r.diff for r in rs):+9.0%} "
              f"{sum(abs(r.diff) > threshold for r in rs):5d}")


def print_rows(rows: list[Row], threshold: float, everything: bool) -> None:
    print(f"\n{'recipe':62} {'ours':>6} {'launch':>6} {'Bridge':>7} {'Δ':>6}  explanation")
    for r in sorted(rows, key=lambda r: (family(r.recipe), r.recipe)):
        flagged = abs(r.diff) > threshold
        if not (flagged or everything):
            continue
        note = f" [{r.world_note}]" if r.world_note else ""
        print(f"{r.recipe[:62]:62} {r.ours:6.1f} {r.launch:6.1f} {r.bridge:7.1f} "
              f"{r.diff:+6.0%}  {r.why if flagged else ''}{note}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threshold", type=float, default=0.30)
    ap.add_argument("--all", action="store_true", help="print every row, not only flagged ones")
    ap.add_argument("--family", help="only recipes of this family prefix, e.g. qwen3_235b")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    texts, rows = read_corpus()
    if args.family:
        rows = [r for r in rows if family(r["recipe"]).startswith(args.family)]
    out, skipped = compare(texts, rows)
    flagged = [r for r in out if abs(r.diff) > args.threshold]
    print(f"{len(out)} recipes compared, {len(flagged)} differ by > {args.threshold:.0%}, "
          f"{len(skipped)} not compared; {time.perf_counter() - t0:.1f} s\n")
    print_families(out, args.threshold)
    print_rows(out, args.threshold, args.all)
    if skipped:
        print("\nnot compared:")
        for s in skipped:
            print(f"  {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
