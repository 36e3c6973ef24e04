"""How close estimate_memory() comes to measured GPU memory of real training runs.

Data (defaults; any CSV with the same columns works):
  - Megatron-LM CI goldens: memory logged by the TensorBoard writer on the LAST rank, GiB.
    Compared with the estimate's LAST stage: peak_max_allocated_GiB vs peak allocated,
    allocated_current_median_GiB vs static state (weights + grads + optimizer) plus the resident
    workspaces.
  - Megatron Bridge skill cards: decimal GB unless the unit says GiB; compared with the
    most-loaded stage (stage 0 when the row names rank 0).

Config columns are read with each framework's defaults where a flag is absent (Megatron-LM:
GeLU ffn = 4h, biases, LayerNorm, learned positions, tied embeddings, dropout 0.1, fusions on,
FP32 gradient accumulation with BF16; Megatron Bridge: the model preset, no dropout, the
distributed optimizer and what Bridge's recipe for that model sets). Rows that cannot be
modelled are listed with the reason. Prints per-row and per-family (dense, MoE, MLA, recompute, FP8,
offload) median / p90 |error|. Not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import load_config
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "memory"
if not DATA.exists():  # checkout layout: <root>/main/benchmarks, <root>/shared/data
    DATA = Path("/work/shared/data/memory")
CI_CSV = DATA / "megatron-ci-goldens.csv"
CARDS_CSV = DATA / "bridge-skill-cards.csv"
GB_PER_GIB = 2**30 / 1e9
FAMILIES = ("dense", "MoE", "MLA", "recompute", "FP8", "offload")

# Megatron-LM CI defaults the CSV leaves implicit (arguments.py / TransformerConfig as used by
# the CI recipes): GPT-2 BPE vocabulary, fused kernels on, BF16 with FP32 grad accumulation.
MLM_VOCAB = 50257
MLM_FUSIONS = {"masked_softmax_fusion": True, "bias_activation_fusion": True,
               "bias_dropout_fusion": True, "apply_rope_fusion": True,
               "attention_softmax_in_fp32": False, "cross_entropy_loss_fusion": False}
CI_NODE_GPUS = 8  # Megatron-LM CI runs one 8-GPU node unless the recipe says otherwise

BRIDGE_PRESETS = {"llama3 70b": "llama3-70b", "moonlight 16b": "moonlight-16b-a3b",
                  "qwen3-30b-a3b": "qwen3-30b-a3b", "qwen3 30b-a3b": "qwen3-30b-a3b",
                  "qwen3 30b a3b": "qwen3-30b-a3b", "gpt-oss-120b": "gpt-oss-120b",
                  "qwen3-8b": "qwen3-8b", "qwen3-next 80b-a3b": "qwen3-next-80b-a3b"}
# What Megatron Bridge's own recipes set for these models where a skill-card row is silent
# (megatron/bridge/recipes/<family>/*.py and scripts/performance/configs/*): applied first,
# the row's stated knobs win.
BRIDGE_RECIPES: dict[str, list[str]] = {
    # scripts/performance/configs/llama/llama3_llm_finetune.py: set_llama3_common_peft_configs
    # (grad_reduce_in_fp32=False, disable_parameter_transpose_cache=True, distributed optimizer)
    # and utils/precision.py get_precision_config("fp8_cs") (first_last_layers_bf16=False)
    # and the recipe's per-layer Transformer Engine CUDA graphs of the MLP (the Bridge 0.6.2
    # dump of LLAMA3_70B_SFT_CONFIG_H100_FP8_CS_V1, ../shared/data/bridge-recipes/yaml/
    # llama3_70b_sft_32gpu_h100_fp8cs_config.yaml: cuda_graph_impl transformer_engine,
    # cuda_graph_scope [mlp])
    "llama3-70b": ["+model.disable_parameter_transpose_cache=true",
                   "mixed_precision.grad_reduce_in_fp32=false",
                   "mixed_precision.first_last_layers_bf16=false",
                   "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[mlp]"],
    # recipes/moonlight/moonlight_16b.py: precision-aware optimizer with BF16 moments and
    # grads, grad_reduce_in_fp32=False, TE cross-entropy, alltoall dispatcher
    "moonlight-16b-a3b": ["optimizer.use_precision_aware_optimizer=true",
                          "optimizer.exp_avg_dtype=bf16", "optimizer.exp_avg_sq_dtype=bf16",
                          "optimizer.main_grads_dtype=bf16",
                          "mixed_precision.grad_reduce_in_fp32=false",
                          "+model.cross_entropy_fusion_impl=te",
                          "model.moe_token_dispatcher_type=alltoall"],
    # recipes/qwen/qwen3_moe.py qwen3_30b_a3b_pretrain_config: TE cross-entropy, grouped GEMM
    "qwen3-30b-a3b": ["+model.cross_entropy_fusion_impl=te",
                      "model.moe_token_dispatcher_type=alltoall"],
}
BRIDGE_PRECISION = {"FP8_CS": "bf16_with_fp8_current_scaling_mixed", "BF16": "bf16_mixed",
                    "FP8_MX": "bf16_with_mxfp8_mixed"}


@dataclass
class Row:
    source: str
    row_id: str
    families: list[str]
    measured_peak_gib: float | None = None
    measured_static_gib: float | None = None
    stage: str = "last"  # "last" | "most" | "0"
    overrides: list[str] = field(default_factory=list)
    preset: str | None = None
    reason: str | None = None
    peak_kind: str = "peak"  # "peak" | "first_iteration"
    note: str = ""


@dataclass
class Result:
    row: Row
    peak_err: float | None
    static_err: float | None
    pred_peak: float | None
    pred_static: float | None


# ---------------------------------------------------------------------------------------------
# Megatron-LM CI goldens


def _truthy(v: str) -> bool:
    return v.strip().lower() in ("true", "1", "yes")


def _freq(text: str) -> list[int] | int | None:
    """'([0]*3+[1]*5)' -> [0, 0, 0, 1, 1, 1, 1, 1]; '2' -> 2."""
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        return int(text)
    parts = re.findall(r"\[(\d)\]\*(\d+)", text)
    if not parts:
        raise ValueError(f"cannot read moe_layer_freq {text!r}")
    out: list[int] = []
    for v, k in parts:
        out += [int(v)] * int(k)
    return out


def _world(r: dict[str, str]) -> tuple[int, str]:
    m = re.search(r":(\d+)x(\d+)", r.get("recipe_world_size", ""))
    if m:
        return int(m.group(1)) * int(m.group(2)), "recipe"
    if r.get("num_workers", "").strip().isdigit():
        return int(r["num_workers"]) * CI_NODE_GPUS, "num_workers x 8"
    return CI_NODE_GPUS, "assumed 8 (one CI node)"


def ci_rows(path: Path) -> Iterable[Row]:
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            yield ci_row(r)


def ci_row(r: dict[str, str]) -> Row:
    g = r.get
    rid = f"{g('test_case')}@{g('platform')}"
    fam = _families_ci(r)
    row = Row(source="ci", row_id=rid, families=fam,
              measured_peak_gib=_num(g("peak_max_allocated_GiB")),
              measured_static_gib=_num(g("allocated_current_median_GiB")), stage="last")
    if "grpo" in (g("test_case") or ""):
        row.reason = ("RL (GRPO) run: memory is held by the inference engine (KV cache, "
                      "CUDA-graph pools, weight copies), not by training")
        return row
    if g("test_type") == "release" and "x" not in (g("recipe_world_size") or ""):
        row.reason = ("release test outside the current CI recipes: its (multi-node) world "
                      "size is not recorded, so DP and the optimizer sharding are unknown")
        return row
    try:
        L, h, a = int(g("L")), int(g("h")), int(g("a"))
    except (TypeError, ValueError):
        row.reason = "layers / hidden / heads not given"
        return row
    tp, pp = int(g("tp") or 1), int(g("pp") or 1)
    swiglu = _truthy(g("swiglu") or "")
    ffn = int(g("ffn")) if g("ffn") else (int((4 * h * 2 / 3) / 64) * 64 if swiglu else 4 * h)
    world, world_src = _world(r)
    fp16 = _truthy(g("fp16") or "")
    mp: dict[str, Any] = {"bf16": not fp16, "fp16": fp16, "grad_reduce_in_fp32": not fp16}
    if g("fp8"):
        mp.update(fp8=g("fp8"), fp8_recipe=g("fp8_recipe") or "delayed",
                  fp8_param_gather=_truthy(g("fp8_param_gather") or ""))
    model: dict[str, Any] = {
        "num_layers": L, "hidden_size": h, "num_attention_heads": a, "ffn_hidden_size": ffn,
        "seq_length": int(g("seq")), "vocab_size": int(g("vocab_size") or MLM_VOCAB),
        "make_vocab_size_divisible_by": int(g("vocab_div") or 128),
        "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
        "context_parallel_size": int(g("cp") or 1),
        "sequence_parallel": _truthy(g("sp") or "") and tp > 1,
        "share_embeddings_and_output_weights": not _truthy(g("untie") or ""),
        "normalization": g("norm") or "LayerNorm", "gated_linear_unit": swiglu,
        "transformer_impl": g("impl") or "transformer_engine",
        "attention_backend": g("attn_backend") or "auto", **MLM_FUSIONS,
    }
    if (g("norm") == "RMSNorm") and swiglu:
        # Llama-style CI configs (RMSNorm + SwiGLU) also pass flags the CSV has no column for:
        # --attention-dropout 0 --hidden-dropout 0 --position-embedding-type rope
        # --disable-bias-linear (e.g. moe/gpt3_mcore_te_tp2_pp2_ep4_etp1_*/model_config.yaml)
        model.update(attention_dropout=0.0, hidden_dropout=0.0, position_embedding_type="rope",
                     add_bias_linear=False)
        row.note = "llama-style flags assumed; "
    if "cross_entropy_loss_fusion" in (g("test_case") or ""):
        model["cross_entropy_loss_fusion"] = True  # the flag the test is named after
    if g("qg") and _truthy(g("gqa") or "True"):
        model["num_query_groups"] = int(g("qg"))
    if g("kv_channels") and not _truthy(g("mla") or ""):
        model["kv_channels"] = int(g("kv_channels"))
    if g("vp_stages_per_rank"):
        model["virtual_pipeline_model_parallel_size"] = int(g("vp_stages_per_rank"))
    elif g("layers_per_vp"):
        per_rank = L // pp
        vpp = per_rank // int(g("layers_per_vp"))
        if vpp > 1:
            model["virtual_pipeline_model_parallel_size"] = vpp
    if g("pp_layout"):
        model["pipeline_model_parallel_layout"] = g("pp_layout")
        model.pop("virtual_pipeline_model_parallel_size", None)
    if g("first_pp_layers"):
        model["num_layers_in_first_pipeline_stage"] = int(g("first_pp_layers"))
    if g("last_pp_layers"):
        model["num_layers_in_last_pipeline_stage"] = int(g("last_pp_layers"))
    model["account_for_embedding_in_pipeline_split"] = _truthy(g("acct_emb") or "")
    model["account_for_loss_in_pipeline_split"] = _truthy(g("acct_loss") or "")
    if g("experts"):
        model.update(num_moe_experts=int(g("experts")), moe_router_topk=int(g("topk") or 2),
                     expert_model_parallel_size=int(g("ep") or 1),
                     moe_grouped_gemm=_truthy(g("grouped_gemm") or ""),
                     moe_token_dispatcher_type=g("dispatcher") or "allgather")
        if g("etp"):
            model["expert_tensor_parallel_size"] = int(g("etp"))
        if g("moe_ffn"):
            model["moe_ffn_hidden_size"] = int(g("moe_ffn"))
        if g("shared_ffn"):
            model["moe_shared_expert_intermediate_size"] = int(g("shared_ffn"))
        freq = _freq(g("moe_layer_freq") or "")
        if freq is not None:
            model["moe_layer_freq"] = freq
    if g("mtp"):
        model["mtp_num_layers"] = int(g("mtp"))
    if _truthy(g("mla") or ""):
        model.update(multi_latent_attention=True, kv_lora_rank=int(g("kv_lora") or 512),
                     q_lora_rank=int(g("q_lora")) if g("q_lora") else None)
    if g("recompute"):
        model["recompute_granularity"] = g("recompute")
        if g("rc_method"):
            model["recompute_method"] = g("rc_method")
        if g("rc_layers"):
            model["recompute_num_layers"] = int(g("rc_layers"))
        if g("rc_modules"):
            model["recompute_modules"] = g("rc_modules").strip("[]").split()
    if _truthy(g("fg_offload") or ""):
        model["fine_grained_activation_offloading"] = True
        model["offload_modules"] = (g("offload_modules") or "").strip("[]").split()
    if g("cuda_graph"):
        model["cuda_graph_impl"] = g("cuda_graph")
    ddp: dict[str, Any] = {"use_distributed_optimizer": _truthy(g("distopt") or "")}
    if _truthy(g("mfsdp") or ""):
        ddp.update(use_megatron_fsdp=True,
                   data_parallel_sharding_strategy=g("fsdp_strategy") or "optim_grads_params")
    train: dict[str, Any] = {"micro_batch_size": int(g("mbs") or 1)}
    if g("gbs"):
        train["global_batch_size"] = int(g("gbs"))
    row.overrides = [_data({"model": model, "train": train, "ddp": ddp,
                            "optimizer": {"use_distributed_optimizer":
                                          ddp["use_distributed_optimizer"]},
                            "mixed_precision": mp, "cluster": {"num_gpus": world}})]
    row.note += f"world {world} ({world_src})"
    return row


def _families_ci(r: dict[str, str]) -> list[str]:
    fam = ["MoE" if r.get("experts") else "dense"]
    if _truthy(r.get("mla") or ""):
        fam.append("MLA")
    if r.get("recompute"):
        fam.append("recompute")
    if r.get("fp8"):
        fam.append("FP8")
    if _truthy(r.get("fg_offload") or ""):
        fam.append("offload")
    return fam


# ---------------------------------------------------------------------------------------------
# Megatron Bridge skill cards


def _num(text: str | None) -> float | None:
    try:
        return float(text) if text not in (None, "") else None
    except ValueError:
        return None


def card_rows(path: Path) -> Iterable[Row]:
    with path.open(newline="") as f:
        for r in csv.DictReader(f):
            yield card_row(r)


def card_row(r: dict[str, str]) -> Row:
    g = r.get
    rid = f"{g('experiment_id')}[{g('metric')}]"
    model_name = (g("model") or "").lower()
    value = _num(g("value"))
    unit = (g("unit") or "").strip()
    gib = None if value is None else (value if unit == "GiB" else value / GB_PER_GIB)
    fam = _families_card(r)
    row = Row(source="cards", row_id=rid, families=fam, measured_peak_gib=gib,
              stage="0" if "rank0" in (g("metric") or "") + (g("mem_kind") or "") or
              "rank 0" in (g("notes") or "") else "most")
    status = g("status") or ""
    metric = g("metric") or ""
    if status in ("worked_estimate", "illustrative", "estimate_or_measured_unclear"):
        row.reason = f"not a measurement (status {status})"
        return row
    if g("mem_kind") == "snapshot" or not model_name or "not stated" in model_name:
        row.reason = "no model configuration given (memory-snapshot example)"
        return row
    if "peft" in (g("task") or "") or "lora" in (g("task") or "").lower():
        row.reason = "LoRA / PEFT run: frozen weights and adapters are not modelled"
        return row
    if "nemotron" in model_name:
        row.reason = "hybrid Mamba/attention MoE (Nemotron 3 Nano): no preset, Mamba " \
                     "activations not modelled"
        return row
    if "reserved" in metric or "reserved" in (g("mem_kind") or ""):
        row.reason = "reserved memory (allocator band), not allocated"
        return row
    if gib is None:
        text = g("value_text") or ""
        nums = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]
        if not nums:
            row.reason = "no numeric value"
            return row
        gib = statistics.mean(nums) / GB_PER_GIB
        row.measured_peak_gib = gib
    preset = next((v for k, v in BRIDGE_PRESETS.items() if model_name.startswith(k)), None)
    if preset is None:
        row.reason = f"no preset for {g('model')!r}"
        return row
    if not g("tp") and not g("ep"):
        row.reason = "parallel layout not stated"
        return row
    if "cpu_offloading=True" in (g("offload") or "") and not g("tp"):
        row.reason = "activation-offload row: TP / EP / seq not stated"
        return row
    row.preset = preset
    ov: list[str] = []
    tp, pp = int(g("tp") or 1), int(g("pp") or 1)
    ov += [f"model.tensor_model_parallel_size={tp}", f"model.pipeline_model_parallel_size={pp}",
           "model.hidden_dropout=0.0", "model.attention_dropout=0.0",
           "optimizer.use_distributed_optimizer=true", "ddp.use_distributed_optimizer=true",
           f"model.sequence_parallel={'true' if tp > 1 else 'false'}"]
    if g("vpp"):
        ov.append(f"model.virtual_pipeline_model_parallel_size={g('vpp')}")
    if g("cp"):
        ov.append(f"model.context_parallel_size={g('cp')}")
    if g("ep"):
        ov.append(f"model.expert_model_parallel_size={g('ep')}")
        ov.append(f"model.expert_tensor_parallel_size={g('etp') or 1}")
        ov.append("model.moe_grouped_gemm=true")
    if g("seq_len"):
        ov.append(f"model.seq_length={g('seq_len')}")
    ov.append(f"train.micro_batch_size={g('mbs') or 1}")
    if g("gbs"):
        ov.append(f"train.global_batch_size={g('gbs')}")
    if g("num_gpus"):
        ov.append(f"cluster.num_gpus={g('num_gpus')}")
    prec = (g("precision") or "BF16").split()[0]
    recipe = BRIDGE_PRECISION.get(prec, "bf16_mixed")
    mp = {"bf16_mixed": {"bf16": True},
          "bf16_with_fp8_current_scaling_mixed": {
              "bf16": True, "fp8": "hybrid", "fp8_recipe": "tensorwise",
              "first_last_layers_bf16": True, "num_layers_at_start_in_bf16": 1,
              "num_layers_at_end_in_bf16": 1, "fp8_param_gather": True},
          "bf16_with_mxfp8_mixed": {"bf16": True, "fp8": "e4m3", "fp8_recipe": "mxfp8",
                                    "fp8_param_gather": True}}[recipe]
    for k, v in mp.items():
        ov.append(f"mixed_precision.{k}={str(v).lower() if isinstance(v, bool) else v}")
    ov += BRIDGE_RECIPES.get(preset, [])
    if g("recompute_granularity"):
        ov.append(f"model.recompute_granularity={g('recompute_granularity')}")
        mods = (g("recompute_modules") or "").strip("[]").replace(",", " ").split()
        ov.append(f"model.recompute_modules=[{','.join(mods)}]")
    for knob in re.findall(r"(\w+)=([\w.]+)", g("offload") or ""):
        name, val = knob
        if name.startswith("optimizer_"):
            ov.append(f"optimizer.{name}={val.lower()}")
        elif name.startswith("cpu_offloading"):
            ov.append(f"model.{name}={val.lower()}")
    disp = (g("dispatcher") or "").lower()
    if "hybridep" in disp:
        ov += ["model.moe_token_dispatcher_type=flex",
               "model.moe_flex_dispatcher_backend=hybridep"]
    elif "alltoall" in disp:
        ov.append("model.moe_token_dispatcher_type=alltoall")
    graphs = g("cuda_graph") or ""
    if graphs.startswith(("transformer_engine", "local")):
        impl, _, mods = graphs.partition(":")
        ov.append(f"model.cuda_graph_impl={impl.strip()}")
        names = [x.strip() for x in mods.split(",") if x.strip()]
        if names:
            ov.append(f"model.cuda_graph_modules=[{','.join(names)}]")
    if "iter1" in metric:
        row.peak_kind = "first_iteration"
    ov.append("env.PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    row.overrides = ov
    return row


def _families_card(r: dict[str, str]) -> list[str]:
    name = (r.get("model") or "").lower()
    moe = any(k in name for k in ("a3b", "moonlight", "oss", "dsv3", "nano", "a22b"))
    fam = ["MoE" if moe else "dense"]
    if "moonlight" in name or "dsv3" in name:
        fam.append("MLA")
    if r.get("recompute_granularity") and (r.get("recompute_modules") or "") not in ("", "[]"):
        fam.append("recompute")
    if "FP8" in (r.get("precision") or ""):
        fam.append("FP8")
    if r.get("offload"):
        fam.append("offload")
    return fam


def _data(d: dict[str, Any]) -> Any:
    return d  # carried as a mapping (not a dotted override)


# ---------------------------------------------------------------------------------------------
# running


def estimate_row(row: Row) -> tuple[MemoryReport, int]:
    if row.preset:
        cfg = load_config(preset=row.preset, overrides=row.overrides)
    else:
        cfg = load_config(data=row.overrides[0])
    rep = estimate_memory(cfg)
    if row.stage == "last":
        idx = len(rep.per_stage) - 1
    elif row.stage == "0":
        idx = 0
    else:
        idx = rep.most_loaded_stage
    return rep, idx


def run(rows: list[Row]) -> tuple[list[Result], list[Row]]:
    results: list[Result] = []
    skipped: list[Row] = []
    for row in rows:
        if row.reason:
            skipped.append(row)
            continue
        try:
            rep, idx = estimate_row(row)
        except ConfigError as exc:
            row.reason = f"estimator refused the config: {exc}"
            skipped.append(row)
            continue
        st = rep.per_stage[idx]
        pred_static = st.static_gib + st.workspace_gib
        pred_peak = st.peak_allocated_gib
        if row.peak_kind == "first_iteration":
            # before the optimizer's first step and before any CUDA graph is captured (the
            # warm-up iterations run eager): the eager forward / backward without Adam moments
            peak = st.peak_allocated_gib
            if st.graphed_peak_allocated_gib is not None:
                peak = st.static_gib + st.activations_gib + st.transient_gib + st.workspace_gib
            pred_peak = peak - st.optimizer_gib * _moment_share(rep)
        pe = se = None
        if row.measured_peak_gib:
            pe = pred_peak / row.measured_peak_gib - 1
        if row.measured_static_gib:
            se = pred_static / row.measured_static_gib - 1
        results.append(Result(row, pe, se, pred_peak, pred_static))
    return results, skipped


def _moment_share(rep: MemoryReport) -> float:
    """Adam moments are allocated at the first optimizer step: their share of optimizer
    state (8 of 12 bytes with FP32 master weights)."""
    return 8 / 12


def _stats(xs: list[float]) -> str:
    if not xs:
        return "      -        -     n=0"
    a = sorted(abs(x) for x in xs)
    p90 = a[min(len(a) - 1, round(0.9 * (len(a) - 1)))]
    return f"{100 * statistics.median(a):6.1f} % {100 * p90:6.1f} %  n={len(a)}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ci_csv", nargs="?", default=str(CI_CSV))
    ap.add_argument("cards_csv", nargs="?", default=str(CARDS_CSV))
    ap.add_argument("--limit", type=int, default=None, help="first N rows of each file")
    ap.add_argument("--quiet", action="store_true", help="summary only")
    args = ap.parse_args(argv)
    rows: list[Row] = []
    for path, reader in ((Path(args.ci_csv), ci_rows), (Path(args.cards_csv), card_rows)):
        if not path.exists():
            print(f"missing {path}", file=sys.stderr)
            return 2
        got = list(reader(path))
        rows += got[: args.limit] if args.limit else got
    results, skipped = run(rows)
    if not args.quiet:
        print(f"{'row':78s} {'stage':>5s} {'meas pk':>8s} {'est pk':>8s} {'err':>7s} "
              f"{'meas st':>8s} {'est st':>8s} {'err':>7s}  families")
        for res in results:
            r = res.row
            pk = f"{100 * res.peak_err:+6.1f}%" if res.peak_err is not None else "      -"
            st = f"{100 * res.static_err:+6.1f}%" if res.static_err is not None else "      -"
            ms = f"{r.measured_static_gib:8.3f}" if r.measured_static_gib else "       -"
            es = f"{res.pred_static:8.3f}" if r.measured_static_gib else "       -"
            print(f"{r.row_id[:78]:78s} {r.stage:>5s} {r.measured_peak_gib or 0:8.3f} "
                  f"{res.pred_peak:8.3f} {pk} {ms} {es} {st}  {','.join(r.families)}")
    print()
    print("Summary: |error| median / p90 (GiB-based; peak = peak allocated, static = "
          "weights + grads + optimizer + resident workspaces)")
    print(f"{'group':28s} {'peak median':>11s} {'p90':>8s}        {'static median':>13s} "
          f"{'p90':>8s}")
    groups = [("all", lambda r: True), ("source: Megatron-LM CI", lambda r: r.source == "ci"),
              ("source: Bridge cards", lambda r: r.source == "cards")]
    groups += [(f"family: {f}", lambda r, f=f: f in r.families) for f in FAMILIES]
    for name, pred in groups:
        sel = [x for x in results if pred(x.row)]
        pk = [x.peak_err for x in sel if x.peak_err is not None]
        st = [x.static_err for x in sel if x.static_err is not None]
        print(f"{name:28s} {_stats(pk)}   {_stats(st)}")
    print()
    print(f"modelled rows: {len(results)}; listed, not modelled: {len(skipped)}")
    reasons: dict[str, list[str]] = {}
    for r in skipped:
        reasons.setdefault(r.reason or "?", []).append(r.row_id)
    for reason, ids in sorted(reasons.items(), key=lambda kv: -len(kv[1])):
        print(f"  {len(ids):3d} x {reason}")
        if not args.quiet:
            for i in ids:
                print(f"        {i}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
