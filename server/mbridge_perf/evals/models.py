"""The model an answer is about, read from the names it uses ("Qwen3 235B", "DeepSeek-V3").

Why: naming a model states its architecture. "mla_up_proj" in a Qwen3 235B config is refused
by Megatron-Core (Qwen3 has no multi-latent attention) whether or not the answer also writes
``multi_latent_attention``; the grader can only see that when the model's own fields are part
of the config it validates. The fields come from the project's presets (presets.yaml), the
same facts every tool uses.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from mbridge_perf.evals.text import Unit

# preset name -> how answers write the model (over normalised, lower-case text)
_NAMES: dict[str, re.Pattern[str]] = {name: re.compile(rx) for name, rx in {
    "deepseek-v3": r"\bdeep ?seek[- ]?v3\b|\bdsv3\b|\bdeepseek[- ]v3",
    "qwen3-235b-a22b": r"\bqwen ?3[- ]?(?:moe[- ])?235b",
    "qwen3-30b-a3b": r"\bqwen ?3[- ]?(?:moe[- ])?30b",
    "qwen3-next-80b-a3b": r"\bqwen ?3[- ]?next",
    "llama3-70b": r"\bllama ?3(?:\.\d)?[- ]?70b",
    "llama3-8b": r"\bllama ?3(?:\.\d)?[- ]?8b",
    "llama3-405b": r"\bllama ?3(?:\.\d)?[- ]?405b",
    "mixtral-8x7b": r"\bmixtral",
    "moonlight-16b-a3b": r"\bmoonlight",
    "gpt-oss-120b": r"\bgpt[- ]?oss",
}.items()}
MAX_UNITS = 400
# The preset facts naming a model states. The layer count is not one: a recipe splits uneven
# layer counts over stages (first / last stage sizes) the preset does not carry.
_STATED = frozenset({"multi_latent_attention", "num_moe_experts", "moe_grouped_gemm",
                     "moe_shared_expert_intermediate_size", "num_attention_heads",
                     "num_query_groups", "hidden_size", "moe_router_topk"})


def named_model(units: list[Unit]) -> str | None:
    """The preset the answer names most often (the first named on a tie); None when it names
    none. A name in quoted output still counts: the log is of the same model."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    for u in units[:MAX_UNITS]:
        for name, rx in _NAMES.items():
            n = sum(not _reference(u.norm, m.start()) for m in rx.finditer(u.norm))
            if n:
                counts[name] += n
                first.setdefault(name, u.index)
    if not counts:
        return None
    return max(counts, key=lambda k: (counts[k], -first[k]))


# A measured figure cited from another model ("≈ 16 % on Llama3 70B", "published for
# DeepSeek-V3", "the Llama3 70B numbers"): the source of a number, not the model at hand.
_CITED = re.compile(r"(?:measured|published|reported|tracked|reference|figures?|numbers?|results?"
                    r"|\d ?(?:%|gb|gib|tflop\S*|ms|s)) (?:on|for|from|with|in)(?: the)? $")


def _reference(norm: str, at: int) -> bool:
    """Whether the model name at ``at`` cites another model's measurement: inside parentheses,
    or right after "measured on", "<figure> on", "published for"."""
    before = norm[max(0, at - 60):at]
    return before.rfind("(") > before.rfind(")") or _CITED.search(before) is not None


def model_fields(name: str) -> tuple[dict[str, Any], frozenset[str]]:
    """``model.X`` -> value for a preset's architecture, plus grouped GEMM for an MoE (every
    Bridge MoE recipe sets it); and the keys of those the name states (see _STATED)."""
    from mbridge_perf.config.presets import get_preset

    # a preset leaves out what the model does not have: no MLA, no experts
    fields = {"model.multi_latent_attention": False, "model.num_moe_experts": None,
              **{f"model.{k}": v for k, v in get_preset(name).model.items()}}
    if fields.get("model.num_moe_experts"):
        fields["model.moe_grouped_gemm"] = True
    return fields, frozenset(k for k in fields if k.removeprefix("model.") in _STATED)
