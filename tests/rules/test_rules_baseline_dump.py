"""Rules about a change (validate with a baseline) on a real Bridge dump, whose world size is
implied (comm_overlap.data_parallel_size x TP·PP·CP), not given: raising TP or PP on the dump by
an override keeps the recorded data_parallel_size, so the world it implies grows; the GPUs do
not, and the DP loss must still be seen - through the CLI and MCP."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from mbridge_perf.config.derived import derive
from mbridge_perf.config.load import load_config

from helpers import REPO

DUMP = REPO / "examples" / "llama3_70b_sft_32gpu_h100_fp8cs_bridge_dump.yaml"
TP8 = "model.tensor_model_parallel_size=8"
PP8 = "model.pipeline_model_parallel_size=8"


def _validate(*args: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "mbridge_perf", "validate", str(DUMP), *args,
                        "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def _finding(report: dict[str, Any], rule_id: str) -> dict[str, Any] | None:
    return next((f for f in report["findings"] if f["rule_id"] == rule_id), None)


def test_the_dump_implies_its_world_and_an_override_grows_it() -> None:
    """The premise: the dump's world is implied, and an edited TP carries the old DP along."""
    base, raised = load_config(file=DUMP), load_config(file=DUMP, overrides=[TP8])
    d0, d1 = derive(base), derive(raised)
    assert d0.world_from_dump and d0.world_size == 32 and d0.dp == 2
    assert d1.world_from_dump and d1.world_size == 64  # what the dump's DP implies at TP 8
    # judged on the baseline's 32 GPUs: DP 2 -> 1
    assert derive(raised, base).dp_lowered() == (2, 1)


def test_cli_validate_flags_a_tp_raise_on_the_dump() -> None:
    rc, report = _validate("--set", TP8, "--baseline", str(DUMP))
    f = _finding(report, "tp.raised-for-memory")
    assert f is not None, [x["rule_id"] for x in report["findings"]]
    assert f["severity"] == "warning" and rc == 0
    assert "4 → 8" in f["message"] and "DP 2 → 1" in f["message"]
    assert "same 32 GPUs" in f["message"] and "28.4" in f["message"]
    # the dump already exports the allocator setting: the fix does not ask for it again
    assert "already has expandable_segments:True" in f["fix"]


def test_cli_validate_flags_a_pp_raise_on_the_dump() -> None:
    _, report = _validate("--set", PP8, "--baseline", str(DUMP))
    f = _finding(report, "pipeline.pp-raised-for-memory")
    assert f is not None and "DP 2 → 1" in f["message"]


@pytest.mark.parametrize("args", [("--baseline", str(DUMP)), (), ("--set", TP8)],
                         ids=["unchanged", "no-baseline", "no-baseline-tp8"])
def test_cli_validate_is_quiet_without_a_tp_raise_against_a_baseline(args: tuple) -> None:
    _, report = _validate(*args)
    assert _finding(report, "tp.raised-for-memory") is None


def test_a_world_the_dump_does_not_imply_still_wins() -> None:
    """A change that states a cluster.num_gpus its data_parallel_size does not imply keeps its
    own world: TP 4 -> 8 on 64 GPUs is DP 2 there, no DP loss. (A stated world equal to the
    implied one cannot be told apart from it and is read as the baseline's GPUs.)"""
    base = load_config(file=DUMP, overrides=["cluster.num_gpus=32"])
    grown = load_config(file=DUMP, overrides=[TP8, "cluster.num_gpus=64",
                                              "comm_overlap.data_parallel_size=4"])
    assert derive(grown, base).dp_lowered() is None


@pytest.mark.anyio
async def test_mcp_validate_config_flags_a_tp_raise_on_the_dump() -> None:
    from mcp import Client

    from mbridge_perf.server import build_server

    text = DUMP.read_text()
    async with Client(build_server(REPO)) as c:
        r = await c.call_tool("validate_config", {
            "config": {"bridge_config": text, "overrides": [TP8]},
            "baseline": {"bridge_config": text}})
        assert not r.is_error, r.content[0].text
        f = _finding(r.structured_content, "tp.raised-for-memory")
        assert f is not None and "DP 2 → 1" in f["message"]
        r = await c.call_tool("validate_config", {
            "config": {"bridge_config": text}, "baseline": {"bridge_config": text}})
        assert _finding(r.structured_content, "tp.raised-for-memory") is None
