"""Megatron Bridge perf-harness flags (scripts/performance/setup_experiment.py) → overrides.

Each flag rewrites the training config the way the harness does (e.g. `-tp N` also sets
`sequence_parallel = N > 1`; `-rl N` means full/block recompute of N layers), so a pasted
launch command validates like the run it starts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mbridge_perf.config.errors import ConfigError, did_you_mean
from mbridge_perf.config.overrides import parse_override

Overrides = list[tuple[list[str], Any]]


def _int(flag: str, value: str, allow_none: bool = False) -> int | None:
    if allow_none and value.lower() in ("none", "null"):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(flag, f"expected a whole number, got {value!r}") from None


def _bool(flag: str, value: str) -> bool:
    low = value.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    raise ConfigError(flag, f"expected true or false, got {value!r}")


def _size(path: str, *, sp: bool = False, allow_none: bool = False
          ) -> Callable[[str, str], Overrides]:
    def apply(flag: str, value: str) -> Overrides:
        n = _int(flag, value, allow_none)
        if n == -1:  # harness: keep the recipe's value
            return []
        out: Overrides = [(path.split("."), n)]
        if sp and n is not None:
            out.append((["model", "sequence_parallel"], n > 1))
        return out
    return apply


def _compute_dtype(flag: str, value: str) -> Overrides:
    from mbridge_perf.config.derived import MIXED_PRECISION_RECIPES

    recipes = {"bf16": "bf16_mixed", "fp8_cs": "bf16_with_fp8_current_scaling_mixed",
               "fp8_mx": "bf16_with_mxfp8_mixed",
               "fp8_sc": "bf16_with_fp8_subchannel_scaling_mixed",
               "fp8_ds": "bf16_with_fp8_delayed_scaling_mixed", "nvfp4": "bf16_with_nvfp4_mixed"}
    if value not in recipes:
        raise ConfigError(flag, f"got {value!r}; expected one of {', '.join(recipes)}")
    section = dict(MIXED_PRECISION_RECIPES[recipes[value]])
    if value == "fp8_cs":  # the harness turns the BF16 first/last layers off
        section["first_last_layers_bf16"] = False
    if value == "fp8_mx":
        section["reuse_grad_buf_for_mxfp8_param_ag"] = True
    return [(["mixed_precision"], section)]


def _cuda_graph_impl(flag: str, value: str) -> Overrides:
    if value not in ("none", "local", "transformer_engine"):
        raise ConfigError(flag, f"got {value!r}; expected none, local or transformer_engine")
    out: Overrides = [(["model", "cuda_graph_impl"], value)]
    if value != "none":
        out.append((["model", "use_te_rng_tracker"], True))
    return out


def _cuda_graph_scope(flag: str, value: str) -> Overrides:
    scopes = [s for s in value.split(",") if s]
    if "full_iteration" in scopes:
        if len(scopes) > 1:
            raise ConfigError(flag, "full_iteration cannot be combined with other scopes")
        return [(["model", "cuda_graph_impl"], "full_iteration"),
                (["model", "cuda_graph_modules"], []),
                (["rerun_state_machine", "check_for_nan_in_loss"], False)]
    return [(["model", "cuda_graph_modules"], scopes)]


def _a2a_overlap(flag: str, value: str) -> Overrides:
    on = _bool(flag, value)
    if not on:
        return [(["comm_overlap", "overlap_moe_expert_parallel_comm"], False)]
    return [(["comm_overlap", "overlap_moe_expert_parallel_comm"], True),
            (["comm_overlap", "delay_wgrad_compute"], True),
            (["model", "moe_shared_expert_overlap"], False)]


def _flex_backend(flag: str, value: str) -> Overrides:
    if value.lower() in ("none", "null"):
        return []
    if value not in ("deepep", "hybridep"):
        raise ConfigError(flag, f"got {value!r}; expected deepep, hybridep or None")
    return [(["model", "moe_token_dispatcher_type"], "flex"),
            (["model", "moe_flex_dispatcher_backend"], value),
            (["model", "moe_shared_expert_overlap"], False)]


def _recompute_layers(flag: str, value: str) -> Overrides:
    n = _int(flag, value)
    return [(["model", "recompute_granularity"], "full"), (["model", "recompute_method"], "block"),
            (["model", "recompute_num_layers"], n)]


def _recompute_modules(flag: str, value: str) -> Overrides:
    return [(["model", "recompute_granularity"], "selective"),
            (["model", "recompute_modules"], [m for m in value.split(",") if m])]


def _offload_layers(flag: str, value: str) -> Overrides:
    n = _int(flag, value)
    if not n:  # 0 means off (an earlier harness bug turned it on)
        return [(["model", "cpu_offloading"], False)]
    return [(["model", "cpu_offloading"], True), (["model", "cpu_offloading_weights"], False),
            (["model", "cpu_offloading_num_layers"], n)]


def _megatron_fsdp(flag: str, value: str) -> Overrides:
    if not _bool(flag, value):
        return []
    return [(["ddp", "use_megatron_fsdp"], True),
            (["ddp", "data_parallel_sharding_strategy"], "optim_grads_params"),
            (["ddp", "average_in_collective"], False)]


def _nccl_ub(flag: str, value: str) -> Overrides:
    if not _bool(flag, value):
        return []
    return [(["ddp", "nccl_ub"], True), (["ddp", "average_in_collective"], False)]


def _plain(path: str, kind: Callable[[str, str], Any] = lambda f, v: v
           ) -> Callable[[str, str], Overrides]:
    return lambda flag, value: [(path.split("."), kind(flag, value))]


_HANDLERS: dict[str, Callable[[str, str], Overrides]] = {
    "-tp": _size("model.tensor_model_parallel_size", sp=True),
    "-pp": _size("model.pipeline_model_parallel_size"),
    "-cp": _size("model.context_parallel_size"),
    "-vp": _size("model.virtual_pipeline_model_parallel_size", allow_none=True),
    "-ep": _size("model.expert_model_parallel_size"),
    "-et": _size("model.expert_tensor_parallel_size", allow_none=True),
    "-gb": _plain("train.global_batch_size", _int),
    "-mb": _plain("train.micro_batch_size", _int),
    "-sl": _plain("model.seq_length", _int),
    "-ms": _plain("train.train_iters", _int),
    "-c": _compute_dtype,
    "--cuda_graph_impl": _cuda_graph_impl,
    "--cuda_graph_scope": _cuda_graph_scope,
    "--moe_a2a_overlap": _a2a_overlap,
    "--moe_flex_dispatcher_backend": _flex_backend,
    "-rl": _recompute_layers,
    "--recompute_modules": _recompute_modules,
    "-ol": _offload_layers,
    "--use_megatron_fsdp": _megatron_fsdp,
    "--nccl_ub": _nccl_ub,
    "-ng": _plain("cluster.num_gpus", _int),
    "-gn": _plain("cluster.gpus_per_node", _int),
    "-g": _plain("cluster.gpu"),
    "--hidden_size": _plain("model.hidden_size", _int),
    "--num_layers": _plain("model.num_layers", _int),
    "--num_moe_experts": _plain("model.num_moe_experts", _int),
    "--pipeline_model_parallel_layout": _plain("model.pipeline_model_parallel_layout"),
    "--vocab_size": _plain("model.vocab_size", _int),
}
_ALIASES = {
    "--tensor_model_parallel_size": "-tp", "--pipeline_model_parallel_size": "-pp",
    "--context_parallel_size": "-cp", "--virtual_pipeline_model_parallel_size": "-vp",
    "--expert_model_parallel_size": "-ep", "--expert_tensor_parallel_size": "-et",
    "-etp": "-et", "--global_batch_size": "-gb", "--micro_batch_size": "-mb",
    "--seq_length": "-sl", "--max_steps": "-ms", "--compute_dtype": "-c",
    "--recompute_num_layers": "-rl", "--activation_offload_layers": "-ol",
    "--num_gpus": "-ng", "--gpus_per_node": "-gn", "--gpu": "-g",
}
# Flags that only steer the launch (Slurm, container, logging, profiling); accepted, ignored.
_LAUNCH_ONLY = frozenset({
    "-a", "--account", "-p", "--partition", "-t", "--time_limit", "-i", "--container_image",
    "-cm", "--custom_mounts", "-ce", "-E", "-cs", "-cb", "--gres", "--additional_slurm_params",
    "--packager", "-vb", "-lgc", "-lmc", "-en", "--enable_nsys", "-pyp",
    "--profiling_start_step", "--profiling_stop_step", "-mh", "--record_memory_history",
    "--profiling_ranks", "-l", "--log_dir", "--save_config_filepath", "--dump_env", "-wdk",
    "-wdp", "-wde", "-wdj", "-wds", "-cv", "--config_variant", "--domain", "--task", "--data",
    "--tokenizer_type",
    "--max_retries", "--detach", "--use_recipes", "-m", "--model_family_name",
    "--use_tokendrop", "--first_k_dense_replace",
})
_NO_VALUE = frozenset({"-d", "--dryrun", "--deterministic", "--list_config_variants"})


def flag_names() -> frozenset[str]:
    """Every perf-harness flag this reader knows, as written (`-tp`, `--recompute_modules`)."""
    return frozenset(_HANDLERS) | frozenset(_ALIASES)


def parse_perf_flags(args: Sequence[str], skip: frozenset[str] = frozenset()
                     ) -> tuple[Overrides, str | None]:
    """Return (overrides in order, preset name from `-mr/--model_recipe_name` if any).
    Trailing `section.field=value` items are Hydra overrides, applied after the flags. Flags
    in ``skip`` (canonical spelling, e.g. `-c` when the recipe it chose already carries its
    precision) are read but change nothing."""
    out: Overrides = []
    trailing: Overrides = []
    preset: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("-"):
            path, value, delete = parse_override(arg)
            if not delete:
                trailing.append((path, value))
            i += 1
            continue
        flag, eq, inline = arg.partition("=")
        flag = _ALIASES.get(flag, flag)
        if flag in _NO_VALUE:
            if flag == "--deterministic":
                out.append((["model", "deterministic_mode"], True))
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(args) and not (args[i + 1].startswith("-") and not _numeric(
                args[i + 1])):
            value, i = args[i + 1], i + 2
        elif flag == "--nccl_ub":
            value, i = "true", i + 1
        else:
            raise ConfigError(flag, "needs a value")
        if flag in ("-mr", "--model_recipe_name"):
            preset = value.replace("_", "-")
        elif flag in _HANDLERS:
            changes = _HANDLERS[flag](flag, value)  # always parsed: a bad value is named
            out += [] if flag in skip else changes
        elif flag not in _LAUNCH_ONLY:
            raise ConfigError(flag, "not a perf-harness flag" + did_you_mean(
                flag, list(_HANDLERS) + list(_ALIASES) + list(_LAUNCH_ONLY)))
    return out + trailing, preset


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# What selects the harness's recipe: -mr, --task, -ng, -g, -c, -cv (canonical → key).
_SELECTORS = {"-mr": "model_recipe", "--model_recipe_name": "model_recipe", "--task": "task",
              "-ng": "num_gpus", "--num_gpus": "num_gpus", "-g": "gpu", "--gpu": "gpu",
              "-c": "compute_dtype", "--compute_dtype": "compute_dtype",
              "-cv": "variant", "--config_variant": "variant"}


def harness_selection(args: Sequence[str]) -> dict[str, str]:
    """The values of the flags the harness picks its recipe by (last one wins), as written:
    {model_recipe, task, num_gpus, gpu, compute_dtype, variant} where given."""
    out: dict[str, str] = {}
    for i, arg in enumerate(args):
        flag, eq, inline = arg.partition("=")
        key = _SELECTORS.get(flag)
        if key is None:
            continue
        if eq:
            out[key] = inline
        elif i + 1 < len(args) and not args[i + 1].startswith("-"):
            out[key] = args[i + 1]
    return out
