"""Megatron Bridge 0.6.2 recipes by name, offline (recipe_data/bridge-recipes.tar.xz).

The corpus is Bridge's own ``ConfigContainer.to_yaml()`` of each recipe (Apache-2.0, see
recipe_data/NOTICE). A name is looked up in the packaged index and nowhere else: it is never a
path, and an unknown name gets one line naming the closest ones.

The perf harness (``scripts/performance``) picks a flat recipe from its flags the same way in
Bridge 0.6.x: ``{model_recipe_name}_{task}_{num_gpus}gpu_{gpu}_{precision}[_{variant}]_config``
with precision bf16 / fp8cs / fp8mx / fp8sc / nvfp4 (``-c fp8_mx`` → ``fp8mx``), task
``pretrain`` unless ``--task`` says otherwise and the variant from ``-cv`` (``v1`` / ``v2``
name the canonical recipe). When no recipe has the asked GPU count, the harness runs its default
one for that model / task / GPU / precision (a fixed count for a few workloads, else the largest)
and applies ``-ng`` on top.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from mbridge_perf.config.errors import ConfigError

ARCHIVE = Path(__file__).with_name("recipe_data") / "bridge-recipes.tar.xz"
MAX_NAME = 200
_NAME = re.compile(r"^[a-z0-9_]+$")
PRECISIONS = {"bf16": "bf16", "fp8_cs": "fp8cs", "fp8_ds": "fp8ds", "fp8_mx": "fp8mx",
              "fp8_sc": "fp8sc", "nvfp4": "nvfp4"}
_TASKS = ("pretrain", "sft", "peft")
# The harness's default GPU count where it is not the largest recipe (Bridge 0.6.x,
# scripts/performance/utils/utils.py): (model, task, gpu, precision) → GPU count.
_DEFAULT_COUNTS = {
    **{("llama3_8b", "pretrain", g, p): 8 for g, p in (
        ("b200", "bf16"), ("b200", "fp8cs"), ("gb200", "bf16"), ("gb200", "fp8cs"),
        ("gb300", "bf16"), ("gb300", "fp8cs"), ("gb300", "fp8mx"), ("gb300", "nvfp4"),
        ("h100", "bf16"), ("h100", "fp8cs"))},
    ("nemotronh_56b", "pretrain", "b200", "fp8cs"): 64,
    ("nemotronh_56b", "pretrain", "gb300", "fp8cs"): 64,
    **{("qwen3_30b_a3b", "pretrain", g, p): 8 for g in ("b200", "gb200", "gb300")
       for p in ("bf16", "fp8cs")},
    ("qwen3_30b_a3b", "pretrain", "h100", "bf16"): 16,
    ("qwen3_30b_a3b", "pretrain", "h100", "fp8cs"): 16,
}


class RecipeInfo(BaseModel):
    """One shipped recipe: what it trains, where, and its layout."""

    name: str = Field(description="recipe name to pass as recipe / --recipe")
    model: str = Field(description="Bridge's model recipe name, e.g. qwen3_30b_a3b")
    model_id: str | None = Field(description="Hugging Face model id the recipe builds")
    task: str = Field(description="pretrain, sft or peft")
    num_gpus: int = Field(description="GPU count the recipe was dumped for")
    gpu: str = Field(description="GPU the recipe is tuned for (h100, b200, gb200, …)")
    precision: str = Field(description="bf16, fp8cs, fp8mx, fp8sc or nvfp4")
    variant: str | None = Field(description="named variant (large_scale, 64k, …) or none")
    source: str = Field(description="megatron.bridge.perf_recipes or megatron.bridge.recipes")
    layout: dict[str, int | None] = Field(description="tp, pp, vpp, cp, ep, etp, mbs, gbs, seq")


@cache
def _members() -> dict[str, str]:
    with tarfile.open(ARCHIVE) as tf:
        return {m.name: tf.extractfile(m).read().decode("utf-8")  # type: ignore[union-attr]
                for m in tf.getmembers() if m.isfile()}


def parse_name(name: str) -> dict[str, Any] | None:
    """Bridge's recipe-name parts: {model, task, num_gpus, gpu, precision, variant, general}
    of ``<model>_<task>_<N>gpu_<gpu>_<precision>[_<variant>]_config[__general]``, or None."""
    general = name.endswith("__general")
    stem = name.removesuffix("__general")
    if not stem.endswith("_config"):
        return None
    tokens = stem.removesuffix("_config").split("_")
    for i in range(1, len(tokens) - 3):
        count, gpu, prec = tokens[i + 1], tokens[i + 2], tokens[i + 3]
        if tokens[i] in _TASKS and count.endswith("gpu") and count[:-3].isdigit() and \
                gpu.isalnum() and prec in PRECISIONS.values():
            return {"model": "_".join(tokens[:i]), "task": tokens[i],
                    "num_gpus": int(count[:-3]), "gpu": gpu, "precision": prec,
                    "variant": "_".join(tokens[i + 4:]) or None, "general": general}
    return None


@cache
def recipe_index() -> dict[str, RecipeInfo]:
    """Every shipped recipe by name."""
    raw = json.loads(_members()["index.json"])
    out = {}
    for name, entry in sorted(raw.items()):
        parts = parse_name(name)
        if parts is None:  # every shipped name follows Bridge's pattern; checked by the tests
            continue
        general = parts.pop("general") or ".perf_recipes." not in str(entry.get("module"))
        out[name] = RecipeInfo(
            name=name, model_id=entry.get("model_id"), layout=entry["layout"], **parts,
            source="megatron.bridge.recipes" if general else "megatron.bridge.perf_recipes")
    return out


def closest(name: str, n: int = 3) -> list[str]:
    """The shipped names nearest to ``name`` (difflib, then shared prefix)."""
    pool = list(recipe_index())
    key = name.strip().lower()[:MAX_NAME]
    close = difflib.get_close_matches(key, pool, n=n, cutoff=0.5)
    if len(close) < n:
        head = key.split("_")[0]
        close += [p for p in pool if p.startswith(head) and p not in close][:n - len(close)]
    return close[:n] or pool[:n]


def _unknown(name: str, why: str) -> ConfigError:
    return ConfigError("recipe", f"{why}; closest: {', '.join(closest(name))} "
                                 f"(`mbridge-perf recipes` lists all {len(recipe_index())})")


def check_name(name: object) -> str:
    """The canonical shipped name for ``name`` (case-insensitive, ``_config`` optional), or one
    ConfigError naming the closest ones. Anything path-like is refused, never opened."""
    if not isinstance(name, str) or not name.strip():
        raise ConfigError("recipe", "expected a recipe name, e.g. "
                                    "'qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config'")
    if len(name) > MAX_NAME:
        raise ConfigError("recipe", f"a recipe name is at most {MAX_NAME} characters, got "
                                    f"{len(name):,}")
    key = name.strip().lower()
    if not _NAME.match(key):
        shown = " ".join(repr(name[:60]).split())
        raise _unknown(key.replace("/", "_").replace(".", "_"),
                       f"{shown} is not a recipe name (a name, never a path: letters, "
                       "digits and '_'; a config file's contents are the config itself)")
    index = recipe_index()
    for cand in (key, f"{key}_config"):
        if cand in index:
            return cand
    raise _unknown(key, f"unknown recipe {key!r}")


def recipe_text(name: str) -> str:
    """The dump's YAML text, exactly as Bridge wrote it."""
    return _members()[f"yaml/{check_name(name)}.yaml"]


def list_recipes(model: str | None = None, gpu: str | None = None) -> list[RecipeInfo]:
    """Shipped recipes, optionally those whose model name contains ``model`` and whose GPU is
    ``gpu`` (both case-insensitive)."""
    want_model = (model or "").strip().lower()[:MAX_NAME]
    want_gpu = (gpu or "").strip().lower()[:64]
    return [r for r in recipe_index().values()
            if want_model in r.model and (not want_gpu or r.gpu == want_gpu)]


@cache
def recorded_bridge_estimates() -> dict[str, dict[str, str]]:
    """recipe → Bridge 0.6.2's recorded estimate_training_memory row (GiB, its layout)."""
    return {r["recipe"]: r for r in csv.DictReader(io.StringIO(
        _members()["bridge_estimates.csv"]))}


# ------------------------------------------------------------------ the harness's choice

@dataclass(frozen=True)
class HarnessChoice:
    """What the perf harness's flags select: a shipped recipe (``name``) or none, and the
    sentence that says how (for the report's assumptions)."""

    name: str | None
    note: str
    nearest: tuple[str, ...] = ()


def harness_recipe(model_recipe: str, *, task: str = "pretrain", num_gpus: int | None = None,
                   gpu: str | None = None, compute_dtype: str = "bf16",
                   variant: str | None = None) -> HarnessChoice:
    """The flat perf recipe ``-mr/--task/-ng/-g/-c/-cv`` select, as the harness selects it."""
    mr, gpu_l = model_recipe.strip().lower()[:MAX_NAME], (gpu or "").strip().lower()[:64]
    prec = PRECISIONS.get(compute_dtype.lower(), compute_dtype.lower().replace("_", ""))
    var = None if variant is None or variant.lower() in ("v1", "v2") else variant.lower()
    suffix = f"_{var}" if var else ""
    if not gpu_l:
        return HarnessChoice(None, "perf flags name no GPU (-g): the harness cannot pick a "
                                   f"recipe for {mr}; started from the "
                                   f"{mr.replace('_', '-')} preset")
    exact = f"{mr}_{task}_{num_gpus}gpu_{gpu_l}_{prec}{suffix}_config"
    index = recipe_index()  # the harness looks in megatron.bridge.perf_recipes only
    if exact in index and index[exact].source.endswith("perf_recipes"):
        return HarnessChoice(exact, f"perf flags resolve to Bridge recipe {exact} (the one the "
                                    "harness runs); the other flags apply on top")
    counts = sorted((r.num_gpus, n) for n, r in index.items()
                    if (r.model, r.task, r.gpu, r.precision, r.variant) == (
                        mr, task, gpu_l, prec, var) and r.source.endswith("perf_recipes"))
    want = _DEFAULT_COUNTS.get((mr, task, gpu_l, prec)) if not var else None
    pick = next((n for c, n in counts if c == want), None) if want else (
        counts[-1][1] if counts else None)
    if pick is not None:
        return HarnessChoice(pick, f"no Bridge recipe for {mr} {task} on {num_gpus} {gpu_l} "
                                   f"{prec}{suffix}: the harness runs its default {pick} with "
                                   f"-ng {num_gpus} on top (its global-batch rescaling is not "
                                   "reproduced); the other flags apply on top")
    near = tuple(closest(exact))
    return HarnessChoice(None, f"no Bridge 0.6.2 perf recipe matches {exact}; nearest: "
                               f"{', '.join(near)}; started from the "
                               f"{mr.replace('_', '-')} preset instead, without a recipe's "
                               "tuned settings", near)



@cache
def _by_digest() -> dict[str, str]:
    return {hashlib.sha256(text.encode("utf-8")).hexdigest(): Path(path).stem
            for path, text in _members().items() if path.startswith("yaml/")}


def shipped_dump(text: str) -> str | None:
    """The shipped recipe whose dump is exactly ``text`` (byte for byte), if any."""
    return _by_digest().get(hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
