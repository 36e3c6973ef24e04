"""The MCP server over the real protocol: in memory for every tool, resource and prompt; the
installed command over stdio; the wire snapshot of tools/list."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client, StdioServerParameters

from mbridge_perf.server import PROMPTS, build_server

from helpers import REPO, SKILL_NAMES, tool

pytestmark = pytest.mark.anyio

SNAPSHOT = REPO / "tests" / "snapshots" / "tools_list.json"
SKILL_URIS = {f"skill://{n}/{f}" for n in SKILL_NAMES for f in ("SKILL.md", "card.yaml")}
REFERENCE_URIS = {f"skill://{n}/references/{p.name}" for n in SKILL_NAMES
                  for p in (REPO / "skills" / n / "references").glob("*.md")}
EXPECTED_URIS = SKILL_URIS | REFERENCE_URIS | {"mbridge-perf://rules", "mbridge-perf://presets",
                                                "mbridge-perf://recipes"}

# The seeds' case: Llama3 70B SFT on 32x H100, FP8 current scaling, TP4 PP4 VPP5 DP2.
LLAMA70B = {
    "preset": "llama3-70b",
    "bridge_config": {
        "model": {"tensor_model_parallel_size": 4, "pipeline_model_parallel_size": 4,
                  "virtual_pipeline_model_parallel_size": 5, "sequence_parallel": True,
                  "seq_length": 4096, "recompute_granularity": "selective",
                  "recompute_modules": ["core_attn"]},
        "train": {"micro_batch_size": 1, "global_batch_size": 32},
        "mixed_precision": "bf16_with_fp8_current_scaling_mixed",
        "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        "cluster": {"num_gpus": 32, "gpus_per_node": 8, "gpu": "H100"},
    },
}


def wire(model: Any) -> Any:
    """Wire JSON (camelCase), independent of the SDK's attribute names."""
    return model.model_dump(by_alias=True, mode="json", exclude_none=True, exclude_unset=True)


@pytest.fixture
async def client() -> Any:
    async with Client(build_server(REPO)) as c:
        yield c


async def call(client: Client, name: str, args: dict[str, Any]) -> tuple[bool, Any, str]:
    r = await client.call_tool(name, args)
    return r.is_error, r.structured_content, r.content[0].text if r.content else ""


# ------------------------------------------------------------------ tools/list

async def test_tools_list_matches_the_committed_wire_snapshot(client: Client) -> None:
    tools = wire(await client.list_tools())["tools"]
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.parent.mkdir(exist_ok=True)
        SNAPSHOT.write_text(json.dumps(tools, indent=2, ensure_ascii=False) + "\n")
    assert tools == json.loads(SNAPSHOT.read_text()), (
        "tools/list changed; review and rerun with UPDATE_SNAPSHOTS=1")


async def test_every_tool_sets_all_four_annotations_and_has_an_output_schema(
        client: Client) -> None:
    for t in wire(await client.list_tools())["tools"]:
        assert set(t["annotations"]) >= {"readOnlyHint", "destructiveHint", "idempotentHint",
                                         "openWorldHint"}, t["name"]
        assert t["outputSchema"]["type"] == "object", t["name"]
        assert len(t["description"]) > 80, t["name"]


async def test_pack_card_lists_exactly_the_registered_tools(client: Client) -> None:
    names = [t.name for t in (await client.list_tools()).tools]
    card = yaml.safe_load((REPO / "card.yaml").read_text())
    assert card["tools"] == names


# ------------------------------------------------------------------ validate_config

async def test_validate_config_accepts_the_seeds_case(client: Client) -> None:
    err, out, _ = await call(client, "validate_config", {"config": LLAMA70B})
    assert not err and out["ok"] is True
    assert out["derived"]["data_parallel_size"] == 2
    assert out["derived"]["layers_per_chunk"] == [[4] * 5] * 4


async def test_validate_config_reports_cpu_offload_with_pipeline_parallelism(
        client: Client) -> None:
    cfg = {**LLAMA70B, "overrides": ["model.cpu_offloading=true",
                                     "model.cpu_offloading_num_layers=2",
                                     "model.recompute_granularity=null"]}
    err, out, _ = await call(client, "validate_config", {"config": cfg})
    assert not err and out["ok"] is False
    f = next(f for f in out["findings"] if f["rule_id"] == "offload.cpu-needs-pp1")
    assert f["severity"] == "error" and "4" in f["message"]
    assert "pipeline_model_parallel_size" in f["fix"] or "cpu_offloading" in f["fix"]
    assert f["skill"] == "nemo-mbridge-perf-memory-tuning"


async def test_validate_config_judges_a_tp_increase_against_the_baseline(
        client: Client) -> None:
    raised = {**LLAMA70B, "overrides": ["model.tensor_model_parallel_size=8"]}
    err, out, _ = await call(client, "validate_config",
                             {"config": raised, "baseline": LLAMA70B})
    assert not err
    f = next(f for f in out["findings"] if f["rule_id"] == "tp.raised-for-memory")
    assert "28.4" in f["message"] and "expandable_segments" in f["fix"]


async def test_validate_config_takes_yaml_text_and_perf_flags(client: Client) -> None:
    text = "model:\n  num_layers: 8\n  hidden_size: 256\n  num_attention_heads: 8\n"
    err, out, _ = await call(client, "validate_config", {"config": {
        "bridge_config": text, "perf_flags": ["-tp", "3", "-ng", "6"]}})
    assert not err and out["ok"] is False
    assert "tp.heads-divisible" in {f["rule_id"] for f in out["findings"]}


BAD_CONFIGS = [
    ({"bridge_config": {"model": {"num_layer": 8}}}, "model.num_layer",
     "did you mean 'num_layers'"),
    ({"bridge_config": "model:\n  num_layers: 8\n    hidden: 2\n"}, "config",
     "not valid YAML"),
    ({"bridge_config": {"model": {"num_layers": "eight"}}}, "model.num_layers", "whole number"),
    ({"bridge_config": {"model": {"num_layers": -1}}}, "model.num_layers", "must be ≥ 0"),
    ({"bridge_config": {"model": {"num_layers": 10**9}}}, "model.num_layers", "beyond any"),
    ({"preset": "llama-70b"}, "preset", "llama3-70b"),
    ({"overrides": ["tp=8"]}, "tp=8", "section.field=value"),
    ({"perf_flags": ["-tpp", "8"]}, "-tpp", "did you mean '-tp'"),
    ({}, "config", "empty"),
]


@pytest.mark.parametrize(("config", "field", "words"), BAD_CONFIGS,
                         ids=[b[1] + ":" + b[2][:10] for b in BAD_CONFIGS])
async def test_validate_config_bad_input_is_an_actionable_tool_error(
        client: Client, config: dict[str, Any], field: str, words: str) -> None:
    err, out, text = await call(client, "validate_config", {"config": config})
    assert err and out is None
    assert f"{field}:" in text and words in text and "call again" in text
    assert "Traceback" not in text


async def test_validate_config_rejects_unknown_argument_keys(client: Client) -> None:
    err, _, text = await call(client, "validate_config",
                              {"config": {"preset": "llama3-8b", "tp": 8}})
    assert err and "config.tp: unknown field" in text and "Extra inputs" not in text


async def test_validate_config_names_the_baseline_when_it_is_the_bad_one(
        client: Client) -> None:
    err, _, text = await call(client, "validate_config", {
        "config": LLAMA70B, "baseline": {"bridge_config": {"modle": {}}}})
    assert err and text.startswith("Error executing tool validate_config: baseline modle:")


# ------------------------------------------------------------------ list_presets

async def test_list_presets_gives_counts_and_sources(client: Client) -> None:
    err, out, _ = await call(client, "list_presets", {})
    assert not err
    by_name = {p["name"]: p for p in out["presets"]}
    assert by_name["deepseek-v3"]["params_b"] == 671
    assert by_name["deepseek-v3"]["num_moe_experts"] == 256
    assert by_name["llama3-70b"]["active_params_b"] is None
    assert all(p["source"] for p in out["presets"])


# ------------------------------------------------------------------ resources

async def test_resources_list_skills_rules_and_presets(client: Client) -> None:
    resources = (await client.list_resources()).resources
    assert {str(r.uri) for r in resources} == EXPECTED_URIS
    mimes = {str(r.uri).rsplit("/", 1)[-1]: r.mime_type for r in resources}
    assert mimes["SKILL.md"] == "text/markdown" and mimes["card.yaml"] == "application/yaml"


async def test_skill_resources_return_the_files_on_disk(client: Client) -> None:
    for name in SKILL_NAMES:
        for rel in ("SKILL.md", "card.yaml"):
            text = (await client.read_resource(f"skill://{name}/{rel}")).contents[0].text
            assert text == (REPO / "skills" / name / rel).read_text(encoding="utf-8")


async def test_every_reference_a_skill_md_links_is_a_resource(client: Client) -> None:
    """A client that reads skills over MCP follows SKILL.md's relative links like a file reader."""
    from mbridge_perf.skillpack.lint import linked_references
    from mbridge_perf.skillpack.pack import get_skill

    for name in SKILL_NAMES:
        skill = get_skill(REPO, name)
        refs = linked_references(skill)
        assert refs, name
        for path in refs:
            rel = path.relative_to(skill.path.resolve()).as_posix()
            text = (await client.read_resource(f"skill://{name}/{rel}")).contents[0].text
            assert text == path.read_text(encoding="utf-8")


async def test_rules_and_presets_resources_are_json(client: Client) -> None:
    rules = json.loads((await client.read_resource("mbridge-perf://rules")).contents[0].text)
    ids = {r["id"] for r in rules}
    assert {"offload.cpu-needs-pp1", "recompute.full-needs-method"} <= ids
    assert len(rules) >= 60
    presets = json.loads(
        (await client.read_resource("mbridge-perf://presets")).contents[0].text)
    assert presets["llama3-70b"]["model"]["num_layers"] == 80


async def test_unknown_resource_is_a_clear_error(client: Client) -> None:
    with pytest.raises(Exception, match=r"(?i)unknown resource|not found"):
        await client.read_resource("skill://no-such-skill/SKILL.md")


# ------------------------------------------------------------------ prompts

async def test_one_prompt_per_skill_checklist_in_card_order(client: Client) -> None:
    prompts = {p.name: p for p in (await client.list_prompts()).prompts}
    assert set(prompts) == set(PROMPTS)
    for name, skill in PROMPTS.items():
        args = {a.name: a.required for a in prompts[name].arguments or []}
        assert args == {"situation": True, "config": False}
        result = await client.get_prompt(name, {"situation": "OOM at 58.8 GB on rank 0",
                                                "config": "model:\n  num_layers: 80\n"})
        text = result.messages[0].content.text
        assert f"skill://{skill}/SKILL.md" in text and "OOM at 58.8 GB" in text
        assert "validate_config" in text and "num_layers: 80" in text
        card = yaml.safe_load((REPO / "skills" / skill / "card.yaml").read_text())
        positions = [text.index(item["text"]) for item in card["answer_checklist"]]
        assert positions == sorted(positions), name


async def test_prompt_without_config_does_not_ask_for_tool_calls(client: Client) -> None:
    text = (await client.get_prompt("recompute_plan", {"situation": "full vs selective?"})
            ).messages[0].content.text
    assert "Training config" not in text


# ------------------------------------------------------------------ stdio

async def test_installed_console_script_serves_over_stdio(tmp_path: Path) -> None:
    params = StdioServerParameters(command=tool("mbridge-perf"), args=["serve"],
                                   cwd=str(tmp_path))
    async with Client(params) as c:
        uris = {str(r.uri) for r in (await c.list_resources()).resources}
        r = await c.call_tool("validate_config", {"config": LLAMA70B})
        prompt = await c.get_prompt("oom_triage", {"situation": "OOM"})
    assert uris == EXPECTED_URIS
    assert r.structured_content["ok"] is True
    assert "expandable_segments" in prompt.messages[0].content.text


def test_pin_on_the_mcp_sdk_is_major_2() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "mcp>=2.3,<3" in deps
    assert sys.version_info >= (3, 11)


def test_docs_tool_reference_is_generated_from_tools_list() -> None:
    """docs/tools.md's reference between the markers is the server's tools/list, rendered."""
    import subprocess

    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_tool_reference.py"),
                           "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_start_up_imports_nothing_heavy_beyond_the_sdk() -> None:
    """The server must start fast enough to be launched with every assistant session."""
    import subprocess

    probe = ("import sys, mcp.server.mcpserver; before = set(sys.modules);"
             "from mbridge_perf.server import build_server; build_server();"
             "heavy = {'torch', 'megatron', 'sqlite3', 'subprocess', 'numpy', 'uvicorn'};"
             "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in heavy))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=60).stdout.strip()
    assert out == "[]"


# ------------------------------------------------------------------ estimate_memory

SEED_YAML = (REPO / "examples" / "llama3_70b_sft_h100.yaml").read_text()


async def test_estimate_memory_on_the_seeds_case(client: Client) -> None:
    err, out, _ = await call(client, "estimate_memory", {
        "config": {"preset": "llama3-70b", "bridge_config": SEED_YAML}})
    assert not err
    assert out["most_loaded_stage"] == 0 and len(out["per_stage"]) == 4
    assert 50 < out["peak_allocated_gib"] < 65  # measured 58.8 GB = 54.8 GiB on rank 0
    # the seeds' OOM was fragmentation: tight, decided by the reserved band, not capacity
    assert out["verdict"] == "tight" and "reserved band" in out["verdict_term"]
    assert out["fits"] is False and out["fits_with_fragmentation"] is False
    assert out["answer_markdown"].startswith("**Verdict: tight**")
    low, high = out["reserved_band_gib"]
    assert 0 < low < high
    stage = out["per_stage"][0]
    assert stage["static_gib"] == pytest.approx(
        stage["weights_gib"] + stage["grads_gib"] + stage["optimizer_gib"], abs=1e-6)
    assert out["assumptions"] and out["not_modeled"]


async def test_estimate_memory_band_narrows_with_expandable_segments(client: Client) -> None:
    base = {"preset": "llama3-70b", "bridge_config": SEED_YAML}
    _, plain, _ = await call(client, "estimate_memory", {"config": base})
    _, expseg, _ = await call(client, "estimate_memory", {"config": {
        **base, "overrides": ["env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"]}})
    assert expseg["reserved_band_gib"][1] < plain["reserved_band_gib"][1] / 2
    assert expseg["fits_with_fragmentation"] is True


ESTIMATE_BAD = [
    ({"config": {"preset": "llama3-70b"}, "gpu": "h999"}, "gpu:", "known GPUs"),
    ({"config": {"bridge_config": {"model": {"num_layers": 2}}}}, "model.hidden_size:",
     "required"),
    ({"config": {"preset": "llama3-70b", "overrides": [
        "model.pipeline_model_parallel_size=3"]}}, "model.", "pipeline"),
    ({"config": {"preset": "llama3-70b"}, "imbalance": 0.5}, "imbalance",
     "imbalance: must be ≥ 1.0"),
    ({"config": {"preset": "llama3-70b", "bridge_config": {"modle": {}}}}, "modle:",
     "not a config section"),
]


@pytest.mark.parametrize(("args", "field", "words"), ESTIMATE_BAD,
                         ids=["unknown-gpu", "missing-field", "bad-split", "imbalance",
                              "bad-section"])
async def test_estimate_memory_bad_input_is_an_actionable_tool_error(
        client: Client, args: dict[str, Any], field: str, words: str) -> None:
    err, out, text = await call(client, "estimate_memory", args)
    assert err and out is None
    assert field in text and words in text, text


def test_docs_estimate_example_is_the_commands_real_output() -> None:
    import subprocess

    text = (REPO / "docs" / "memory.md").read_text()
    block = text.split("<!-- estimate-example -->", 1)[1].split("```console\n", 1)[1]
    block = block.split("```", 1)[0]
    command, expected = block.split("\n", 1)
    args = command.removeprefix("$ mbridge-perf ").split()
    proc = subprocess.run([tool("mbridge-perf"), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected


def test_serve_without_a_skill_pack_is_one_clear_line(tmp_path: Path) -> None:
    import subprocess

    proc = subprocess.run([tool("mbridge-perf"), "serve"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MBRIDGE_PERF_PACK": str(tmp_path)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: MBRIDGE_PERF_PACK=") and "Traceback" not in proc.stderr
