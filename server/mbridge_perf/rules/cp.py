"""Context parallelism: sequence divisibility, communication types, hierarchical CP and sizing
(constraint catalog section D)."""

from __future__ import annotations

from math import prod
from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import LONG_CONTEXT, Violation, rule

CP = "model.context_parallel_size"
SEQ = "model.seq_length"
COMM = "model.cp_comm_type"
HCP = "model.hierarchical_context_parallel_sizes"
TOKENS_PER_RANK = 4096  # the skills' CP sizing target
# Dataset configs Bridge treats as finetuning for D2 (matched in the `_target_` class path).
FINETUNE_DATASETS = ("Finetuning", "SFT", "HFDataset", "Energon", "MockVLM")


def _comm_types(c: TrainingConfig) -> list[str]:
    """cp_comm_type as a list of strings (Bridge reads a missing value as p2p)."""
    ct = c.model.cp_comm_type
    return [str(t) for t in ct] if isinstance(ct, list) else [ct or "p2p"]


def _section(c: TrainingConfig, name: str) -> dict[str, Any]:
    raw = c.carried().get(name)
    return raw if isinstance(raw, dict) else {}


def _pow2_near(x: float) -> int:
    """The power of two closest to x on a log scale (at least 1)."""
    p = 1
    while p * 2 <= x * 1.414:
        p *= 2
    return p


@rule("cp.seq-divisible", "error", ref="D1", source="megatron-bridge", fields=(SEQ, CP),
      skill=LONG_CONTEXT, summary="CP > 1 needs seq_length divisible by 2·CP (load-balanced "
                                  "chunks)")
def _seq_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    seq = c.model.seq_length
    if d.cp == 1 or seq is None or seq % (2 * d.cp) == 0:
        return None
    step = 2 * d.cp
    ok = [k for k in (2, 4, 8, 16, 32, 64) if seq % (2 * k) == 0 and k < d.cp]
    alt = f", or set {CP} to {ok[-1]}" if ok else ""
    return Violation(f"seq_length={seq} is not divisible by 2·context_parallel_size = {step}",
                     f"set {SEQ} to a multiple of {step} (e.g. {seq // step * step or step} or "
                     f"{(seq // step + 1) * step}){alt}")


@rule("cp.finetune-per-token-loss", "error", ref="D2", source="megatron-bridge",
      fields=(CP, "model.calculate_per_token_loss", "ddp.average_in_collective", "dataset"),
      skill=LONG_CONTEXT,
      summary="finetuning with CP > 1 needs calculate_per_token_loss and no in-collective "
              "averaging")
def _finetune_per_token_loss(c: TrainingConfig, d: Derived) -> Violation | None:
    target = str(_section(c, "dataset").get("_target_", ""))
    if d.cp == 1 or not any(k in target for k in FINETUNE_DATASETS):
        return None
    bad = (["calculate_per_token_loss=False"] if not c.model.calculate_per_token_loss else []) \
        + (["average_in_collective=True"] if c.ddp.average_in_collective else [])
    if not bad:
        return None
    return Violation(f"finetuning dataset with context_parallel_size={d.cp} and "
                     f"{', '.join(bad)}",
                     "set model.calculate_per_token_loss = true and ddp.average_in_collective = "
                     "false")


@rule("cp.hierarchical-sizes-required", "error", ref="D3", source="megatron-bridge",
      fields=(COMM, HCP), skill=LONG_CONTEXT,
      summary="cp_comm_type containing 'a2a+p2p' needs hierarchical_context_parallel_sizes "
              "(else CP comm is silently off)")
def _hierarchical_sizes_required(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.model.hierarchical_context_parallel_sizes is not None or not any(
            "a2a+p2p" in t for t in _comm_types(c)):
        return None
    return Violation(
        f"cp_comm_type={c.model.cp_comm_type!r} without hierarchical_context_parallel_sizes",
        f"set {HCP} to [a2a size inside the node, p2p size across nodes] with product "
        f"{d.cp} (e.g. [8, {max(d.cp // 8, 1)}] for 8 GPUs per node)")


@rule("cp.hierarchical-product", "error", ref="D4", source="megatron-bridge",
      fields=(HCP, CP), skill=LONG_CONTEXT,
      summary="product of hierarchical_context_parallel_sizes equals context_parallel_size")
def _hierarchical_product(c: TrainingConfig, d: Derived) -> Violation | None:
    sizes = c.model.hierarchical_context_parallel_sizes
    if sizes is None or prod(sizes) == d.cp:
        return None
    return Violation(f"hierarchical_context_parallel_sizes={sizes} multiply to {prod(sizes)}, "
                     f"not context_parallel_size={d.cp}",
                     f"make the sizes multiply to {d.cp}, or set {CP} = {prod(sizes)}")


@rule("cp.comm-type-length", "error", ref="D5", source="megatron-core",
      fields=(COMM, "model.num_layers", CP), skill=LONG_CONTEXT, mcore_enforced=True,
      summary="a list cp_comm_type needs one entry per layer")
def _comm_type_per_layer(c: TrainingConfig, d: Derived) -> Violation | None:
    ct, layers = c.model.cp_comm_type, c.model.num_layers
    if d.cp == 1 or not isinstance(ct, list) or layers is None or len(ct) == layers:
        return None
    return Violation(f"cp_comm_type lists {len(ct)} entries for num_layers={layers}",
                     f"give {COMM} exactly {layers} entries, or a single string for all layers")


@rule("cp.hierarchical-needs-mpu-pg", "warning", ref="D6", source="megatron-bridge",
      fields=("dist.use_decentralized_pg", HCP, COMM), skill=LONG_CONTEXT,
      summary="hierarchical CP is built only on the MPU process-group path")
def _hierarchical_needs_mpu_pg(c: TrainingConfig, d: Derived) -> Violation | None:
    hier = c.model.hierarchical_context_parallel_sizes is not None or any(
        "a2a+p2p" in t for t in _comm_types(c))
    if not hier or _section(c, "dist").get("use_decentralized_pg") is not True:
        return None
    return Violation("dist.use_decentralized_pg=True with hierarchical CP: the decentralized "
                     "path builds a flat CP group and no hierarchical groups",
                     "set dist.use_decentralized_pg = false")


@rule("cp.size-advice", "info", ref="D8", source="skill", fields=(CP, SEQ),
      skill=LONG_CONTEXT,
      summary="size CP so that each rank holds about 4096 tokens (CP ≈ seq_length / 4096)")
def _size_advice(c: TrainingConfig, d: Derived) -> Violation | None:
    # Advice only at long context (≥ 16384) and only when the shard is more than 4x away from the
    # 4096-token target, i.e. outside [1024, 16384] tokens per CP rank.
    seq = c.model.seq_length
    if seq is None or seq < 4 * TOKENS_PER_RANK:
        return None
    per_rank = seq / d.cp
    if TOKENS_PER_RANK / 4 <= per_rank <= TOKENS_PER_RANK * 4:
        return None
    target = _pow2_near(seq / TOKENS_PER_RANK)
    return Violation(f"seq_length={seq} with context_parallel_size={d.cp} gives "
                     f"{per_rank:g} tokens per CP rank (target about {TOKENS_PER_RANK})",
                     f"try {CP} = {target} ({seq} / {TOKENS_PER_RANK} rounded to a power of two)"
                     "; use cp_comm_type a2a+p2p with hierarchical sizes for CP beyond one node")


@rule("cp.dsa-needs-allgather", "error", ref="D9", source="megatron-core",
      fields=("model.experimental_attention_variant", CP, COMM), skill=LONG_CONTEXT,
      summary="DSA attention with CP > 1 supports only cp_comm_type=allgather")
def _dsa_needs_allgather(c: TrainingConfig, d: Derived) -> Violation | None:
    # Pin rule; MCore 0.16.1 rejects DSA with any CP > 1, so not marked mcore_enforced.
    if c.model.experimental_attention_variant != "dsa" or d.cp == 1:
        return None
    ct = c.model.cp_comm_type
    types = ct if isinstance(ct, list) else [ct]
    if all(t is not None and str(t).replace("_", "").lower() == "allgather" for t in types):
        return None
    return Violation(f"experimental_attention_variant='dsa' with context_parallel_size={d.cp} and "
                     f"cp_comm_type={ct!r}",
                     f"set {COMM} = 'allgather'")
