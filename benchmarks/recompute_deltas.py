"""Measured vs estimated change of peak memory for pairs of runs that differ in one knob.

Why differences: an absolute peak carries every constant the estimator does not know (allocator
rounding, workspaces, graph pools); the change between two runs of the same job cancels them,
and a recommender prices its rungs by exactly such changes. Pairs come from
../shared/data/memory/recompute-pairs.csv (`counts` says whether a pair is a saving at all);
the configurations of the Megatron Bridge card rows are read as benchmarks/memory_accuracy.py
reads them (Llama3 70B FP8-CS with its recipe's per-layer TE CUDA graphs of the MLP, from the
Bridge 0.6.2 dump), the DeepSeek-V3-shape pair (Megatron-LM PR #6429) is spelled out below. Each
side is the run's peak: with those graphs, the larger of the eager warm-up iterations and the
graphed steady state (server/mbridge_perf/memory/graphs.py).

Pass: |estimated - measured| <= max(35 % of |measured|, 1 GiB), with the measured sign where
|measured| > 1 GiB. Prints a row per pair and the count that pass. Not a test: it asserts
nothing (tests/memory/test_recompute_deltas.py checks the same pairs from a copy, written by
`python benchmarks/recompute_deltas.py --write-fixture tests/memory/fixtures/recompute_pairs.csv`).
"""

from __future__ import annotations

import csv
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory
from memory_accuracy import CARDS_CSV, DATA, card_row

PAIRS_CSV = DATA / "recompute-pairs.csv"
GB_PER_GIB = 2**30 / 1e9

# pair_id -> (base experiment_id, variant experiment_id) in bridge-skill-cards.csv
CARD_PAIRS = {
    "llama70b-pp8": ("llama70b_sft_baseline_expseg", "llama70b_sft_more_pp"),
    "llama70b-tp8": ("llama70b_sft_baseline_expseg", "llama70b_sft_more_tp"),
    "llama70b-mlp": ("llama70b_sft_baseline_expseg", "llama70b_sft_mlp"),
    "llama70b-mlp-core-attn": ("llama70b_sft_baseline_expseg", "llama70b_sft_mlp_core_attn"),
    "llama70b-layernorm": ("llama70b_sft_baseline_no_expseg",
                           "llama70b_sft_core_attn_layernorm"),
    "llama70b-vpp10": ("llama70b_sft_baseline_no_expseg", "llama70b_sft_vpp10_note"),
    "moonlight-core-attn": ("moonlight16b_empty_control", "moonlight16b_core_attn"),
    "moonlight-mla-up-proj": ("moonlight16b_empty_control", "moonlight16b_mla_up_proj"),
    "moonlight-moe-act": ("moonlight16b_empty_control", "moonlight16b_moe_act"),
    "moonlight-layernorm-moe-act": ("moonlight16b_empty_control",
                                    "moonlight16b_layernorm_plus_moe_act"),
    "moonlight-mla-up-proj-mlp": ("moonlight16b_empty_control",
                                  "moonlight16b_mla_up_proj_plus_mlp"),
}

# Megatron-LM PR #6429: DeepSeek-V3 shapes cut to 14 layers (3 dense + 11 MoE, MTP 1), 64x H100,
# TP1 PP4 VPP2 with layout Ett|(tt|)*6mL, EP16 ETP1, seq 2048, MBS 1, GBS 256, alltoall,
# distributed optimizer, FP32 grads, BF16; arm B adds full uniform recompute of 1 layer.
DSV3_BASE = [
    "model.num_layers=14", "model.moe_layer_freq=[0,0,0,1,1,1,1,1,1,1,1,1,1,1]",
    "model.mtp_num_layers=1", "model.tensor_model_parallel_size=1",
    "model.pipeline_model_parallel_size=4", "model.virtual_pipeline_model_parallel_size=2",
    "model.pipeline_model_parallel_layout=Ett|tt|tt|tt|tt|tt|tt|mL",
    "model.expert_model_parallel_size=16", "model.expert_tensor_parallel_size=1",
    "model.sequence_parallel=false", "model.seq_length=2048", "model.moe_grouped_gemm=true",
    "model.moe_token_dispatcher_type=alltoall", "train.micro_batch_size=1",
    "train.global_batch_size=256", "cluster.num_gpus=64",
    "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
    "mixed_precision.bf16=true", "mixed_precision.grad_reduce_in_fp32=true",
]
DSV3_FULL = ["model.recompute_granularity=full", "model.recompute_method=uniform",
             "model.recompute_num_layers=1"]


def _card_configs() -> dict[str, tuple[str, list[str]]]:
    with CARDS_CSV.open(newline="") as f:
        rows = {r["experiment_id"]: card_row(r) for r in csv.DictReader(f)}
    return {k: (r.preset or "", r.overrides) for k, r in rows.items()}


def pair_configs() -> dict[str, tuple[tuple[str, list[str]], tuple[str, list[str]]]]:
    """pair_id -> ((preset, base overrides), (preset, variant overrides))."""
    cards = _card_configs()
    out = {pid: (cards[b], cards[v]) for pid, (b, v) in CARD_PAIRS.items()}
    out["dsv3shape-full"] = (("deepseek-v3", DSV3_BASE), ("deepseek-v3", DSV3_BASE + DSV3_FULL))
    return out


def peak(preset: str, overrides: list[str]) -> float:
    """Peak allocated (GiB) of the most-loaded stage."""
    return estimate_memory(load_config(preset=preset or None, overrides=overrides)) \
        .peak_allocated_gib


def passes(measured: float, estimated: float) -> bool:
    ok = abs(estimated - measured) <= max(0.35 * abs(measured), 1.0)
    if abs(measured) > 1.0 and estimated * measured <= 0:
        ok = False
    return ok


def write_fixture(path: Path) -> None:
    """Copy the pairs with their configs for tests/memory/test_recompute_deltas.py (the
    project tests itself without ../shared)."""
    configs = pair_configs()
    with PAIRS_CSV.open(newline="") as f, path.open("w", newline="") as out:
        w = csv.writer(out)
        w.writerow(["pair_id", "counts", "measured_delta_gib", "source", "preset",
                    "base_overrides", "variant_overrides"])
        for r in csv.DictReader(f):
            (bp, bo), (_, vo) = configs[r["pair_id"]]
            w.writerow([r["pair_id"], r["counts"], round(_measured(r), 3),
                        f"../shared/data/memory/recompute-pairs.csv: {r['model']}; {r['why']}",
                        bp, ";".join(bo), ";".join(vo)])


def _measured(r: dict[str, str]) -> float:
    if r["delta_gib"]:
        return float(r["delta_gib"])
    b, v = float(r["base_peak"]), float(r["variant_peak"])
    return (v - b) / GB_PER_GIB if r["unit"] == "GB" else v - b


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--write-fixture"]:
        write_fixture(Path(args[1]))
        return 0
    configs = pair_configs()
    with PAIRS_CSV.open(newline="") as f:
        pairs = list(csv.DictReader(f))
    print(f"{'pair':28s} {'counts':>6s} {'measured':>9s} {'estimated':>9s} {'ratio':>6s}  pass")
    n_ok = n = 0
    for r in pairs:
        pid = r["pair_id"]
        (bp, bo), (vp, vo) = configs[pid]
        est = peak(vp, vo) - peak(bp, bo)
        meas = _measured(r)
        counts = r["counts"] == "yes"
        ok = passes(meas, est)
        if counts:
            n += 1
            n_ok += ok
        ratio = f"{est / meas:6.2f}" if abs(meas) > 0.05 else "     -"
        mark = ("yes" if ok else "NO") if counts else "(not counted)"
        print(f"{pid:28s} {r['counts']:>6s} {meas:+9.2f} {est:+9.2f} {ratio}  {mark}")
    print(f"\ncounting pairs within ±35 % or ±1 GiB (sign kept beyond 1 GiB): {n_ok} / {n}")
    _implied_non_static(configs, pairs)
    _recommend_time()
    return 0


def _implied_non_static(configs: dict[str, Any], pairs: list[dict[str, str]]) -> None:
    """What each counted Llama3 70B run's measured peak leaves above the modelled static state
    (weights + grads + optimizer of the most-loaded stage), next to what the estimate puts there
    in its two states: eager (warm-up iterations: every saved tensor allocated) and graphed
    (steady state: the TE-graphed MLP's saved tensors in the graph pool, or the optimizer step).

    Why: the misses are a question of which state sets a run's peak and what it holds. A reading
    of mem-max-allocated is a run-long maximum, so the eager state bounds it from below; where
    measured - static is below the eager figure, the eager activations are over-counted, and
    where it is above the graphed figure under TP or PP changes, a term the model lacks is
    there."""
    runs: dict[str, tuple[tuple[str, list[str]], float]] = {}
    for r in pairs:
        if r["counts"] != "yes" or not r["pair_id"].startswith("llama70b"):
            continue
        (bp, bo), (vp, vo) = configs[r["pair_id"]]
        base, var = CARD_PAIRS[r["pair_id"]]
        runs[base] = ((bp, bo), float(r["base_peak"]) / GB_PER_GIB)
        runs[var] = ((vp, vo), float(r["variant_peak"]) / GB_PER_GIB)
    print("\nLlama3 70B FP8-CS runs: GiB above the modelled static state (most-loaded stage)")
    print(f"{'run':32s} {'measured':>8s} {'static':>7s} {'meas-static':>11s} "
          f"{'eager':>6s} {'graphed':>7s}")
    for run, ((preset, overrides), measured) in runs.items():
        rep = estimate_memory(load_config(preset=preset or None, overrides=overrides))
        st = rep.per_stage[rep.most_loaded_stage]
        eager = st.activations_gib + st.transient_gib + st.workspace_gib
        graphed = (st.graphed_peak_allocated_gib or st.peak_allocated_gib) - st.static_gib
        print(f"{run:32s} {measured:8.2f} {st.static_gib:7.2f} {measured - st.static_gib:11.2f} "
              f"{eager:6.2f} {graphed:7.2f}")


def _recommend_time() -> None:
    """One recommend_recompute on the seeds' case (examples/llama3_70b_sft_h100.yaml): cold
    (first call in the process) and the median of warm calls (goal < 50 ms)."""
    from mbridge_perf.advise.recompute import recommend_recompute

    seed = Path(__file__).resolve().parents[1] / "examples" / "llama3_70b_sft_h100.yaml"
    cfg = load_config(preset="llama3-70b", file=seed)
    t0 = time.perf_counter()
    plan = recommend_recompute(cfg)
    cold = (time.perf_counter() - t0) * 1e3
    warm = []
    for _ in range(20):
        t0 = time.perf_counter()
        recommend_recompute(cfg)
        warm.append((time.perf_counter() - t0) * 1e3)
    print(f"recommend_recompute on the seed case ({len(plan.steps)} steps): first call "
          f"{cold:.1f} ms, then median {statistics.median(warm):.1f} ms (goal < 50 ms)")


if __name__ == "__main__":
    raise SystemExit(main())
