"""The other side of the verdict: every run that went OOM in the Megatron Bridge skill cards
(../shared/data/memory/bridge-skill-cards.csv, status OOM; the rows are copied into
tests/memory/fixtures/bridge-skill-cards-sample.csv) comes out `tight` or `does_not_fit`, never
`fits`; the passing runs of the same experiments do not come out `does_not_fit`.

Each config is the run as the card states it, on the nearest real input: the seeds' Llama3 70B
case, the Nemotron 3 Nano and Qwen3-30B-A3B Bridge perf-recipe dumps with the card's knobs, the
GPT-OSS-120B preset. Where the card leaves a setting unstated, the choice is said beside it.
"""

from __future__ import annotations

import copy
import csv
from pathlib import Path

import pytest

from bridge_corpus import dumps
from mbridge_perf.config.load import load_config
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.estimate import estimate_memory

from helpers import REPO

CARDS = Path(__file__).parent / "fixtures" / "bridge-skill-cards-sample.csv"
SEED = REPO / "examples" / "llama3_70b_sft_h100.yaml"
NANO = ["cluster.num_gpus=16", "model.tensor_model_parallel_size=1",
        "model.pipeline_model_parallel_size=1", "model.context_parallel_size=1",
        "model.expert_model_parallel_size=8", "model.seq_length=8192",
        "train.micro_batch_size=1", "train.global_batch_size=16",
        "model.recompute_granularity=selective", "model.cuda_graph_impl=transformer_engine",
        "model.cuda_graph_modules=[attn,mamba]", "model.moe_token_dispatcher_type=flex",
        "model.moe_flex_dispatcher_backend=hybridep", "model.moe_grouped_gemm=true"]
# the perf-cpu-offloading card's layout (its baseline row: TP2 PP2 EP4 on 16 H100, the
# distributed optimizer as in Bridge's recipe); the OOM run forced PP = 1 for layer offload
QWEN = ["cluster.num_gpus=16", "model.tensor_model_parallel_size=2",
        "model.sequence_parallel=true", "model.expert_model_parallel_size=4",
        "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
        "+model.cross_entropy_fusion_impl=te", "model.moe_token_dispatcher_type=alltoall"]


def _dump(name: str, overrides: list[str]) -> TrainingConfig:
    return load_config(data=copy.deepcopy(dumps()[name]), overrides=overrides)


def _config(experiment: str) -> TrainingConfig:
    nano = "nemotron_3_nano_pretrain_16gpu_h100_bf16_config"
    return {
        # PYTORCH_CUDA_ALLOC_CONF unset, as the card says
        "llama70b_sft_baseline_no_expseg": lambda: load_config(preset="llama3-70b", file=SEED),
        "llama70b_sft_core_attn_layernorm": lambda: load_config(
            preset="llama3-70b", file=SEED,
            overrides=["model.recompute_modules=[core_attn,layernorm]"]),
        "nemotron3nano_empty_control": lambda: _dump(nano, [*NANO,
                                                            "model.recompute_modules=[]"]),
        "nemotron3nano_moe_act": lambda: _dump(nano, [*NANO,
                                                      "model.recompute_modules=[moe_act]"]),
        "nemotron3nano_moe": lambda: _dump(nano, [*NANO, "model.recompute_modules=[moe]"]),
        "nemotron3nano_moe_layernorm": lambda: _dump(
            nano, [*NANO, "model.recompute_modules=[moe,layernorm]"]),
        "qwen3_30b_activation_offload_24": lambda: load_config(
            preset="qwen3-30b-a3b", overrides=[
                *QWEN, "model.pipeline_model_parallel_size=1", "model.cpu_offloading=true",
                "model.cpu_offloading_num_layers=24",
                "model.cpu_offloading_activations=true"]),
        "qwen3_30b_offload_baseline": lambda: load_config(
            preset="qwen3-30b-a3b", overrides=[*QWEN, "model.pipeline_model_parallel_size=2"]),
        # the card's layout; ETP 1 (EP 8 with ETP = TP = 2 would not divide 32 GPUs)
        "gpt_oss_120b_te_graphs_pretrain": lambda: load_config(
            preset="gpt-oss-120b", overrides=[
                "cluster.num_gpus=32", "model.tensor_model_parallel_size=2",
                "model.sequence_parallel=true", "model.pipeline_model_parallel_size=4",
                "model.expert_model_parallel_size=8", "model.expert_tensor_parallel_size=1",
                "model.cuda_graph_impl=transformer_engine",
                "model.cuda_graph_modules=[attn,moe_router,moe_preprocess]"]),
    }[experiment]()


def _runs(status: str) -> list[str]:
    with CARDS.open(encoding="utf-8") as f:
        return sorted({r["experiment_id"] for r in csv.DictReader(f)
                       if r["status"] == status and r["gpu"] == "H100_80GB"})


def test_the_fixture_holds_every_oom_run_of_the_cards() -> None:
    assert _runs("OOM") == ["gpt_oss_120b_te_graphs_pretrain",
                            "llama70b_sft_baseline_no_expseg",
                            "llama70b_sft_core_attn_layernorm", "nemotron3nano_empty_control",
                            "nemotron3nano_moe_act", "qwen3_30b_activation_offload_24"]


@pytest.mark.parametrize("experiment", _runs("OOM"))
def test_a_run_that_went_oom_is_never_said_to_fit(experiment: str) -> None:
    rep = estimate_memory(_config(experiment), gpu="H100")
    assert rep.verdict in ("tight", "does_not_fit"), rep.verdict_term
    assert rep.fits is False


@pytest.mark.parametrize("experiment", ["nemotron3nano_moe", "nemotron3nano_moe_layernorm",
                                        "qwen3_30b_offload_baseline"])
def test_the_passing_runs_of_those_experiments_are_not_refused(experiment: str) -> None:
    rep = estimate_memory(_config(experiment), gpu="H100")
    assert rep.verdict in ("fits", "tight"), rep.verdict_term
