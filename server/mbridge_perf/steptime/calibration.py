"""The step-time model's few calibrated parameters (data/calibration.json, written by
scripts/fit_steptime.py from ../shared/data/steptime only).

Per GPU generation (``ampere``, ``hopper``, ``blackwell``, ``blackwell_ultra`` = B300/GB300;
``rubin`` borrows Blackwell's): GEMM
efficiency as a fraction of the dense peak for BF16, FP8 and FP4. Shared by all generations:
the grouped-GEMM (MoE experts) factor on that efficiency, the exposed share of EP all-to-all,
a fixed host/launch overhead per layer and micro-batch, and the fixed seeds the fit does not
move (link efficiencies, overlap fractions), each with its source. ``band_frac`` is the
out-of-sample residual spread the report turns into ``band_s``.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from mbridge_perf.config.errors import ConfigError

CALIBRATION_FILE = Path(__file__).with_name("data") / "calibration.json"


class GenParams(BaseModel):
    """GEMM efficiency (achieved / dense peak) per precision for one GPU generation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gemm_eff_bf16: float = Field(gt=0, le=1)
    gemm_eff_fp8: float = Field(gt=0, le=1)
    gemm_eff_fp4: float = Field(gt=0, le=1)


class Calibration(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    generations: dict[str, GenParams]
    grouped_gemm_factor: float = Field(gt=0, le=1.5)
    """MoE expert (grouped) GEMM efficiency relative to a dense GEMM of the same precision."""
    gemm_half_flops: float = Field(2e9, ge=0)
    """GEMM size (forward FLOPs) at which efficiency is half its large-GEMM value (seed from
    Calculon's size buckets: 1-16 GFLOP -> 0.6 of the >=128 GFLOP value)."""
    attn_eff: float = Field(0.55, gt=0, le=1)
    """Flash/cuDNN attention core efficiency of the BF16 peak (seed: FA3 ~0.75 fwd, lower bwd)."""
    ssm_eff: float = Field(0.043, gt=0, le=1)
    """Mamba-2 SSD / GatedDeltaNet chunked-scan rate as a fraction of Hopper's dense BF16 peak,
    scaled per generation by SM count x clock (model.SCAN_SM_SCALE: the scan's kernels are
    latency-bound, not tensor-bound). Seed: the value with which the model reproduces a public
    pure Mamba-2 1.4B model's training throughput on A100, H200 and GB200 (102.5 / 239 / 360
    TFLOP/s, state-spaces/mamba#904) within 7 %; the old seed, 0.1 of each GPU's own BF16
    peak, put Nemotron-3 Nano 25-29 % too fast out of sample."""
    ep_exposed: float = Field(ge=0, le=1)
    """Share of EP all-to-all time not hidden (without overlap_moe_expert_parallel_comm)."""
    ep_overlap_flag_factor: float = Field(0.6, ge=0, le=1)
    """Exposed EP share multiplier when overlap_moe_expert_parallel_comm is on (skill card:
    Qwen3-30B-A3B EP16 41.25 s -> 31.31 s)."""
    layer_overhead_us: float = Field(ge=0)
    """Host/launch time per layer per micro-batch (fwd+bwd) not hidden by the GPU."""
    layer_host_us: float = Field(1000.0, ge=0)
    """Host time to launch one layer's kernels for one micro-batch (forward and backward): a
    layer whose GPU work is shorter waits for the host (small models, small micro-batches).
    Seed: ~100 kernels x ~10 us; fitted on vTrain's small GPTs (Megatron-DeepSpeed, A100),
    the only rows where it binds - Bridge's recipes have layers of several ms."""
    graph_overhead_factor: float = Field(0.3, ge=0, le=1)
    """Share of that overhead left with CUDA graphs on (seed)."""
    tp_exposed: float = Field(0.25, ge=0, le=1)
    """Exposed share of the TP all-gather/reduce-scatter with comm_overlap.tp_comm_overlap on:
    TE userbuffers split each into 4 chunks pipelined with the GEMM, one chunk stays exposed
    (Bridge performance guide, step-time-model.md §4). A seed, not fitted: the fit drove it to
    0.0008, which no overlap scheme achieves."""
    tp_exposed_no_overlap: float = Field(1.0, ge=0, le=1)
    """The same without tp_comm_overlap: the collectives sit between the GEMMs on the critical
    path (SimuMax counts every in-layer collective as exposed, step-time-model.md §3)."""
    cp_exposed: float = Field(0.3, ge=0, le=1)
    pp_exposed: float = Field(0.2, ge=0, le=1)
    dp_exposed: float = Field(0.1, ge=0, le=1)
    """Exposed share of the DP/EDP gradient reduce-scatter + parameter all-gather with the
    overlap flags on (1.0 when off)."""
    coll_latency_us: float = Field(20.0, ge=0)
    """Fixed start-up time of one collective or send/recv (NVLink; SimuMax's fit: 20-25 us,
    Calculon 10-20 us, step-time-model.md §7): what a small message costs whatever its size."""
    coll_hop_us: float = Field(5.0, ge=0)
    """Latency per further rank a ring collective passes through (SimuMax: 5-10 us per hop)."""
    nvlink_eff: float = Field(0.8, gt=0, le=1)
    """Achieved bus bandwidth / NVLink one-way line rate (H100 ring ~370/450, nccl-tests#212)."""
    network_eff: float = Field(0.9, gt=0, le=1)
    """Achieved / NIC line rate (46-49 GB/s per 400 Gb/s NIC, nccl-tests#290)."""
    hbm_eff: float = Field(0.7, gt=0, le=1)
    band_frac: float = Field(0.15, ge=0)
    """Out-of-sample p80 |relative error| of step time on the fitted source."""
    pair_band_frac: float = Field(0.12, ge=0, le=1)
    """p80 of |predicted / measured - 1| of the throughput ratio of two measured runs of the
    same model, pooled over the 153 layout pairs of the NeMo auto-configurator sweep (p80
    11.8 %) and the skill cards' 19 A/B pairs with a change of at least 2 % (p80 17.2 %), both
    in ../shared/data/steptime and printed by benchmarks/steptime_accuracy.py. Two layouts whose
    predictions differ by less are a tie for the planner."""
    fitted: list[str] = Field(default_factory=list)
    rows: list[dict[str, str]] = Field(default_factory=list)
    """The rows the fit used (recipe dump, release, GPU, GPUs, precision)."""
    source: str = ""

    def gen(self, architecture: str) -> GenParams:
        return self.generations.get(architecture) or self.generations["blackwell"]


SEED = Calibration(
    generations={
        # SimuMax a100_pcie matmul median 0.718 (step-time-model.md §3)
        "ampere": GenParams(gemm_eff_bf16=0.72, gemm_eff_fp8=0.72, gemm_eff_fp4=0.72),
        "hopper": GenParams(gemm_eff_bf16=0.7, gemm_eff_fp8=0.55, gemm_eff_fp4=0.55),
        "blackwell": GenParams(gemm_eff_bf16=0.6, gemm_eff_fp8=0.5, gemm_eff_fp4=0.35),
        "blackwell_ultra": GenParams(gemm_eff_bf16=0.6, gemm_eff_fp8=0.5, gemm_eff_fp4=0.35),
    },
    grouped_gemm_factor=0.6, ep_exposed=0.8, layer_overhead_us=100.0,
    source="seed values, step-time-model.md §7",
)


USER_ENV = "MBRIDGE_PERF_CALIBRATION"


def user_calibration_path() -> Path:
    """Where ``mbridge-perf calibrate`` writes the user's own calibration: $MBRIDGE_PERF_
    CALIBRATION, else the user's config directory (never a tool argument)."""
    return Path(_user())


def _user() -> str:
    return _user_path(os.environ.get(USER_ENV), os.environ.get("XDG_CONFIG_HOME"),
                      os.environ.get("HOME"))


@cache
def _user_path(env: str | None, xdg: str | None, home: str | None) -> str:
    if env:
        return str(Path(env).expanduser())
    base = xdg or str(Path(home).expanduser() if home else Path.home()) + "/.config"
    return str(Path(base) / "mbridge-perf" / "calibration.json")


def load_calibration(path: str | None = None) -> Calibration:
    """The calibration at ``path``; else the user's own (``mbridge-perf calibrate``) where it
    exists; else the shipped file; the seed when none exists. Re-read when the file changes.
    Called on every estimate: one stat, the path resolution cached."""
    p = path or _user()
    try:
        stamp = os.stat(p).st_mtime_ns
    except OSError:
        if path:
            return SEED
        p = _SHIPPED
        try:
            stamp = os.stat(p).st_mtime_ns
        except OSError:
            return SEED
    return _read(p, stamp)


_SHIPPED = str(CALIBRATION_FILE)


@cache
def _read(path: str, stamp: int) -> Calibration:
    try:
        return Calibration.model_validate(json.loads(Path(path).read_text("utf-8")))
    except (OSError, ValueError) as exc:
        raise ConfigError("calibration", f"{path} is not a step-time calibration "
                                         f"({type(exc).__name__}); rerun `mbridge-perf "
                                         "calibrate` or delete the file") from None
