"""Properties of the memory estimator over random valid configurations (hypothesis).

- more TP never raises the weights (or parameters) one GPU of any stage holds;
- full recompute <= selective recompute <= no recompute, for every layer and every stage's
  activations (full `block` recompute that leaves layers whole is only <= none);
- the stages' layers are every transformer layer exactly once, as the validator places them;
- parameters summed over the stages are the model's parameters (per GPU: the TP / EP shards
  plus the TP-replicated share), and the report's total is `count_params`'s;
- the same input gives the identical report, whatever was estimated in between.

Configurations are built valid by construction (sizes that divide, layer splits Megatron-Core
accepts) and then required to pass `rules.validate`, so what is tested is the estimator, not the
validator. Deterministic: `derandomize=True`.
"""

from __future__ import annotations

from math import lcm
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.activations import layer_activation_bytes
from mbridge_perf.memory.estimate import MemoryReport, estimate_memory
from mbridge_perf.memory.params import count_params
from mbridge_perf.rules import validate

SETTINGS = settings(derandomize=True, max_examples=100, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

Cfg = dict[str, Any]


@st.composite
def _model(draw: st.DrawFn) -> Cfg:
    """Architecture: dense or MoE, sizes every TP up to 8 divides."""
    heads = draw(st.sampled_from([8, 16, 32]))
    h = heads * draw(st.sampled_from([32, 64, 128]))
    model: Cfg = {
        "hidden_size": h, "num_attention_heads": heads,
        "num_query_groups": draw(st.sampled_from([g for g in (1, 2, 4, 8, heads)
                                                  if heads % g == 0])),
        "ffn_hidden_size": h * draw(st.sampled_from([2, 3, 4])),
        "gated_linear_unit": draw(st.booleans()),
        "normalization": draw(st.sampled_from(["LayerNorm", "RMSNorm"])),
        "add_bias_linear": draw(st.booleans()),
        "position_embedding_type": draw(st.sampled_from(["rope", "learned_absolute"])),
        "share_embeddings_and_output_weights": draw(st.booleans()),
        "vocab_size": draw(st.sampled_from([32000, 50257, 128256])),
        "seq_length": draw(st.sampled_from([1024, 2048, 4096])),
        "attention_dropout": draw(st.sampled_from([0.0, 0.1])),
        "hidden_dropout": draw(st.sampled_from([0.0, 0.1])),
        "transformer_impl": draw(st.sampled_from(["transformer_engine", "local"])),
        "bf16": True,
    }
    if draw(st.booleans()):
        experts = draw(st.sampled_from([4, 8, 16]))
        topk = draw(st.sampled_from([1, 2]))
        # top-1 routing needs pre-softmax scores (Megatron-Core refuses it otherwise)
        model.update(num_moe_experts=experts, moe_router_topk=topk,
                     moe_router_pre_softmax=topk == 1,
                     moe_ffn_hidden_size=h // 2, moe_grouped_gemm=True,
                     add_bias_linear=False,
                     expert_model_parallel_size=draw(st.sampled_from(
                         [e for e in (1, 2, 4) if experts % e == 0])),
                     expert_tensor_parallel_size=draw(st.sampled_from([None, 1])))
        if draw(st.booleans()):
            model["moe_shared_expert_intermediate_size"] = h
    return model


@st.composite
def _pipeline(draw: st.DrawFn) -> Cfg:
    """PP, VPP and a layer split Megatron-Core accepts: even, uneven first / last stage, or
    embedding / loss accounted as layers."""
    pp = draw(st.sampled_from([1, 2, 3, 4]))
    vpp = draw(st.sampled_from([1, 2, 3])) if pp > 1 else 1
    out: Cfg = {"pipeline_model_parallel_size": pp}
    if vpp > 1:
        out["virtual_pipeline_model_parallel_size"] = vpp
    mode = draw(st.sampled_from(["even", "uneven", "account"])) if pp > 1 else "even"
    if mode == "even":
        out["num_layers"] = pp * vpp * draw(st.integers(1, 3))
    elif mode == "uneven":
        per = draw(st.integers(1, 3)) * vpp
        first = draw(st.sampled_from([None, vpp, 2 * vpp, 3 * vpp]))
        last = draw(st.sampled_from([None, vpp, 2 * vpp, 3 * vpp]))
        if pp == 2 and first is not None and last is not None:
            middle = 0
        else:
            middle = pp - (first is not None) - (last is not None)
        out.update(num_layers=(first or 0) + (last or 0) + middle * per,
                   num_layers_in_first_pipeline_stage=first,
                   num_layers_in_last_pipeline_stage=last)
    else:
        emb, loss = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
        per_chunk = draw(st.integers(2, 3))
        out.update(num_layers=pp * vpp * per_chunk - emb - loss,
                   account_for_embedding_in_pipeline_split=emb,
                   account_for_loss_in_pipeline_split=loss)
    return out


@st.composite
def _recompute(draw: st.DrawFn, model: Cfg, layers_per_rank: int) -> Cfg:
    kind = draw(st.sampled_from(["none", "selective", "full"]))
    if kind == "none":
        return {}
    if kind == "selective":
        choices = ["core_attn", "layernorm", "moe" if model.get("num_moe_experts") else "mlp"]
        modules = draw(st.lists(st.sampled_from(choices), min_size=1, max_size=3, unique=True))
        return {"recompute_granularity": "selective", "recompute_modules": modules}
    return {"recompute_granularity": "full",
            "recompute_method": draw(st.sampled_from(["uniform", "block"])),
            "recompute_num_layers": draw(st.integers(1, max(1, layers_per_rank)))}


@st.composite
def configs(draw: st.DrawFn, *, tp: int | None = None) -> Cfg:
    """A whole TrainingConfig as a dict (so variants can be derived from it)."""
    model = draw(_model())
    model.update(draw(_pipeline()))
    pp = model["pipeline_model_parallel_size"]
    if pp > 1:
        model["pipeline_dtype"] = "bf16"
    tp = tp or draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([1, 2]))
    model.update(tensor_model_parallel_size=tp, context_parallel_size=cp,
                 sequence_parallel=tp > 1)
    model.update(draw(_recompute(model, model["num_layers"] // pp)))
    mbs = draw(st.sampled_from([1, 2]))
    dp = draw(st.sampled_from([1, 2, 4]))
    etp = model.get("expert_tensor_parallel_size") or tp
    ep = model.get("expert_model_parallel_size", 1)
    # a world both meshes divide, with DP = dp on the dense side
    world = pp * lcm(tp * cp * dp, etp * ep)
    dp = world // (pp * tp * cp)
    microbatches = pp * draw(st.integers(1, 3))
    return {"model": model,
            "train": {"micro_batch_size": mbs, "global_batch_size": mbs * dp * microbatches},
            "optimizer": {"use_distributed_optimizer": draw(st.booleans())},
            "ddp": {"use_distributed_optimizer": False},
            "cluster": {"num_gpus": world, "gpu": "H100"}}


def _valid(data: Cfg) -> TrainingConfig:
    cfg = TrainingConfig.model_validate(data)
    report = validate(cfg)
    assume(report.ok)
    return cfg


def _with(data: Cfg, **model: Any) -> Cfg:
    """The same config with some model fields replaced (None removes one)."""
    merged = {**data["model"], **model}
    return {**data, "model": {k: v for k, v in merged.items() if v is not None}}


def _rescaled(data: Cfg, tp: int) -> Cfg:
    """The same config at another TP, DP kept (the world grows or shrinks with TP)."""
    m = data["model"]
    old = m["tensor_model_parallel_size"]
    out = _with(data, tensor_model_parallel_size=tp, sequence_parallel=tp > 1)
    etp = m.get("expert_tensor_parallel_size") or tp
    ep = m.get("expert_model_parallel_size", 1)
    pp, cp = m["pipeline_model_parallel_size"], m["context_parallel_size"]
    dp = data["cluster"]["num_gpus"] // (pp * old * cp)
    world = pp * lcm(tp * cp * dp, etp * ep)
    new_dp = world // (pp * tp * cp)
    mbs = data["train"]["micro_batch_size"]
    microbatches = data["train"]["global_batch_size"] // (mbs * dp)
    return {**out, "cluster": {**data["cluster"], "num_gpus": world},
            "train": {**data["train"], "global_batch_size": mbs * new_dp * microbatches}}


# --- properties ------------------------------------------------------------------------------


@SETTINGS
@given(configs(tp=1), st.sampled_from([1, 2, 4]))
def test_more_tp_never_raises_weights_per_gpu(data: Cfg, tp: int) -> None:
    low = estimate_memory(_valid(_rescaled(data, tp)))
    high = estimate_memory(_valid(_rescaled(data, 2 * tp)))
    for a, b in zip(low.per_stage, high.per_stage, strict=True):
        assert b.weights_gib <= a.weights_gib, (tp, a.stage, a.weights_gib, b.weights_gib)
        assert b.params <= a.params, (tp, a.stage, a.params, b.params)


def _activations(report: MemoryReport) -> list[float]:
    """Per stage: one micro-batch's activations, and all held at the peak."""
    return [x for s in report.per_stage
            for x in (s.activation_per_microbatch_gib, s.activations_gib)]


def _layers(cfg: TrainingConfig) -> list[int]:
    return [layer_activation_bytes(cfg, i).total for i in range(int(cfg.model.num_layers or 0))]


def _le(a: list[Any], b: list[Any]) -> bool:
    """Element by element."""
    return all(x <= y for x, y in zip(a, b, strict=True))


@SETTINGS
@given(configs(), st.data())
def test_full_le_selective_le_none(data: Cfg, draw: st.DataObject) -> None:
    base = _with(data, recompute_granularity=None, recompute_method=None,
                 recompute_num_layers=None, recompute_modules=None)
    m = data["model"]
    choices = ["core_attn", "layernorm", "moe" if m.get("num_moe_experts") else "mlp"]
    modules = draw.draw(st.lists(st.sampled_from(choices), min_size=1, max_size=3, unique=True))
    cfg_none = _valid(base)
    cfg_sel = _valid(_with(base, recompute_granularity="selective", recompute_modules=modules))
    chunks = [n for rank in (Derived(cfg_none).layers_per_chunk or [[1]]) for n in rank]
    n = draw.draw(st.integers(1, max(1, max(chunks))))
    cfg_uniform = _valid(_with(base, recompute_granularity="full", recompute_method="uniform",
                               recompute_num_layers=n))
    cfg_block = _valid(_with(base, recompute_granularity="full", recompute_method="block",
                             recompute_num_layers=n))

    none, sel = _layers(cfg_none), _layers(cfg_sel)
    uniform, block = _layers(cfg_uniform), _layers(cfg_block)
    assert _le(sel, none), (modules, sel, none)
    assert _le(uniform, sel), (n, uniform, sel)
    assert _le(block, none), (n, block, none)

    r_none, r_sel = estimate_memory(cfg_none), estimate_memory(cfg_sel)
    r_uniform, r_block = estimate_memory(cfg_uniform), estimate_memory(cfg_block)
    assert _le(_activations(r_sel), _activations(r_none))
    assert _le(_activations(r_uniform), _activations(r_sel))
    assert _le(_activations(r_block), _activations(r_none))
    if n >= max(chunks):  # block recompute then covers every layer of every chunk
        assert _le(block, sel), (n, block, sel)
        assert _le(_activations(r_block), _activations(r_sel))


@SETTINGS
@given(configs())
def test_stages_hold_every_layer_once(data: Cfg) -> None:
    cfg = _valid(data)
    report = estimate_memory(cfg)
    num_layers = int(cfg.model.num_layers or 0)
    assert len(report.per_stage) == cfg.model.pipeline_model_parallel_size
    assert sum(len(s.layers) for s in report.per_stage) == num_layers
    assert sorted(i for s in report.per_stage for i in s.layers) == list(range(num_layers))
    for s in report.per_stage:
        assert sum(s.layers_per_chunk) == len(s.layers)
    assert [len(s.layers) for s in report.per_stage] == Derived(cfg).layers_per_stage
    assert sum(s.embedding for s in report.per_stage) == 1
    assert sum(s.output_layer for s in report.per_stage) == 1


def _check_parameters(cfg: TrainingConfig, report: MemoryReport) -> None:
    """Stage parameters against params.py: per GPU, the TP-sharded parameters / TP, the
    TP-replicated ones and the routed experts / (EP x ETP), summed over the stages, plus the
    copy of a tied embedding the last stage keeps when PP > 1."""
    m = cfg.model
    tp = m.tensor_model_parallel_size
    ep_etp = m.expert_model_parallel_size * (m.expert_tensor_parallel_size or tp)
    assert report.total_params == count_params(m, pad_vocab=False).total
    counts = count_params(m, pad_vocab=True, tp=tp)
    sharded = counts.non_expert - counts.tp_replicated
    expected = sharded / tp + counts.tp_replicated + counts.routed_experts / ep_etp
    if m.share_embeddings_and_output_weights and m.pipeline_model_parallel_size > 1:
        expected += counts.vocab_size * int(m.hidden_size or 0) / tp
    got = sum(s.params for s in report.per_stage)
    assert abs(got - expected) <= len(report.per_stage), (got, expected)
    assert sum(s.expert_params for s in report.per_stage) == round(
        counts.routed_experts / ep_etp)
    if tp == ep_etp == 1:  # nothing sharded: the stages hold the model (once)
        tied_copy = counts.vocab_size * int(m.hidden_size or 0) if (
            m.share_embeddings_and_output_weights and m.pipeline_model_parallel_size > 1) else 0
        assert got == counts.total + tied_copy


@SETTINGS
@given(configs())
def test_stage_parameters_sum_to_the_model(data: Cfg) -> None:
    cfg = _valid(data)
    _check_parameters(cfg, estimate_memory(cfg))


@SETTINGS
@given(configs(tp=1))
def test_unsharded_stage_parameters_are_the_model_total(data: Cfg) -> None:
    data = _rescaled(_with(data, expert_model_parallel_size=None,
                           expert_tensor_parallel_size=None), 1)
    cfg = _valid(data)
    _check_parameters(cfg, estimate_memory(cfg))


@SETTINGS
@given(configs(), configs(), st.data())
def test_estimates_are_deterministic(data: Cfg, other: Cfg, draw: st.DataObject) -> None:
    cfg = _valid(data)
    first = estimate_memory(cfg)
    first_layers = _layers(cfg)
    # Neighbours that share every architecture field but one that changes the parameters (tied
    # output layer, learned-position table length, vocabulary): what cfg cached must not leak
    # into them, and what they cache must not leak back.
    m = data["model"]
    neighbours = [
        _with(data, share_embeddings_and_output_weights=not m[
            "share_embeddings_and_output_weights"]),
        _with(data, position_embedding_type="learned_absolute",
              seq_length=draw.draw(st.sampled_from([512, 8192]))),
        _with(data, vocab_size=m["vocab_size"] + draw.draw(st.sampled_from([1, 1000]))),
        other,
    ]
    for variant in neighbours:
        vcfg = TrainingConfig.model_validate(variant)
        if validate(vcfg).ok:
            _check_parameters(vcfg, estimate_memory(vcfg))
            _layers(vcfg)
    again = TrainingConfig.model_validate(data)
    assert estimate_memory(again).model_dump() == first.model_dump()
    assert estimate_memory(cfg).model_dump_json() == first.model_dump_json()
    assert _layers(again) == first_layers
