"""Which environment variables a config or a tool argument may hand to a job: an ALLOWLIST.

A config's ``env`` / Bridge's ``env_vars`` is untrusted: it may come from a pasted dump, a
cloned repository or an assistant steered by text it read. Values are always quoted when
rendered, so the danger is in the *names*. A deny-list of dangerous names keeps losing the
race (``SLURM_JOB_NODELIST`` chose torchrun's rendezvous host, ``TRITON_CACHE_MANAGER`` imports
the class it names, ``UV_INDEX_URL`` / ``PIP_INDEX_URL`` / ``HF_ENDPOINT`` / ``*_PROXY`` choose
where code and credentials go, ``TMP`` / ``HF_HUB_CACHE`` choose directories, ``PET_*`` /
``MASTER_ADDR`` configure torchrun …), so only the performance settings users put in a config
pass; the user sets anything else in a cluster profile they own (``env:`` or ``setup:``), which
is trusted.

What passes (case-sensitive: the libraries read upper-case names only):

- ``ALLOWED_NAMES``: single performance knobs, each listed with what it tunes.
- ``FAMILIES``: prefixes whose members are performance knobs (NCCL, Transformer Engine,
  PyTorch's NCCL process group, NVSHMEM, cuBLAS, the cuDNN frontend, hybrid-EP), minus
  - ``FAMILY_EXCLUDED``: members named one by one, each with the reason it is excluded, and
  - ``_STRUCTURAL``: any member whose name has a word that names a file, path, directory,
    library, plugin, command, network interface or device, address, port or URL
    (``NCCL_TOPO_FILE``, ``NCCL_NET_PLUGIN``, ``NCCL_SOCKET_IFNAME``, ``NCCL_RAS_ADDR``,
    ``NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME``, ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``, …), so a
    member a future library version adds with such a name is refused too.

Everything else is refused with one message naming the variable and saying to put it in a
profile. Every name the real Megatron Bridge recipe dumps set passes (tests/bench/test_envpolicy.py
lists them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Single names, outside the families below: what each tunes.
ALLOWED_NAMES: dict[str, str] = {
    # PyTorch allocator
    "PYTORCH_CUDA_ALLOC_CONF": "CUDA caching allocator (expandable segments, split sizes)",
    "PYTORCH_ALLOC_CONF": "caching allocator (the newer, device-neutral name)",
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "turns the caching allocator off",
    "PYTORCH_NVML_BASED_CUDA_CHECK": "CUDA availability check through NVML",
    # CUDA driver / runtime performance knobs (the CUDA_* family is NOT allowed as a whole:
    # CUDA_INJECTION64_PATH loads a library, CUDA_CACHE_PATH / CUDA_COREDUMP_FILE /
    # CUDA_MPS_PIPE_DIRECTORY name files and directories, CUDA_HOME / CUDA_PATH search paths)
    "CUDA_DEVICE_MAX_CONNECTIONS": "hardware work queues (1 orders TP comm before compute)",
    "CUDA_DEVICE_MAX_COPY_CONNECTIONS": "copy-engine work queues",
    "CUDA_LAUNCH_BLOCKING": "synchronous kernel launches",
    "CUDA_MODULE_LOADING": "lazy or eager module loading",
    "CUDA_MODULE_DATA_LOADING": "lazy or eager module data loading",
    "CUDA_AUTO_BOOST": "GPU boost clocks",
    "CUDA_SCALE_LAUNCH_QUEUES": "launch queue size",
    "CUDA_CACHE_DISABLE": "JIT cache off",
    "CUDA_CACHE_MAXSIZE": "JIT cache size",
    "CUDA_FORCE_PTX_JIT": "force PTX JIT",
    "CUDA_DISABLE_PTX_JIT": "no PTX JIT",
    "CUDA_VISIBLE_DEVICES": "which local GPUs the process sees",
    "CUDA_DEVICE_ORDER": "GPU enumeration order",
    "CUDA_MANAGED_FORCE_DEVICE_ALLOC": "managed memory placement",
    "CUDA_GRAPHS_USE_NODE_PRIORITY": "CUDA graph node priorities",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "MPS SM share",
    # a family member whose name has a word _STRUCTURAL refuses, but which only switches a
    # built-in behaviour on (no code or file is named)
    "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "NCCL buffer registration of allocations",
    # TF32 and cuDNN
    "NVIDIA_TF32_OVERRIDE": "TF32 math on or off",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": "TF32 in cuBLAS matmuls",
    "TORCH_CUDNN_V8_API_ENABLED": "cuDNN v8 API",
    "TORCH_CUDNN_V8_API_LRU_CACHE_LIMIT": "cuDNN v8 plan cache size",
    # multi-node NVLink and Transformer Engine userbuffers (Megatron Bridge perf recipes)
    "USE_MNNVL": "multi-node NVLink for hybrid expert parallelism",
    "NVLINK_DOMAIN_SIZE": "GPUs per NVLink domain for hybrid expert parallelism",
    "UB_SKIPMC": "userbuffers without multicast",
    # CPU threads
    "OMP_NUM_THREADS": "OpenMP threads per process",
    "OMP_PROC_BIND": "OpenMP thread binding",
    "OMP_PLACES": "OpenMP thread places",
    "OMP_WAIT_POLICY": "OpenMP spin or sleep",
    "OMP_DYNAMIC": "OpenMP dynamic thread count",
    "MKL_NUM_THREADS": "MKL threads per process",
    "OPENBLAS_NUM_THREADS": "OpenBLAS threads per process",
}

# Prefix → what the family tunes. Members pass unless FAMILY_EXCLUDED or _STRUCTURAL refuse them.
FAMILIES: dict[str, str] = {
    "NCCL_": "NCCL collectives (algorithms, protocols, channels, NVLS, buffer sizes, debug level)",
    "TORCH_NCCL_": "PyTorch's NCCL process group (record streams, priorities, async errors)",
    "NVTE_": "Transformer Engine kernels and fusions (attention backends, FP8, SM margins)",
    "NVSHMEM_": "NVSHMEM (DeepEP) buffer sizes and IBGDA settings",
    "CUBLAS_": "cuBLAS workspace and math modes",
    "CUBLASLT_": "cuBLASLt workspace and heuristics",
    "CUDNNFE_": "cuDNN frontend kernel knobs (e.g. cluster overlap margin)",
    "NUM_OF_": "hybrid expert-parallel dispatch and combine (ranks per domain, tokens per chunk)",
}

# Family members refused by name (names _STRUCTURAL does not already catch), with the reason.
_WIRING = ("chooses the cluster's network wiring (interfaces, devices, addresses): a property "
           "of the cluster, not of the config")
FAMILY_EXCLUDED: dict[str, str] = {
    "NCCL_COMM_ID": "is the host:port every rank bootstraps through (it picks where the job's "
                    "ranks meet)",
    "NCCL_HOSTID": "overrides the host identity NCCL groups ranks by",
    "NCCL_IB_HCA": _WIRING,
    "NCCL_SOCKET_FAMILY": _WIRING,
    "NCCL_IB_ADDR_FAMILY": _WIRING,
    "NCCL_IB_ADDR_RANGE": _WIRING,
    "NCCL_IB_GID_INDEX": _WIRING,
    "NCCL_IB_ROCE_VERSION_NUM": _WIRING,
    "NCCL_NET": "chooses the network transport by name (IB, Socket or a plugin's name): "
                "cluster wiring",
    "NCCL_CONF_FILE": "names a file NCCL reads more settings from",
    "NCCL_PROXY_PROFILE": "names the file NCCL's proxy profiler writes",
    "NVSHMEM_BOOTSTRAP": "chooses how NVSHMEM ranks find each other (a plugin, MPI, a host:port)",
    "NVSHMEM_REMOTE_TRANSPORT": "names the transport library NVSHMEM loads",
    "NVSHMEM_LIBFABRIC_PROVIDER": "names the libfabric provider NVSHMEM loads",
    "NVSHMEM_IB_GID_INDEX": _WIRING,
    "NVSHMEM_IB_ADDR_FAMILY": _WIRING,
    "NVTE_DEBUG_CONFIG": "names a configuration file Transformer Engine's debug tools load",
    "CUBLAS_LOGDEST_DBG": "names the file cuBLAS logs to",
}

# Words (between underscores) that make a family member name a file, path, directory, library,
# plugin, command, network interface or device, address, port or URL; and name prefixes that
# select one (NVSHMEM_BOOTSTRAP_*). NCCL_SOCKET_NTHREADS / NCCL_CUMEM_HOST_ENABLE stay allowed:
# SOCKET and HOST alone are not in the list.
_STRUCTURAL_WORDS = frozenset({
    "FILE", "FILES", "FILENAME", "PATH", "PATHS", "DIR", "DIRS", "DIRECTORY", "HOME", "ROOT",
    "PLUGIN", "PLUGINS", "LIB", "LIBS", "LIBRARY", "LIBRARIES", "MODULE", "MODULES", "PRELOAD",
    "CMD", "COMMAND", "EXEC", "EXE", "SCRIPT", "HOOK", "HOOKS", "SHELL", "IFNAME", "HCA",
    "ADDR", "ADDRESS", "PORT", "SOCK", "URL", "URI", "ENDPOINT", "PROXY", "DEST", "HOSTNAME",
    "HOSTS", "HOSTID", "PROVIDER", "TRANSPORT", "LOGDEST",
})
_STRUCTURAL_PREFIXES = ("NVSHMEM_BOOTSTRAP_",)

# Names that decide where or how the job's processes start and meet: Slurm's own variables
# (its allocation, srun's prologs and epilogs), torchrun's (PET_*, TORCHELASTIC_*), the
# rendezvous (MASTER_ADDR / MASTER_PORT / RANK / WORLD_SIZE) and process managers.
_LAUNCHER_PREFIXES = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "SCRON_", "PET_",
                      "TORCHELASTIC_", "PMI_", "PMIX_", "OMPI_", "MPI_")
_LAUNCHER_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "GROUP_RANK",
                             "WORLD_SIZE", "LOCAL_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE",
                             "NODE_RANK", "NNODES"})

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
_MAX_SHOWN = 80


class EnvPolicyError(ValueError):
    """A variable the config may not set; the message names it and says where it belongs."""


def _family(name: str) -> str | None:
    """The longest family prefix ``name`` belongs to (TORCH_NCCL_ before NCCL_)."""
    best = None
    for prefix in FAMILIES:
        if name.startswith(prefix) and len(name) > len(prefix) and (
                best is None or len(prefix) > len(best)):
            best = prefix
    return best


def refusal(name: str) -> str | None:
    """Why ``name`` may not come from a config or a tool argument, or None if it may."""
    if not _NAME.fullmatch(name):
        return "is not an environment variable name"
    if name in ALLOWED_NAMES:
        return None
    upper = name.upper()
    if upper in _LAUNCHER_NAMES or upper.startswith(_LAUNCHER_PREFIXES):
        return ("decides where or how the job's processes start and meet (Slurm's allocation, "
                "srun's prologs, torchrun's rendezvous); only the launcher sets it")
    family = _family(name)
    if family is None:
        return ("is not one of the performance settings a config may pass to a job "
                "(NCCL_*, TORCH_NCCL_*, NVTE_*, NVSHMEM_*, CUBLAS_*, CUBLASLT_*, CUDNNFE_*, "
                "NUM_OF_* and single names such as PYTORCH_CUDA_ALLOC_CONF, "
                "CUDA_DEVICE_MAX_CONNECTIONS, USE_MNNVL, NVLINK_DOMAIN_SIZE, OMP_NUM_THREADS)")
    if name in FAMILY_EXCLUDED:
        return f"{FAMILY_EXCLUDED[name]}; excluded from the {family}* family"
    words = set(name[len(family):].split("_"))
    hit = sorted(words & _STRUCTURAL_WORDS)
    if hit or name.startswith(_STRUCTURAL_PREFIXES):
        what = hit[0] if hit else "BOOTSTRAP"
        return (f"names a file, library, plugin, command, interface, address or URL ({what}); "
                f"excluded from the {family}* family")
    return None


def check_env(env: Mapping[str, str], where: str = "env") -> None:
    """Refuse the first variable of ``env`` the allowlist does not pass. Values pass: they are
    quoted into the script and reach the job literally, whatever they contain."""
    for name in env:
        text = str(name)
        why = refusal(text)
        if why:
            shown = text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "…"
            raise EnvPolicyError(
                f"{where}.{shown}: {why}; a config or tool argument may not set it — put it in "
                "a cluster profile you own (its env: or setup: lines)")
