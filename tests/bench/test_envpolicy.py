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
from mbridge_perf.bench.envpolicy import (
    ALLOWED_NAMES,
    FAMILIES,
    FAMILY_EXCLUDED,
    EnvPolicyError,
    check_env,
    refusal,
)
from mbridge_perf.bench.logparse import parse_log
from mbridge_perf.bench.profile import load_profile
from mbridge_perf.bench.result import compare, evaluate_run
from mbridge_perf.config.load import load_config

FIXTURES = Path(__file__).parent / "fixtures"
# Every env name the real Megatron Bridge 0.6.2 recipe dumps set (tests/data corpus): `env_vars`
# (Bridge's name, mapped to TrainingConfig.env by config.load) and `env` (ours) of every dump.
CORPUS_ENV_NAMES = sorted({name for d in dumps().values() for section in ("env_vars", "env")
                           for name in d.get(section) or {}})
# ... written out, so a corpus change that adds a name is a visible diff here: every one of
# them is a performance knob and must pass the allowlist.
BRIDGE_ENV_NAMES = [
    "CUBLAS_WORKSPACE_CONFIG", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDNNFE_CLUSTER_OVERLAP_MARGIN",
    "NCCL_ALGO", "NCCL_CTA_POLICY", "NCCL_GRAPH_REGISTER", "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_NVLS_ENABLE", "NCCL_P2P_NET_CHUNKSIZE", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
    "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "NVLINK_DOMAIN_SIZE",
    "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "NVTE_BWD_LAYERNORM_SM_MARGIN", "NVTE_CPU_OFFLOAD_V1",
    "NVTE_CUTEDSL_FUSED_GROUPED_MLP", "NVTE_DPA_FP8_FORMAT", "NVTE_DPA_FP8_RECIPE",
    "NVTE_FWD_LAYERNORM_SM_MARGIN", "NVTE_NORM_BWD_USE_CUDNN", "NVTE_NORM_FWD_USE_CUDNN",
    "NVTE_USE_FAST_MATH", "PYTORCH_CUDA_ALLOC_CONF", "TORCH_NCCL_AVOID_RECORD_STREAMS",
    "TORCH_NCCL_HIGH_PRIORITY", "USE_MNNVL"]
# Other performance knobs users set in a config (members of the families and single names)
LAUNCH_NAMES = ["NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_PROTO", "NCCL_MIN_NCHANNELS",
                "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_CUMEM_HOST_ENABLE",
                "NCCL_BUFFSIZE", "NCCL_NVLS_CHUNKSIZE", "NCCL_IB_SL", "NCCL_IB_TIMEOUT",
                "NCCL_NET_GDR_LEVEL", "NCCL_P2P_LEVEL", "NCCL_MNNVL_ENABLE",
                "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                "NVTE_FUSED_ATTN", "NVTE_FLASH_ATTN", "NVTE_DEBUG", "NVSHMEM_SYMMETRIC_SIZE",
                "NVSHMEM_IBGDA_NUM_RC_PER_PE", "NVSHMEM_DISABLE_CUDA_VMM",
                "CUBLASLT_WORKSPACE_SIZE", "PYTORCH_ALLOC_CONF", "OMP_NUM_THREADS",
                "CUDA_VISIBLE_DEVICES", "CUDA_MODULE_LOADING", "CUDA_LAUNCH_BLOCKING",
                "NVIDIA_TF32_OVERRIDE", "UB_SKIPMC", "NVTE_DPA_FP8CS_O_in_F16",
                "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK"]

EOS = load_profile({"name": "eos", "executor": "slurm", "partition": "batch",
                    "gpus_per_node": 8})

BLOCKED = {
    "shell hooks": ["BASH_ENV", "ENV", "PROMPT_COMMAND", "PS4", "SHELLOPTS", "IFS", "CDPATH"],
    "loader": ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "ld_preload", "DYLD_INSERT_LIBRARIES",
               "GLIBC_TUNABLES", "GCONV_PATH"],
    "interpreters": ["PYTHONPATH", "PYTHONSTARTUP", "PYTHONWARNINGS", "PYTHONHOME",
                     "PERL5OPT", "PERL5LIB", "NODE_OPTIONS", "RUBYOPT", "JAVA_TOOL_OPTIONS"],
    "search paths": ["PATH", "CUDA_PATH", "CUDA_HOME", "MANPATH", "TRITON_LIBCUDA_PATH"],
    "files, dirs, plugins": ["CUDA_INJECTION64_PATH", "CUDA_CACHE_PATH", "CUDA_COREDUMP_FILE",
                             "CUDA_MPS_PIPE_DIRECTORY", "TORCHINDUCTOR_CACHE_DIR", "HF_HOME",
                             "TMPDIR", "SSL_CERT_FILE", "SOME_TOOL_LIBRARY",
                             "OMP_TOOL_LIBRARIES"],
    "commands": ["GIT_SSH_COMMAND", "EDITOR", "PAGER", "SSH_ASKPASS", "LESSOPEN",
                 "MY_HELPER_CMD"],
    # the rendezvous and what srun runs (issue 23, High 1)
    "Slurm and torchrun": ["SLURM_JOB_NODELIST", "SLURM_JOB_NUM_NODES", "SLURM_NODELIST",
                           "SLURM_NNODES", "SLURM_JOB_ID", "SLURM_TASK_PROLOG", "SLURM_PROLOG",
                           "SLURM_EPILOG", "SLURM_TASK_EPILOG", "SLURM_CONF", "SLURM_CPU_BIND",
                           "slurm_job_nodelist", "Slurm_Task_Prolog", "SBATCH_EXPORT",
                           "SRUN_EXPORT_ENV", "SALLOC_PARTITION", "MASTER_ADDR", "MASTER_PORT",
                           "master_addr", "WORLD_SIZE", "RANK", "LOCAL_RANK",
                           "PET_RDZV_ENDPOINT", "PET_MASTER_ADDR", "PET_NNODES",
                           "TORCHELASTIC_RUN_ID", "PMIX_MCA_ptl", "OMPI_MCA_plm_rsh_agent"],
    # names that choose code, files, hosts or where credentials go (issue 23, Medium 3)
    "temp dirs": ["TMP", "TEMP", "TMPDIR", "tmp", "TEMPDIR"],
    "code by name": ["TRITON_CACHE_MANAGER", "TRITON_HOME", "TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE",
                     "TORCH_COMPILE_DEBUG"],
    "package indexes": ["UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX",
                        "UV_PYTHON", "UV_PROJECT", "UV_FIND_LINKS", "PIP_INDEX_URL",
                        "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "pip_index_url",
                        "CONDA_CHANNELS"],
    "endpoints and proxies": ["HF_ENDPOINT", "WANDB_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY",
                              "https_proxy", "ALL_PROXY", "NO_PROXY", "FTP_PROXY",
                              "MLFLOW_TRACKING_URI", "REQUESTS_CA_BUNDLE"],
    "caches and remote code": ["HF_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_DATASETS_CACHE",
                               "HF_DATASETS_TRUST_REMOTE_CODE", "HF_HUB_OFFLINE",
                               "TRANSFORMERS_OFFLINE", "WANDB_MODE", "WANDB_API_KEY",
                               "HF_TOKEN"],
    "container binds": ["APPTAINER_BIND", "SINGULARITY_BIND", "APPTAINERENV_LD_PRELOAD",
                        "SINGULARITYENV_PATH", "ENROOT_MOUNT_HOME", "NVIDIA_VISIBLE_DEVICES"],
    "tracing to files": ["TORCH_TRACE", "TORCH_LOGS_OUT", "TORCH_LOGS", "NSYS_OUTPUT"],
    # family members that name files, plugins, hosts, sockets or interfaces
    "NCCL exclusions": ["NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN",
                        "NCCL_ENV_PLUGIN", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE",
                        "NCCL_CONF_FILE", "NCCL_DEBUG_FILE", "NCCL_TOPO_DUMP_FILE",
                        "NCCL_GRAPH_DUMP_FILE", "NCCL_SOCKET_IFNAME", "NCCL_OOB_NET_IFNAME",
                        "NCCL_IB_HCA", "NCCL_COMM_ID", "NCCL_HOSTID", "NCCL_RAS_ADDR",
                        "NCCL_SOCKET_FAMILY", "NCCL_IB_ADDR_RANGE", "NCCL_IB_GID_INDEX",
                        "NCCL_NET", "NCCL_FUTURE_THING_PATH", "NCCL_", "nccl_algo",
                        "NCCL_PROXY_PROFILE", "NCCL_TUNER_CONFIG_FILE",
                        "TORCH_NCCL_SOME_HOOK"],
    "other family exclusions": ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "NVSHMEM_BOOTSTRAP",
                                "NVSHMEM_BOOTSTRAP_PLUGIN", "NVSHMEM_BOOTSTRAP_UID_SESSION_ID",
                                "NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "NVSHMEM_REMOTE_TRANSPORT",
                                "NVSHMEM_HCA_LIST", "NVSHMEM_DEBUG_FILE", "NVTE_DEBUG_CONFIG",
                                "NVTE_CUDA_INCLUDE_PATH", "CUBLAS_LOGDEST_DBG",
                                "CUBLASLT_LOG_FILE", "CUDNNFE_LOG_FILE", "NUM_OF_HOSTS"],
    "not a name": ["A-B", "1X", "X Y", "BASH_FUNC_x%%", "", "X" * 300],
}


def test_the_corpus_names_are_the_real_ones() -> None:
    assert CORPUS_ENV_NAMES == BRIDGE_ENV_NAMES
    for name in ("USE_MNNVL", "NVLINK_DOMAIN_SIZE", "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN",
                 "NUM_OF_TOKENS_PER_CHUNK_COMBINE_API", "CUDNNFE_CLUSTER_OVERLAP_MARGIN"):
        assert name in BRIDGE_ENV_NAMES


@pytest.mark.parametrize("name", BRIDGE_ENV_NAMES + LAUNCH_NAMES)
def test_every_performance_name_passes(name: str) -> None:
    assert refusal(name) is None
    check_env({name: "1"})


@pytest.mark.parametrize(("kind", "name"), [(k, n) for k, names in BLOCKED.items()
                                            for n in names])
def test_everything_else_is_refused_naming_the_variable(kind: str, name: str) -> None:
    assert refusal(name), kind
    with pytest.raises(EnvPolicyError) as info:
        check_env({"NCCL_ALGO": "Ring", name: "x"})
    text = str(info.value)
    assert f"env.{name[:80]}" in text and "\n" not in text
    if kind != "not a name":
        assert "cluster profile you own" in text


def test_the_refusal_says_why_by_class() -> None:
    assert "only the launcher sets it" in (refusal("SLURM_JOB_NODELIST") or "")
    assert "only the launcher sets it" in (refusal("PET_RDZV_ENDPOINT") or "")
    assert "excluded from the NCCL_* family" in (refusal("NCCL_SOCKET_IFNAME") or "")
    assert "excluded from the NCCL_* family" in (refusal("NCCL_IB_HCA") or "")
    assert "performance settings" in (refusal("TRITON_CACHE_MANAGER") or "")


def test_every_documented_exclusion_is_refused_and_every_family_has_members() -> None:
    for name, why in FAMILY_EXCLUDED.items():
        assert why and refusal(name), name
    for prefix in FAMILIES:
        assert any(n.startswith(prefix) for n in BRIDGE_ENV_NAMES + LAUNCH_NAMES), prefix
    for name, what in ALLOWED_NAMES.items():
        assert what and refusal(name) is None, name


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
