"""Which kind of layer sits where: the decoder's token mixer and MLP per layer, as Megatron-Core
builds them from the model section (hybrid Mamba patterns, ``moe_layer_freq``, GatedDeltaNet's
``linear_attention_freq``, MLA). Ground floor: the estimator, the recompute ladder and the
resolved view all read the same layer kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import ModelSection

Mixer = Literal["attention", "mla", "gdn", "mamba", "none"]
MLPKind = Literal["dense", "moe", "none"]

# Hybrid-pattern symbols (Megatron-Core `Symbols`): Mamba, attention, dense MLP, MoE.
HYBRID_SYMBOLS = {"M": ("mamba", "none"), "*": ("attention", "none"), "-": ("none", "dense"),
                  "E": ("none", "moe")}


@dataclass(frozen=True)
class LayerKind:
    """What one decoder layer holds: its token mixer and its MLP."""

    mixer: Mixer
    mlp: MLPKind


def as_model(model: ModelSection | Mapping[str, Any]) -> ModelSection:
    """Accept a ModelSection or a plain dict of model-section fields (e.g. a preset)."""
    if isinstance(model, ModelSection):
        return model
    return ModelSection.model_validate(dict(model))


def opt_field(model: ModelSection, name: str, default: Any = None) -> Any:
    """A field that may be modelled or carried as an extra (Megatron-Core names)."""
    value = getattr(model, name, None)
    if value is None:
        value = (model.__pydantic_extra__ or {}).get(name)
    return default if value is None else value


def opt_int(model: ModelSection, name: str, default: Any) -> Any:
    """A carried whole-number field (Megatron-Core names such as mamba_head_dim): carried
    fields are not typed on load, so a list or a word here is reported naming the field."""
    value = opt_field(model, name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.{name}", f"expected a whole number >= 1, got {value!r}")
    return value


def need_field(model: ModelSection, name: str) -> Any:
    value = opt_field(model, name)
    if value is None:
        raise ValueError(f"model.{name} is required to count parameters")
    return value


def hybrid_pattern(model: ModelSection) -> str | None:
    """The hybrid Mamba layer pattern, under either Bridge spelling."""
    pattern = (opt_field(model, "hybrid_override_pattern")
               or opt_field(model, "hybrid_layer_pattern"))
    if pattern is None:
        return None
    pattern = str(pattern)
    bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
    if bad:
        raise ValueError(f"model.hybrid_override_pattern has symbols {bad} that are not "
                         f"modelled (known: {sorted(HYBRID_SYMBOLS)}; MTP parts after '/' "
                         "are not supported)")
    return pattern


def num_layers(model: ModelSection) -> int:
    pattern = hybrid_pattern(model)
    if pattern is not None:
        if model.num_layers is not None and model.num_layers != len(pattern):
            raise ValueError(f"model.num_layers={model.num_layers} but the hybrid pattern has "
                             f"{len(pattern)} layers")
        return len(pattern)
    return int(need_field(model, "num_layers"))


def _pattern(freq: Any, n: int, name: str, *, int_rule: Any) -> list[int]:
    if isinstance(freq, bool):
        raise ValueError(f"model.{name} must be an int or a list of 0/1, got {freq!r}")
    if isinstance(freq, int):
        if freq < 1:
            raise ValueError(f"model.{name} must be >= 1, got {freq}")
        return [int_rule(i, freq) for i in range(n)]
    if isinstance(freq, list | tuple):
        if len(freq) != n:
            raise ValueError(f"model.{name} has {len(freq)} entries, expected {n} (num_layers)")
        return [1 if v else 0 for v in freq]
    raise ValueError(f"model.{name} must be an int or a list of 0/1, got {freq!r}")


def moe_pattern(model: ModelSection) -> list[int]:
    """1 where a decoder layer is MoE: int N = every Nth layer from layer 0; list = per layer."""
    n = num_layers(model)
    if not model.num_moe_experts:
        return [0] * n
    return _pattern(model.moe_layer_freq, n, "moe_layer_freq",
                    int_rule=lambda i, k: 1 if i % k == 0 else 0)


def linear_attention_pattern(model: ModelSection) -> list[int]:
    """1 where a layer uses GatedDeltaNet: int N = every Nth layer (1-based) is full attention."""
    n = num_layers(model)
    variant = model.experimental_attention_variant
    if variant is None:
        return [0] * n
    if variant != "gated_delta_net":
        raise ValueError(f"model.experimental_attention_variant={variant!r} is not modelled; "
                         "supported: gated_delta_net")
    return _pattern(need_field(model, "linear_attention_freq"), n, "linear_attention_freq",
                    int_rule=lambda i, k: 0 if (i + 1) % k == 0 else 1)


def layer_kinds(model: ModelSection | Mapping[str, Any]) -> tuple[LayerKind, ...]:
    """Mixer and MLP kind of every decoder layer, in order."""
    m = as_model(model)
    pattern = hybrid_pattern(m)
    if pattern is not None:
        return tuple(LayerKind(*HYBRID_SYMBOLS[c]) for c in pattern)
    attn: Mixer = "mla" if m.multi_latent_attention else "attention"
    gdn = linear_attention_pattern(m)
    moe = moe_pattern(m)
    return tuple(LayerKind("gdn" if g else attn, "moe" if e else "dense")
                 for g, e in zip(gdn, moe, strict=True))


# ---------------------------------------------------------------------------------------------
# pieces
