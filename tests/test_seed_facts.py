"""The seeds' measured numbers and representative layouts landed in the right skill: in the text
the assistant reads (SKILL.md and the references/ files it links, all inside the skill folder)
and in the card the tools read (measured_results)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from mbridge_perf.skillpack.lint import numbers_in_text, numeric_leaves, readable_text
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO

MEM = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"
LONG = "nemo-mbridge-perf-moe-long-context"
WORKFLOW = "nemo-mbridge-perf-moe-optimization-workflow"

# number as the seed writes it -> skills whose seed states it (as a measurement)
SEED_NUMBERS: dict[str, tuple[str, ...]] = {
    "709.93": (MEM, RECOMPUTE),   # Llama3 70B SFT golden TFLOP/s/GPU, 32x H100 FP8
    "58.8": (MEM, RECOMPUTE),     # baseline peak GB (fragmentation OOM)
    "60.2": (MEM,),               # VPP=10 peak GB
    "53.2": (MEM,),               # PP 4->8 peak GB
    "50.2": (MEM,),               # TP 4->8 peak GB
    "668.0": (MEM,),              # PP=8 TFLOP/s/GPU
    "508.7": (MEM,),              # TP=8 TFLOP/s/GPU
    "-28.4": (MEM,),              # TP=8 vs golden, %
    "-5.9": (MEM,),               # PP=8 vs golden, %
    "593.6": (RECOMPUTE,),        # mlp recompute TFLOP/s/GPU
    "586.8": (RECOMPUTE,),        # mlp + core_attn recompute TFLOP/s/GPU
    "-16.4": (RECOMPUTE,),        # mlp recompute vs golden, %
    "-17.3": (RECOMPUTE,),        # mlp + core_attn vs golden, %
    "55.6": (RECOMPUTE,),         # peak GB with mlp recompute
    "0.11": (WORKFLOW,),          # comm hidden under GEMM/attention before EP overlap, %
    "36.55": (WORKFLOW,),         # ... after
    "24.7138": (WORKFLOW,),       # step time s before EP overlap
    "20.9920": (WORKFLOW,),       # ... after
    "244.039": (WORKFLOW,),       # model TFLOPS/GPU before
    "287.305": (WORKFLOW,),       # ... after plain EP overlap
    "299.352": (WORKFLOW,),       # tuned recipe with more HybridEP tuning
}


def _text(name: str) -> str:
    """What an agent can read for this skill: SKILL.md plus its linked references."""
    return readable_text(get_skill(REPO, name))


def _card_numbers(name: str) -> set[Decimal]:
    card = get_skill(REPO, name).card
    return {abs(Decimal(repr(v))).normalize() for v in numeric_leaves(card["measured_results"])}


@pytest.mark.parametrize("number", sorted(SEED_NUMBERS))
def test_seed_number_is_in_its_skill_and_card(number: str) -> None:
    value = abs(Decimal(number)).normalize()
    for name in SEED_NUMBERS[number]:
        assert value in numbers_in_text(_text(name)), f"{number} not in {name}"
        assert value in _card_numbers(name), f"{number} not in {name} card measured_results"


def test_decimals_are_written_as_the_seed_writes_them() -> None:
    """Trailing zeros carry precision: 20.9920 s and 668.0 TFLOP/s stay as measured."""
    assert "20.9920" in _text(WORKFLOW)
    assert "668.0" in _text(MEM)


def test_unrelated_skills_do_not_claim_the_workflow_a_b() -> None:
    for name in (MEM, RECOMPUTE, LONG):
        assert Decimal("24.7138") not in _card_numbers(name)


LAYOUTS: list[dict[str, Any]] = [
    {"model": "DeepSeek-V3", "gpu": "H100", "seq_length": 131072,
     "tp": 1, "cp": 32, "ep": 32, "pp": 8, "vpp": 4, "dispatcher": "DeepEP"},
    {"model": "DeepSeek-V3", "gpu": "H100", "seq_length": 262144,
     "tp": 1, "cp": 64, "ep": 32, "pp": 8, "edp": 2, "vpp": 4, "dispatcher": "DeepEP"},
    {"model": "Qwen3 235B", "gpu": "GB200", "seq_length": 131072,
     "tp": 4, "cp": 4, "ep": 32, "pp": 4, "vpp": 12, "dispatcher": "HybridEP"},
]


def _rows(card: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for t in card["measured_results"] for r in t["rows"]]


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x['model']}-{x['seq_length']}")
def test_representative_long_context_layouts_are_in_the_long_context_skill(
        layout: dict[str, Any]) -> None:
    skill = get_skill(REPO, LONG)
    matches = [r for r in _rows(skill.card) if all(r.get(k) == v for k, v in layout.items())]
    assert len(matches) == 1, f"{layout} not in {LONG} card"
    row = matches[0]
    # valid labels at the pin, never the seed's shorthand
    assert set(row["recompute_modules"]) <= {"core_attn", "moe_act", "layernorm", "mla_up_proj",
                                             "mlp", "moe", "shared_experts", "gdn_norm_out"}
    context = f"{layout['seq_length'] // 1024}K"
    lines = [line for line in _text(LONG).splitlines()
             if layout["model"].split()[0] in line and layout["gpu"] in line and context in line]
    cells = [[c.strip() for c in line.split("|")] for line in lines]
    wanted = [str(layout[k]) for k in ("tp", "cp", "ep", "pp", "vpp")]
    assert any(all(w in row for w in wanted) for row in cells), (
        f"no SKILL.md / reference table row gives {layout['model']} {context} on "
        f"{layout['gpu']} as "
        f"TP/CP/EP/PP/VPP {wanted}")


def test_dsv3_layouts_keep_expert_and_dense_meshes_consistent() -> None:
    """Parallel folding: dense TP*CP*DP*PP and expert ETP*EP*EDP*PP give the same world size."""
    dsv3_256k = LAYOUTS[1]
    world = dsv3_256k["ep"] * 1 * dsv3_256k["edp"] * dsv3_256k["pp"]
    dense_dp = world // (dsv3_256k["tp"] * dsv3_256k["cp"] * dsv3_256k["pp"])
    assert (world, dense_dp) == (512, 1)
    assert "512" in _text(LONG)
