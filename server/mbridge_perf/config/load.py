"""Read a TrainingConfig from what users already have, composed in this order (later wins):

    Bridge recipe name (or the one perf-harness flags select) or preset name
                 →  Hugging Face config.json  →  YAML / JSON (file, text or mapping)
                 →  dotted overrides (`model.tensor_model_parallel_size=8`, lists as `[a,b]`)
                 →  perf-script flags (`-tp 8 -pp 4 --recompute_modules core_attn,mlp`)

YAML is read with ``safe_load`` only. Every problem becomes one ``ConfigError`` naming the field.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mbridge_perf.config.errors import ConfigError, did_you_mean, type_problem
from mbridge_perf.config.fields import known_fields
from mbridge_perf.config.flags import harness_selection, parse_perf_flags
from mbridge_perf.config.limits import (
    MAX_DEPTH,
    HugeInt,
    check_count,
    check_size,
    check_tree,
    load_yaml,
    max_config_bytes,
)
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.overrides import parse_override, set_path

# Hydra / OmegaConf instantiation markers found in Bridge config dumps; not fields.
_MARKERS = frozenset({"_target_", "_partial_", "_call_", "_recursive_", "_convert_", "_args_"})
_OURS = {"env", "cluster"}


# ------------------------------------------------------------------ reading inputs

def read_yaml(text: str, source: str = "config") -> dict[str, Any]:
    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(source, f"not valid YAML{where}: {problem}; fix the syntax "
                                  "(indentation, quotes, a missing ':')") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(source, f"expected a mapping of sections (model:, train:, …), got "
                                  f"{type(data).__name__}")
    return data


def read_file(path: str | Path) -> dict[str, Any]:
    """A Bridge YAML/JSON config, or a Hugging Face config.json (architecture only)."""
    p = Path(path)
    text = read_text(p, str(path))
    if p.suffix == ".json":
        data = read_json(text, str(path))
        if isinstance(data, dict) and ("architectures" in data or "model_type" in data):
            return {"model": hf_model_fields(data, str(path))}
        if not isinstance(data, dict):
            raise ConfigError(str(path), "expected a JSON object of sections")
        return data
    return read_yaml(text, str(path))


def read_text(p: Path, source: str) -> str:
    """A config file's text: size-checked before reading, UTF-8 or one clear error."""
    try:
        if p.is_file():
            check_size(p.stat().st_size, source)
        with p.open("rb") as fh:  # a FIFO or device is read only up to the limit
            raw = fh.read(max_config_bytes() + 1)
    except OSError as exc:
        raise ConfigError(source, f"cannot read the file ({exc.strerror}); check the "
                                  "path") from None
    check_size(len(raw), source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(source, f"not UTF-8 text (byte {raw[exc.start]:#04x} at offset "
                                  f"{exc.start}); save the file as UTF-8") from None


def read_json(text: str, source: str) -> Any:
    check_size(len(text.encode("utf-8", "surrogatepass")), source)
    try:
        data = json.loads(text, parse_int=_json_int, object_pairs_hook=_json_object)
    except json.JSONDecodeError as exc:
        raise ConfigError(source, f"not valid JSON at line {exc.lineno}: {exc.msg}") from None
    except _DuplicateKey as exc:
        raise ConfigError(source, f"the key {exc.args[0]!r} is written twice in one object; "
                                  "JSON readers would keep only the second silently: keep "
                                  "one") from None
    except RecursionError:
        raise ConfigError(source, f"nested deeper than {MAX_DEPTH} levels; a Bridge config "
                                  "is a few levels deep") from None
    check_tree(data, source)
    return data


class _DuplicateKey(Exception):
    pass


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_int(digits: str) -> Any:
    try:
        return int(digits)
    except ValueError:  # over Python's int_max_str_digits: named by check_tree
        return HugeInt(len(digits))


def hf_model_fields(data: Mapping[str, Any], source: str = "config.json") -> dict[str, Any]:
    from mbridge_perf.config.hf import model_fields_from_hf

    try:
        return model_fields_from_hf(dict(data))
    except ValueError as exc:
        raise ConfigError(source, str(exc)) from None


def preset_data(name: str) -> dict[str, Any]:
    from mbridge_perf.config.presets import get_preset

    try:
        preset = get_preset(name)
    except ValueError as exc:
        raise ConfigError("preset", str(exc)) from None
    model = {**copy.deepcopy(dict(preset.model)), **{
        k: v for k, v in preset.defaults.items() if k in known_fields()["model"]}}
    train = {k: v for k, v in preset.defaults.items() if k not in model}
    return {"model": model, **({"train": train} if train else {})}


# ------------------------------------------------------------------ merging

def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else replaces."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


# ------------------------------------------------------------------ building

def _check_names(data: Mapping[str, Any]) -> None:
    from mbridge_perf.config.derived import MIXED_PRECISION_RECIPES

    known = known_fields()
    mp = data.get("mixed_precision")
    if isinstance(mp, str) and mp not in MIXED_PRECISION_RECIPES:
        raise ConfigError("mixed_precision", f"unknown recipe {mp!r}" + did_you_mean(
            mp, MIXED_PRECISION_RECIPES) + "; use a Bridge recipe name such as bf16_mixed or "
                                           "a mapping of mixed_precision fields")
    for top, value in data.items():
        if top not in known["top_level"]:
            raise ConfigError(top, "not a config section" + did_you_mean(
                top, known["top_level"]) + "; sections are " + ", ".join(
                sorted(TrainingConfig.model_fields)) + " and the other Bridge ConfigContainer "
                                                       "sections")
        if top in _OURS or top not in known or not isinstance(value, Mapping):
            continue
        for name in value:
            if name in known[top] or name in _MARKERS:
                continue
            home = [s for s, names in known.items()
                    if s not in ("top_level", top) and name in names]
            hint = (f"; it belongs in {home[0]}: use {home[0]}.{name}" if home
                    else did_you_mean(name, known[top]) or
                    f"; no {top} field of Megatron Bridge / Megatron-Core has this name")
            raise ConfigError(f"{top}.{name}", "unknown field" + hint)


def build(data: Mapping[str, Any]) -> TrainingConfig:
    """Turn a merged mapping into a TrainingConfig, or raise one ConfigError."""
    from mbridge_perf.config.bridge import normalise

    clean = normalise(data)  # Bridge's YAML dialect (markers, dtypes, enums, nulls) read
    _check_names(clean)
    bridge_env = clean.pop("env_vars", None)
    if isinstance(bridge_env, dict):  # Bridge's own name for the job environment
        clean["env"] = {**bridge_env, **(clean.get("env") or {})}
    env = clean.get("env")
    if isinstance(env, dict):
        clean["env"] = {str(k): "" if v is None else str(v) for k, v in env.items()}
    try:
        return TrainingConfig.model_validate(clean)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not str(p).endswith("Section") and not str(
            p).startswith(("str", "literal", "int", "list", "float", "bool", "function"))]
        raise ConfigError(".".join(loc) or "config", type_problem(err)) from None


def _recipe_base(recipe: str | None, preset: str | None, flags: Sequence[str]
                 ) -> tuple[str | None, list[str]]:
    """The Bridge recipe to start from (named, or the one the perf-harness flags select) and
    the sentence saying how the flags were read; (None, …) when the base is a preset."""
    from mbridge_perf.config.recipes import check_name, harness_recipe

    if recipe is not None:
        if preset is not None:
            raise ConfigError("recipe", "give a recipe or a preset, not both (a recipe "
                                        "already names its model)")
        return check_name(recipe), []
    if preset is not None or not flags:
        return None, []
    sel = harness_selection(flags)
    if "model_recipe" not in sel:
        return None, []
    ng = sel.get("num_gpus", "")
    choice = harness_recipe(sel["model_recipe"], task=sel.get("task", "pretrain"),
                            num_gpus=int(ng) if ng.isdigit() else None, gpu=sel.get("gpu"),
                            compute_dtype=sel.get("compute_dtype", "bf16"),
                            variant=sel.get("variant"))
    if choice.name is None and choice.nearest:
        from mbridge_perf.config.presets import load_presets

        if sel["model_recipe"].strip().lower().replace("_", "-") not in load_presets():
            raise ConfigError("-mr", choice.note.split("; started from")[0] + "; and no "
                              "preset of that name: pass one of those with --recipe (MCP: "
                              "recipe), or a preset")
    return choice.name, [choice.note]


def load_config(*, preset: str | None = None, file: str | Path | None = None,
                text: str | None = None, data: Mapping[str, Any] | None = None,
                hf_config: Mapping[str, Any] | None = None,
                overrides: Sequence[str] = (), flags: Sequence[str] = (),
                recipe: str | None = None) -> TrainingConfig:
    """Compose every input the user has, in the documented order, into one TrainingConfig.
    The base is a Bridge recipe (``recipe``, or the one perf-harness flags select) or a
    preset; see source_notes() for how flags were resolved."""
    merged: dict[str, Any] = {}
    check_count(overrides, "overrides")
    check_count(flags, "perf_flags")
    base, notes = _recipe_base(recipe, preset, flags)
    flag_overrides, flag_preset = ([], None)
    if flags:  # a recipe the flags chose already carries the precision -c chose it by
        flag_overrides, flag_preset = parse_perf_flags(
            flags, frozenset({"-c"}) if base and recipe is None else frozenset())
    if base is not None:
        from mbridge_perf.config.recipes import recipe_text

        merged = read_yaml(recipe_text(base), f"recipe {base}")
    elif preset or flag_preset:
        merged = preset_data(preset or flag_preset or "")
    if hf_config is not None:
        merged = merge(merged, {"model": hf_model_fields(hf_config)})
    if file is not None:
        merged = merge(merged, read_file(file))
    if text is not None:
        merged = merge(merged, read_yaml(text))
    if data is not None:
        if not isinstance(data, Mapping):
            raise ConfigError("config", "expected a mapping of sections (model:, train:, …)")
        check_tree(data, "config")
        merged = merge(merged, data)
    for item in overrides:
        path, value, delete = parse_override(item)
        set_path(merged, path, value, delete)
    for path, value in flag_overrides:
        set_path(merged, path, value)
    cfg = build(merged)
    cfg._source_notes = notes
    only_dump = not (overrides or flags or preset or hf_config is not None or data is not None)
    name = _shipped(base, file, text) if only_dump else None
    if name is not None:  # a shipped recipe as Bridge dumped it: its recorded estimate applies
        cfg._shipped_recipe = (name, cfg.model_dump_json())
    return cfg


def _shipped(recipe: str | None, file: str | Path | None, text: str | None) -> str | None:
    from mbridge_perf.config.recipes import shipped_dump

    if recipe is not None:
        return recipe if file is None and text is None else None
    if (file is None) == (text is None):
        return None
    return shipped_dump(text if text is not None else read_text(Path(str(file)), str(file)))


def shipped_recipe(cfg: TrainingConfig) -> str | None:
    """The shipped Bridge recipe ``cfg`` is, unmodified (by name or its exact dump), or None
    (also for a copy of it that changed anything since it was loaded)."""
    mark = getattr(cfg, "_shipped_recipe", None)
    if mark is None or cfg.model_dump_json() != mark[1]:
        return None
    return mark[0]


def source_notes(cfg: TrainingConfig) -> list[str]:
    """How the config's base was chosen from perf-harness flags (for a report's assumptions);
    empty when nothing was resolved."""
    return list(getattr(cfg, "_source_notes", None) or [])


class ConfigSource(BaseModel):
    """A training config as the user has it, for the MCP tools: any combination of a preset,
    a Bridge config (mapping or YAML text), dotted overrides and perf-harness flags, composed
    in that order."""

    model_config = ConfigDict(extra="forbid")

    preset: str | None = Field(
        None, description="Model preset to start from, e.g. 'llama3-70b' (see list_presets).")
    recipe: str | None = Field(
        None, max_length=200,
        description="Megatron Bridge 0.6.2 recipe to start from, by name, e.g. "
                    "'qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config' (the resource "
                    "mbridge-perf://recipes lists them); its dump loads, then overrides and "
                    "perf_flags apply on top. A name, never a path.")
    bridge_config: dict[str, Any] | str | None = Field(
        None, description="Megatron Bridge ConfigContainer as a mapping ({model: {...}, train: "
                          "{...}, optimizer: ..., ddp: ..., mixed_precision: ...}) or the same "
                          "as YAML text; a whole config.yaml dump is fine. Extra sections: env "
                          "(environment variables) and cluster (num_gpus, gpus_per_node, gpu).")
    overrides: list[str] = Field(
        default_factory=list, description="Dotted overrides applied after, e.g. "
                                          "'model.tensor_model_parallel_size=8', lists as "
                                          "'model.recompute_modules=[core_attn,mlp]'.")
    perf_flags: list[str] = Field(
        default_factory=list, description="Megatron Bridge perf-harness flags applied last, "
                                          "e.g. ['-tp', '8', '-pp', '4', '-ng', '32'].")


def load_source(src: ConfigSource) -> TrainingConfig:
    """ConfigSource → TrainingConfig (raises ConfigError naming the field)."""
    if src.preset is None and src.recipe is None and src.bridge_config is None and \
            not src.overrides and not src.perf_flags:
        raise ConfigError("config", "empty: give a preset, a recipe, a bridge_config (mapping "
                                    "or YAML text), overrides or perf_flags")
    text = src.bridge_config if isinstance(src.bridge_config, str) else None
    data = src.bridge_config if isinstance(src.bridge_config, dict) else None
    return load_config(preset=src.preset, recipe=src.recipe, text=text, data=data,
                       overrides=src.overrides, flags=src.perf_flags)
