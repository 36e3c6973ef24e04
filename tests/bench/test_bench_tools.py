"""The benchmark tools over MCP (in memory) and the `mbridge-perf bench` CLI, on the built-in
`cpu-test` profile: a real Megatron-Core GPT trains on CPU under torchrun, launched by the local
executor (the Slurm path is covered by test_slurm_cluster.py)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client

from mbridge_perf.server import build_server

from helpers import REPO, require_megatron, tool

FIXTURES = Path(__file__).parent / "fixtures"
TINY = {"bridge_config": {
    "model": {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64,
              "vocab_size": 512, "tensor_model_parallel_size": 2, "sequence_parallel": True},
    "train": {"micro_batch_size": 1, "global_batch_size": 1},
    "cluster": {"num_gpus": 2}}}


@pytest.fixture(autouse=True)
def registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path_factory.getbasetemp() / "bench-tools" / "runs.sqlite3"
    monkeypatch.setenv("MBRIDGE_PERF_REGISTRY", str(path))
    monkeypatch.setenv("MBRIDGE_PERF_PROFILES", str(path.parent / "profiles"))
    return path


@pytest.fixture
async def client() -> Iterator[Client]:
    async with Client(build_server(REPO)) as c:
        yield c


async def call(client: Client, name: str, args: dict[str, Any], **kw: Any
               ) -> tuple[bool, Any, str]:
    r = await client.call_tool(name, args, **kw)
    return r.is_error, r.structured_content, r.content[0].text if r.content else ""


async def finish(client: Client, run_id: str, progress: list[float] | None = None) -> dict:
    async def on_progress(p: float, total: float | None, msg: str | None) -> None:
        if progress is not None:
            progress.append(p)

    for _ in range(10):  # each call waits at most 30 s
        err, st, text = await call(client, "benchmark_status", {"run_id": run_id, "wait_s": 30},
                                   progress_callback=on_progress)
        assert not err, text
        if st["terminal"]:
            return st
    pytest.fail(f"run {run_id} did not finish: {st}")


pytestmark = pytest.mark.anyio


async def test_dry_run_renders_script_and_contract_and_submits_nothing(
        client: Client, registry: Path) -> None:
    err, out, text = await call(client, "submit_benchmark", {"config": TINY,
                                                             "profile": "cpu-test"})
    assert not err, text
    assert out["dry_run"] is True and out["run_id"] is None and out["steps"] == 50
    assert out["script"].startswith("#!/bin/bash") and "torchrun" in out["script"]
    assert out["contract"]["layout"]["tp"] == 2
    assert out["contract"]["window"]["start"] == 41
    assert not registry.exists() or "DRY-RUN" not in registry.read_bytes().decode("latin-1")


async def test_submit_poll_result_and_a_valid_a_b(client: Client) -> None:
    require_megatron()
    runs = []
    for variant in (TINY, {**TINY, "overrides": ["model.recompute_granularity=full",
                                                  "model.recompute_method=uniform",
                                                  "model.recompute_num_layers=1"]}):
        err, handle, text = await call(client, "submit_benchmark", {
            "config": variant, "profile": "cpu-test", "dry_run": False})
        assert not err, text
        assert handle["run_id"] and handle["external_id"] and handle["poll_after_s"] > 0
        runs.append(handle["run_id"])
    progress: list[float] = []
    for run_id in runs:
        st = await finish(client, run_id, progress)
        assert st["state"] == "completed" and st["last_iteration"] == 50
    assert (progress and progress == sorted(progress)) or len(progress) > 0
    err, res, text = await call(client, "benchmark_result", {"run_id": runs[0]})
    assert not err, text
    assert res["result"]["outcome"] == "pass" and res["result"]["valid"] is True
    assert res["result"]["metrics"]["step_time_ms"]["median"] > 0
    assert "Benchmark result: pass" in res["markdown"]
    assert res["evidence"]["contract"]["layout"]["tp"] == 2
    # the library versions the job's Python reported, recorded in the contract (issue 23)
    import importlib.metadata as md
    versions = res["evidence"]["contract"]["versions"]
    assert versions["torch"] == md.version("torch") == res["evidence"]["versions_reported"]["torch"]
    assert versions["megatron_core"] == md.version("megatron-core")
    assert "megatron_bridge" in res["evidence"]["versions_unknown"]
    assert "Versions unknown" in res["markdown"] and "megatron_bridge" in res["markdown"]
    err, cmp, text = await call(client, "compare_benchmarks", {"run_a": runs[0],
                                                              "run_b": runs[1]})
    assert not err, text
    assert cmp["comparison"]["valid"] is True and cmp["comparison"]["variable"] == "recompute"
    assert {d["metric"] for d in cmp["comparison"]["deltas"]} >= {"step_time_ms"}
    # the step-time model's expected change beside the measured one (a CPU run has no GPU
    # for it to price: said, not guessed)
    pred = cmp["predicted"]
    assert pred["measured_change_pct"] == pytest.approx(
        next(d["delta_pct"] for d in cmp["comparison"]["deltas"]
             if d["metric"] == "step_time_ms"), abs=0.01)
    assert pred["verdict"] == "not_predicted" and pred["note"].startswith("no prediction")


async def test_cancel_stops_a_running_benchmark(client: Client) -> None:
    require_megatron()
    err, handle, text = await call(client, "submit_benchmark", {
        "config": TINY, "profile": "cpu-test", "dry_run": False, "steps": 100000})
    assert not err, text
    err, st, text = await call(client, "cancel_benchmark", {"run_id": handle["run_id"]})
    assert not err, text
    assert st["state"] == "cancelled" and st["terminal"] is True
    err, again, _ = await call(client, "cancel_benchmark", {"run_id": handle["run_id"]})
    assert not err and again["state"] == "cancelled"  # idempotent


BAD = [
    ("submit_benchmark", {"config": TINY, "profile": "no-such-profile"}, "profile:"),
    ("submit_benchmark", {"config": TINY, "profile": "../../etc/passwd"}, "not a profile name"),
    ("submit_benchmark", {"config": TINY, "profile": "cpu-test", "steps": 10},
     "steps: must be ≥ 50"),
    ("submit_benchmark", {"config": TINY, "profile": "cpu-test", "steps": 60,
                          "window_start": 51, "window_end": 70}, "steps:"),
    ("submit_benchmark", {"config": {**TINY, "overrides": ["model.cpu_offloading=true",
                                                           "model.pipeline_model_parallel_size=2",
                                                           "model.num_layers=4"]},
                          "profile": "cpu-test"}, "offload.cpu-needs-pp1"),
    ("submit_benchmark", {"config": {"bridge_config": {"model": {"num_layer": 2}}},
                          "profile": "cpu-test"}, "model.num_layer"),
    # issue 23: a tool argument's env may not choose the rendezvous, srun's programs, or
    # code, files, hosts and where credentials go — refused before anything is rendered
    *[("submit_benchmark", {"config": {**TINY, "overrides": overrides}, "profile": "cpu-test",
                            "dry_run": dry}, f"env.{overrides[0][4:].split('=')[0]}:")
      for dry in (True, False) for overrides in (
          ["env.SLURM_JOB_NODELIST=attacker.example.com", "env.SLURM_JOB_NUM_NODES=2"],
          ["env.SLURM_TASK_PROLOG=/tmp/x.sh"], ["env.SLURM_EPILOG=/tmp/x.sh"],
          ["env.MASTER_ADDR=attacker.example.com"], ["env.PET_RDZV_ENDPOINT=evil:29500"],
          ["env.TMP=/tmp/evil"], ["env.TRITON_CACHE_MANAGER=evil:Manager"],
          ["env.UV_INDEX_URL=https://evil"], ["env.PIP_EXTRA_INDEX_URL=https://evil"],
          ["env.HF_ENDPOINT=https://evil"], ["env.https_proxy=http://evil:3128"],
          ["env.HF_HUB_CACHE=/tmp/evil"], ["env.HF_DATASETS_TRUST_REMOTE_CODE=1"],
          ["env.APPTAINER_BIND=/:/host"], ["env.TORCH_TRACE=/tmp/evil"],
          ["env.NCCL_SOCKET_IFNAME=eth9"], ["env.NCCL_COMM_ID=evil:1234"])],
    ("submit_benchmark", {"config": {"bridge_config": {**TINY["bridge_config"], "env_vars": {
        "SLURM_JOB_NODELIST": "attacker.example.com"}}}, "profile": "cpu-test"},
     "env.SLURM_JOB_NODELIST:"),
    ("benchmark_status", {"run_id": "0123456789abcdef"}, "run_id:"),
    ("benchmark_status", {"run_id": "bad id; rm -rf /"}, "String should match pattern"),
    ("benchmark_result", {"run_id": "0123456789abcdef"}, "run_id:"),
    ("cancel_benchmark", {"run_id": "0123456789abcdef"}, "run_id:"),
    ("compare_benchmarks", {"run_a": "0123456789abcdef", "run_b": "fedcba9876543210"},
     "run_id:"),
]


@pytest.mark.parametrize(("tool_name", "args", "words"), BAD,
                         ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
async def test_bad_input_is_an_actionable_tool_error(
        client: Client, tool_name: str, args: dict[str, Any], words: str) -> None:
    err, out, text = await call(client, tool_name, args)
    assert err and out is None
    assert words in text, text
    assert "Traceback" not in text


async def test_result_of_an_unfinished_run_says_to_poll(client: Client) -> None:
    require_megatron()
    _, handle, _ = await call(client, "submit_benchmark", {
        "config": TINY, "profile": "cpu-test", "dry_run": False, "steps": 100000})
    err, _, text = await call(client, "benchmark_result", {"run_id": handle["run_id"]})
    await call(client, "cancel_benchmark", {"run_id": handle["run_id"]})
    assert err and "still" in text and "benchmark_status" in text


async def test_named_profiles_come_from_the_profile_directory(client: Client,
                                                              registry: Path) -> None:
    profiles = registry.parent / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "my-cluster.yaml").write_text(
        "executor: slurm\npartition: batch\naccount: proj1\nnodes: 4\ngpus_per_node: 8\n"
        "time_limit: '00:30:00'\n")
    err, out, text = await call(client, "submit_benchmark", {
        "config": {"preset": "llama3-8b", "perf_flags": ["-tp", "2", "-ng", "32", "-gb", "64"]},
        "profile": "my-cluster", "recipe": "llama3_8b_pretrain_config"})
    assert not err, text
    assert "#SBATCH --partition=batch" in out["script"] and out["executor"] == "slurm"
    assert "#SBATCH --nodes=4" in out["script"]
    assert "llama3_8b_pretrain_config" in out["script"]
    assert "model.tensor_model_parallel_size=2" in out["script"]


# ------------------------------------------------------------------ CLI


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("mbridge-perf"), "bench", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_parse_judges_a_log_from_any_launcher() -> None:
    ok = bench("parse", str(FIXTURES / "clean_60.log"), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["result"]["outcome"] == "pass"
    nan = bench("parse", str(FIXTURES / "nan_in_window.log"))
    assert nan.returncode == 1 and "nan_loss" in nan.stdout
    bad = bench("parse", str(FIXTURES / "clean_60.log"), "--window", "50-41")
    assert bad.returncode == 2 and bad.stderr.startswith("error: window:")
    missing = bench("parse", "/nonexistent.log")
    assert missing.returncode == 2 and "cannot read" in missing.stderr


def test_cli_submit_is_a_dry_run_unless_asked(tmp_path: Path) -> None:
    proc = bench("submit", "--profile", "cpu-test", "--registry", str(tmp_path / "r.db"),
                 "--set", "model.num_layers=2", "--set", "model.hidden_size=64", "--set",
                 "model.num_attention_heads=4", "--set", "model.seq_length=64")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("DRY RUN") and "#!/bin/bash" in proc.stdout
    listed = bench("list", "--registry", str(tmp_path / "r.db"))
    assert listed.stdout.strip() == "no runs"
    unknown = bench("status", "0123456789abcdef", "--registry", str(tmp_path / "r.db"))
    assert unknown.returncode == 2 and "run_id:" in unknown.stderr


def test_docs_profile_example_renders_a_batch_script() -> None:
    from mbridge_perf.bench import service
    from mbridge_perf.config.load import load_config

    text = (REPO / "docs" / "benchmarks.md").read_text()
    block = text.split("# ~/.config/mbridge-perf/profiles/eos.yaml\n", 1)[1].split("```", 1)[0]
    profile = service.resolve_profile({"name": "eos", **yaml.safe_load(block)})
    cfg = load_config(preset="llama3-70b", flags=["-tp", "4", "-pp", "4", "-ng", "32",
                                                  "-gb", "32"])
    handle = service.submit(cfg, profile, recipe="llama3_70b_pretrain_config")
    assert handle.dry_run and "#SBATCH --account=my_account" in handle.script
    assert "--container-image" in handle.script and "source /lustre/envs/nccl.sh" in handle.script
    assert "expandable_segments:True" in handle.script


def test_cli_unusable_registry_is_one_clear_line() -> None:
    proc = bench("list", "--registry", "/proc/no-such-dir/runs.sqlite3")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: registry: cannot open /proc/no-such-dir")
    assert "Traceback" not in proc.stderr
