"""The MCP tools: each a plain function whose typed signature is its input schema, whose
return type is its output schema and whose docstring is its description. ``TOOLS`` lists them
with their titles and annotations, in the order tools/list shows them; server.py registers
them (behind its one error path). A tool that needs server state takes a ``Context`` (which
the SDK injects and leaves out of the input schema) or calls a module-level accessor."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from mbridge_perf.advise.oom import OOMDiagnosis
from mbridge_perf.advise.parallelism import ParallelismPlan, PlanConstraints
from mbridge_perf.advise.recompute import RecomputePlan
from mbridge_perf.bench.reports import RunComparison, RunHandle, RunResult, RunStatus
from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.load import ConfigSource, load_source
from mbridge_perf.config.model import MAX_GPUS
from mbridge_perf.evals.grade import Grade
from mbridge_perf.memory.estimate import MemoryReport
from mbridge_perf.rules.validate import ValidationReport
from mbridge_perf.skillpack.pack import find_pack_root
from mbridge_perf.steptime import StepTimeReport

# All four hints set on purpose (clients treat a missing destructiveHint as true).
PURE = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                       open_world_hint=False)
CLUSTER = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                          open_world_hint=True)
SUBMIT = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                         open_world_hint=True)
CANCEL = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                         open_world_hint=True)


class PresetInfo(BaseModel):
    name: str = Field(description="preset name to pass as preset")
    params_b: float = Field(description="published total parameters, billions")
    active_params_b: float | None = Field(description="published active parameters per token "
                                                      "(MoE), billions")
    num_layers: int | None
    hidden_size: int | None
    num_moe_experts: int | None
    source: str = Field(description="where the architecture numbers come from")


class PresetList(BaseModel):
    presets: list[PresetInfo]


RunId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                             description="run id returned by submit_benchmark")]


def _config(src: ConfigSource, what: str = "config") -> Any:
    try:
        return load_source(src)
    except ConfigError as exc:
        where = "" if what == "config" else f"{what} "
        raise ToolError(f"{where}{exc}. Fix that field and call again.") from None


def pack_root(ctx: Context) -> Path:
    """The skill pack the serving server was built on (server.build_server sets it)."""
    root: Path | None = getattr(ctx.mcp_server, "pack_root", None)
    return root or find_pack_root()


def _service() -> Any:
    """The benchmark service (executors, SQLite registry), imported on first use, not at
    start-up: long work behind job handles; no call blocks longer than 30 s."""
    from mbridge_perf.bench import service as svc

    return svc


# ------------------------------------------------------------------ config and memory

def validate_config(
        config: Annotated[ConfigSource, Field(description="The training config to check.")],
        baseline: Annotated[ConfigSource | None, Field(
            description="Optional: the config before the user's change.")] = None,
        mcore_version: Annotated[str, Field(
            description="Megatron-Core release whose checks apply: 0.19.2 (the one "
                        "Megatron Bridge 0.6.2 ships, default) or 0.16.1; other patches "
                        "of those lines are accepted.", max_length=32)] = "0.19.2",
) -> ValidationReport:
    """Check a Megatron Bridge training config against Megatron-Core / Megatron Bridge
    constraints and the skills' documented hazards before launching, or to explain a
    start-up error. Returns ok, findings (rule_id, severity error|warning|info, message with
    the user's values, fields, the fix as a config change, the skill that documents it),
    derived sizes (DP, expert DP, microbatches, layers per pipeline stage) and the fields
    accepted but not used. Give baseline (the config before the user's change) to also
    judge the change itself, e.g. TP raised or VPP changed to fix an OOM. Pure check:
    runs nothing, needs no GPU."""
    from mbridge_perf.rules import validate

    cfg = _config(config)
    base = _config(baseline, "baseline") if baseline is not None else None
    try:
        return validate(cfg, base, mcore_version)
    except ConfigError as exc:
        raise ToolError(f"{exc}. Fix that argument and call again.") from None


def estimate_memory(
        config: Annotated[ConfigSource, Field(description="The training config to size.")],
        gpu: Annotated[str | None, Field(
            description="GPU kind, e.g. 'H100', 'GB200' (default: the config's "
                        "cluster.gpu); needed for fits / headroom.")] = None,
        imbalance: Annotated[float, Field(
            ge=1.0, le=64.0, description="MoE routing imbalance: tokens on the busiest "
                                         "expert over the mean (1.0 = perfectly "
                                         "balanced).")] = 1.0,
) -> MemoryReport:
    """Estimate per-GPU memory of a Megatron Bridge training config for every pipeline
    stage before launching, or to explain an OOM: weights, gradients and optimizer state
    (static_gib), activations with micro-batches in flight, embedding / logits terms and
    the peak allocated per stage; the most-loaded stage; the allocator's reserved-but-
    unallocated band (where fragmentation OOMs live; narrower with
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); with per-layer CUDA graphs the
    replayed steady state and the graphs' private pool; CUDA context, NCCL and instantiated
    graphs outside the allocator; per phase what the process needs, and the verdict on the
    GPU: fits / tight (the decision flips inside the reserved band or the estimator's margin)
    / does_not_fit, with the term that decides it; assumptions and what is not modelled. All
    sizes in GiB (2^30 bytes). Megatron logs decimal GB: 58.8 GB = 54.8 GiB. Also
    answer_markdown: the estimate read as the memory skill answers it, verdict first. Pure
    arithmetic, needs no GPU; validate_config checks the config's legality."""
    from mbridge_perf.memory.answer import estimate_with_answer as estimate

    cfg = _config(config)
    return estimate(cfg, gpu=gpu, imbalance=imbalance)


def estimate_step_time(
        config: Annotated[ConfigSource, Field(description="The training config to time (its "
                                                          "layout, batch and precision).")],
        gpu: Annotated[str | None, Field(
            max_length=64, description="GPU kind, e.g. 'H100', 'GB200' (default: the "
                                       "config's cluster.gpu).")] = None,
) -> StepTimeReport:
    """Predict the step time of one global batch on the config's layout: compute per op class
    against the GPU's dense peak for the precision in use x a calibrated efficiency, exposed
    TP / CP / EP / PP communication, the pipeline bubble, recompute's extra forward, DP/EDP
    gradient and parameter traffic and the optimizer step. Returns step_time_s,
    tokens_per_s_per_gpu, model_tflops_per_gpu (NVIDIA's model-FLOP convention, comparable
    with Bridge's tables), mfu, band_s (from the calibration's out-of-sample errors: layouts
    within each other's band are a tie, measure them with submit_benchmark) and the
    breakdown with what each term assumes. Calibrated on Megatron Bridge's published tables;
    its out-of-sample error is printed by benchmarks/steptime_accuracy.py. Pure arithmetic,
    needs no GPU."""
    from mbridge_perf.steptime import estimate_step_time as estimate

    return estimate(_config(config), gpu=gpu)


# ------------------------------------------------------------------ advise (advise/)

def recommend_recompute(
        config: Annotated[ConfigSource, Field(description="The training config to fit.")],
        target_gib: Annotated[float | None, Field(
            gt=0, le=10_000, description="Memory budget per GPU in GiB (default: the "
                                         "capacity of cluster.gpu / gpu).")] = None,
        gpu: Annotated[str | None, Field(
            description="GPU kind, e.g. 'H100' (default: the config's cluster.gpu).")
        ] = None,
) -> RecomputePlan:
    """Run the skills' memory ladder on the user's config, in order of cost, each rung
    priced by the estimator and checked by the validator: the allocator setting
    (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, free), the selective-recompute
    module the attention backend and architecture call for (core_attn only with unfused
    attention; mla_up_proj, moe_act, layernorm, mlp last), full recompute with
    recompute_method and the smallest recompute_num_layers that fits, optimizer CPU
    offload, activation offload where PP = 1. Never a TP increase or VPP change. Returns
    steps (action, config_changes as dotted overrides, est_peak_gib of the most-loaded
    stage, est_saving_gib, throughput_cost - the skills' measured figure, else the step-time
    model's predicted change, else a FLOPs ratio - with its basis and source, verdict
    fits / tight / does_not_fit, rationale, skill); the ladder stops at the first step that
    fits or is tight (first_fitting_step; later steps are marked optional margin) and a
    config that already fits gets no steps; scenario (fragmentation / capacity / tight /
    fits) and answer_markdown. Pure arithmetic, needs no GPU."""
    from mbridge_perf.advise.recompute import recommend_recompute as recommend

    cfg = _config(config)
    return recommend(cfg, target_gib=target_gib, gpu=gpu)


def diagnose_oom(
        text: Annotated[str, Field(description="The CUDA OOM message or the training "
                                               "log's tail (any length; the last 2 M "
                                               "characters are read).")],
        config: Annotated[ConfigSource | None, Field(
            description="Optional: the run's config, for a recommend_recompute plan.")
        ] = None,
) -> OOMDiagnosis:
    """Classify a GPU out-of-memory failure from its text: PyTorch CUDA OOM messages
    (current and legacy 1.x / 2.0 shapes), Megatron / Bridge per-rank memory lines,
    driver / NCCL OOMs. fragmentation (large reserved-but-unallocated band next to the
    failed request, one rank of many, CUDA-graph capture) vs capacity (small band,
    allocator already set) vs none (no OOM: NCCL timeout, host OOM, ...). Returns the
    numbers read, per-rank lines, the skills' failure-table row with its fix, with a
    config the recommend_recompute plan, and answer_markdown. Reads the text only."""
    from mbridge_perf.advise.oom import diagnose_oom as diagnose

    cfg = _config(config) if config is not None else None
    return diagnose(text, cfg)


def plan_parallelism(
        config: Annotated[ConfigSource, Field(
            description="The model and training setup: {preset: 'deepseek-v3'} or the "
                        "Bridge config (its precision, recompute, optimizer and offload "
                        "are kept; its parallel sizes are what is planned).")],
        num_gpus: Annotated[int, Field(ge=1, le=MAX_GPUS, description="GPU count.")],
        gpu: Annotated[str, Field(max_length=64, description="GPU kind, e.g. 'H100', "
                                                             "'GB200'.")],
        seq_length: Annotated[int, Field(ge=1, le=16_777_216,
                                         description="Training sequence length.")],
        global_batch_size: Annotated[int, Field(ge=1, le=100_000_000,
                                                description="Global batch size (GBS).")],
        micro_batch_size: Annotated[int | None, Field(
            ge=1, le=4096, description="Fixed MBS (default: searched, 1 first).")] = None,
        top_k: Annotated[int, Field(ge=1, le=50, description="Layouts to return.")] = 10,
        constraints: Annotated[PlanConstraints | None, Field(
            description="Allowed values per size (Bridge names), e.g. "
                        "{expert_tensor_parallel_size: [1]}.")] = None,
) -> ParallelismPlan:
    """Every valid parallel layout (TP, PP, VPP with uneven splits as Bridge writes them,
    CP, EP, ETP, DP, EDP, MBS) of a model on num_gpus GPUs, with Parallel Folding
    (TP·CP·DP·PP = N, ETP·EP·EDP·PP = N) and the divisibility rules, priced per pipeline
    stage by estimate_memory with the config's recompute / offload, and ranked by predicted
    tokens/s/GPU (estimate_step_time; layouts within the model's pair band are a tie, listed
    in tied_with) and, within a tie, the way the skills and Bridge's tuned MoE recipes rank:
    fits with headroom, CP no larger than seq_length / 4096, smallest TP, EP before ETP, the
    experts' all-to-all inside the fewest NVLink domains, most DP, CP nearest
    seq_length / 4096, fewest pipeline stages and bubbles. min_gpus = PP·lcm(TP·CP, EP·ETP)
    is reported per layout; a tied #1 comes with an A/B suggestion in notes.
    Says when a layout fits only with a selective-recompute module or optimizer offload
    (never full recompute at long context). Returns layouts (sizes, both meshes, per-stage
    peaks, headroom, micro-batches, bubble fraction, predicted step time and tokens/s/GPU,
    config_changes, reasons), the
    long-context skill's published layout for the case when one applies (priced, its rank
    and what ranks above it), rejected families with the rule or memory number, counts and
    answer_markdown. Pure arithmetic, needs no GPU."""
    from mbridge_perf.advise.parallelism import plan_parallelism as plan

    cfg = _config(config)
    return plan(cfg, num_gpus, gpu, seq_length, global_batch_size,
                micro_batch_size=micro_batch_size, top_k=top_k, constraints=constraints)


# ------------------------------------------------------------------ presets and evals

def list_presets() -> PresetList:
    """List the model presets (Llama3, Qwen3, Qwen3-Next, DeepSeek-V3, Moonlight, GPT-OSS,
    Mixtral, Nemotron-H): name, published total and active parameter counts, layers,
    hidden size, experts and the source of the architecture. Pass a name as
    config.preset to the other tools instead of spelling out the model section."""
    from mbridge_perf.config.presets import load_presets

    out = []
    for name, p in load_presets().items():
        m = p.model
        out.append(PresetInfo(name=name, params_b=p.published_params_b,
                              active_params_b=p.active_params_b,
                              num_layers=m.get("num_layers"), hidden_size=m.get("hidden_size"),
                              num_moe_experts=m.get("num_moe_experts"), source=p.source))
    return PresetList(presets=out)


def grade_answer(
        answer: Annotated[str, Field(
            min_length=1, max_length=200_000,
            description="The draft answer: Markdown, or the JSON a tool returned (its "
                        "answer_markdown is graded).")],
        ctx: Context,
        skill: Annotated[str | None, Field(
            description="Grade against this skill's answer checklist, e.g. "
                        "'nemo-mbridge-perf-memory-tuning'.")] = None,
        case_id: Annotated[str | None, Field(
            description="Or grade against one evals.json case (its checks and "
                        "checklist).")] = None,
        tool_calls: Annotated[list[str] | None, Field(
            max_length=200, description="Tools called while answering, for the case's "
                                        "required / forbidden tool checks.")] = None,
) -> Grade:
    """Self-check a draft answer before sending it: does it recommend the skill's
    checklist items in the documented order (allocator fix first, selective recompute
    by architecture, mlp last, ...), avoid the unsafe or incompatible advice a case
    forbids (TP raised first for a fragmentation OOM, CPU offload with PP > 1, VPP as a
    memory fix), and name only knobs that exist? Matching is normalised (TP=8 =
    tensor_model_parallel_size=8) and negation-aware ("do not raise TP" is a mention,
    not advice). Give skill or case_id. Returns passed, expectations (text, passed,
    evidence span, critical) and summary. Deterministic, reads nothing but the pack."""
    from mbridge_perf.evals.selfcheck import grade_text

    return grade_text(pack_root(ctx), answer, skill=skill, case_id=case_id,
                      tool_calls=tool_calls)


# ------------------------------------------------------------------ benchmarks (bench/)

def submit_benchmark(
        config: Annotated[ConfigSource, Field(description="The training config to run.")],
        profile: Annotated[str, Field(
            description="Cluster profile name: a built-in ('cpu-test') or the stem of a "
                        "YAML file in the user's profile directory "
                        "($MBRIDGE_PERF_PROFILES, default ~/.config/mbridge-perf/"
                        "profiles).")],
        dry_run: Annotated[bool, Field(
            description="True (default): render the job script and the contract, submit "
                        "nothing. False: submit it (spends cluster time).")] = True,
        steps: Annotated[int | None, Field(
            ge=50, le=1_000_000, description="Training steps (default: train.train_iters "
                                             "or 50; the contract needs >= 50).")] = None,
        window_start: Annotated[int, Field(ge=1, description="First iteration of the "
                                                             "steady-state window.")] = 41,
        window_end: Annotated[int, Field(ge=1, description="Last iteration of the "
                                                           "window.")] = 50,
        label: Annotated[Literal["training-equivalent", "benchmark-only"] | None, Field(
            description="Acceptance class; forced load balancing makes a run "
                        "benchmark-only.")] = None,
        recipe: Annotated[str | None, Field(
            pattern=r"^[A-Za-z0-9_.]+$", max_length=200,
            description="Megatron Bridge recipe for the run_recipe.py launcher, e.g. "
                        "'llama3_8b_pretrain_config'; the config's values override "
                        "it.")] = None,
) -> RunHandle:
    """Run a training benchmark on the user's cluster (Slurm) or locally, under a frozen
    measurement contract (versions, hardware, layout, precision, recompute, dispatcher,
    overlap, graphs, steady-state window). Dry run by default: returns the rendered batch
    script and contract so the user can review them; with dry_run=false it submits and
    returns a job handle at once (run_id, executor job id, poll_after_s) — then poll
    benchmark_status and fetch benchmark_result. The config is validated first; a config
    Megatron would refuse is not submitted. Runs are kept in a registry that survives
    server restarts."""
    cfg = _config(config)
    prof = _service().named_profile(profile)
    return _service().submit(cfg, prof, dry_run=dry_run, steps=steps,
                            window=(window_start, window_end), label=label, recipe=recipe)


async def benchmark_status(
        run_id: RunId,
        ctx: Context,
        wait_s: Annotated[float, Field(
            ge=0, le=30, description="Wait up to this many seconds (max 30) for the run "
                                     "to finish, with progress notifications.")] = 0,
) -> RunStatus:
    """State of a submitted benchmark (pending, running, completed, failed, cancelled,
    timeout, lost, unknown), its progress (last iteration logged of the steps asked for),
    exit code and the executor's message. With wait_s it polls for up to 30 s and sends
    progress notifications; call again if the run is still going."""
    import anyio

    deadline = anyio.current_time() + wait_s
    while True:
        st = await anyio.to_thread.run_sync(lambda: _service().status(run_id))
        if st.progress_pct is not None:
            await ctx.report_progress(st.progress_pct, 100.0,
                                      f"{st.state}: iteration {st.last_iteration or 0}"
                                      f"/{st.steps}")
        remaining = deadline - anyio.current_time()
        if st.terminal or remaining <= 0:
            return st
        await anyio.sleep(min(2.0, remaining))


def benchmark_result(
        run_id: RunId,
        golden_tflops: Annotated[float | None, Field(
            gt=0, description="Golden TFLOP/s/GPU to check a regression against.")] = None,
        regression_pct: Annotated[float, Field(
            gt=0, le=100, description="Allowed drop below golden, percent.")] = 5.0,
) -> RunResult:
    """Judge a finished benchmark from its log against its contract: validity gates
    (enough steps, finite losses, no skipped / NaN iterations in the window, requested
    features evidenced), steady-window metrics (median and spread of step time,
    TFLOP/s/GPU, tokens/s/GPU, peak allocated / reserved), regression against a golden
    value, and an evidence bundle as JSON and Markdown. Errors if the run has not
    finished."""
    return _service().result(run_id, golden_tflops=golden_tflops,
                            regression_pct=regression_pct)


def cancel_benchmark(run_id: RunId) -> RunStatus:
    """Cancel a benchmark this server submitted (scancel / kill of its own job only;
    jobs it did not create are refused). Finished runs are left as they are."""
    return _service().cancel(run_id)


def compare_benchmarks(run_a: RunId, run_b: RunId) -> RunComparison:
    """A/B two finished benchmarks. Valid only when their contracts differ in exactly one
    variable (e.g. the dispatcher) and both results are valid; otherwise it names the
    extra differences. Reports deltas of step time, TFLOP/s/GPU, tokens/s/GPU and peak
    memory, absolute and in percent."""
    return _service().compare_runs(run_a, run_b)


# (tool, title, annotations), in tools/list order.
TOOLS: list[tuple[Callable[..., Any], str, ToolAnnotations]] = [
    (validate_config, "Validate a training config", PURE),
    (estimate_memory, "Estimate per-GPU memory", PURE),
    (estimate_step_time, "Estimate the step time", PURE),
    (recommend_recompute, "Recommend recompute / memory steps", PURE),
    (diagnose_oom, "Diagnose a GPU OOM", PURE),
    (plan_parallelism, "Plan parallel layouts", PURE),
    (list_presets, "List model presets", PURE),
    (grade_answer, "Grade an answer against a skill's checklist", PURE),
    (submit_benchmark, "Submit a benchmark (dry run by default)", SUBMIT),
    (benchmark_status, "Benchmark status", CLUSTER),
    (benchmark_result, "Benchmark result", CLUSTER),
    (cancel_benchmark, "Cancel a benchmark", CANCEL),
    (compare_benchmarks, "Compare two benchmarks", CLUSTER),
]
