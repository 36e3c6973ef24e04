"""Megatron Bridge recipes by name (config.recipes): the shipped corpus, `--recipe`, the
`recipes` listing, and perf-harness flags resolving to the recipe the harness runs."""

from __future__ import annotations

import json
import subprocess

import pytest

from bridge_corpus import dump_texts
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config, source_notes
from mbridge_perf.config.recipes import check_name, recipe_index, recipe_text
from mbridge_perf.memory.estimate import estimate_memory

from helpers import SHARED_DATA, tool


def argv(line: str) -> list[str]:
    return line.split()


def _shipped_reference() -> dict[str, str]:
    """Dump texts from outside the package: the tests' archive, plus ../shared when present."""
    texts = dict(dump_texts())
    shared = SHARED_DATA / "bridge-recipes" / "yaml"
    if shared.is_dir():
        texts.update({p.stem: p.read_text("utf-8") for p in shared.glob("*.yaml")})
    return texts


def _outcome(**kw: object) -> object:
    try:
        return estimate_memory(load_config(**kw)).model_dump(mode="json")  # type: ignore[arg-type]
    except ConfigError as exc:
        return f"ConfigError {exc.problem}"


def test_the_corpus_ships_every_recipe_of_the_tests_archive_byte_for_byte() -> None:
    index = recipe_index()
    ref = _shipped_reference()
    assert len(index) >= 406
    assert set(dump_texts()) <= set(index)
    for name, text in ref.items():
        assert recipe_text(name) == text, name


def test_estimate_of_every_recipe_by_name_equals_the_estimate_of_its_dump() -> None:
    ref = _shipped_reference()
    estimated = 0
    for name in recipe_index():
        by_name = _outcome(recipe=name)
        assert by_name == _outcome(text=ref[name]), name
        estimated += not isinstance(by_name, str)
    assert estimated >= 390  # the rest (Wan diffusion, …) are refused the same way both ways


@pytest.mark.parametrize("name", ["qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config",
                                  "deepseek_v3_pretrain_256gpu_b200_fp8mx_config",
                                  "llama3_70b_sft_32gpu_h100_fp8cs_config"])
def test_cli_estimate_by_recipe_equals_estimate_of_the_dump_file(tmp_path, name: str) -> None:
    dump = tmp_path / f"{name}.yaml"
    dump.write_text(recipe_text(name), encoding="utf-8")
    by_name = subprocess.run([tool("mbridge-perf"), "estimate", "--recipe", name, "--json"],
                             capture_output=True, text=True, timeout=120)
    by_file = subprocess.run([tool("mbridge-perf"), "estimate", str(dump), "--json"],
                             capture_output=True, text=True, timeout=120)
    assert by_name.returncode == by_file.returncode
    assert json.loads(by_name.stdout) == json.loads(by_file.stdout)


def test_recipes_json_lists_every_shipped_recipe_with_its_layout() -> None:
    out = subprocess.run([tool("mbridge-perf"), "recipes", "--json"], capture_output=True,
                         text=True, timeout=60, check=True)
    rows = json.loads(out.stdout)
    assert {r["name"] for r in rows} == set(recipe_index())
    row = next(r for r in rows if r["name"] == "deepseek_v3_pretrain_256gpu_b200_fp8mx_config")
    assert (row["model"], row["num_gpus"], row["gpu"], row["precision"]) == (
        "deepseek_v3", 256, "b200", "fp8mx")
    assert row["layout"]["pp"] == 8 and row["layout"]["ep"] == 8
    filtered = subprocess.run([tool("mbridge-perf"), "recipes", "--model", "qwen3_30b",
                               "--gpu", "B300"], capture_output=True, text=True, timeout=60,
                              check=True).stdout.splitlines()
    assert filtered and all("qwen3_30b_a3b" in line and " b300 " in line for line in filtered)


@pytest.mark.parametrize("name", ["qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_confg",
                                  "../../etc/passwd", "/tmp/x.yaml",
                                  "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config.yaml",
                                  "x" * 5000])
def test_unknown_or_path_like_recipe_is_one_line_with_the_closest_names(name: str) -> None:
    r = subprocess.run([tool("mbridge-perf"), "validate", "--recipe", name],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: recipe:"), r.stderr
    assert "Traceback" not in r.stderr
    if len(name) < 200:
        assert "closest: " in lines[0] and "_config" in lines[0].split("closest: ")[1]
    if "fp8mx" in name:
        assert "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config" in lines[0]


def test_names_match_case_insensitively_and_without_the_config_suffix() -> None:
    want = "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"
    assert check_name("QWEN3_30B_A3B_pretrain_8gpu_b300_fp8mx") == want
    with pytest.raises(ConfigError, match="give a recipe or a preset"):
        load_config(recipe=want, preset="qwen3-30b-a3b")


def test_overrides_and_flags_land_on_top_of_the_recipe() -> None:
    cfg = load_config(recipe="qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config",
                      overrides=["train.micro_batch_size=2"], flags=["-ng", "16", "-tp", "2"])
    assert cfg.train.micro_batch_size == 2 and cfg.model.tensor_model_parallel_size == 2
    assert cfg.model.sequence_parallel is True and cfg.cluster.num_gpus == 16
    assert cfg.model.num_moe_experts == 128  # the recipe's model, not a preset's
    assert source_notes(cfg) == []


# ------------------------------------------------------------------ perf-harness flags

# (pasted command, recipe the harness runs). Spellings as scripts/performance takes them.
HARNESS = [
    ("-m qwen3 -mr qwen3_30b_a3b -g b300 -c fp8_mx -ng 8",
     "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"),
    ("-m deepseek -mr deepseek_v3 -g b200 -c fp8_mx -ng 256",
     "deepseek_v3_pretrain_256gpu_b200_fp8mx_config"),
    ("--model_family_name deepseek --model_recipe_name deepseek_v3 --gpu gb300 "
     "--compute_dtype nvfp4 --num_gpus 256", "deepseek_v3_pretrain_256gpu_gb300_nvfp4_config"),
    ("-m deepseek -mr deepseek_v3 -g b200 -c fp8_mx -ng 256 -cv large_scale",
     "deepseek_v3_pretrain_256gpu_b200_fp8mx_large_scale_config"),
    ("-m deepseek -mr deepseek_v3 -g h100 -c fp8_cs -ng 1024",
     "deepseek_v3_pretrain_1024gpu_h100_fp8cs_config"),
    ("-m llama -mr llama3_70b -g h100 -c fp8_cs -ng 64",
     "llama3_70b_pretrain_64gpu_h100_fp8cs_config"),
    ("-m llama -mr llama3_70b -g gb200 -ng 64", "llama3_70b_pretrain_64gpu_gb200_bf16_config"),
    ("-m llama -mr llama3_70b --task sft -g h100 -c bf16 -ng 32",
     "llama3_70b_sft_32gpu_h100_bf16_config"),
    ("-m llama -mr llama3_70b --task peft -g b300 -c fp8_mx -ng 8",
     "llama3_70b_peft_8gpu_b300_fp8mx_config"),
    ("-m llama -mr llama3_8b -g r100 -c nvfp4 -ng 8", "llama3_8b_pretrain_8gpu_r100_nvfp4_config"),
    ("-m llama -mr llama3_8b -g vr200 -c fp8_cs -ng 8",
     "llama3_8b_pretrain_8gpu_vr200_fp8cs_config"),
    ("-m llama -mr llama31_405b -g gb300 -c fp8_mx -ng 256",
     "llama31_405b_pretrain_256gpu_gb300_fp8mx_config"),
    ("-m llama -mr llama31_405b -g h100 -c fp8_cs -ng 512",
     "llama31_405b_pretrain_512gpu_h100_fp8cs_config"),
    ("-m qwen3 -mr qwen3_235b_a22b -g gb200 -c fp8_mx -ng 64",
     "qwen3_235b_a22b_pretrain_64gpu_gb200_fp8mx_config"),
    ("-m qwen3 -mr qwen3_235b_a22b -g gb300 -c nvfp4 -ng 64 -cv full_iteration",
     "qwen3_235b_a22b_pretrain_64gpu_gb300_nvfp4_full_iteration_config"),
    ("-m qwen3 -mr qwen3_235b_a22b -g h100 -c bf16 -ng 256",
     "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config"),
    ("-m qwen3 -mr qwen3_30b_a3b -g h100 -c fp8_sc -ng 32 -cv dev",
     "qwen3_30b_a3b_pretrain_32gpu_h100_fp8sc_dev_config"),
    ("-m qwen3 -mr qwen3_next_80b_a3b -g gb300 -c fp8_mx -ng 64",
     "qwen3_next_80b_a3b_pretrain_64gpu_gb300_fp8mx_config"),
    ("-m gpt_oss -mr gpt_oss_20b -g b300 -c nvfp4 -ng 64",
     "gpt_oss_20b_pretrain_64gpu_b300_nvfp4_config"),
    ("-m gpt_oss -mr gpt_oss_20b -g gb200 -c nvfp4 -ng 8",
     "gpt_oss_20b_pretrain_8gpu_gb200_nvfp4_config"),
    ("-m nemotronh -mr nemotronh_56b -g gb300 -c fp8_cs -ng 64",
     "nemotronh_56b_pretrain_64gpu_gb300_fp8cs_config"),
    ("-m nemotron_3_nano -mr nemotron_3_nano -g vr200 -c nvfp4 -ng 8",
     "nemotron_3_nano_pretrain_8gpu_vr200_nvfp4_config"),
    ("-m deepseek -mr deepseek_v3 -g gb300 -c fp8_mx -ng 128 -cv hsdp",
     "deepseek_v3_pretrain_128gpu_gb300_fp8mx_hsdp_config"),
    ("-m llama -mr llama3_70b -g b200 -c fp8_mx -ng 64 -cv v2",  # v1 / v2: the canonical one
     "llama3_70b_pretrain_64gpu_b200_fp8mx_config"),
    ("-m=qwen3 -mr=qwen3_30b_a3b -g=gb200 -c=fp8_mx -ng=8",
     "qwen3_30b_a3b_pretrain_8gpu_gb200_fp8mx_config"),
]


def _base(flags: str) -> str | None:
    from mbridge_perf.config.flags import harness_selection
    from mbridge_perf.config.recipes import harness_recipe

    sel = harness_selection(flags.split())
    ng = sel.get("num_gpus")
    return harness_recipe(sel["model_recipe"], task=sel.get("task", "pretrain"),
                          num_gpus=int(ng) if ng else None, gpu=sel.get("gpu"),
                          compute_dtype=sel.get("compute_dtype", "bf16"),
                          variant=sel.get("variant")).name


@pytest.mark.parametrize(("flags", "recipe"), HARNESS)
def test_a_pasted_harness_command_resolves_to_the_recipe_it_runs(flags: str, recipe: str
                                                                 ) -> None:
    assert _base(flags) == recipe
    from_flags = load_config(flags=flags.split())
    direct = load_config(recipe=recipe)
    assert from_flags.model == direct.model and from_flags.train == direct.train
    assert from_flags.mixed_precision == direct.mixed_precision  # -c picked it; not rewritten
    assert from_flags.cluster.num_gpus == recipe_index()[recipe].num_gpus  # -ng on top
    assert any(recipe in n for n in source_notes(from_flags))


def test_harness_resolution_covers_families_gpus_and_dtypes() -> None:
    assert len(HARNESS) >= 20
    names = [r for _, r in HARNESS]
    infos = [recipe_index()[n] for n in names]
    assert len({i.model for i in infos}) >= 8 and len({i.gpu for i in infos}) >= 7
    assert {i.precision for i in infos} >= {"bf16", "fp8cs", "fp8mx", "fp8sc", "nvfp4"}


def test_extra_flags_and_hydra_overrides_land_on_top_of_the_resolved_recipe() -> None:
    cfg = load_config(flags=argv("-m qwen3 -mr qwen3_30b_a3b -g b300 -c fp8_mx -ng 16 -mb 2 "
                                 "-tp 2 --recompute_modules moe_act model.seq_length=8192"))
    assert (cfg.train.micro_batch_size, cfg.model.tensor_model_parallel_size) == (2, 2)
    assert cfg.model.recompute_modules == ["moe_act"] and cfg.model.seq_length == 8192
    assert cfg.cluster.num_gpus == 16 and cfg.cluster.gpu == "b300"
    recipe = load_config(recipe="qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config")
    assert cfg.train.global_batch_size == recipe.train.global_batch_size
    assert cfg.model.moe_token_dispatcher_type == recipe.model.moe_token_dispatcher_type


def test_the_issues_deepseek_command_prices_the_recipe_not_the_preset() -> None:
    from mbridge_perf.memory.answer import estimate_with_answer

    cfg = load_config(flags=argv("-m deepseek -mr deepseek_v3 -g b200 -c fp8_mx -ng 256"))
    report = estimate_with_answer(cfg)
    assert report.peak_allocated_gib < 200  # the preset without TP / PP / EP priced 11,593
    assert report.parallelism["pipeline"] == 8 and report.parallelism["expert"] == 8
    assert "deepseek_v3_pretrain_256gpu_b200_fp8mx_config" in report.assumptions[0]


def test_without_an_exact_gpu_count_the_harness_default_runs_with_ng_on_top() -> None:
    assert _base("-m llama -mr llama3_8b -g h100 -ng 16") == \
        "llama3_8b_pretrain_8gpu_h100_bf16_config"  # the harness's fixed default count
    assert _base("-m deepseek -mr deepseek_v3 -g b200 -c fp8_mx -ng 512") == \
        "deepseek_v3_pretrain_256gpu_b200_fp8mx_config"  # else the largest
    cfg = load_config(flags=argv("-m llama -mr llama3_8b -g h100 -ng 16"))
    assert cfg.cluster.num_gpus == 16
    assert "llama3_8b_pretrain_8gpu_h100_bf16_config" in source_notes(cfg)[0]


def test_no_matching_recipe_falls_back_to_the_preset_and_names_the_nearest() -> None:
    from mbridge_perf.memory.answer import estimate_with_answer

    cfg = load_config(flags=argv("-m qwen3 -mr qwen3_30b_a3b -g h200 -c fp8_mx -ng 8"))
    note = source_notes(cfg)[0]
    assert "no Bridge 0.6.2 perf recipe matches" in note and "qwen3-30b-a3b preset" in note
    assert "qwen3_30b_a3b_pretrain_8gpu_" in note.split("nearest: ")[1]
    assert cfg.model.num_moe_experts == 128
    assert estimate_with_answer(cfg).assumptions[0] == note


def test_a_recipe_outside_the_perf_recipes_is_not_what_the_harness_runs() -> None:
    """gpt_oss_20b_sft_8gpu_h100_fp8mx_config is in megatron.bridge.recipes, which the
    harness does not search; with no gpt-oss-20b preset either, the error names the nearest."""
    assert _base("-m gpt_oss -mr gpt_oss_20b --task sft -g h100 -c fp8_mx -ng 8") is None
    with pytest.raises(ConfigError) as err:
        load_config(flags=argv("-m gpt_oss -mr gpt_oss_20b --task sft -g h100 -c fp8_mx -ng 8"))
    assert err.value.field == "-mr" and "gpt_oss_20b_sft_8gpu_h100_fp8mx_config" in str(err.value)
    assert load_config(recipe="gpt_oss_20b_sft_8gpu_h100_fp8mx_config").model.num_moe_experts
