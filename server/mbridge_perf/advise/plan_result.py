"""plan_parallelism's typed result: ranked layouts, rejected families and counts (apart from
the planner that fills them and the markdown that renders them)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from mbridge_perf.advise.published import PublishedLayout


class StagePeak(BaseModel):
    stage: int
    layers: int
    peak_allocated_gib: float


class PlannedLayout(BaseModel):
    """One ranked layout: the sizes, both meshes, per-stage memory and why it ranks here."""

    rank: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    virtual_pipeline_model_parallel_size: int | None
    context_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int | None
    micro_batch_size: int
    data_parallel_size: int
    expert_data_parallel_size: int | None
    min_gpus: int = Field(description="PP·lcm(TP·CP, EP·ETP): the smallest world this layout "
                                      "runs on")
    attention_mesh: str = Field(description="TP x CP x DP x PP = N")
    expert_mesh: str | None = Field(description="ETP x EP x EDP x PP = N (MoE)")
    pipeline_split: str = Field(description="how the layers go on the PP x VPP stages")
    tokens_per_cp_rank: int
    num_microbatches: int
    bubble_fraction: float = Field(description="(PP - 1) / (VPP x micro-batches)")
    fit: Literal["as_set", "with_rung", "no"] = Field(
        description="as_set: fits with the config's own recompute / offload; with_rung: "
                    "fits only with the rung named in `rung`; no: does not fit")
    rung: str | None = Field(description="the change that makes it fit (fit=with_rung)")
    per_stage: list[StagePeak]
    most_loaded_stage: int
    peak_allocated_gib: float
    headroom_gib: float | None
    fits_with_fragmentation: bool | None
    config_changes: dict[str, Any] = Field(description="dotted Bridge keys for this layout "
                                                       "(and its rung)")
    overrides: list[str]
    warnings: list[str] = Field(description="validator warnings on this layout")
    reasons: list[str] = Field(description="why it ranks here")
    predicted_step_time_s: float | None = Field(
        None, description="the step-time model's prediction for this layout (estimate_step_time)")
    predicted_tokens_per_s_per_gpu: float | None = Field(
        None, description="what the ranking orders by (faster first within a fit class)")
    predicted_band_s: float | None = Field(
        None, description="the prediction's out-of-sample error band")
    tied_with: list[int] = Field(
        default_factory=list, description="ranks predicted within the model's pair band of "
                                          "this one: a tie the model cannot order (A/B them)")


class RejectedFamily(BaseModel):
    family: str
    reason: str
    count: int


class PlanCounts(BaseModel):
    skeletons: int = Field(description="(TP, PP, VPP, EP, ETP, MBS) combinations")
    layouts: int = Field(description="layouts enumerated (skeletons x the CPs each allows)")
    priced: int = Field(description="layouts priced with estimate_memory")
    bounded: int = Field(description="layouts decided without pricing: by the CP / EP bound, "
                                     "MBS > 1 behind MBS 1, ETP > 1 behind ETP 1 at EP·ETP")
    rescue_estimates: int
    validated: int
    seconds: float


class ParallelismPlan(BaseModel):
    num_gpus: int
    gpu: str
    gpu_capacity_gib: float
    nvlink_domain: int
    seq_length: int
    global_batch_size: int
    cp_start: int = Field(description="seq_length / 4096 as a power of two (where the CP "
                                      "search starts)")
    layouts: list[PlannedLayout]
    published: list[PublishedLayout] = Field(
        description="the skills' published layouts for this model, GPU and sequence, priced "
                    "and placed in this ranking (empty when none applies)")
    rejected: list[RejectedFamily]
    counts: PlanCounts
    notes: list[str]
    answer_markdown: str
