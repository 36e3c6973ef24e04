"""Ground truth: the per-layer activation estimate against real Megatron-Core layers on CPU.

Every case of `mcore_activations.CASES` is one TrainingConfig; the same config builds the
Megatron-Core `GPTModel` (local specs, one-rank gloo group) whose saved-for-backward bytes are
counted per decoder layer, and drives `layer_activation_bytes`. Two checks:

- the measurement itself equals a closed form exactly (the terms of
  ../shared/reference/cpu-ground-truth.md §4.3 and §10 at these shapes), so a broken shim or a
  Megatron-Core change shows up as such and not as an estimator error;
- the estimate is within 3 % of the measurement, per layer.

One forward per case, measured once for the module (a few seconds in all).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from mbridge_perf.config.model import TrainingConfig

from helpers import require_megatron

require_megatron()
from mcore_activations import (  # noqa: E402
    CASES,
    Measurement,
    measure_all,
    training_config,
)

TOLERANCE = 0.03


@dataclass(frozen=True)
class Dims:
    s: int
    b: int
    h: int
    a: int
    g: int  # query groups
    d: int  # head dim
    f: int  # ffn hidden size

    @classmethod
    def of(cls, cfg: TrainingConfig) -> Dims:
        m = cfg.model
        h, a = int(m.hidden_size or 0), int(m.num_attention_heads or 0)
        return cls(s=int(m.seq_length or 0), b=cfg.train.micro_batch_size, h=h, a=a,
                   g=int(m.num_query_groups or a), d=int(m.kv_channels or h // a),
                   f=int(m.ffn_hidden_size or 4 * h))

    @property
    def sbh(self) -> int:
        return self.s * self.b * self.h

    @property
    def as2b(self) -> int:
        return self.a * self.s * self.s * self.b

    @property
    def sbf(self) -> int:
        return self.s * self.b * self.f

    @property
    def ln_stats(self) -> int:
        """Two LayerNorms, fp32 mean and rstd per token: 16 B per token."""
        return 16 * self.s * self.b

    @property
    def rope_cos_sin(self) -> int:
        """cos and sin, computed for q and for k in every layer: 4 · s · d · 2 B (not · b)."""
        return 8 * self.s * self.d


# the int32 attention-mask-type scalar the core_attn checkpoint saves; the fp32 scale the
# fused softmax saves
SCALAR = 4


def _paper(x: Dims) -> int:
    return 34 * x.sbh + 5 * x.as2b + x.ln_stats


# Exact bytes per layer (bf16 unless stated; TP 1) — what each case must measure.
CLOSED_FORM: dict[str, Callable[[Dims, int], int]] = {
    "paper-none": lambda x, i: _paper(x),
    "paper-mbs2": lambda x, i: _paper(x),
    # no masks: both hidden masks go; softmax output and bmm input are one tensor
    "dropout0-none": lambda x, i: 32 * x.sbh + 2 * x.as2b + x.ln_stats,
    # the unfused softmax upcast keeps fp32 probabilities
    "softmax-fp32-none": lambda x, i: 34 * x.sbh + 7 * x.as2b + x.ln_stats,
    "sel-core_attn": lambda x, i: 34 * x.sbh + x.ln_stats + SCALAR,
    # both norm outputs are freed (−4sbh) and the norms, run without grad, keep no statistics
    "sel-layernorm": lambda x, i: 30 * x.sbh + 5 * x.as2b,
    # the MLP keeps only its input (2sbh of its 18sbh)
    "sel-mlp": lambda x, i: 18 * x.sbh + 5 * x.as2b + x.ln_stats,
    # ... and that input is the freed norm output: nothing of the MLP stays
    "sel-layernorm-mlp": lambda x, i: 14 * x.sbh + 5 * x.as2b,
    "full-uniform-1": lambda x, i: 2 * x.sbh,
    "full-block-1": lambda x, i: 2 * x.sbh if i == 0 else _paper(x),
    # a group's input, on the group's first layer
    "full-uniform-2": lambda x, i: 2 * x.sbh if i % 2 == 0 else 0,
    # no recompute: q is a copy, k and v are expanded to all heads: as MHA
    "gqa-none": lambda x, i: _paper(x),
    # the checkpoint keeps the q copy and (through the k, v views) the whole QKV buffer
    "gqa-core_attn": lambda x, i: (30 * x.sbh + 2 * x.s * x.b * (x.h + 2 * x.g * x.d)
                                   + x.ln_stats + SCALAR),
    "swiglu-unfused": lambda x, i: 18 * x.sbh + 10 * x.sbf + 5 * x.as2b + x.ln_stats,
    "swiglu-fused": lambda x, i: 18 * x.sbh + 6 * x.sbf + 5 * x.as2b + x.ln_stats,
    # rotated q and k are new tensors; v, a view, keeps the QKV buffer alive
    "rope-none": lambda x, i: 38 * x.sbh + 5 * x.as2b + x.ln_stats + x.rope_cos_sin,
    "rope-core_attn": lambda x, i: 38 * x.sbh + x.ln_stats + x.rope_cos_sin + SCALAR,
    # RMSNorm (fp32 rstd only), RoPE, GQA, fused SwiGLU, no dropout, core_attn: norm inputs 4,
    # QKV input 2, rotated q 2, rotated k 2·g·d/h, QKV buffer, projection input 2, fc1 input 2
    "llama-like": lambda x, i: (12 * x.sbh + 2 * x.s * x.b * x.g * x.d
                                + 2 * x.s * x.b * (x.h + 2 * x.g * x.d) + 6 * x.sbf
                                + x.ln_stats // 2 + x.rope_cos_sin + SCALAR),
    # 4-byte activations, 1-byte masks
    "fp32-none": lambda x, i: 66 * x.sbh + 9 * x.as2b + x.ln_stats,
    # the fused kernel keeps bf16 probabilities whatever attention_softmax_in_fp32 says
    "fused-softmax": lambda x, i: _paper(x) + SCALAR,
    # fp32 softmax (+2as²b), unfused glu(), unfused RoPE
    "mcore-defaults": lambda x, i: (22 * x.sbh + 10 * x.sbf + 7 * x.as2b + x.ln_stats
                                    + x.rope_cos_sin),
}


def _estimator() -> Callable[..., object]:
    try:
        from mbridge_perf.memory.activations import layer_activation_bytes
    except ImportError as exc:  # the estimator is issue 5's deliverable
        pytest.fail(f"mbridge_perf.memory.activations.layer_activation_bytes: {exc}",
                    pytrace=False)
    return layer_activation_bytes


@pytest.fixture(scope="module")
def measured() -> dict[str, Measurement]:
    return measure_all()


def test_every_case_has_a_closed_form() -> None:
    assert set(CLOSED_FORM) == set(CASES)


@pytest.mark.parametrize("case", list(CASES))
def test_measurement_matches_closed_form(measured: dict[str, Measurement], case: str) -> None:
    cfg = training_config(case)
    x = Dims.of(cfg)
    got = measured[case].layers
    want = [CLOSED_FORM[case](x, i) for i in range(len(got))]
    assert got == want, f"{case}: measured {got} != closed form {want}\n" + "\n".join(
        f"  {w:<16} {what:<36} {n:>8}" for w, what, n in measured[case].storages)


@pytest.mark.parametrize("case", list(CASES))
def test_estimate_within_3_percent(measured: dict[str, Measurement], case: str) -> None:
    estimate = _estimator()
    cfg = training_config(case)
    for i, real in enumerate(measured[case].layers):
        layer = estimate(cfg, layer_index=i)
        est = int(layer.total)  # type: ignore[attr-defined]
        err = f"{(est - real) / real:+.2%}" if real else "measured 0"
        assert abs(est - real) <= TOLERANCE * real, (
            f"{case} layer {i}: estimate {est:,} B vs measured {real:,} B ({err}); estimate "
            f"terms {layer.terms}; measured storages "  # type: ignore[attr-defined]
            f"{[st for st in measured[case].storages if st[0] == f'layer{i}']}")
