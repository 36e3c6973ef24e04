"""Ground truth: full recompute (`uniform` and `block`, N = 1, 2, 4) priced by the estimator
against the live activation peak of a real Megatron-Core GPTModel on CPU.

mcore_recompute.py measures, through forward, recompute and backward, the peak of live
activation bytes of an 8-layer model with 1 and with 8 micro-batches forwarded before the first
backward (the in-flight count of a pipeline's first stage, emulated at PP = 1). The estimate is
the estimator's stage pieces at that in-flight count.

What must hold:

- the measurement itself follows the mechanism (memory.recompute): per micro-batch one input
  per `uniform` group, N inputs plus L - N whole layers for `block`; in backward N whole
  layers rebuilt for `uniform`, none beyond what the micro-batch freed for `block`;
- the estimator orders the six configurations as measured, at both in-flight counts;
- every estimated difference to `uniform` N = 1 is within 3 % of the measured one (or 16 KiB,
  half a checkpoint input, where the difference is small). The absolute levels differ by a
  constant (the CPU backward's own transients, ~0.3 MB here), which cancels in the differences;
- with 8 micro-batches in flight `uniform` N = 2 peaks below N = 1 (measured and estimated):
  N = 1 keeps the least per micro-batch, not the least at the peak.

One model build and step per config and in-flight count (12 runs, a few seconds each).
"""

from __future__ import annotations

import pytest

from helpers import require_megatron

require_megatron()
from mcore_recompute import (  # noqa: E402
    CONFIGS,
    IN_FLIGHT,
    MODEL,
    estimated_bytes,
    measure_all,
    training_config,
)

TOLERANCE = 0.03
S, H = MODEL["seq_length"], MODEL["hidden_size"]
INPUT = 2 * S * H  # one checkpoint input: 2sbh bytes (b = 1)
FLOOR = INPUT // 2
REF = "uniform-1"


@pytest.fixture(scope="module")
def measured() -> dict[tuple[str, int], int]:
    return measure_all()


@pytest.fixture(scope="module")
def estimated() -> dict[tuple[str, int], float]:
    return {(name, k): estimated_bytes(training_config(name), k)
            for k in IN_FLIGHT for name in CONFIGS}


# a few hundred bytes of CPU allocator noise between runs (seen once in a clean-clone CI run:
# 256 B on a 607,232 B difference); a layer is 640,000 B, an input 32,768 B
SLACK = 1024


def _layer_bytes(measured: dict[tuple[str, int], int]) -> int:
    # uniform N=2 vs N=1 at one micro-batch: one more layer rebuilt, four fewer inputs kept
    return measured[("uniform-2", 1)] - measured[("uniform-1", 1)] + 4 * INPUT


@pytest.mark.parametrize("k", IN_FLIGHT)
def test_measurement_follows_the_mechanism(measured: dict[tuple[str, int], int],
                                           k: int) -> None:
    layer = _layer_bytes(measured)
    got = {name: measured[(name, k)] for name in CONFIGS}
    # uniform: N layers rebuilt at once, ceil(8/N) inputs per micro-batch
    assert got["uniform-4"] - got["uniform-2"] == pytest.approx(2 * layer - k * 2 * INPUT,
                                                               abs=SLACK)
    # block: N inputs + (8 - N) whole layers per micro-batch, nothing rebuilt on top
    assert got["block-1"] - got["block-2"] == pytest.approx(k * (layer - INPUT), abs=SLACK)
    assert got["block-2"] - got["block-4"] == pytest.approx(k * 2 * (layer - INPUT),
                                                            abs=SLACK)
    # block N=4 keeps the 4 whole layers uniform N=4 rebuilds, and 2 more inputs
    if k == 1:
        assert got["block-4"] - got["uniform-4"] == pytest.approx(2 * INPUT, abs=SLACK)


@pytest.mark.parametrize("k", IN_FLIGHT)
def test_estimator_orders_the_six_as_measured(measured: dict[tuple[str, int], int],
                                              estimated: dict[tuple[str, int], float],
                                              k: int) -> None:
    by_measured = sorted(CONFIGS, key=lambda name: measured[(name, k)])
    by_estimate = sorted(CONFIGS, key=lambda name: estimated[(name, k)])
    assert by_estimate == by_measured, {name: (measured[(name, k)], round(estimated[(name, k)]))
                                        for name in CONFIGS}


@pytest.mark.parametrize("k", IN_FLIGHT)
@pytest.mark.parametrize("name", [n for n in CONFIGS if n != REF])
def test_estimated_differences_within_3_percent(measured: dict[tuple[str, int], int],
                                                estimated: dict[tuple[str, int], float],
                                                name: str, k: int) -> None:
    real = measured[(name, k)] - measured[(REF, k)]
    est = estimated[(name, k)] - estimated[(REF, k)]
    assert abs(est - real) <= max(TOLERANCE * abs(real), FLOOR), (
        f"{name} - {REF} at {k} in flight: estimate {est:+,.0f} B vs measured {real:+,} B")


def test_with_many_in_flight_a_larger_uniform_group_peaks_lower(
        measured: dict[tuple[str, int], int], estimated: dict[tuple[str, int], float]) -> None:
    for source in (measured, estimated):
        assert source[("uniform-1", 1)] < source[("uniform-2", 1)]
        assert source[("uniform-2", 8)] < source[("uniform-1", 8)]
