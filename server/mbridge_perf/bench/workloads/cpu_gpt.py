"""A real Megatron-Core GPT training run on CPU that prints Megatron-format logs: the benchmark
workload for tests and CI, where there is no GPU but the whole submit → log → result path must be
exercised on genuine output.

Run under torchrun (two processes over gloo: TP2 with sequence parallelism, or DP2)::

    torchrun --standalone --nproc_per_node 2 -m mbridge_perf.bench.workloads.cpu_gpt \
        --steps 50 --tp 2

What runs is unmodified Megatron-Core 0.16 code — `GPTModel` from the local (no Transformer
Engine) layer specs, `Float16Module`, Megatron `DistributedDataParallel`, `get_megatron_optimizer`
(Adam, bf16, constant loss scale 1.0 so a non-finite gradient skips the step the way Megatron
does with a grad scaler), `OptimizerParamScheduler`, `finalize_model_grads` — after the CPU shims
of cpu-ground-truth.md §3.3 (CUDA device/RNG/sync calls routed to the CPU, the causal-mask
helper, the torch LayerNorm sequence-parallel assert, `device="cuda"` literals in DDP and the
optimizer). Data are synthetic tokens from a noisy affine sequence, so the loss falls.

Log lines (log-formats.md §2–§5, one iteration per log interval):

- iteration line from the last rank; `throughput per GPU (TFLOP/s/GPU)` uses Megatron's dense
  GPT FLOP count and is tiny on a CPU (it prints as 0.0 at the format's one decimal);
- `Step Time : …s GPU utilization: …MODEL_TFLOP/s/GPU` from rank 0;
- `[Rank r] (after N iterations) memory (GB) | …` after iterations 1 and 2 from every
  data-parallel-rank-0 rank. **These are synthetic CPU figures** (a CPU has no caching
  allocator; rank 0 prints a line saying so first): allocated/active = bytes of the live torch
  tensors in the process, max-allocated = the largest such value seen at a report, reserved =
  the process RSS, max-reserved = its peak RSS, inactive and alloc-retires = 0. `--memory-lines
  omit` leaves them out;
- the theoretical-memory line (§5, weight and optimizer only) and `[after training is done]`
  from rank 0.

Fault injection for tests: `--inject-nan-at N` makes iteration N's loss NaN (the optimizer
skips the step: skipped 1, nan 1, no loss on that line); `--exit-code C` exits every rank with
C after `--exit-after K` iterations (default: all); `--sleep-per-step S` slows each step.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import logging
import math
import os
import resource
import sys
import time
import warnings
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

_CUDA_TYPES = {"torch.bfloat16": "BFloat16Tensor", "torch.float32": "FloatTensor",
               "torch.float16": "HalfTensor"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cpu_gpt", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="training iterations (train_iters)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (DP = world / TP)")
    p.add_argument("--no-sp", dest="sp", action="store_false",
                   help="no sequence parallelism (on by default when TP > 1)")
    p.add_argument("--seq", type=int, default=64, help="sequence length")
    p.add_argument("--hidden", type=int, default=64, help="hidden size")
    p.add_argument("--layers", type=int, default=2, help="transformer layers")
    p.add_argument("--heads", type=int, default=4, help="attention heads")
    p.add_argument("--vocab", type=int, default=256, help="vocabulary size")
    p.add_argument("--mbs", type=int, default=2, help="micro batch size")
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--log-interval", type=int, default=1)
    p.add_argument("--memory-lines", choices=("synthetic", "omit"), default="synthetic")
    p.add_argument("--inject-nan-at", type=int, default=None, metavar="N",
                   help="make iteration N's loss NaN (fault test)")
    p.add_argument("--exit-code", type=int, default=None, metavar="C",
                   help="exit every rank with code C after --exit-after iterations")
    p.add_argument("--exit-after", type=int, default=None, metavar="K",
                   help="iterations before --exit-code applies (default: all)")
    p.add_argument("--sleep-per-step", type=float, default=0.0, metavar="S",
                   help="sleep S seconds inside every step (timeout / cancel tests)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.tp < 1 or args.mbs < 1:
        p.error("--steps, --tp and --mbs must be >= 1")
    return args


# ---------------------------------------------------------------- CPU shims (§3.3)

def install_cpu_shims() -> None:
    """Route Megatron-Core's CUDA-only calls to the CPU for the rest of this process."""
    warnings.filterwarnings("ignore")
    _shim_torch_cuda()
    _shim_dropout()
    import torch._dynamo as dynamo

    dynamo.config.disable = True  # the torch.compile'd fusions run eagerly
    _shim_megatron()
    _cpu_for_cuda_mode().__enter__()


def _shim_torch_cuda() -> None:
    """torch.cuda device, sync and RNG calls act on the CPU: one generator stands for both, so
    Megatron's CUDA seeding and RNG tracker work unchanged."""
    import torch

    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    torch.cuda.set_device = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
    torch.cuda.manual_seed = lambda s: torch.default_generator.manual_seed(int(s))  # type: ignore
    torch.cuda.manual_seed_all = lambda s: None  # type: ignore[assignment]  # seeding trap
    torch.cuda.get_rng_state = lambda *a, **k: torch.get_rng_state()  # type: ignore
    torch.cuda.set_rng_state = lambda s, *a, **k: torch.set_rng_state(s)  # type: ignore


def _shim_dropout() -> None:
    """F.dropout through native_dropout in training, as CUDA computes it (§3.3 #4)."""
    import torch
    import torch.nn.functional as F

    original_dropout = F.dropout

    def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and 0.0 < p < 1.0:  # the 1-byte mask CUDA keeps (§3.3 #4)
            out = torch.native_dropout(x, p, True)[0]
            return x.copy_(out) if inplace else out
        return original_dropout(x, p, training, inplace)

    F.dropout = dropout  # type: ignore[assignment]


def _shim_megatron() -> None:
    """Megatron-Core's CUDA-only helpers: the causal mask, the CUDA RNG state of the tensor-
    parallel RNG tracker, TE's GEMM and FP8 hooks, and the torch LayerNorm SP assert."""
    import megatron.core.fusions.fused_softmax as fused_softmax
    import megatron.core.tensor_parallel.random as tp_random
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.utils as tutils
    import torch
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    masks: dict[int, Any] = {}

    def causal_mask(sq: int) -> Any:
        if sq not in masks:
            masks[sq] = torch.triu(torch.ones(sq, sq), diagonal=1).bool()
        return masks[sq]

    tutils.get_default_causal_mask = causal_mask
    fused_softmax.get_default_causal_mask = causal_mask
    # one generator serves as "CPU" and "CUDA" here, so every fork reports a changed CPU state
    logging.getLogger(tp_random.__name__).disabled = True
    tp_random._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    tp_random._set_cuda_rng_state = lambda s, *a, **k: torch.set_rng_state(s)
    moe_utils.te_general_gemm = None
    if not getattr(tp_random, "HAVE_TE", False):
        _shim_no_fp8(tp_random)
    _shim_torch_norm(WrappedTorchNorm)


def _shim_no_fp8(tp_random: Any) -> None:
    """Without Transformer Engine the RNG tracker's FP8 hooks are undefined: FP8 is off."""

    class _NoFP8:
        is_fp8_enabled = staticmethod(lambda: False)
        get_fp8_recipe = staticmethod(lambda: None)

    tp_random.FP8GlobalStateManager = _NoFP8
    tp_random.activation_recompute_forward = lambda *a, **k: contextlib.nullcontext()
    tp_random.fp8_autocast = lambda *a, **k: contextlib.nullcontext()


def _shim_torch_norm(wrapped_torch_norm: Any) -> None:
    """torch LayerNorm asserts no SP: build it without, then mark its parameters so
    finalize_model_grads all-reduces their grads over TP as it does for TE/apex norms."""
    original_new = wrapped_torch_norm.__new__

    def norm_new(cls: type, config: Any, *args: Any, **kwargs: Any) -> Any:
        sp = config.sequence_parallel
        config.sequence_parallel = False
        try:
            norm = original_new(cls, config, *args, **kwargs)
        finally:
            config.sequence_parallel = sp
        for param in norm.parameters():
            param.sequence_parallel = sp
        return norm

    wrapped_torch_norm.__new__ = norm_new


def _cpu_for_cuda_mode() -> Any:
    """A torch function mode (not entered) that runs CUDA-bound calls on the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    def on_cpu(device: Any) -> Any:
        text = str(device)
        return "cpu" if text == "cuda" or text.startswith("cuda:") else device

    class CpuForCuda(TorchFunctionMode):
        """`device="cuda"` literals in DDP / optimizer / grad scaler → CPU; `.cuda()` no-op;
        `Tensor.type()` reports a CUDA type so the optimizer accepts CPU parameters."""

        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs and kwargs["device"] is not None:
                kwargs["device"] = on_cpu(kwargs["device"])
            if func is torch.Tensor.cuda:
                return args[0]
            if func is torch.Tensor.to and len(args) > 1 and isinstance(
                    args[1], str | torch.device):
                args = (args[0], on_cpu(args[1]), *args[2:])
            if func is torch.Tensor.type and len(args) == 1 and not kwargs:
                name = _CUDA_TYPES.get(str(args[0].dtype))
                if name:
                    return f"torch.cuda.{name}"
            return func(*args, **kwargs)

    return CpuForCuda()


# ---------------------------------------------------------------- log lines

def emit(line: str) -> None:
    """One whole line in one write(2): ranks share stdout, and with PYTHONUNBUFFERED print()
    writes the text and its newline separately, so lines of two ranks would interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def gb(nbytes: float) -> str:
    """Bytes → decimal GB at 5 significant digits, never in exponent notation (log §4)."""
    value = float(f"{nbytes / 1e9:.5g}")
    text = f"{value:.12f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def gpt_flops(args: argparse.Namespace, global_batch: int, vocab: int) -> float:
    """Megatron's dense GPT training FLOPs per iteration (no causal halving):
    12·B·s·L·h²·(1 + g/a + s/h + F/h + V/(2·L·h)), MHA (g = a), F = 4h."""
    h, s, layers = args.hidden, args.seq, args.layers
    ffn = 4 * h
    return 12.0 * global_batch * s * layers * h * h * (
        1 + 1 + s / h + ffn / h + vocab / (2 * layers * h))


def live_tensor_stats() -> tuple[int, int]:
    """(bytes, count) of the live torch tensors in this process, deduplicated by storage."""
    import torch

    seen: dict[int, int] = {}
    count = 0
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu":
                storage = obj.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
                count += 1
        except Exception:
            continue
    return sum(seen.values()), count


def rss_bytes() -> tuple[int, int]:
    """(current, peak) resident set size of this process."""
    current = 0
    with contextlib.suppress(OSError), open("/proc/self/statm") as f:
        current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return current, peak


def memory_line(rank: int, iteration: int, max_alloc: list[int]) -> str:
    alloc, count = live_tensor_stats()
    max_alloc[0] = max(max_alloc[0], alloc)
    reserved, peak = rss_bytes()
    fields = [
        ("mem-allocated-gigabytes", gb(alloc)), ("mem-active-gigabytes", gb(alloc)),
        ("mem-inactive-gigabytes", gb(0)), ("mem-reserved-gigabytes", gb(reserved)),
        ("mem-max-allocated-gigabytes", gb(max_alloc[0])),
        ("mem-max-active-gigabytes", gb(max_alloc[0])),
        ("mem-max-inactive-gigabytes", gb(0)), ("mem-max-reserved-gigabytes", gb(peak)),
        ("mem-alloc-retires", "0"), ("mem-allocated-count", str(count)),
    ]
    return (f"[Rank {rank}] (after {iteration} iterations) memory (GB) | "
            + " | ".join(f"{k}: {v}" for k, v in fields))


def iteration_line(*, iteration: int, total: int, consumed: int, elapsed_ms: float,
                   tflops: float, lr: float, gbs: int, loss: float | None,
                   loss_scale: float, grad_norm: float | None, skipped: int, nan: int) -> str:
    """Bridge/Megatron `training_log` (log-formats.md §2); a loss that is not > 0 (NaN, a
    skipped-only interval) is left out, as Megatron does."""
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    parts = [f" [{now}] iteration {iteration:8d}/{total:8d} |",
             f" consumed samples: {consumed:12d} |",
             f" elapsed time per iteration (ms): {elapsed_ms:.1f} |",
             f" throughput per GPU (TFLOP/s/GPU): {tflops:.1f} |",
             f" learning rate: {lr:.6E} |",
             f" global batch size: {gbs:5d} |"]
    if loss is not None and loss > 0.0:
        parts.append(f" lm loss: {loss:.6E} |")
    parts.append(f" loss scale: {loss_scale:.1f} |")
    if grad_norm is not None:
        parts.append(f" grad norm: {grad_norm:.3f} |")
    parts.append(f" number of skipped iterations: {skipped:3d} |")
    parts.append(f" number of nan iterations: {nan:3d} |")
    return "".join(parts)


# ---------------------------------------------------------------- training

def synthetic_batch(args: argparse.Namespace, step: int, dp_rank: int) -> tuple[Any, Any]:
    """Tokens of a noisy affine sequence (t[i+1] = 5·t[i] + 3 mod V, 10 % noise): the same on
    every TP rank, different per DP rank and step."""
    import torch

    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 101 + dp_rank)
    b, s, v = args.mbs, args.seq, args.vocab
    seq = torch.empty(b, s + 1, dtype=torch.long)
    seq[:, 0] = torch.randint(0, v, (b,), generator=g)
    for i in range(s):
        seq[:, i + 1] = (5 * seq[:, i] + 3) % v
    noise = torch.rand(b, s + 1, generator=g) < 0.1
    seq[noise] = torch.randint(0, v, (int(noise.sum()),), generator=g)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


# Imported after the CPU shims and before the process group exists (import-time code sees the
# shims); `main`'s phases import from these again.
_MEGATRON_MODULES = (
    "torch.distributed", "megatron.core.parallel_state", "megatron.core.tensor_parallel",
    "megatron.core.distributed", "megatron.core.models.gpt",
    "megatron.core.models.gpt.gpt_layer_specs", "megatron.core.optimizer",
    "megatron.core.optimizer_param_scheduler", "megatron.core.transformer.module",
    "megatron.core.transformer.transformer_config",
)


@dataclass
class _Run:
    """One rank's training run: its place in the layout, what it trains, and the figures its
    log lines print."""

    args: argparse.Namespace
    rank: int
    world: int
    sp: bool
    dp: int
    dp_rank: int
    model: Any
    optimizer: Any
    scheduler: Any
    gbs: int
    n_params: int
    flops: float  # Megatron's dense GPT FLOPs per iteration
    total_params: Any = field(repr=False)  # a tensor: the parameters summed over the TP shards
    max_alloc: list[int] = field(default_factory=lambda: [0])

    @property
    def last(self) -> int:
        """The rank that prints the iteration line (Megatron's last rank)."""
        return self.world - 1


@dataclass
class _Interval:
    """Sums over one log interval; a new one starts the clock for the next."""

    t0: float = field(default_factory=time.perf_counter)
    iters: int = 0
    skipped: int = 0
    nan: int = 0
    loss_sum: float = 0.0
    loss_iters: int = 0
    grad_norm: float | None = None

    def add(self, ok: bool, norm: float | None, loss: float) -> None:
        """One step: a skipped step counts as skipped (and NaN when its loss is not finite)
        and leaves the loss average and grad norm alone, as Megatron does."""
        self.iters += 1
        if ok:
            self.loss_sum += loss
            self.loss_iters += 1
            self.grad_norm = norm
        else:
            self.skipped += 1
            self.nan += int(not math.isfinite(loss))


def _default_rendezvous_env() -> None:
    """Let a plain `python -m` run (no torchrun) start a world of one."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))


def _init_parallel(args: argparse.Namespace) -> tuple[int, int, bool]:
    """The gloo process group and Megatron's TP/DP groups and RNG; (rank, world, SP)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % args.tp:
        raise SystemExit(f"cpu_gpt: world size {world} is not a multiple of --tp {args.tp}")
    sp = args.sp and args.tp > 1
    ps.initialize_model_parallel(tensor_model_parallel_size=args.tp)
    tensor_parallel.model_parallel_cuda_manual_seed(args.seed)
    return rank, world, sp


def _build_model(args: argparse.Namespace, sp: bool) -> Any:
    """GPTModel from the local layer specs (no TE fusions), in bf16, wrapped in Megatron DDP."""
    import torch
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=4 * args.hidden,
        num_attention_heads=args.heads, tensor_model_parallel_size=args.tp,
        sequence_parallel=sp, use_cpu_initialization=True, params_dtype=torch.bfloat16,
        bf16=True, pipeline_dtype=torch.bfloat16, gradient_accumulation_fusion=False,
        bias_dropout_fusion=False, bias_activation_fusion=False, masked_softmax_fusion=False,
        apply_rope_fusion=False, persist_layer_norm=False, attention_softmax_in_fp32=True,
        finalize_model_grads_func=finalize_model_grads)
    model = GPTModel(config, get_gpt_layer_local_spec(), vocab_size=args.vocab,
                     max_sequence_length=args.seq, position_embedding_type="learned_absolute",
                     share_embeddings_and_output_weights=False)
    return DistributedDataParallel(
        config, DistributedDataParallelConfig(grad_reduce_in_fp32=False,
                                              overlap_grad_reduce=False,
                                              use_distributed_optimizer=False),
        module=Float16Module(config, model))


def _build_optimizer(args: argparse.Namespace, model: Any, gbs: int) -> tuple[Any, Any]:
    """Megatron's bf16 Adam (constant loss scale 1.0, so a non-finite gradient skips the step)
    and a warm-up + cosine scheduler that counts samples, as Megatron's loop does."""
    import torch
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    opt_config = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.lr / 10,
                                 weight_decay=0.01, bf16=True, params_dtype=torch.bfloat16,
                                 loss_scale=1.0, clip_grad=1.0, use_distributed_optimizer=False)
    optimizer = get_megatron_optimizer(opt_config, [model])
    warmup = min(10, max(1, args.steps // 5))
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=args.lr, min_lr=args.lr / 10,
        lr_warmup_steps=warmup * gbs, lr_decay_steps=args.steps * gbs, lr_decay_style="cosine",
        start_wd=0.01, end_wd=0.01, wd_incr_steps=args.steps * gbs, wd_incr_style="constant")
    return optimizer, scheduler


def _count_params(model: Any) -> tuple[int, Any]:
    """This rank's parameter count and (a tensor) the count summed over the TP shards."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    n_params = sum(p.numel() for p in model.parameters())
    total = torch.tensor([n_params], dtype=torch.long)
    dist.all_reduce(total, group=ps.get_tensor_model_parallel_group())
    return n_params, total


def _setup(args: argparse.Namespace) -> _Run:
    """Process groups, model, optimizer and parameter counts for this rank."""
    from megatron.core import parallel_state as ps

    rank, world, sp = _init_parallel(args)
    dp, dp_rank = ps.get_data_parallel_world_size(), ps.get_data_parallel_rank()
    model = _build_model(args, sp)
    gbs = args.mbs * dp
    optimizer, scheduler = _build_optimizer(args, model, gbs)
    n_params, total = _count_params(model)
    return _Run(args=args, rank=rank, world=world, sp=sp, dp=dp, dp_rank=dp_rank, model=model,
                optimizer=optimizer, scheduler=scheduler, gbs=gbs, n_params=n_params,
                flops=gpt_flops(args, gbs, args.vocab), total_params=total)


def _announce(run: _Run) -> None:
    """Rank 0's header: the layout, what the memory lines mean, the loop start (log §2)."""
    args = run.args
    if run.rank != 0:
        return
    emit(f"cpu_gpt: Megatron-Core GPTModel on CPU/gloo: world {run.world}, TP {args.tp}, "
         f"SP {run.sp}, DP {run.dp}, layers {args.layers}, hidden {args.hidden}, "
         f"seq {args.seq}, vocab {args.vocab}, mbs {args.mbs}, gbs {run.gbs}")
    if args.memory_lines == "synthetic":
        emit("cpu_gpt: memory lines are synthetic CPU figures, not "
             "torch.cuda.memory_stats(): allocated = live torch tensor bytes in the "
             "process, reserved = process RSS, max-reserved = peak RSS")
    emit("Starting training loop at iteration 0")


def _train(run: _Run) -> None:
    """The training loop: one micro-batch per step, the loss averaged over DP, the log lines
    at every log interval, and the --exit-code fault after --exit-after steps."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.distributed import finalize_model_grads

    args, model, optimizer = run.args, run.model, run.optimizer
    positions = torch.arange(args.seq).unsqueeze(0).expand(args.mbs, -1)
    stop_after = args.steps if args.exit_after is None else min(args.exit_after, args.steps)
    interval = _Interval()
    for iteration in range(1, args.steps + 1):
        tokens, labels = synthetic_batch(args, iteration, run.dp_rank)
        model.train()
        model.zero_grad_buffer()
        optimizer.zero_grad()
        per_token = model(tokens, positions, attention_mask=None, labels=labels)
        loss = per_token.float().mean()
        if args.inject_nan_at == iteration:
            loss = loss * float("nan")
        loss.backward()
        finalize_model_grads([model])
        ok, norm, _ = optimizer.step()
        if ok:
            run.scheduler.step(increment=run.gbs)
        if args.sleep_per_step:
            time.sleep(args.sleep_per_step)
        reduced = loss.detach().clone()
        dist.all_reduce(reduced, group=ps.get_data_parallel_group())
        reduced /= run.dp
        interval.add(ok, norm, float(reduced))
        if iteration % args.log_interval == 0 or iteration == args.steps:
            _log_interval(run, iteration, interval)
            interval = _Interval()
        if args.exit_code is not None and iteration >= stop_after:
            _exit_now(run, iteration)


def _log_interval(run: _Run, iteration: int, interval: _Interval) -> None:
    """The lines of one log interval: the iteration line (last rank), Step Time (rank 0), the
    parameter and theoretical-memory lines with the first report, and the memory lines after
    iterations 1 and 2 (every data-parallel-rank-0 rank)."""
    import torch.distributed as dist

    args = run.args
    dist.barrier()
    elapsed = (time.perf_counter() - interval.t0) / interval.iters
    tflops = run.flops / elapsed / run.world / 1e12
    if run.rank == run.last:
        emit(iteration_line(
            iteration=iteration, total=args.steps, consumed=iteration * run.gbs,
            elapsed_ms=elapsed * 1000.0, tflops=tflops,
            lr=run.optimizer.param_groups[0]["lr"], gbs=run.gbs,
            loss=interval.loss_sum / interval.loss_iters if interval.loss_iters else None,
            loss_scale=float(run.optimizer.get_loss_scale()),
            grad_norm=interval.grad_norm if interval.loss_iters else None,
            skipped=interval.skipped, nan=interval.nan))
    if run.rank == 0:
        emit(f"Step Time : {elapsed:.2f}s GPU utilization: {tflops:.1f}"
             "MODEL_TFLOP/s/GPU")
    if run.rank == 0 and iteration == 1:  # with the first memory report (log §5)
        emit(f"Total number of parameters in billions: {int(run.total_params) / 1e9:.2f}")
        emit(f"Theoretical memory footprints: weight and optimizer="
             f"{run.n_params * 18 / 2**20:.2f} MB")
    if args.memory_lines == "synthetic" and iteration <= 2 and run.dp_rank == 0:
        emit(memory_line(run.rank, iteration, run.max_alloc))


def _exit_now(run: _Run, iteration: int) -> None:
    """The --exit-code fault: every rank leaves with the code, skipping interpreter cleanup."""
    import torch.distributed as dist

    dist.barrier()
    print(f"cpu_gpt: rank {run.rank} exiting with code {run.args.exit_code} after iteration "
          f"{iteration} (--exit-code)", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(run.args.exit_code)


def _finish(run: _Run) -> None:
    """Rank 0's end-of-training marker, then the parallel state and process group go."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    dist.barrier()
    if run.rank == 0:
        emit(f"[after training is done] datetime: "
             f"{datetime.now().strftime('%Y-%m-%d %H:%M:%S')} ")
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Train under torchrun (or as a world of one) and print Megatron-format log lines."""
    args = parse_args(argv)
    _default_rendezvous_env()
    import torch

    torch.set_num_threads(1)
    install_cpu_shims()
    for name in _MEGATRON_MODULES:
        importlib.import_module(name)
    run = _setup(args)
    _announce(run)
    _train(run)
    _finish(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
