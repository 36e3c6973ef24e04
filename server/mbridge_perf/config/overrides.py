"""Dotted overrides (`model.tensor_model_parallel_size=8`, Hydra's `+key=v` / `~key`): parsed
into a path and a value, and applied to a config mapping. Used by the loader and by the
perf-flag reader (trailing overrides), so it depends on neither."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from mbridge_perf.config.errors import ConfigError, did_you_mean
from mbridge_perf.config.fields import known_fields
from mbridge_perf.config.limits import HYDRA_MARKERS, has_marker, load_yaml


def parse_override(text: str) -> tuple[list[str], Any, bool]:
    """`section.field=value` → (path, value, delete). Hydra's `+key=v` adds, `~key` deletes;
    values are YAML scalars or flow lists (`[core_attn,mlp]`)."""
    raw = text.strip()
    delete = raw.startswith("~")
    raw = raw.lstrip("+~")
    key, sep, value = raw.partition("=")
    key = key.strip()
    whole_section = "." not in key and key in known_fields()["top_level"]
    if (not sep and not delete) or not (whole_section or "." in key) or not all(
            key.split(".")):
        raise ConfigError(text, "an override must look like section.field=value, e.g. "
                                "model.tensor_model_parallel_size=8")
    path = key.split(".")
    if has_marker(path):
        raise ConfigError(key, "an override may not name a Hydra marker ("
                               + ", ".join(sorted(HYDRA_MARKERS)) + ") in any part of its "
                               "key; set the field itself, e.g. model.init_method_std=0.02")
    if delete:
        return path, None, True
    if path[0] == "env":
        return path, value, False  # environment values stay strings, verbatim
    try:
        parsed = load_yaml(value, key) if value.strip() else ""
    except yaml.YAMLError:
        parsed = value
    return path, parsed, False


def set_path(data: dict[str, Any], path: Sequence[str], value: Any, delete: bool = False
             ) -> None:
    node = data
    for part in path[:-1]:
        child = node.get(part)
        if node is data and part == "mixed_precision" and isinstance(child, str):
            child = _recipe_fields(child)  # `mixed_precision.fp8=…` refines the named recipe
        if not isinstance(child, dict):
            child = {}
        node[part] = child
        node = child
    if delete:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = value


def _recipe_fields(name: str) -> Any:
    """A Bridge mixed-precision recipe name as the fields it sets."""
    from mbridge_perf.config.derived import MIXED_PRECISION_RECIPES

    fields = MIXED_PRECISION_RECIPES.get(name)
    if fields is None:
        raise ConfigError("mixed_precision", f"unknown recipe {name!r}" + did_you_mean(
            name, MIXED_PRECISION_RECIPES) + "; a field override refines a known recipe")
    return dict(fields)
