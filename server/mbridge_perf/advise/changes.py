"""Apply a step's ``config_changes`` (dotted Bridge keys -> values) to a TrainingConfig.

Why not rebuild from YAML: a ladder prices a dozen variants of one config; copying the one
section that changes keeps a recommendation in milliseconds. The values come from this package
(typed as the fields are), and every variant is then checked by ``rules.validate``.
"""

from __future__ import annotations

from typing import Any, get_args

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig


def apply_changes(cfg: TrainingConfig, changes: dict[str, Any]) -> TrainingConfig:
    """A copy of ``cfg`` with ``changes`` set; ``env.NAME`` keys set environment variables."""
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if not name or section not in type(cfg).model_fields:
            raise ConfigError(key, "a change must name section.field")
        by_section.setdefault(section, {})[name] = value
    update: dict[str, Any] = {}
    for section, values in by_section.items():
        current = getattr(cfg, section)
        if current is None:  # an optional section the config left out: start from its defaults
            ann = type(cfg).model_fields[section].annotation
            current = next(a for a in get_args(ann) if a is not type(None))()
        if isinstance(current, dict):
            update[section] = {**current, **{k: str(v) for k, v in values.items()}}
        else:
            update[section] = current.model_copy(update=values)
    return cfg.model_copy(update=update)


def as_overrides(changes: dict[str, Any]) -> list[str]:
    """The same changes as dotted overrides (``--override`` / ConfigSource.overrides)."""
    out = []
    for key, value in changes.items():
        if isinstance(value, bool):
            text = str(value).lower()
        elif isinstance(value, list):
            text = "[" + ",".join(str(v) for v in value) + "]"
        elif value is None:
            text = "null"
        else:
            text = str(value)
        out.append(f"{key}={text}")
    return out
