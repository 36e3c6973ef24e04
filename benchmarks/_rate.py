"""Shared timing loop of the speed benchmarks: calls per second over repeated windows."""

from __future__ import annotations

import time
from collections.abc import Callable


def calls_per_second(fn: Callable[[], object], *, seconds: float, repeats: int,
                     batch: int = 100) -> list[float]:
    """One rate per repeat: `fn` called in batches until `seconds` have passed."""
    rates = []
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            for _ in range(batch):
                fn()
            n += batch
        rates.append(n / elapsed)
    return rates
