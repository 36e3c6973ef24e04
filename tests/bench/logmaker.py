"""Iteration lines in the exact Megatron Bridge template (log-formats §2), for the parser and
result tests."""

from __future__ import annotations


def line(i: int, total: int = 60, *, elapsed: float = 2000.0, tflops: float | None = 300.0,
         losses: dict[str, float] | None = None, grad: str | None = "0.812", skipped: int = 0,
         nan: int = 0, extra: str = "", prefix: str = "") -> str:
    """An iteration line in the exact Bridge template (§2)."""
    s = (f"{prefix} [2026-08-22 10:15:03] iteration {i:8d}/{total:8d} | consumed samples: "
         f"{i * 128:12d} | elapsed time per iteration (ms): {elapsed:.1f} |")
    if tflops is not None:
        s += f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |"
    s += extra
    s += f" learning rate: {1.234e-5:.6E} | global batch size: {128:5d} |"
    for k, v in (losses if losses is not None else {"lm loss": 8.1}).items():
        s += f" {k}: {v:.6E} |"
    s += " loss scale: 1.0 |"
    if grad is not None:
        s += f" grad norm: {grad} |"
    s += f" number of skipped iterations: {skipped:3d} | number of nan iterations: {nan:3d} |"
    return s
