"""Every GPU the Bridge recipe corpus names resolves in the catalog, or is refused in one line
that names it (no public memory capacity); an estimate on such a GPU is a ConfigError naming
cluster.gpu, never a traceback."""

from __future__ import annotations

import copy
import re

import pytest

from bridge_corpus import dumps
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.gpus import list_gpus, lookup_gpu
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import estimate_memory

GPU_TOKENS = ("h100", "b200", "b300", "gb200", "gb300", "vr200", "r100")
# GPUs Megatron Bridge has recipes for but NVIDIA has published no memory capacity for
UNPUBLISHED = {"r100": "R100"}


def _corpus_gpus() -> set[str]:
    names = set(dumps())
    return {t for n in names for t in GPU_TOKENS if re.search(rf"_{t}_", n)}


def test_the_corpus_names_the_gpus_we_check() -> None:
    assert _corpus_gpus() >= {"h100", "b200", "b300", "gb200", "gb300", "vr200"}


@pytest.mark.parametrize("token", GPU_TOKENS)
def test_every_gpu_token_resolves_or_is_one_line_naming_it(token: str) -> None:
    if token not in UNPUBLISHED:
        spec = lookup_gpu(token)
        assert spec.capacity_gib > 0 and spec.source and spec.nvlink_domain >= 8
        return
    with pytest.raises(ValueError) as err:
        lookup_gpu(token)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(UNPUBLISHED[token]) and "no public memory capacity" in text


def test_vera_rubin_is_a_72_gpu_nvlink_domain_of_288_gb_gpus() -> None:
    vr = lookup_gpu("VR200")
    assert (vr.architecture, vr.memory_gb, vr.nvlink_domain, vr.gpus_per_node) == (
        "rubin", 288, 72, 4)
    assert vr.capacity_gib == pytest.approx(268.22)  # nominal, no torch-reported figure yet
    assert "HBM4" in vr.source and "http" in vr.source
    assert lookup_gpu("Vera Rubin NVL72") is vr and lookup_gpu("vr200-288gb") is vr
    assert "R100" not in {g.name for g in list_gpus()}


def _dump(prefix: str) -> dict:
    name = next(n for n in sorted(dumps()) if n.startswith(prefix))
    return copy.deepcopy(dumps()[name])


def test_a_vr200_dump_estimates_against_the_vr200_capacity() -> None:
    cfg = load_config(data=_dump("llama3_8b_pretrain_8gpu_vr200_bf16"),
                      overrides=["cluster.gpu=vr200"])
    report = estimate_memory(cfg)
    assert report.gpu == "VR200" and report.gpu_capacity_gib == pytest.approx(268.22)


@pytest.mark.parametrize("where", ["cluster", "argument"])
def test_an_r100_estimate_is_one_config_error_naming_the_gpu(where: str) -> None:
    data = _dump("llama3_8b_pretrain_8gpu_r100_bf16")
    if where == "cluster":
        cfg = load_config(data=data, overrides=["cluster.gpu=r100"])
        with pytest.raises(ConfigError) as err:
            estimate_memory(cfg)
        assert err.value.field == "cluster.gpu"
    else:
        with pytest.raises(ConfigError) as err:
            estimate_memory(load_config(data=data), gpu="R100")
        assert err.value.field == "gpu"
    assert "R100" in err.value.problem and "no public memory capacity" in err.value.problem
    assert "\n" not in str(err.value)
