"""Which kind of layer sits where: the decoder's token mixer and MLP per layer, as Megatron-Core
builds them from the model section (hybrid Mamba patterns and their MTP layers,
``moe_layer_freq``, GatedDeltaNet's ``linear_attention_freq``, MLA). Ground floor: the
estimator, the recompute ladder and the resolved view all read the same layer kinds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
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
# PEFT: which linears carry LoRA adapters (Megatron Bridge's LoRA / ModuleMatcher)

LORA_DEFAULT_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
MAX_LORA_DIM = 65_536  # a rank beyond any adapter trained today (LoRA ranks are 4..256)
MAX_LORA_TARGETS = 256
MAX_LORA_TARGET_CHARS = 512


@dataclass(frozen=True)
class LoRASpec:
    """A ``peft:`` section as Megatron Bridge's LoRA reads it: rank ``dim`` adapters on the
    linears ``targets`` name (a module's own name, or a wildcard pattern over its full name),
    or on every linear layer but ``exclude`` when no targets are given."""

    dim: int
    targets: tuple[str, ...]
    exclude: tuple[str, ...] = ()
    share_expert_adapters: bool = True
    experts_shared_outer: bool = False
    normalize_moe: bool = False
    dropout: float = 0.0

    @property
    def all_linears(self) -> bool:
        return not self.targets

    def matches(self, name: str, full_names: tuple[str, ...], *, linear: bool = True) -> bool:
        """Bridge's rule: a target equal to the module's name, or a wildcard pattern matching
        its full name; with no targets, every linear layer whose name no exclude pattern
        matches (``linear``: the module is one of the linear types Bridge walks for that)."""
        if self.targets:
            return any(name == t or _wild(t, full_names) for t in self.targets)
        return linear and not any(name == x or _wild(x, full_names) for x in self.exclude)

    @property
    def indexed(self) -> tuple[str, ...]:
        """Patterns naming layer indices: priced on every layer (Megatron numbers layers per
        pipeline chunk, so such a pattern names a layer of every chunk): an upper bound."""
        return tuple(t for t in (*self.targets, *self.exclude)
                     if "." in t and any(part.isdigit() for part in t.split(".")))


def _wild(pattern: str, full_names: tuple[str, ...]) -> bool:
    """Bridge's wildcard_match ('*' = any text, anchored) of a pattern against a module's full
    names; the layer index in them is tried as every index the pattern spells."""
    if "*" not in pattern and "." not in pattern:
        return False
    rx = _pattern_rx(pattern)
    digits = {part for part in pattern.split(".") if part.isdigit()} or {"0"}
    return any(rx.match(n.replace("{i}", d)) for n in full_names for d in digits)


@lru_cache(maxsize=256)
def _pattern_rx(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + ".*".join(re.escape(p) for p in pattern.split("*")) + "$")


def _short(value: Any) -> str:
    """A value's repr cut to one readable line (errors never echo a huge input)."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def _names(section: Mapping[str, Any], field: str, default: tuple[str, ...]) -> tuple[str, ...]:
    value = section.get(field, default)
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"peft.{field}", f"expected a list of module names, got "
                                           f"{_short(value)}")
    if len(value) > MAX_LORA_TARGETS:
        raise ConfigError(f"peft.{field}", f"{len(value)} entries is beyond any real adapter "
                                           f"set (limit {MAX_LORA_TARGETS}); check the list")
    for v in value:
        if not v or len(v) > MAX_LORA_TARGET_CHARS or not _MODULE_NAME.match(v):
            raise ConfigError(f"peft.{field}", f"{_short(v)} is not a module name or "
                                               "wildcard pattern (letters, digits, '_', '.', '*')")
    return tuple(value)


_MODULE_NAME = re.compile(r"^[A-Za-z0-9_.*]+$")


def _flag(section: Mapping[str, Any], field: str, default: bool) -> bool:
    value = section.get(field, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"peft.{field}", f"expected true or false, got {_short(value)}")
    return value


def lora_spec(section: Any) -> LoRASpec | None:
    """The ``peft:`` section of a config (carried as given, Bridge's LoRA field names), read
    and bounded; None when there is none. ``peft: lora`` stands for Bridge's LoRA defaults."""
    if section is None:
        return None
    if isinstance(section, str):
        if section.strip().lower() not in ("lora", "vlm_lora"):
            raise ConfigError("peft", f"{_short(section)} is not a PEFT method priced here; "
                                      "give a LoRA section (dim, target_modules, ...) or lora")
        section = {}
    if not isinstance(section, Mapping):
        raise ConfigError("peft", f"expected a mapping of LoRA fields (dim, target_modules, "
                                  f"...), got {type(section).__name__}")
    dim = section.get("dim", section.get("rank", 32))
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim <= MAX_LORA_DIM:
        raise ConfigError("peft.dim", f"the LoRA rank must be a whole number in 1.."
                                      f"{MAX_LORA_DIM}, got {_short(dim)}")
    targets = _names(section, "target_modules", LORA_DEFAULT_TARGETS)
    exclude = _names(section, "exclude_modules", ())
    if targets and exclude:
        raise ConfigError("peft.exclude_modules", "give target_modules or exclude_modules, not "
                                                  "both (Bridge's LoRA asserts one is empty)")
    if section.get("canonical_mapping"):
        raise ConfigError("peft.canonical_mapping", "a canonical mapping is set: give the "
                                                    "adapted modules as target_modules")
    dropout = section.get("dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not (
            0 <= dropout < 1):
        raise ConfigError("peft.dropout", f"expected a probability in [0, 1), got "
                                          f"{_short(dropout)}")
    return LoRASpec(dim=dim, targets=targets, exclude=exclude,
                    share_expert_adapters=_flag(section, "share_expert_adapters", True),
                    experts_shared_outer=_flag(section, "experts_shared_outer_loras", False),
                    normalize_moe=_flag(section, "normalize_moe_lora", False),
                    dropout=float(dropout))


# ---------------------------------------------------------------------------------------------
# pieces
