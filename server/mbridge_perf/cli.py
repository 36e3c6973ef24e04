"""`mbridge-perf` command line: a thin door over the same functions the MCP server calls."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mbridge_perf import __version__

if TYPE_CHECKING:  # the CLI imports its doors lazily; this is for the type checker only
    from mbridge_perf.bench.reports import RunStatus
    from mbridge_perf.config.model import TrainingConfig


def _cmd_serve(args: argparse.Namespace) -> int:
    import os

    from mbridge_perf.config.errors import ConfigError
    from mbridge_perf.server import TOKEN_ENV, build_server, http_app, serve_http
    from mbridge_perf.skillpack.pack import PackError

    try:
        server = build_server()
    except PackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.http:
        server.run()  # stdio: stdout is the wire
        return 0
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        http_app(server, args.host, token)  # refuses an unsafe bind before anything listens
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve_http(server, args.host, args.port, token)
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from mbridge_perf.skillpack.lint import lint
    from mbridge_perf.skillpack.pack import PackError, find_pack_root

    if args.path is not None:
        target = Path(args.path)
    else:
        try:
            target = find_pack_root(Path.cwd())
        except PackError:
            target = Path.cwd()
    findings = lint(target)
    for f in findings:
        print(f)
    errors = sum(f.severity == "error" for f in findings)
    if errors:
        print(f"{errors} error(s)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{target}: ok", file=sys.stderr)
    return 0


def _add_config_args(p: argparse.ArgumentParser, json_flag: bool = True,
                     recipe_flag: bool = True) -> None:
    """The config inputs every config-reading command takes, in composition order."""
    p.add_argument("file", nargs="?", help="Bridge config YAML/JSON, a Hugging Face "
                                           "config.json, or - for stdin")
    p.add_argument("--preset", help="model preset to start from (see `mbridge-perf presets`)")
    if recipe_flag:
        p.add_argument("--recipe", dest="config_recipe", metavar="NAME",
                       help="Megatron Bridge 0.6.2 recipe to start from, by name (see "
                            "`mbridge-perf recipes`)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="dotted override, e.g. model.tensor_model_parallel_size=8 (repeatable)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print the JSON report")
    p.set_defaults(flags=[])
    p.epilog = ("Perf-harness flags go after --, e.g. `-- -tp 8 -pp 4 -ng 32 "
                "--recompute_modules core_attn,mlp`.")


def _load_config(args: argparse.Namespace, which: str = "file") -> TrainingConfig:
    from mbridge_perf.config.load import load_config

    source = getattr(args, which)
    flags = args.flags
    recipe = getattr(args, "config_recipe", None)
    if source == "-":
        return load_config(preset=args.preset, recipe=recipe, text=sys.stdin.read(),
                           overrides=args.overrides, flags=flags)
    first = which == "file"
    return load_config(preset=args.preset if first else None, file=source,
                       recipe=recipe if first else None,
                       overrides=args.overrides if first else (), flags=flags if first else ())


def _cmd_validate(args: argparse.Namespace) -> int:
    from mbridge_perf.rules import RULES, validate
    from mbridge_perf.rules.validate import format_report

    if args.list_rules:
        for r in RULES:
            print(f"{r.id:45} {r.severity:7} {r.ref:6} {r.summary}")
        return 0
    cfg = _load_config(args)
    baseline = _load_config(args, "baseline") if args.baseline else None
    report = validate(cfg, baseline, args.mcore_version)
    print(report.model_dump_json(indent=2) if args.json else format_report(report))
    return 0 if report.ok else 1


def _cmd_steptime(args: argparse.Namespace) -> int:
    from mbridge_perf.steptime import estimate_step_time

    r = estimate_step_time(_load_config(args), gpu=args.gpu)
    if args.json:
        print(r.model_dump_json(indent=2))
        return 0
    print(f"Step time on {r.num_gpus} x {r.gpu} ({r.precision}): {r.step_time_s:.3f} s "
          f"(band +/- {r.band_s:.3f} s), {r.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
          f"{r.model_tflops_per_gpu:.0f} model TFLOP/s/GPU, MFU {r.mfu:.1%}")
    for t in sorted(r.breakdown, key=lambda t: -t.seconds):
        print(f"  {t.name:24} {t.seconds:8.3f} s  {t.share:6.1%}  {t.assumes}")
    return 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from mbridge_perf.bench.calibrate import calibrate
    from mbridge_perf.bench.registry import Registry

    try:
        res = calibrate(Registry(args.registry) if args.registry else None,
                        out=Path(args.out) if args.out else None, write=not args.dry_run)
    except ValueError as exc:  # CalibrateError, RegistryError
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(res.model_dump_json(indent=2))
        return 0
    print(f"{'wrote' if res.written else 'would write (dry run)'} {res.path}: fitted on "
          f"{len(res.runs)} runs ({', '.join(res.fitted) or 'nothing moved'}); median |error| "
          f"{res.before_median_error_pct:.1f} % before, {res.after_median_error_pct:.1f} % after")
    for r in res.runs:
        print(f"  {r.run_id[:12]} {r.gpu:10} measured {r.measured_s:8.3f} s  before "
              f"{r.before_s:8.3f} s ({r.before_s / r.measured_s - 1:+.1%})  after "
              f"{r.after_s:8.3f} s ({r.after_s / r.measured_s - 1:+.1%})")
    for why in res.skipped[:20]:
        print(f"  skipped {why}")
    return 0


def _cmd_estimate(args: argparse.Namespace) -> int:
    from mbridge_perf.config.errors import ConfigError
    from mbridge_perf.memory.answer import estimate_with_answer as estimate_memory
    from mbridge_perf.memory.estimate import format_estimate

    try:
        stage = None if args.stage is None else -1 if args.stage == "last" else int(args.stage)
    except ValueError:
        raise ConfigError("--stage", f"expected a stage number or 'last', got "
                          f"{args.stage!r}") from None
    report = estimate_memory(_load_config(args), gpu=args.gpu, imbalance=args.imbalance)
    print(report.model_dump_json(indent=2) if args.json else format_estimate(report, stage))
    if not args.json and report.bridge is not None:
        print(f"  {report.bridge.message}")
    return 1 if report.verdict == "does_not_fit" else 0


def _cmd_recommend(args: argparse.Namespace) -> int:
    from mbridge_perf.advise.recompute import recommend_recompute

    plan = recommend_recompute(_load_config(args), target_gib=args.target_gib, gpu=args.gpu)
    print(plan.model_dump_json(indent=2) if args.json else plan.answer_markdown)
    return 0 if plan.first_fitting_step is not None or plan.baseline.fits else 1


def _cmd_plan(args: argparse.Namespace) -> int:
    from mbridge_perf.advise.parallelism import plan_parallelism
    from mbridge_perf.config.errors import ConfigError

    constraints: dict[str, list[int]] = {}
    for item in args.fix:
        name, _, values = item.partition("=")
        try:
            constraints[name.strip()] = [int(v) for v in values.split(",") if v.strip()]
        except ValueError:
            raise ConfigError(f"constraints.{name.strip()}", "expected whole numbers "
                              "separated by commas, e.g. context_parallel_size=16,32") from None
    plan = plan_parallelism(_load_config(args), args.gpus, args.gpu, args.seq, args.gbs,
                            micro_batch_size=args.mbs, top_k=args.top,
                            constraints=constraints or None)
    print(plan.model_dump_json(indent=2) if args.json else plan.answer_markdown)
    return 0 if any(lay.fit != "no" for lay in plan.layouts) else 1


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from mbridge_perf.advise.oom import SCAN_CHARS, diagnose_oom
    from mbridge_perf.config.errors import ConfigError

    try:
        cfg = None
        if args.config or args.preset:
            from mbridge_perf.config.load import load_config

            cfg = load_config(preset=args.preset, file=args.config)
    except ConfigError as exc:
        print(f"error: --config: {exc}", file=sys.stderr)
        return 2
    text = _read_tail(args.log, SCAN_CHARS)
    diag = diagnose_oom(text, cfg)
    print(diag.model_dump_json(indent=2) if args.json else diag.answer_markdown)
    return 0


def _read_tail(path: str, limit: int) -> str:
    """The last ``limit`` characters of a log file, a pipe or stdin, in bounded memory (a log
    of any size is fine; a device that never ends is refused)."""
    from mbridge_perf.bench.logparse import stream_tail, tail_bytes

    raw = (stream_tail(sys.stdin.buffer, 4 * limit) if path == "-"
           else tail_bytes(path, 4 * limit))
    return raw.decode("utf-8", "replace")[-limit:]


def _bench_print(args: argparse.Namespace, model: object, text: str) -> None:
    from pydantic import BaseModel

    if args.json and isinstance(model, BaseModel):
        print(model.model_dump_json(indent=2))
    elif args.json:
        print(json.dumps(model, indent=2, default=str))
    else:
        print(text)


def _status_line(s: RunStatus) -> str:
    prog = f" {s.last_iteration}/{s.steps}" if s.last_iteration is not None else ""
    return (f"{s.run_id}  {s.state:9}{prog}  {s.executor} {s.external_id or '-'}  "
            f"{s.updated_at}  {s.message}")


def _cmd_bench(args: argparse.Namespace) -> int:
    import time

    from mbridge_perf.bench import service
    from mbridge_perf.bench.registry import Registry
    from mbridge_perf.bench.result import render_comparison

    try:
        reg = Registry(args.registry) if args.registry else None
        if args.action == "submit":
            cfg = _load_config(args)
            handle = service.submit(cfg, service.resolve_profile(args.profile), registry=reg,
                                    dry_run=not args.run, steps=args.steps,
                                    window=service.parse_window(args.window), label=args.label,
                                    recipe=args.recipe)
            head = ("DRY RUN: nothing submitted (add --run to submit). Script:\n" if
                    handle.dry_run else f"submitted run {handle.run_id} ({handle.executor} "
                                        f"{handle.external_id}); poll: mbridge-perf bench "
                                        f"status {handle.run_id}\n")
            _bench_print(args, handle, head + (handle.script if handle.dry_run else ""))
            return 0
        if args.action == "status":
            st = service.status(args.run_id, registry=reg)
            deadline = time.monotonic() + args.wait
            while not st.terminal and time.monotonic() < deadline:
                time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
                st = service.status(args.run_id, registry=reg)
            _bench_print(args, st, _status_line(st))
            return 0
        if args.action in ("result", "parse"):
            if args.action == "result":
                res = service.result(args.run_id, registry=reg, golden_tflops=args.golden_tflops,
                                     regression_pct=args.regression_pct)
            else:
                res = service.parse(args.log, window=service.parse_window(args.window),
                                    golden_tflops=args.golden_tflops,
                                    regression_pct=args.regression_pct, num_gpus=args.num_gpus,
                                    seq_length=args.seq_length,
                                    global_batch_size=args.global_batch_size)
            _bench_print(args, res, res.markdown)
            return 0 if res.result.outcome == "pass" else 1
        if args.action == "cancel":
            st = service.cancel(args.run_id, registry=reg)
            _bench_print(args, st, _status_line(st))
            return 0
        if args.action == "compare":
            cmp = service.compare_runs(args.run_a, args.run_b, registry=reg)
            text = render_comparison(cmp.comparison)
            if cmp.predicted is not None:
                text += f"\n\nStep-time model: {cmp.predicted.note}"
            _bench_print(args, cmp, text)
            return 0 if cmp.comparison.valid else 1
        runs = service.list_runs(registry=reg, state=args.state, limit=args.limit)
        _bench_print(args, [r.model_dump(mode="json") for r in runs],
                     "\n".join(_status_line(r) for r in runs) or "no runs")
        return 0
    except ValueError as exc:  # ConfigError, BenchError, RegistryError: input to fix
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _cmd_presets(args: argparse.Namespace) -> int:
    from mbridge_perf.config.presets import load_presets

    presets = load_presets()
    if args.json:
        print(json.dumps({n: p.model_dump(mode="json") for n, p in presets.items()}, indent=2))
        return 0
    for name, p in presets.items():
        active = f", {p.active_params_b:g}B active" if p.active_params_b else ""
        print(f"{name:22} {p.published_params_b:g}B{active}  ({p.source})")
    return 0


def _cmd_recipes(args: argparse.Namespace) -> int:
    from mbridge_perf.config.recipes import list_recipes

    rows = list_recipes(args.model, args.gpu)
    if args.json:
        print(json.dumps([r.model_dump(mode="json") for r in rows], indent=1))
        return 0
    names = ("tp", "pp", "vpp", "cp", "ep", "etp")
    for r in rows:
        lay = " ".join(f"{k.upper()}{r.layout[k]}" for k in names if r.layout.get(k))
        print(f"{r.name:70} {r.model:22} {r.num_gpus:5d} x {r.gpu:6} {r.precision:6} {lay} "
              f"MBS{r.layout.get('mbs')} GBS{r.layout.get('gbs')} seq{r.layout.get('seq')}")
    if not rows:
        print("no recipe matches; `mbridge-perf recipes` lists them all", file=sys.stderr)
    return 0


Subparsers = argparse._SubParsersAction  # type: ignore[type-arg]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mbridge-perf",
        description="Megatron Bridge training-performance skills and MCP tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_serve_parser(sub)
    _add_config_parsers(sub)
    _add_plan_parser(sub)
    _add_diagnose_parser(sub)
    _add_bench_parser(sub)
    _add_pack_parsers(sub)

    from mbridge_perf.evals.commands import add_parser as add_eval_parser

    add_eval_parser(sub)
    return parser


def _add_serve_parser(sub: Subparsers) -> None:
    p = sub.add_parser("serve", help="run the MCP server (stdio by default)")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP at /mcp instead")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default loopback; "
                                                       "any other needs a token)")
    p.add_argument("--port", type=bounded(int, 1, 65535), default=8765,
                   help="HTTP port, 1-65535 (default 8765)")
    p.add_argument("--token", help="bearer token HTTP clients must send (default: "
                                   "$MBRIDGE_PERF_TOKEN)")
    p.set_defaults(func=_cmd_serve)


def _add_config_parsers(sub: Subparsers) -> None:
    """validate, estimate and recommend: one training config in, a verdict out."""
    p = sub.add_parser("validate", help="check a training config against the rule catalog",
                       description="Exit 0: no errors; 1: errors found; 2: unusable input.")
    _add_config_args(p)
    p.add_argument("--baseline", metavar="FILE",
                   help="the config before your change (enables rules about the change)")
    p.add_argument("--list-rules", action="store_true", help="print the rule catalog")
    p.add_argument("--mcore-version", default="0.19.2", metavar="X.Y.Z",
                   help="Megatron-Core release whose checks apply (default 0.19.2, the one "
                        "Megatron Bridge 0.6.2 ships; also 0.16.1)")
    p.set_defaults(func=_cmd_validate)

    p = sub.add_parser("estimate", help="per-stage GPU memory of a training config",
                       description="Exit 0: fits (or no GPU given); 1: does not fit; "
                                   "2: unusable input.")
    _add_config_args(p)
    p.add_argument("--gpu", help="GPU kind, e.g. H100, GB200 (default: cluster.gpu)")
    p.add_argument("--stage", help="show one pipeline stage in full: a number or 'last'")
    p.add_argument("--imbalance", type=bounded(float, 1.0, 64.0), default=1.0,
                   help="MoE routing imbalance: tokens on the busiest expert / mean (1-64)")
    p.set_defaults(func=_cmd_estimate)

    p = sub.add_parser("steptime", help="predicted step time and throughput of a config",
                       description="Exit 0: predicted; 2: unusable input.")
    _add_config_args(p)
    p.add_argument("--gpu", help="GPU kind, e.g. H100, GB200 (default: cluster.gpu)")
    p.set_defaults(func=_cmd_steptime)

    p = sub.add_parser("calibrate", help="refit the step-time model on your completed "
                                         "benchmark runs")
    p.add_argument("--registry", help="run registry file (default: $MBRIDGE_PERF_REGISTRY "
                                      "or the user data directory)")
    p.add_argument("--out", help="where to write (default: $MBRIDGE_PERF_CALIBRATION or "
                                 "~/.config/mbridge-perf/calibration.json, which the tools read)")
    p.add_argument("--dry-run", action="store_true", help="fit and print; write nothing")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_calibrate)

    p = sub.add_parser("recommend", help="the recompute / memory ladder for a config",
                       description="Exit 0: a step fits; 1: nothing on the ladder fits; "
                                   "2: unusable input.")
    _add_config_args(p)
    p.add_argument("--target-gib", type=bounded(float, 0.001, 10_000.0), default=None,
                   help="memory budget per GPU in GiB (default: the GPU's capacity)")
    p.add_argument("--gpu", help="GPU kind, e.g. H100, GB200 (default: cluster.gpu)")
    p.set_defaults(func=_cmd_recommend)


def _add_plan_parser(sub: Subparsers) -> None:
    p = sub.add_parser("plan", help="ranked parallel layouts for a model on N GPUs",
                       description="Exit 0: a layout fits; 1: none fits; 2: unusable input.")
    _add_config_args(p)
    p.add_argument("--gpus", type=bounded(int, 1, 1_048_576), required=True,
                   help="GPU count (world size)")
    p.add_argument("--gpu", required=True, help="GPU kind, e.g. H100, GB200")
    p.add_argument("--seq", type=bounded(int, 1, 16_777_216), required=True,
                   help="seq_length, e.g. 131072")
    p.add_argument("--gbs", type=bounded(int, 1, 100_000_000), required=True,
                   help="global_batch_size")
    p.add_argument("--mbs", type=bounded(int, 1, 4096), default=None,
                   help="micro_batch_size (default: searched, 1 first)")
    p.add_argument("--top", type=bounded(int, 1, 50), default=10, help="layouts to return")
    p.add_argument("--fix", action="append", default=[], metavar="SIZE=V1,V2",
                   help="allowed values of a size, e.g. expert_tensor_parallel_size=1 "
                        "(repeatable; Bridge field names)")
    p.set_defaults(func=_cmd_plan)


def _add_diagnose_parser(sub: Subparsers) -> None:
    p = sub.add_parser("diagnose", help="classify a CUDA OOM message or training log",
                       description="Reads the log's tail. Exit 0 unless the input is "
                                   "unusable (2).")
    p.add_argument("log", help="log or OOM text file, or - for stdin")
    p.add_argument("--config", help="the run's config (YAML/JSON) for a recommend plan")
    p.add_argument("--preset", help="model preset the config starts from")
    p.add_argument("--json", action="store_true", help="print the JSON diagnosis")
    p.set_defaults(func=_cmd_diagnose)


def _bench_cmd(bench: Subparsers, name: str, help_text: str) -> argparse.ArgumentParser:
    """One `bench` action, with the options every action shares."""
    q = bench.add_parser(name, help=help_text)
    q.add_argument("--registry", help="run registry file (default: $MBRIDGE_PERF_REGISTRY "
                                      "or the user data directory)")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=_cmd_bench)
    return q


def _add_bench_parser(sub: Subparsers) -> None:
    p = sub.add_parser("bench", help="run and judge benchmarks (local or Slurm)")
    bench = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    q = _bench_cmd(bench, "submit", "freeze the contract and render the job; --run submits it")
    _add_config_args(q, json_flag=False, recipe_flag=False)
    q.add_argument("--profile", required=True,
                   help="cluster profile: a built-in (cpu-test) or a YAML file")
    q.add_argument("--run", action="store_true", help="really submit (default: dry run)")
    q.add_argument("--steps", type=bounded(int, 1, 10_000_000),
                   help="training steps (default: train.train_iters or 50)")
    q.add_argument("--window", default="41-50", help="steady-state window (default 41-50)")
    q.add_argument("--label", choices=["training-equivalent", "benchmark-only"])
    q.add_argument("--recipe", help="Megatron Bridge recipe for run_recipe.py, e.g. "
                                    "llama3_8b_pretrain_config")
    q = _bench_cmd(bench, "status", "state and progress of a run")
    q.add_argument("run_id")
    q.add_argument("--wait", type=bounded(float, 0.0, 86_400.0), default=0.0,
                   help="poll up to this many seconds")
    _add_bench_judge_parsers(bench)
    q = _bench_cmd(bench, "cancel", "cancel a run this registry made")
    q.add_argument("run_id")
    q = _bench_cmd(bench, "compare", "A/B of two finished runs")
    q.add_argument("run_a")
    q.add_argument("run_b")
    q = _bench_cmd(bench, "list", "recent runs")
    q.add_argument("--state", help="only runs in this state")
    q.add_argument("--limit", type=bounded(int, 1, 10_000), default=20)


def _add_bench_judge_parsers(bench: Subparsers) -> None:
    """`bench result` (a registered run) and `bench parse` (any log): judged the same way."""
    for name, text in (("result", "judge a finished run"), ("parse", "judge any training log")):
        q = _bench_cmd(bench, name, text)
        if name == "result":
            q.add_argument("run_id")
        else:
            q.add_argument("log")
            q.add_argument("--window", default="41-50", help="steady-state window")
            q.add_argument("--num-gpus", type=bounded(int, 1, 1 << 20), help="for tokens/s/GPU")
            q.add_argument("--seq-length", type=bounded(int, 1, 1 << 24),
                           help="for tokens/s/GPU")
            q.add_argument("--global-batch-size", type=bounded(int, 1, 1 << 24),
                           help="for tokens/s/GPU")
        q.add_argument("--golden-tflops", type=bounded(float, 1e-3, 1e6),
                       help="golden TFLOP/s/GPU to compare with (> 0)")
        q.add_argument("--regression-pct", type=bounded(float, 0.0, 100.0), default=5.0,
                       help="allowed drop below golden, 0-100 (default 5)")


def _add_pack_parsers(sub: Subparsers) -> None:
    """presets, recipes and lint: the packaged presets, Bridge recipes and skill pack."""
    p = sub.add_parser("presets", help="list the model presets")
    p.add_argument("--json", action="store_true", help="print every preset as JSON")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("recipes", help="list the Megatron Bridge recipes --recipe accepts")
    p.add_argument("--model", help="only models whose name contains this, e.g. qwen3_30b")
    p.add_argument("--gpu", help="only recipes for this GPU, e.g. b300")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=_cmd_recipes)

    p = sub.add_parser("lint", help="lint the skill pack or one skill folder")
    p.add_argument("path", nargs="?", help="pack root or skills/<name> (default: the pack "
                                           "containing the current directory)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing when clean")
    p.set_defaults(func=_cmd_lint)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags: list[str] = []
    if "--" in argv:  # everything after -- is perf-harness flags, passed through verbatim
        cut = argv.index("--")
        argv, flags = argv[:cut], argv[cut + 1:]
    args = build_parser().parse_args(argv)
    if flags and not hasattr(args, "overrides"):
        build_parser().error(f"{args.command} takes no perf-harness flags after --")
    args.flags = flags
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    """The one error path: unusable input is exit 2 and one line; nothing escapes as a
    traceback (MBRIDGE_PERF_DEBUG=1 shows one for a defect)."""
    import os

    try:
        return args.func(args)
    except BrokenPipeError:  # `… | head` closed the pipe: not an error of ours or the input
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 2
    except (ValueError, OSError, RecursionError, MemoryError) as exc:
        if os.environ.get("MBRIDGE_PERF_DEBUG") == "1":
            raise
        print(f"error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Exception as exc:
        if os.environ.get("MBRIDGE_PERF_DEBUG") == "1":
            raise
        print(f"error: mbridge-perf could not handle this input ({type(exc).__name__}); "
              "please report it with the input (MBRIDGE_PERF_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """Our errors already read as one line naming the field; others get their kind named."""
    from mbridge_perf.config.errors import ConfigError

    if isinstance(exc, ConfigError) or type(exc).__module__.startswith("mbridge_perf"):
        return " ".join(str(exc).split())
    if isinstance(exc, RecursionError | MemoryError):
        return "the input is too deeply nested or too large to read; simplify it"
    if isinstance(exc, OSError):
        return f"{exc.filename or 'file'}: {exc.strerror or 'cannot be used'}"
    return f"unusable input ({type(exc).__name__}); check the values you gave"


def bounded(kind: type, low: float, high: float) -> Callable[[str], Any]:
    """An argparse type: a finite number of ``kind`` in [low, high], else a message naming
    the range (argparse puts the flag in front)."""
    import math

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'a whole number' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not (isinstance(value, int) or math.isfinite(value)) or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, got {text}")
        return value

    return parse


if __name__ == "__main__":
    sys.exit(main())
