"""How long one estimate_step_time takes, warm (the resolved view and the per-model work
cached), on Bridge recipes of three shapes: a dense 8B, a 235B MoE on 256 GPUs and DeepSeek-V3
(MLA, MTP) on 256 GPUs. Goal: < 1 ms per call on one core. Also the first (cold) call, and
predict_step_time_s on a resolved view (what the planner and the fit call).
Prints the figures; asserts nothing (not a test).

    python benchmarks/steptime_speed.py
"""

from __future__ import annotations

import statistics
import time

from mbridge_perf.config.derived import derive
from mbridge_perf.config.load import load_config
from mbridge_perf.steptime import estimate_step_time, predict_step_time_s

CASES = [("llama3_8b_pretrain_8gpu_b200_fp8cs", 8, "B200"),
         ("qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx", 256, "GB200"),
         ("deepseek_v3_pretrain_256gpu_gb200_fp8mx", 256, "GB200")]
REPEAT = 300


def per_call_ms(fn) -> float:  # type: ignore[no-untyped-def]
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(REPEAT):
            fn()
        samples.append((time.perf_counter() - t0) / REPEAT * 1e3)
    return statistics.median(samples)


def main() -> None:
    print(f"{'recipe':46} {'cold ms':>8} {'warm ms':>8} {'view ms':>8}  predicted step")
    for name, n, gpu in CASES:
        cfg = load_config(recipe=name, overrides=[f"cluster.num_gpus={n}", f"cluster.gpu={gpu}"])
        t0 = time.perf_counter()
        rep = estimate_step_time(cfg)
        cold = (time.perf_counter() - t0) * 1e3
        warm = per_call_ms(lambda c=cfg: estimate_step_time(c))
        d = derive(cfg)
        view = per_call_ms(lambda d=d: predict_step_time_s(d))
        print(f"{name:46} {cold:8.2f} {warm:8.3f} {view:8.3f}  {rep.step_time_s:.2f} s, "
              f"{rep.tokens_per_s_per_gpu:,.0f} tokens/s/GPU")


if __name__ == "__main__":
    main()
