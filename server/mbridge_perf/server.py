"""MCP wiring only: tools, resources and prompts over the package's pure functions, and the
stdio / streamable-HTTP transports. No logic lives here that the CLI cannot reach."""

from __future__ import annotations

import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError, UnexpectedToolError
from mcp.shared.exceptions import MCPError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

from mbridge_perf import __version__
from mbridge_perf.advise.oom import OOMDiagnosis
from mbridge_perf.advise.parallelism import ParallelismPlan, PlanConstraints
from mbridge_perf.advise.recompute import RecomputePlan
from mbridge_perf.bench.reports import RunComparison, RunHandle, RunResult, RunStatus
from mbridge_perf.config.errors import ConfigError, type_problem
from mbridge_perf.config.load import ConfigSource, load_source
from mbridge_perf.config.model import MAX_GPUS
from mbridge_perf.evals.grade import Grade
from mbridge_perf.memory.estimate import MemoryReport
from mbridge_perf.rules.validate import ValidationReport
from mbridge_perf.skillpack.pack import CARD_FILE, SKILL_FILE, Skill, find_pack_root, list_skills

log = logging.getLogger("mbridge_perf.server")

INSTRUCTIONS = (
    "Megatron Bridge / Megatron-Core training-performance tools and skills. Pass the user's "
    "training config as they have it (a Bridge config mapping or YAML, a preset name, dotted "
    "overrides, perf-harness flags). validate_config checks it against Megatron's constraints "
    "before a launch. Read skill://<name>/SKILL.md for the checklist that fits the question "
    "(GPU OOM and memory, activation recompute, long-context MoE, MoE optimisation workflow)."
)

# All four hints set on purpose (clients treat a missing destructiveHint as true).
PURE = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                       open_world_hint=False)

# Prompt name → skill whose answer checklist it walks through.
PROMPTS = {
    "oom_triage": "nemo-mbridge-perf-memory-tuning",
    "recompute_plan": "nemo-mbridge-perf-activation-recompute",
    "long_context_moe_plan": "nemo-mbridge-perf-moe-long-context",
    "moe_optimization_workflow": "nemo-mbridge-perf-moe-optimization-workflow",
}


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


INVALID_PARAMS = -32602  # JSON-RPC: the request's parameters are wrong


class GuardedServer(MCPServer):
    """MCPServer whose errors read as ours: the SDK's argument-validation dump becomes one
    line naming the argument; a bad prompt request is an invalid-params error saying what
    to send, not "Internal server error"."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None
                        ) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError) and not isinstance(exc, UnexpectedToolError):
                raise ToolError(f"Error executing tool {name}: {argument_problem(cause)}"
                                ) from cause
            raise

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None,
                         context: Any = None) -> Any:
        prompt = self._prompt_manager.get_prompt(name)
        if prompt is None:
            known = ", ".join(p.name for p in self._prompt_manager.list_prompts())
            raise MCPError(INVALID_PARAMS, f"unknown prompt {name!r}; prompts are {known}")
        missing = [a.name for a in prompt.arguments or []
                   if a.required and not (arguments or {}).get(a.name)]
        if missing:
            raise MCPError(INVALID_PARAMS, f"prompt {name}: argument {missing[0]!r} is "
                                           "required: describe the user's situation in it")
        return await super().get_prompt(name, arguments, context)


def argument_problem(exc: ValidationError) -> str:
    """The first argument error as `field: problem. Fix …` — our words, never a dump."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "arguments"
    return f"{loc}: {type_problem(err)}. Fix that argument and call again."


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Every tool's one error path: our ValueErrors (ConfigError, BenchError, …) keep their
    message; anything else becomes a message naming the tool, so no exception's repr ever
    reaches the client (the traceback goes to the server log)."""
    import functools

    def problem(exc: BaseException) -> ToolError:
        if isinstance(exc, ToolError):
            return exc
        if isinstance(exc, ValueError):  # a ConfigError names a field, other errors a value
            what = "that field" if isinstance(exc, ConfigError) else "that"
            return ToolError(f"{' '.join(str(exc).split())}. Fix {what} and call again.")
        if isinstance(exc, RecursionError | MemoryError):
            return ToolError("the input is too deeply nested or too large to read; simplify "
                             "it and call again")
        log.exception("%s failed", fn.__name__)
        return ToolError(f"{fn.__name__} could not handle this input ({type(exc).__name__}); "
                         "the server log has the details")

    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def run_async(*args: Any, **kwargs: Any) -> Any:
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise problem(exc) from None
        return run_async

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise problem(exc) from None
    return run


def _config(src: ConfigSource, what: str = "config") -> Any:
    try:
        return load_source(src)
    except ConfigError as exc:
        where = "" if what == "config" else f"{what} "
        raise ToolError(f"{where}{exc}. Fix that field and call again.") from None


def _reader(path: Path) -> Callable[[], str]:
    def read() -> str:
        return path.read_text(encoding="utf-8")

    return read


def _register_tools(server: MCPServer, root: Path | None = None) -> list[str]:
    """Register every tool whose function exists (never a stub); return their names."""

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
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); CUDA context, NCCL and CUDA-graph
        overheads; GPU capacity, fits and headroom; assumptions and what is not modelled. All
        sizes in GiB (2^30 bytes). Megatron logs decimal GB: 58.8 GB = 54.8 GiB. Also
        answer_markdown: the estimate read as the memory skill answers it. Pure arithmetic,
        needs no GPU; validate_config checks the config's legality."""
        from mbridge_perf.memory.answer import estimate_with_answer as estimate

        cfg = _config(config)
        return estimate(cfg, gpu=gpu, imbalance=imbalance)

    tools = [(validate_config, "Validate a training config", PURE),
             (estimate_memory, "Estimate per-GPU memory", PURE),
             *_advise_tools(),
             (list_presets, "List model presets", PURE),
             *_eval_tools(root),
             *_bench_tools()]
    for fn, title, hints in tools:
        # cleandoc: the docstring is the description the assistant reads, without indentation
        server.tool(title=title, annotations=hints,
                    description=inspect.cleandoc(fn.__doc__ or ""))(guarded(fn))
    return [fn.__name__ for fn, _, _ in tools]


def _advise_tools() -> list[tuple[Callable[..., Any], str, ToolAnnotations]]:
    """recommend_recompute and diagnose_oom (advise/)."""

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
        stage, est_saving_gib, throughput_cost measured or estimated with its source, fits,
        rationale, skill), first_fitting_step, scenario (fragmentation / capacity / fits) and
        answer_markdown. Pure arithmetic, needs no GPU."""
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
        stage by estimate_memory with the config's recompute / offload, and ranked the way the
        skills and Bridge's tuned MoE recipes rank: fits with headroom, CP no larger than
        seq_length / 4096, smallest TP, EP before ETP, the experts' all-to-all inside the fewest
        NVLink domains, most DP, CP nearest seq_length / 4096, fewest pipeline stages and
        bubbles. min_gpus = PP·lcm(TP·CP, EP·ETP) is reported per layout.
        Says when a layout fits only with a selective-recompute module or optimizer offload
        (never full recompute at long context). Returns layouts (sizes, both meshes, per-stage
        peaks, headroom, micro-batches, bubble fraction, config_changes, reasons), the
        long-context skill's published layout for the case when one applies (priced, its rank
        and what ranks above it), rejected families with the rule or memory number, counts and
        answer_markdown. Pure arithmetic, needs no GPU."""
        from mbridge_perf.advise.parallelism import plan_parallelism as plan

        cfg = _config(config)
        return plan(cfg, num_gpus, gpu, seq_length, global_batch_size,
                    micro_batch_size=micro_batch_size, top_k=top_k, constraints=constraints)

    return [(recommend_recompute, "Recommend recompute / memory steps", PURE),
            (diagnose_oom, "Diagnose a GPU OOM", PURE),
            (plan_parallelism, "Plan parallel layouts", PURE)]


def _eval_tools(root: Path | None) -> list[tuple[Callable[..., Any], str, ToolAnnotations]]:
    """grade_answer (evals/): an assistant self-checks a draft before sending it."""

    def grade_answer(
            answer: Annotated[str, Field(
                min_length=1, max_length=200_000,
                description="The draft answer: Markdown, or the JSON a tool returned (its "
                            "answer_markdown is graded).")],
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

        return grade_text(root or find_pack_root(), answer, skill=skill, case_id=case_id,
                          tool_calls=tool_calls)

    return [(grade_answer, "Grade an answer against a skill's checklist", PURE)]


RunId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$",
                             description="run id returned by submit_benchmark")]


def _bench_tools() -> list[tuple[Callable[..., Any], str, ToolAnnotations]]:
    """The benchmark tools: long work behind job handles; no call blocks longer than 30 s.
    The service (executors, SQLite registry) is imported on first use, not at start-up."""

    def service() -> Any:
        from mbridge_perf.bench import service as svc

        return svc

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
        prof = service().named_profile(profile)
        return service().submit(cfg, prof, dry_run=dry_run, steps=steps,
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
            st = await anyio.to_thread.run_sync(lambda: service().status(run_id))
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
        return service().result(run_id, golden_tflops=golden_tflops,
                                regression_pct=regression_pct)

    def cancel_benchmark(run_id: RunId) -> RunStatus:
        """Cancel a benchmark this server submitted (scancel / kill of its own job only;
        jobs it did not create are refused). Finished runs are left as they are."""
        return service().cancel(run_id)

    def compare_benchmarks(run_a: RunId, run_b: RunId) -> RunComparison:
        """A/B two finished benchmarks. Valid only when their contracts differ in exactly one
        variable (e.g. the dispatcher) and both results are valid; otherwise it names the
        extra differences. Reports deltas of step time, TFLOP/s/GPU, tokens/s/GPU and peak
        memory, absolute and in percent."""
        return service().compare_runs(run_a, run_b)

    cluster = ToolAnnotations(read_only_hint=True, destructive_hint=False,
                              idempotent_hint=True, open_world_hint=True)
    return [
        (submit_benchmark, "Submit a benchmark (dry run by default)",
         ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                         open_world_hint=True)),
        (benchmark_status, "Benchmark status", cluster),
        (benchmark_result, "Benchmark result", cluster),
        (cancel_benchmark, "Cancel a benchmark",
         ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                         open_world_hint=True)),
        (compare_benchmarks, "Compare two benchmarks", cluster),
    ]


def _register_resources(server: MCPServer, skills: list[Skill]) -> None:
    for skill in skills:
        name = skill.folder_name
        desc = str(skill.frontmatter.get("description", ""))
        server.resource(f"skill://{name}/SKILL.md", name=f"{name}/SKILL.md",
                        title=f"{name} (SKILL.md)", description=desc,
                        mime_type="text/markdown")(_reader(skill.path / SKILL_FILE))
        server.resource(f"skill://{name}/card.yaml", name=f"{name}/card.yaml",
                        title=f"{name} (card.yaml)",
                        description=f"Machine-readable card of {name}: answer checklist, "
                                    "measured results, constraints, rule ids.",
                        mime_type="application/yaml")(_reader(skill.path / CARD_FILE))
        # SKILL.md links references/<file>.md; the same relative path resolves here
        for ref in sorted((skill.path / "references").glob("*.md")):
            rel = f"references/{ref.name}"
            server.resource(f"skill://{name}/{rel}", name=f"{name}/{rel}",
                            title=f"{name} ({rel})",
                            description=f"Detail that {name}'s SKILL.md links to; read it "
                                        "when the answer needs it.",
                            mime_type="text/markdown")(_reader(ref))

    @server.resource("mbridge-perf://rules", name="rules", title="Validator rule catalog",
                     description="Every validate_config rule: id, severity, constraint ref, "
                                 "source, fields, summary, documenting skill.",
                     mime_type="application/json")
    def rules_resource() -> str:
        from mbridge_perf.rules.catalog import describe_rules

        return json.dumps(describe_rules(), indent=1)

    @server.resource("mbridge-perf://presets", name="presets", title="Model presets",
                     description="Every preset with its model-section fields and sources.",
                     mime_type="application/json")
    def presets_resource() -> str:
        from mbridge_perf.config.presets import load_presets

        return json.dumps({n: p.model_dump(mode="json") for n, p in load_presets().items()},
                          indent=1)


# Skills whose prompts triage an OOM first (diagnose_oom), then run the ladder.
OOM_SKILLS = ("nemo-mbridge-perf-memory-tuning", "nemo-mbridge-perf-activation-recompute")


def _checklist_prompt(skill: Skill, tools: list[str]) -> Callable[..., str]:
    name = skill.folder_name

    def render(situation: str, config: str = "") -> str:
        items = skill.card["answer_checklist"]
        steps = "\n".join(f"{i}. {item['text']}" for i, item in enumerate(items, 1))
        calls = ", ".join(t for t in ("validate_config", "estimate_memory",
                                      "recommend_recompute", "plan_parallelism") if t in tools)
        parts = [f"Use the {name} skill (read skill://{name}/SKILL.md first).",
                 f"Situation: {situation.strip()}"]
        if name in OOM_SKILLS and "diagnose_oom" in tools:
            parts.append("If the situation includes an OOM message or a training log, call "
                         "diagnose_oom with that text (and the config, if any) first.")
        if name == PROMPTS["long_context_moe_plan"] and "plan_parallelism" in tools:
            parts.append("Call plan_parallelism (the model as a preset or the config, GPU "
                         "count and type, seq_length, global_batch_size) for the ranked "
                         "layouts and their per-stage memory before sizing CP, EP, TP or PP "
                         "by hand; then validate_config on the layout you pick.")
        if config.strip():
            parts.append(f"Training config:\n```yaml\n{config.strip()}\n```")
            parts.append(f"Call {calls} with this config (as config.bridge_config) before "
                         "recommending anything, and quote the findings you rely on.")
        parts.append("Answer in this order, the skill's first-answer checklist:\n" + steps)
        parts.append("Use Megatron Bridge field names verbatim and say what you did not "
                     "measure.")
        return "\n\n".join(parts)

    return render


def _register_prompts(server: MCPServer, skills: list[Skill], tools: list[str]) -> None:
    by_name = {s.folder_name: s for s in skills}
    for prompt, skill_name in PROMPTS.items():
        skill = by_name.get(skill_name)
        if skill is None:
            continue
        desc = (f"Walk through the {skill_name} answer checklist for the user's situation; "
                "optionally validate their config first.")
        fn = _checklist_prompt(skill, tools)
        fn.__name__ = prompt
        fn.__doc__ = desc
        server.prompt(name=prompt, title=prompt.replace("_", " ").capitalize(),
                      description=desc)(fn)


def build_server(pack_root: Path | None = None) -> MCPServer:
    """The whole server; skill files are read on each request so edits show at once."""
    root = pack_root or find_pack_root()
    skills = list_skills(root)
    server = GuardedServer("mbridge-perf", version=__version__, instructions=INSTRUCTIONS)
    tools = _register_tools(server, root)
    _register_resources(server, skills)
    _register_prompts(server, skills, tools)
    return server


# ------------------------------------------------------------------ HTTP transport

TOKEN_ENV = "MBRIDGE_PERF_TOKEN"
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "[::1]"}


def is_loopback(host: str) -> bool:
    if host in _LOCAL_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HttpGuard:
    """ASGI guard in front of the MCP app: a bearer token when one is configured, and no
    browser Origin other than localhost (a web page must not drive a local server)."""

    def __init__(self, app: Any, token: str | None) -> None:
        self.app, self.token = app, token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        raw = {k.lower(): v for k, v in scope.get("headers", [])}
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in raw.items()}
        origin = headers.get("origin")
        if origin and not _local_origin(origin):
            await _reply(send, 403, "origin not allowed: only localhost pages may call this "
                                    "server")
            return
        if self.token is not None:  # bytes on both sides: any token, any header, no 500
            scheme, _, value = raw.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not _token_matches(value.strip(), self.token):
                await _reply(send, 401, "missing or wrong bearer token", www_auth=True)
                return
        await self.app(scope, receive, send)


def _token_matches(given: bytes, token: str) -> bool:
    """Constant-time compare of the header's bytes with the token as UTF-8 (what most
    clients send) or Latin-1 (what some send for a non-ASCII header)."""
    forms = {token.encode("utf-8")}
    with contextlib.suppress(UnicodeEncodeError):
        forms.add(token.encode("latin-1"))
    return any([hmac.compare_digest(given, form) for form in forms])


def _local_origin(origin: str) -> bool:
    from urllib.parse import urlsplit

    host = urlsplit(origin).hostname
    return host is not None and is_loopback(host)


async def _reply(send: Any, status: int, text: str, www_auth: bool = False) -> None:
    headers = [(b"content-type", b"text/plain; charset=utf-8")]
    if www_auth:
        headers.append((b"www-authenticate", b'Bearer realm="mbridge-perf"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": text.encode()})


def http_app(server: MCPServer, host: str, token: str | None) -> Any:
    """The streamable-HTTP app at /mcp behind the guard; refuses a non-loopback bind without
    a token (anyone on the network could otherwise drive the tools)."""
    from mcp.server.transport_security import TransportSecuritySettings

    if not is_loopback(host) and not token:
        raise ConfigError("--host", f"binding {host} (not loopback) needs a bearer token: pass "
                                    f"--token or set {TOKEN_ENV}")
    local = is_loopback(host)
    security = TransportSecuritySettings(
        enable_dns_rebinding_protection=local,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"] if local else [],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"])
    return HttpGuard(server.streamable_http_app(transport_security=security, host=host), token)


def serve_http(server: MCPServer, host: str, port: int, token: str | None) -> None:
    import uvicorn

    app = http_app(server, host, token)
    log.info("mbridge-perf MCP over streamable HTTP at http://%s:%d/mcp", host, port)
    uvicorn.run(app, host=host, port=port, log_level="warning")
