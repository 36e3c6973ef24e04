"""Throughput cost of a memory rung: the skills' measured figure where the run matches, else
the step-time model's predicted change (before and after the rung, on the config's GPU and
batch), else recomputed FLOPs / step FLOPs - each labelled with its basis.

Why FLOPs: recompute repeats forward work, so its cost is bounded by the forward FLOPs it
repeats over the step's (forward + 2x backward) FLOPs; memory-bound modules (norms, activation
functions) repeat almost no FLOPs but do cost kernel time, which only a measurement shows.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import ModelSection, TrainingConfig
from mbridge_perf.memory.params import layer_kinds, layer_params
from mbridge_perf.steptime import load_calibration, predict_step_time_s

RECOMPUTE_CARD = ("Megatron Bridge perf-activation-recompute card, Llama3 70B SFT 32x H100 FP8-CS "
                  "(skills/nemo-mbridge-perf-activation-recompute/card.yaml, "
                  "llama3-70b-sft-recompute-modules)")
MOONLIGHT = ("Megatron Bridge Moonlight 16B recompute ladder, 8x H100 TP2 EP8 BF16 "
             "(reference memory-estimation.md §10, item 3)")
OFFLOAD_CARD = ("Megatron Bridge perf-cpu-offloading card, Qwen3-30B-A3B TP2 PP2 EP4 16x H100 "
                "(optimizer_offload_fraction 0.25-1.0; memory-estimation.md §4)")


class ThroughputCost(BaseModel):
    """What a rung costs in speed."""

    pct: float | None = Field(description="percent slower (step time up / TFLOP/s down); "
                                          "None when not known")
    basis: Literal["measured", "model", "estimate", "none"] = Field(
        description="measured: the skills' run; model: estimate_step_time before and after; "
                    "estimate: recomputed FLOPs / step FLOPs (no GPU or batch to time a step)")
    text: str = Field(description="the figure in words, with what it was measured on")
    source: str = Field(description="where the figure comes from")


FREE = ThroughputCost(pct=0.0, basis="measured", text="none: the allocator setting changes how "
                      "memory is carved, not compute (Llama3 70B SFT with it: ~704 TFLOP/s, "
                      "-0.8 % vs golden)", source=RECOMPUTE_CARD)


def _llama70b(m: ModelSection) -> bool:
    return m.hidden_size == 8192 and m.ffn_hidden_size == 28672 and not m.num_moe_experts


def _moonlight(m: ModelSection) -> bool:
    return bool(m.multi_latent_attention and m.num_moe_experts == 64 and m.hidden_size == 2048)


def measured_module_cost(m: ModelSection, module: str) -> ThroughputCost | None:
    """The skills' measured cost of adding ``module`` on the model it was measured on."""
    if _llama70b(m):
        if module == "mlp":
            return ThroughputCost(pct=16.4, basis="measured", text="about 16 % TFLOP/s "
                                  "(704 -> 593.6) for about 3 GB on Llama3 70B (FFN 28672)",
                                  source=RECOMPUTE_CARD)
        if module == "layernorm":
            return ThroughputCost(pct=0.3, basis="measured", text="about 0 % (702 vs 704 "
                                  "TFLOP/s on Llama3 70B)", source=RECOMPUTE_CARD)
    if _moonlight(m):
        pct = {"moe_act": 1.99, "mla_up_proj": 5.19, "core_attn": 3.85}.get(module)
        if pct is not None:
            return ThroughputCost(pct=pct, basis="measured", text=f"+{pct} % step time on "
                                  "Moonlight 16B", source=MOONLIGHT)
    if module == "core_attn":
        return ThroughputCost(pct=3.85, basis="measured", text="+3.85 % step time for "
                              "-0.01 % memory under fused attention (Moonlight 16B)",
                              source=MOONLIGHT)
    return None


def measured_saving(m: ModelSection, module: str) -> tuple[float, str] | None:
    """The skills' measured peak saving (GiB) of adding ``module`` on the model it was measured
    on, with its source, where the estimator is known to disagree (issue 11)."""
    if _llama70b(m) and module == "mlp":
        return 3.17, ("Llama3 70B SFT FP8-CS 32x H100, recompute_modules [core_attn] -> [mlp]: "
                      "59 -> 55.6 GB (" + RECOMPUTE_CARD + ")")
    return None


def _layer_flops(m: ModelSection) -> list[tuple[int, dict[str, float]]]:
    """Forward FLOPs per token of each kind of layer, by recompute label, with its count
    (one parameter count per kind: layers of a kind are alike)."""
    seq = int(m.seq_length or 0)
    heads = int(m.num_attention_heads or 1)
    kinds = layer_kinds(m)
    first: dict[object, int] = {}
    counts: dict[object, int] = {}
    for i, kind in enumerate(kinds):
        first.setdefault(kind, i)
        counts[kind] = counts.get(kind, 0) + 1
    out = []
    for kind, i in first.items():
        p = layer_params(m, i)
        f: dict[str, float] = {"attn_linear": 2.0 * p.attention, "norms": 0.0}
        if kind.mixer in ("attention", "mla"):
            d = (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim) / 2 if \
                kind.mixer == "mla" else int(m.kv_channels or (m.hidden_size or 0) // heads)
            f["core_attn"] = 2.0 * seq * heads * d  # causal: half of 4·s·a·d
        if kind.mixer == "mla":
            q_in = m.q_lora_rank or m.hidden_size or 0
            f["mla_up_proj"] = 2.0 * heads * (q_in * (m.qk_head_dim + m.qk_pos_emb_head_dim)
                                             + m.kv_lora_rank * (m.qk_head_dim + m.v_head_dim))
        if kind.mlp == "dense":
            f["mlp"] = 2.0 * p.dense_mlp
        elif kind.mlp == "moe":
            f["moe"] = 2.0 * (m.moe_router_topk * p.routed_per_expert + p.shared_experts)
            f["shared_experts"] = 2.0 * p.shared_experts
        out.append((counts[kind], f))
    return out


_NOT_IN_FWD = ("mla_up_proj", "shared_experts")  # parts of attn_linear / moe, not extra


def estimated_cost(cfg: TrainingConfig, modules: list[str], *, full_layers: float = 0.0,
                   note: str = "") -> ThroughputCost:
    """Recomputed forward FLOPs of ``modules`` (selective) or of ``full_layers`` of every
    chunk's layers (fraction 0..1, full recompute) over the step's FLOPs (3x forward)."""
    m = cfg.model
    layers = _layer_flops(m)
    fwd = sum(n * sum(v for k, v in f.items() if k not in _NOT_IN_FWD) for n, f in layers)
    if full_layers:
        redo = full_layers * fwd
    else:
        redo = sum(n * f.get(mod, 0.0) for n, f in layers for mod in modules)
    fwd += 2.0 * (m.hidden_size or 0) * (m.vocab_size or 0)
    pct = 100.0 * redo / (3.0 * fwd) if fwd else 0.0
    what = "full-layer" if full_layers else "+".join(modules)
    text = (f"~{pct:.1f} % more compute (estimate: {what} recompute FLOPs / step FLOPs)"
            + (f"; {note}" if note else ""))
    return ThroughputCost(pct=round(pct, 1), basis="estimate", text=text,
                          source="mbridge-perf FLOPs model (2 x parameters per token, causal "
                                 "attention 2·s·a·d)")


def module_cost(cfg: TrainingConfig, module: str) -> ThroughputCost:
    """Measured where the skills have the run, else the FLOPs estimate."""
    measured = measured_module_cost(cfg.model, module)
    if measured is not None:
        return measured
    note = {"layernorm": "memory-bound: costs kernel time FLOPs do not show",
            "moe_act": "memory-bound activation function: measured +1.99 % on Moonlight 16B",
            "moe": "also repeats the token dispatch / combine all-to-all",
            "mlp": "measured about 16 % TFLOP/s on Llama3 70B"}.get(module, "")
    return estimated_cost(cfg, [module], note=note)


def model_cost(before: TrainingConfig, after: TrainingConfig, fallback: ThroughputCost,
               gpu: str | None = None) -> ThroughputCost:
    """The step-time model's predicted change from ``before`` to ``after``; ``fallback`` (the
    FLOPs estimate) when the config lacks what a step time needs (GPU, GPU count, batch)."""
    try:
        a = predict_step_time_s(before, gpu=gpu)
        b = predict_step_time_s(after, gpu=gpu)
    except (ConfigError, ValueError, ZeroDivisionError):
        return fallback
    pct = (b / a - 1.0) * 100.0
    return ThroughputCost(
        pct=round(pct, 1), basis="model",
        text=f"~{pct:+.1f} % step time predicted ({a:.2f} -> {b:.2f} s per step; "
             f"FLOPs alone: {fallback.pct if fallback.pct is not None else '?'} %)",
        source=f"estimate_step_time (steptime/; calibration: {load_calibration().source[:80]})")
