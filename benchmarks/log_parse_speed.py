"""How fast parse_log() reads a large training log on one core.

Writes (in a temporary directory) a realistic Megatron Bridge log of --size-mb: a 128-GPU MoE run
launched with `srun -l` (rank prefixes on every line), the rank-0 startup (NCCL init from every
rank, the printed config, theoretical memory, warnings, CUDA-graph capture), then per iteration
the last rank's iteration line, rank 0's Step Time line, memory reports after iterations 1 and 2,
timers every 10 iterations and warnings from random ranks; the end-of-training marker last.
Then parses it (--repeats times) and prints seconds (wall and CPU) and MB/s. Goal: 1 GB in < 10 s
on one core. Asserts nothing (not a test); it prints what the parse found, so a wrong fast parse
is visible.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from mbridge_perf.bench.logparse import parse_log
from mbridge_perf.bench.result import evaluate

RANKS = 128
LAST = RANKS - 1
CONFIG = """model:
  num_layers: 48
  hidden_size: 2048
  num_moe_experts: 128
  moe_router_topk: 8
  moe_token_dispatcher_type: flex
  moe_flex_dispatcher_backend: hybridep
  moe_shared_expert_overlap: false
  cuda_graph_impl: transformer_engine
  cuda_graph_warmup_steps: 3
  fp8: null
  fp4: null
  recompute_granularity: selective
  tensor_model_parallel_size: 1
  expert_model_parallel_size: 16
comm_overlap:
  tp_comm_overlap: false
  overlap_moe_expert_parallel_comm: true
  delay_wgrad_compute: false
ddp:
  overlap_grad_reduce: true
  overlap_param_gather: true
mixed_precision: bf16_mixed""".splitlines()
NOISE = (
    "{r}: [rank{r}]:[W822 10:{m:02d}:{s:02d}.{us:06d} ProcessGroupNCCL.cpp:4561] Warning: "
    "TORCH_NCCL_AVOID_RECORD_STREAMS is the default now, this environment variable is thus "
    "deprecated. (function operator())",
    "{r}: /usr/local/lib/python3.12/dist-packages/transformer_engine/pytorch/module/base.py:"
    "{us}: UserWarning: Weight gradient accumulation fusion requires main_grad; falling back.",
    "{r}: INFO:megatron.core.rerun_state_machine:Rerun state machine: step {us}, no rerun needed",
    "{r}: node{n:03d}:{us}:{us} [{lr}] NCCL INFO Channel {lr:02d}/0 : {r}[{lr}] -> {r2}[{lr}] "
    "via P2P/CUMEM/read",
)


def _iteration_line(i: int, total: int, rng: random.Random) -> str:
    ms = 2400 + rng.random() * 40 + (900 if i == 1 else 0)
    return (f"{LAST}:  [2026-08-22 10:{i // 60 % 60:02d}:{i % 60:02d}] iteration {i:8d}/{total:8d}"
            f" | consumed samples: {i * 512:12d} | elapsed time per iteration (ms): {ms:.1f}"
            f" | throughput per GPU (TFLOP/s/GPU): {300 * 2400 / ms:.1f}"
            f" | learning rate: {1e-4 * min(1.0, i / 10):.6E} | global batch size:   512"
            f" | lm loss: {10.5 / (1 + i / 500) + rng.random() * 0.05:.6E}"
            f" | load_balancing_loss: {1.0 + rng.random() * 0.01:.6E}"
            f" | loss scale: 1.0 | grad norm: {0.8 + rng.random() * 0.2:.3f}"
            f" | number of skipped iterations:   0 | number of nan iterations:   0 |")


def _noise(rng: random.Random) -> str:
    r = rng.randrange(RANKS)
    return rng.choice(NOISE).format(r=r, r2=(r + 1) % RANKS, lr=r % 8, n=r // 8,
                                    m=rng.randrange(60), s=rng.randrange(60),
                                    us=rng.randrange(1_000_000))


def write_log(path: Path, size_mb: int, seed: int = 0) -> int:
    """Write a log of about size_mb MB; returns the number of iterations in it."""
    rng = random.Random(seed)
    target = size_mb * 1_000_000
    # one iteration with its Step Time line, timers and ~1.4 noise lines is ~670 bytes
    total = max(60, target // 670)
    out: list[str] = []
    for r in range(RANKS):
        out.append(f"{r}: node{r // 8:03d}:{1000 + r}:{1000 + r} [{r % 8}] NCCL INFO "
                   f"Bootstrap : Using ib0:10.0.{r // 8}.{r % 8}<0>")
        out.append(f"{r}: node{r // 8:03d}:{1000 + r}:{1000 + r} [{r % 8}] NCCL INFO "
                   f"cudaDriverVersion 12080")
    out += [f"0: {line}" for line in CONFIG]
    out += [
        "0: WARNING:megatron.core.transformer.transformer_config:moe_ffn_hidden_size is not "
        "set, using ffn_hidden_size instead.",
        "0: Number of parameters in transformer block in billions:  29.87",
        "0: Number of parameters in most loaded shard in billions: 2.1234",
        "0: Theoretical memory footprints: weight and optimizer=23456.78 MB",
        "0: INFO:megatron.bridge.training.train:Starting training loop at iteration 0",
    ]
    written = 0
    with path.open("w") as f:
        f.write("\n".join(out) + "\n")
        out = []
        for i in range(1, total + 1):
            out.append(_iteration_line(i, total, rng))
            out.append(f"0: Step Time : {2.4 + rng.random() * 0.04:.2f}s GPU utilization: "
                       f"{299 + rng.random():.1f}MODEL_TFLOP/s/GPU")
            if i in (1, 2):
                for r in range(0, RANKS, 8):
                    out.append(
                        f"{r}: [Rank {r}] (after {i} iterations) memory (GB) | "
                        f"mem-allocated-gigabytes: {40 + r / 100:.5g} | mem-active-gigabytes: 40 "
                        f"| mem-inactive-gigabytes: 1.5 | mem-reserved-gigabytes: 61.2 | "
                        f"mem-max-allocated-gigabytes: {55 + r / 50:.5g} | mem-max-active-"
                        f"gigabytes: 55 | mem-max-inactive-gigabytes: 3.1 | mem-max-reserved-"
                        f"gigabytes: {66 + r / 64:.5g} | mem-alloc-retires: 0 | "
                        f"mem-allocated-count: 281949")
            if i == 4:
                out.append("0: INFO:megatron.core.transformer.cuda_graphs:> built 96 cuda "
                           "graph(s) in 3.21 sec, with total memory usage: allocated 1.2 gb, "
                           "reserved 1.5 gb.")
            if i % 10 == 0:
                out.append(f"{LAST}: (min, max) time across ranks (ms):")
                out.append(f"{LAST}:     forward-backward ...............................: "
                           f"({2300 + rng.random():.2f}, {2350 + rng.random():.2f})")
                out.append(f"{LAST}:     optimizer ......................................: "
                           f"({40 + rng.random():.2f}, {45 + rng.random():.2f})")
            for _ in range(rng.choice((0, 1, 1, 2, 3))):
                out.append(_noise(rng))
            if len(out) > 20_000:
                text = "\n".join(out) + "\n"
                f.write(text)
                written += len(text)
                out = []
        out.append("0: [after training is done] datetime: 2026-08-22 12:00:00 ")
        f.write("\n".join(out) + "\n")
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024, help="log size (default 1024)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="parse this many times and report each (the best is the figure "
                             "on a machine shared with other work)")
    parser.add_argument("--keep", type=Path, help="write the log here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "train.log"
        t0 = time.perf_counter()
        total = write_log(path, args.size_mb)
        gen_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        print(f"log: {size / 1e6:,.0f} MB, {total:,} iterations, written in {gen_s:.1f} s")

        runs = []
        for _ in range(max(1, args.repeats)):
            t0, c0 = time.perf_counter(), time.process_time()
            parsed = parse_log(path)
            runs.append((time.perf_counter() - t0, time.process_time() - c0))
        parse_s = min(runs)[0]
        t0 = time.perf_counter()
        result = evaluate(parsed, window=(total - 9, total), num_gpus=RANKS, seq_length=4096,
                          requested_features=["cuda_graph", "flex:hybridep"])
        eval_s = time.perf_counter() - t0
        s = parsed.summary()
        for wall, cpu in runs:
            print(f"parse_log(): {wall:.2f} s wall ({cpu:.2f} s CPU, one core), "
                  f"{size / 1e6 / wall:,.0f} MB/s (goal: 1 GB in < 10 s, i.e. >= 100 MB/s)")
        if len(runs) > 1:
            print(f"best: {parse_s:.2f} s wall, {size / 1e6 / parse_s:,.0f} MB/s; "
                  f"1 GB at this rate: {1e9 / (size / parse_s):.1f} s")
        print(f"evaluate() on the last 10 iterations: {eval_s * 1e3:.0f} ms")
        print(f"found: {s.iteration_lines:,}/{total:,} iteration lines, {s.step_time_lines:,} "
              f"Step Time lines, {len(s.memory_reports)} memory reports, "
              f"{len(s.findings)} findings, config keys {sorted(s.config)}, "
              f"completed={s.completed}")
        m, mem = result.metrics, result.memory
        print(f"result: {result.outcome}; step time median "
              f"{m.step_time_ms.median if m.step_time_ms else float('nan'):.1f} ms, TFLOP/s/GPU "
              f"median {m.tflops_per_gpu.median if m.tflops_per_gpu else float('nan'):.1f}, "
              f"peak allocated {mem.peak_allocated_gib if mem else float('nan'):.2f} GiB")


if __name__ == "__main__":
    main()
