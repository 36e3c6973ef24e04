"""NVIDIA's measured recipes fit: estimate_memory's verdict on every Megatron Bridge 0.6.2
perf-recipe dump of the packed corpus, on the GPU and GPU count its name gives.

tests/data/measured_recipes.csv lists the 40 dumps Bridge's published performance tables show
running and measured at the dump's own layout (../shared/data/steptime/bridge_perf_summary.csv,
`dump_layout_matches = yes`, with each row's source): they ran, so they are `fits` or `tight`.
Of all the language-model dumps with a known GPU, at least 95 % are; each other one names the
term that decides it. benchmarks/recipes_fit.py prints the same by family.
"""

from __future__ import annotations

import copy
import csv
import re
from functools import cache

from bridge_corpus import dumps, index, is_diffusion
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

from helpers import REPO

GPU_TOKEN = re.compile(r"_(\d+)gpu_(h100|b200|b300|gb200|gb300|vr200|r100)_")
MEASURED = REPO / "tests" / "data" / "measured_recipes.csv"


def _verdict(name: str) -> tuple[str, str]:
    match = GPU_TOKEN.search(name)
    assert match is not None
    data = copy.deepcopy(dumps()[name])
    try:
        cfg = load_config(data=data)
        if cfg.cluster.num_gpus is None:  # the GPU count of the recipe's name
            cfg = load_config(data=copy.deepcopy(data),
                              overrides=[f"cluster.num_gpus={match[1]}"])
        rep = estimate_memory(cfg, gpu=match[2])
    except ConfigError as exc:
        return "refused", str(exc)
    assert rep.verdict is not None
    return rep.verdict, rep.verdict_term


@cache
def _results() -> dict[str, tuple[str, str]]:
    return {name: _verdict(name) for name, row in index().items()
            if row["package"] == "megatron.bridge.perf_recipes" and GPU_TOKEN.search(name)
            and name in dumps() and not is_diffusion(name)}


def _measured() -> dict[str, str]:
    with MEASURED.open(encoding="utf-8") as f:
        return {r["recipe"]: r["releases"] for r in csv.DictReader(f)}


def test_every_recipe_nvidia_measured_at_its_layout_fits_or_is_tight() -> None:
    measured, results = _measured(), _results()
    assert len(measured) == 40 and set(measured) <= set(results)
    bad = {n: results[n] for n in measured if results[n][0] not in ("fits", "tight")}
    assert not bad, bad
    newer = [n for n, rel in measured.items() if max(rel.split()) >= "26.02"]
    assert len(newer) == 35


def test_most_perf_recipes_fit_and_the_rest_name_the_deciding_term() -> None:
    results = _results()
    known = {n: v for n, v in results.items() if not v[1].startswith("gpu: R100")}
    assert len(known) >= 260
    ok = [n for n, (verdict, _) in known.items() if verdict in ("fits", "tight")]
    assert len(ok) >= 0.95 * len(known), f"{len(ok)} of {len(known)}"
    for name, (verdict, term) in known.items():
        if verdict == "does_not_fit":
            assert "GiB" in term and "margin" in term, (name, term)
        elif verdict == "refused":  # only what Bridge itself rejects (GBS 192 at DP 128)
            assert term.startswith("train.global_batch_size"), (name, term)
