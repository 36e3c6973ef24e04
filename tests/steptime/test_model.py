"""The step-time model's terms against hand-computed cases, and the report's invariants."""

from __future__ import annotations

import math

import pytest

from mbridge_perf.advise.changes import apply_changes
from mbridge_perf.config.gpus import lookup_gpu
from mbridge_perf.config.load import load_config
from mbridge_perf.steptime import Calibration, GenParams, estimate_step_time, load_calibration
from mbridge_perf.steptime.calibration import SEED
from mbridge_perf.steptime.model import ACT_BYTES, _bw, _scan_bytes, _scan_rate

H = 4096
FFN = 16384
SEQ = 2048


def plain(**over: object) -> Calibration:
    """Every overhead off: time is compute (and what the test turns on) only."""
    gens = {g: GenParams(gemm_eff_bf16=0.5, gemm_eff_fp8=0.4, gemm_eff_fp4=0.3)
            for g in ("ampere", "hopper", "blackwell", "blackwell_ultra")}
    base = dict(generations=gens, grouped_gemm_factor=1.0, attn_eff=0.5, ep_exposed=0.0,
                layer_overhead_us=0.0, tp_exposed=0.0, cp_exposed=0.0, pp_exposed=0.0,
                dp_exposed=0.0, hbm_eff=1.0, coll_latency_us=0.0, coll_hop_us=0.0,
                layer_host_us=0.0)
    return Calibration(**(base | over))


def gpt(*, tp: int = 1, pp: int = 1, vp: int | None = None, layers: int = 1, gpus: int = 1,
        gbs: int = 1, heads: int = 32, prec: str = "bf16_mixed", **model: object):
    m = {"num_layers": layers, "hidden_size": H, "ffn_hidden_size": FFN,
         "num_attention_heads": heads, "seq_length": SEQ, "vocab_size": 128,
         "make_vocab_size_divisible_by": 128, "tensor_model_parallel_size": tp,
         "pipeline_model_parallel_size": pp, "sequence_parallel": tp > 1,
         "share_embeddings_and_output_weights": True, "add_bias_linear": False} | model
    if vp:
        m["virtual_pipeline_model_parallel_size"] = vp
    return load_config(data={"model": m, "train": {"global_batch_size": gbs,
                                                   "micro_batch_size": 1},
                             "mixed_precision": prec,
                             "optimizer": {"use_distributed_optimizer": False},
                             "cluster": {"num_gpus": gpus, "gpu": "h100"}})


def term(rep, name: str) -> float:
    return next(t.seconds for t in rep.breakdown if t.name == name)


def test_one_gemm_is_flops_over_peak_times_efficiency() -> None:
    """The MLP of one layer is two GEMMs: 6 x params FLOPs per token (fwd, dgrad, wgrad)."""
    cal = plain()
    base = estimate_step_time(gpt(), calibration=cal)
    wider = estimate_step_time(gpt(ffn_hidden_size=2 * FFN), calibration=cal)
    extra_flops = 6 * (2 * H * FFN) * SEQ  # the added FFN columns: up + down projections
    want = extra_flops / (989e12 * 0.5)
    got = term(wider, "compute") - term(base, "compute")
    assert got == pytest.approx(want, rel=1e-9)


def test_fp8_uses_the_fp8_peak_and_its_efficiency() -> None:
    cal = plain()
    bf16 = estimate_step_time(gpt(), calibration=cal)
    fp8 = estimate_step_time(gpt(prec="bf16_with_fp8_current_scaling_mixed"), calibration=cal)
    assert fp8.precision == "fp8"
    ratio = (term(bf16, "compute") - term(fp8, "compute"))
    assert ratio > 0  # linears at 1979 x 0.4 beat 989 x 0.5


def test_ring_collective_is_2_n_minus_1_over_n_bytes_over_bandwidth() -> None:
    """TP with SP: per layer 4 all-gathers and 4 reduce-scatters, each (n-1)/n x bytes / bw,
    i.e. 4 ring all-reduces of 2(n-1)/n x bytes / bw."""
    tp = 4
    cal = plain(tp_exposed=1.0)
    rep = estimate_step_time(gpt(tp=tp, gpus=tp), calibration=cal)
    bw = 450e9 * cal.nvlink_eff
    assert _bw(lookup_gpu("h100"), tp, cal) == pytest.approx(bw)
    act = SEQ * H * ACT_BYTES
    one_all_reduce = 2 * (tp - 1) / tp * act / bw
    assert term(rep, "exposed comm: TP") == pytest.approx(4 * one_all_reduce, rel=1e-9)


def test_each_collective_pays_its_start_up_latency() -> None:
    """A ring over n ranks starts in coll_latency + (n - 2) x coll_hop; TP's 8 collectives a
    layer pay it on top of their bytes, and full recompute repeats the forward's 4."""
    tp = 4
    cal = plain(tp_exposed=1.0, coll_latency_us=20.0, coll_hop_us=5.0)
    bw = 450e9 * cal.nvlink_eff
    one = (tp - 1) / tp * SEQ * H * ACT_BYTES / bw + (20.0 + 5.0 * (tp - 2)) * 1e-6
    rep = estimate_step_time(gpt(tp=tp, gpus=tp), calibration=cal)
    assert term(rep, "exposed comm: TP") == pytest.approx(8 * one, rel=1e-9)
    full = estimate_step_time(gpt(tp=tp, gpus=tp, recompute_granularity="full",
                                  recompute_method="uniform", recompute_num_layers=1),
                              calibration=cal)
    assert term(full, "exposed comm: TP") == pytest.approx(12 * one, rel=1e-9)


def test_tp_exposure_follows_tp_comm_overlap() -> None:
    """Without comm_overlap.tp_comm_overlap the collectives sit between the GEMMs (exposed
    share tp_exposed_no_overlap); with it, TE pipelines them (tp_exposed)."""
    tp = 4
    cal = plain(tp_exposed=0.25, tp_exposed_no_overlap=1.0)
    bw = 450e9 * cal.nvlink_eff
    full = 4 * 2 * (tp - 1) / tp * SEQ * H * ACT_BYTES / bw
    off = estimate_step_time(gpt(tp=tp, gpus=tp), calibration=cal)
    on = estimate_step_time(apply_changes(gpt(tp=tp, gpus=tp),
                                          {"comm_overlap.tp_comm_overlap": True}),
                            calibration=cal)
    assert term(off, "exposed comm: TP") == pytest.approx(full, rel=1e-9)
    assert term(on, "exposed comm: TP") == pytest.approx(0.25 * full, rel=1e-9)


def test_past_the_nvlink_domain_the_network_is_used() -> None:
    cal = plain()
    spec = lookup_gpu("h100")
    assert _bw(spec, 16, cal) == pytest.approx(50e9 * cal.network_eff)
    assert _bw(lookup_gpu("gb200"), 16, cal) == pytest.approx(900e9 * cal.nvlink_eff)


@pytest.mark.parametrize(("pp", "vp", "gbs"), [(4, None, 8), (4, None, 32), (4, 2, 8)])
def test_pipeline_bubble(pp: int, vp: int | None, gbs: int) -> None:
    """Bubble = (PP-1)/VPP stage times; its share of the pipeline is (p-1)/(v·m + p-1)."""
    cal = plain()
    rep = estimate_step_time(gpt(pp=pp, vp=vp, layers=8, gpus=pp, gbs=gbs), calibration=cal)
    m, v = gbs, vp or 1
    bubble = term(rep, "pipeline bubble")
    pipeline = rep.step_time_s - term(rep, "optimizer") - term(rep, "exposed comm: DP/EDP")
    assert bubble / pipeline == pytest.approx((pp - 1) / (v * m + pp - 1), rel=1e-9)


def test_report_invariants() -> None:
    cfg = load_config(preset="llama3-70b", overrides=[
        "cluster.num_gpus=64", "cluster.gpu=h100", "model.tensor_model_parallel_size=4",
        "model.pipeline_model_parallel_size=4", "train.global_batch_size=128",
        "train.micro_batch_size=1"])
    rep = estimate_step_time(cfg)
    tokens = 128 * cfg.model.seq_length
    assert rep.tokens_per_s_per_gpu * 64 * rep.step_time_s == pytest.approx(tokens, rel=1e-9)
    assert sum(t.seconds for t in rep.breakdown) == pytest.approx(rep.step_time_s, rel=1e-9)
    assert sum(t.share for t in rep.breakdown) == pytest.approx(1.0, rel=1e-9)
    assert rep.model_tflops_per_gpu * 1e12 * rep.step_time_s * 64 == \
        pytest.approx(rep.model_flops_per_step, rel=1e-9)
    assert 0 < rep.mfu < 1
    assert rep.band_s == pytest.approx(rep.step_time_s * load_calibration().band_frac)
    # the model-FLOP convention: 70B dense ~ 6 x params per token plus attention
    per_token = rep.model_flops_per_step / tokens
    assert 6 * 69e9 < per_token < 6 * 69e9 * 1.3


def test_recompute_costs_time_but_not_model_flops() -> None:
    cal = plain()
    none = estimate_step_time(gpt(layers=2), calibration=cal)
    full = estimate_step_time(gpt(layers=2, recompute_granularity="full",
                                  recompute_method="uniform", recompute_num_layers=1),
                              calibration=cal)
    assert full.model_flops_per_step == none.model_flops_per_step
    assert term(full, "recompute") == pytest.approx(term(none, "compute") / 3, rel=0.02)
    assert full.step_time_s > none.step_time_s


def test_unknown_gpu_or_ragged_batch_is_a_config_error() -> None:
    from mbridge_perf.config.errors import ConfigError
    cfg = gpt()
    with pytest.raises(ConfigError):
        estimate_step_time(cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
            update={"gpu": None})}))
    with pytest.raises(ConfigError):
        estimate_step_time(gpt(gpus=2, gbs=3))


def test_seed_and_shipped_calibration_load() -> None:
    cal = load_calibration()
    assert cal.generations.keys() >= {"hopper", "blackwell"}
    assert SEED.gen("rubin") == SEED.generations["blackwell"]
    assert math.isfinite(cal.band_frac)


def moe(*, ep: int, gpu: str) -> object:
    """One MoE layer (8 experts, top-2) on EP ranks only (DP = EP)."""
    return load_config(data={
        "model": {"num_layers": 1, "hidden_size": H, "ffn_hidden_size": FFN,
                  "moe_ffn_hidden_size": 1024, "num_moe_experts": 16, "moe_router_topk": 2,
                  "num_attention_heads": 32, "seq_length": SEQ, "vocab_size": 128,
                  "make_vocab_size_divisible_by": 128, "expert_model_parallel_size": ep,
                  "moe_token_dispatcher_type": "alltoall", "moe_grouped_gemm": True,
                  "share_embeddings_and_output_weights": True, "add_bias_linear": False},
        "train": {"global_batch_size": ep, "micro_batch_size": 1},
        "mixed_precision": "bf16_mixed", "optimizer": {"use_distributed_optimizer": False},
        "cluster": {"num_gpus": ep, "gpu": gpu}})


def test_ep_all_to_all_inside_the_domain_is_every_remote_copy_over_nvlink() -> None:
    cal = plain(ep_exposed=1.0)
    spec = lookup_gpu("h100")
    rep = estimate_step_time(moe(ep=8, gpu="h100"), calibration=cal)
    # dispatch + combine, fwd + bwd: 4 x tokens x top-k x h x 2 B, 7 of 8 copies leave the GPU
    vol = 4 * SEQ * 2 * H * ACT_BYTES * 7 / 8
    assert term(rep, "exposed comm: EP") == pytest.approx(vol / _bw(spec, 8, cal), rel=1e-9)


def test_ep_across_nodes_splits_copies_between_nvlink_and_the_nic() -> None:
    cal = plain(ep_exposed=1.0)
    spec = lookup_gpu("h100")  # 8 GPUs per NVLink domain: EP 32 spans 4 nodes
    rep = estimate_step_time(moe(ep=32, gpu="h100"), calibration=cal)
    per_copy = 4 * SEQ * H * ACT_BYTES
    local = 2 * 7 / 32 * per_copy / _bw(spec, 1, cal)  # 7 other ranks of the node
    remote = 2 * 3 / 4 * per_copy / _bw(spec, 32, cal)  # 3 of 4 nodes are remote
    assert remote > local
    assert term(rep, "exposed comm: EP") == pytest.approx(max(local, remote), rel=1e-9)


def test_a_layer_shorter_than_its_launch_waits_for_the_host() -> None:
    """The host floor: per layer and micro-batch, max(GPU work, layer_host_us)."""
    small = gpt(layers=2, gbs=4)  # 4 micro-batches of a 2-layer model
    gpu = estimate_step_time(small, calibration=plain()).step_time_s
    host = gpu  # far above one layer's GPU work
    a, b = (estimate_step_time(small, calibration=plain(layer_host_us=x * 1e6))
            for x in (host, 2 * host))
    # both bind: each extra second of launch time costs every layer of every micro-batch
    assert term(b, "other (host/launch)") - term(a, "other (host/launch)") == \
        pytest.approx(4 * 2 * host, rel=1e-9)
    tiny = estimate_step_time(small, calibration=plain(layer_host_us=gpu * 1e6 / 1000))
    assert term(tiny, "other (host/launch)") == 0.0


def mamba(**model: object):
    """One Mamba-2 mixer layer (no MLP): d_inner 32 x 64 = 2048, 2 groups, state 64."""
    return gpt(hybrid_layer_pattern="M", is_hybrid_model=True, mamba_num_heads=32,
               mamba_head_dim=64, mamba_num_groups=2, mamba_state_dim=64, **model)


def test_mamba_scan_bytes_count_fp32_chunk_states() -> None:
    """Scan traffic per token, by hand: bf16 passes over the in_proj output (5), the conv input
    (7) and the inner width (24), plus 14 passes of fp32 chunk states (d_in x state / chunk)."""
    d_in, conv = 2048, 2048 + 2 * 2 * 64
    bf16 = 5 * (conv + d_in + 32) + 7 * conv + 24 * d_in
    for chunk in (64, 128):
        m = mamba(mamba_chunk_size=chunk).model
        want = 2 * bf16 + 14 * 4 * d_in * 64 / chunk
        assert _scan_bytes(m, "mamba") == pytest.approx(want, rel=1e-12)
    # the memory-bound term: 40 B per token x h for norms and residual, plus the scan's bytes
    rep = estimate_step_time(mamba(mamba_chunk_size=64), calibration=plain())
    want_s = SEQ * (40 * H + 2 * bf16 + 14 * 4 * d_in) / 3.35e12
    assert term(rep, "memory-bound ops") == pytest.approx(want_s, rel=1e-9)


def test_scan_rate_follows_sm_count_not_the_tensor_peak() -> None:
    """GB200's dense BF16 peak is 2.5x H100's, its scan rate only 1.12x (SM count x clock)."""
    cal = plain(ssm_eff=0.04)
    h100, gb200 = (_scan_rate(lookup_gpu(g), cal) for g in ("h100", "gb200"))
    assert h100 == pytest.approx(0.04 * 989e12, rel=1e-12)
    assert gb200 / h100 == pytest.approx(1.12, rel=1e-12)
    # the scan's FLOPs (2 x d_in x (chunk + 2 state), x3) take FLOPs / rate of compute
    lean, fat = (estimate_step_time(mamba(), calibration=plain(ssm_eff=e)) for e in (0.04, 0.02))
    flops = SEQ * 3 * 2 * 2048 * (128 + 2 * 64)
    assert term(fat, "compute") - term(lean, "compute") == \
        pytest.approx(flops / (0.02 * 989e12) - flops / (0.04 * 989e12), rel=1e-9)


def test_cp_ring_merges_each_step_over_hbm() -> None:
    """CP2 without GQA: each ring step folds its output into fp32 and its dQ / dK,dV into fp32
    buffers - 34 B per output element and 12 B per K/V element, per token of the rank - over
    HBM. The last step's merge is exposed; the first one's only beyond a step's attention
    (half the core's time), which the next kernel hides. cp_exposed 0 leaves the K/V exchange
    out, so that is the CP term."""
    cal = plain()
    rep = estimate_step_time(gpt(gpus=2, context_parallel_size=2), calibration=cal)
    tok_cp = SEQ // 2
    per_tok = 34 * H + 12 * (2 * H)  # output width h; K and V of 32 groups x 128
    step = tok_cp * per_tok / (lookup_gpu("h100").hbm_tb_s * 1e12)
    core = tok_cp * 3 * 32 * SEQ * (2 * 128) / (989e12 * 0.5)  # fwd+bwd, causal half
    assert step > core / 2  # this shape exposes part of the first step too
    want = step + (step - core / 2)
    assert term(rep, "exposed comm: CP") == pytest.approx(want, rel=1e-9)
    assert term(estimate_step_time(gpt(), calibration=cal), "exposed comm: CP") == 0.0


def test_unfused_attention_pays_full_scores_and_their_hbm_traffic() -> None:
    """attention_backend unfused: QK^T and PV over the whole s x s (twice the causal-halved
    core) plus 32 B per score element (heads x s x s per sequence) over HBM."""
    cal = plain()
    flash = estimate_step_time(gpt(), calibration=cal)
    unfused = estimate_step_time(gpt(attention_backend="unfused"), calibration=cal)
    core = SEQ * 3 * 32 * SEQ * (2 * 128) / (989e12 * 0.5)  # fwd+bwd, causal half
    scores = 32 * 32 * SEQ * SEQ / (lookup_gpu("h100").hbm_tb_s * 1e12)
    got = term(unfused, "compute") - term(flash, "compute")
    assert got == pytest.approx(core + scores, rel=1e-9)
