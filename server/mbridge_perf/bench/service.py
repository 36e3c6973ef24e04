"""The benchmark operations the CLI and the MCP tools share: submit (dry run by default),
status, result, cancel, compare, list, and parse a log from any launcher.

Everything a run needs later (contract, script, log path, executor, external id) lives in the
registry, so any process — a restarted server, the CLI — can pick a run up again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from mbridge_perf.bench.contract import (
    VERSION_KEYS,
    Job,
    MeasurementContract,
    Versions,
    contract_from_config,
)
from mbridge_perf.bench.envpolicy import EnvPolicyError, check_env, refusal
from mbridge_perf.bench.executors import cancel_run, refresh_run, submit_run
from mbridge_perf.bench.launch import VERSIONS_PREFIX, given_values, job_env, render_script
from mbridge_perf.bench.logparse import parse_iteration_line, parse_log, read_tail
from mbridge_perf.bench.predicted import predicted_change
from mbridge_perf.bench.profile import ClusterProfile, ProfileError, builtin_profiles, load_profile
from mbridge_perf.bench.registry import Registry, RegistryError, RunNotFound, RunRecord
from mbridge_perf.bench.reports import RunComparison, RunHandle, RunResult, RunStatus
from mbridge_perf.bench.result import (
    compare,
    evaluate,
    evaluate_run,
    evidence_bundle,
    render_markdown,
)
from mbridge_perf.config.model import TrainingConfig

PROFILES_ENV = "MBRIDGE_PERF_PROFILES"
POLL_AFTER_S = 30
_PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_\-]{0,63}")
TAIL_BYTES = 65_536


class BenchError(ValueError):
    """A benchmark request that cannot be carried out; the message says what to do."""


def profile_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(os.environ.get(PROFILES_ENV) or Path(base) / "mbridge-perf" / "profiles")


def named_profile(name: str) -> ClusterProfile:
    """A profile by name only: a built-in or `<name>.yaml` in the profile directory — never a
    path, never the working directory. Used by the MCP tools, whose arguments come from a
    model: a profile's trusted setup lines must come from a file the user wrote."""
    builtins = builtin_profiles()
    if name in builtins:
        return builtins[name]
    if not _PROFILE_NAME.fullmatch(name):
        raise BenchError(f"profile: {name[:64]!r} is not a profile name (letters, digits, '_', "
                         f"'-'; no paths); use a built-in ({', '.join(builtins)}) or the stem "
                         f"of a YAML file in {profile_dir()}")
    path = profile_dir() / f"{name}.yaml"
    if not path.is_file():
        raise BenchError(f"profile: no profile named {name!r}: built-ins are "
                         f"{', '.join(builtins)}; others are {profile_dir()}/<name>.yaml "
                         f"(${PROFILES_ENV})")
    try:
        return load_profile(path)
    except ProfileError as exc:
        raise BenchError(f"profile: {exc}") from None


def resolve_profile(source: str | Path | Mapping[str, Any] | ClusterProfile) -> ClusterProfile:
    """The CLI's profile: a bare name resolves exactly as over MCP (never to a file in the
    working directory); a path (with a separator or a .yaml suffix) is the person's choice."""
    if isinstance(source, str) and "/" not in source and not source.endswith((".yaml", ".yml")):
        return named_profile(source)
    try:
        return load_profile(source)
    except ProfileError as exc:
        raise BenchError(f"profile: {exc}") from None


def _steps(cfg: TrainingConfig, steps: int | None, window: tuple[int, int]) -> int:
    if steps is not None and steps < 1:
        raise BenchError(f"steps: {steps} is not a step count; ask for at least {window[1]} "
                         "(the contract needs >= 50)")
    n = steps if steps is not None else cfg.train.train_iters or max(50, window[1])
    if n < window[1]:
        raise BenchError(f"steps: {n} steps end before the steady-state window "
                         f"{window[0]}-{window[1]}; ask for at least {window[1]} (the contract "
                         "needs >= 50)")
    return n


def as_run(cfg: TrainingConfig, profile: ClusterProfile, recipe: str | None
           ) -> TrainingConfig:
    """The config the job trains. Under run_recipe.py that is the recipe with the config's
    values laid over it (what the launcher renders), so a contract frozen from the config alone
    would record the defaults where the recipe sets graphs, layouts or precision; a recipe this
    package does not ship is taken as the config describes it."""
    if not recipe or profile.launcher != "bridge-run-recipe":
        return cfg
    from mbridge_perf.config.load import load_config
    from mbridge_perf.config.recipes import list_recipes

    if recipe not in {r.name for r in list_recipes()}:
        return cfg
    try:
        run = load_config(recipe=recipe, data=given_values(cfg))
    except ValueError as exc:
        raise BenchError(f"recipe: the config's values over recipe {recipe}: {exc}") from None
    return run.model_copy(update={"env": cfg.env, "cluster": cfg.cluster})


def _contract(cfg: TrainingConfig, profile: ClusterProfile, window: tuple[int, int],
              label: str | None, versions: Mapping[str, str] | None, steps: int,
              recipe: str | None = None) -> MeasurementContract:
    cfg = as_run(cfg, profile, recipe)
    sized = cfg.model_copy(update={"train": cfg.train.model_copy(update={"train_iters": steps}),
                                   "env": job_env(cfg, profile)})
    setup = "\n".join(profile.setup)
    unrecorded = {k: v for k, v in sorted(profile.env.items()) if refusal(k) is not None}
    job = Job(executor=profile.executor, launcher_args=list(profile.launcher_args),
              srun_args=list(profile.srun_args),
              setup_sha256=hashlib.sha256(setup.encode()).hexdigest() if setup else None,
              env_sha256=(hashlib.sha256(json.dumps(unrecorded).encode()).hexdigest()
                          if unrecorded else None))
    known = {"container": profile.container_image} if profile.container_image else {}
    try:
        return contract_from_config(sized, versions={**known, **dict(versions or {})},
                                    window=window, label=label, launcher=profile.launcher,
                                    job=job)  # type: ignore[arg-type]
    except ValidationError as exc:  # a contract part refused a value: say which, in words
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "contract"
        raise BenchError(f"{where}: {err['msg'].removeprefix('Value error, ')}") from None
    except ValueError as exc:
        raise BenchError(f"contract: {exc}") from None


def submit(cfg: TrainingConfig, profile: ClusterProfile, *, registry: Registry | None = None,
           dry_run: bool = True, steps: int | None = None, window: tuple[int, int] = (41, 50),
           label: str | None = None, versions: Mapping[str, str] | None = None,
           recipe: str | None = None) -> RunHandle:
    """Freeze the contract, render the script and — unless dry_run — submit it. A config
    with validation errors is refused before anything reaches the cluster."""
    from mbridge_perf.rules import validate

    try:
        check_env(cfg.env)
    except EnvPolicyError as exc:
        raise BenchError(str(exc)) from None
    report = validate(cfg)
    if not report.ok:
        errs = "; ".join(f"{f.rule_id}: {f.message}" for f in report.findings
                         if f.severity == "error")
        raise BenchError(f"config: validate_config finds errors, the job would not start: "
                         f"{errs}")
    n = _steps(cfg, steps, window)
    contract = _contract(cfg, profile, window, label, versions, n, recipe)
    if dry_run:
        try:
            script = render_script(cfg, profile, run_id="DRY-RUN", log_path="<run-dir>/train.log",
                                   recipe=recipe, steps=n)
        except ValueError as exc:
            raise BenchError(f"launch: {exc}") from None
        return RunHandle(run_id=None, dry_run=True, state="not submitted",
                         executor=profile.executor, external_id=None, profile=profile.name,
                         steps=n, script=script, contract=contract.model_dump(mode="json"),
                         poll_after_s=0, message="dry run: nothing was submitted; call again "
                                                 "with dry_run=false to run it")
    reg = registry or Registry()
    try:
        run = submit_run(reg, cfg, profile, recipe=recipe, steps=n,
                         contract=contract.model_dump(mode="json"))
    except RegistryError:  # already one line naming the registry file
        raise
    except ValueError as exc:
        raise BenchError(f"launch: {exc}") from None
    except RuntimeError as exc:  # SubmitError: the executor refused; the run is recorded
        raise BenchError(f"submit: {exc}") from None
    return RunHandle(run_id=run.id, dry_run=False, state=run.state, executor=run.executor,
                     external_id=run.external_id, profile=profile.name, steps=n,
                     script=run.script or "", contract=run.contract or {},
                     poll_after_s=POLL_AFTER_S if run.executor == "slurm" else 5,
                     message=run.message)


def _get(reg: Registry, run_id: str) -> RunRecord:
    try:
        return reg.get(run_id)
    except RunNotFound as exc:
        raise BenchError(f"run_id: {exc.args[0] if exc.args else run_id}") from None


def _last_iteration(log_path: str | None) -> int | None:
    """The newest iteration in the log's tail: cheap enough to call on every poll."""
    for line in reversed((read_tail(log_path, TAIL_BYTES) or b"").splitlines()):
        if b"iteration" in line and (row := parse_iteration_line(line)) is not None:
            return row.iteration
    return None


def _status(run: RunRecord) -> RunStatus:
    steps = (run.contract or {}).get("window", {}).get("steps")
    last = _last_iteration(run.log_path)
    pct = None
    if steps:
        pct = 100.0 if run.state == "completed" else min(100.0, 100.0 * (last or 0) / steps)
    return RunStatus(run_id=run.id, state=run.state, terminal=run.terminal,
                     executor=run.executor, external_id=run.external_id,
                     exit_code=run.exit_code, last_iteration=last, steps=steps,
                     progress_pct=pct, message=run.message, log_path=run.log_path,
                     created_at=run.created_at, updated_at=run.updated_at)


def status(run_id: str, *, registry: Registry | None = None) -> RunStatus:
    """Ask the executor about the run, store the answer, and report it with progress."""
    reg = registry or Registry()
    _get(reg, run_id)
    return _status(refresh_run(reg, run_id))


def result(run_id: str, *, registry: Registry | None = None,
           golden_tflops: float | None = None, regression_pct: float = 5.0) -> RunResult:
    """Judge a run's log against its contract (gates, steady-window metrics, regression)."""
    reg = registry or Registry()
    _get(reg, run_id)
    run = refresh_run(reg, run_id)
    if not run.terminal:
        raise BenchError(f"run_id: run {run_id} is still {run.state}; poll benchmark_status "
                         "and ask for the result once it has finished")
    if not run.log_path or not Path(run.log_path).is_file():
        raise BenchError(f"run_id: run {run_id} ({run.state}) left no log at {run.log_path}: "
                         f"{run.message}")
    contract, reported = with_reported_versions(
        MeasurementContract.model_validate(run.contract), run.log_path)
    judged = evaluate_run(parse_log(run.log_path), contract, golden_tflops=golden_tflops,
                          regression_pct=regression_pct, exit_code=run.exit_code)
    reg.set_result(run.id, judged.model_dump(mode="json"))
    unknown = [k for k, v in contract.versions.model_dump().items() if v is None]
    evidence = {**evidence_bundle(judged, contract), "versions_reported": reported,
                "versions_unknown": unknown}
    markdown = render_markdown(judged, contract)
    if unknown:
        markdown += ("\n\nVersions unknown (the run did not report them and none were given): "
                     + ", ".join(unknown) + "\n")
    return RunResult(run_id=run.id, state=run.state, result=judged, evidence=evidence,
                     markdown=markdown)


_VERSION_VALUE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_\-:]{0,63}")
HEAD_BYTES = 1 << 20


def reported_versions(log_path: str | Path) -> dict[str, str]:
    """The library versions the job's Python reported (the launch script's
    ``mbridge-perf versions: {json}`` line near the top of the log); {} when there is none."""
    try:
        with open(log_path, "rb") as fh:
            head = fh.read(HEAD_BYTES)
    except OSError:
        return {}
    prefix = VERSIONS_PREFIX.encode()
    for line in head.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            data = json.loads(line[len(prefix):])
        except ValueError:
            return {}
        if not isinstance(data, dict):
            return {}
        return {k: v for k, v in data.items() if k in VERSION_KEYS and k != "container"
                and isinstance(v, str) and _VERSION_VALUE.fullmatch(v)}
    return {}


def with_reported_versions(contract: MeasurementContract, log_path: str | Path
                           ) -> tuple[MeasurementContract, dict[str, str]]:
    """The contract with each version it did not record filled from what the run reported
    (a version given at submit or the profile's container stays as given)."""
    reported = reported_versions(log_path)
    given = contract.versions.model_dump()
    merged = {k: given[k] if given[k] is not None else reported.get(k) for k in given}
    if merged == given:
        return contract, reported
    return contract.model_copy(update={"versions": Versions(**merged)}), reported


def cancel(run_id: str, *, registry: Registry | None = None) -> RunStatus:
    """Cancel a run this registry made (scancel only for its own jobs)."""
    reg = registry or Registry()
    _get(reg, run_id)
    try:
        return _status(cancel_run(reg, run_id))
    except PermissionError as exc:
        raise BenchError(f"run_id: {exc}") from None


def compare_runs(run_a: str, run_b: str, *, registry: Registry | None = None
                 ) -> RunComparison:
    """A/B of two finished runs: valid only when their contracts differ in one variable."""
    reg = registry or Registry()
    pairs = []
    for run_id in (run_a, run_b):
        judged = result(run_id, registry=reg)
        pairs.append((MeasurementContract.model_validate(judged.evidence["contract"]),
                      judged.result))
    cmp = compare(pairs[0], pairs[1])
    step = next((d for d in cmp.deltas if d.metric == "step_time_ms"), None)
    predicted = predicted_change(
        _get(reg, run_a).config, _get(reg, run_b).config, pairs[0][0].hardware.gpu,
        pairs[1][0].hardware.gpu, None if step is None or step.delta_pct is None
        else round(step.delta_pct, 2))
    return RunComparison(a=run_a, b=run_b, comparison=cmp, predicted=predicted)


def _unreadable(run_id: str, why: str) -> RunStatus:
    """A registry row that cannot be read, named in the listing instead of breaking it."""
    return RunStatus(run_id=run_id, state="unknown", terminal=False, executor="?",
                     external_id=None, exit_code=None, last_iteration=None, steps=None,
                     progress_pct=None, message=why, log_path=None, created_at="",
                     updated_at="")


def list_runs(*, registry: Registry | None = None, state: str | None = None,
              limit: int = 20) -> list[RunStatus]:
    """Runs, newest first; a row that cannot be read is listed by id with the reason (and
    how to remove it) instead of hiding every other run."""
    reg = registry or Registry()
    skipped: list[tuple[str, str]] = []
    out = []
    for run in reg.list(state=state, limit=limit, skipped=skipped):  # type: ignore[arg-type]
        try:
            out.append(_status(run))
        except (ValueError, TypeError, AttributeError, OSError) as exc:  # odd stored contract
            out.append(_unreadable(run.id, f"registry: run {run.id!r} cannot be shown "
                                           f"({type(exc).__name__}); it is skipped"))
    return out + [_unreadable(rid, why) for rid, why in skipped]


def parse(log: str | Path, *, window: tuple[int, int] = (41, 50),
          golden_tflops: float | None = None, regression_pct: float = 5.0,
          num_gpus: int | None = None, seq_length: int | None = None,
          global_batch_size: int | None = None) -> RunResult:
    """The same judgement for a log from any launcher (no contract, no registry)."""
    try:
        parsed = parse_log(Path(log))
    except OSError as exc:
        raise BenchError(f"log: cannot read {log} ({exc.strerror})") from None
    try:
        judged = evaluate(parsed, window=window, golden_tflops=golden_tflops,
                          regression_pct=regression_pct, num_gpus=num_gpus,
                          seq_length=seq_length, global_batch_size=global_batch_size)
    except ValueError as exc:  # its message names the argument (window, golden_tflops, …)
        raise BenchError(str(exc)) from None
    return RunResult(run_id=None, state="parsed", result=judged,
                     evidence=evidence_bundle(judged), markdown=render_markdown(judged))


def parse_window(text: str) -> tuple[int, int]:
    """`41-50` → (41, 50)."""
    start, sep, end = text.partition("-")
    try:
        window = (int(start), int(end))
    except ValueError:
        raise BenchError(f"window: {text!r} is not START-END, e.g. 41-50") from None
    if not sep or not 1 <= window[0] <= window[1]:
        raise BenchError(f"window: {text!r} is not START-END with 1 <= START <= END")
    return window
