"""Ground truth for full recompute: the peak of live activation bytes of a real Megatron-Core
`GPTModel` through forward and backward, for `uniform` and `block` with N = 1, 2, 4.

Why a live peak and not the saved set: full recompute trades what a micro-batch keeps between
its forward and its backward (one input per checkpoint group, plus the layers `block` leaves
whole) for what backward rebuilds (a whole `uniform` group at once, one `block` layer). The
saved set after the forward sees only the first; the peak needs both.

Method (same CPU shims and one-rank gloo group as mcore_activations.py): a
`TorchDispatchMode` sees every tensor an operator returns, forward, recompute and backward
alike; each new storage adds its bytes to a running total and a `weakref.finalize` on the
storage takes them off when it is freed. The peak of that total, less the gradients that were
already allocated by a warm-up step, is the activation peak of the step (saved tensors, the
rebuilt group and the backward's transients; parameters never count). The unfused softmax's
causal mask is built once and cached (0.16.1 builds one per call; a GPU build caches it).

Several micro-batches in flight, as a pipeline's first stage holds them, are emulated with
PP = 1: M forwards, then the M backwards oldest first. The estimate of the same config is the
estimator's stage pieces with M in flight: M x `activation_per_microbatch` + `transient`.

Run as a script for the table: `python tests/memory/mcore_recompute.py`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from mcore_activations import BASE_MODEL, build_model, megatron_on_cpu
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from mbridge_perf.config.model import TrainingConfig

# 8 layers where one layer's activations (34sbh + 5as²b = 20 checkpoint inputs of 2sbh) and
# the inputs of many micro-batches are of the same order: the regime where N > 1 can win.
MODEL: dict[str, Any] = {**BASE_MODEL, "num_layers": 8, "hidden_size": 256,
                         "ffn_hidden_size": 1024, "seq_length": 64}
CONFIGS: dict[str, tuple[str, int]] = {
    "uniform-1": ("uniform", 1), "uniform-2": ("uniform", 2), "uniform-4": ("uniform", 4),
    "block-1": ("block", 1), "block-2": ("block", 2), "block-4": ("block", 4),
}
IN_FLIGHT = (1, 8)


def training_config(name: str) -> TrainingConfig:
    method, n = CONFIGS[name]
    model = {**MODEL, "recompute_granularity": "full", "recompute_method": method,
             "recompute_num_layers": n}
    return TrainingConfig.model_validate({"model": model, "train": {"micro_batch_size": 1}})


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages operators returned that are still alive, and their peak."""

    def __init__(self, ignore: set[int]) -> None:
        super().__init__()
        self.ignore = ignore
        self.sizes: dict[int, int] = {}
        self.live = 0
        self.peak = 0

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self.sizes.pop(key, None)

    def add(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage._cdata
        if key in self.sizes or key in self.ignore:
            return
        nbytes = storage.nbytes()
        self.sizes[key] = nbytes
        self.live += nbytes
        weakref.finalize(storage, self._free, key, nbytes)
        self.peak = max(self.peak, self.live)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                self.add(t)
        return out


@contextlib.contextmanager
def recompute_on_cpu() -> Iterator[None]:
    """megatron_on_cpu with the causal mask cached (built once, outside the measurement)."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.transformer.utils as tutils
    import torch._dynamo as dynamo

    # megatron_on_cpu's MonkeyPatch of dynamo.config.disable leaves the key hidden when undone
    # (ConfigModule), so a second use in one process fails; assigning it makes it visible
    # again, before and after ours
    if not hasattr(dynamo.config, "disable"):
        dynamo.config.disable = False
    try:
        with megatron_on_cpu(), pytest.MonkeyPatch.context() as mp:
            mask = functools.lru_cache(maxsize=None)(
                lambda sq: torch.triu(torch.ones(sq, sq), diagonal=1).bool())
            mp.setattr(tutils, "get_default_causal_mask", mask)
            mp.setattr(fused_softmax, "get_default_causal_mask", mask)
            yield
    finally:
        if not hasattr(dynamo.config, "disable"):
            dynamo.config.disable = False


def peak_bytes(cfg: TrainingConfig, in_flight: int) -> tuple[int, int]:
    """(peak live activation bytes, bytes held after the forwards) of one step with
    `in_flight` micro-batches forwarded before the first backward (inside recompute_on_cpu)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(cfg)
    model.train()
    m = cfg.model
    s, v = int(m.seq_length or 0), int(m.vocab_size or 0)
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, v, (1, s), generator=gen) for _ in range(in_flight)]
    labels = [torch.randint(0, v, (1, s), generator=gen) for _ in range(in_flight)]
    positions = torch.arange(s).unsqueeze(0)
    held = [0]

    def step(tracker: LiveBytes | None, count: int) -> None:
        losses = [model(tokens[i], positions, None, labels=labels[i]).float().mean()
                  for i in range(count)]
        if tracker is not None:
            held[0] = tracker.live
        for loss in losses:
            loss.backward()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # warm-up: one micro-batch makes every gradient exist; backward then accumulates in place
        step(None, 1)
        gc.collect()
        tracker = LiveBytes({p.untyped_storage()._cdata for p in model.parameters()})
        for p in model.parameters():
            if p.grad is not None:
                tracker.add(p.grad)
        base = tracker.peak = tracker.live
        with tracker:
            step(tracker, in_flight)
    return tracker.peak - base, held[0] - base


def measure_all(in_flight: tuple[int, ...] = IN_FLIGHT) -> dict[tuple[str, int], int]:
    """Peak bytes of every config at every in-flight count."""
    with recompute_on_cpu():
        return {(name, k): peak_bytes(training_config(name), k)[0]
                for k in in_flight for name in CONFIGS}


def estimated_bytes(cfg: TrainingConfig, in_flight: int) -> float:
    """The estimator's activation peak of the config's only stage with `in_flight`
    micro-batches held: in-flight x per-micro-batch bytes + the backward's transient."""
    from mbridge_perf.memory.estimate import estimate_memory

    stage = estimate_memory(cfg).per_stage[0]
    return (in_flight * stage.activation_per_microbatch_gib + stage.transient_gib) * 2**30


def main() -> None:
    import time

    start = time.perf_counter()
    measured = measure_all()
    took = time.perf_counter() - start
    print(f"{'config':<12}{'in flight':>10}{'measured B':>13}{'MiB':>8}{'estimate B':>13}"
          f"{'est - meas':>12}")
    for (name, k), got in measured.items():
        est = estimated_bytes(training_config(name), k)
        print(f"{name:<12}{k:>10}{got:>13,}{got / 2**20:>8.2f}{est:>13,.0f}{est - got:>+12,.0f}")
    print(f"{len(measured)} runs in {took:.1f} s")


if __name__ == "__main__":
    main()
