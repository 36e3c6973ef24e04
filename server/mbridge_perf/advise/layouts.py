"""Candidate parallel layouts for a model on N GPUs: the divisibility rules applied as integer
arithmetic (cheap), before any layout is priced.

Why here and not in the validator: the validator checks one config; the planner has to reject
thousands of combinations per second and say, per family, which rule rejected it. The checks
are the same rules (rule ids quoted), and every layout the planner returns is validated again.

Parallel folding (Megatron-Core): the attention mesh TP·CP·DP·PP = N and the expert mesh
ETP·EP·EDP·PP = N are independent, so the smallest world a layout needs is
PP·lcm(TP·CP, EP·ETP), never the product of every degree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from mbridge_perf.config.derived import mesh_world
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import ModelSection
from mbridge_perf.config.semantics import LONG_CONTEXT

# keys of PlanConstraints / the layout fields, Bridge names verbatim
SIZE_FIELDS = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
               "virtual_pipeline_model_parallel_size", "context_parallel_size",
               "expert_model_parallel_size", "expert_tensor_parallel_size", "micro_batch_size")
MAX_VPP = 16
MAX_MBS = 8
# Bounds on one search (issue 23: 720,720 GPUs with highly divisible sizes enumerated ~10^6
# layouts, seconds and hundreds of MB per call). Real plans need far fewer: every preset at
# 720,720 GPUs stays under ~1,200 families and ~340,000 layouts. Past either bound the search
# stops and says so in the answer's rejected families.
MAX_GROUPS = 2_000
MAX_LAYOUTS = 400_000


def min_gpus(tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1, etp: int | None = None) -> int:
    """Smallest world both meshes divide: PP·lcm(TP·CP, EP·ETP); ETP unset means ETP = TP
    (Megatron-Core's default), so TP2 PP8 CP8 EP32 needs 512 GPUs (256 with ETP=1), not the
    product 8,192."""
    for name, v in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                    ("context_parallel_size", cp), ("expert_model_parallel_size", ep),
                    ("expert_tensor_parallel_size", etp if etp is not None else 1)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1_048_576:
            raise ConfigError(name, f"must be a whole number from 1 to 1,048,576, got {v!r}")
    return mesh_world(tp, pp, cp, ep, tp if etp is None else etp)


def min_gpus_for(m: ModelSection, seq_length: int, *, tp: int = 1, pp: int = 1,
                 ep: int = 1, etp: int | None = None, cp: int | None = None) -> int:
    """"How many GPUs do I need for this sequence?": the layout family's min_gpus with CP from
    the long-context skill (seq_length / 4096 as a power of two) unless given, after the
    checks that make the family impossible at any size (experts over EP, seq over 2·CP, heads
    over TP)."""
    cp = cp_start(seq_length) if cp is None else cp
    experts = int(m.num_moe_experts or 0)
    if ep > 1 and (not experts or experts % ep):
        raise ConfigError("expert_model_parallel_size", f"{ep} does not divide the model's "
                                                        f"{experts} experts")
    if cp > 1 and seq_length % (2 * cp):
        raise ConfigError("context_parallel_size", f"seq_length {seq_length} is not divisible "
                                                   f"by 2·CP = {2 * cp}")
    if m.num_attention_heads and m.num_attention_heads % tp:
        raise ConfigError("tensor_model_parallel_size", f"{tp} does not divide "
                                                        f"{m.num_attention_heads} heads")
    return min_gpus(tp, pp, cp, ep, etp)


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


@dataclass(frozen=True, slots=True)
class PipelineSplit:
    """How the layers go on PP x VPP virtual stages, in Bridge's terms: even (nothing set),
    ``account_for_*_in_pipeline_split`` (embedding and loss count as one layer each) or an
    explicit ``pipeline_model_parallel_layout``."""

    pp: int
    vpp: int
    kind: str  # "even" | "account" | "layout"
    layout: str | None = None

    def changes(self) -> dict[str, Any]:
        """model.* fields that express this split (the others reset)."""
        return {"model.pipeline_model_parallel_size": self.pp,
                "model.virtual_pipeline_model_parallel_size": self.vpp if self.vpp > 1 else None,
                "model.pipeline_model_parallel_layout": self.layout,
                "model.account_for_embedding_in_pipeline_split": self.kind == "account",
                "model.account_for_loss_in_pipeline_split": self.kind == "account",
                "model.num_layers_in_first_pipeline_stage": None,
                "model.num_layers_in_last_pipeline_stage": None}


def _layout_string(counts: list[int], mtp: int) -> str:
    """'Et|(tt|)*30mL' style: the first stage holds the embedding, the last the MTP layers and
    the loss; runs of equal middle stages are folded into a repeat."""
    parts = ["t" * n for n in counts]
    parts[0] = "E" + parts[0]
    parts[-1] = parts[-1] + "m" * mtp + "L"
    head, mids, tail = parts[0], parts[1:-1], parts[-1]
    if len(parts) == 1:
        return head
    text = head + "|"
    i = 0
    while i < len(mids):
        j = i
        while j < len(mids) and mids[j] == mids[i]:
            j += 1
        run = j - i
        text += f"({mids[i]}|)*{run}" if run > 2 else "".join(m + "|" for m in mids[i:j])
        i = j
    return text + tail


def pipeline_splits(m: ModelSection, pp: int) -> list[PipelineSplit]:
    """Every VPP for this PP that Bridge's recipes could express: an even split, the
    account_for_* split, or a layout that gives the middle virtual stages ceil(L / S) layers and
    takes the remainder from the last stage (MTP + loss), then the first (embedding) - the shape
    of DeepSeek-V3's 'Et|(tt|)*30mL' at PP8 VPP4. An even split may run one layer per
    virtual chunk (Llama3 70B SFT: PP8 VPP10 on GB200); the others keep at least two, as the
    recipes do (DeepSeek-V3 PP8 VPP4, Qwen3-235B PP4 VPP12)."""
    layers = int(m.num_layers or 0)
    mtp = int(m.mtp_num_layers or 0)
    out: list[PipelineSplit] = []
    if pp == 1:
        return [PipelineSplit(1, 1, "even")]
    for vpp in range(1, MAX_VPP + 1):
        stages = pp * vpp
        if stages > layers + 2:
            break
        if layers % stages == 0 and not mtp:
            out.append(PipelineSplit(pp, vpp, "even"))
            continue
        if (layers + 2) % stages == 0 and not mtp and (vpp == 1 or (layers + 2) // stages >= 2):
            out.append(PipelineSplit(pp, vpp, "account"))
            continue
        per = -(-layers // stages)
        excess = per * stages - layers
        if excess >= 2 * per or per < 1 or (vpp > 1 and per < 2):
            continue  # the remainder would empty stages beyond the first and last
        counts = [per] * stages
        take = min(excess, per)
        counts[-1] -= take
        counts[0] -= excess - take
        out.append(PipelineSplit(pp, vpp, "layout", _layout_string(counts, mtp)))
    return out


@dataclass(frozen=True, slots=True)
class Skeleton:
    """A layout without CP: static memory does not depend on CP at a fixed world size (the
    optimizer shards over DP·CP = N / (TP·PP)), activations fall as CP grows."""

    tp: int
    split: PipelineSplit
    ep: int
    etp: int | None  # None: dense model
    mbs: int


@dataclass
class Rejections:
    """Families rejected before pricing: reason -> (count, an example)."""

    by_reason: dict[str, list[Any]]

    def add(self, reason: str, example: str) -> None:
        row = self.by_reason.setdefault(reason, [0, example])
        row[0] += 1


def _allowed(constraints: dict[str, list[int]], name: str, values: list[int]) -> list[int]:
    allow = constraints.get(name)
    return [v for v in values if allow is None or v in allow]


def tp_values(m: ModelSection, n: int, nvlink: int, constraints: dict[str, list[int]],
              rej: Rejections) -> list[int]:
    """TP degrees the heads, query groups, MLA ranks and the NVLink domain allow."""
    heads = int(m.num_attention_heads or 1)
    groups = int(m.num_query_groups or heads)
    out = []
    for t in _allowed(constraints, "tensor_model_parallel_size", divisors(n)):
        if t > nvlink:
            rej.add(f"TP > {nvlink}: crosses the NVLink domain of the GPU "
                    "(tp.crosses-nvlink-domain)", f"TP{t}")
        elif heads % t:
            rej.add(f"num_attention_heads {heads} not divisible by TP (tp.heads-divisible)",
                    f"TP{t}")
        elif groups % t and t % groups:
            rej.add(f"num_query_groups {groups} neither a multiple nor a divisor of TP "
                    "(tp.query-groups-divisible)", f"TP{t}")
        elif m.multi_latent_attention and ((m.q_lora_rank or 0) % t or (
                m.kv_lora_rank + m.qk_pos_emb_head_dim) % t):
            rej.add("MLA q_lora_rank / kv_lora_rank + qk_pos_emb_head_dim not divisible by TP "
                    "(tp.mla-lora-divisible)", f"TP{t}")
        else:
            out.append(t)
    return out


def cp_values(m: ModelSection, room: int, tp: int, constraints: dict[str, list[int]],
              rej: Rejections) -> list[int]:
    """CP degrees dividing the room left by TP·PP with seq_length % (2·CP) == 0."""
    seq = int(m.seq_length or 0)
    lin_k = int(getattr(m, "linear_num_key_heads", None) or 0) if _is_gdn(m) else 0
    out = []
    for c in _allowed(constraints, "context_parallel_size", divisors(room)):
        if c > 1 and seq % (2 * c):
            rej.add(f"seq_length {seq} not divisible by 2·CP (cp.seq-divisible)", f"CP{c}")
        elif lin_k and lin_k % (tp * c):
            rej.add("GatedDeltaNet linear heads not divisible by TP·CP (tp.gdn-heads-divisible)",
                    f"TP{tp} CP{c}")
        else:
            out.append(c)
    return out


def _is_gdn(m: ModelSection) -> bool:
    return str(getattr(m, "experimental_attention_variant", None) or "") == "gated_delta_net"


@dataclass(frozen=True, slots=True)
class Group:
    """Skeletons that differ only in EP, with the CPs they allow: peak memory does not rise as
    EP or CP grows (experts shard over EP while their optimizer state stays N-wide; activations
    shard over CP), so the layouts that fit form a staircase in the (EP, CP) grid."""

    tp: int
    split: PipelineSplit
    etp: int | None
    mbs: int
    eps: tuple[int, ...]
    cps: tuple[int, ...]
    dominated: int = 0
    """Layouts left out: ETP > 1 at an EP whose EP·ETP is also reachable with ETP 1 (same
    expert shards and footprint, more routed tokens per GPU, ranks below it)."""

    def skeleton(self, ep: int) -> Skeleton:
        return Skeleton(self.tp, self.split, ep, self.etp, self.mbs)


def groups(m: ModelSection, n: int, nvlink: int, gbs: int, mbs: int | None,
           constraints: dict[str, list[int]], rej: Rejections) -> Iterator[Group]:
    """Every (TP, PP split, ETP, MBS) with the EPs and CPs it allows; the DP each CP implies
    must divide the global batch (world.gbs-divisible)."""
    layouts = 0
    for found, group in enumerate(_groups(m, n, nvlink, gbs, mbs, constraints, rej), 1):
        layouts += len(group.eps) * len(group.cps)
        if found > MAX_GROUPS or layouts > MAX_LAYOUTS:
            rej.add(f"search bounded: stopped after {found - 1:,} layout families "
                    f"(limits {MAX_GROUPS:,} families, {MAX_LAYOUTS:,} layouts); the families "
                    "from here on (larger TP / PP) were not priced: narrow the search with "
                    "constraints (e.g. pipeline_model_parallel_size) to see them",
                    f"TP{group.tp} PP{group.split.pp}")
            return
        yield group


def _groups(m: ModelSection, n: int, nvlink: int, gbs: int, mbs: int | None,
            constraints: dict[str, list[int]], rej: Rejections) -> Iterator[Group]:
    experts = int(m.num_moe_experts or 0)
    layers = int(m.num_layers or 0)
    for tp in tp_values(m, n, nvlink, constraints, rej):
        for pp in _allowed(constraints, "pipeline_model_parallel_size", divisors(n // tp)):
            if pp > layers:
                rej.add("PP larger than num_layers (pipeline.layers-divisible-by-pp)", f"PP{pp}")
                continue
            cps = cp_values(m, n // (tp * pp), tp, constraints, rej)
            cps = [c for c in cps if _gbs_ok(gbs, n // (tp * pp * c), 1, rej)]
            if not cps:
                continue
            splits = [s for s in pipeline_splits(m, pp)
                      if _allowed(constraints, "virtual_pipeline_model_parallel_size", [s.vpp])]
            pairs = _expert_pairs(experts, n, pp, tp, constraints, rej)
            by_etp: dict[int | None, list[int]] = {}
            for ep, etp in pairs:
                by_etp.setdefault(etp, []).append(ep)
            plain = set(by_etp.get(1, ()))
            for split in splits:
                for etp, eps in by_etp.items():
                    keep = [e for e in eps if not etp or etp == 1 or e * etp not in plain]
                    for b in _mbs_values(mbs, constraints):
                        ok = tuple(c for c in cps if gbs % (n // (tp * pp * c) * b) == 0)
                        if keep and ok:
                            yield Group(tp, split, etp, b, tuple(sorted(keep)), ok,
                                        (len(eps) - len(keep)) * len(ok))


def _gbs_ok(gbs: int, dp: int, mbs: int, rej: Rejections) -> bool:
    if gbs % (dp * mbs):
        rej.add(f"global_batch_size {gbs} not divisible by DP·MBS (world.gbs-divisible)",
                f"DP{dp}")
        return False
    return True


def _mbs_values(mbs: int | None, constraints: dict[str, list[int]]) -> list[int]:
    if mbs is not None:
        return [mbs]
    return _allowed(constraints, "micro_batch_size", [b for b in (1, 2, 4, 8) if b <= MAX_MBS])


def _expert_pairs(experts: int, n: int, pp: int, tp: int, constraints: dict[str, list[int]],
                  rej: Rejections) -> list[tuple[int, int | None]]:
    """(EP, ETP): EP divides the experts and ETP·EP·PP divides the world; ETP is 1 (Bridge's
    MoE recipes) or TP (Megatron-Core's default when unset) unless constrained."""
    if not experts:
        return [(1, None)]
    etps = sorted({1, tp})
    if "expert_tensor_parallel_size" in constraints:
        etps = constraints["expert_tensor_parallel_size"]
    out: list[tuple[int, int | None]] = []
    for ep in _allowed(constraints, "expert_model_parallel_size", divisors(experts)):
        for etp in etps:
            if n % (ep * etp * pp):
                rej.add("world size not divisible by ETP·EP·PP (world.edp-divisible)",
                        f"EP{ep} ETP{etp} PP{pp}")
                continue
            out.append((ep, etp))
    return out


def bubble_fraction(pp: int, vpp: int, microbatches: int) -> float:
    """Pipeline bubble of (interleaved) 1F1B relative to the ideal step: (PP - 1) / (VPP·M)."""
    return (pp - 1) / (vpp * microbatches) if microbatches else 0.0


def cp_start(seq: int) -> int:
    """The long-context skill's starting CP: seq_length / 4096 rounded to a power of two."""
    target = max(seq / 4096, 1.0)
    lo = 1 << (int(target).bit_length() - 1)
    return lo if target / lo <= (2 * lo) / target else 2 * lo


def cp_rule_applies(start: int) -> bool:
    """Whether the skill's CP = seq / 4096 is the start the ranking aims at: inside the
    long-context skill's 32K-256K scope, i.e. where seq / 4096 rounds to CP 8 or more (the
    planner's tie-break and the plan's answer read it from the same start). Below it ties go
    to the smallest CP, as NVIDIA's 8K-16K recipes run."""
    return start * 4096 >= LONG_CONTEXT
