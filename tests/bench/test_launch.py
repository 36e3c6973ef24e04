"""Launch scripts: what lands in the job (headers, environment, overrides) and that no config
value can run as shell — checked by running the rendered script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mbridge_perf.bench.executors import submit_run, wait_run
from mbridge_perf.bench.launch import config_overrides, render_script
from mbridge_perf.bench.profile import ClusterProfile, ProfileError, load_profile
from mbridge_perf.bench.registry import Registry
from mbridge_perf.config.load import load_config

EOS = {"name": "eos", "partition": "batch", "account": "coreai_dlalgo", "gpus_per_node": 8,
       "time_limit": "00:20:00", "exclusive": True}
# A stand-in for torchrun that prints what it was given: every argument and the environment.
ECHO = ("import json, os, sys; print('ECHO ' + json.dumps({'argv': sys.argv[1:], "
        "'env': {k: v for k, v in os.environ.items() if k.startswith(('MBP_', 'PYTORCH_', "
        "'CUDA_', 'NVTE_', 'NCCL_'))}}), flush=True)")
NASTY = "$(touch pwned_dollar) `touch pwned_tick`; touch pwned_semi\ntouch pwned_newline 'q\" \\"


def cfg(**data: object):
    return load_config(data=data)


def render(config: object, profile: ClusterProfile | dict, **kw: object) -> str:
    prof = profile if isinstance(profile, ClusterProfile) else load_profile(profile)
    kw.setdefault("run_id", "0123456789abcdef")
    kw.setdefault("log_path", "/shared/runs/r1/train.log")
    return render_script(config, prof, **kw)  # type: ignore[arg-type]


def bash_syntax_ok(script: str, tmp_path: Path) -> None:
    path = tmp_path / "syntax.sh"
    path.write_text(script)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


def test_headers_env_and_overrides(tmp_path: Path) -> None:
    c = cfg(model={"tensor_model_parallel_size": 4, "sequence_parallel": True,
                   "recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
            train={"micro_batch_size": 1, "global_batch_size": 512, "train_iters": 1000},
            mixed_precision="bf16_with_mxfp8_mixed", dataset={"split": "99,1,0"},
            env={"NCCL_NVLS_ENABLE": "0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
            cluster={"num_gpus": 32, "gpus_per_node": 8})
    prof = load_profile({**EOS, "env": {"NCCL_NVLS_ENABLE": "1"}, "setup": ["module load nccl"]})
    text = render(c, prof, recipe="llama3_70b_pretrain_config", steps=50)
    bash_syntax_ok(text, tmp_path)
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=1", "#SBATCH --time=00:20:00",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --partition=batch",
                 "#SBATCH --account=coreai_dlalgo", "#SBATCH --exclusive",
                 "#SBATCH --output=/shared/runs/r1/train.log",
                 "#SBATCH --job-name=mbridge-perf-0123456789ab", "module load nccl"):
        assert line in text.splitlines()
    # env: skill defaults < config env < profile env; no NCCL_GRAPH_REGISTER without graphs
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False" in text
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" not in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text
    assert "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=1" in text
    assert "export NCCL_NVLS_ENABLE=1" in text and "NCCL_GRAPH_REGISTER" not in text
    over = config_overrides(c, 50)
    assert over == [
        "model.tensor_model_parallel_size=4", "model.sequence_parallel=true",
        "model.recompute_granularity=selective", "model.recompute_modules=[core_attn]",
        "train.micro_batch_size=1", "train.global_batch_size=512",
        "mixed_precision=bf16_with_mxfp8_mixed", "dataset.split='99,1,0'",
        "train.train_iters=50", "logger.log_interval=1", "logger.log_throughput=true"]
    assert "/opt/Megatron-Bridge/scripts/training/run_recipe.py" in text
    assert "--recipe llama3_70b_pretrain_config" in text
    assert "--nproc_per_node=8" in text and "srun --nodes=\"$nnodes\"" in text


def test_cuda_graphs_add_nccl_graph_register(tmp_path: Path) -> None:
    text = render(cfg(model={"cuda_graph_impl": "transformer_engine"}), EOS, recipe="r")
    assert "export NCCL_GRAPH_REGISTER=0" in text
    assert "model.cuda_graph_impl=transformer_engine" in text
    user_logger = cfg(logger={"log_interval": 10})
    assert "logger.log_interval=10" in config_overrides(user_logger, 5)
    assert "logger.log_interval=1" not in config_overrides(user_logger, 5)


def test_container_and_local_guard(tmp_path: Path) -> None:
    prof = {**EOS, "container_image": "nvcr.io/nvidia/nemo:26.04",
            "container_mounts": ["/lustre:/lustre", "/home/u/mb:/opt/Megatron-Bridge"],
            "srun_args": ["--mpi=pmix"]}
    text = render(cfg(), prof, recipe="r")
    bash_syntax_ok(text, tmp_path)
    assert ("--container-image=nvcr.io/nvidia/nemo:26.04 --container-mounts=/lustre:/lustre,"
            "/home/u/mb:/opt/Megatron-Bridge --no-container-mount-home --mpi=pmix") in text
    script = tmp_path / "job.sh"
    script.write_text(text)
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin"}, check=False)
    assert res.returncode == 2 and "container (pyxis): submit it through Slurm" in res.stderr


def test_log_path_outside_plain_chars_is_left_to_the_command_line() -> None:
    text = render(cfg(), EOS, recipe="r", log_path="/home/J Doe/runs/train.log")
    assert "#SBATCH --output" not in text
    assert "MBRIDGE_PERF_EXIT_FILE='/home/J Doe/runs/train.log.exitcode'" in text


@pytest.mark.parametrize(("change", "match"), [
    ({"partition": "batch\n#SBATCH --wrap=id"}, "partition"),
    ({"account": "a b"}, "account"),
    ({"time_limit": "1h"}, "time_limit"),
    ({"setup": ["echo a\necho b"]}, "setup"),
    ({"sbatch_args": ["--comment=a b"]}, "sbatch_args"),
    ({"env": {"BAD-NAME": "1"}}, "env"),
    ({"container_image": "img\nid"}, "container_image"),
    ({"launcher": "mpirun"}, "launcher"),
    ({"nodes": 0}, "nodes"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_profiles_are_refused(change: dict, match: str) -> None:
    with pytest.raises(ProfileError, match=match):
        load_profile({**EOS, **change})


def test_profile_yaml_is_read_safely(tmp_path: Path) -> None:
    path = tmp_path / "eos.yaml"
    path.write_text("partition: batch\ngpus_per_node: 8\nsetup:\n  - source /opt/env.sh\n")
    prof = load_profile(path)
    assert (prof.name, prof.partition, prof.setup) == ("eos", "batch", ["source /opt/env.sh"])
    path.write_text("name: x\npartition: !!python/object/apply:os.system ['touch pwned']\n")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(path)
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ProfileError, match=r"no profile named 'gpu-big'.*cpu-test"):
        load_profile("gpu-big")
    assert load_profile("cpu-test").launcher == "cpu-gpt"


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"run_id": "abc; rm"}, "run_id"),
    ({"log_path": "/tmp/a\nb"}, "log_path"),
    ({"steps": 0}, "steps"),
    ({"recipe": None}, "needs a recipe"),
])
def test_bad_render_arguments(kwargs: dict, match: str) -> None:
    kwargs.setdefault("recipe", "r")
    with pytest.raises(ValueError, match=match):
        render(cfg(), EOS, **kwargs)


def test_bad_configs_for_the_launchers() -> None:
    with pytest.raises(ValueError, match="not an environment variable name"):
        render(cfg(env={"A B": "1"}), EOS, recipe="r")
    with pytest.raises(ValueError, match="num_gpus 12 is not a multiple"):
        render(cfg(cluster={"num_gpus": 12}), EOS, recipe="r")
    with pytest.raises(ValueError, match="gpus_per_node is 4 but profile 'eos' has 8"):
        render(cfg(cluster={"gpus_per_node": 4}), EOS, recipe="r")
    with pytest.raises(ValueError, match=r"TP/SP/DP only.*pipeline_model_parallel_size"):
        render(cfg(model={"pipeline_model_parallel_size": 2}), "cpu-test")
    with pytest.raises(ValueError, match="does not divide"):
        render(cfg(model={"tensor_model_parallel_size": 4}), "cpu-test")


def test_cpu_test_profile_runs_the_workload_with_the_configs_shape(tmp_path: Path) -> None:
    c = cfg(model={"tensor_model_parallel_size": 2, "sequence_parallel": False,
                   "num_layers": 3, "hidden_size": 96, "seq_length": 32},
            train={"micro_batch_size": 1})
    text = render(c, "cpu-test", steps=7)
    bash_syntax_ok(text, tmp_path)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    assert f"cmd=({torchrun} \"${{rdzv[@]}}\" --nproc_per_node=2" in text
    for words in ("-m mbridge_perf.bench.workloads.cpu_gpt", "--steps 7", "--tp 2", "--no-sp",
                  "--layers 3", "--hidden 96", "--seq 32", "--mbs 1"):
        assert f"  {words}\n" in text


def test_injection_reaches_the_job_literally(tmp_path: Path) -> None:
    """A config value with $(…), backticks, ';', quotes and a newline — in an env value, a
    carried Bridge field and the recipe name — arrives in the job as that exact string, and
    nothing in it runs."""
    work = tmp_path / "work"
    work.mkdir()
    prof = load_profile({"name": "echo", "executor": "local", "torchrun": [sys.executable, "-c",
                                                                          ECHO],
                         "workdir": str(work), "log_dir": str(tmp_path / "runs"),
                         "env": {"MBP_PROFILE": NASTY}})
    c = cfg(env={"NCCL_ALGO": NASTY}, dataset={"data_path": NASTY},
            model={"tensor_model_parallel_size": 2})
    reg = Registry(tmp_path / "runs.sqlite3")
    run = submit_run(reg, c, prof, recipe=NASTY, steps=3)
    run = wait_run(reg, run.id, timeout_s=60, poll_s=0.1)
    log = Path(run.log_path or "").read_text()
    assert run.state == "completed", (run.message, log)
    echoed = json.loads(next(line for line in log.splitlines()
                             if line.startswith("ECHO "))[5:])
    assert echoed["env"]["NCCL_ALGO"] == NASTY and echoed["env"]["MBP_PROFILE"] == NASTY
    argv = echoed["argv"]
    assert argv[argv.index("--recipe") + 1] == NASTY
    hydra = "'" + NASTY.replace("\\", "\\\\").replace("'", "\\'") + "'"
    assert f"dataset.data_path={hydra}" in argv
    assert "model.tensor_model_parallel_size=2" in argv and "train.train_iters=3" in argv
    assert argv[:2] == ["--standalone", "--nproc_per_node=1"]
    leaked = [p.name for d in (tmp_path, work, tmp_path / "runs" / run.id, Path.cwd())
              for p in d.glob("pwned*")]
    assert leaked == []


# ------------------------------------------------------------------ the rendezvous (issue 23)

ATTACK = ["env.SLURM_JOB_NODELIST=attacker.example.com", "env.SLURM_JOB_NUM_NODES=2"]


@pytest.mark.parametrize("overrides", [ATTACK, ["env.SLURM_TASK_PROLOG=/tmp/x.sh"],
                                       ["env.SLURM_PROLOG=/tmp/x.sh"],
                                       ["env.SLURM_EPILOG=/tmp/x.sh"],
                                       ["env.SLURM_TASK_EPILOG=/tmp/x.sh"],
                                       ["env.MASTER_ADDR=attacker.example.com"],
                                       ["env.PET_RDZV_ENDPOINT=attacker.example.com:29500"]])
def test_a_config_cannot_render_slurm_or_rendezvous_names(overrides: list[str]) -> None:
    c = load_config(data={"model": {"tensor_model_parallel_size": 1}}, overrides=overrides)
    with pytest.raises(ValueError, match=r"env\.(SLURM_|MASTER_ADDR|PET_).*only the launcher"):
        render(c, EOS, recipe="llama3_8b_pretrain_config")


def test_slurms_view_is_read_before_any_environment_is_exported() -> None:
    prof = load_profile({**EOS, "env": {"NCCL_NVLS_ENABLE": "1"}})
    text = render(cfg(env={"NCCL_ALGO": "Ring"}, cluster={"num_gpus": 16}), prof,
                  recipe="llama3_8b_pretrain_config")
    lines = text.splitlines()
    first_export = next(i for i, line in enumerate(lines)
                        if line.startswith("export ") and "MBRIDGE_PERF_RUN_ID" not in line)
    reads = [i for i, line in enumerate(lines) if "$SLURM_" in line or "${SLURM_" in line]
    assert reads and all(i < first_export for i in reads), "\n".join(
        lines[i] for i in reads)
    assert "export SLURM_" not in text
    assert '--rdzv-endpoint="$head_node:29500"' in text
    assert 'scontrol show hostnames "$mbp_slurm_nodelist"' in text


def _fake_slurm_bin(tmp_path: Path) -> Path:
    """`srun` that drops its options and runs the command; `scontrol show hostnames` that
    expands the real allocation's `node[1-2]` and echoes anything else back."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ $# -gt 0 && $1 == --* ]]; do shift; '
                                  'done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text('#!/bin/bash\nif [ "$3" = "node[1-2]" ]; then '
                                      "printf 'node1\\nnode2\\n'; else echo \"$3\"; fi\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir


def test_a_profile_env_cannot_move_the_rendezvous(tmp_path: Path) -> None:
    """Run under a (faked) two-node allocation: even SLURM_* names in the user's own profile
    env are exported only after the launch read Slurm's values, so torchrun meets at node1."""
    prof = load_profile({"name": "two", "executor": "slurm", "launcher": "cpu-gpt",
                         "nproc_per_node": 1, "nodes": 2,
                         "torchrun": [sys.executable, "-c", ECHO],
                         "env": {"SLURM_JOB_NODELIST": "attacker.example.com",
                                 "SLURM_JOB_NUM_NODES": "5", "SLURM_JOB_ID": "666"}})
    script = tmp_path / "job.sh"
    script.write_text(render(cfg(), prof, log_path=str(tmp_path / "train.log"), steps=3))
    env = {**os.environ, "PATH": f"{_fake_slurm_bin(tmp_path)}:{os.environ['PATH']}",
           "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}
    res = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    echoed = json.loads(next(line for line in res.stdout.splitlines()
                             if line.startswith("ECHO "))[5:])
    argv = echoed["argv"]
    assert argv[:4] == ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node1:29500",
                        "--rdzv-id=77"], argv
    assert "attacker" not in res.stdout


# ------------------------------------------------------------------ versions (issue 23)

def test_the_job_reports_its_library_versions_into_the_contract(tmp_path: Path) -> None:
    """The script prints the versions the job's Python has installed (where it trains: its
    torchrun's interpreter); the result fills the contract's unrecorded versions from that
    line, keeps what was given, and names what stays unknown."""
    import importlib.metadata as md

    from mbridge_perf.bench import service
    from mbridge_perf.bench.contract import MeasurementContract

    prof = load_profile({"name": "echo", "executor": "local", "launcher": "cpu-gpt",
                         "nproc_per_node": 1, "torchrun": [sys.executable, "-c", ECHO],
                         "log_dir": str(tmp_path / "runs")})
    reg = Registry(tmp_path / "runs.sqlite3")
    run = wait_run(reg, submit_run(reg, cfg(), prof, steps=3).id, timeout_s=60, poll_s=0.1)
    log = Path(run.log_path or "")
    line = next(x for x in log.read_text().splitlines() if x.startswith("mbridge-perf versions:"))
    reported = service.reported_versions(log)
    assert reported["torch"] == md.version("torch") and reported["torch"] in line
    handle = service.submit(cfg(), load_profile({**EOS, "container_image": "nvcr.io/x:1"}),
                            recipe="r", versions={"megatron_core": "given"})
    contract = MeasurementContract.model_validate(handle.contract)
    filled, _ = service.with_reported_versions(contract, log)
    assert filled.versions.torch == md.version("torch")
    assert filled.versions.megatron_core == "given" and filled.versions.container == "nvcr.io/x:1"
    assert filled.versions.megatron_bridge is None  # not installed here: stays unknown
    forged = tmp_path / "forged.log"  # junk values never land in a contract
    forged.write_text('mbridge-perf versions: {"torch": "$(reboot)", "container": "x", '
                      '"shell": "1", "nccl": "2.27.3"}\n')
    assert service.reported_versions(forged) == {"nccl": "2.27.3"}
    (tmp_path / "bad.log").write_text("mbridge-perf versions: [1, 2\n")
    assert service.reported_versions(tmp_path / "bad.log") == {}
    assert service.reported_versions(tmp_path / "missing.log") == {}
