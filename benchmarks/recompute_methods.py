"""Full recompute, `uniform` vs `block` and N: what each keeps per micro-batch, what backward
rebuilds, and which peaks lowest once pipeline micro-batches are in flight.

Two parts:

1. The skills' seed layout (examples/llama3_70b_sft_h100.yaml: Llama3 70B, TP4 PP4 VPP5,
   seq 4096, FP8) with full recompute instead of `core_attn` (graphs off, as full recompute
   requires): per stage and method, the micro-batches in flight (chunk micro-batches summed over
   VPP chunks), the activations they hold, the backward's transient (one layer's backward plus the
   layers recompute rebuilds), their sum (the forward/backward activation peak) and the stage's
   peak allocated (where the optimizer step dominates it says so).
2. With `--measure` (needs Megatron-Core; ~1 min on 2 cores): the CPU ground truth of
   tests/memory/mcore_recompute.py, a real 8-layer Megatron-Core GPTModel with 1 and 8
   micro-batches forwarded before the first backward, next to the estimate.

Not a test: it asserts nothing (tests/memory/test_recompute_window.py and
tests/memory/test_recompute_mcore.py check the same).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "llama3_70b_sft_h100.yaml"
METHODS = [("uniform", 1), ("uniform", 2), ("uniform", 4), ("block", 1), ("block", 2),
           ("block", 4)]


def seed_table() -> None:
    print("Seed layout (Llama3 70B, TP4 PP4 VPP5, seq 4096), full recompute; GiB per stage")
    print(f"{'method':<10}{'stage':>6}{'in flight':>10}{'held':>8}{'transient':>10}"
          f"{'fwd/bwd':>9}{'peak':>8}  phase")
    best: dict[int, tuple[float, str]] = {}
    for method, n in METHODS:
        cfg = load_config(preset="llama3-70b", file=SEED, overrides=[
            "model.recompute_granularity=full", f"model.recompute_method={method}",
            f"model.recompute_num_layers={n}", "model.cuda_graph_impl=none"])
        report = estimate_memory(cfg)
        for st in report.per_stage:
            fb = st.activations_gib + st.transient_gib
            name = f"{method}-{n}"
            if st.stage not in best or fb < best[st.stage][0]:
                best[st.stage] = (fb, name)
            print(f"{name:<10}{st.stage:>6}{sum(st.in_flight_per_chunk):>10}"
                  f"{st.activations_gib:>8.2f}{st.transient_gib:>10.2f}{fb:>9.2f}"
                  f"{st.peak_allocated_gib:>8.2f}  {st.peak_phase}")
    print("lowest forward/backward activations per stage: " + ", ".join(
        f"stage {s} {name} ({fb:.2f} GiB)" for s, (fb, name) in sorted(best.items())))


def cpu_table() -> None:
    sys.path[:0] = [str(ROOT / "tests" / "memory"), str(ROOT / "tests")]
    import mcore_recompute

    print()
    print("CPU ground truth (real Megatron-Core, 8 layers, h=256, s=64; activation peak)")
    mcore_recompute.main()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    seed_table()
    if "--measure" in args:
        cpu_table()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
