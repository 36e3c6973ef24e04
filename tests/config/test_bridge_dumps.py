"""What Megatron Bridge 0.6.2 really writes: every recipe dump of the corpus
(tests/data/bridge-recipes.tar.xz) loads, Bridge's own validate() verdict is kept, every
language-model dump is sized per stage, and the dialect is read for its meaning."""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import pytest

from bridge_corpus import dumps, index, is_diffusion
from mbridge_perf.config.derived import derive, resolve_precision
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import estimate_memory
from mbridge_perf.memory.state import dtype_bytes
from mbridge_perf.rules import validate

# Bridge validate() failures and the rule that reports the same problem (message → rule id).
BRIDGE_FAILURES = {
    "PEFT requires a pretrained checkpoint path": "peft.needs-pretrained-checkpoint",
    "Please ensure sequence length configuration": "dataset.seq-length-match",
    "conflicts with pipeline_model_parallel_layout": "pipeline.layout-conflict",
    "ZeroDivisionError": "model.sizes-set",
}


def lm_names() -> list[str]:
    return sorted(n for n in dumps() if not is_diffusion(n))


@cache
def loaded(name: str) -> TrainingConfig:
    return load_config(data=copy.deepcopy(dumps()[name]))


def one(prefix: str) -> TrainingConfig:
    return loaded(next(n for n in lm_names() if n.startswith(prefix)))


def test_the_corpus_covers_every_family_gpu_and_precision() -> None:
    names = set(dumps())
    assert len(names) >= 400
    for part in ("llama3", "qwen3", "qwen3_next", "deepseek_v3", "gpt_oss", "moonlight",
                 "nemotron", "olmoe", "gemma3", "wan", "h100", "b200", "b300", "gb200",
                 "gb300", "vr200", "bf16", "fp8cs", "fp8mx", "fp8sc", "nvfp4", "pretrain",
                 "sft", "peft"):
        assert any(part in n for n in names), part


def test_every_language_model_dump_loads() -> None:
    for name in lm_names():
        assert isinstance(loaded(name), TrainingConfig)


@pytest.mark.parametrize("name", sorted(n for n in dumps() if is_diffusion(n))[:3])
def test_a_diffusion_dump_is_one_clear_error_naming_the_provider(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(data=copy.deepcopy(dumps()[name]))
    assert info.value.field == "model._target_"
    assert "WanModelProvider" in info.value.problem and "diffusion" in info.value.problem


def test_every_dump_bridge_validated_has_no_error_finding() -> None:
    passed = [n for n in lm_names() if index()[n]["validate"] == "PASS"]
    assert len(passed) >= 300
    bad = {n: [f"{f.rule_id}: {f.message}" for f in r.findings if f.severity == "error"]
           for n in passed if not (r := validate(loaded(n))).ok}
    assert not bad, bad


@pytest.mark.parametrize(("needle", "rule_id"), BRIDGE_FAILURES.items())
def test_bridge_validate_failures_are_error_findings(needle: str, rule_id: str) -> None:
    failed = [n for n in lm_names() if index()[n]["validate"] == "FAIL"
              and needle in index()[n]["validate_msg"]]
    assert failed
    for name in failed:
        errors = {f.rule_id for f in validate(loaded(name)).findings if f.severity == "error"}
        assert rule_id in errors, (name, errors)


def _estimate_or_why(cfg: TrainingConfig) -> tuple[Any, ConfigError | None]:
    try:
        return estimate_memory(cfg), None
    except ConfigError as exc:
        return None, exc


def test_every_language_model_dump_gets_a_per_stage_estimate() -> None:
    sized = unheld = 0
    for name in lm_names():
        cfg = loaded(name)
        report, why = _estimate_or_why(cfg)
        if why is not None:  # only recipes Bridge itself rejects
            assert index()[name]["validate"] == "FAIL", (name, str(why))
            continue
        m = cfg.model
        assert len(report.per_stage) == m.pipeline_model_parallel_size, name
        assert all(s.peak_allocated_gib > 0 for s in report.per_stage), name
        d = derive(cfg)
        if d.is_moe and d.world_size and d.world_size % (m.expert_model_parallel_size * (
                m.expert_tensor_parallel_size or m.tensor_model_parallel_size) *
                m.pipeline_model_parallel_size):
            # the world the dump implies does not hold the expert mesh (Bridge's validate()
            # does not check it; process-group init would): sized anyway, and said so
            assert d.world_from_dump, name
            assert any("expert mesh" in a for a in report.assumptions), name
            unheld += 1
        sized += 1
    assert sized >= len(lm_names()) - 3
    assert unheld >= 1  # the corpus has such dumps (Qwen3-235B at 64 GPUs with EP32 x PP4)


# ------------------------------------------------------------------ the dialect's meaning

def test_objects_dtypes_and_callables_read_as_what_they_mean() -> None:
    cfg = loaded("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    m, o = cfg.model, cfg.optimizer
    assert m.activation_func == "torch.nn.functional.silu" and m.gated_linear_unit
    assert m.carried()["transformer_layer_spec"] == (
        "megatron.core.models.gpt.gpt_layer_specs.get_gpt_decoder_block_spec")
    assert (m.params_dtype, o.main_grads_dtype, o.main_params_dtype) == ("bf16", "bf16", "fp32")
    assert (dtype_bytes(o.exp_avg_dtype, 4), dtype_bytes(o.main_params_dtype, 4)) == (2, 4)
    assert resolve_precision(cfg).bf16 is True
    assert cfg.train.carried()["exit_signal"] == "SIGTERM"  # signal.Signals member


def test_enum_members_are_their_names() -> None:
    m = one("nemotron_3_nano_pretrain_8gpu_h100")
    assert isinstance(m.model.cuda_graph_modules, list)
    assert set(m.model.cuda_graph_modules) <= {"attn", "mlp", "moe", "moe_router",
                                               "moe_preprocess", "mamba"}


def test_a_router_dtype_object_is_its_precision() -> None:
    cfg = one("qwen3_30b_a3b_pretrain_32gpu_h100_fp8sc")
    assert cfg.model.moe_router_dtype == "fp32"


def test_data_parallel_size_from_comm_overlap_sets_the_world() -> None:
    cfg = loaded("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    d = derive(cfg)
    assert cfg.cluster.num_gpus == 256 and d.dp == 32 and d.world_from_dump
    assert d.num_microbatches == 4096 // 32  # GBS / (MBS · DP), Bridge's own count


def test_a_world_the_user_gives_wins_over_the_dump() -> None:
    data = copy.deepcopy(dumps()["deepseek_v3_pretrain_256gpu_b200_bf16_config"])
    cfg = load_config(data=data, overrides=["cluster.num_gpus=512"])
    assert derive(cfg).dp == 64


def test_nulls_mean_megatrons_default() -> None:
    cfg = loaded("deepseek_v3_pretrain_256gpu_b200_bf16_config")
    raw = dumps()["deepseek_v3_pretrain_256gpu_b200_bf16_config"]
    assert raw["comm_overlap"]["overlap_p2p_comm"] is None
    assert raw["model"]["attention_backend"] is None
    assert cfg.model.attention_backend == "auto"  # TE picks the backend, as AttnBackend.auto
    assert cfg.overlap.overlap_moe_expert_parallel_comm is False


def test_a_null_comm_overlap_bool_is_the_default_not_an_error() -> None:
    data = copy.deepcopy(dumps()["deepseek_v3_pretrain_256gpu_b200_bf16_config"])
    data["comm_overlap"]["overlap_moe_expert_parallel_comm"] = None
    data["comm_overlap"]["delay_wgrad_compute"] = None
    cfg = load_config(data=data)
    assert cfg.overlap.overlap_moe_expert_parallel_comm is False
    assert cfg.overlap.delay_wgrad_compute is False


def test_a_compact_layout_string_places_every_layer() -> None:
    hits = [n for n in lm_names()
            if isinstance(dumps()[n]["model"].get("pipeline_model_parallel_layout"), str)]
    assert hits
    for name in hits:
        cfg = loaded(name)
        per_stage = derive(cfg).layers_per_stage
        assert per_stage is not None and sum(per_stage) == cfg.model.num_layers, name


def test_the_vocabulary_comes_from_the_tokenizer_when_the_model_leaves_it_unset() -> None:
    raw = dumps()["nemotronh_8b_sft_2gpu_h100_bf16_config"]
    assert raw["model"]["vocab_size"] is None
    cfg = loaded("nemotronh_8b_sft_2gpu_h100_bf16_config")
    assert cfg.model.vocab_size == 131072 and cfg.model.carried()["should_pad_vocab"] is True
    raw = dumps()["gpt3_175b_pretrain_32gpu_h100_bf16_config"]
    assert raw["model"]["vocab_size"] is None
    assert raw["tokenizer"]["tokenizer_type"] == "NullTokenizer"
    assert loaded("gpt3_175b_pretrain_32gpu_h100_bf16_config").model.vocab_size == 32000


def test_mixed_precision_as_a_recipe_name_or_an_object() -> None:
    named = [n for n in lm_names() if isinstance(dumps()[n]["mixed_precision"], str)]
    objects = [n for n in lm_names() if isinstance(dumps()[n]["mixed_precision"], dict)]
    assert named and objects
    for name in named[:5] + objects[:5]:
        p = resolve_precision(loaded(name))
        assert p.bf16 or p.fp16, name
    fp8 = one("llama3_70b_pretrain_64gpu_b200_fp8cs")
    assert resolve_precision(fp8).fp8 is not None


def test_a_broken_recipe_is_an_error_finding_not_a_crash() -> None:
    cfg = loaded("vanilla_gpt_pretrain_1gpu_h100_bf16_config")
    report = validate(cfg)
    assert not report.ok
    assert [f.rule_id for f in report.findings if f.severity == "error"] == ["model.sizes-set"]
    with pytest.raises(ConfigError, match="is 0"):
        estimate_memory(cfg)


def _enum(cls: str, name: str, value: int) -> dict[str, Any]:
    return {"_target_": f"megatron.core.transformer.enums.{cls}", "_args_": [value],
            "_call_": True, "_name_": name}


def test_equivalent_spellings_of_the_dialect_mean_the_same() -> None:
    # What Bridge writes for the same values in different recipes: enum objects or strings,
    # dtype objects or names, a comma string or a list, a layout as nested lists or compact.
    name = "deepseek_v3_pretrain_256gpu_b200_bf16_config"
    plain = copy.deepcopy(dumps()[name])
    plain["model"].update({"cuda_graph_impl": "transformer_engine", "use_te_rng_tracker": True,
                           "cuda_graph_modules": ["attn", "moe_router"],
                           "cuda_graph_scope": None, "attention_backend": "auto",
                           "moe_router_dtype": "fp32"})
    spelled = copy.deepcopy(plain)
    spelled["model"].update({
        "cuda_graph_modules": [_enum("CudaGraphModule", "attn", 1),
                               _enum("CudaGraphModule", "moe_router", 4)],
        "attention_backend": _enum("AttnBackend", "auto", 5),
        "moe_router_dtype": {"_target_": "torch.float32", "_call_": False},
        "pipeline_model_parallel_layout": "Et*8|(t*8|)*6t*5mL"})
    comma = copy.deepcopy(plain)
    comma["model"]["cuda_graph_modules"] = "attn,moe_router"
    reports = [validate(load_config(data=d)) for d in (plain, spelled, comma)]
    assert all(r.ok for r in reports)
    assert len({r.model_dump_json(exclude={"not_used"}) for r in reports}) == 1
    sizes = {estimate_memory(load_config(data=d)).peak_allocated_gib
             for d in (plain, spelled, comma)}
    assert len(sizes) == 1
