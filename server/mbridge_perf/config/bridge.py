"""Megatron Bridge's YAML dialect → the plain mapping TrainingConfig reads.

``ConfigContainer.to_yaml()`` writes every dataclass as a Hydra-style object (``_target_`` plus
its fields), callables as ``{_target_: torch.nn.functional.silu, _call_: false}``, dtypes as
``{_target_: torch.bfloat16, _call_: false}``, enum members as ``{_target_: ..., _name_: attn,
_args_: [1], _call_: true}``, ``functools.partial`` objects with ``_partial_: true``, and
``null`` for any unset field whatever its type. This module reads that *meaning* — a dtype
object is a precision, an enum member is its name, a callable is its dotted name, ``null`` is
"Megatron's default" — so the rest of the package sees ordinary values. Pure: no imports of
torch or megatron, nothing is instantiated.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from mbridge_perf.config.errors import ConfigError

MARKERS = frozenset({"_target_", "_partial_", "_call_", "_recursive_", "_convert_", "_args_",
                     "_name_"})

# torch dtypes as Megatron-Core's string spellings (moe_router_dtype uses fp32 / fp64; the
# memory estimator reads the same names for optimizer and parameter dtypes).
DTYPES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
    "bfloat16": "bf16", "float64": "fp64", "double": "fp64", "uint8": "uint8",
    "int8": "int8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8",
}

# Model fields whose null has a meaning of its own at Megatron-Core 0.19.2 (our types accept
# None, so _drop_unset keeps them): a null attention backend lets Transformer Engine choose, as
# AttnBackend.auto does.
_NULL_MEANS = {"attention_backend": "auto"}

# Unpadded vocabulary of public Hugging Face tokenizers a dump may name without a vocab_size
# (Bridge reads it from the tokenizer at setup). Nemotron-H, Nemotron Nano v2 and Nemotron 3
# share one 131072-entry tokenizer (config.json vocab_size of each model card).
HF_TOKENIZER_VOCAB = {"nvidia/Nemotron-H-": 131072, "nvidia/NVIDIA-Nemotron-": 131072}

# Sections whose fields we model: a null there means "the default", as it does to Megatron.
_MODELLED = ("model", "train", "optimizer", "ddp", "mixed_precision", "comm_overlap")


def _dtype(target: str) -> str | None:
    head, _, name = target.rpartition(".")
    return DTYPES.get(name) if head == "torch" else None


def read_value(obj: Any) -> Any:
    """One dumped value as plain data: objects lose their markers, callables / dtypes / enum
    members become names."""
    if isinstance(obj, list):
        return [read_value(v) for v in obj]
    if not isinstance(obj, Mapping):
        return obj
    target = obj.get("_target_")
    if isinstance(target, str):
        if "_name_" in obj:  # enum member: CudaGraphModule.attn, AttnBackend.auto, SIGTERM
            return str(obj["_name_"])
        dtype = _dtype(target)
        if dtype is not None:
            return dtype
        if obj.get("_call_") is False or obj.get("_partial_") is True:
            return target  # a function or partial: its dotted name is what it means here
    return {k: read_value(v) for k, v in obj.items() if k not in MARKERS}


def _refuse_out_of_scope(data: Mapping[str, Any]) -> None:
    model = data.get("model")
    target = model.get("_target_") if isinstance(model, Mapping) else None
    if isinstance(target, str) and ".diffusion." in f".{target}.":
        provider = target.rsplit(".", 1)[-1]
        raise ConfigError("model._target_", f"{provider} ({target}) is a diffusion model "
                          "provider; mbridge-perf validates and sizes language models (GPT, "
                          "MLA, hybrid / Mamba, MoE providers) only")


@cache
def _nullable(section: str) -> dict[str, bool]:
    """Per modelled field of a section: does our type accept None?"""
    from mbridge_perf.config.model import TrainingConfig

    ann = TrainingConfig.model_fields[section].annotation
    cls = next(c for c in typing.get_args(ann) or (ann,) if isinstance(c, type)
               and hasattr(c, "model_fields"))
    return {name: _accepts_none(info.annotation) for name, info in cls.model_fields.items()}


def _accepts_none(ann: Any) -> bool:
    if ann is Any or ann is None or ann is type(None):
        return True
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        return any(_accepts_none(a) for a in typing.get_args(ann))
    return False


def _drop_unset(data: dict[str, Any]) -> None:
    """A null where our type has no None is Bridge's "unset": Megatron's default applies."""
    for section in _MODELLED:
        values = data.get(section)
        if not isinstance(values, dict):
            continue
        nullable = _nullable(section)
        for name in [k for k, v in values.items() if v is None]:
            if name in nullable and not nullable[name]:
                del values[name]


def _tokenizer_vocab(tokenizer: Mapping[str, Any]) -> int | None:
    size = tokenizer.get("vocab_size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    name = tokenizer.get("tokenizer_model")
    if tokenizer.get("tokenizer_type") == "HuggingFaceTokenizer" and isinstance(name, str):
        return next((v for k, v in HF_TOKENIZER_VOCAB.items() if name.startswith(k)), None)
    return None


def _model_defaults(data: dict[str, Any]) -> None:
    """Model values Bridge or Megatron-Core fill in at setup when the dump leaves them null:
    the vocabulary from the tokenizer (then padded, as Bridge's setup does), null meanings."""
    model, tokenizer = data.get("model"), data.get("tokenizer")
    if not isinstance(model, dict):
        return
    for name, meaning in _NULL_MEANS.items():
        if name in model and model[name] is None:
            model[name] = meaning
    if not isinstance(tokenizer, Mapping):
        return
    vocab = _tokenizer_vocab(tokenizer)
    if vocab is not None and (model.get("vocab_size") is None or
                              tokenizer.get("use_tokenizer_vocab_size") is True):
        model["vocab_size"] = vocab
        model["should_pad_vocab"] = True


def _world_size(data: dict[str, Any]) -> None:
    """Bridge writes the data-parallel size only into ``comm_overlap`` (set_data_parallel_size);
    the world it came from is DP x TP x PP x CP. A world the user gives wins."""
    overlap, model = data.get("comm_overlap"), data.get("model")
    dp = overlap.get("data_parallel_size") if isinstance(overlap, dict) else None
    cluster = data.get("cluster")
    if isinstance(cluster, dict) and cluster.get("num_gpus") is not None:
        return
    if not isinstance(dp, int) or isinstance(dp, bool) or dp < 1 or not isinstance(model, dict):
        return
    sizes = [model.get(k, 1) for k in ("tensor_model_parallel_size",
                                       "pipeline_model_parallel_size", "context_parallel_size")]
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in sizes):
        return
    data["cluster"] = {**(cluster if isinstance(cluster, dict) else {}),
                       "num_gpus": dp * sizes[0] * sizes[1] * sizes[2]}


def normalise(data: Mapping[str, Any]) -> dict[str, Any]:
    """A merged config mapping, possibly a whole ``config.yaml`` dump, in the plain form
    TrainingConfig validates (raises ConfigError for a model provider out of scope)."""
    _refuse_out_of_scope(data)
    clean = {k: read_value(v) for k, v in data.items() if k not in MARKERS}
    _drop_unset(clean)
    _model_defaults(clean)
    _world_size(clean)
    return clean
