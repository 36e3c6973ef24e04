"""Cluster profiles: where and how a benchmark runs (partition, account, nodes, container, setup
lines, launcher), kept apart from the TrainingConfig that says *what* runs.

A profile is a YAML file the cluster's owner writes (read with ``safe_load``). Its ``setup``
lines are shell the owner wrote and are copied into the job script verbatim — they are trusted
because they come from the profile file, never from tool arguments. Every other value is
validated here (Slurm header values may not contain whitespace, quotes or newlines, since
``#SBATCH`` lines are not shell) and quoted when rendered.

Built-in profile ``cpu-test``: the Megatron-Core CPU workload
(``mbridge_perf.bench.workloads.cpu_gpt``) under this interpreter's ``torchrun`` with two
processes — what the tests and CI run, locally or through a local Slurm.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

# Slurm header values: partition / account / qos names, time limits, node counts.
_HEADER_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/\-]+$")
# [days-]hours:minutes:seconds, minutes, minutes:seconds, days-hours[:minutes]
_TIME_LIMIT = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^UNLIMITED$|^infinite$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Launcher = Literal["bridge-run-recipe", "cpu-gpt"]
LAUNCHERS: dict[str, str] = {
    "bridge-run-recipe": "Megatron Bridge scripts/training/run_recipe.py under torchrun, one "
                         "torchrun per node via srun, Hydra-style overrides from the config",
    "cpu-gpt": "the Megatron-Core CPU workload (mbridge_perf.bench.workloads.cpu_gpt) under "
               "torchrun; for tests and CI without GPUs",
}


class ProfileError(ValueError):
    """A profile that cannot be read or is not valid; the message names the field."""


def _no_control(value: str, what: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError(f"{what} contains a newline or control character")
    return value


class ClusterProfile(BaseModel):
    """Where a benchmark runs. Field names follow sbatch options where there is one."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="profile name, shown in the run record")
    executor: Literal["local", "slurm"] = Field(
        "slurm", description="local: run the script with bash on this machine; slurm: sbatch")
    partition: str | None = Field(None, description="sbatch --partition")
    account: str | None = Field(None, description="sbatch --account")
    qos: str | None = Field(None, description="sbatch --qos")
    nodes: int = Field(1, ge=1, le=100_000, description="sbatch --nodes (one torchrun per node)")
    gpus_per_node: int | None = Field(
        None, ge=0, le=1024, description="sbatch --gpus-per-node; also torchrun's "
                                         "--nproc_per_node unless nproc_per_node is set")
    nproc_per_node: int | None = Field(
        None, ge=1, le=1024, description="processes torchrun starts per node "
                                         "(default: gpus_per_node, else 1)")
    cpus_per_task: int | None = Field(None, ge=1, le=100_000, description="sbatch --cpus-per-task")
    time_limit: str = Field("00:30:00", description="sbatch --time ([D-]HH:MM:SS or minutes)")
    exclusive: bool = Field(False, description="sbatch --exclusive")
    sbatch_args: list[str] = Field(
        default_factory=list, description="extra #SBATCH options, e.g. ['--constraint=h100']")
    container_image: str | None = Field(
        None, description="pyxis: srun --container-image (needs Slurm with pyxis)")
    container_mounts: list[str] = Field(
        default_factory=list, description="pyxis: srun --container-mounts, 'src:dst[:flags]'")
    srun_args: list[str] = Field(default_factory=list, description="extra srun arguments")
    setup: list[str] = Field(
        default_factory=list, description="shell lines run before the launch (module load, "
                                          "source a venv, …); trusted: copied verbatim")
    launcher: Launcher = Field("bridge-run-recipe", description="launch template, see LAUNCHERS")
    torchrun: list[str] = Field(
        default_factory=lambda: ["python", "-m", "torch.distributed.run"],
        description="command that starts torchrun, as an argument list "
                    "(e.g. ['uv', 'run', 'python', '-m', 'torch.distributed.run'])")
    bridge_dir: str = Field(
        "/opt/Megatron-Bridge", description="Megatron Bridge checkout (in the container, if "
                                            "any): scripts/training/run_recipe.py lives here")
    launcher_args: list[str] = Field(
        default_factory=list, description="extra arguments for the training script "
                                          "(run_recipe.py or the CPU workload)")
    env: dict[str, str] = Field(
        default_factory=dict, description="extra environment (wins over the config's env)")
    workdir: str | None = Field(None, description="directory the job runs in (cd)")
    log_dir: str | None = Field(
        None, description="where scripts and logs go; must be visible from the compute "
                          "nodes (default: next to the run registry)")
    slurm_conf: str | None = Field(
        None, description="SLURM_CONF for the client commands (default: the system's "
                          "/etc/slurm/slurm.conf); a local test cluster's config, for example")
    master_port: int = Field(29500, ge=1024, le=65535,
                             description="rendezvous port for multi-node runs")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", v):
            raise ValueError("use 1-64 letters, digits, '.', '_' or '-'")
        return v

    @field_validator("partition", "account", "qos")
    @classmethod
    def _header(cls, v: str | None) -> str | None:
        if v is not None and not _HEADER_VALUE.fullmatch(v):
            raise ValueError(f"{v!r} is not a Slurm name (letters, digits, _ . , : @ % + = / -)")
        return v

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        if not _TIME_LIMIT.fullmatch(v):
            raise ValueError(f"{v!r} is not a Slurm time limit; use HH:MM:SS, D-HH:MM:SS or "
                             "minutes")
        return v

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, v: list[str]) -> list[str]:
        for arg in v:
            if not re.fullmatch(r"--[a-z][a-z\-]*(=[A-Za-z0-9_.,:@%+=/\-]+)?", arg):
                raise ValueError(f"{arg!r}: extra #SBATCH options look like --name or "
                                 "--name=value without spaces or quotes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV_NAME.fullmatch(k):
                raise ValueError(f"{k!r} is not an environment variable name")
        return v

    @field_validator("setup")
    @classmethod
    def _setup(cls, v: list[str]) -> list[str]:
        for line in v:
            if "\n" in line or "\r" in line:
                raise ValueError("one shell line per list item (no newlines inside an item)")
        return v

    @field_validator("container_image", "workdir", "log_dir", "bridge_dir", "slurm_conf")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v, "value")

    @field_validator("torchrun")
    @classmethod
    def _torchrun(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("give the torchrun command as a non-empty argument list")
        return v

    @property
    def procs_per_node(self) -> int:
        return self.nproc_per_node or self.gpus_per_node or 1


def _venv_torchrun() -> list[str]:
    """This interpreter's torchrun (the venv the server runs in)."""
    exe = Path(sys.executable)
    candidate = exe.with_name("torchrun")
    return [str(candidate)] if candidate.exists() else [str(exe), "-m",
                                                         "torch.distributed.run"]


def builtin_profiles() -> dict[str, ClusterProfile]:
    """Profiles that ship with the package (built on call: they name this interpreter)."""
    return {
        "cpu-test": ClusterProfile(
            name="cpu-test", executor="local", nodes=1, nproc_per_node=2, cpus_per_task=2,
            time_limit="00:10:00", launcher="cpu-gpt", torchrun=_venv_torchrun(),
            env={"OMP_NUM_THREADS": "1"}),
    }


def load_profile(source: str | Path | Mapping[str, Any] | ClusterProfile) -> ClusterProfile:
    """A profile from a built-in name, a YAML file path, YAML text or a mapping."""
    if isinstance(source, ClusterProfile):
        return source
    where = "profile"
    if isinstance(source, Mapping):
        data: Any = dict(source)
    else:
        text = str(source)
        builtins = builtin_profiles()
        if text in builtins:
            return builtins[text]
        path = Path(text)
        # a path only when it looks like one: a bare word never finds a file in the cwd
        if "\n" not in text and (path.suffix in (".yaml", ".yml") or "/" in text):
            where = str(path)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ProfileError(f"{path}: cannot read the profile ({exc.strerror}); built-in "
                                   f"profiles are {', '.join(builtins)}") from None
        elif "\n" not in text and ":" not in text:
            raise ProfileError(f"no profile named {text!r}: give a YAML file or one of "
                               f"{', '.join(builtins)}")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ProfileError(f"{where}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: expected a mapping (name:, partition:, …)")
    if "name" not in data and where != "profile":
        data["name"] = Path(where).stem
    try:
        return ClusterProfile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "profile"
        raise ProfileError(f"{where}: {field}: {err['msg']}") from None
