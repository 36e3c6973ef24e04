"""Where every piece of the model lives: transformer layers, embedding, output layer + loss and
MTP layers on each (pipeline rank, virtual chunk).

Why a separate step: memory is per GPU, and a pipeline stage owns whatever its chunks own. The
placement follows Megatron-Core: virtual stage ``v * PP + r`` is chunk ``v`` of rank ``r`` and
layers are dealt to virtual stages in that order (``get_transformer_layer_offset``); without a
layout the embedding sits on the first chunk of rank 0, the output layer, loss and MTP layers on
the last chunk of the last rank; a ``pipeline_model_parallel_layout`` says it explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from mbridge_perf.config.derived import layers_per_chunk, parse_pipeline_layout
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import ModelSection


@dataclass(frozen=True, slots=True)
class Chunk:
    """One virtual pipeline stage: a model chunk on one pipeline rank."""

    rank: int
    chunk: int
    first_layer: int
    """Global index of the first transformer layer here (layers are contiguous)."""
    num_layers: int
    embedding: bool
    loss: bool
    """Final norm, output layer and loss (the "post-process" part)."""
    mtp: int
    """Multi-token-prediction layers here."""

    @property
    def layers(self) -> range:
        return range(self.first_layer, self.first_layer + self.num_layers)


Placement = tuple[tuple[Chunk, ...], ...]
"""Chunks per pipeline rank, in chunk order."""


def _freeze(value: Any) -> Any:
    """Hashable for the cache; anything but text or lists of layer names is refused here
    (the parse below names the field)."""
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if value is None or isinstance(value, str | int):
        return value
    raise ConfigError("model.pipeline_model_parallel_layout",
                      f"{value!r} is not a layer name; give one list of layer names per stage "
                      "or the string form, e.g. 'Et|tt|tL'")


def placement(m: ModelSection) -> Placement:
    """Chunks of every pipeline rank; ConfigError when the layers cannot be split that way."""
    layout = m.pipeline_model_parallel_layout
    return _placement(
        m.pipeline_model_parallel_size, m.virtual_pipeline_model_parallel_size or 1,
        _freeze(layout), m.num_layers, m.num_layers_in_first_pipeline_stage,
        m.num_layers_in_last_pipeline_stage, m.account_for_embedding_in_pipeline_split,
        m.account_for_loss_in_pipeline_split, int(m.mtp_num_layers or 0))


@lru_cache(maxsize=256)
def _placement(pp: int, vpp: int, layout: Any, num_layers: int | None, first: int | None,
               last: int | None, acct_emb: bool, acct_loss: bool, mtp: int) -> Placement:
    if layout is not None:
        return _from_layout(pp, layout, num_layers, mtp)
    if num_layers is None:
        raise ConfigError("model.num_layers", "required to place layers on pipeline stages; "
                                              "set the model's number of transformer layers")
    probe = ModelSection.model_construct(
        num_layers=num_layers, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
        account_for_embedding_in_pipeline_split=acct_emb,
        account_for_loss_in_pipeline_split=acct_loss, pipeline_model_parallel_layout=None)
    chunks = layers_per_chunk(probe)
    if chunks is None:
        split = f"{num_layers} layers over PP={pp}" + (f" x VPP={vpp}" if vpp > 1 else "")
        if first is not None or last is not None:
            split += f" (first stage {first}, last stage {last})"
        raise ConfigError("model.pipeline_model_parallel_size",
                          f"{split} do not split evenly; choose sizes whose layer counts divide "
                          "(or set num_layers_in_first/last_pipeline_stage)")
    counts = [[chunks[r][v] for r in range(pp)] for v in range(vpp)]
    return _assemble(pp, vpp, counts,
                     lambda r, v: (r == 0 and v == 0, r == pp - 1 and v == vpp - 1,
                                   mtp if (r == pp - 1 and v == vpp - 1) else 0))


def _from_layout(pp: int, layout: Any, num_layers: int | None, mtp: int) -> Placement:
    text = layout if isinstance(layout, str) else [list(s) for s in layout]
    try:
        stages = parse_pipeline_layout(text)
    except ValueError as exc:
        raise ConfigError("model.pipeline_model_parallel_layout", str(exc)) from None
    field = "model.pipeline_model_parallel_layout"
    if len(stages) % pp:
        raise ConfigError(field, f"{len(stages)} virtual stages do not divide over "
                                 f"PP={pp}; give PP x VPP stages separated by '|'")
    vpp = len(stages) // pp
    total = sum(s.count("t") for s in stages)
    if num_layers is not None and total != num_layers:
        raise ConfigError(field, f"places {total} transformer layers but model.num_layers="
                                 f"{num_layers}; make the 't' count match")
    placed_mtp = sum(s.count("m") for s in stages)
    if placed_mtp != mtp:
        raise ConfigError(field, f"places {placed_mtp} MTP layers but model.mtp_num_layers="
                                 f"{mtp}; add or remove 'm' entries")
    counts = [[stages[v * pp + r].count("t") for r in range(pp)] for v in range(vpp)]

    def where(r: int, v: int) -> tuple[bool, bool, int]:
        s = stages[v * pp + r]
        return "E" in s, "L" in s, s.count("m")

    return _assemble(pp, vpp, counts, where)


def _assemble(pp: int, vpp: int, counts: list[list[int]], where: Any) -> Placement:
    """Deal layers to virtual stages in schedule order (v * PP + r)."""
    out: list[list[Chunk]] = [[] for _ in range(pp)]
    offset = 0
    for v in range(vpp):
        for r in range(pp):
            n = counts[v][r]
            emb, loss, mtp = where(r, v)
            out[r].append(Chunk(rank=r, chunk=v, first_layer=offset, num_layers=n,
                                embedding=emb, loss=loss, mtp=mtp))
            offset += n
    return tuple(tuple(c) for c in out)


def stage_layers(chunks: tuple[Chunk, ...]) -> list[int]:
    """Transformer layer indices a pipeline rank holds, in chunk order."""
    return [i for c in chunks for i in c.layers]
