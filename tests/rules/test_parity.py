"""Parity with the real Megatron-Core: for every rule Megatron-Core itself enforces, our error
verdict equals Megatron-Core's raise / no-raise on every corpus config.

The corpus (parity_corpus.yaml) is run through mcore_oracle.run_oracle (the installed
megatron-core builds its config dataclasses and the model-build layer placement) and through
our validate(). Configs whose check cannot run without Transformer Engine / Apex / CUDA
("environment_limited") never count either way; configs marked ``version_gap`` (the installed
0.16.1 and the pinned Megatron-Core the catalog follows disagree) are reported, not asserted.
"""

from __future__ import annotations

import importlib
import pkgutil
import time
from dataclasses import dataclass
from typing import Any

import mcore_oracle
import pytest
import yaml
from mcore_oracle import Verdict, mapped_rule_ids, run_oracle

import mbridge_perf.rules as rules_pkg
from mbridge_perf.config.derived import layers_per_chunk
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules import RULES, get_rule, validate

from helpers import REPO, require_megatron

require_megatron()

CORPUS = REPO / "tests" / "rules" / "parity_corpus.yaml"
MIN_CONFIGS = 100
MIN_VALID = 30
MAX_ENV_LIMITED_SHARE = 0.10


def _import_rule_modules() -> dict[str, str]:
    """Import every module of mbridge_perf.rules (the package __init__ may not list the newest
    ones yet) so all rules are registered; name -> error for those that fail to import."""
    errors: dict[str, str] = {}
    for info in pkgutil.iter_modules(rules_pkg.__path__):
        try:
            importlib.import_module(f"{rules_pkg.__name__}.{info.name}")
        except Exception as exc:
            errors[info.name] = f"{type(exc).__name__}: {exc}"
    return errors


IMPORT_ERRORS = _import_rule_modules()


@dataclass(frozen=True)
class Case:
    name: str
    config: dict[str, Any]
    expect: str
    note: str
    version_gap: str | None = None
    pin_expect: str | None = None  # with version_gap: what the pinned Megatron-Core does


def _load() -> list[Case]:
    raw = yaml.safe_load(CORPUS.read_text())
    return [Case(e["name"], e["config"], str(e["expect"]), str(e.get("note", "")),
                 e.get("version_gap"), e.get("pin_expect")) for e in raw]


CASES = _load()


@dataclass(frozen=True)
class Outcome:
    case: Case
    cfg: TrainingConfig
    verdict: Verdict
    our_errors: tuple[str, ...]  # rule ids of our error findings
    our_mcore_errors: tuple[str, ...]  # ... of those whose rule is mcore_enforced
    crash: str | None  # validate() itself raised


def _is_mcore(rule_id: str) -> bool:
    try:
        return get_rule(rule_id).mcore_enforced
    except KeyError:
        return False


outcomes_time: dict[str, float] = {}


@pytest.fixture(scope="module")
def outcomes() -> dict[str, Outcome]:
    """Oracle and validate() once per corpus config (the oracle's time is kept for the
    report)."""
    mcore_oracle.mcore()  # import megatron.core outside the timed loop
    out: dict[str, Outcome] = {}
    spent = 0.0
    for case in CASES:
        cfg = TrainingConfig(**case.config)
        start = time.perf_counter()
        verdict = run_oracle(cfg)
        spent += time.perf_counter() - start
        crash = None
        errors: list[str] = []
        try:
            errors = [f.rule_id for f in validate(cfg).findings if f.severity == "error"]
        except Exception as exc:
            crash = f"{type(exc).__name__}: {exc}"
        out[case.name] = Outcome(case, cfg, verdict, tuple(errors),
                                 tuple(r for r in errors if _is_mcore(r)), crash)
    outcomes_time["oracle_s"] = spent
    return out


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _mcore_text(v: Verdict) -> str:
    if v.status != "raised":
        return v.status
    return "; ".join(f"{r.exc_type}: {r.message} [{r.rule_id or 'unmapped'}]" for r in v.raises)


def _ours_text(o: Outcome) -> str:
    """Our mcore-enforced errors, then (marked) the other errors, which parity ignores."""
    other = [r for r in o.our_errors if r not in o.our_mcore_errors]
    text = ", ".join(o.our_mcore_errors) or "-"
    return text + (f" (not mcore_enforced: {', '.join(other)})" if other else "")


def _table(rows: list[tuple[str, str, str, str]]) -> str:
    head = ("config", "Megatron-Core", "our mcore-enforced errors", "problem")
    widths = (46, 64, 64, 56)
    lines = [" | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))]
    lines.append("-+-".join("-" * w for w in widths))
    for row in rows:
        lines.append(" | ".join(_clip(c, w).ljust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def disagreement(o: Outcome) -> str | None:
    """Why our verdict differs from Megatron-Core's on this config, or None when they agree
    (or when the config does not count: environment-limited or a version gap)."""
    v = o.verdict
    if v.status == "environment_limited" or o.case.version_gap:
        return None
    if o.crash:
        return f"validate() raised {o.crash}"
    raised = v.status == "raised"
    if raised and not o.our_mcore_errors:
        return "Megatron-Core raises; we report no mcore-enforced error"
    if not raised and o.our_mcore_errors:
        return "Megatron-Core accepts; we report an mcore-enforced error"
    if raised:
        missing = [r.rule_id or f"<unmapped: {r.message}>" for r in v.raises
                   if not set(r.covered_by) & set(o.our_errors)]
        if missing:
            return f"Megatron-Core's rule {', '.join(missing)} not among our errors"
    return None


# --------------------------------------------------------------------------------------------


def test_rule_modules_import() -> None:
    assert not IMPORT_ERRORS, f"rule modules that fail to import: {IMPORT_ERRORS}"


def test_corpus_is_well_formed() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), "duplicate corpus names"
    assert len(CASES) >= MIN_CONFIGS
    assert sum(c.expect == "ok" for c in CASES) >= MIN_VALID
    known = set(mapped_rule_ids()) | {"ok", "env-limited"}
    for c in CASES:
        TrainingConfig(**c.config)
        assert c.expect in known, f"{c.name}: expect {c.expect!r} is no mapped rule id"
        assert c.note, f"{c.name}: no note"
        assert c.version_gap is None or c.version_gap.strip(), f"{c.name}: empty version_gap"
        assert (c.pin_expect is None) == (c.version_gap is None), (
            f"{c.name}: pin_expect and version_gap go together")
        assert c.pin_expect is None or c.pin_expect in known | {r.id for r in RULES}, (
            f"{c.name}: pin_expect {c.pin_expect!r} is no rule id of the catalog")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_oracle_verdict_matches_expect(case: Case, outcomes: dict[str, Outcome]) -> None:
    """The corpus documents what Megatron-Core does; guard it against silent drift."""
    v = outcomes[case.name].verdict
    assert v.expect_label == case.expect, (
        f"{case.name}: corpus expects {case.expect!r}, Megatron-Core "
        f"{mcore_oracle.mcore_version()}: {v.summary(400)}")


def test_parity_with_megatron_core(outcomes: dict[str, Outcome]) -> None:
    """MCore raised ⇔ we report an error from an mcore_enforced rule; when it raised, the rule
    its message maps to is among our errors."""
    rows = []
    for o in outcomes.values():
        why = disagreement(o)
        if why:
            rows.append((o.case.name, _mcore_text(o.verdict), _ours_text(o), why))
    counted = sum(o.verdict.status != "environment_limited" and not o.case.version_gap
                  for o in outcomes.values())
    print(f"\nparity: {counted - len(rows)}/{counted} configs agree; oracle "
          f"{outcomes_time.get('oracle_s', 0.0):.2f} s for {len(outcomes)} configs")
    assert not rows, (f"{len(rows)} of {counted} configs disagree with Megatron-Core "
                      f"{mcore_oracle.mcore_version()}:\n{_table(rows)}")


def test_environment_limited_configs_are_few_and_explained(
        outcomes: dict[str, Outcome]) -> None:
    limited = [o for o in outcomes.values() if o.verdict.status == "environment_limited"]
    print(f"\n{len(limited)} environment-limited configs (excluded from parity):")
    for o in limited:
        ours = ", ".join(o.our_errors) or "no errors"
        print(f"  {o.case.name}: {o.verdict.reason} — ours: {ours}")
    assert all(o.verdict.reason for o in limited)
    assert len(limited) <= MAX_ENV_LIMITED_SHARE * len(outcomes), (
        f"{len(limited)} of {len(outcomes)} configs are environment-limited")


def test_version_gap_configs_are_explained(outcomes: dict[str, Outcome]) -> None:
    """Configs where 0.16.1 and the pinned Megatron-Core differ: listed with what each does
    and whether our mcore-enforced errors follow the pin (reported, not asserted)."""
    gaps = [o for o in outcomes.values() if o.case.version_gap]
    print(f"\n{len(gaps)} version-gap configs (reported, not asserted):")
    for o in gaps:
        pin = o.case.pin_expect
        follows = (not o.our_mcore_errors) if pin == "ok" else pin in o.our_errors
        print(f"  {o.case.name}: {o.case.version_gap}\n"
              f"    Megatron-Core {mcore_oracle.mcore_version()}: {o.verdict.summary(160)}\n"
              f"    pin: {pin}; ours: {_ours_text(o)}"
              f" ({'follows the pin' if follows else 'does NOT follow the pin'})")
    assert all(o.case.version_gap and o.case.pin_expect for o in gaps)


def test_every_mcore_enforced_rule_is_exercised(outcomes: dict[str, Outcome]) -> None:
    """Each rule marked mcore_enforced has a corpus config on which Megatron-Core raises a
    message mapped to it (otherwise parity says nothing about it, or the flag is wrong)."""
    raised = {rid for o in outcomes.values() if not o.case.version_gap
              for r in o.verdict.raises for rid in r.covered_by}
    # a rule only the pinned Megatron-Core has is covered by a documented version gap
    raised |= {o.case.pin_expect for o in outcomes.values() if o.case.pin_expect}
    missing = sorted(r.id for r in RULES if r.mcore_enforced and r.id not in raised)
    assert not missing, (
        "mcore_enforced rules that no corpus config makes Megatron-Core raise (add a config, "
        f"or the rule is not enforced by Megatron-Core's config dataclasses): {missing}")


def test_rule_map_ids_exist_in_catalog() -> None:
    ids = {r.id for r in RULES}
    missing = sorted(mapped_rule_ids() - ids)
    assert not missing, f"rule ids in mcore_oracle.RULE_MAP that the catalog lacks: {missing}"


def test_layer_placement_matches_derived(outcomes: dict[str, Outcome]) -> None:
    """Where Megatron-Core builds the model, Derived.layers_per_chunk places the same layers."""
    rows = []
    for o in outcomes.values():
        v, m = o.verdict, o.cfg.model
        if v.layers is None or (m.pipeline_model_parallel_size == 1
                                and m.virtual_pipeline_model_parallel_size):
            continue  # VPP without PP: parallel_state rejects it before any model is built
        ours = layers_per_chunk(m)
        theirs = [list(chunks) for chunks in v.layers]
        if ours != theirs:
            rows.append(f"{o.case.name}: Megatron-Core {theirs}, derived {ours}")
    assert not rows, "layer placement differs:\n" + "\n".join(rows)


@pytest.mark.parametrize(("exc_type", "message", "limited"), [
    ("TypeError", "'>=' not supported between instances of 'NoneType' and 'Version'", True),
    ("ValueError", "apply_rope_fusion is not available. Please install TE >= 1.4.", True),
    ("RuntimeError", "--use-precision-aware-optimizer requires FusedAdam from "
                     "TransformerEngine, but not found.", True),
    ("ImportError", "cannot import name 'fused_permute' from "
                    "'megatron.core.transformer.moe.moe_utils'", True),
    ("ValueError", "TransformerEngine only support gelu, geglu, silu, swiglu, relu, reglu. ",
     False),
    ("AssertionError", "To use full iteration cuda graph, please use cuda_graph_impl=local "
                       "instead of cuda_graph_impl=transformer_engine.", False),
    ("ValueError", "CUDA graphs not supported with CPU offloading.", False),
    ("ValueError", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True is currently not "
                   "supported with nccl_ub due to compatibility issue with torch.cuda.MemPool "
                   "API.", False),
])
def test_environment_limited_classifier(exc_type: str, message: str, limited: bool) -> None:
    """Only failures caused by the missing Transformer Engine / Apex / CUDA are set aside."""
    assert (mcore_oracle.env_limited_reason(exc_type, message) is not None) == limited
