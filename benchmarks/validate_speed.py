"""How many validate() calls per second one core does on a DeepSeek-V3 config.

Goal: >= 5,000/s, so an assistant can sweep thousands of candidate layouts in a tool call.
Prints the figures; asserts nothing (not a test).
"""

from __future__ import annotations

import argparse
import statistics
import time

from _rate import calls_per_second
from mbridge_perf.config.load import load_config
from mbridge_perf.rules import RULES, validate

# DeepSeek-V3 pretraining on 256 H100s (the 128K long-context family's mesh at 4K).
OVERRIDES = [
    "model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=8",
    "model.virtual_pipeline_model_parallel_size=4", "model.expert_model_parallel_size=32",
    "model.expert_tensor_parallel_size=1", "model.sequence_parallel=false",
    "model.seq_length=4096", "model.recompute_granularity=selective",
    "model.recompute_modules=[mla_up_proj,layernorm,moe_act]", "model.moe_grouped_gemm=true",
    "model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep",
    "model.pipeline_model_parallel_layout=Et|(tt|)*30mL", "mixed_precision=bf16_mixed",
    "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
    "train.micro_batch_size=1", "train.global_batch_size=2048", "cluster.num_gpus=256",
    "cluster.gpus_per_node=8", "cluster.gpu=H100",
    "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    t0 = time.perf_counter()
    cfg = load_config(preset="deepseek-v3", overrides=OVERRIDES)
    load_ms = (time.perf_counter() - t0) * 1e3
    report = validate(cfg)
    rates = calls_per_second(lambda: validate(cfg), seconds=args.seconds,
                             repeats=args.repeats, batch=100)
    print(f"config: deepseek-v3, {len(RULES)} rules, {len(report.findings)} findings "
          f"({report.errors} errors), layers per stage {report.derived['layers_per_stage']}")
    print(f"first load_config (preset + {len(OVERRIDES)} overrides): {load_ms:.1f} ms")
    print(f"validate(): median {statistics.median(rates):,.0f}/s, min {min(rates):,.0f}/s, "
          f"max {max(rates):,.0f}/s over {args.repeats} x {args.seconds:g} s (goal >= 5,000/s)")
    per_call = 1e6 / statistics.median(rates)
    print(f"            {per_call:.0f} us per call")


if __name__ == "__main__":
    main()
