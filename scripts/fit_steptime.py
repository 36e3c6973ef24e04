"""Fit the step-time model's few parameters on Megatron Bridge's published throughput tables.

Data (only): ../shared/data/steptime/bridge_perf_summary.csv rows with a recipe dump whose
layout is the table's (``dump_layout_matches = yes``), a precision, not LoRA, the newest release
per (model, GPU, GPU count, precision); the dump from ../shared/data/bridge-recipes/yaml/.
Measured step time = GBS x seq / (tokens/s/GPU x GPUs). Then the host launch floor
(``layer_host_us``) alone on every third row of ../shared/data/steptime/vtrain_single.csv
(small GPTs on A100, the only rows where it binds).

Method: steptime/fit.py (robust loss on log errors plus a pull towards the seeds' public
figures). Out-of-sample figures: k-fold by model family (fit on the other families, predict
the held-out one); ``band_frac`` = p80 of those out-of-sample |relative errors|.

    python scripts/fit_steptime.py          # writes steptime/data/calibration.json
    python scripts/fit_steptime.py --check    # recomputes and compares with the shipped file
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mbridge_perf.config.derived import Derived, derive
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import GPUSpec, lookup_gpu
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.steptime.calibration import CALIBRATION_FILE, Calibration
from mbridge_perf.steptime.fit import FITTED, HOST, fit, get, relevant
from mbridge_perf.steptime.model import predict_step_time_s

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
if not SHARED.exists():
    SHARED = Path("/work/shared/data")



@dataclass
class Row:
    recipe: str
    release: str
    model: str
    family: str
    gpu: str
    num_gpus: int
    precision: str
    measured_s: float
    derived: Derived
    spec: GPUSpec


def family(recipe: str) -> str:
    for key in ("llama", "qwen", "nemotron", "deepseek", "gpt_oss", "kimi"):
        if recipe.startswith(key):
            return key
    return recipe.split("_")[0]


def _release_key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def bridge_rows(data: Path = SHARED) -> tuple[list[Row], dict[str, int]]:
    """The scored Bridge rows, and why the others were left out (counts)."""
    skipped: dict[str, int] = {}

    def skip(why: str) -> None:
        skipped[why] = skipped.get(why, 0) + 1

    newest: dict[tuple[str, str, str, str], dict[str, str]] = {}
    with (data / "steptime" / "bridge_perf_summary.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if not r["recipe_dump"]:
                skip("no recipe dump (architecture unknown)")
            elif r["dump_layout_matches"] != "yes":
                skip("dump layout differs from the table's")
            elif not r["precision"]:
                skip("no precision")
            elif r["task"] == "lora":
                skip("LoRA (frozen weights: not modelled)")
            else:
                # plain "FP8" rows were matched to FP8-CS dumps (data README): one precision
                prec = "fp8cs" if r["precision"] == "fp8" else r["precision"]
                key = (r["model"], r["gpu"], r["num_gpus"], prec)
                old = newest.get(key)
                if old is None or _release_key(r["release"]) > _release_key(old["release"]):
                    if old is not None:
                        skip("older release of the same (model, GPU, GPUs, precision)")
                    newest[key] = r
                else:
                    skip("older release of the same (model, GPU, GPUs, precision)")
    rows = []
    for r in newest.values():
        path = data / "bridge-recipes" / "yaml" / f"{r['recipe_dump']}.yaml"
        cfg = load_config(file=path, overrides=[f"cluster.num_gpus={r['num_gpus']}"])
        n = int(r["num_gpus"])
        measured = int(r["gbs"]) * int(r["seq_len"]) / (float(r["tokens_per_s_per_gpu"]) * n)
        rows.append(Row(recipe=r["recipe_dump"], release=r["release"], model=r["model"],
                        family=family(r["recipe_dump"]), gpu=r["gpu"], num_gpus=n,
                        precision=r["precision"], measured_s=measured, derived=derive(cfg),
                        spec=lookup_gpu(r["gpu"])))
    rows.sort(key=lambda x: (x.family, x.recipe))
    return rows, skipped


def gpt_config(*, layers: int, hidden: int, ffn: int, heads: int, head_dim: int | None,
               seq: int, gbs: int, mbs: int, tp: int, pp: int, vp: int, gpus: int, gpu: str,
               recompute: str, sp: bool, attention_backend: str = "auto") -> TrainingConfig:
    """A plain GPT (the vTrain and Korthikanti rows' models) as a Bridge config."""
    model: dict[str, Any] = {
        "num_layers": layers, "hidden_size": hidden, "ffn_hidden_size": ffn,
        "num_attention_heads": heads, "seq_length": seq, "vocab_size": 51200,
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "sequence_parallel": sp and tp > 1, "attention_backend": attention_backend,
    }
    if head_dim:
        model["kv_channels"] = head_dim
    if vp > 1:
        model["virtual_pipeline_model_parallel_size"] = vp
    if recompute == "full":
        model |= {"recompute_granularity": "full", "recompute_method": "uniform",
                  "recompute_num_layers": 1}
    elif recompute == "selective":
        model |= {"recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
    data = {"model": model, "train": {"global_batch_size": gbs, "micro_batch_size": mbs},
            "mixed_precision": "fp16_mixed",
            "optimizer": {"use_distributed_optimizer": False},
            "cluster": {"num_gpus": gpus, "gpu": gpu}}
    return load_config(data=data)


VTRAIN_GPU = "A100-80GB"


def vtrain_rows(data: Path = SHARED) -> list[Row]:
    """vTrain's single-node runs (A100, Megatron-DeepSpeed, fp16) as rows; family = the
    model's width ("vtrain-h1024" / "vtrain-h2048"), so a fold predicts one width from the
    other. Rows whose layout does not build are left out."""
    out = []
    spec = lookup_gpu(VTRAIN_GPU)
    with (data / "steptime" / "vtrain_single.csv").open(encoding="utf-8") as f:
        for r in csv.DictReader(f):
            h = int(r["hidden"])
            try:
                cfg = gpt_config(layers=int(r["num_layers"]), hidden=h, ffn=4 * h,
                                 heads=int(r["heads"]), head_dim=None, seq=int(r["seq_len"]),
                                 gbs=int(r["gbs"]), mbs=int(r["mbs"]), tp=int(r["tp"]),
                                 pp=int(r["pp"]), vp=1, gpus=int(r["num_gpus"]),
                                 gpu=VTRAIN_GPU, sp=False,
                                 recompute="full" if r["activation_recompute_simcfg"] == "true"
                                 else "none")
                derived = derive(cfg)
            except (ConfigError, ValueError):
                continue
            out.append(Row(recipe=r["sim_config"] or "vtrain", release="", model="gpt",
                           family=f"vtrain-h{h}", gpu=VTRAIN_GPU, num_gpus=int(r["num_gpus"]),
                           precision="fp16", measured_s=float(r["step_time_s"]),
                           derived=derived, spec=spec))
    return out


def fit_host(rows: list[Row], cal: Calibration) -> Calibration:
    """The host launch floor fitted on vTrain's step times (every third row: the small models
    where it binds), the rest of ``cal`` kept. Bridge's recipes never reach it."""
    return fit(rows[::3], start=cal, names=HOST)


def host_folds(rows: list[Row], cal: Calibration) -> dict[str, Calibration]:
    """vTrain family -> ``cal`` with the host floor fitted on the other family (out of
    sample for the ranking figure)."""
    return {fam: fit_host([r for r in rows if r.family != fam], cal)
            for fam in sorted({r.family for r in rows})}


def fold_calibrations(rows: list[Row]) -> dict[str, Calibration]:
    """Family -> the calibration fitted on every other family's rows (k-fold by family)."""
    return {fam: fit([r for r in rows if r.family != fam])
            for fam in sorted({r.family for r in rows})}


def cross_validate(rows: list[Row]) -> dict[str, float]:
    """recipe -> out-of-sample relative error of step time (fit on the other families)."""
    folds = fold_calibrations(rows)
    return {r.recipe: predict_step_time_s(r.derived, gpu=r.spec, calibration=folds[r.family])
            / r.measured_s - 1 for r in rows}


def quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    i = q * (len(s) - 1)
    lo = math.floor(i)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (i - lo)


def build(data: Path = SHARED, band: float | None = None) -> dict[str, object]:
    """The calibration file's content; ``band`` given: the k-fold (slow part) is skipped and
    that band kept."""
    rows, _ = bridge_rows(data)
    if band is None:
        oos = cross_validate(rows)
        band = round(quantile([abs(e) for e in oos.values()], 0.8), 4)
    cal = fit_host(vtrain_rows(data), fit(rows))
    cal = cal.model_copy(update={
        "band_frac": band,
        "fitted": [n for n in FITTED if relevant(n, rows)] + list(HOST),
        "rows": [{"recipe_dump": r.recipe, "release": r.release, "gpu": r.gpu,
                  "num_gpus": str(r.num_gpus), "precision": r.precision} for r in rows],
        "source": "scripts/fit_steptime.py on ../shared/data/steptime/bridge_perf_summary.csv "
                  f"({len(rows)} rows, dump_layout_matches=yes, newest release per model/GPU/"
                  "GPUs/precision); layer_host_us on every third row of vtrain_single.csv; "
                  "unfitted values are seeds from step-time-model.md §7",
    })
    return json.loads(cal.model_dump_json())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=SHARED)
    parser.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    parser.add_argument("--check", action="store_true",
                        help="compare with the file at --out instead of writing it (the "
                             "k-fold band is taken from the file unless --full)")
    parser.add_argument("--full", action="store_true", help="with --check: redo the k-fold")
    args = parser.parse_args(argv)
    band = None
    if args.check and not args.full and args.out.exists():
        band = json.loads(args.out.read_text("utf-8")).get("band_frac")
    new = build(args.data, band)
    text = json.dumps(new, indent=1, sort_keys=True) + "\n"
    if args.check:
        old = args.out.read_text("utf-8") if args.out.exists() else ""
        if old != text:
            print(f"{args.out} differs from a fresh fit; rerun scripts/fit_steptime.py",
                  file=sys.stderr)
            return 1
        print(f"{args.out} reproduces")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, "utf-8")
    print(f"wrote {args.out}: " + ", ".join(f"{n}={get(Calibration(**new), n)}"
                                             for n in new["fitted"]))  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
