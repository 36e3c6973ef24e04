"""How well the step-time model predicts measured step times, out of sample, per source.

- Bridge tables (../shared/data/steptime/bridge_perf_summary.csv, the rows scripts/fit_steptime.py
  uses): k-fold by model family (fit on the other families, predict the held-out one); median
  and p90 |error| of step time.
- Korthikanti et al. 2022 Table 5 (A100; never fitted on): per-row error, recompute direction.
- Ranking, pairwise order agreement of predicted vs measured: the NeMo auto-configurator sweep
  (one group of 18; GPU and precision unstated: H100 BF16 assumed, with NeMo 2's
  distributed optimizer and DP overlap) and vTrain single-node
  groups (A100, fp16, full recompute).
- Megatron-LM CI goldens (megatron_ci_iteration_time.csv; reported, no target): rows with a
  recorded GPU count on a named GPU (A100 / H100 / GB200), GRPO tests (rollout time) and resumed
  `_2nd` runs left out, grouped by platform, model arguments, seq, GBS and GPU count; pairwise
  order agreement inside each group (most are one layout, so few groups score).
- Skill-card A/B rows (bridge_skill_cards_throughput.csv) with a measured change of >= 2 %:
  sign agreement, where the knob is one the model reads (layout, recompute modules, EP overlap,
  CUDA graphs) and the model has a preset; the rest are counted with the reason.

Prints the figures and writes the scored rows to --out (CSV per source); asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import re
import statistics
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.steptime import estimate_step_time, load_calibration

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import fit_steptime as fit

SHARED = fit.SHARED


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def bridge(data: Path, out: Path) -> None:
    rows, skipped = fit.bridge_rows(data)
    oos = fit.cross_validate(rows)
    errs = [abs(e) for e in oos.values()]
    print(f"== Bridge tables: {len(rows)} rows scored (k-fold by family: "
          f"{', '.join(sorted({r.family for r in rows}))})")
    for why, n in sorted(skipped.items()):
        print(f"   skipped {n:3d}: {why}")
    print(f"   step time |error| out of sample: median {100 * statistics.median(errs):.1f} %, "
          f"p90 {100 * fit.quantile(errs, 0.9):.1f} %  (targets 10 % / 20 %)")
    by_fam: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        by_fam[r.family].append(abs(oos[r.recipe]))
    for fam, e in sorted(by_fam.items()):
        print(f"   {fam:10s} n={len(e):2d} median {100 * statistics.median(e):5.1f} %  "
              f"max {100 * max(e):5.1f} %")
    with (out / "steptime_bridge.csv").open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["recipe_dump", "release", "family", "gpu", "num_gpus", "precision",
                    "measured_s", "oos_error"])
        for r in rows:
            w.writerow([r.recipe, r.release, r.family, r.gpu, r.num_gpus, r.precision,
                        f"{r.measured_s:.4f}", f"{oos[r.recipe]:.4f}"])


def korthikanti(data: Path, out: Path) -> None:
    with (data / "steptime" / "korthikanti_2022.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    print(f"== Korthikanti 2022 Table 5 (A100-80GB, fp16; not fitted on): {len(rows)} rows")
    preds: dict[tuple[str, str], tuple[float, float]] = {}
    lines = []
    for r in rows:
        cfg = fit.gpt_config(
            layers=int(r["num_layers"]), hidden=int(r["hidden"]), ffn=int(r["ffn"]),
            heads=int(r["heads"]), head_dim=int(r["head_dim"]), seq=int(r["seq_len"]),
            gbs=int(r["gbs"]), mbs=int(r["mbs"]), tp=int(r["tp"]), pp=int(r["pp"]),
            vp=int(r["vp"]), gpus=int(r["num_gpus"]), gpu="A100-80GB",
            recompute="full" if r["recompute"] == "full" else "selective",
            sp=r["sequence_parallel"] == "true",
            # Megatron-LM of 2022: softmax over materialised scores, before flash attention
            attention_backend="unfused")
        pred = estimate_step_time(cfg).step_time_s
        meas = float(r["step_time_s"])
        kind = "full" if r["recompute"] == "full" else "selective"
        preds[(r["model"], kind)] = (pred, meas)
        err = pred / meas - 1
        lines.append([r["model"], kind, meas, round(pred, 3), round(err, 4)])
        print(f"   {r['model']:12s} {kind:9s} measured {meas:6.2f} s  predicted {pred:6.2f} s  "
              f"{pct(err)}")
    errs = [abs(x[4]) for x in lines]
    within = sum(e <= 0.15 for e in errs)
    right = sum((preds[(m, 'full')][0] > preds[(m, 'selective')][0]) ==
                (preds[(m, 'full')][1] > preds[(m, 'selective')][1])
                for m in {k[0] for k in preds})
    print(f"   within 15 %: {within}/{len(errs)}; mean |error| {100 * statistics.fmean(errs):.1f} "
          f"%; recompute direction right {right}/{len({k[0] for k in preds})}")
    with (out / "steptime_korthikanti.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["model", "recompute", "measured_s", "predicted_s", "error"],
                                 *lines])


def pairwise(group: list[tuple[float, float]]) -> tuple[int, int]:
    """(agreeing pairs, pairs) of (predicted, measured) step times; measured ties skipped."""
    agree = total = 0
    for (p1, m1), (p2, m2) in itertools.combinations(group, 2):
        if m1 == m2:
            continue
        total += 1
        agree += (p1 < p2) == (m1 < m2)
    return agree, total


def nemo(data: Path, out: Path) -> None:
    with (data / "steptime" / "nemo_autoconfig_sweep.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    group = []
    lines = []
    for r in rows:
        ov = [f"model.tensor_model_parallel_size={r['TP']}",
              f"model.pipeline_model_parallel_size={r['PP']}",
              f"model.context_parallel_size={r['CP']}", f"model.seq_length={r['Seq Length']}",
              f"train.global_batch_size={r['GBS']}", f"train.micro_batch_size={r['MBS']}",
              f"cluster.num_gpus={r['num_gpus']}", "cluster.gpu=h100",
              "mixed_precision=bf16_mixed", f"model.sequence_parallel={int(r['TP']) > 1}",
              # NeMo 2 llama3 pretrain recipe defaults (the preset carries Megatron's)
              "optimizer.use_distributed_optimizer=true", "ddp.overlap_grad_reduce=true",
              "ddp.overlap_param_gather=true"]
        cfg = load_config(preset="llama3-8b", overrides=ov)
        pred = estimate_step_time(cfg).step_time_s
        group.append((pred, float(r["step_time_s"])))
        lines.append([r["Config Name"], r["step_time_s"], round(pred, 3)])
    agree, total = pairwise(group)
    ratio_errs = [abs((a[0] / b[0]) / (a[1] / b[1]) - 1)
                  for i, a in enumerate(group) for b in group[i + 1:]]
    fastest_meas = min(range(len(group)), key=lambda i: group[i][1])
    fastest_pred = min(range(len(group)), key=lambda i: group[i][0])
    rank = sorted(range(len(group)), key=lambda i: group[i][0]).index(fastest_meas) + 1
    print(f"== NeMo auto-configurator sweep (Llama3-8B, 128 GPUs; H100 BF16 assumed): "
          f"{len(group)} rows, one group")
    print(f"   pairwise order agreement {agree}/{total} = {100 * agree / total:.1f} % "
          f"(target 85 %); measured fastest {rows[fastest_meas]['Config Name']} is predicted "
          f"#{rank} (predicted fastest {rows[fastest_pred]['Config Name']})")
    print(f"   layout-pair throughput ratio |predicted / measured - 1|: median "
          f"{100 * statistics.median(ratio_errs):.1f} %, "
          f"p80 {100 * fit.quantile(ratio_errs, 0.8):.1f} % "
          "(the calibration's pair_band_frac, the planner's tie band, is set from this p80 "
          "and the A/B pairs' below)")
    with (out / "steptime_nemo.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["config", "measured_s", "predicted_s"], *lines])


def vtrain(data: Path, out: Path) -> None:
    """Each width predicted with the host launch floor fitted on the other width only."""
    rows = fit.vtrain_rows(data)
    folds = fit.host_folds(rows, load_calibration())
    groups: dict[tuple[Any, ...], list[tuple[float, float]]] = defaultdict(list)
    lines = []
    for r in rows:
        m, t = r.derived.cfg.model, r.derived.cfg.train
        key = (m.num_layers, m.hidden_size, m.num_attention_heads, m.seq_length,
               t.global_batch_size, r.num_gpus)
        pred = fit.predict_step_time_s(r.derived, gpu=r.spec, calibration=folds[r.family])
        groups[key].append((pred, r.measured_s))
        lines.append([*key, r.derived.tp, r.derived.dp, r.derived.pp, t.micro_batch_size,
                      r.measured_s, round(pred, 4)])
    agree = total = 0
    scored = 0
    for g in groups.values():
        if len(g) < 2:
            continue
        scored += 1
        a, t = pairwise(g)
        agree += a
        total += t
    errs = [abs(p / m - 1) for g in groups.values() for p, m in g]
    hosts = ", ".join(f"{k} {c.layer_host_us:,.0f} us" for k, c in sorted(folds.items()))
    print(f"== vTrain single-node (A100-80GB assumed, fp16, full recompute): {len(lines)} rows "
          f"in {scored} groups of >= 2; host launch floor fitted on the other width "
          f"({hosts})")
    print(f"   pairwise order agreement {agree}/{total} = {100 * agree / max(total, 1):.1f} % "
          f"(target 85 %); step time |error| median {100 * statistics.median(errs):.1f} % "
          "(small models: fixed costs dominate)")
    with (out / "steptime_vtrain.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["layers", "hidden", "heads", "seq", "gbs", "gpus", "tp", "dp",
                                  "pp", "mbs", "measured_s", "predicted_s"], *lines])


PRESETS = [("dsv3", "deepseek-v3"), ("deepseek", "deepseek-v3"), ("llama3 70b", "llama3-70b"),
           ("moonlight", "moonlight-16b-a3b"), ("qwen3-next", "qwen3-next-80b-a3b"),
           ("qwen3 235b", "qwen3-235b-a22b"), ("qwen3-235b", "qwen3-235b-a22b"),
           ("qwen3 30b", "qwen3-30b-a3b"), ("qwen3-30b", "qwen3-30b-a3b"),
           ("qwen3-8b", "qwen3-8b"), ("gpt-oss-120b", "gpt-oss-120b")]
LAYOUT = re.compile(r"\b(TP|PP|VPP|CP|EP|ETP|DP)(\d+)")
FIELD = {"TP": "model.tensor_model_parallel_size", "PP": "model.pipeline_model_parallel_size",
         "VPP": "model.virtual_pipeline_model_parallel_size",
         "CP": "model.context_parallel_size", "EP": "model.expert_model_parallel_size",
         "ETP": "model.expert_tensor_parallel_size"}
PREC = {"FP8_CS": "bf16_with_fp8_current_scaling_mixed", "BF16": "bf16_mixed",
        "FP8-MX": "bf16_with_mxfp8_mixed", "MXFP8": "bf16_with_mxfp8_mixed"}


# the Megatron-LM CI platforms' GPU (dracooci is an A100 cluster; 80 GB assumed, as for
# vTrain: memory does not enter the step time); bare "lts"/"dev" name none
_CI_GPU = (("gb200", "gb200"), ("h100", "h100"), ("a100", "a100-80gb"))
# the columns that make two CI tests the same model run (everything but the layout)
_CI_MODEL = ("L", "h", "a", "ffn", "qg", "kv_channels", "experts", "topk", "moe_ffn",
             "shared_ffn", "moe_layer_freq", "mtp", "mla", "fp8", "fp8_recipe", "bf16", "fp16",
             "swiglu", "recompute", "rc_method", "rc_layers", "rc_modules")
_CI_LAYOUT = ("tp", "pp", "cp", "ep", "etp", "mbs", "layers_per_vp", "vp_stages_per_rank",
              "pp_layout", "sp", "dispatcher", "distopt", "mfsdp", "cuda_graph", "overlap_grad",
              "overlap_param", "tp_comm_overlap", "ep_overlap")


def _ci_predict(r: dict[str, str]) -> tuple[float | None, str]:
    """(predicted step time, why not) of one CI golden row."""
    from memory_accuracy import ci_row

    if "grpo" in r["test_case"]:
        return None, "GRPO (rollout time in the step)"
    if r["platform"].endswith("_2nd"):
        return None, "resumed run (_2nd)"
    if not r.get("num_gpus"):
        return None, "GPU count not recorded"
    gpu = next((g for key, g in _CI_GPU if key in r["platform"]), None)
    if gpu is None:
        return None, "platform names no GPU"
    row = ci_row(r)
    if row.reason or not row.overrides:
        return None, row.reason or "no config"
    data = {**row.overrides[0]}
    data["cluster"] = {**data.get("cluster", {}), "gpu": gpu, "num_gpus": int(r["num_gpus"])}
    try:
        return estimate_step_time(load_config(data=data)).step_time_s, ""
    except (ConfigError, ValueError, TypeError) as e:
        return None, f"config not buildable ({str(e)[:40]})"


def megatron_ci(data: Path, out: Path) -> None:
    with (data / "steptime" / "megatron_ci_iteration_time.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    groups: dict[tuple[str, ...], dict[tuple[str, ...], tuple[float, float]]] = \
        defaultdict(dict)
    skipped: Counter[str] = Counter()
    lines = []
    for r in rows:
        pred, why = _ci_predict(r)
        if pred is None:
            skipped[why] += 1
            continue
        key = (r["platform"], *(r.get(c, "") for c in _CI_MODEL), r["seq"], r["gbs"],
               r["num_gpus"])
        # one point per layout: the same layout tested twice (features the columns miss)
        # keeps its first row
        layout = tuple(r.get(c, "") for c in _CI_LAYOUT)
        groups[key].setdefault(layout, (pred, float(r["median_iteration_time_s"])))
        lines.append([r["test_case"], r["platform"], r["num_gpus"],
                      r["median_iteration_time_s"], round(pred, 4), "|".join(key)])
    scored = [list(g.values()) for g in groups.values() if len(g) >= 2]
    agree = total = 0
    for g in scored:
        a, t = pairwise(g)
        agree += a
        total += t
    errs = [x[4] / float(x[3]) - 1 for x in lines]
    print(f"== Megatron-LM CI goldens (reported, no target): {len(lines)} rows predicted, "
          f"{len(scored)} groups of >= 2 layouts ({sum(map(len, scored))} rows)")
    for why, n in sorted(skipped.items()):
        print(f"   skipped {n:3d}: {why}")
    if total:
        print(f"   pairwise order agreement {agree}/{total} = {100 * agree / total:.1f} %; "
              f"step time error over all predicted rows: median |error| "
              f"{100 * statistics.median(map(abs, errs)):.1f} %, median signed "
              f"{pct(statistics.median(errs))} (small models: fixed costs dominate)")
    with (out / "steptime_megatron_ci.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["test_case", "platform", "num_gpus", "measured_s",
                                  "predicted_s", "group"], *lines])


def _preset(model: str) -> str | None:
    low = model.lower()
    if "vl" in low.split() or "qwen3-vl" in low or "qwen3.5" in low:
        return None
    return next((p for k, p in PRESETS if k in low), None)


def _layout(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in LAYOUT.findall(text)}


def _side(r: dict[str, str], layout: str, mods: list[str] | None, ep_overlap: bool,
          graphs: bool, preset: str) -> Any:
    lay = _layout(layout)
    ov = [f"{FIELD[k]}={v}" for k, v in lay.items() if k in FIELD]
    if "VPP" not in lay:
        ov.append("model.virtual_pipeline_model_parallel_size=null")
    prec = PREC.get(r["precision"].split()[0] if r["precision"] else "BF16", "bf16_mixed")
    ov += [f"cluster.num_gpus={r['num_gpus']}", f"cluster.gpu={r['gpu'].split('_')[0]}",
           f"mixed_precision={prec}"]
    for k, name in (("seq_len", "model.seq_length"), ("gbs", "train.global_batch_size"),
                    ("mbs", "train.micro_batch_size")):
        if r[k]:
            ov.append(f"{name}={r[k]}")
    if mods is not None:
        ov += ["model.recompute_granularity=selective",
               f"model.recompute_modules=[{','.join(mods)}]"]
    if ep_overlap:
        ov.append("model.overlap_moe_expert_parallel_comm=true")
    if graphs:
        ov += ["model.cuda_graph_impl=transformer_engine",
               "model.cuda_graph_scope=[attn,moe_router,moe_preprocess]"]
    return load_config(preset=preset, overrides=ov)


def skill_cards(data: Path, out: Path) -> None:
    with (data / "steptime" / "bridge_skill_cards_throughput.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    skipped: Counter[str] = Counter()
    lines = []
    for r in rows:
        if not r["kind"].startswith("ab_"):
            skipped["not an A/B pair"] += 1
            continue
        try:
            ratio = float(r["variant_over_base"])
        except ValueError:
            skipped["no measured ratio"] += 1
            continue
        if r["metric"] == "step_time_s":
            ratio = 1 / ratio  # as a throughput ratio
        if abs(ratio - 1) < 0.02:
            skipped["measured change < 2 %"] += 1
            continue
        preset = _preset(r["model"])
        if preset is None:
            skipped["model without a preset"] += 1
            continue
        knob = r["knob_changed"]
        base_mods = var_mods = None
        ep_b = ep_v = g_b = g_v = False
        m = re.match(r"recompute modules (.*) -> (.*)", knob)
        if m:
            def mods(x: str) -> list[str]:
                return [s.strip() for s in x.strip("[] ").split(",") if s.strip()]
            base_mods, var_mods = mods(m[1]), mods(m[2])
        elif "overlap_moe_expert_parallel_comm off -> on" in knob:
            ep_v = True
        elif "CUDA graphs off -> on" in knob:
            g_v = True
        elif r["base_layout"] == r["variant_layout"] or not r["base_layout"]:
            skipped["knob the model does not read"] += 1
            continue
        elif "->" not in knob:
            skipped["not a single-knob change"] += 1
            continue
        if not r["base_layout"] and not r["variant_layout"]:
            skipped["no layout given"] += 1
            continue
        try:
            base = estimate_step_time(_side(r, r["base_layout"], base_mods, ep_b, g_b, preset))
            var = estimate_step_time(_side(r, r["variant_layout"], var_mods, ep_v, g_v, preset))
        except (ConfigError, ValueError) as exc:
            skipped[f"config not buildable ({str(exc)[:50]})"] += 1
            continue
        pred = base.step_time_s / var.step_time_s
        lines.append([r["comparison_group"], knob[:80], round(ratio, 4), round(pred, 4),
                      (pred - 1) * (ratio - 1) > 0 and abs(pred - 1) >= 0.001])
    right = sum(x[4] for x in lines)
    print(f"== Skill-card A/B (change >= 2 %): {len(lines)} scored, "
          f"{sum(skipped.values())} skipped")
    for why, n in skipped.most_common():
        print(f"   skipped {n:3d}: {why}")
    if lines:
        print(f"   sign right {right}/{len(lines)} = {100 * right / len(lines):.0f} % "
              "(target 90 %)")
        errs = [abs(x[3] / x[2] - 1) for x in lines]
        print(f"   throughput ratio |predicted / measured - 1|: median "
              f"{100 * statistics.median(errs):.1f} %, p80 {100 * fit.quantile(errs, 0.8):.1f} %")
    for x in lines:
        print(f"   {x[1][:60]:60s} measured x{x[2]:.3f} predicted x{x[3]:.3f} "
              f"{'ok' if x[4] else 'WRONG'}")
    with (out / "steptime_skill_cards.csv").open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([["group", "knob", "measured_throughput_ratio",
                                  "predicted_throughput_ratio", "sign_right"], *lines])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=SHARED)
    parser.add_argument("--out", type=Path, default=Path("build/steptime_accuracy"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for part in (bridge, korthikanti, nemo, vtrain, megatron_ci, skill_cards):
        part(args.data, args.out)
    print(f"scored rows written to {args.out}/")


if __name__ == "__main__":
    main()
