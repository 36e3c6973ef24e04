"""Memory a training process uses beyond the tensors the model saves: constants per GPU kind,
NCCL buffers, CUDA-graph pools and the caching allocator's reserved-but-unallocated band.

Why separate from "allocated": Megatron's memory log (``torch.cuda.memory_stats()``) and every
published golden value count allocator-allocated bytes only. The CUDA context and NCCL live
outside the allocator; fragmentation is reserved, not allocated. A fit decision needs all of
them, a comparison with a log needs none of them, so each is a named term with its source.
Every constant below names where it comes from; none is fitted to a single run.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30


@dataclass(frozen=True, slots=True)
class Constant:
    value: float
    source: str


# CUDA context, kernel images and library handles, outside the torch allocator (per GPU).
CUDA_CONTEXT_GIB: dict[str, Constant] = {
    "ampere": Constant(0.75, "PyTorch forum 'What is the reason for pytorch's GPU memory "
                             "floor?' (723 MiB after the first CUDA call) and 'High gpu memory "
                             "overhead' (~700-800 MB); CUDA 11/12"),
    "hopper": Constant(0.75, "same PyTorch forum reports; CUDA 12 lazy module loading keeps "
                             "the context near this on H100/H200"),
    "blackwell": Constant(1.0, "not measured: Hopper figure plus 25 % for larger kernel "
                               "images (ESTIMATED)"),
}
CUDA_CONTEXT_DEFAULT = CUDA_CONTEXT_GIB["hopper"]

# Workspaces allocated through the torch allocator and resident for the whole run (cuBLAS /
# cuBLASLt handles per stream, Transformer Engine GEMM workspaces, Megatron's global memory
# buffer, RNG trackers). Counted in "allocated".
ALLOCATED_WORKSPACE = Constant(
    0.1, "median of (measured mem-allocated - computed model state) over the 352 modelled "
         "Megatron-LM CI golden rows: 0.099 GiB (A100 0.08, H100 0.12, GB200 0.11; "
         "../shared/data/memory/megatron-ci-goldens.csv); 7B TP4 golden +0.096 GiB "
         "(memory-estimation.md §10); cuBLAS and TE GEMM workspaces are 32 MiB each on Hopper")

# NCCL buffers per communicator a rank uses (cudaMalloc'd by NCCL, outside the allocator).
NCCL_COLLECTIVE_GIB = Constant(
    0.5, "NVIDIA/nccl#864 (~1.6 GB with one communicator doing all-reduce, ~6 GB with three "
         "or more) and #986 (memory scales with channels; ring needs two peers per channel)")
NCCL_P2P_GIB = Constant(0.25, "NVIDIA/nccl#1450: send/recv share one buffer per peer")
NCCL_ALLTOALL_GIB = Constant(
    3.0, "NVIDIA/nccl#1685: an intra-node all_to_all_single on 8x H100 raised NCCL memory from "
         "1.06 GB to 4.34 GB (32 channels per GPU pair)")

# Instantiated CUDA graphs (cudaGraphExec) and their driver bookkeeping, outside the allocator.
CUDA_GRAPH_FIXED = Constant(
    0.5, "no public per-node figure for instantiated graphs (cuda-graph-memory.md §5, open "
         "question); a floor (ESTIMATED). The graphs' pools and static buffers are priced "
         "inside the allocator (memory.graphs), not here")

# Reserved-but-unallocated band as a fraction of peak allocated: (low, high).
RESERVED_BAND = {
    False: ((0.05, 0.45), "without expandable segments: Moonlight 16B max reserved ~40 GB at "
                          "36.6 GB allocated (+9 %); Llama3-70B FP8 SFT OOM at 58.8 GB "
                          "allocated on an 80 GB H100 from fragmentation (reserved - allocated "
                          "> 40 %); Bridge skill cards"),
    True: ((0.02, 0.10), "with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow "
                         "in place; GPT-OSS-120B 69-70 GB allocated vs 72-73 GB reserved "
                         "(+4 %), Megatron-LM PR #6429 A2A overlap +9 % reserved"),
}


def expandable_segments(env: dict[str, str]) -> bool:
    conf = env.get("PYTORCH_CUDA_ALLOC_CONF", "") + "," + env.get("PYTORCH_ALLOC_CONF", "")
    return "expandable_segments:true" in conf.replace(" ", "").lower()


def cuda_context(architecture: str | None) -> Constant:
    return CUDA_CONTEXT_GIB.get(architecture or "", CUDA_CONTEXT_DEFAULT)


def nccl_bytes(*, tp: int, cp: int, dp: int, pp: int, ep: int, edp: int,
               alltoall: bool) -> float:
    """NCCL buffers for the communicators a rank uses (each counted once)."""
    gib = 0.0
    for size in (tp, cp, dp, edp if ep > 1 else 1):
        if size > 1:
            gib += NCCL_COLLECTIVE_GIB.value
    if pp > 1:
        gib += NCCL_P2P_GIB.value
    if ep > 1:
        gib += NCCL_ALLTOALL_GIB.value if alltoall else NCCL_COLLECTIVE_GIB.value
    return gib * GIB
