"""Ground truth for the per-layer activation estimate: bytes real Megatron-Core layers save.

Builds a Megatron-Core `GPTModel` from the local (no Transformer Engine) layer specs in a one-rank
gloo group on the CPU, runs one forward over one microbatch inside a
`torch.autograd.graph.saved_tensors_hooks` context and counts what the autograd graph keeps for
backward, per decoder layer (method: ../shared/reference/cpu-ground-truth.md §4.1):

- every packed tensor is held by a weak reference and labelled with the module running when it
  was packed; at the end of the forward the live ones are deduplicated by storage and the
  storage's size is read then (so views of one buffer count once, graphs built and dropped
  inside a checkpoint count nothing, and storages freed with `resize_(0)` count nothing);
- parameters (and their views) are not activations and are skipped;
- a storage saved by several layers (RoPE frequencies handed to every checkpoint) is "shared",
  the per-call causal mask of the unfused softmax is kept apart as "causal_mask";
- the checkpoint inputs of full recompute are saved by the decoder block, after the layers of
  the checkpointed group ran: they are given to the group's first layer (the layer that takes
  them as input).

The CPU shims (§3.3) make the forward run and make the CPU save what a GPU saves: dropout keeps
a one-byte mask, LayerNorm keeps fp32 mean/rstd and RMSNorm keeps its input and an fp32 rstd (as
the fused CUDA kernels do; the CPU kernels keep bf16 statistics and fp32 copies). The
torch.compile'd fusions run eagerly; their autograd Functions, hence the saved sets, are the
real ones. Everything else is unmodified Megatron-Core code.

Run as a script for the measurement table: `python tests/memory/mcore_activations.py`.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import sys
import tempfile
import types
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.memory.params import vocab_rows

# What every case starts from: a GPT-2-style layer (LayerNorm, GELU, biases, learned positions,
# dropout 0.1) at shapes where the s² attention term and the sbh terms are of the same order.
BASE_MODEL: dict[str, Any] = {
    "num_layers": 2, "hidden_size": 64, "ffn_hidden_size": 256, "num_attention_heads": 4,
    "seq_length": 64, "vocab_size": 128, "make_vocab_size_divisible_by": 128,
    "position_embedding_type": "learned_absolute", "normalization": "LayerNorm",
    "add_bias_linear": True, "gated_linear_unit": False,
    "attention_dropout": 0.1, "hidden_dropout": 0.1,
    "transformer_impl": "local", "attention_backend": "local", "bf16": True,
    # TransformerConfig switches the tools carry through (not modelled fields): spelled out so
    # the estimator sees exactly what was built.
    "attention_softmax_in_fp32": False, "masked_softmax_fusion": False,
    "bias_activation_fusion": False, "bias_dropout_fusion": False, "apply_rope_fusion": False,
}
_NO_BIAS = {"add_bias_linear": False}  # `mlp` recompute with biases recurses (§3.6)
_SWIGLU = {"gated_linear_unit": True, "activation_func": "silu", "ffn_hidden_size": 160}

# name -> (model overrides, train overrides); an override None removes the base's field
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "paper-none": ({}, {}),
    "paper-mbs2": ({}, {"micro_batch_size": 2}),
    "dropout0-none": ({"attention_dropout": 0.0, "hidden_dropout": 0.0}, {}),
    "softmax-fp32-none": ({"attention_softmax_in_fp32": True}, {}),
    "sel-core_attn": ({"recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
                      {}),
    "sel-layernorm": ({**_NO_BIAS, "recompute_granularity": "selective",
                       "recompute_modules": ["layernorm"]}, {}),
    "sel-mlp": ({**_NO_BIAS, "recompute_granularity": "selective", "recompute_modules": ["mlp"]},
                {}),
    "sel-layernorm-mlp": ({**_NO_BIAS, "recompute_granularity": "selective",
                           "recompute_modules": ["layernorm", "mlp"]}, {}),
    "full-uniform-1": ({"recompute_granularity": "full", "recompute_method": "uniform",
                        "recompute_num_layers": 1}, {}),
    "full-block-1": ({"recompute_granularity": "full", "recompute_method": "block",
                      "recompute_num_layers": 1}, {}),
    "full-uniform-2": ({"num_layers": 4, "recompute_granularity": "full",
                        "recompute_method": "uniform", "recompute_num_layers": 2}, {}),
    "gqa-none": ({"num_attention_heads": 8, "num_query_groups": 2}, {}),
    "gqa-core_attn": ({"num_attention_heads": 8, "num_query_groups": 2, **_NO_BIAS,
                       "recompute_granularity": "selective", "recompute_modules": ["core_attn"]},
                      {}),
    "swiglu-unfused": ({**_SWIGLU, **_NO_BIAS}, {}),
    "swiglu-fused": ({**_SWIGLU, **_NO_BIAS, "bias_activation_fusion": True}, {}),
    "rope-none": ({"position_embedding_type": "rope"}, {}),
    "rope-core_attn": ({"position_embedding_type": "rope", "recompute_granularity": "selective",
                        "recompute_modules": ["core_attn"]}, {}),
    "llama-like": ({**_SWIGLU, **_NO_BIAS, "normalization": "RMSNorm",
                    "position_embedding_type": "rope", "num_attention_heads": 8,
                    "num_query_groups": 2, "attention_dropout": 0.0, "hidden_dropout": 0.0,
                    "bias_activation_fusion": True, "recompute_granularity": "selective",
                    "recompute_modules": ["core_attn"]}, {}),
    "fp32-none": ({"bf16": False}, {}),
    # the fused kernel ignores attention_softmax_in_fp32 and keeps bf16 probabilities; it only
    # runs when b·a divides by its batches per block (8 at s=64), hence 8 heads
    "fused-softmax": ({"num_attention_heads": 8, "attention_softmax_in_fp32": True,
                       "masked_softmax_fusion": True}, {}),
    # no switch given: Megatron-Core's TransformerConfig defaults (fp32 softmax, no fusions)
    # on both sides
    "mcore-defaults": ({**_SWIGLU, **_NO_BIAS, "position_embedding_type": "rope",
                        "attention_softmax_in_fp32": None, "masked_softmax_fusion": None,
                        "bias_activation_fusion": None, "bias_dropout_fusion": None,
                        "apply_rope_fusion": None}, {}),
}

# ModelSection fields handed to TransformerConfig unchanged.
_TC_FIELDS = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "normalization", "add_bias_linear", "add_qkv_bias", "gated_linear_unit",
    "qk_layernorm", "attention_dropout", "hidden_dropout", "recompute_granularity",
    "recompute_method", "recompute_num_layers", "recompute_modules", "bf16",
    "attention_softmax_in_fp32", "masked_softmax_fusion", "bias_activation_fusion",
    "bias_dropout_fusion", "apply_rope_fusion",
)


def training_config(name: str) -> TrainingConfig:
    """The TrainingConfig of a case: the one input both the build and the estimator read."""
    model, train = CASES[name]
    fields = {k: v for k, v in {**BASE_MODEL, **model}.items() if v is not None}
    return TrainingConfig.model_validate({"model": fields,
                                          "train": {"micro_batch_size": 1, **train}})


@dataclass
class Measurement:
    """Bytes saved for backward by one forward of one microbatch."""

    layers: list[int]
    """Per decoder layer, index 0 first."""
    outside: dict[str, int] = field(default_factory=dict)
    """Everything else by label: embedding, final_layernorm, output_layer, causal_mask, shared,
    other."""
    storages: list[tuple[str, str, int]] = field(default_factory=list)
    """Each counted storage: (where, dtype and shape of a tensor viewing it, bytes)."""


# --- CPU shims ------------------------------------------------------------------------------


class _FusedStyleNorm(torch.autograd.Function):
    """Saves what the fused CUDA norm kernels save: the input and fp32 statistics (LayerNorm:
    mean and rstd; RMSNorm: rstd); the backward recomputes through the original forward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: torch.nn.Module,
                forward: Callable[..., torch.Tensor], rms: bool,
                *params: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(module.normalized_shape), 0))
        xf = x.float()
        eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
        if rms:
            stats: tuple[torch.Tensor, ...] = (
                torch.rsqrt(xf.pow(2).mean(dims, keepdim=True) + eps),)
        else:
            mean = xf.mean(dims, keepdim=True)
            stats = (mean, torch.rsqrt(xf.var(dims, keepdim=True, unbiased=False) + eps))
        ctx.module, ctx.forward = module, forward
        ctx.save_for_backward(x, *stats, *params)
        ctx.n_stats = len(stats)
        return forward(module, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, *rest = ctx.saved_tensors
        params = rest[ctx.n_stats:]
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            out = ctx.forward(ctx.module, xd)
            inputs = [xd, *(p for p in params if p.requires_grad)]
            grads = iter(torch.autograd.grad(out, inputs, grad, allow_unused=True))
        gx = next(grads)
        gp = [next(grads) if p.requires_grad else None for p in params]
        return (gx, None, None, None, *gp)


def _norm_forward(original: Callable[..., torch.Tensor], rms: bool,
                  ) -> Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]:
    def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not torch.is_grad_enabled() or not (x.requires_grad or any(
                p.requires_grad for p in self.parameters())):
            return original(self, x)
        params = [p for p in (getattr(self, "weight", None), getattr(self, "bias", None))
                  if p is not None]
        return _FusedStyleNorm.apply(x, self, original, rms, *params)
    return forward


def _native_dropout(original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """CUDA dropout keeps a one-byte mask; CPU `F.dropout` keeps `input * noise`."""
    def dropout(x: torch.Tensor, p: float = 0.5, training: bool = True,
                inplace: bool = False) -> torch.Tensor:
        if training and 0.0 < p < 1.0:
            out = torch.native_dropout(x, p, True)[0]
            return x.copy_(out) if inplace else out
        return original(x, p, training, inplace)
    return dropout


class _NoFP8:
    """Inert stand-in for Transformer Engine's FP8 state (FP8 is off)."""

    @staticmethod
    def is_fp8_enabled() -> bool:
        return False

    @staticmethod
    def get_fp8_recipe() -> None:
        return None


def _softmax_kernels() -> dict[str, types.ModuleType]:
    """Stand-ins for the CUDA extensions behind Megatron-Core's fused causal softmax: the
    values in plain torch, the saved set from Megatron's own autograd Function."""
    upper = types.ModuleType("scaled_upper_triang_masked_softmax_cuda")

    def forward(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        sq, sk = x.shape[-2:]
        causal = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)
        return torch.softmax((x.float() * scale).masked_fill(causal, float("-inf")),
                             dim=-1).to(x.dtype)

    def backward(grad: torch.Tensor, probs: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        g, p = grad.float(), probs.float()
        return (scale * p * (g - (g * p).sum(-1, keepdim=True))).to(grad.dtype)

    upper.forward, upper.backward = forward, backward  # type: ignore[attr-defined]
    masked = types.ModuleType("scaled_masked_softmax_cuda")

    def batch_per_block(sq: int, sk: int, b: int, heads: int) -> int:
        # the kernel's launch geometry: 128 threads per block, one warp (<= 32 lanes) per row
        # of up to next_pow2(sk) elements, two rows per warp up to 128 elements
        pow2 = 1 << max(0, math.ceil(math.log2(sk)))
        warp = min(pow2, 32)
        return (128 // warp) * (2 if pow2 <= 128 else 1)

    masked.get_batch_per_block = batch_per_block  # type: ignore[attr-defined]
    return {upper.__name__: upper, masked.__name__: masked}


@contextlib.contextmanager
def one_rank_gloo(mp: pytest.MonkeyPatch, seed: int = 1234) -> Iterator[None]:
    """The CUDA shims every CPU run needs and a one-rank gloo group with Megatron-Core's
    parallel state, torn down on exit. Callers add their own shims to `mp` first."""
    import torch.distributed as dist

    mp.setattr(torch.cuda, "current_device", lambda: torch.device("cpu"))
    mp.setattr(torch.cuda, "set_device", lambda *a, **k: None)
    mp.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    mp.setattr(torch.cuda, "device_count", lambda: 1)
    mp.setattr(torch.cuda, "manual_seed", lambda s: torch.default_generator.manual_seed(int(s)))
    mp.setattr(torch.cuda, "manual_seed_all", lambda s: None)
    mp.setattr(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state())
    mp.setattr(torch.cuda, "set_rng_state", lambda s, *a, **k: torch.set_rng_state(s))

    import megatron.core.tensor_parallel.random as tp_random
    from megatron.core import parallel_state

    mp.setattr(tp_random, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state())
    mp.setattr(tp_random, "_set_cuda_rng_state", lambda s, *a, **k: torch.set_rng_state(s))
    handle, path = tempfile.mkstemp()
    os.close(handle)
    os.unlink(path)
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1)
        tp_random.model_parallel_cuda_manual_seed(seed)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        with contextlib.suppress(OSError):
            os.unlink(path)


@contextlib.contextmanager
def megatron_on_cpu(seed: int = 1234) -> Iterator[list[torch.Tensor]]:
    """The CPU shims and a one-rank gloo group with Megatron-Core's parallel state, undone on
    exit. Yields the list collecting the causal masks the unfused softmax builds (a fresh one
    per call in megatron-core 0.16; held so their storages stay recognisable)."""
    import logging

    import torch.nn.functional as F

    masks: list[torch.Tensor] = []
    with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mp.setattr(F, "dropout", _native_dropout(F.dropout))
        for name, module in _softmax_kernels().items():
            mp.setitem(sys.modules, name, module)
        mp.setattr(torch.nn.LayerNorm, "forward",
                   _norm_forward(torch.nn.LayerNorm.forward, rms=False))
        mp.setattr(torch.nn.RMSNorm, "forward", _norm_forward(torch.nn.RMSNorm.forward, rms=True))
        # the torch.compile'd bias/activation fusions: run eagerly (same autograd Functions)
        import torch._dynamo as dynamo

        mp.setattr(dynamo.config, "disable", True)

        import megatron.core.fusions.fused_softmax as fused_softmax
        import megatron.core.tensor_parallel.random as tp_random
        import megatron.core.transformer.utils as tutils

        def causal_mask(sq: int) -> torch.Tensor:  # 0.16.1 builds a fresh one on every call
            mask = torch.triu(torch.ones(sq, sq), diagonal=1).bool()
            masks.append(mask)
            return mask

        mp.setattr(tutils, "get_default_causal_mask", causal_mask)
        mp.setattr(fused_softmax, "get_default_causal_mask", causal_mask)
        # CPU and "CUDA" generators are one here, so every fork reports a changed CPU state
        mp.setattr(logging.getLogger(tp_random.__name__), "disabled", True)
        if not getattr(tp_random, "HAVE_TE", False):  # CheckpointWithoutOutput asks TE
            mp.setattr(tp_random, "FP8GlobalStateManager", _NoFP8, raising=False)
            mp.setattr(tp_random, "activation_recompute_forward",
                       lambda *a, **k: contextlib.nullcontext(), raising=False)
            mp.setattr(tp_random, "fp8_autocast", lambda *a, **k: contextlib.nullcontext(),
                       raising=False)

        with one_rank_gloo(mp, seed):
            yield masks


# --- build and measure -----------------------------------------------------------------------


def build_model(cfg: TrainingConfig) -> torch.nn.Module:
    """The GPTModel the config describes, built from the local layer specs (call inside
    `megatron_on_cpu`)."""
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    m = cfg.model
    given = m.model_dump(exclude_unset=True)
    kwargs = {k: given[k] for k in _TC_FIELDS if k in given}
    kwargs["activation_func"] = F.silu if given.get("activation_func") == "silu" else F.gelu
    dtype = torch.bfloat16 if m.bf16 else torch.float32
    config = TransformerConfig(
        **kwargs, use_cpu_initialization=True, params_dtype=dtype, pipeline_dtype=dtype,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        transformer_impl="local")
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                      normalization=config.normalization)
    model = GPTModel(config, spec, vocab_size=vocab_rows(m, tp=1),
                     max_sequence_length=int(m.seq_length or 0),
                     position_embedding_type=m.position_embedding_type,
                     share_embeddings_and_output_weights=m.share_embeddings_and_output_weights)
    return Float16Module(config, model) if m.bf16 else model


def measure(cfg: TrainingConfig, masks: list[torch.Tensor] | None = None) -> Measurement:
    """Bytes one forward of one microbatch leaves saved for backward, per decoder layer (call
    inside `megatron_on_cpu`, passing the set it yields)."""
    from megatron.core.transformer.transformer_block import TransformerBlock
    from megatron.core.transformer.transformer_layer import TransformerLayer

    masks = masks if masks is not None else []
    masks.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build_model(cfg)
    model.train()
    names = {id(mod): name.removeprefix("module.") for name, mod in model.named_modules()}
    params = {p.untyped_storage()._cdata for p in model.parameters()}

    stack: list[torch.nn.Module] = []
    # full recompute: the layer that opened the current checkpoint group (the first layer to
    # start after the previous group's inputs were saved)
    group = {"first": -1, "open": True}

    def pre(mod: torch.nn.Module, args: Any) -> None:
        stack.append(mod)
        if isinstance(mod, TransformerLayer) and group["open"]:
            group["first"], group["open"] = mod.layer_number - 1, False

    def post(mod: torch.nn.Module, args: Any, out: Any) -> None:
        if stack and stack[-1] is mod:
            stack.pop()

    def label() -> str:
        for mod in reversed(stack):
            if isinstance(mod, TransformerLayer):
                return f"layer{mod.layer_number - 1}"
            if isinstance(mod, TransformerBlock):  # a checkpoint group's inputs
                group["open"] = True
                return f"layer{group['first']}" if group["first"] >= 0 else "decoder"
            top = names.get(id(mod), "").split(".")[0]
            if top in ("embedding", "output_layer"):
                return top
            if names.get(id(mod), "").endswith("final_layernorm"):
                return "final_layernorm"
        return "other"

    packed: list[tuple[weakref.ref[torch.Tensor], str]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage()._cdata not in params:
            packed.append((weakref.ref(t), label()))
        return t

    m, b = cfg.model, cfg.train.micro_batch_size
    s, v = int(m.seq_length or 0), int(m.vocab_size or 0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, v, (b, s), generator=gen)
    labels = torch.randint(0, v, (b, s), generator=gen)
    positions = torch.arange(s).unsqueeze(0).expand(b, s)

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(pre),
             torch.nn.modules.module.register_module_forward_hook(post)]
    try:
        with warnings.catch_warnings(), torch.autograd.graph.saved_tensors_hooks(
                pack, lambda t: t):
            warnings.simplefilter("ignore")
            loss = model(tokens, positions, None, labels=labels)
    finally:
        for hook in hooks:
            hook.remove()
    gc.collect()
    mask_keys = {t.untyped_storage()._cdata for t in masks}

    seen: dict[int, tuple[int, set[str], str]] = {}
    for ref, where in packed:
        t = ref()
        if t is None:
            continue
        key = t.untyped_storage()._cdata
        nbytes, wheres, what = seen.get(
            key, (t.untyped_storage().nbytes(), set(), f"{t.dtype} {tuple(t.shape)}"))
        seen[key] = (nbytes, wheres | {where}, what)
    result = Measurement(layers=[0] * int(m.num_layers or 0))
    for key, (nbytes, wheres, what) in seen.items():
        if key in mask_keys:
            where = "causal_mask"
        elif len(wheres) > 1:
            where = "shared"
        else:
            (where,) = wheres
        result.storages.append((where, what, nbytes))
        if where.startswith("layer"):
            result.layers[int(where.removeprefix("layer"))] += nbytes
        else:
            result.outside[where] = result.outside.get(where, 0) + nbytes
    del loss
    masks.clear()
    return result


def korthikanti(cfg: TrainingConfig, layer_index: int = 0) -> float:
    """The paper's per-layer bytes, sbh(34 + 5as/h) (16-bit, TP 1, no recompute), with its
    selective `core_attn` (34sbh) and full (2sbh per recompute group) variants: the classic
    reference, not the estimate."""
    m = cfg.model
    s, b, h = int(m.seq_length or 0), cfg.train.micro_batch_size, int(m.hidden_size or 0)
    a = int(m.num_attention_heads or 0)
    n = int(m.recompute_num_layers or 1)
    if m.recompute_granularity == "full":
        if m.recompute_method == "uniform":
            return 2.0 * s * b * h if layer_index % n == 0 else 0.0
        if layer_index < n:
            return 2.0 * s * b * h
    if m.recompute_granularity == "selective" and "core_attn" in (m.recompute_modules or []):
        return 34.0 * s * b * h
    return s * b * h * (34 + 5 * a * s / h)


def measure_all(names: list[str] | None = None) -> dict[str, Measurement]:
    """Every case (or the named ones) measured in one process group."""
    with megatron_on_cpu() as masks:
        return {name: measure(training_config(name), masks) for name in (names or CASES)}


def main() -> None:
    import time

    estimator: Callable[..., Any] | None
    try:
        from mbridge_perf.memory.activations import layer_activation_bytes as estimator
    except ImportError:
        estimator = None
    start = time.perf_counter()
    results = measure_all()
    took = time.perf_counter() - start
    print(f"{'case':<20}{'layer':>6}{'measured B':>12}{'Korthikanti B':>15}{'ratio':>8}"
          f"{'estimate B':>12}{'error %':>9}   outside")
    for name, res in results.items():
        cfg = training_config(name)
        for i, got in enumerate(res.layers):
            ref = korthikanti(cfg, i)
            est = estimator(cfg, layer_index=i).total if estimator else None
            err = "" if est is None or not got else f"{100 * (est - got) / got:+.2f}"
            ratio = f"{got / ref:.4f}" if ref else ""
            print(f"{name:<20}{i:>6}{got:>12,}{ref:>15,.0f}{ratio:>8}"
                  f"{'' if est is None else f'{est:,}':>12}{err:>9}   "
                  f"{res.outside if i == 0 else ''}")
    print(f"{len(results)} cases measured in {took:.1f} s")


if __name__ == "__main__":
    main()
