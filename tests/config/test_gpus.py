"""GPU catalog: the spellings people use resolve to one entry; bad names list the choices."""

from __future__ import annotations

import pytest

from mbridge_perf.config.gpus import list_gpus, lookup_gpu


@pytest.mark.parametrize(("name", "expected"), [
    ("h100", "H100-80GB"),
    ("H100-80GB", "H100-80GB"),
    ("H100_80GB", "H100-80GB"),
    ("h100-sxm", "H100-80GB"),
    ("NVIDIA H100 80GB HBM3", "H100-80GB"),   # torch.cuda.get_device_name()
    ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
    ("a100-40gb", "A100-40GB"),
    ("NVIDIA H200", "H200-141GB"),
    ("h200-141gb", "H200-141GB"),
    ("B200", "B200"),
    ("hgx b300", "B300"),
    ("gb200", "GB200"),
    ("NVIDIA GB200", "GB200"),
    ("GB300 NVL72", "GB300"),
])
def test_name_variants_resolve(name: str, expected: str) -> None:
    assert lookup_gpu(name).name == expected


def test_bare_a100_is_ambiguous_and_names_both() -> None:
    with pytest.raises(ValueError, match="ambiguous") as err:
        lookup_gpu("a100")
    assert "A100-40GB" in str(err.value) and "A100-80GB" in str(err.value)


@pytest.mark.parametrize("name", ["h100 pcie", "tpu-v5p", ""])
def test_unknown_name_lists_known_gpus(name: str) -> None:
    with pytest.raises(ValueError, match="known GPUs: A100-40GB, A100-80GB, H100-80GB"):
        lookup_gpu(name)


def test_catalog_facts_hang_together() -> None:
    gpus = {g.name: g for g in list_gpus()}
    assert {"A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "B200", "B300", "GB200",
            "GB300"} <= set(gpus)
    for gpu in gpus.values():
        assert gpu.source
        if gpu.usable_gib is not None:
            assert gpu.usable_source
            assert gpu.capacity_gib == gpu.usable_gib
        else:
            assert gpu.capacity_gib == gpu.memory_gib
        assert gpu.sm_version == (None if gpu.sm is None else f"sm_{gpu.sm}")
    h100 = gpus["H100-80GB"]
    assert (h100.usable_gib, h100.memory_gb, h100.nvlink_domain, h100.gpus_per_node) == (
        79.11, 80, 8, 8)
    assert h100.memory_gib == pytest.approx(74.51)
    assert (gpus["GB200"].nvlink_domain, gpus["GB200"].gpus_per_node) == (72, 4)
    assert gpus["A100-80GB"].architecture == "ampere" and gpus["B300"].sm == 103
