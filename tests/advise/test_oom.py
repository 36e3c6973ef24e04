"""diagnose_oom on recorded message shapes (fixtures/oom_messages.yaml names their source):
fragmentation vs capacity vs none, the numbers read, the failure-table row, the plan with a
config; garbage and huge texts never crash."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mbridge_perf.advise.oom import SCAN_CHARS, diagnose_oom
from mbridge_perf.config.load import load_config

from helpers import REPO

CASES = yaml.safe_load((Path(__file__).parent / "fixtures" / "oom_messages.yaml").read_text())
SEED = REPO / "examples" / "llama3_70b_sft_h100.yaml"


def test_the_recorded_shapes_cover_the_issue() -> None:
    assert len(CASES) >= 8
    assert {c["expect"] for c in CASES} == {"fragmentation", "capacity", "none"}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_recorded_message_is_classified(case: dict) -> None:
    d = diagnose_oom(case["text"])
    assert d.classification == case["expect"], d.reason
    assert d.reason


def test_current_message_numbers_are_read_in_gib() -> None:
    d = diagnose_oom(CASES[0]["text"])
    n = d.numbers
    assert (n.requested_gib, n.allocated_gib, n.reserved_unallocated_gib) == (0.875, 54.76,
                                                                              22.61)
    assert n.total_capacity_gib == 79.11 and n.rank == 0 and n.gpu_index == 0
    assert d.message_format == "pytorch>=2.1"
    assert d.failure_mode is not None and d.failure_mode.name == "fragmentation-oom"
    assert "expandable_segments:True" in d.failure_mode.fix
    assert d.allocator_set is None  # the hint sentence is not the setting


def test_legacy_message_derives_the_unallocated_band() -> None:
    d = diagnose_oom(CASES[3]["text"])
    assert d.message_format == "pytorch-2.0/1.x"
    assert d.numbers.reserved_unallocated_gib == pytest.approx(0.56)


def test_capacity_with_allocator_set_points_at_the_capacity_row() -> None:
    d = diagnose_oom(CASES[1]["text"])
    assert d.allocator_set is True
    assert d.failure_mode is not None and d.failure_mode.name == "capacity-oom"


def test_failure_rows_are_the_skill_cards_verbatim() -> None:
    card = yaml.safe_load((REPO / "skills" / "nemo-mbridge-perf-memory-tuning" /
                           "card.yaml").read_text())
    rows = {r["name"]: r for r in card["failure_modes"]}
    for text in (CASES[0]["text"], CASES[1]["text"]):
        f = diagnose_oom(text).failure_mode
        assert f is not None
        assert f.symptom == rows[f.name]["symptom"] and f.fix == rows[f.name]["fix"]


def test_per_rank_lines_are_read() -> None:
    d = diagnose_oom(CASES[4]["text"])
    assert [r.rank for r in d.ranks] == [0, 8, 16, 24]
    assert d.ranks[0].max_allocated_gib == pytest.approx(58.8 * 1e9 / 2**30, abs=1e-3)


def test_with_a_config_the_plan_comes_along() -> None:
    cfg = load_config(preset="llama3-70b", file=SEED)
    d = diagnose_oom(CASES[0]["text"], cfg)
    assert d.plan is not None and d.plan.steps[0].rung == "allocator"
    assert d.answer_markdown.index("fragmentation") < d.answer_markdown.index("## Memory plan")


@pytest.mark.parametrize("junk", ["", "\x00\xff" * 100, "CUDA out of memory. Tried to allocate",
                                  "Tried to allocate 1e400 GiB", "{" * 10000, "🙂" * 5000,
                                  "CUDA out of memory. Tried to allocate 1.2.3 GiB (GPU 0; "
                                  "1.2.3 GiB total capacity; 1..2 GiB already allocated)"])
def test_garbage_is_none_with_a_reason(junk: str) -> None:
    d = diagnose_oom(junk)
    assert d.classification == "none" and d.reason


def test_a_huge_log_is_read_from_its_tail() -> None:
    noise = "iteration 1/100 | lm loss: 1.0\n" * (SCAN_CHARS // 20)
    d = diagnose_oom(noise + CASES[0]["text"])
    assert d.classification == "fragmentation" and d.numbers.rank == 0
