"""Megatron Bridge's estimate_training_memory next to ours (memory.bridge_compare): on Bridge
0.6.2's recorded estimates for the shipped corpus, and live where megatron.bridge imports."""

from __future__ import annotations

import json
import subprocess

import pytest

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config, shipped_recipe
from mbridge_perf.config.recipes import recipe_text, recorded_bridge_estimates
from mbridge_perf.memory.answer import estimate_with_answer
from mbridge_perf.memory.bridge_compare import (
    BridgeNumbers,
    bridge_importable,
    compare,
    recorded_numbers,
    side_by_side,
)
from mbridge_perf.memory.estimate import estimate_memory

from helpers import tool

OURS_ONLY = {"CUDA graphs", "fragmentation band", "NCCL", "CUDA context"}


def test_every_recorded_bridge_estimate_is_shown_with_both_totals_and_the_named_terms() -> None:
    shown = 0
    for name, row in recorded_bridge_estimates().items():
        if not row["total_gib"]:
            assert recorded_numbers(name) is None
            continue
        try:
            cfg = load_config(recipe=name)
            report = estimate_memory(cfg)
        except ConfigError:  # Wan diffusion and the other dumps the reader refuses
            continue
        side = side_by_side(report, cfg, shipped_recipe(cfg))
        assert side.source == "recorded", name
        assert side.bridge_total_gib == pytest.approx(float(row["total_gib"]))
        assert side.ours_peak_allocated_gib == pytest.approx(report.peak_allocated_gib, abs=1e-3)
        terms = {t.name: t for t in side.terms}
        assert terms["weights + gradients + optimizer"].bridge_gib == pytest.approx(
            float(row["weights_optimizer_gib"]))
        assert terms["activations (+ working set)"].bridge_gib == pytest.approx(
            float(row["activations_gib"]))
        assert set(terms) >= OURS_ONLY and all(terms[t].bridge_gib is None for t in OURS_ONLY)
        assert ("dispatcher buffers" in terms) == bool(cfg.model.num_moe_experts)
        assert f"{float(row['total_gib']):.1f} GiB" in side.message
        shown += 1
    assert shown >= 330


def test_the_comparison_names_what_bridges_formula_leaves_out() -> None:
    name = "deepseek_v3_pretrain_256gpu_b200_fp8mx_config"
    cfg = load_config(recipe=name)
    side = estimate_with_answer(cfg).bridge
    assert side is not None and side.source == "recorded"
    leaves = " ".join(side.bridge_leaves_out)
    assert "MLA" in leaves and "MoE dispatch" in leaves and "FP8 parameters" in leaves
    graphs = next(t for t in side.terms if t.name == "CUDA graphs")
    assert graphs.ours_gib > 10  # the recipe's per-layer graphs hold a private pool


def test_a_changed_recipe_or_another_config_gets_one_line_instead() -> None:
    cfg = load_config(recipe="deepseek_v3_pretrain_256gpu_b200_fp8mx_config",
                      overrides=["train.micro_batch_size=2"])
    side = estimate_with_answer(cfg).bridge
    assert side is not None and side.source == "unavailable" and not side.terms
    assert len(side.message.splitlines()) == 1
    want = "needs a live ConfigContainer" if bridge_importable() else "not installed"
    assert want in side.message


def test_the_exact_dump_of_a_shipped_recipe_gets_its_recorded_estimate(tmp_path) -> None:
    name = "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"
    dump = tmp_path / "config.yaml"
    dump.write_text(recipe_text(name), encoding="utf-8")
    out = subprocess.run([tool("mbridge-perf"), "estimate", str(dump)], capture_output=True,
                         text=True, timeout=120)
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("  Bridge 0.6.2's estimate_training_memory "
                           f"recorded for {name}")
    edited = dump.read_text() + "\n# edited\n"
    assert shipped_recipe(load_config(text=edited)) is None
    cfg = load_config(text=dump.read_text())
    assert shipped_recipe(cfg) == name
    changed = cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"micro_batch_size": 1})})
    assert shipped_recipe(changed) is None  # a changed copy is no longer the recipe
    out = json.loads(subprocess.run([tool("mbridge-perf"), "estimate", str(dump), "--set",
                                     "train.micro_batch_size=1", "--json"],
                                    capture_output=True, text=True, timeout=120).stdout)
    assert out["bridge"]["source"] == "unavailable"


def test_compare_lines_up_live_numbers_term_by_term() -> None:
    cfg = load_config(recipe="llama3_70b_pretrain_64gpu_h100_fp8cs_config")
    report = estimate_memory(cfg)
    side = compare(report, cfg, BridgeNumbers(50.0, 30.0, 20.0, "live", "Bridge live"))
    assert side.source == "live" and side.bridge_total_gib == 50.0
    assert side.message.startswith("Bridge live: 50.0 GiB; ours ")
    assert [t.name for t in side.terms][:3] == ["weights + gradients + optimizer",
                                                 "activations (+ working set)", "peak allocated"]


def test_live_bridge_estimate_where_megatron_bridge_imports() -> None:
    pytest.importorskip("megatron.bridge", reason="Megatron Bridge is not installed here")
    from megatron.bridge.recipes.llama import llama3_8b_pretrain_config  # type: ignore

    from mbridge_perf import api

    container = llama3_8b_pretrain_config()
    report = api.estimate(container)
    assert report.bridge is not None and report.bridge.source == "live"
    assert report.bridge.bridge_total_gib and report.bridge.bridge_total_gib > 0
