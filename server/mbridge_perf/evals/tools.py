"""Grade our own tools: a case with a ``config`` (and for diagnose_oom a ``log``) names a
``tool``; run it and grade its ``answer_markdown`` as a golden answer. A tool that does not
exist yet is reported as unscored, never faked."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mbridge_perf.config.errors import ConfigError
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.evals.answer import from_json
from mbridge_perf.evals.cases import Case, Outcome, SuiteError
from mbridge_perf.evals.grade import grade_case

MAX_INPUT_BYTES = 2_000_000
_SOURCE_KEYS = {"preset", "file", "bridge_config", "overrides", "perf_flags"}


def case_file(case: Case, rel: str, what: str) -> str:
    """A file the case names, confined to its skill's evals/ folder (never elsewhere)."""
    folder = (case.skill.path / "evals").resolve()
    path = (folder / rel).resolve()
    if not path.is_relative_to(folder) or not path.is_file():
        raise SuiteError(f"{case.id}: {what} {rel!r} must be a file under "
                         f"{case.skill.folder_name}/evals/")
    if path.stat().st_size > MAX_INPUT_BYTES:
        raise SuiteError(f"{case.id}: {what} {rel!r} is larger than {MAX_INPUT_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def case_config(case: Case) -> TrainingConfig | None:
    """The case's config: a YAML/JSON file under the skill's evals/ or an inline mapping (a
    Bridge mapping, or preset / file / bridge_config / overrides / perf_flags)."""
    from mbridge_perf.config.load import ConfigSource, load_source

    raw = case.data.get("config")
    if raw is None:
        return None
    if isinstance(raw, str):
        src = ConfigSource(bridge_config=case_file(case, raw, "config"))
    elif set(raw) <= _SOURCE_KEYS:
        fields = {k: v for k, v in raw.items() if k != "file"}
        if "file" in raw:
            fields["bridge_config"] = case_file(case, raw["file"], "config.file")
        src = ConfigSource(**fields)
    else:
        src = ConfigSource(bridge_config=raw)
    try:
        return load_source(src)
    except ConfigError as exc:
        raise SuiteError(f"{case.id}: config: {exc}") from None


def _recommend(cfg: TrainingConfig | None, log: str | None, args: dict[str, Any]) -> Any:
    from mbridge_perf.advise.recompute import recommend_recompute

    return recommend_recompute(_need(cfg), args.get("target_gib"), gpu=args.get("gpu"))


def _diagnose(cfg: TrainingConfig | None, log: str | None, args: dict[str, Any]) -> Any:
    from mbridge_perf.advise.oom import diagnose_oom

    if log is None:
        raise SuiteError("diagnose_oom needs the case's log")
    return diagnose_oom(log, cfg)


def _estimate(cfg: TrainingConfig | None, log: str | None, args: dict[str, Any]) -> Any:
    from mbridge_perf.memory.answer import estimate_with_answer

    return estimate_with_answer(_need(cfg), gpu=args.get("gpu"),
                                imbalance=float(args.get("imbalance", 1.0)))


def _plan(cfg: TrainingConfig | None, log: str | None, args: dict[str, Any]) -> Any:
    from mbridge_perf.advise.parallelism import plan_parallelism

    return plan_parallelism(_need(cfg), **args)


def _need(cfg: TrainingConfig | None) -> TrainingConfig:
    if cfg is None:
        raise SuiteError("this tool needs the case's config")
    return cfg


TOOLS: dict[str, Callable[[TrainingConfig | None, str | None, dict[str, Any]], Any]] = {
    "recommend_recompute": _recommend, "diagnose_oom": _diagnose,
    "estimate_memory": _estimate, "plan_parallelism": _plan,
}


def run_tool(case: Case) -> dict[str, Any]:
    """The tool's output as JSON data (raises ImportError when the tool does not exist)."""
    tool = case.data["tool"]
    cfg = case_config(case)
    log = case_file(case, case.data["log"], "log") if "log" in case.data else None
    out = TOOLS[tool](cfg, log, dict(case.data.get("tool_args", {})))
    return out.model_dump(mode="json") if hasattr(out, "model_dump") else dict(out)


def tool_outcome(case: Case, root: Path) -> Outcome | None:
    tool = case.data.get("tool")
    if tool is None:
        return None
    name = f"tool:{tool}"
    t0 = time.perf_counter()
    try:
        data = run_tool(case)
    except (ImportError, AttributeError) as exc:
        return Outcome(case.id, case.skill.folder_name, name, "tool", None, True,
                       f"unscored: {tool} is not available in this build ({exc})")
    except (SuiteError, ValueError) as exc:
        return Outcome(case.id, case.skill.folder_name, name, "tool", None, False,
                       f"{tool} failed on the case's input: {exc}")
    answer = from_json(data, [tool])
    grade = grade_case(case.data, case.skill.card, answer, case.skill.folder_name)
    failed = [e.text for e in grade.expectations if not e.passed]
    note = "" if grade.passed else f"{tool} answer_markdown failed: " + "; ".join(failed[:3])
    return Outcome(case.id, case.skill.folder_name, name, "tool", grade, grade.passed, note,
                   time.perf_counter() - t0)
