"""GPU catalog (gpus.yaml): memory, NVLink domain and peak BF16 per GPU kind.

Why a lookup that forgives spelling: the GPU name arrives from users ("h100", "H100_80GB"),
from `nvidia-smi` and from `torch.cuda.get_device_name()` ("NVIDIA H100 80GB HBM3"). Names are
compared case-insensitively with separators, a leading "NVIDIA", "HGX"/"DGX" and the memory
technology (HBM3, HBM3e, ...) ignored.

A bare "a100" is refused: the 40 GB and 80 GB parts differ by 2x in memory, and a memory
estimate against the wrong one is worse than a question. The error lists both names.

A GPU people name but whose memory capacity has no public figure (an entry with
``memory_gb: null``, e.g. the R100 of Megatron Bridge's early Rubin recipes) is refused the same
way, in one line that names it: a guessed capacity would make every fit verdict a guess.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, computed_field

GPUS_FILE = "gpus.yaml"
GIB = 2**30

_DROP = re.compile(r"nvidia|hbm\d*e?|^(hgx|dgx)")


class GPUSpec(BaseModel):
    """One GPU kind. Memory in decimal GB as marketed and in GiB as torch reports it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    aliases: tuple[str, ...] = ()
    architecture: Literal["ampere", "hopper", "blackwell", "rubin"]
    sm: int | None = Field(None, ge=10, le=200)
    """Compute capability as an integer; None where no public figure was found."""
    memory_gb: float = Field(gt=0)
    usable_gib: float | None = Field(None, gt=0)
    usable_source: str | None = None
    nvlink_domain: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    bf16_dense_tflops: float | None = Field(None, gt=0)
    """Peak dense BF16 TFLOP/s; None where no public dense figure was found."""
    fp8_dense_tflops: float | None = Field(None, gt=0)
    """Peak dense FP8 TFLOP/s; None where the GPU has no FP8 or no public dense figure."""
    fp4_dense_tflops: float | None = Field(None, gt=0)
    """Peak dense FP4 (NVFP4) TFLOP/s; None where none is published."""
    hbm_tb_s: float | None = Field(None, gt=0)
    """HBM bandwidth, TB/s (decimal)."""
    nvlink_gb_s: float | None = Field(None, gt=0)
    """NVLink bandwidth per GPU in one direction, GB/s (half NVIDIA's bidirectional figure)."""
    network_gb_s: float | None = Field(None, gt=0)
    """Typical scale-out NIC bandwidth per GPU, GB/s; None where not published."""
    perf_source: str | None = None
    """Where the step-time fields above come from."""
    source: str
    notes: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def memory_gib(self) -> float:
        """The marketed figure converted literally (GB -> GiB)."""
        return round(self.memory_gb * 1e9 / GIB, 2)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def sm_version(self) -> str | None:
        return None if self.sm is None else f"sm_{self.sm}"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def capacity_gib(self) -> float:
        """What a memory estimate compares against: the torch-reported total where known,
        else the literal conversion of the marketed figure (the smaller, safer number)."""
        return self.usable_gib if self.usable_gib is not None else self.memory_gib


def normalize(name: str) -> str:
    """Spelling-insensitive key: lower case, letters and digits only, vendor and memory-type
    words dropped ("NVIDIA H100 80GB HBM3" -> "h10080gb")."""
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    previous = None
    while previous != key:
        previous, key = key, _DROP.sub("", key)
    return key


class UnpublishedGPU(BaseModel):
    """A GPU name in use (recipes, launch scripts) whose memory capacity has no public figure."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    family: str
    aliases: tuple[str, ...] = ()
    memory_gb: None = None
    source: str
    notes: str | None = None


@cache
def _catalog() -> tuple[dict[str, GPUSpec], dict[str, tuple[str, ...]],
                        dict[str, UnpublishedGPU]]:
    """(specs by canonical name, lookup key -> canonical names that answer to it, names with
    no public capacity by lookup key)."""
    raw = yaml.safe_load(Path(__file__).with_name(GPUS_FILE).read_text("utf-8")) or {}
    specs: dict[str, GPUSpec] = {}
    unpublished: dict[str, UnpublishedGPU] = {}
    for name, body in raw.items():
        if body.get("memory_gb") is None:
            gpu = UnpublishedGPU(name=str(name), **body)
            for spelling in {gpu.name, gpu.family, *gpu.aliases}:
                unpublished[normalize(spelling)] = gpu
        else:
            specs[str(name)] = GPUSpec(name=str(name), **body)
    keys: dict[str, set[str]] = {}
    for spec in specs.values():
        memory = f"{spec.memory_gb:g}gb"
        spellings = {spec.name, spec.family, spec.family + memory, *spec.aliases}
        for spelling in spellings:
            keys.setdefault(normalize(spelling), set()).add(spec.name)
    return specs, {k: tuple(sorted(v)) for k, v in keys.items()}, unpublished


def list_gpus() -> list[GPUSpec]:
    """Every GPU kind in the catalog with a known capacity, in file order."""
    return list(_catalog()[0].values())


def lookup_gpu(name: str) -> GPUSpec:
    """The GPU kind a name refers to; ValueError (one line) listing the choices when unknown or
    ambiguous, or naming the GPU when no public memory capacity is known for it."""
    specs, keys, unpublished = _catalog()
    key = normalize(name)
    matches = keys.get(key, ())
    if len(matches) == 1:
        return specs[matches[0]]
    if matches:
        raise ValueError(f"GPU name {name!r} is ambiguous: say which of "
                         f"{', '.join(matches)} (memory differs)")
    if key in unpublished:
        gpu = unpublished[key]
        raise ValueError(f"{gpu.name}: no public memory capacity is known for this GPU, so "
                         "no fit can be judged; name a GPU with a published capacity "
                         f"({', '.join(specs)}) or leave the GPU unset for a per-stage "
                         "estimate without a verdict")
    raise ValueError(f"unknown GPU {name!r}; known GPUs: {', '.join(specs)}")
