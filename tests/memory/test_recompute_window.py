"""Full recompute priced as Megatron-Core runs it, per chunk (memory.recompute): what each
micro-batch keeps, what one backward rebuilds, and where that moves the peak. The CPU ground
truth of the same mechanism is test_recompute_mcore.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import estimate_memory
from mbridge_perf.memory.recompute import rebuilt_layers

SEED = Path(__file__).resolve().parents[2] / "examples" / "llama3_70b_sft_h100.yaml"


def _model(**fields: object) -> TrainingConfig:
    # a small vocabulary: the loss's logits stay below one layer's backward
    base = {"num_layers": 16, "hidden_size": 1024, "num_attention_heads": 16,
            "seq_length": 2048, "vocab_size": 1024, "bf16": True}
    return TrainingConfig.model_validate({"model": {**base, **fields},
                                          "train": {"micro_batch_size": 1}})


@pytest.mark.parametrize(("pp", "vpp", "method", "n", "want"), [
    (1, None, "uniform", 1, 1), (1, None, "uniform", 4, 4), (1, None, "uniform", 16, 16),
    # a chunk of 4 layers never rebuilds more than its 4 (0.19 clamps the group)
    (2, 2, "uniform", 8, 4),
    # block: a kept layer is freed before the checkpointed ones rebuild; only a chunk
    # checkpointed whole adds a layer
    (1, None, "block", 1, 0), (1, None, "block", 15, 0), (1, None, "block", 16, 1),
    (2, 2, "block", 4, 1), (2, 2, "block", 3, 0),
    (1, None, None, 1, 0),
])
def test_rebuilt_layers(pp: int, vpp: int | None, method: str | None, n: int,
                        want: int) -> None:
    m = _model(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp).model
    assert rebuilt_layers(m, method, n) == want


def _stage0(cfg: TrainingConfig) -> tuple[float, float]:
    st = estimate_memory(cfg).per_stage[0]
    return st.activations_gib, st.transient_gib


def _full(method: str, n: int, **fields: object) -> TrainingConfig:
    return _model(recompute_granularity="full", recompute_method=method,
                  recompute_num_layers=n, **fields)


def test_uniform_rebuilds_its_group_and_block_one_layer_only_when_nothing_is_kept() -> None:
    act1, ws1 = _stage0(_full("uniform", 1))
    act4, ws4 = _stage0(_full("uniform", 4))
    assert act4 < act1 and ws4 > ws1
    layer = (ws4 - ws1) / 3  # one more layer rebuilt per step of N
    _, ws_block = _stage0(_full("block", 4))
    _, ws_whole = _stage0(_full("block", 16))
    assert ws_whole == pytest.approx(ws1)
    assert ws_block == pytest.approx(ws1 - layer)


def test_a_group_larger_than_the_chunk_costs_what_the_chunk_holds() -> None:
    vpp = {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}
    assert _stage0(_full("uniform", 8, **vpp)) == _stage0(_full("uniform", 4, **vpp))


def _seed(method: str, n: int) -> float:
    """Stage 0 of the skill's Llama3 70B seed layout (PP4 VPP5, 23 chunk micro-batches in
    flight): activations + transient of the forward/backward phase, GiB."""
    cfg = load_config(preset="llama3-70b", file=SEED, overrides=[
        "model.recompute_granularity=full", f"model.recompute_method={method}",
        f"model.recompute_num_layers={n}", "model.cuda_graph_impl=none"])
    st = estimate_memory(cfg).per_stage[0]
    return st.activations_gib + st.transient_gib


def test_on_the_seed_layout_uniform_n2_peaks_below_n1() -> None:
    u1, u2, u4 = (_seed("uniform", n) for n in (1, 2, 4))
    assert u2 < u4 < u1
    # the figures the activation-recompute skill quotes (references/measurements.md)
    assert (u1, u2, u4) == pytest.approx((1.98, 1.54, 1.74), abs=0.02)
