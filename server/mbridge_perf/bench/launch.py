"""Render a benchmark's Slurm batch script from a TrainingConfig and a ClusterProfile.

The same script runs under ``sbatch`` and under plain ``bash`` (the local executor): the
Slurm-only steps (srun, multi-node rendezvous, pyxis containers) are guarded by
``SLURM_JOB_ID``; ``#SBATCH`` lines are comments to bash.

Safety: every value that comes from the config, the profile or the caller is passed through
``shlex.quote`` and lands in the job as one literal word — a value holding ``$(…)``, backticks,
``;`` or a newline is never executed. ``#SBATCH`` header values are not shell, so the profile
restricts them to plain names (see ``profile.py``) and the log path goes in the header only when
it is a plain path (the Slurm executor always passes ``--output`` on the sbatch command line).
The profile's ``setup`` lines are the one exception: trusted shell from the profile file.

Environment, in order (later wins): the skills' defaults (``PYTORCH_CUDA_ALLOC_CONF=
expandable_segments:True``, ``CUDA_DEVICE_MAX_CONNECTIONS=1``, ``NVTE_ALLOW_NONDETERMINISTIC_ALGO=
1``, ``NCCL_GRAPH_REGISTER=0`` when CUDA graphs are on), the config's ``env``, the profile's
``env``.

Launchers: ``bridge-run-recipe`` runs Megatron Bridge's ``scripts/training/run_recipe.py
--recipe <recipe>`` under torchrun (one torchrun per node via srun) with Hydra-style overrides
for every field the config sets, plus ``train.train_iters=<steps>`` and — unless the config sets
them — ``logger.log_interval=1`` and ``logger.log_throughput=true`` (the result needs one
iteration line per step with TFLOP/s). ``cpu-gpt`` runs the CPU workload with the shape and
TP/SP/DP layout the config gives.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import Any

from mbridge_perf.bench.envpolicy import check_env
from mbridge_perf.bench.profile import ClusterProfile
from mbridge_perf.config.model import TrainingConfig

EXIT_FILE_SUFFIX = ".exitcode"
SKILL_ENV: dict[str, str] = {
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_DEVICE_MAX_CONNECTIONS": "1",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO": "1",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_ID = re.compile(r"^[A-Za-z0-9_\-]{1,64}$")
_PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./%+=,:@\-]+$")
_PLAIN_HYDRA = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-./]*$")
_HYDRA_WORDS = {"true", "false", "null", "none", "nan", "inf"}
# Sections handed to run_recipe.py (TrainingConfig.env and .cluster are ours, not Bridge's).
_SECTIONS = ("model", "train", "optimizer", "ddp", "mixed_precision", "comm_overlap")
_MAX_STEPS = 10_000_000
CPU_GPT_MODULE = "mbridge_perf.bench.workloads.cpu_gpt"


def exit_file(log_path: str) -> str:
    """Where the script records its exit status (read by the local executor)."""
    return log_path + EXIT_FILE_SUFFIX


def slurm_job_name(run_id: str) -> str:
    """The job name a run gets; the Slurm executor checks it before trusting a job id."""
    return f"mbridge-perf-{run_id[:12]}"


def q(value: Any) -> str:
    """One literal shell word."""
    return shlex.quote(str(value))


# ---------------------------------------------------------------- overrides

def hydra_value(value: Any) -> str:
    """A value in Hydra override syntax: plain words stay bare, other strings are quoted."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN_HYDRA.fullmatch(text) and text.lower() not in _HYDRA_WORDS:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            # `_target_`, `_call_`, …: an override naming a callable would let a config choose
            # code for Hydra to instantiate; the recipe already has the right objects
            if not (str(k).startswith("_") and str(k).endswith("_")):
                yield from _flatten(f"{prefix}.{k}", v)
    else:
        yield prefix, value


def config_overrides(cfg: TrainingConfig, steps: int) -> list[str]:
    """`section.field=value` for every field the config sets (modelled or carried), then the
    fields a benchmark needs."""
    pairs = dict(kv for name, value in given_values(cfg).items() for kv in _flatten(name, value))
    pairs.pop("train.train_iters", None)
    pairs["train.train_iters"] = steps
    pairs.setdefault("logger.log_interval", 1)
    pairs.setdefault("logger.log_throughput", True)
    return [f"{key}={hydra_value(value)}" for key, value in pairs.items()]


def given_values(cfg: TrainingConfig) -> dict[str, Any]:
    """The sections and fields the config sets (modelled or carried): what run_recipe.py lays
    over its recipe."""
    given: dict[str, Any] = {}
    for name in _SECTIONS:
        section = getattr(cfg, name)
        if section is None or name not in cfg.model_fields_set:
            continue
        if isinstance(section, str):  # a named mixed-precision recipe
            given[name] = section
            continue
        values = {**section.model_dump(exclude_unset=True), **section.carried()}
        if values:
            given[name] = values
    for name, value in cfg.carried().items():  # dataset, logger, checkpoint, …
        given[name] = value
    return given


# ---------------------------------------------------------------- environment

def cuda_graphs_on(cfg: TrainingConfig) -> bool:
    m = cfg.model
    return (m.cuda_graph_impl or "none") != "none" or m.enable_cuda_graph or m.external_cuda_graph


def job_env(cfg: TrainingConfig, profile: ClusterProfile) -> dict[str, str]:
    """The job's environment: the skills' defaults, the config's env (checked against the
    policy: it is untrusted), then the profile's env (the user's own file, trusted)."""
    check_env(cfg.env)
    env = dict(SKILL_ENV)
    if cuda_graphs_on(cfg):
        env["NCCL_GRAPH_REGISTER"] = "0"
    env.update(cfg.env)
    env.update(profile.env)
    for name in env:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"env: {name!r} is not an environment variable name")
    return env


# ---------------------------------------------------------------- launchers

def _nodes(cfg: TrainingConfig, profile: ClusterProfile) -> int:
    """Nodes = ceil(num_gpus / gpus_per_node) when the config states a world size."""
    c = cfg.cluster
    if c.gpus_per_node and profile.gpus_per_node and c.gpus_per_node != profile.gpus_per_node:
        raise ValueError(f"cluster.gpus_per_node is {c.gpus_per_node} but profile "
                         f"{profile.name!r} has {profile.gpus_per_node} GPUs per node")
    per_node = profile.procs_per_node
    if c.num_gpus is None:
        return profile.nodes
    if c.num_gpus > per_node and c.num_gpus % per_node:
        raise ValueError(f"cluster.num_gpus {c.num_gpus} is not a multiple of the "
                         f"{per_node} processes per node of profile {profile.name!r}")
    return max(1, math.ceil(c.num_gpus / per_node))


def _cpu_gpt_args(cfg: TrainingConfig, profile: ClusterProfile, steps: int) -> list[str]:
    m, t = cfg.model, cfg.train
    unsupported = [name for name, bad in (
        ("pipeline_model_parallel_size", m.pipeline_model_parallel_size > 1),
        ("context_parallel_size", m.context_parallel_size > 1),
        ("expert_model_parallel_size", m.expert_model_parallel_size > 1),
        ("num_moe_experts", bool(m.num_moe_experts))) if bad]
    if unsupported:
        raise ValueError("the cpu-gpt workload runs dense GPT with TP/SP/DP only; unset "
                         + ", ".join(f"model.{n}" for n in unsupported))
    world = profile.procs_per_node
    tp = m.tensor_model_parallel_size
    if world % tp:
        raise ValueError(f"model.tensor_model_parallel_size {tp} does not divide the "
                         f"{world} processes of profile {profile.name!r}")
    if t.global_batch_size is not None and t.global_batch_size != t.micro_batch_size * (
            world // tp):
        raise ValueError("the cpu-gpt workload runs one micro-batch per step: "
                         "train.global_batch_size must be micro_batch_size × DP = "
                         f"{t.micro_batch_size * (world // tp)}")
    args = ["--steps", str(steps), "--tp", str(tp), "--mbs", str(t.micro_batch_size)]
    if tp > 1 and not m.sequence_parallel:
        args.append("--no-sp")
    for flag, value in (("--seq", m.seq_length), ("--hidden", m.hidden_size),
                        ("--layers", m.num_layers), ("--heads", m.num_attention_heads),
                        ("--vocab", m.vocab_size)):
        if value is not None:
            args += [flag, str(value)]
    return args


def _training_command(cfg: TrainingConfig, profile: ClusterProfile, recipe: str | None,
                      steps: int) -> list[str]:
    """The words after `torchrun <rendezvous> --nproc_per_node=N`."""
    if profile.launcher == "cpu-gpt":
        return ["-m", CPU_GPT_MODULE, *_cpu_gpt_args(cfg, profile, steps),
                *profile.launcher_args]
    if not recipe:
        raise ValueError("the bridge-run-recipe launcher needs a recipe name, e.g. "
                         "'llama3_8b_pretrain_config' (Megatron Bridge's exported recipes)")
    script = profile.bridge_dir.rstrip("/") + "/scripts/training/run_recipe.py"
    return [script, "--recipe", recipe, *profile.launcher_args,
            *config_overrides(cfg, steps)]


# ---------------------------------------------------------------- the script

def _grouped(words: list[str]) -> Iterator[str]:
    """Quoted words, one option (with its value) or override per line."""
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-") and "=" not in word and i + 1 < len(words) and \
                not words[i + 1].startswith("-"):
            yield f"{q(word)} {q(words[i + 1])}"
            i += 2
        else:
            yield q(word)
            i += 1


def _check_run(run_id: str, log_path: str, steps: int) -> None:
    """Refuse a run id, log path or step count that cannot land safely in the script."""
    if not _RUN_ID.fullmatch(run_id):
        raise ValueError(f"run_id {run_id!r}: use 1-64 letters, digits, '_' or '-'")
    if not log_path or any(ord(c) < 32 or ord(c) == 127 for c in log_path):
        raise ValueError("log_path must be a non-empty path without newlines or control "
                         "characters")
    if not 1 <= steps <= _MAX_STEPS:
        raise ValueError(f"steps must be between 1 and {_MAX_STEPS}, got {steps}")


def _sbatch_header(profile: ClusterProfile, *, run_id: str, log_path: str,
                   nodes: int) -> list[str]:
    """The shebang and ``#SBATCH`` lines (comments to bash); values are plain names from the
    profile, and the log path only when it is a plain path."""
    head = ["#!/bin/bash", f"#SBATCH --job-name={slurm_job_name(run_id)}",
            f"#SBATCH --nodes={nodes}", "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --time={profile.time_limit}"]
    if profile.gpus_per_node:
        head.append(f"#SBATCH --gpus-per-node={profile.gpus_per_node}")
    if profile.cpus_per_task:
        head.append(f"#SBATCH --cpus-per-task={profile.cpus_per_task}")
    for opt in ("partition", "account", "qos"):
        value = getattr(profile, opt)
        if value:
            head.append(f"#SBATCH --{opt}={value}")
    if profile.exclusive:
        head.append("#SBATCH --exclusive")
    if _PLAIN_PATH.fullmatch(log_path):
        head.append(f"#SBATCH --output={log_path}")
    head += [f"#SBATCH {arg}" for arg in profile.sbatch_args]
    return head


def _preamble(profile: ClusterProfile, *, run_id: str, log_path: str, steps: int,
              env: dict[str, str]) -> list[str]:
    """Shell options, the exit-status trap the local executor reads, the environment, the
    working directory and the profile's setup lines."""
    body = [
        "#",
        f"# mbridge-perf benchmark run {run_id} (profile {profile.name}, launcher "
        f"{profile.launcher}, {steps} steps).",
        "# Rendered by mbridge_perf.bench.launch: every value is shell-quoted. Runs under sbatch",
        "# or plain bash (local executor); Slurm-only steps are guarded by SLURM_JOB_ID.",
        "set -uo pipefail",
        f"export MBRIDGE_PERF_RUN_ID={q(run_id)}",
        f"MBRIDGE_PERF_EXIT_FILE={q(exit_file(log_path))}",
        "_mbp_exit() {",
        '  local rc=$?',
        '  printf \'%s\\n\' "$rc" >"$MBRIDGE_PERF_EXIT_FILE.tmp" && '
        'mv -f "$MBRIDGE_PERF_EXIT_FILE.tmp" "$MBRIDGE_PERF_EXIT_FILE"',
        "}",
        "trap _mbp_exit EXIT",
        'echo "mbridge-perf: run $MBRIDGE_PERF_RUN_ID on $(hostname) at '
        '$(date -u +%Y-%m-%dT%H:%M:%SZ) (Slurm job ${SLURM_JOB_ID:-none})"',
        *_slurm_view(),
        "",
        "# environment: the skills' defaults, then the config's env, then the profile's env",
    ]
    body += [f"export {name}={q(value)}" for name, value in env.items()]
    if profile.workdir:
        body += ["", f"cd -- {q(profile.workdir)} || exit 2"]
    if profile.setup:
        body += ["", "# setup lines from the profile (trusted)", *profile.setup]
    return body


def _srun_words(profile: ClusterProfile) -> list[str]:
    """The srun prefix under Slurm (one task per node, pyxis container flags when set)."""
    srun = ["srun", '--nodes="$nnodes"', "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    if profile.container_image:
        srun.append(q(f"--container-image={profile.container_image}"))
        if profile.container_mounts:
            srun.append(q("--container-mounts=" + ",".join(profile.container_mounts)))
        srun.append("--no-container-mount-home")
    srun += [q(a) for a in profile.srun_args]
    return srun


def _slurm_view() -> list[str]:
    """Slurm's own view of the job (id, node count, node list), captured BEFORE any environment
    is exported: nothing the job's environment sets — a config may not set Slurm's names at
    all, a profile's env is the user's own — can move the rendezvous endpoint or change the
    node count srun is given."""
    return [
        "",
        "# Slurm's view of the job, captured before any environment below is exported",
        'mbp_slurm_job_id="${SLURM_JOB_ID:-}"',
        'mbp_slurm_nnodes="${SLURM_JOB_NUM_NODES:-1}"',
        'mbp_slurm_nodelist="${SLURM_JOB_NODELIST:-}"',
    ]


def _launch_block(profile: ClusterProfile, nodes: int) -> list[str]:
    """The launcher prefix and rendezvous from the captured Slurm view: srun plus multi-node
    c10d under Slurm; under plain bash a standalone torchrun, or a refusal when the run needs a
    container or several nodes."""
    body = [
        "",
        "# launch: torchrun per node (via srun under Slurm, directly under bash)",
        "launch=()",
        "rdzv=(--standalone)",
        'if [ -n "$mbp_slurm_job_id" ]; then',
        '  nnodes="$mbp_slurm_nnodes"',
        '  case "$nnodes" in ""|*[!0-9]*) echo "mbridge-perf: SLURM_JOB_NUM_NODES=$nnodes is '
        'not a node count" >&2; exit 2;; esac',
        '  if [ "$nnodes" -gt 1 ]; then',
        '    head_node=$(scontrol show hostnames "$mbp_slurm_nodelist" | head -n 1)',
        '    rdzv=(--nnodes="$nnodes" --rdzv-backend=c10d '
        f'--rdzv-endpoint="$head_node:{profile.master_port}" --rdzv-id="$mbp_slurm_job_id")',
        "  fi",
        "  launch=(" + " ".join(_srun_words(profile)) + ")",
    ]
    local_refusal = []
    if profile.container_image:
        local_refusal.append("it runs in a container (pyxis)")
    if nodes > 1:
        local_refusal.append(f"it needs {nodes} nodes")
    if local_refusal:
        why = " and ".join(local_refusal)
        body += ["else", f"  echo {q(f'mbridge-perf: {why}: submit it through Slurm')} >&2",
                 "  exit 2"]
    body.append("fi")
    return body


VERSIONS_PREFIX = "mbridge-perf versions: "
# Distribution names per contract version key, first installed one wins (metadata only: no
# import of torch, so the probe costs a fraction of a second).
_VERSION_DISTS = {
    "torch": ["torch"],
    "megatron_core": ["megatron-core", "megatron_core"],
    "megatron_bridge": ["megatron-bridge", "megatron_bridge"],
    "transformer_engine": ["transformer-engine", "transformer_engine", "transformer-engine-cu12",
                           "transformer-engine-torch"],
    "nccl": ["nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl"],
    "cuda": ["nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime"],
}
_VERSIONS_PY = (
    "import importlib.metadata as m, json\n"
    f"out = {{}}\nfor key, dists in {json.dumps(_VERSION_DISTS)}.items():\n"
    "    for d in dists:\n"
    "        try:\n            out[key] = m.version(d)\n            break\n"
    "        except Exception:\n            pass\n"
    f"print({json.dumps(VERSIONS_PREFIX)} + json.dumps(out, sort_keys=True), flush=True)\n")


def _job_python(profile: ClusterProfile) -> str:
    """The interpreter next to the profile's torchrun (the one training imports from)."""
    first = profile.torchrun[0] if profile.torchrun else "torchrun"
    name = first.rsplit("/", 1)[-1]
    if name.startswith("python"):
        return first
    if "/" in first and name.startswith("torchrun"):
        return first.rsplit("/", 1)[0] + "/python"
    return "python3"


def _versions_probe(profile: ClusterProfile) -> list[str]:
    """One line with the library versions the job's Python has installed (where the training
    runs: inside the container under Slurm); benchmark_result reads it into the contract.
    Never fails the job."""
    return ["", "# versions: what the job's Python has installed (read into the contract)",
            f'"${{launch[@]}}" {q(_job_python(profile))} -c {q(_VERSIONS_PY)} 2>/dev/null '
            f"| head -n 1 || echo {q(VERSIONS_PREFIX + '{}')}"]


def _command_block(profile: ClusterProfile, train_cmd: list[str]) -> list[str]:
    """The torchrun command (one option per line), echoed quoted, then run."""
    return [
        "cmd=(" + " ".join(q(w) for w in profile.torchrun) + ' "${rdzv[@]}" '
        + q(f"--nproc_per_node={profile.procs_per_node}"),
        *("  " + line for line in _grouped(train_cmd)),
        ")",
        "printf 'mbridge-perf: launching:'",
        "printf ' %q' \"${launch[@]}\" \"${cmd[@]}\"",
        "echo",
        '"${launch[@]}" "${cmd[@]}"',
        "",
    ]


def render_script(cfg: TrainingConfig, profile: ClusterProfile, *, run_id: str, log_path: str,
                  recipe: str | None = None, steps: int = 50) -> str:
    """A Slurm batch script (also runnable with plain bash) for one benchmark run.

    Raises ValueError for a run id, log path, step count or config the launcher cannot take."""
    _check_run(run_id, log_path, steps)
    nodes = _nodes(cfg, profile)
    train_cmd = _training_command(cfg, profile, recipe, steps)
    env = job_env(cfg, profile)
    head = _sbatch_header(profile, run_id=run_id, log_path=log_path, nodes=nodes)
    body = [*_preamble(profile, run_id=run_id, log_path=log_path, steps=steps, env=env),
            *_launch_block(profile, nodes), *_versions_probe(profile),
            *_command_block(profile, train_cmd)]
    return "\n".join(head + body)
