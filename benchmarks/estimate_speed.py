"""How many estimate_memory() calls per second one core does on DeepSeek-V3 with PP16 VPP4.

Goal: >= 20,000/s, so a planner can price thousands of candidate layouts in one tool call.
Prints the figures; asserts nothing (not a test). Each call recomputes everything that depends
on the parallel layout; only per-model-shape parameter counts are cached (as in real use, where
a sweep varies the layout of one model).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _rate import calls_per_second
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

# DeepSeek-V3 on 1,024 H100s: TP1 PP16 VPP4 EP64; 61 layers, the embedding, the MTP layer and
# the loss over 64 virtual stages.
OVERRIDES = [
    "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=16",
    "model.expert_model_parallel_size=64", "model.expert_tensor_parallel_size=1",
    "model.sequence_parallel=false", "model.seq_length=4096",
    "model.recompute_granularity=selective",
    "model.recompute_modules=[mla_up_proj,layernorm,moe_act]", "model.moe_grouped_gemm=true",
    "model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep",
    "model.pipeline_model_parallel_layout=E|(t|)*61|mL", "mixed_precision=bf16_mixed",
    "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
    "train.micro_batch_size=1", "train.global_batch_size=8192", "cluster.num_gpus=1024",
    "cluster.gpus_per_node=8", "cluster.gpu=H100",
    "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=2.0, help="time per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    cfg = load_config(preset="deepseek-v3", overrides=OVERRIDES)
    t0 = time.perf_counter()
    report = estimate_memory(cfg)  # first call: builds the per-shape parameter cache
    first_ms = (time.perf_counter() - t0) * 1e3
    rates = calls_per_second(lambda: estimate_memory(cfg), seconds=args.seconds,
                             repeats=args.repeats, batch=200)
    par = report.parallelism
    print(f"config: deepseek-v3, TP{par['tensor']} PP{par['pipeline']} "
          f"VPP{par['virtual_pipeline']} EP{par['expert']} on {par['world_size']} GPUs, "
          f"{len(report.per_stage)} stages, most loaded stage {report.most_loaded_stage} at "
          f"{report.peak_allocated_gib:.1f} GiB")
    print(f"first call (cold parameter cache): {first_ms:.1f} ms")
    med = statistics.median(rates)
    print(f"estimate_memory(): median {med:,.0f}/s, min {min(rates):,.0f}/s, "
          f"max {max(rates):,.0f}/s over {args.repeats} x {args.seconds:g} s "
          f"(goal >= 20,000/s)")
    print(f"                   {1e6 / med:.1f} us per call")


if __name__ == "__main__":
    main()
