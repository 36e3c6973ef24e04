"""The environment policy (which variables a config may hand a job) and the contract's record
of the profile (image, environment, setup lines), so two differently-started runs are never
called an A/B of one variable."""

from __future__ import annotations

from pathlib import Path
from shlex import quote

import pytest

from bridge_corpus import dump_texts, dumps
from mbridge_perf.bench import service
from mbridge_perf.bench.contract import MeasurementContract
from mbridge_perf.bench.envpolicy import EnvPolicyError, check_env, refusal
from mbridge_perf.bench.logparse import parse_log
from mbridge_perf.bench.profile import load_profile
from mbridge_perf.bench.result import compare, evaluate_run
from mbridge_perf.config.load import load_config

FIXTURES = Path(__file__).parent / "fixtures"
# Every env_vars name the real Megatron Bridge 0.6.2 recipe dumps set (tests/data corpus)
BRIDGE_ENV_NAMES = sorted({name for d in dumps().values() for name in d.get("env_vars") or {}})
LAUNCH_NAMES = ["CUDA_DEVICE_MAX_CONNECTIONS", "NVTE_ALLOW_NONDETERMINISTIC_ALGO",
                "NCCL_GRAPH_REGISTER", "PYTORCH_CUDA_ALLOC_CONF", "OMP_NUM_THREADS",
                "NCCL_DEBUG", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME",
                "TORCH_NCCL_AVOID_RECORD_STREAMS",
                "CUDA_VISIBLE_DEVICES", "NVTE_FUSED_ATTN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE",
                "WANDB_MODE"]

EOS = load_profile({"name": "eos", "executor": "slurm", "partition": "batch",
                    "gpus_per_node": 8})

BLOCKED = {
    "shell hooks": ["BASH_ENV", "ENV", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "IFS", "CDPATH"],
    "loader": ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "ld_preload", "DYLD_INSERT_LIBRARIES",
               "GLIBC_TUNABLES", "GCONV_PATH"],
    "interpreters": ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONWARNINGS", "PYTHONHOME",
                     "PERL5OPT", "PERL5LIB", "NODE_OPTIONS", "RUBYOPT", "JAVA_TOOL_OPTIONS"],
    "search paths": ["PATH", "CUDA_PATH", "MANPATH", "TRITON_LIBCUDA_PATH"],
    "files, dirs, plugins": ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_TOPO_FILE",
                             "NCCL_GRAPH_FILE", "CUDA_INJECTION64_PATH", "NCCL_DEBUG_FILE",
                             "TORCHINDUCTOR_CACHE_DIR", "HF_HOME", "TMPDIR", "SSL_CERT_FILE",
                             "NVSHMEM_BOOTSTRAP_PLUGIN", "SOME_TOOL_LIBRARY"],
    "commands": ["GIT_SSH_COMMAND", "EDITOR", "PAGER", "SSH_ASKPASS", "LESSOPEN",
                 "MY_HELPER_CMD"],
    "not a name": ["A-B", "1X", "X Y", "BASH_FUNC_x%%"],
}


def test_the_corpus_names_are_the_real_ones() -> None:
    assert len(BRIDGE_ENV_NAMES) >= 20
    for name in ("USE_MNNVL", "NVLINK_DOMAIN_SIZE", "CUBLAS_WORKSPACE_CONFIG"):
        assert name in BRIDGE_ENV_NAMES
    assert any(n.startswith("NUM_OF_") for n in BRIDGE_ENV_NAMES)
    assert any(n.startswith("CUDNNFE_") for n in BRIDGE_ENV_NAMES)


@pytest.mark.parametrize("name", BRIDGE_ENV_NAMES + LAUNCH_NAMES)
def test_every_performance_name_passes(name: str) -> None:
    assert refusal(name) is None


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, names in BLOCKED.items()
                                            for n in names])
def test_every_hook_class_is_refused_naming_the_variable(kind: str, name: str) -> None:
    assert refusal(name), kind
    with pytest.raises(EnvPolicyError) as info:
        check_env({"NCCL_ALGO": "Ring", name: "x"})
    assert f"env.{name}:" in str(info.value)
    if kind != "not a name":
        assert "cluster profile you own" in str(info.value)


def test_every_corpus_name_set_at_once_reaches_the_job() -> None:
    env_vars = {name: f"v{i}" for i, name in enumerate(BRIDGE_ENV_NAMES)}
    cfg = load_config(preset="llama3-8b", data={"env_vars": env_vars})
    handle = service.submit(cfg, EOS, recipe="llama3_8b_pretrain_config")
    for name, value in env_vars.items():
        assert f"export {name}={value}\n" in handle.script
        assert handle.contract["environment"][name] == value  # all of them affect speed


def test_a_job_rendered_from_a_real_dump_keeps_its_env_vars() -> None:
    name, text = max(dump_texts().items(), key=lambda kv: len(dumps()[kv[0]]["env_vars"] or {}))
    env_vars = dumps()[name]["env_vars"]
    assert len(env_vars) >= 5, name
    handle = service.submit(load_config(text=text), EOS, recipe=name)
    for var, value in env_vars.items():
        assert f"export {var}={quote(str(value))}\n" in handle.script, var


# ------------------------------------------------------------------ the contract and the profile

BASE = {"name": "a", "executor": "slurm", "partition": "batch", "gpus_per_node": 8,
        "container_image": "nvcr.io/nvidia/nemo:26.04", "env": {"NCCL_ALGO": "Ring"},
        "setup": ["source /lustre/envs/nccl.sh"]}
CHANGED = {"container_image": "nvcr.io/nvidia/nemo:26.06", "env": {
    "NCCL_ALGO": "Tree", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
    "setup": ["source /lustre/envs/nccl-2.27.sh"]}


def _contract(**profile: object) -> MeasurementContract:
    cfg = load_config(preset="llama3-8b",
                      overrides=["cluster.num_gpus=8", "train.global_batch_size=8"])
    handle = service.submit(cfg, load_profile({**BASE, **profile}),
                            recipe="llama3_8b_pretrain_config")
    return MeasurementContract.model_validate(handle.contract)


def test_the_contract_records_image_environment_and_setup() -> None:
    c = _contract()
    assert c.versions.container == "nvcr.io/nvidia/nemo:26.04"
    assert c.environment["NCCL_ALGO"] == "Ring"
    assert c.environment["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"  # launcher's
    assert c.job.setup_sha256 and len(c.job.setup_sha256) == 64
    assert _contract(name="b") == c  # the profile's name alone changes nothing


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_each_profile_difference_is_a_contract_variable(field: str) -> None:
    a, b = _contract(), _contract(**{field: CHANGED[field]})
    assert a != b


def test_compare_refuses_runs_started_from_different_profiles() -> None:
    ca, cb = _contract(), _contract(**CHANGED)
    ra = evaluate_run(parse_log(FIXTURES / "clean_60.log"), ca)
    rb = evaluate_run(parse_log(FIXTURES / "clean_60.log"), cb)
    c = compare((ca, ra), (cb, rb))
    assert not c.valid
    reason = " ".join(c.reasons)
    for name in ("versions.container", "environment.NCCL_ALGO",
                 "environment.PYTORCH_CUDA_ALLOC_CONF", "job.setup_sha256"):
        assert name in reason
