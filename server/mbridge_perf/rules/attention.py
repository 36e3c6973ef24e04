"""Attention backend (project check X4): unfused attention materialises the a·s² score,
softmax and dropout-mask tensors (the 5·a·s/h term of the per-layer activation formula, next to
34 for everything else), which dominates memory at long sequence."""

from __future__ import annotations

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.semantics import attention_backend
from mbridge_perf.rules.catalog import LONG_CONTEXT, Violation, rule

LONG_SEQ = 2048  # below this the score tensors stay small next to the weights


def _unfused_reason(c: TrainingConfig, d: Derived) -> str | None:
    """Why attention runs unfused, or None when a fused / flash kernel is expected."""
    m = c.model
    backend = attention_backend(m)
    if m.transformer_impl == "local":
        return 'transformer_impl="local" (Megatron-Core\'s own unfused attention)'
    if backend in ("unfused", "local"):
        return f'attention_backend="{backend}"'
    if not (d.precision.bf16 or d.precision.fp16):
        return (f'attention_backend="{backend}" in FP32 (Transformer Engine falls back to '
                "unfused attention without bf16 / fp16)")
    return None


@rule("attention.unfused-long-seq", "warning", ref="X4", source="project",
      fields=("model.attention_backend", "model.transformer_impl", "model.seq_length"),
      skill=LONG_CONTEXT,
      summary="unfused attention at long sequence materialises the attention scores")
def _unfused_long_seq(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    s, a, h = m.seq_length, m.num_attention_heads, m.hidden_size
    reason = _unfused_reason(c, d)
    if reason is None or s is None or s < LONG_SEQ:
        return None
    ratio = ""
    if a and h:
        term = 5 * a * s / h
        if term < 34:
            return None
        # scores + softmax (2 bytes each) and dropout mask (1 byte) per head and query-key pair
        gib = 5 * (a / d.tp) * (s / d.cp) * s * c.train.micro_batch_size / 2**30
        ratio = (f"; 5·a·s/h = {term:.0f} vs 34 for the rest of the layer, ≈ {gib:.1f} GiB of "
                 "scores per layer per micro-batch")
    return Violation(f"{reason} at seq_length={s}{ratio}",
                     'use a fused kernel: model.attention_backend="auto" (or "fused" / "flash") '
                     'with model.transformer_impl="transformer_engine" and bf16 / fp16')
