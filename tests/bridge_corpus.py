"""The Megatron Bridge 0.6.2 recipe dumps kept in tests/data/bridge-recipes.tar.xz: every
``ConfigContainer.to_yaml()`` of Bridge's recipes (yaml/<recipe>.yaml), Bridge's own validate()
verdicts (recipe_index.csv) and its estimate_training_memory() totals (bridge_estimates.csv).

Read in memory, once per test session. The dumps are parsed with libyaml when PyYAML has it (the
same data as safe_load, ten times faster); the file door itself is exercised by the CLI tests.
"""

from __future__ import annotations

import csv
import io
import tarfile
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ARCHIVE = Path(__file__).resolve().parent / "data" / "bridge-recipes.tar.xz"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@cache
def _members() -> dict[str, str]:
    with tarfile.open(ARCHIVE) as tf:
        return {m.name: tf.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
                for m in tf.getmembers() if m.isfile()}


def dump_texts() -> dict[str, str]:
    """recipe name → YAML text."""
    return {Path(n).stem: t for n, t in _members().items() if n.startswith("yaml/")}


@cache
def dumps() -> dict[str, dict[str, Any]]:
    """recipe name → the parsed dump (a fresh copy is the caller's to make)."""
    return {n: yaml.load(t, Loader=_LOADER) for n, t in dump_texts().items()}


def _csv(name: str) -> dict[str, dict[str, str]]:
    return {r["recipe"]: r for r in csv.DictReader(io.StringIO(_members()[name]))}


@cache
def index() -> dict[str, dict[str, str]]:
    """recipe → recipe_index.csv row (provider, Bridge's validate verdict, …)."""
    return _csv("recipe_index.csv")


@cache
def bridge_estimates() -> dict[str, dict[str, str]]:
    """recipe → bridge_estimates.csv row (Bridge's estimate_training_memory, GiB)."""
    return _csv("bridge_estimates.csv")


def is_diffusion(name: str) -> bool:
    return ".diffusion." in str(dumps()[name]["model"].get("_target_", ""))
