"""The measurement contract: what a config freezes, the benchmark-only label, and diff() naming
every differing field (grouped into the variables an A/B may change)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from mbridge_perf.bench.contract import (
    MeasurementContract,
    contract_from_config,
    diff,
    flatten,
    performance_env,
    variables,
)
from mbridge_perf.config.load import load_config

MOE = ["cluster.num_gpus=16", "cluster.gpus_per_node=8", "cluster.gpu=H100",
       "model.tensor_model_parallel_size=2", "model.sequence_parallel=true",
       "model.expert_model_parallel_size=8", "model.expert_tensor_parallel_size=1",
       "model.moe_token_dispatcher_type=alltoall", "train.global_batch_size=512",
       "train.train_iters=50", "mixed_precision=bf16_mixed"]


def moe(*extra: str, **kw) -> MeasurementContract:
    cfg = load_config(preset="qwen3-30b-a3b", overrides=[*MOE, *extra])
    return contract_from_config(cfg, model="qwen3-30b-a3b", task="pretrain", data="mock", **kw)


def test_contract_records_layout_shape_and_hardware_from_the_config() -> None:
    c = moe(versions={"megatron_bridge": "067f987df03b", "megatron_core": "2a75ac12c54b"},
            topology="NVL8 + IB")
    assert (c.layout.tp, c.layout.ep, c.layout.etp, c.layout.pp) == (2, 8, 1, 1)
    assert c.layout.dp == 8  # 16 / (TP2 · PP1 · CP1)
    assert c.layout.edp == 2  # 16 / (ETP1 · EP8 · PP1)
    assert (c.hardware.num_gpus, c.hardware.gpu, c.hardware.gpus_per_node, c.hardware.nodes) == (
        16, "H100", 8, 2)
    assert c.workload.global_batch_size == 512 and c.workload.seq_length == 4096
    assert c.workload.architecture["num_moe_experts"] == 128
    assert c.dispatcher.type == "alltoall" and c.dispatcher.backend is None
    assert c.precision.recipe == "bf16_mixed" and c.precision.compute == "bf16"
    assert c.precision.fp8 is None and c.precision.fp8_recipe is None
    assert (c.window.start, c.window.end, c.window.steps, c.window.warmup) == (41, 50, 50, 40)
    assert not c.window.screening
    assert c.label == "training-equivalent" and c.label_reasons == []
    assert c.versions.megatron_core == "2a75ac12c54b" and c.hardware.topology == "NVL8 + IB"


def test_forced_load_balancing_makes_the_run_benchmark_only() -> None:
    c = moe("model.moe_router_force_load_balancing=true")
    assert c.label == "benchmark-only"
    assert "moe_router_force_load_balancing" in c.label_reasons[0]
    with pytest.raises(ValueError, match="benchmark-only"):
        moe("model.moe_router_force_load_balancing=true", label="training-equivalent")
    # a stored contract cannot carry the contradiction either
    data = c.model_dump()
    data["label"] = "training-equivalent"
    with pytest.raises(ValidationError, match="benchmark-only"):
        MeasurementContract.model_validate(data)
    # a user may declare benchmark-only for other reasons (synthetic data, no optimizer)
    assert moe(label="benchmark-only").label == "benchmark-only"


def test_only_performance_env_vars_are_recorded_and_secrets_never() -> None:
    cfg = load_config(preset="llama3-8b", overrides=[
        "cluster.num_gpus=8", "env.NCCL_GRAPH_REGISTER=0", "env.HF_TOKEN=hf_secret",
        "env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "env.WANDB_API_KEY=x"])
    c = contract_from_config(cfg, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1",
                                       "NCCL_GRAPH_REGISTER": "1"})
    assert c.environment == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_GRAPH_REGISTER": "0",
                             "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "hf_secret" not in c.model_dump_json()
    assert performance_env({"NVTE_FUSED_ATTN": "1", "HOME": "/root"}) == {"NVTE_FUSED_ATTN": "1"}


# Names the allowlist passes from each of its classes (single names, each family), the old
# recording list missed some of them (OMP_PLACES, CUDA_MODULE_LOADING, CUBLASLT_*, ...).
ALLOWED_SAMPLE = {
    "OMP_NUM_THREADS": "8", "OMP_PLACES": "cores", "CUDA_MODULE_LOADING": "LAZY",
    "PYTORCH_ALLOC_CONF": "expandable_segments:True", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
    "CUBLASLT_WORKSPACE_SIZE": "1024", "CUDNNFE_CLUSTER_OVERLAP_MARGIN": "4",
    "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN": "8", "NVSHMEM_IBGDA_NUM_RC_PER_PE": "4",
    "MKL_NUM_THREADS": "1", "USE_MNNVL": "1", "NVLINK_DOMAIN_SIZE": "72"}
# Names a trusted profile may set that the allowlist refuses: never recorded.
REFUSED_SAMPLE = {"HF_TOKEN": "hf_secret", "NCCL_SOCKET_IFNAME": "ib0", "UV_INDEX_URL": "u",
                  "SLURM_JOB_NODELIST": "n1", "MASTER_ADDR": "h", "TRITON_CACHE_MANAGER": "x:y",
                  "UB_SOMETHING": "1", "TORCH_CUDNN_SOME_DIR": "/tmp"}


def test_contract_records_exactly_the_allowlisted_env_the_run_set() -> None:
    """One source of truth: the contract records every name the job-environment allowlist
    passes and nothing else, whatever list of names it is handed."""
    from mbridge_perf.bench.envpolicy import refusal

    assert all(refusal(k) is None for k in ALLOWED_SAMPLE)
    assert all(refusal(k) for k in REFUSED_SAMPLE)
    recorded = dict(sorted(ALLOWED_SAMPLE.items()))
    assert performance_env({**ALLOWED_SAMPLE, **REFUSED_SAMPLE}) == recorded
    cfg = load_config(preset="llama3-8b", overrides=["cluster.num_gpus=8"])
    c = contract_from_config(cfg, env={**ALLOWED_SAMPLE, **REFUSED_SAMPLE})
    assert c.environment == recorded
    assert "hf_secret" not in c.model_dump_json()


def test_submit_contract_records_the_job_env_the_script_exports(tmp_path) -> None:
    """Through submit (dry run): skill defaults, the config's env and the profile's env all
    reach the record when allowlisted; the profile's secrets and wiring do not."""
    from mbridge_perf.bench import service

    profile = service.resolve_profile({"name": "p", "executor": "local",
                                       "env": {**REFUSED_SAMPLE, "OMP_PLACES": "cores"}})
    cfg = load_config(preset="llama3-8b", overrides=[
        "cluster.num_gpus=8", "env.CUDA_MODULE_LOADING=LAZY", "env.CUBLASLT_WORKSPACE_SIZE=1"])
    handle = service.submit(cfg, profile, dry_run=True, steps=50,
                            recipe="llama3_8b_pretrain_config")
    env = handle.contract["environment"]
    assert env["CUDA_MODULE_LOADING"] == "LAZY" and env["CUBLASLT_WORKSPACE_SIZE"] == "1"
    assert env["OMP_PLACES"] == "cores" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert not set(env) & set(REFUSED_SAMPLE)
    assert "OMP_PLACES=" in handle.script


def test_profile_wiring_outside_the_allowlist_still_tells_runs_apart() -> None:
    """Cluster wiring a profile sets (NCCL_IB_HCA) is not recorded by value, but two runs whose
    profiles differ in it are not an A/B of anything else: the job's env hash differs; a secret
    never appears in the record, and a profile without such names has no hash."""
    from mbridge_perf.bench import service

    cfg = load_config(preset="llama3-8b", overrides=["cluster.num_gpus=8"])

    def contract(env: dict[str, str]) -> MeasurementContract:
        profile = service.resolve_profile({"name": "p", "executor": "local", "env": env})
        handle = service.submit(cfg, profile, steps=50, recipe="llama3_8b_pretrain_config")
        return MeasurementContract.model_validate(handle.contract)

    a = contract({"NCCL_IB_HCA": "mlx5_0", "HF_TOKEN": "hf_secret"})
    b = contract({"NCCL_IB_HCA": "mlx5_1", "HF_TOKEN": "hf_secret"})
    assert "hf_secret" not in a.model_dump_json() and "mlx5_0" not in a.model_dump_json()
    assert variables(diff(a, b)) == ["job.env_sha256"]
    assert contract({"NCCL_ALGO": "Ring"}).job.env_sha256 is None


def test_a_recipe_run_freezes_the_recipes_graphs_with_the_configs_values_over_them(
        tmp_path) -> None:
    """Issue 23: the contract said no graphs where the recipe run_recipe.py trains graphs
    [moe_router, moe_preprocess]. Through the CLI process: the contract is the recipe with the
    config's values over it, as the job trains it; a recipe not shipped here stays as given."""
    import json
    import subprocess

    from helpers import tool, tool_env

    (tmp_path / "eos.yaml").write_text("executor: slurm\npartition: batch\ngpus_per_node: 8\n")
    recipe = "qwen3_235b_a22b_pretrain_256gpu_h100_bf16_hybridep_dev_config"

    def contract(*args: str) -> dict:
        p = subprocess.run([tool("mbridge-perf"), "bench", "submit", "--profile", "eos",
                            "--json", *args], capture_output=True, text=True, timeout=120,
                           cwd=tmp_path, env=tool_env(MBRIDGE_PERF_PROFILES=str(tmp_path)))
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)["contract"]

    c = contract("--recipe", recipe)
    assert c["cuda_graphs"]["impl"] == "transformer_engine"
    assert c["cuda_graphs"]["modules"] == ["moe_router", "moe_preprocess"]
    assert c["dispatcher"] == {"type": "flex", "backend": "hybridep"}
    assert (c["layout"]["tp"], c["layout"]["pp"], c["layout"]["ep"]) == (2, 8, 32)
    off = contract("--recipe", recipe, "--set", "model.cuda_graph_impl=none",
                   "--set", "model.tensor_model_parallel_size=4")
    assert off["cuda_graphs"]["impl"] == "none" and off["layout"]["tp"] == 4
    mine = contract("--recipe", "my_site_recipe_config")
    assert mine["cuda_graphs"]["impl"] == "none"  # not shipped: the config as given


def test_bad_inputs_are_named() -> None:
    with pytest.raises(ValueError, match=r"unknown version key.*bridge_sha"):
        moe(versions={"bridge_sha": "abc"})
    with pytest.raises(ValueError, match="only 50 steps"):
        moe(window=(51, 60))
    with pytest.raises(ValueError, match="end is before the start"):
        moe(window=(50, 41))


def test_screening_window_is_flagged() -> None:
    c = moe("train.train_iters=12", window=(7, 12))
    assert c.window.screening and c.window.warmup == 6


def test_precision_dispatcher_recompute_and_graph_fields() -> None:
    c = moe("mixed_precision=bf16_with_mxfp8_mixed", "model.moe_token_dispatcher_type=flex",
            "model.moe_flex_dispatcher_backend=hybridep", "model.recompute_granularity=selective",
            "model.recompute_modules=[moe_act,layernorm]", "model.moe_grouped_gemm=true",
            "model.cuda_graph_impl=transformer_engine",
            "model.cuda_graph_modules=[moe_router,moe_preprocess]",
            "comm_overlap.overlap_moe_expert_parallel_comm=true")
    assert (c.precision.fp8, c.precision.fp8_recipe) == ("e4m3", "mxfp8")
    assert (c.dispatcher.type, c.dispatcher.backend) == ("flex", "hybridep")
    assert c.recompute.modules == ["moe_act", "layernorm"] and c.recompute.method is None
    assert c.cuda_graphs.impl == "transformer_engine"
    assert c.cuda_graphs.modules == ["moe_router", "moe_preprocess"]
    assert c.overlap.overlap_moe_expert_parallel_comm


def test_contract_round_trips_through_json_and_is_frozen() -> None:
    c = moe()
    assert MeasurementContract.model_validate_json(c.model_dump_json()) == c
    with pytest.raises(ValidationError):
        c.launcher = "other"  # type: ignore[misc]


@pytest.mark.parametrize(("overrides", "kw", "fields", "variable"), [
    (["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=[moe_router]"], {},
     {"cuda_graphs.impl", "cuda_graphs.modules"}, ["cuda_graphs"]),
    (["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"], {},
     {"dispatcher.type", "dispatcher.backend"}, ["dispatcher"]),
    (["comm_overlap.overlap_moe_expert_parallel_comm=true"], {},
     {"overlap.overlap_moe_expert_parallel_comm"}, ["overlap.overlap_moe_expert_parallel_comm"]),
    (["model.tensor_model_parallel_size=4"], {}, {"layout.tp", "layout.dp"}, ["layout.tp"]),
    (["cluster.num_gpus=32"], {}, {"hardware.num_gpus", "hardware.nodes", "layout.dp",
                                   "layout.edp"}, ["hardware.num_gpus"]),
    (["train.global_batch_size=1024"], {}, {"workload.global_batch_size"},
     ["workload.global_batch_size"]),
    (["env.NCCL_GRAPH_REGISTER=0"], {}, {"environment.NCCL_GRAPH_REGISTER"},
     ["environment.NCCL_GRAPH_REGISTER"]),
    ([], {"versions": {"megatron_core": "abc"}}, {"versions.megatron_core"},
     ["versions.megatron_core"]),
    ([], {"window": (31, 40)}, {"window.start", "window.end"}, ["window"]),
    (["model.moe_router_force_load_balancing=true"], {},
     {"routing.force_load_balancing", "label"}, ["routing"]),
    (["mixed_precision=bf16_with_fp8_current_scaling_mixed"], {},
     {"precision.recipe", "precision.fp8", "precision.fp8_recipe", "precision.fp8_param",
      "precision.first_last_layers_bf16"}, ["precision"]),
    (["model.recompute_granularity=full", "model.recompute_method=uniform",
      "model.recompute_num_layers=1"], {},
     {"recompute.granularity", "recompute.method", "recompute.num_layers"}, ["recompute"]),
    (["model.moe_grouped_gemm=true"], {}, {"kernels.moe_grouped_gemm"},
     ["kernels.moe_grouped_gemm"]),
])
def test_diff_names_every_differing_field(overrides, kw, fields, variable) -> None:
    a, b = moe(), moe(*overrides, **kw)
    d = diff(a, b)
    assert {x.field for x in d} == fields
    assert variables(d) == variable
    for x in d:  # both sides' values are reported
        assert flatten(a).get(x.field) == x.a and flatten(b).get(x.field) == x.b
    assert diff(a, a) == [] and variables([]) == []


def test_diff_of_dense_against_moe_names_the_routing_and_architecture() -> None:
    dense = contract_from_config(load_config(preset="llama3-8b",
                                             overrides=["cluster.num_gpus=16"]))
    d = {x.field for x in diff(dense, moe())}
    assert "routing.force_load_balancing" in d and "dispatcher.type" in d
    assert "workload.architecture.num_moe_experts" in d and "workload.model" in d
    assert "label_reasons" not in d


def test_two_changes_are_two_variables() -> None:
    d = diff(moe(), moe("model.tensor_model_parallel_size=4", "env.NCCL_NVLS_ENABLE=0"))
    assert sorted(variables(d)) == ["environment.NCCL_NVLS_ENABLE", "layout.tp"]


def test_contract_freezes_recompute_and_graphs_as_megatron_reads_them() -> None:
    """The contract reads the resolved view: an unset recompute_modules is Megatron-Core's
    ["core_attn"], the deprecated moe_layer_recompute folds in, a "full" graph scope means
    whole layers (not the letters of the word), the local impl graphs the router pair."""
    unset = moe("model.recompute_granularity=selective")
    explicit = moe("model.recompute_granularity=selective", "model.recompute_modules=[core_attn]")
    assert unset.recompute.modules == ["core_attn"] == explicit.recompute.modules
    assert not diff(unset, explicit)
    folded = moe("model.moe_layer_recompute=true")
    assert folded.recompute.granularity == "selective"
    assert folded.recompute.modules == ["core_attn", "moe"]
    whole = moe("model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=full")
    assert whole.cuda_graphs.impl == "transformer_engine" and whole.cuda_graphs.modules is None
    spelt = moe("model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=attn,mlp")
    assert spelt.cuda_graphs.modules == ["attn", "mlp"]
    word = moe("model.cuda_graph_impl=transformer_engine", "model.cuda_graph_modules=full")
    assert word.cuda_graphs.modules is None
    router = moe("model.cuda_graph_impl=local", "model.cuda_graph_modules=[moe_router]")
    assert router.cuda_graphs.modules == ["moe_router", "moe_preprocess"]
    legacy = moe("model.enable_cuda_graph=true")
    assert legacy.cuda_graphs.impl == "local"
