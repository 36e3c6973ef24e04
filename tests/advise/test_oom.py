"""diagnose_oom on recorded message shapes (fixtures/oom_messages.yaml names their source):
fragmentation vs capacity vs none, the numbers read, the failure-table row, the plan with a
config; garbage and huge texts never crash."""

from __future__ import annotations

import json
import subprocess
import sys
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


# ------------------------------------------------------------------ measured vs estimated
# The seed case: the rank-3 OOM of the memory-tuning skill's log triage (54.76 GiB allocated,
# 21.93 GiB reserved but unallocated, 79.11 GiB capacity, 1.21 GiB free) with the real Bridge
# 0.6.2 dump of the same Llama3 70B SFT FP8-CS 32x H100 recipe. The dump exports
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the fix); the run that OOMed had no such
# setting, so the case is checked both ways.
SEED_LOG = (REPO / "skills" / "nemo-mbridge-perf-memory-tuning" / "evals" /
            "oom_rank3_fragmentation.log")
DUMP = REPO / "examples" / "llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml"


def _dump(tmp_path: Path, allocator: bool) -> Path:
    if allocator:
        return DUMP
    out = tmp_path / "dump_without_allocator.yaml"
    out.write_text("".join(line for line in DUMP.read_text().splitlines(keepends=True)
                           if "PYTORCH_CUDA_ALLOC_CONF" not in line))
    return out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mbridge_perf", *args], capture_output=True,
                          text=True, cwd=REPO, timeout=300)


def _check_seed(d: dict) -> None:
    assert d["classification"] == "fragmentation", d["reason"]
    rows = {r["term"]: r for r in d["reconciliation"]}
    assert {"allocated", "reserved_unallocated", "outside_pytorch", "in_use"} <= set(rows)
    assert rows["allocated"]["measured_gib"] == 54.76
    assert rows["reserved_unallocated"]["measured_gib"] == 21.93
    assert rows["outside_pytorch"]["measured_gib"] == pytest.approx(79.11 - 1.21 - 76.69,
                                                                  abs=0.01)
    for r in rows.values():
        assert r["difference_gib"] == pytest.approx(r["measured_gib"] - r["estimated_gib"],
                                                    abs=0.011)
    b = d["plan_budget"]
    assert b["measured_outside_gib"] == rows["outside_pytorch"]["measured_gib"]
    assert b["estimated_outside_gib"] == rows["outside_pytorch"]["estimated_gib"]
    assert b["target_gib"] == pytest.approx(79.11 - b["measured_outside_gib"]
                                            + b["estimated_outside_gib"], abs=0.011)
    plan = d["plan"]
    assert plan["budget_gib"] == pytest.approx(b["target_gib"], abs=0.011)
    # the allocator fix is the first step, and on this case it is enough
    assert plan["steps"][0]["rung"] == "allocator" and plan["first_fitting_step"] == 0
    assert plan["steps"][0]["fits"]  # fits or tight: the ladder stops here
    md = d["answer_markdown"]
    assert (md.index("**fragmentation**") < md.index("Measured vs estimated")
            < md.index("judged on the measured state") < md.index("## Memory plan"))
    assert md.index("expandable_segments:True") < md.index("## Memory plan")


@pytest.mark.parametrize("allocator", [False, True], ids=["run-without-allocator", "as-dumped"])
def test_seed_oom_with_the_bridge_dump_through_the_cli(tmp_path: Path, allocator: bool) -> None:
    r = _cli("diagnose", str(SEED_LOG), "--config", str(_dump(tmp_path, allocator)), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    _check_seed(d)
    assert d["allocator_set"] is allocator
    # a dump that exports the setting next to a 21.93 GiB band: it did not reach the process
    assert d["allocator_in_effect"] is (False if allocator else None)
    if allocator:
        # the band the run showed is far wider than the estimate's with expandable segments
        band = next(r for r in d["reconciliation"] if r["term"] == "reserved_unallocated")
        assert band["difference_gib"] > 10
        assert "did not run with it" in d["reason"]
        assert "not in effect" in d["answer_markdown"]


@pytest.mark.anyio
async def test_seed_oom_with_the_bridge_dump_over_mcp(tmp_path: Path) -> None:
    from mcp import Client

    from mbridge_perf.server import build_server

    async with Client(build_server(REPO)) as c:
        r = await c.call_tool("diagnose_oom", {
            "text": SEED_LOG.read_text(),
            "config": {"bridge_config": _dump(tmp_path, False).read_text()}})
    assert not r.is_error, r.content[0].text
    _check_seed(r.structured_content)


def test_the_budget_follows_the_memory_measured_outside_pytorch() -> None:
    """Another process holding 10 GiB lowers the plan's budget by those 10 GiB; the estimate's
    own outside term stays what the ladder's need counts."""
    cfg = load_config(preset="llama3-70b", file=SEED)
    text = CASES[0]["text"]
    crowded = text.replace("GPU 0 has a total capacity of 79.11 GiB of which 245.06 MiB is "
                           "free.", "GPU 0 has a total capacity of 79.11 GiB of which 245.06 "
                           "MiB is free. Process 4711 has 10.00 GiB memory in use.").replace(
        "54.76 GiB is allocated", "44.76 GiB is allocated").replace(
        "this process has 78.86 GiB", "this process has 68.86 GiB")
    a, b = diagnose_oom(text, cfg), diagnose_oom(crowded, cfg)
    assert a.plan_budget is not None and b.plan_budget is not None
    assert b.plan_budget.measured_outside_gib == pytest.approx(
        a.plan_budget.measured_outside_gib + 10, abs=0.01)
    assert b.plan_budget.target_gib == pytest.approx(a.plan_budget.target_gib - 10, abs=0.02)
    assert b.plan is not None and b.plan.budget_gib == pytest.approx(b.plan_budget.target_gib,
                                                                     abs=0.011)
    outside = next(r for r in b.reconciliation if r.term == "outside_pytorch")
    assert "other processes" in outside.note


EXPORTED = "+ export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
SMALL_BAND = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 "
              "has a total capacity of 79.11 GiB of which 180.00 MiB is free. Including "
              "non-PyTorch memory, this process has 78.93 GiB memory in use. Of the allocated "
              "memory 75.90 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch "
              "but unallocated.")


def test_allocator_set_with_a_small_band_is_capacity_not_fragmentation() -> None:
    # without the setting a 1.5 GiB band next to a 0.25 GiB request is fragmentation ...
    assert diagnose_oom(SMALL_BAND).classification == "fragmentation"
    # ... with it exported, expandable segments leave up to ~10 % of allocated: capacity
    d = diagnose_oom(EXPORTED + SMALL_BAND)
    assert d.classification == "capacity", d.reason
    assert d.failure_mode is not None and d.failure_mode.name == "capacity-oom"
    # the one-rank-of-many signature does not override a working allocator setting either
    d = diagnose_oom(EXPORTED + CASES[4]["text"])
    assert d.classification == "capacity", d.reason


def test_allocator_set_in_the_config_with_a_small_band_is_capacity() -> None:
    cfg = load_config(preset="llama3-70b", file=SEED,
                      overrides=["env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"])
    d = diagnose_oom(SMALL_BAND, cfg)
    assert d.classification == "capacity" and d.allocator_in_effect is True
    assert d.plan is not None and all(s.rung != "allocator" for s in d.plan.steps)


def test_an_allocator_exported_in_the_log_is_what_the_plan_starts_from() -> None:
    cfg = load_config(preset="llama3-70b", file=SEED)  # the config does not set it
    d = diagnose_oom(EXPORTED + SMALL_BAND, cfg)
    assert d.classification == "capacity"
    assert d.plan is not None and d.plan.baseline.expandable_segments
    assert all(s.rung != "allocator" for s in d.plan.steps)


def test_a_range_estimate_compares_with_its_nearest_end() -> None:
    cfg = load_config(preset="llama3-70b", file=SEED)
    d = diagnose_oom(CASES[0]["text"], cfg)
    for r in d.reconciliation:
        if r.estimated_range_gib is not None:
            lo, hi = r.estimated_range_gib
            inside = lo <= r.measured_gib <= hi
            assert (r.difference_gib == 0) == inside
