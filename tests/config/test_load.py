"""Reading a TrainingConfig from what users have: Bridge dumps, overrides, perf flags; and one
clear message naming the field for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mbridge_perf.config.derived import derive, layers_per_chunk, parse_pipeline_layout
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import ModelSection
from mbridge_perf.rules import validate

from helpers import REPO, tool

FIXTURES = Path(__file__).parent / "fixtures"
DUMP = FIXTURES / "bridge_dump_llama3_8b.yaml"


def test_a_whole_bridge_dump_loads_and_unmodelled_fields_are_carried() -> None:
    cfg = load_config(file=DUMP, overrides=["cluster.num_gpus=16"])
    assert (cfg.model.hidden_size, cfg.model.context_parallel_size) == (4096, 2)
    assert cfg.model.carried()["rotary_base"] == 500000
    report = validate(cfg)
    assert report.ok
    assert {"model.rotary_base", "model.bias_activation_fusion", "train.manual_gc",
            "dataset", "checkpoint"} <= set(report.not_used)
    assert "model.hidden_size" not in report.not_used
    assert report.derived["data_parallel_size"] == 8  # 16 / (TP1 · PP1 · CP2)
    assert report.derived["num_microbatches"] == 16  # 128 / (1 · 8)


def test_env_vars_of_a_bridge_config_become_env() -> None:
    cfg = load_config(data={"env_vars": {"NCCL_GRAPH_REGISTER": 0},
                            "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}})
    assert cfg.env == {"NCCL_GRAPH_REGISTER": "0",
                       "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def test_overrides_win_over_the_file_and_parse_lists_and_deletes() -> None:
    cfg = load_config(file=DUMP, overrides=[
        "model.tensor_model_parallel_size=2", "model.recompute_granularity=selective",
        "model.recompute_modules=[core_attn,mlp]", "~model.rotary_base",
        "+model.qk_layernorm=true", "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
        "mixed_precision=bf16_with_mxfp8_mixed"])
    m = cfg.model
    assert m.tensor_model_parallel_size == 2 and m.recompute_modules == ["core_attn", "mlp"]
    assert "rotary_base" not in m.carried() and m.qk_layernorm is True
    assert cfg.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    p = derive(cfg).precision
    assert (p.fp8, p.fp8_recipe, p.bf16) == ("e4m3", "mxfp8", True)


def test_perf_flags_rewrite_the_config_like_the_harness() -> None:
    cfg = load_config(file=DUMP, flags=[
        "-tp", "4", "-pp", "2", "-vp", "None", "-gb", "256", "-mb", "2", "-ng", "32",
        "-gn", "8", "-g", "h100", "-c", "fp8_cs", "-rl", "4", "--moe_a2a_overlap", "false",
        "--cuda_graph_scope", "full_iteration", "-a", "acct", "-t", "00:30:00",
        "model.seq_length=4096"])
    m = cfg.model
    assert (m.tensor_model_parallel_size, m.sequence_parallel) == (4, True)
    assert (m.recompute_granularity, m.recompute_method, m.recompute_num_layers) == (
        "full", "block", 4)
    assert (m.cuda_graph_impl, m.cuda_graph_modules) == ("full_iteration", [])
    assert cfg.carried()["rerun_state_machine"]["check_for_nan_in_loss"] is False
    assert m.seq_length == 4096  # trailing Hydra override applied after the flags
    assert (cfg.cluster.num_gpus, cfg.cluster.gpus_per_node, cfg.cluster.gpu) == (32, 8, "h100")
    p = derive(cfg).precision
    assert (p.fp8_recipe, p.first_last_layers_bf16) == ("tensorwise", False)


@pytest.mark.parametrize(("flags", "expect"), [
    (["--recompute_modules", "core_attn,mlp"], {"recompute_granularity": "selective",
                                                "recompute_modules": ["core_attn", "mlp"]}),
    (["-ol", "0"], {"cpu_offloading": False}),
    (["-ol", "2"], {"cpu_offloading": True, "cpu_offloading_num_layers": 2,
                    "cpu_offloading_weights": False}),
    (["--moe_flex_dispatcher_backend", "hybridep"], {"moe_token_dispatcher_type": "flex",
                                                     "moe_flex_dispatcher_backend": "hybridep"}),
    (["--cuda_graph_impl", "transformer_engine", "--cuda_graph_scope", "attn,moe_router"],
     {"cuda_graph_impl": "transformer_engine", "use_te_rng_tracker": True,
      "cuda_graph_modules": ["attn", "moe_router"]}),
    (["-tp=1"], {"tensor_model_parallel_size": 1, "sequence_parallel": False}),
])
def test_single_perf_flags(flags: list[str], expect: dict[str, object]) -> None:
    m = load_config(data={}, flags=flags).model
    assert {k: getattr(m, k) for k in expect} == expect


def test_moe_a2a_overlap_turns_on_delayed_wgrad_too() -> None:
    cfg = load_config(data={}, flags=["--moe_a2a_overlap", "true"])
    assert cfg.overlap.overlap_moe_expert_parallel_comm and cfg.overlap.delay_wgrad_compute
    assert cfg.model.moe_shared_expert_overlap is False


BAD_INPUTS: list[tuple[dict[str, object], str, str]] = [
    ({"text": "model:\n  num_layers: 4\n    hidden_size: 8\n"}, "config", "not valid YAML"),
    ({"text": "- a\n- b\n"}, "config", "expected a mapping"),
    ({"data": {"model": {"num_layer": 4}}}, "model.num_layer", "did you mean 'num_layers'"),
    ({"data": {"model": {"micro_batch_size": 4}}}, "model.micro_batch_size",
     "use train.micro_batch_size"),
    ({"data": {"modle": {"num_layers": 4}}}, "modle", "did you mean 'model'"),
    ({"data": {"model": {"num_layers": "four"}}}, "model.num_layers", "whole number"),
    ({"data": {"model": {"num_layers": -1}}}, "model.num_layers", "must be ≥ 0"),
    ({"data": {"model": {"tensor_model_parallel_size": -2}}},
     "model.tensor_model_parallel_size", "must be ≥ 1"),
    ({"data": {"model": {"num_layers": 10**9}}}, "model.num_layers", "beyond any real"),
    ({"data": {"train": {"global_batch_size": 10**12}}}, "train.global_batch_size",
     "beyond any real"),
    ({"data": {"model": {"normalization": "rmsnorm"}}}, "model.normalization", "RMSNorm"),
    ({"data": {"cluster": {"gpuz": "h100"}}}, "cluster.gpuz", "unknown field"),
    ({"data": {"mixed_precision": "bf16"}}, "mixed_precision", "did you mean 'bf16_mixed'"),
    ({"preset": "lama3-8b"}, "preset", "llama3-8b"),
    ({"overrides": ["tp=8"]}, "tp=8", "section.field=value"),
    ({"flags": ["-tpp", "8"]}, "-tpp", "did you mean '-tp'"),
    ({"flags": ["-tp", "eight"]}, "-tp", "whole number"),
    ({"file": "/nonexistent/config.yaml"}, "/nonexistent/config.yaml", "cannot read"),
]


@pytest.mark.parametrize(("kwargs", "field", "words"), BAD_INPUTS,
                         ids=[b[1] + ":" + b[2][:12] for b in BAD_INPUTS])
def test_bad_input_names_the_field_and_says_what_to_do(
        kwargs: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert words in str(info.value)
    assert "\n" not in str(info.value)


def test_yaml_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    evil = f"model: !!python/object/apply:os.system ['touch {marker}']\n"
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(text=evil)
    assert not marker.exists()


# Megatron-Core's get_num_layers_to_build results for these cases (cpu-ground-truth §8).
PLACEMENT = [
    ({"num_layers": 32, "pipeline_model_parallel_size": 4}, [[8], [8], [8], [8]]),
    ({"num_layers": 32, "pipeline_model_parallel_size": 4,
      "virtual_pipeline_model_parallel_size": 2}, [[4, 4]] * 4),
    ({"num_layers": 30, "pipeline_model_parallel_size": 4,
      "num_layers_in_first_pipeline_stage": 6, "num_layers_in_last_pipeline_stage": 6},
     [[6], [9], [9], [6]]),
    ({"num_layers": 30, "pipeline_model_parallel_size": 4,
      "account_for_embedding_in_pipeline_split": True,
      "account_for_loss_in_pipeline_split": True}, [[7], [8], [8], [7]]),
    ({"num_layers": 6, "pipeline_model_parallel_size": 2,
      "virtual_pipeline_model_parallel_size": 2}, None),
    ({"num_layers": 8, "pipeline_model_parallel_size": 3}, None),
    ({"num_layers": 4, "pipeline_model_parallel_size": 2,
      "pipeline_model_parallel_layout": "E|(tt|)*2L"}, [[0, 2], [2, 0]]),
]


@pytest.mark.parametrize(("model", "expect"), PLACEMENT)
def test_layer_placement_matches_megatron_core(model: dict[str, object],
                                               expect: list[list[int]] | None) -> None:
    assert layers_per_chunk(ModelSection.model_validate(model)) == expect


def test_pipeline_layout_strings_expand_repeats() -> None:
    stages = parse_pipeline_layout("Et*3|(tt|)*2,m|L")
    assert ["".join(s) for s in stages] == ["Ettt", "tt", "tt", "m", "L"]
    with pytest.raises(ValueError, match="cannot read"):
        parse_pipeline_layout("Ex|tL")


def test_parallel_folding_arithmetic() -> None:
    cfg = load_config(data={
        "model": {"num_layers": 8, "num_moe_experts": 64, "tensor_model_parallel_size": 2,
                  "context_parallel_size": 2, "pipeline_model_parallel_size": 2,
                  "expert_model_parallel_size": 8, "expert_tensor_parallel_size": 1},
        "train": {"micro_batch_size": 1, "global_batch_size": 64},
        "cluster": {"num_gpus": 64}})
    d = derive(cfg)
    # dense TP·CP·DP·PP = 2·2·8·2 = 64 and expert ETP·EP·EDP·PP = 1·8·4·2 = 64
    assert (d.dp, d.edp, d.num_microbatches, d.min_gpus) == (8, 4, 8, 16)


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool("mbridge-perf"), "validate", *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_cli_exit_codes_and_json() -> None:
    ok = cli(str(DUMP), "--set", "cluster.num_gpus=16", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["ok"] is True and report["derived"]["data_parallel_size"] == 8

    bad = cli(str(DUMP), "--set", "model.cpu_offloading=true", "--set",
              "model.pipeline_model_parallel_size=2")
    assert bad.returncode == 1
    assert "offload.cpu-needs-pp1" in bad.stdout and "fix:" in bad.stdout

    unusable = cli(str(DUMP), "--set", "model.num_layer=2")
    assert unusable.returncode == 2
    assert unusable.stderr.strip() == ("error: model.num_layer: unknown field (did you mean "
                                       "'num_layers' or 'mtp_num_layers' or "
                                       "'num_joint_layers'?)")
    assert "Traceback" not in unusable.stderr


def test_cli_reads_stdin_and_perf_flags_after_double_dash() -> None:
    proc = cli("-", "--", "-tp", "3", "-ng", "8", stdin=DUMP.read_text())
    assert proc.returncode == 1
    assert "tp.heads-divisible" in proc.stdout or "world.dp-divisible" in proc.stdout


def test_docs_config_example_is_a_valid_config() -> None:
    text = (REPO / "docs" / "configs.md").read_text()
    block = text.split("A Bridge YAML, for example:", 1)[1].split("```yaml\n", 1)[1]
    cfg = load_config(text=block.split("```", 1)[0])
    report = validate(cfg)
    assert report.ok and report.derived["data_parallel_size"] == 2


def test_presets_command_lists_every_preset() -> None:
    proc = subprocess.run([tool("mbridge-perf"), "presets", "--json"], capture_output=True,
                          text=True, timeout=60, check=True)
    presets = json.loads(proc.stdout)
    assert {"llama3-70b", "deepseek-v3", "qwen3-30b-a3b"} <= set(presets)
    cfg = load_config(preset="deepseek-v3")
    assert cfg.model.num_layers == presets["deepseek-v3"]["model"]["num_layers"] == 61


def test_a_field_override_refines_a_named_precision_recipe() -> None:
    """`mixed_precision=<recipe>` then `mixed_precision.<field>=…` keeps the recipe's fields
    (Bridge applies the override onto the recipe object) instead of pricing in FP32."""
    cfg = load_config(preset="llama3-8b", overrides=[
        "mixed_precision=bf16_with_fp8_current_scaling_mixed",
        "mixed_precision.fp8_param_gather=true"])
    mp = cfg.mixed_precision
    assert not isinstance(mp, str) and mp.bf16 is True and mp.fp8 == "hybrid"
    assert mp.fp8_recipe == "tensorwise" and mp.fp8_param_gather is True
    with pytest.raises(ConfigError, match="unknown recipe 'bf17_mixed'"):
        load_config(preset="llama3-8b", overrides=["mixed_precision=bf17_mixed",
                                                   "mixed_precision.fp8=hybrid"])
