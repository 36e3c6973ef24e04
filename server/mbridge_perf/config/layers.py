"""Which kind of layer sits where: the decoder's token mixer and MLP per layer, as Megatron-Core
builds them from the model section (hybrid Mamba patterns and their MTP layers,
``moe_layer_freq``, GatedDeltaNet's ``linear_attention_freq``, MLA). Ground floor: the
estimator, the recompute ladder and the resolved view all read the same layer kinds.
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
MTP_SEPARATOR = "/"  # Megatron-Core's unified pattern: "<decoder>/<mtp depth 1>/<mtp depth 2>"
MAX_PATTERN = 100_000  # symbols in a hybrid pattern (a bound, far above any real model)


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


def _hybrid_text(model: ModelSection) -> str | None:
    pattern = (opt_field(model, "hybrid_override_pattern")
               or opt_field(model, "hybrid_layer_pattern"))
    if pattern is None:
        return None
    if not isinstance(pattern, str):
        raise ValueError(f"model.hybrid_layer_pattern must be a string of layer symbols, got "
                         f"{type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"model.hybrid_layer_pattern has {len(pattern)} symbols; more than "
                         f"{MAX_PATTERN} is beyond any real model")
    return pattern


def _check_symbols(pattern: str, field: str, what: str) -> None:
    bad = sorted(set(pattern) - set(HYBRID_SYMBOLS))
    if bad:
        pipe = ("; '|' stage boundaries are not modelled: give the split with "
                "pipeline_model_parallel_layout" if "|" in bad else "")
        raise ValueError(f"model.{field} has symbols {bad} in its {what} that are not "
                         f"modelled (known: {sorted(HYBRID_SYMBOLS)}{pipe})")


def hybrid_pattern(model: ModelSection) -> str | None:
    """The hybrid Mamba decoder's layer pattern, under either Bridge spelling: the part before
    Megatron-Core's MTP separator '/' (what follows it is the MTP layers, see ``hybrid_mtp``)."""
    text = _hybrid_text(model)
    if text is None:
        return None
    main = text.split(MTP_SEPARATOR)[0]
    _check_symbols(main, "hybrid_layer_pattern", "decoder part")
    return main


@dataclass(frozen=True)
class HybridMTP:
    """The MTP layers of a hybrid model as Megatron-Core builds them: one MTP layer per depth
    is enorm, hnorm, eh_proj, a stack of hybrid layers spelled by ``pattern`` and a final norm;
    ``physical`` layers hold parameters (1 when the one layer is repeated), ``depths`` run."""

    pattern: str
    depths: int
    physical: int

    @property
    def kinds(self) -> tuple[LayerKind, ...]:
        return tuple(LayerKind(*HYBRID_SYMBOLS[c]) for c in self.pattern)


def hybrid_mtp(model: ModelSection) -> HybridMTP | None:
    """MTP of a hybrid model, None when it has none. Megatron Bridge's HybridModelProvider
    appends ``mtp_hybrid_override_pattern`` to the decoder pattern after '/', once per MTP
    layer (once in all with ``mtp_use_repeated_layer``); a pattern may also carry the MTP parts
    itself ("<decoder>/<mtp>/<mtp>", every part the same). Megatron-Core builds MTP only from
    such a part, runs ``mtp_num_layers`` depths, and with ``mtp_use_repeated_layer`` holds one
    layer's parameters."""
    text = _hybrid_text(model)
    if text is None:
        return None
    depths = int(model.mtp_num_layers or 0)
    repeated = opt_field(model, "mtp_use_repeated_layer", False) is True
    override = opt_field(model, "mtp_hybrid_override_pattern")
    if override is not None and not isinstance(override, str):
        raise ValueError(f"model.mtp_hybrid_override_pattern must be a string of layer symbols, "
                         f"got {type(override).__name__}")
    if override:  # Bridge rebuilds the MTP parts from it (the pattern's own are replaced)
        if len(override) > MAX_PATTERN:
            raise ValueError(f"model.mtp_hybrid_override_pattern has {len(override)} symbols; "
                             f"more than {MAX_PATTERN} is beyond any real model")
        _check_symbols(override, "mtp_hybrid_override_pattern", "MTP layer")
        if not depths:
            return None
        return HybridMTP(override, depths, 1 if repeated else depths)
    parts = [p for p in text.split(MTP_SEPARATOR)[1:]]
    if not parts or all(p == "" for p in parts):
        return None
    if len(set(parts)) > 1:
        raise ValueError(f"model.hybrid_layer_pattern has MTP parts {sorted(set(parts))} after "
                         "'/'; Megatron-Core needs every MTP depth to spell the same layers")
    _check_symbols(parts[0], "hybrid_layer_pattern", "MTP part")
    if depths != len(parts) and not (repeated and depths):
        raise ValueError(f"model.mtp_num_layers is {model.mtp_num_layers} but the hybrid "
                         f"pattern has {len(parts)} MTP part(s) after '/'; set "
                         f"model.mtp_num_layers={len(parts)} (Megatron Bridge infers it from the "
                         "pattern)")
    return HybridMTP(parts[0], depths, 1 if repeated else len(parts))


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
