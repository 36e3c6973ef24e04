"""How long one plan_parallelism call takes for DeepSeek-V3 on 4,096 H100 at 128K, and how many
layouts it enumerates, prices with estimate_memory and decides by the CP / EP bound.

Goal: every layout decided in under 1 s on one core (the estimator prices ~10-20k configs/s, so
the planner prunes: one estimate rejects a whole (TP, PP, VPP, ETP) group when even its largest
EP and CP do not fit, and each group's fit boundary in the (EP, CP) grid is walked, not swept).
Prints the figures; asserts nothing (not a test). The first call is cold (the estimator's
per-shape caches empty); the rest are the median of repeated calls.
"""

from __future__ import annotations

import argparse
import statistics
import time

from mbridge_perf.advise.parallelism import plan_parallelism
from mbridge_perf.config.load import load_config

# the long-context seed's setup on H100: blockwise FP8, precision-aware optimizer with BF16
# moments, BF16 grads, selective recompute of the MLA / MoE side, flex + DeepEP, optimizer offload
OVERRIDES = [
    # Bridge's bf16_with_fp8_subchannel_scaling_mixed, spelt out so grad_reduce_in_fp32 can be set
    "mixed_precision.bf16=true", "mixed_precision.fp8=hybrid",
    "mixed_precision.fp8_recipe=blockwise", "mixed_precision.grad_reduce_in_fp32=false",
    "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
    "optimizer.use_precision_aware_optimizer=true", "optimizer.main_grads_dtype=bf16",
    "optimizer.exp_avg_dtype=bf16", "optimizer.exp_avg_sq_dtype=bf16",
    "optimizer.optimizer_cpu_offload=true", "optimizer.optimizer_offload_fraction=0.5",
    "optimizer.decoupled_weight_decay=true",
    "model.recompute_granularity=selective",
    "model.recompute_modules=[mla_up_proj,layernorm,moe,mlp]", "model.moe_grouped_gemm=true",
    "model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep",
    "model.moe_router_dtype=fp32", "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
]
CASES = [  # (label, GPUs, seq, constraints)
    ("DeepSeek-V3 4096 x H100 128K, ETP 1 or TP", 4096, 131072, None),
    ("DeepSeek-V3 4096 x H100 128K, ETP 1", 4096, 131072, {"expert_tensor_parallel_size": [1]}),
    ("DeepSeek-V3 256 x H100 128K, ETP 1", 256, 131072, {"expert_tensor_parallel_size": [1]}),
    ("DeepSeek-V3 512 x H100 256K, ETP 1", 512, 262144, {"expert_tensor_parallel_size": [1]}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cfg = load_config(preset="deepseek-v3", overrides=OVERRIDES)
    print(f"{'case':44} {'skel.':>6} {'layouts':>8} {'priced':>7} {'bounded':>8} "
          f"{'rescue':>6} {'cold s':>7} {'warm s':>7}  best")
    for label, n, seq, cons in CASES:
        t0 = time.perf_counter()
        plan = plan_parallelism(cfg, n, "H100", seq, 128, top_k=10, constraints=cons)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            plan_parallelism(cfg, n, "H100", seq, 128, top_k=10, constraints=cons)
            warm.append(time.perf_counter() - t0)
        c, best = plan.counts, plan.layouts[0] if plan.layouts else None
        desc = "-" if best is None else (
            f"TP{best.tensor_model_parallel_size} CP{best.context_parallel_size} "
            f"EP{best.expert_model_parallel_size} PP{best.pipeline_model_parallel_size} "
            f"DP{best.data_parallel_size} ({best.fit}, {best.headroom_gib} GiB)")
        print(f"{label:44} {c.skeletons:6} {c.layouts:8} {c.priced:7} {c.bounded:8} "
              f"{c.rescue_estimates:6} {cold:7.3f} {statistics.median(warm):7.3f}  {desc}")
    print("skel. = (TP, PP, VPP, EP, ETP, MBS) combinations; layouts = every (TP, PP, VPP, "
          "EP, ETP, MBS, CP) that passes the divisibility rules; "
          "priced = estimate_memory calls; bounded = decided by the monotone CP / EP bound or "
          "MBS > 1 (needs more memory than MBS 1 and ranks below it)")


if __name__ == "__main__":
    main()
