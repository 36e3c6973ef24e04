"""Sequence packing and batch / sequence-length consistency (constraint catalog section N).

The `dataset` section is not modelled; its fields are read from `cfg.carried()["dataset"]`.
Offline packing is `enable_offline_packing` with `offline_packing_specs` at the pin, or the older
`packed_sequence_specs` with a positive `packed_sequence_size`.
"""

from __future__ import annotations

from math import lcm
from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import LONG_CONTEXT, Violation, rule

MBS = "train.micro_batch_size"
OFFLINE = "dataset.enable_offline_packing"
IN_BATCH = "dataset.enable_in_batch_packing"
SPECS = "dataset.offline_packing_specs"
DATASET_SEQ = "dataset.seq_length"


def _dataset(c: TrainingConfig) -> dict[str, Any]:
    raw = c.carried().get("dataset")
    return raw if isinstance(raw, dict) else {}


def _specs(ds: dict[str, Any]) -> dict[str, Any]:
    """The offline packing specs, under the pinned or the older name."""
    for key in ("offline_packing_specs", "packed_sequence_specs"):
        if isinstance(ds.get(key), dict):
            return ds[key]
    return {}


def _offline(ds: dict[str, Any]) -> bool:
    legacy = ds.get("packed_sequence_specs")
    size = legacy.get("packed_sequence_size") if isinstance(legacy, dict) else None
    return ds.get("enable_offline_packing") is True or (
        isinstance(size, int) and not isinstance(size, bool) and size > 0)


def _pad_to_max_length(ds: dict[str, Any]) -> bool:
    """Bridge reads it from the dataset config or its ``dataset_kwargs`` (SFT recipes)."""
    kwargs = ds.get("dataset_kwargs")
    return ds.get("pad_to_max_length") is True or (
        isinstance(kwargs, dict) and kwargs.get("pad_to_max_length") is True)


def _in_batch(ds: dict[str, Any]) -> bool:
    return ds.get("enable_in_batch_packing") is True


@rule("packing.modes-exclusive", "error", ref="N1", source="megatron-bridge",
      fields=(OFFLINE, IN_BATCH), skill=LONG_CONTEXT,
      summary="offline and in-batch sequence packing are mutually exclusive")
def _modes_exclusive(c: TrainingConfig, d: Derived) -> Violation | None:
    ds = _dataset(c)
    if not (_offline(ds) and _in_batch(ds)):
        return None
    return Violation("offline packing and enable_in_batch_packing=True both on",
                     f"keep one: {OFFLINE} (pre-packed files) or {IN_BATCH}")


@rule("packing.offline-needs-specs", "error", ref="N1", source="megatron-bridge",
      fields=(OFFLINE, SPECS), skill=LONG_CONTEXT,
      summary="offline packing needs offline_packing_specs, and the specs need the offline flag")
def _offline_needs_specs(c: TrainingConfig, d: Derived) -> Violation | None:
    ds = _dataset(c)
    flag, specs = ds.get("enable_offline_packing") is True, ds.get("offline_packing_specs")
    if flag and specs is None:
        return Violation("enable_offline_packing=True without offline_packing_specs",
                         f"set {SPECS} (packed_sequence_size, …)")
    if specs is not None and not flag:
        return Violation("offline_packing_specs given with enable_offline_packing unset",
                         f"set {OFFLINE} = true, or drop {SPECS}")
    return None


@rule("packing.pad-cu-seqlens-needs-pad", "error", ref="N2", source="megatron-bridge",
      fields=("dataset.offline_packing_specs.pad_cu_seqlens", "dataset.pad_to_max_length"),
      skill=LONG_CONTEXT, summary="pad_cu_seqlens=True needs dataset pad_to_max_length=True")
def _pad_cu_seqlens_needs_pad(c: TrainingConfig, d: Derived) -> Violation | None:
    ds = _dataset(c)
    if _specs(ds).get("pad_cu_seqlens") is not True or _pad_to_max_length(ds):
        return None
    return Violation("pad_cu_seqlens=True with pad_to_max_length unset/false",
                     "set dataset.pad_to_max_length = true")


@rule("packing.offline-mbs1", "error", ref="N3", source="megatron-bridge",
      fields=(MBS, OFFLINE, "dataset.offline_packing_specs.packed_sequence_size"),
      skill=LONG_CONTEXT, summary="offline packed sequences need micro_batch_size = 1")
def _offline_mbs1(c: TrainingConfig, d: Derived) -> Violation | None:
    mbs = c.train.micro_batch_size
    if mbs == 1 or not _offline(_dataset(c)):
        return None
    gbs = c.train.global_batch_size
    size = _specs(_dataset(c)).get("packed_sequence_size")
    scaled = (f", packed_sequence_size = {mbs}·{size} = {mbs * size}"
              if isinstance(size, int) and size > 0 else ", packed_sequence_size × " + str(mbs))
    new_gbs = f"global_batch_size = {gbs}/{mbs} = {gbs // mbs}" if gbs and gbs % mbs == 0 \
        else f"global_batch_size ÷ {mbs}"
    return Violation(f"micro_batch_size={mbs} with offline packed sequences",
                     f"set {MBS} = 1 and keep tokens per step: {new_gbs}{scaled}")


@rule("packing.in-batch-mbs", "error", ref="N4", source="megatron-bridge",
      fields=(MBS, IN_BATCH), skill=LONG_CONTEXT,
      summary="in-batch packing needs micro_batch_size > 1")
def _in_batch_mbs(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.train.micro_batch_size > 1 or not _in_batch(_dataset(c)):
        return None
    return Violation(f"enable_in_batch_packing=True with micro_batch_size="
                     f"{c.train.micro_batch_size}: there is nothing to pack together",
                     f"raise {MBS} (e.g. 4), or set {IN_BATCH} = false")


@rule("packing.seq-padding-multiple", "error", ref="N6", source="megatron-bridge",
      fields=(DATASET_SEQ, "model.context_parallel_size", "model.tensor_model_parallel_size",
              "model.sequence_parallel"), skill=LONG_CONTEXT,
      summary="packed dataset seq_length divisible by lcm(2·CP, TP·CP with SP)")
def _seq_padding_multiple(c: TrainingConfig, d: Derived) -> Violation | None:
    ds = _dataset(c)
    seq = ds.get("seq_length")
    if not (_offline(ds) or _in_batch(ds)) or not isinstance(seq, int) or isinstance(seq, bool):
        return None
    sp = c.model.sequence_parallel and d.tp > 1
    multiple = lcm(2 * d.cp if d.cp > 1 else 1, d.cp * d.tp if sp else 1)
    if seq % multiple == 0:
        return None
    return Violation(f"dataset seq_length={seq} is not a multiple of the CP/SP padding multiple "
                     f"{multiple} (CP={d.cp}, TP={d.tp}, sequence_parallel={sp})",
                     f"set {DATASET_SEQ} (and model.seq_length) to a multiple of {multiple}, "
                     f"e.g. {(seq // multiple + 1) * multiple}")


@rule("dataset.seq-length-match", "error", ref="N8", source="megatron-bridge",
      fields=("model.seq_length", DATASET_SEQ), skill=LONG_CONTEXT,
      summary="model and dataset seq_length must match")
def _seq_length_match(c: TrainingConfig, d: Derived) -> Violation | None:
    model_seq, data_seq = c.model.seq_length, _dataset(c).get("seq_length")
    if model_seq is None or not isinstance(data_seq, int) or data_seq == model_seq:
        return None
    return Violation(f"model.seq_length={model_seq} but dataset.seq_length={data_seq}",
                     f"set both to the same length (e.g. {DATASET_SEQ} = {model_seq})")
