"""Which environment variables a config or a tool argument may hand to a job.

A config's ``env`` / Bridge's ``env_vars`` is untrusted: it may come from a pasted dump, a
cloned repository or an assistant steered by text it read. Values are always quoted when
rendered, so the danger is in the *names*: variables that make a shell, the dynamic loader,
an interpreter or a library run code, search a path, or load a file or plugin. Those classes
are refused here whatever their prefix; the user sets them in a cluster profile they own
(``env:`` or ``setup:``), which is trusted. Everything else passes — performance knobs come
with every kind of name (``NCCL_*``, ``NVTE_*``, ``USE_MNNVL``, ``NUM_OF_*``, ``CUDNNFE_*``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Exact names: shell start-up and prompt hooks, shell parsing state, loader and interpreter
# hooks, and tools that run a command named by a variable.
_HOOKS = frozenset({
    "BASH_ENV", "ENV", "SHELLOPTS", "BASHOPTS", "PROMPT_COMMAND", "PS0", "PS1", "PS2", "PS4",
    "IFS", "CDPATH", "GLOBIGNORE", "HISTFILE", "INPUTRC", "ZDOTDIR", "SHELL", "HOME",
    "NODE_OPTIONS", "NODE_PATH", "RUBYOPT", "RUBYLIB", "PERLLIB", "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS", "CLASSPATH", "GLIBC_TUNABLES", "GCONV_PATH",
    "LOCPATH", "NLSPATH", "HOSTALIASES", "RESOLV_CONF", "TMPDIR", "TZDIR", "OPENSSL_CONF",
    "OPENSSL_ENGINES", "KRB5_CONFIG", "CONFIG_SITE", "EDITOR", "VISUAL", "PAGER", "BROWSER",
    "LESSOPEN", "LESSCLOSE", "MANPAGER", "TERMINFO", "MAIL", "MAILPATH", "PATH",
    "CUDA_INJECTION64_PATH", "CUDA_INJECTION32_PATH", "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN", "NCCL_TOPO_FILE", "NCCL_GRAPH_FILE", "NCCL_CONF_FILE",
    "TORCH_CUDA_ARCH_LIST_FILE", "PYTORCH_JIT_LOG_LEVEL", "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR", "NVTE_DEBUG_CONFIG", "SLURM_CONF", "SBATCH_EXPORT",
})

# Prefixes: whole families that hook a loader or an interpreter, or exported shell functions.
_HOOK_PREFIXES = ("LD_", "DYLD_", "PYTHON", "PERL5", "PERLIO", "BASH_FUNC_", "GIT_",
                  "SSH_", "SUDO_", "XDG_", "SBATCH_", "SRUN_", "SALLOC_", "PMIX_MCA_", "OMPI_MCA_")

# Suffixes: anything that names a search path, a file, a directory, a library or plugin to
# load, or a command to run.
_PATH_SUFFIX = re.compile(
    r"(PATH|PATHS|_DIR|_DIRS|DIR|_HOME|_ROOT|_FILE|_FILES|_FILENAME|_PLUGIN|_PLUGINS|_LIB|"
    r"_LIBS|_LIBRARY|_LIBRARIES|_MODULE|_MODULES|_PRELOAD|_COMMAND|_CMD|_EXEC|_EXE|_SHELL|"
    r"_SCRIPT|_HOOK|_HOOKS|_ASKPASS|ASKPASS|_OPTIONS|_OPTS|_SOCKET|_CONFIG_FILE|_CERT|"
    r"_BUNDLE|_EDITOR)$")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EnvPolicyError(ValueError):
    """A variable the config may not set; the message names it and says where it belongs."""


def refusal(name: str) -> str | None:
    """Why ``name`` may not come from a config or a tool argument, or None if it may."""
    if not _NAME.fullmatch(name):
        return "is not an environment variable name"
    upper = name.upper()
    if upper in _HOOKS or upper.startswith(_HOOK_PREFIXES):
        return ("is a shell, loader or interpreter hook (it can make the job run code or "
                "read a file of someone else's choosing)")
    if _PATH_SUFFIX.search(upper):
        return ("names a search path, file, directory, library, plugin or command (it "
                "decides what the job loads or runs)")
    return None


def check_env(env: Mapping[str, str], where: str = "env") -> None:
    """Refuse the first variable of ``env`` the policy blocks. Values pass: they are quoted
    into the script and reach the job literally, whatever they contain."""
    for name in env:
        why = refusal(str(name))
        if why:
            raise EnvPolicyError(
                f"{where}.{name}: {why}; a config or tool argument may not set it — put it in "
                "a cluster profile you own (its env: or setup: lines)")
