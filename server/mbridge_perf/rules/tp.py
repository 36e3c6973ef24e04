"""Tensor and sequence parallelism: head / query-group / MLA divisibility, SP, TP comm overlap and
where TP should stay (constraint catalog sections C and L1)."""

from __future__ import annotations

from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.config.semantics import first_selective_hint
from mbridge_perf.rules.catalog import MEM, WORKFLOW, Violation, rule
from mbridge_perf.rules.env import _expandable

TP = "model.tensor_model_parallel_size"
SP = "model.sequence_parallel"
EP = "model.expert_model_parallel_size"
CP = "model.context_parallel_size"
HEADS = "model.num_attention_heads"
GROUPS = "model.num_query_groups"
MLA = "model.multi_latent_attention"
GDN_VARIANTS = ("gated_delta_net", "gdn", "gdn2")


def _not_divisible(value: int | None, by: int) -> bool:
    return value is not None and value % by != 0


def _tp_options(n: int, tp: int) -> str:
    """TP sizes up to the current one that divide n (what the fix can offer)."""
    ok = [k for k in range(1, max(tp, 1) + 1) if n % k == 0]
    return ", ".join(map(str, ok[-4:]))


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _nvlink_domain(c: TrainingConfig, d: Derived) -> tuple[int, str] | None:
    """GPUs that share one NVLink domain, and where that number comes from: the GPU catalog when
    cluster.gpu names a known GPU, else cluster.gpus_per_node."""
    gpu = d.gpu
    if gpu is not None:
        return gpu.nvlink_domain, f"the {gpu.name} NVLink domain of {gpu.nvlink_domain} GPUs"
    per_node = c.cluster.gpus_per_node
    if per_node:
        return per_node, f"{per_node} GPUs per node"
    return None


@rule("model.sizes-set", "error", ref="C2", source="megatron-core",
      fields=("model.num_layers", "model.hidden_size", HEADS), skill=None,
      summary="num_layers, hidden_size and num_attention_heads must be positive")
def _sizes_set(c: TrainingConfig, d: Derived) -> Violation | None:
    # A recipe template (Bridge's vanilla_gpt) dumps them as 0; Megatron-Core's
    # TransformerConfig then divides by zero (kv_channels = hidden_size // heads).
    m = c.model
    zero = [f"{n}=0" for n in ("num_layers", "hidden_size", "num_attention_heads")
            if getattr(m, n) == 0]
    if not zero:
        return None
    return Violation(f"{', '.join(zero)}: the recipe leaves the architecture unset",
                     "set model.num_layers, model.hidden_size and model.num_attention_heads "
                     "(or start from a preset)")


@rule("tp.sp-needs-tp", "error", ref="C1", source="megatron-core", fields=(SP, TP),
      skill=MEM, mcore_enforced=True,
      summary="sequence_parallel needs tensor_model_parallel_size > 1")
def _sp_needs_tp(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.model.sequence_parallel or d.tp > 1:
        return None
    return Violation(f"sequence_parallel=True with tensor_model_parallel_size={d.tp}",
                     f"set {SP} = false, or raise {TP} to 2 or more")


@rule("tp.heads-divisible", "error", ref="C2", source="megatron-core", fields=(HEADS, TP),
      skill=MEM, mcore_enforced=True,
      summary="num_attention_heads divisible by tensor_model_parallel_size")
def _heads_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    heads = c.model.num_attention_heads
    if heads is None or heads % d.tp == 0:
        return None
    return Violation(f"num_attention_heads={heads} is not divisible by "
                     f"tensor_model_parallel_size={d.tp}",
                     f"set {TP} to a divisor of {heads} (e.g. {_tp_options(heads, d.tp)})")


@rule("tp.query-groups-divisible", "error", ref="C3", source="megatron-core",
      fields=(GROUPS, TP), skill=MEM, mcore_enforced=True,
      summary="num_query_groups (KV heads) must be a multiple or a divisor of TP")
def _query_groups_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    groups = c.model.num_query_groups
    if groups is None or groups % d.tp == 0 or d.tp % groups == 0:
        return None
    return Violation(f"num_query_groups={groups} is neither a multiple nor a divisor of "
                     f"tensor_model_parallel_size={d.tp}",
                     f"set {TP} to a divisor or a multiple of {groups} (e.g. "
                     f"{_tp_options(groups, d.tp)})")


@rule("tp.ep-tp-needs-sp", "warning", ref="C4", source="megatron-core", fields=(SP, TP, EP),
      skill=WORKFLOW,
      summary="EP > 1 with TP > 1 should use sequence parallelism (MCore warns)")
def _ep_tp_needs_sp(c: TrainingConfig, d: Derived) -> Violation | None:
    if d.ep == 1 or d.tp == 1 or c.model.sequence_parallel:
        return None
    return Violation(f"expert_model_parallel_size={d.ep} and tensor_model_parallel_size={d.tp} "
                     "with sequence_parallel=False",
                     f"set {SP} = true")


@rule("tp.mla-lora-divisible", "warning", ref="C6", source="megatron-core",
      fields=(MLA, "model.q_lora_rank", "model.kv_lora_rank", "model.qk_pos_emb_head_dim", TP),
      skill=None,
      summary="MLA: q_lora_rank and kv_lora_rank + qk_pos_emb_head_dim divisible by TP when the "
              "down projection is tensor-parallel")
def _mla_lora_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    # MCore asserts this only where the (fused) down projection is split over TP (column-
    # parallel specs, fused qkv-down checkpoint handling); the default TE spec replicates it, so
    # this is a warning rather than an error.
    m = c.model
    if not m.multi_latent_attention or d.tp == 1:
        return None
    kv = m.kv_lora_rank + m.qk_pos_emb_head_dim
    bad = ([f"q_lora_rank={m.q_lora_rank}"] if _not_divisible(m.q_lora_rank, d.tp) else []) + (
        [f"kv_lora_rank + qk_pos_emb_head_dim = {kv}"] if kv % d.tp else [])
    if not bad:
        return None
    return Violation(f"{' and '.join(bad)} not divisible by tensor_model_parallel_size={d.tp}",
                     f"choose {TP} dividing both, or keep the MLA down projection replicated "
                     "(the default Transformer Engine layer spec)")


@rule("attention.mla-rotary-interleaved", "error", ref="C7", source="megatron-core",
      fields=(MLA, "model.rotary_interleaved"), skill=None, mcore_enforced=True,
      summary="rotary_interleaved does not work with multi_latent_attention")
def _mla_rotary_interleaved(c: TrainingConfig, d: Derived) -> Violation | None:
    if not (c.model.multi_latent_attention and c.model.rotary_interleaved):
        return None
    return Violation("rotary_interleaved=True with multi_latent_attention=True",
                     "set model.rotary_interleaved = false")


@rule("attention.mla-rope-fusion-needs-yarn", "error", ref="C7", source="megatron-core",
      fields=(MLA, "model.apply_rope_fusion", "model.rope_type"), skill=None, mcore_enforced=True,
      summary="MLA RoPE fusion only works with YaRN RoPE (MLATransformerConfig)")
def _mla_rope_fusion_yarn(c: TrainingConfig, d: Derived) -> Violation | None:
    m = c.model
    rope = m.carried().get("rope_type", "yarn")  # MLATransformerConfig's default
    if not (m.multi_latent_attention and m.apply_rope_fusion) or rope == "yarn":
        return None
    return Violation(f"apply_rope_fusion=True with multi_latent_attention and rope_type={rope!r}",
                     "set model.apply_rope_fusion = false, or model.rope_type = 'yarn'")


@rule("tp.gdn-heads-divisible", "error", ref="C8", source="megatron-core",
      fields=("model.linear_num_key_heads", "model.linear_num_value_heads", TP, CP,
              "model.experimental_attention_variant"), skill=None,
      summary="gated delta net: linear key/value heads divisible by TP·CP, value heads a multiple "
              "of key heads")
def _gdn_heads_divisible(c: TrainingConfig, d: Derived) -> Violation | None:
    # Pin rule (TP·CP); MCore 0.16.1 instead requires CP == 1 and divides by TP only, so this is
    # not marked mcore_enforced.
    m = c.model
    if m.experimental_attention_variant not in GDN_VARIANTS:
        return None
    extra = m.carried()
    keys = _positive_int(extra.get("linear_num_key_heads", 16))  # MCore defaults
    values = _positive_int(extra.get("linear_num_value_heads", 32))
    if keys is None or values is None:
        return None
    split = d.tp * d.cp
    bad = [f"{name}={n}" for name, n in (("linear_num_key_heads", keys),
                                         ("linear_num_value_heads", values)) if n % split]
    if values % keys:
        bad.append(f"linear_num_value_heads={values} not a multiple of linear_num_key_heads="
                   f"{keys}")
    if not bad:
        return None
    return Violation(f"{'; '.join(bad)} (TP·CP = {d.tp}·{d.cp} = {split})",
                     f"choose {TP} and {CP} whose product divides both linear head counts")


@rule("tp.crosses-nvlink-domain", "warning", ref="C9", source="skill",
      fields=(TP, "cluster.gpus_per_node", "cluster.gpu"), skill=MEM,
      summary="TP larger than one NVLink domain puts its all-reduces on the inter-node fabric")
def _crosses_nvlink_domain(c: TrainingConfig, d: Derived) -> Violation | None:
    domain = _nvlink_domain(c, d)
    if domain is None or d.tp <= domain[0]:
        return None
    return Violation(
        f"tensor_model_parallel_size={d.tp} exceeds {domain[1]}: every layer's TP all-reduce "
        "crosses nodes (TP 4 → 8 on Llama3 70B already cost −28.4 % inside one node)",
        f"keep {TP} ≤ {domain[0]} and scale with PP, CP or DP instead")


@rule("tp.raised-for-memory", "warning", ref="C9", source="skill", fields=(TP,
      "cluster.num_gpus"), skill=MEM,
      summary="raising TP (and lowering DP) to fit memory cost −28.4 % on Llama3 70B")
def _raised_for_memory(c: TrainingConfig, d: Derived) -> Violation | None:
    # DP before and after on the baseline's GPUs (Derived.dp_lowered): a Bridge dump whose TP
    # was edited keeps comm_overlap.data_parallel_size, so the world it implies grows with TP
    b, lowered = d.before, d.dp_lowered()
    if b is None or lowered is None or b.tp >= d.tp:
        return None
    old_dp, new_dp = lowered
    world = old_dp * b.model_parallel_size
    first = ("PYTORCH_CUDA_ALLOC_CONF already has expandable_segments:True, so next: "
             if _expandable(c) else
             "first set env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, then ")
    return Violation(
        f"tensor_model_parallel_size raised {b.tp} → {d.tp} with DP {old_dp} → {new_dp} on the "
        f"same {world} GPUs: on Llama3 70B TP 4 → 8 measured −28.4 % throughput",
        "revert TP; " + first + first_selective_hint(d.first_selective_modules()))


@rule("tp.comm-overlap-needs-sp", "warning", ref="L1", source="megatron-bridge",
      fields=("comm_overlap.tp_comm_overlap", TP, SP), skill=None,
      summary="TP comm overlap is silently disabled when TP < 2 or sequence_parallel is off")
def _comm_overlap_needs_sp(c: TrainingConfig, d: Derived) -> Violation | None:
    if not c.overlap.tp_comm_overlap or (d.tp > 1 and c.model.sequence_parallel):
        return None
    why = f"tensor_model_parallel_size={d.tp}" if d.tp < 2 else "sequence_parallel=False"
    return Violation(f"tp_comm_overlap=True with {why}: Bridge disables the overlap",
                     f"set {SP} = true with {TP} ≥ 2, or comm_overlap.tp_comm_overlap = false")
