"""Python API: the tools the CLI and the MCP server expose, called from your own code.

Each function takes the training config as you hold it and returns the same report the
``mbridge-perf`` command and the MCP tools return (pydantic models; ``.model_dump()`` for a
dict):

- a live Megatron Bridge ``ConfigContainer`` (anything with ``to_yaml()``): read through its
  own YAML dump, so nothing of Bridge is imported here;
- a mapping of sections (``{"model": {...}, "train": {...}, ...}``);
- YAML text (a ``config.yaml`` dump as a string);
- a path you name (``pathlib.Path``, or a string naming an existing ``.yaml`` / ``.yml`` /
  ``.json`` file): a Bridge dump or a Hugging Face ``config.json``;
- a ``TrainingConfig`` already loaded;
- or nothing, with ``recipe=`` (a Bridge 0.6.2 recipe name), ``preset=`` or ``flags=``.

``overrides`` (dotted ``section.field=value``) and ``flags`` (perf-harness flags) apply on
top, as on the command line::

    from mbridge_perf import api

    report = api.estimate(cfg)                        # cfg: a live ConfigContainer
    report = api.estimate(recipe="qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config",
                          overrides=["train.micro_batch_size=2"], gpu="B300")
    print(report.answer_markdown)

Bad input raises ``mbridge_perf.config.errors.ConfigError`` (a ``ValueError``) naming the
field. Where ``megatron.bridge`` is importable and a live ``ConfigContainer`` is given,
``estimate`` also calls Bridge's own ``estimate_training_memory`` on it and lines the two up
(``report.bridge``).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig

if TYPE_CHECKING:
    from mbridge_perf.advise.parallelism import ParallelismPlan
    from mbridge_perf.advise.recompute import RecomputePlan
    from mbridge_perf.memory.bridge_compare import BridgeNumbers
    from mbridge_perf.memory.estimate import MemoryReport
    from mbridge_perf.rules.validate import ValidationReport
    from mbridge_perf.steptime import StepTimeReport

__all__ = ["estimate", "load", "plan", "recommend", "step_time", "validate"]

_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def _yaml_of(obj: Any) -> str:
    """A live object's YAML through its own ``to_yaml()``: the returned text, what it
    printed, or (for a ``to_yaml(path)`` that only writes files) the file it wrote."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        text = obj.to_yaml()
    if isinstance(text, str) and text.strip():
        return text
    if out.getvalue().strip():
        return out.getvalue()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        obj.to_yaml(str(path))
        if not path.exists():
            raise ConfigError("config", f"{type(obj).__name__}.to_yaml() gave no YAML")
        return path.read_text("utf-8")


def _is_path(config: Any) -> bool:
    if isinstance(config, os.PathLike):
        return True
    return (isinstance(config, str) and "\n" not in config and len(config) < 4096
            and config.lower().endswith(_FILE_SUFFIXES) and Path(config).is_file())


def load(config: Any = None, *, recipe: str | None = None, preset: str | None = None,
         overrides: Sequence[str] = (), flags: Sequence[str] = ()) -> TrainingConfig:
    """The config as every tool reads it, from any of the forms the module docstring lists."""
    if isinstance(config, TrainingConfig):
        if recipe or preset or overrides or flags:
            raise ConfigError("config", "a TrainingConfig is used as it is: pass the mapping "
                                        "or YAML instead to add a recipe, preset, overrides "
                                        "or flags")
        return config
    kw: dict[str, Any] = {"recipe": recipe, "preset": preset, "overrides": overrides,
                          "flags": flags}
    if config is None:
        return load_config(**kw)
    if _is_path(config):
        return load_config(file=Path(config), **kw)
    if isinstance(config, str):
        return load_config(text=config, **kw)
    if isinstance(config, Mapping):
        return load_config(data=config, **kw)
    if _is_container(config):
        return load_config(text=_yaml_of(config), **kw)
    raise ConfigError("config", f"cannot read a {type(config).__name__}: give a Bridge "
                                "ConfigContainer, a mapping, YAML text or a path")


def validate(config: Any = None, *, baseline: Any = None, mcore_version: str = "0.19.2",
             **source: Any) -> ValidationReport:
    """validate_config: findings against Megatron-Core / Bridge constraints (``baseline``:
    the config before your change, in any accepted form)."""
    from mbridge_perf.rules import validate as run

    base = load(baseline) if baseline is not None else None
    return run(load(config, **source), base, mcore_version)


def estimate(config: Any = None, *, gpu: str | None = None, imbalance: float = 1.0,
             **source: Any) -> MemoryReport:
    """estimate_memory: per-stage memory, the reserved band, overheads and the verdict; with a
    live ConfigContainer and megatron.bridge importable, Bridge's own estimate next to it."""
    from mbridge_perf.memory.answer import estimate_with_answer
    from mbridge_perf.memory.bridge_compare import compare

    cfg = load(config, **source)
    report = estimate_with_answer(cfg, gpu=gpu, imbalance=imbalance)
    if not _is_container(config) or any(source.values()):
        return report
    numbers = bridge_estimate(config, report.parallelism.get("num_microbatches"))
    if numbers is None:
        return report
    return report.model_copy(update={"bridge": compare(report, cfg, numbers)})


def _is_container(config: Any) -> bool:
    return not isinstance(config, str | Mapping | os.PathLike | TrainingConfig) and \
        callable(getattr(config, "to_yaml", None))


def bridge_estimate(container: Any, num_microbatches: int | None) -> BridgeNumbers | None:
    """Bridge's own ``estimate_training_memory(container, num_microbatches=…)`` (the memory
    skill's call), or None where megatron.bridge does not import or the call fails."""
    from mbridge_perf.memory.bridge_compare import BridgeNumbers

    try:
        from megatron.bridge.training.utils.theoretical_memory_utils import (
            estimate_training_memory,
        )
    except ImportError:
        return None
    try:
        result = estimate_training_memory(container, num_microbatches=num_microbatches)
    except Exception:  # Bridge's formula raises on configs it does not cover (see its notes)
        return None
    gib = float(1 << 30)
    total = getattr(result, "total_memory_bytes", None)
    state = getattr(result, "weight_and_optimizer_bytes", None)
    act = getattr(getattr(result, "activation", None), "memory_bytes", 0.0)
    if total is None or state is None:
        return None
    return BridgeNumbers(total / gib, state / gib, (act or 0.0) / gib, "live",
                         "Megatron Bridge's estimate_training_memory on your ConfigContainer")


def recommend(config: Any = None, *, target_gib: float | None = None, gpu: str | None = None,
              **source: Any) -> RecomputePlan:
    """recommend_recompute: the memory ladder, cheapest first, each step priced."""
    from mbridge_perf.advise.recompute import recommend_recompute

    return recommend_recompute(load(config, **source), target_gib=target_gib, gpu=gpu)


def plan(config: Any = None, *, num_gpus: int, gpu: str, seq_length: int,
         global_batch_size: int, micro_batch_size: int | None = None, top_k: int = 10,
         constraints: Mapping[str, Sequence[int]] | None = None,
         **source: Any) -> ParallelismPlan:
    """plan_parallelism: valid layouts on ``num_gpus`` GPUs, priced and ranked."""
    from mbridge_perf.advise.parallelism import plan_parallelism

    limits = {k: list(v) for k, v in constraints.items()} if constraints else None
    return plan_parallelism(load(config, **source), num_gpus, gpu, seq_length,
                            global_batch_size, micro_batch_size=micro_batch_size,
                            top_k=top_k, constraints=limits)


def step_time(config: Any = None, *, gpu: str | None = None, **source: Any) -> StepTimeReport:
    """estimate_step_time: predicted step time, tokens/s/GPU, MFU, breakdown and band."""
    from mbridge_perf.steptime import estimate_step_time

    return estimate_step_time(load(config, **source), gpu=gpu)
