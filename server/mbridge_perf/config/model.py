"""TrainingConfig: one typed view of a Megatron Bridge ConfigContainer, plus env and cluster.

Section and field names are Bridge's verbatim so users can paste what they have. Only the fields
the tools reason about are modelled; every other field a real section accepts is carried through
untouched (see ``known_fields``) and reported as "not used". Derived values (DP, EDP,
microbatches, layer placement) live in ``derived.py`` and are never stored here.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

# Bounds that catch typos and absurd inputs (10**9 layers) long before arithmetic overflows;
# all far above anything trained today.
MAX_LAYERS = 10_000
MAX_WIDTH = 1_048_576
MAX_HEADS = 65_536
MAX_VOCAB = 16_777_216
MAX_SEQ = 16_777_216
MAX_PARALLEL = 131_072
MAX_EXPERTS = 65_536
MAX_BATCH = 16_777_216
MAX_GPUS = 1_048_576

def _size(maximum: int, desc: str, default: int | None = None) -> Any:
    return Field(default, ge=1, le=maximum, description=desc)


class Section(BaseModel):
    """Base for a config section: unknown names are kept (checked later against the real
    dataclass field lists) so a pasted Bridge dump round-trips."""

    # strict: `true` or "4" for a size is a mistake to report, not a value to coerce
    model_config = ConfigDict(extra="allow", populate_by_name=True, validate_default=False,
                              strict=True)

    def carried(self) -> dict[str, Any]:
        """Fields the user gave that this project does not model."""
        return dict(self.__pydantic_extra__ or {})


RecomputeModule = str  # validated by rules against the pinned label set, not by the type
DispatcherType = Literal["allgather", "alltoall", "flex", "alltoall_seq"]


class ModelSection(Section):
    """`model`: GPTModelProvider / TransformerConfig / ModelParallelConfig fields."""

    # architecture
    # 0 loads (Bridge's vanilla_gpt recipe leaves its sizes at 0); a rule reports it as an error
    num_layers: int | None = Field(None, ge=0, le=MAX_LAYERS, description="transformer layers")
    hidden_size: int | None = Field(None, ge=0, le=MAX_WIDTH, description="model width h")
    ffn_hidden_size: int | None = _size(MAX_WIDTH, "dense MLP width")
    num_attention_heads: int | None = Field(None, ge=0, le=MAX_HEADS,
                                            description="attention heads a")
    num_query_groups: int | None = _size(MAX_HEADS, "KV heads (GQA groups); None = MHA")
    kv_channels: int | None = _size(MAX_WIDTH, "head dim; None = hidden/heads")
    vocab_size: int | None = _size(MAX_VOCAB, "tokenizer vocabulary before padding")
    make_vocab_size_divisible_by: int = _size(MAX_VOCAB, "vocab padding divisor", 128)
    share_embeddings_and_output_weights: bool = False
    gated_linear_unit: bool = False
    activation_func: Any = None
    normalization: Literal["LayerNorm", "RMSNorm"] = "LayerNorm"
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    qk_layernorm: bool = False
    position_embedding_type: Literal["learned_absolute", "rope", "mrope", "yarn", "none"] = (
        "learned_absolute")
    seq_length: int | None = _size(MAX_SEQ, "training sequence length s")
    max_position_embeddings: int | None = _size(MAX_SEQ, "position table size")
    attention_dropout: float = Field(0.1, ge=0, le=1)
    hidden_dropout: float = Field(0.1, ge=0, le=1)
    attention_backend: Literal["auto", "flash", "fused", "unfused", "local"] | Any = "auto"
    transformer_impl: Literal["transformer_engine", "local", "inference_optimized"] = (
        "transformer_engine")
    experimental_attention_variant: str | None = None
    # MoE
    num_moe_experts: int | None = _size(MAX_EXPERTS, "routed experts")
    moe_router_topk: int = _size(MAX_EXPERTS, "experts per token", 2)
    moe_ffn_hidden_size: int | None = _size(MAX_WIDTH, "routed expert FFN width")
    moe_shared_expert_intermediate_size: int | None = Field(None, ge=0, le=MAX_WIDTH)
    moe_layer_freq: int | list[int] = 1
    moe_grouped_gemm: bool = False
    moe_token_dispatcher_type: DispatcherType = "allgather"
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep", "ncclep"] | None = "deepep"
    moe_shared_expert_overlap: bool = False
    moe_router_dtype: str | None = None  # MCore casts for fp32 / fp64 only; others are ignored
    moe_expert_capacity_factor: float | None = None
    moe_pad_expert_input_to_capacity: bool = False
    moe_router_load_balancing_type: str | list[str] = "aux_loss"
    moe_router_pre_softmax: bool = False
    moe_router_score_function: Literal["softmax", "sigmoid", "sqrtsoftplus"] = "softmax"
    moe_router_enable_expert_bias: bool = False
    moe_router_num_groups: int | None = None
    moe_router_group_topk: int | None = None
    moe_router_force_load_balancing: bool = False
    moe_router_padding_for_quantization: bool = False
    moe_permute_fusion: bool = False
    moe_layer_recompute: bool = False
    # MLA
    multi_latent_attention: bool = False
    q_lora_rank: int | None = _size(MAX_WIDTH, "MLA query LoRA rank; None = full q proj")
    kv_lora_rank: int = _size(MAX_WIDTH, "MLA KV LoRA rank", 512)
    qk_head_dim: int = _size(MAX_WIDTH, "MLA q/k head dim (no rope part)", 128)
    qk_pos_emb_head_dim: int = _size(MAX_WIDTH, "MLA rope head dim", 64)
    v_head_dim: int = _size(MAX_WIDTH, "MLA value head dim", 128)
    # MTP
    mtp_num_layers: int | None = Field(None, ge=0, le=MAX_LAYERS)
    # parallelism
    tensor_model_parallel_size: int = _size(MAX_PARALLEL, "TP", 1)
    pipeline_model_parallel_size: int = _size(MAX_PARALLEL, "PP", 1)
    virtual_pipeline_model_parallel_size: int | None = _size(MAX_PARALLEL, "VPP chunks/stage")
    context_parallel_size: int = _size(MAX_PARALLEL, "CP", 1)
    expert_model_parallel_size: int = _size(MAX_PARALLEL, "EP", 1)
    expert_tensor_parallel_size: int | None = _size(MAX_PARALLEL, "ETP; None = TP")
    sequence_parallel: bool = False
    num_layers_in_first_pipeline_stage: int | None = Field(None, ge=0, le=MAX_LAYERS)
    num_layers_in_last_pipeline_stage: int | None = Field(None, ge=0, le=MAX_LAYERS)
    pipeline_model_parallel_layout: str | list[Any] | None = None
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False
    pipeline_dtype: Any = None
    cp_comm_type: str | list[str] | None = None
    hierarchical_context_parallel_sizes: list[int] | None = None
    # recompute
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = Field(None, ge=0, le=MAX_LAYERS)
    recompute_modules: list[RecomputeModule] | None = None
    distribute_saved_activations: bool | None = None
    # offloading
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = Field(0, ge=0, le=MAX_LAYERS)
    cpu_offloading_activations: bool = True
    cpu_offloading_weights: bool = False
    fine_grained_activation_offloading: bool = False
    offload_modules: list[str] | None = None
    # CUDA graphs
    cuda_graph_impl: str = "none"
    cuda_graph_scope: str | list[str] | None = None
    cuda_graph_modules: str | list[str] | None = None  # "full" / "attn,mlp" read as MCore does
    cuda_graph_warmup_steps: int = Field(3, ge=0, le=1_000_000)
    use_te_rng_tracker: bool = False
    enable_cuda_graph: bool = False
    external_cuda_graph: bool = False
    # precision (TransformerConfig side; `mixed_precision` may override)
    bf16: bool = False
    fp16: bool = False
    params_dtype: Any = None
    fp8: str | None = None
    fp8_recipe: str = "delayed"
    fp8_param: bool = False
    fp4: str | None = None
    fp4_recipe: str | None = None
    fp4_param: bool = False
    first_last_layers_bf16: bool = False
    num_layers_at_start_in_bf16: int = Field(1, ge=0, le=MAX_LAYERS)
    num_layers_at_end_in_bf16: int = Field(1, ge=0, le=MAX_LAYERS)
    # misc training behaviour
    calculate_per_token_loss: bool = False
    gradient_accumulation_fusion: bool = False
    deterministic_mode: bool = False
    cross_entropy_loss_fusion: bool = True
    apply_rope_fusion: bool = False
    rotary_interleaved: bool = False


class TrainSection(Section):
    """`train`: batch shape and length of the run."""

    micro_batch_size: int = _size(MAX_BATCH, "MBS", 1)
    global_batch_size: int | None = _size(MAX_BATCH, "GBS")
    train_iters: int | None = Field(None, ge=0, le=10**12)


class OptimizerSection(Section):
    """`optimizer`: Megatron-Core OptimizerConfig."""

    optimizer: Literal["adam", "sgd", "muon", "dist_muon"] | str = "adam"
    use_distributed_optimizer: bool = False
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = Field(0.0, ge=0.0, le=1.0)
    use_precision_aware_optimizer: bool = False
    main_grads_dtype: Any = None
    main_params_dtype: Any = None
    exp_avg_dtype: Any = None
    exp_avg_sq_dtype: Any = None
    decoupled_weight_decay: bool = True
    bf16: bool = False
    fp16: bool = False


ShardingStrategy = Literal["no_shard", "optim", "optim_grads", "optim_grads_params"]


class DDPSection(Section):
    """`ddp`: DistributedDataParallelConfig (and Megatron-FSDP switches)."""

    use_distributed_optimizer: bool = False
    use_megatron_fsdp: bool = False
    data_parallel_sharding_strategy: ShardingStrategy = "no_shard"
    grad_reduce_in_fp32: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    average_in_collective: bool = False
    nccl_ub: bool = False
    fsdp_manual_registration: bool = False


class MixedPrecisionSection(Section):
    """`mixed_precision`: Bridge MixedPrecisionConfig, applied onto the model at setup."""

    bf16: bool | None = None
    fp16: bool | None = None
    fp8: str | None = None
    fp8_recipe: str | None = None
    fp8_param: bool | None = None
    fp8_param_gather: bool | None = None
    fp4: str | None = None
    fp4_recipe: str | None = None
    grad_reduce_in_fp32: bool | None = None
    reuse_grad_buf_for_mxfp8_param_ag: bool | None = None
    first_last_layers_bf16: bool | None = None
    num_layers_at_start_in_bf16: int | None = Field(None, ge=0, le=MAX_LAYERS)
    num_layers_at_end_in_bf16: int | None = Field(None, ge=0, le=MAX_LAYERS)


class CommOverlapSection(Section):
    """`comm_overlap`: Bridge CommOverlapConfig."""

    tp_comm_overlap: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    overlap_p2p_comm: bool | None = None
    batch_p2p_comm: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None


class ClusterSection(Section):
    """`cluster` (ours): where the job runs."""

    model_config = ConfigDict(extra="forbid")

    num_gpus: int | None = _size(MAX_GPUS, "total GPUs (world size)")
    gpus_per_node: int | None = _size(1024, "GPUs per node")
    gpu: str | None = Field(None, description="GPU kind from the catalog, e.g. H100, GB200")


# Bridge ConfigContainer sections this project carries but does not model.
CARRIED_SECTIONS = (
    "dataset", "checkpoint", "logger", "scheduler", "tokenizer", "rng", "dist", "profiling",
    "rerun_state_machine", "peft", "validation", "ft", "straggler", "nvrx_straggler",
    "inprocess_restart", "tensor_inspect", "env_vars",
)


class TrainingConfig(Section):
    """The one configuration type every tool reads. Other ConfigContainer sections
    (CARRIED_SECTIONS) are kept as given in the extras."""

    model_config = ConfigDict(strict=False)  # sections arrive as mappings; each is strict

    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection = Field(default_factory=TrainSection)
    optimizer: OptimizerSection = Field(default_factory=OptimizerSection)
    ddp: DDPSection = Field(default_factory=DDPSection)
    mixed_precision: MixedPrecisionSection | str | None = None
    comm_overlap: CommOverlapSection | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    # how the loader chose the base from perf-harness flags (config.load.source_notes)
    _source_notes: list[str] = PrivateAttr(default_factory=list)
    # the shipped Bridge recipe this config is, unmodified (config.load.shipped_recipe)
    _shipped_recipe: tuple[str, str] | None = PrivateAttr(default=None)

    @property
    def overlap(self) -> CommOverlapSection:
        return self.comm_overlap or CommOverlapSection()
