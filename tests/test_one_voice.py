"""Every door gives the same first-recompute advice on the seeds' Llama3 70B case (TE fused
attention, core_attn already on): the cards, SKILL.md, the prompts, the evals and the
validator's fix texts. The cards decide; core_attn is advised only with unfused attention."""

from __future__ import annotations

import re

import pytest
from mcp import Client

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.load import load_config
from mbridge_perf.rules import validate
from mbridge_perf.server import build_server
from mbridge_perf.skillpack.pack import get_skill

from helpers import REPO

SEED = REPO / "examples" / "llama3_70b_sft_h100.yaml"
MEM = "nemo-mbridge-perf-memory-tuning"
RECOMPUTE = "nemo-mbridge-perf-activation-recompute"
# "recompute_modules=[core_attn]" / ["core_attn"] / = ["core_attn"] as an instruction
ADD_CORE_ATTN = re.compile(r"recompute_modules\s*=?\s*\[\s*\"?core_attn\"?\s*\]")


def _sentences_advising_core_attn(text: str) -> list[str]:
    """Sentences that tell the reader to set recompute_modules=[core_attn] with no condition
    on the attention backend."""
    out = []
    for sentence in re.split(r"(?<=[.;])\s+|\n", text):
        if ADD_CORE_ATTN.search(sentence) and "unfused" not in sentence:
            out.append(sentence)
    return out


def _seed(**extra: str):
    return load_config(preset="llama3-70b", file=SEED, overrides=list(extra.values()))


@pytest.mark.parametrize("skill", [MEM, RECOMPUTE])
def test_card_checklist_conditions_core_attn_on_the_attention_backend(skill: str) -> None:
    card = get_skill(REPO, skill).card
    item = next(i for i in card["answer_checklist"] if i["id"] == "selective-by-architecture")
    assert "unfused" in item["text"] and "fused / flash" in item["text"]
    for module in ("mla_up_proj", "moe_act", "layernorm"):
        assert module in item["text"]
    assert not _sentences_advising_core_attn(item["text"])


@pytest.mark.parametrize("skill", [MEM, RECOMPUTE])
def test_skill_md_checklist_says_the_same(skill: str) -> None:
    body = get_skill(REPO, skill).body
    checklist = body.split("## Answer checklist", 1)[1].split("\n## ", 1)[0]
    assert not _sentences_advising_core_attn(checklist), checklist
    assert "≈ 0" in checklist and "unfused" in checklist


def test_recommended_paths_do_not_pair_mlp_with_core_attn() -> None:
    """The measured run: mlp + core_attn was slower than mlp alone (586.8 vs 593.6)."""
    for skill in (MEM, RECOMPUTE):
        for step in get_skill(REPO, skill).card.get("recommended_path", []):
            mods = (step.get("config_changes") or {}).get("model.recompute_modules")
            if isinstance(mods, list) and "mlp" in mods:
                assert "core_attn" not in mods, (skill, step["step"])


def test_the_validator_never_tells_the_seed_case_to_add_core_attn() -> None:
    cfg = _seed()
    raised = _seed(tp="model.tensor_model_parallel_size=8")
    full = _seed(g="model.recompute_granularity=full", m="model.recompute_method=uniform",
                 n="model.recompute_num_layers=1")
    fixes = [f.fix for c, b in ((cfg, None), (raised, cfg), (full, cfg))
             for f in validate(c, b).findings]
    assert any("layernorm" in f for f in fixes)
    assert not [f for f in fixes if _sentences_advising_core_attn(f)], fixes
    ids = {f.rule_id for f in validate(cfg).findings}
    assert "recompute.core-attn-fused" in ids


def first_selective_modules(cfg) -> list[str]:
    return Derived(cfg).first_selective_modules()


def test_first_module_follows_the_architecture() -> None:
    bf16 = "mixed_precision=bf16_mixed"
    dense = _seed()
    unfused = _seed(b="model.attention_backend=unfused")
    mla = load_config(preset="deepseek-v3", overrides=[bf16])
    moe = load_config(preset="qwen3-30b-a3b", overrides=["model.moe_grouped_gemm=true", bf16])
    assert first_selective_modules(dense) == ["layernorm"]
    assert first_selective_modules(unfused) == ["core_attn"]
    assert first_selective_modules(mla)[0] == "mla_up_proj"
    assert first_selective_modules(moe) == ["moe_act"]
    # FP32: Transformer Engine falls back to unfused attention, so core_attn comes first
    fp32 = load_config(preset="deepseek-v3", overrides=["model.bf16=false"])
    assert first_selective_modules(fp32)[0] == "core_attn"


@pytest.mark.anyio
@pytest.mark.parametrize("prompt", ["oom_triage", "recompute_plan"])
async def test_prompts_say_the_same(prompt: str) -> None:
    async with Client(build_server(REPO)) as c:
        text = (await c.get_prompt(prompt, {"situation": "seed case OOM at 58.8 GB",
                                            "config": SEED.read_text()})
                ).messages[0].content.text
    assert not _sentences_advising_core_attn(text)
    assert "fused / flash" in text
