"""Where plan_parallelism ranks the layout of each Megatron Bridge perf recipe: NVIDIA picked
those layouts on runs, for throughput, so the rank their (TP, CP, EP, PP) gets is a measured
check of the ranking keys - the only one available without a GPU cluster.

Each ``<model>_pretrain_<N>gpu_<gpu>_<precision>_config`` dump of Bridge 0.6.2 is planned on
its own GPU count, GPU, sequence length, global and micro-batch size, precision, recompute and
offload (ETP pinned to the recipe's own, Megatron-Core's default TP where it sets none), top 50.
A recipe counts where our estimator says its own layout fits; the rest are listed apart (the
library dumps lack some launch-time settings). Prints per recipe the rank and the planner's #1,
then top-1 / 3 / 10 / 50 counts and the median rank, for MoE and dense models apart. Data:
../shared/data/bridge-recipes, else tests/data/bridge-recipes.tar.xz. Not a test: it prints and
asserts nothing.

    python benchmarks/plan_vs_recipes.py [--family NAME] [--quiet]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bridge_side_by_side import LOADER, read_corpus
from mbridge_perf.advise.changes import apply_changes
from mbridge_perf.advise.parallelism import ParallelismPlan, PlannedLayout, plan_parallelism
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import estimate_memory
from mbridge_perf.steptime import Calibration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fit_steptime import SHARED, bridge_rows, family, fold_calibrations

NAME = re.compile(r"_(?:pretrain|sft|peft)_(\d+)gpu_([a-z0-9]+)_")
TOP = 50


def sizes(lay: PlannedLayout | Any) -> tuple[int, int, int, int]:
    return (lay.tensor_model_parallel_size, lay.context_parallel_size,
            lay.expert_model_parallel_size, lay.pipeline_model_parallel_size)


def spell(t: tuple[int, int, int, int]) -> str:
    return "TP{} CP{} EP{} PP{}".format(*t)


def recipes(texts: dict[str, str], family: str | None) -> list[tuple[str, int, str, str]]:
    """(name, GPUs, GPU, dump text) of every perf pretrain recipe on a catalogued GPU."""
    out = []
    for name, text in sorted(texts.items()):
        m = NAME.search(name)
        if not m or name.endswith("__general") or (family and family not in name):
            continue
        try:
            gpu = lookup_gpu(m.group(2)).name
        except ValueError:
            continue
        out.append((name, int(m.group(1)), gpu, text))
    return out


def frozen_names(data: Path = SHARED) -> list[str]:
    """The frozen list: every recipe dump measured at its own layout (``dump_layout_matches =
    yes`` in the Bridge tables; NVIDIA ran it there, so it fits) - the issue's 40, LoRA
    included (its step time is priced as full fine-tuning, an upper bound)."""
    with (data / "steptime" / "bridge_perf_summary.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return sorted({r["recipe_dump"] for r in rows if r["dump_layout_matches"] == "yes"})


def launch_settings(data: dict[str, Any]) -> dict[str, Any]:
    """A library dump with the settings Bridge fills in at launch: a PEFT recipe's base
    checkpoint path (the validator refuses PEFT without one; any path will do here)."""
    ckpt = data.get("checkpoint")
    if data.get("peft") is not None and isinstance(ckpt, dict) and not ckpt.get(
            "pretrained_checkpoint"):
        ckpt["pretrained_checkpoint"] = "/launch/pretrained_checkpoint"
    return data


def held_out_calibrations() -> dict[str, Calibration]:
    """Family -> the step-time calibration fitted without that family's rows (k-fold by
    family, as the accuracy benchmark does), so each recipe is ranked out of sample."""
    return fold_calibrations(bridge_rows()[0])


def plan_of(cfg: TrainingConfig, n: int, gpu: str, cal: Calibration | None = None,
            rank_by: str = "speed") -> ParallelismPlan:
    md = cfg.model
    cons = None
    if md.num_moe_experts:
        cons = {"expert_tensor_parallel_size": [md.expert_tensor_parallel_size
                                                or md.tensor_model_parallel_size]}
    return plan_parallelism(cfg, n, gpu, int(md.seq_length), cfg.train.global_batch_size,
                            micro_batch_size=cfg.train.micro_batch_size, top_k=TOP,
                            constraints=cons, calibration=cal,
                            rank_by=rank_by)  # type: ignore[arg-type]


def one(name: str, n: int, gpu: str, text: str, cal: Calibration | None = None,
        rank_by: str = "speed") -> dict[str, Any] | None:
    try:
        cfg = load_config(data=launch_settings(yaml.load(text, Loader=LOADER)))
        own = sizes(cfg.model)
        at = apply_changes(cfg, {"cluster.num_gpus": n, "cluster.gpu": gpu})
        fits = bool(estimate_memory(at).fits)
        plan = plan_of(cfg, n, gpu, cal, rank_by)
    except ConfigError:
        return None
    ranks = [i + 1 for i, lay in enumerate(plan.layouts) if sizes(lay) == own]
    return {"name": name, "moe": bool(cfg.model.num_moe_experts), "own": own, "fits": fits,
            "rank": ranks[0] if ranks else None,
            "top": sizes(plan.layouts[0]) if plan.layouts else None}


def summary(label: str, rows: list[dict[str, Any]], every: bool = False) -> None:
    """Rank counts over the recipes whose layout fits by our estimate (``every``: over all,
    a recipe whose layout the plan does not list counting as beyond the top)."""
    counted = [r for r in rows if r["fits"] or every]
    ranks = [r["rank"] or TOP + 1 for r in counted]
    if not ranks:
        print(f"{label}: no recipe whose own layout fits by our estimate")
        return
    med = statistics.median(ranks)
    hits = {k: sum(x <= k for x in ranks) for k in (1, 3, 10, TOP)}
    what = ("recipes (a layout the plan does not list counts as beyond the top)" if every
            else f"recipes whose own layout fits by our estimate ({len(rows) - len(counted)} "
                 "more do not)")
    print(f"{label}: {len(counted)} {what} | rank 1: {hits[1]}, top 3: {hits[3]}, "
          f"top 10: {hits[10]}, top {TOP}: {hits[TOP]} | median rank "
          f"{med if med <= TOP else f'> {TOP}'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", help="only recipes whose name contains this")
    ap.add_argument("--quiet", action="store_true", help="summary lines only")
    ap.add_argument("--frozen", action="store_true",
                    help="only the 40 recipes measured at their own layout (LoRA included), "
                         "each ranked with "
                         "the calibration fitted without its family; by speed and by keys")
    ap.add_argument("--band", type=float, help="tie band instead of the calibration's "
                                               "pair_band_frac (with --frozen)")
    args = ap.parse_args()
    texts, _ = read_corpus()
    if args.frozen:
        return frozen(texts, args.quiet, args.band)
    t0 = time.perf_counter()
    rows = [r for r in (one(*x) for x in recipes(texts, args.family)) if r is not None]
    if not args.quiet:
        print(f"{'recipe':<66} {'its layout':<20} {'rank':>5}  planner's #1")
        for r in rows:
            rank = r["rank"] or (f">{TOP}" if r["fits"] else "(does not fit)")
            top = spell(r["top"]) if r["top"] else "-"
            print(f"{r['name']:<66} {spell(r['own']):<20} {rank!s:>5}  {top}")
        print()
    summary("MoE", [r for r in rows if r["moe"]])
    summary("dense", [r for r in rows if not r["moe"]])
    print(f"{len(rows)} recipes planned in {time.perf_counter() - t0:.0f} s")


def frozen(texts: dict[str, str], quiet: bool, band: float | None = None) -> None:
    names = set(frozen_names())
    cals = held_out_calibrations()
    if band is not None:
        cals = {k: c.model_copy(update={"pair_band_frac": band}) for k, c in cals.items()}
    todo = [x for x in recipes(texts, None) if x[0] in names]
    print(f"frozen list: {len(names)} recipes measured at their own layout, {len(todo)} with a "
          "perf-recipe name on a catalogued GPU; ranked out of sample (calibration fitted "
          "without the recipe's family)")
    for rank_by in ("speed", "keys"):
        t0 = time.perf_counter()
        rows = [r for r in (one(*x, cals.get(family(x[0])), rank_by) for x in todo)
                if r is not None]
        if not quiet:
            for r in rows:
                print(f"  {rank_by:5} {r['name']:<60} {spell(r['own']):<20} "
                      f"{r['rank'] or f'>{TOP}'!s:>4}  #1 {spell(r['top']) if r['top'] else '-'}")
        summary(f"by {rank_by}", rows, every=True)
        print(f"  {len(rows)} planned in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
