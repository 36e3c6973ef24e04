"""Miscellaneous training-config checks on fields users set: PEFT, scheduler units, ModelOpt
(constraint catalog section O)."""

from __future__ import annotations

from typing import Any

from mbridge_perf.config.derived import Derived
from mbridge_perf.config.model import TrainingConfig
from mbridge_perf.rules.catalog import Violation, rule


def _section(c: TrainingConfig, name: str) -> dict[str, Any]:
    raw = c.carried().get(name)
    return raw if isinstance(raw, dict) else {}


def _count(value: Any) -> int | float | None:
    """A scheduler count the user set (None, 0 and non-numbers count as unset)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value
    return value if ok else None


@rule("peft.needs-pretrained-checkpoint", "error", ref="O1", source="megatron-bridge",
      fields=("peft", "checkpoint.pretrained_checkpoint"), skill=None,
      summary="PEFT needs checkpoint.pretrained_checkpoint")
def _peft_needs_pretrained(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.carried().get("peft") is None or _section(c, "checkpoint").get("pretrained_checkpoint"):
        return None
    return Violation("a peft section without checkpoint.pretrained_checkpoint",
                     "set checkpoint.pretrained_checkpoint to the base model checkpoint path")


@rule("scheduler.samples-vs-iters", "error", ref="O2", source="megatron-bridge",
      fields=("train.train_samples", "scheduler.lr_decay_iters", "scheduler.lr_warmup_iters",
              "scheduler.lr_decay_samples", "scheduler.lr_warmup_samples",
              "scheduler.lr_warmup_fraction"), skill=None,
      summary="sample-based and iteration-based scheduler fields must not be mixed")
def _samples_vs_iters(c: TrainingConfig, d: Derived) -> Violation | None:
    s = _section(c, "scheduler")
    by_samples = c.train.carried().get("train_samples") is not None
    unit, other = ("samples", "iters") if by_samples else ("iters", "samples")
    wrong = [f"lr_{k}_{other}={s[f'lr_{k}_{other}']}" for k in ("decay", "warmup")
             if _count(s.get(f"lr_{k}_{other}")) is not None]
    if s.get("lr_warmup_fraction") is not None and _count(s.get(f"lr_warmup_{unit}")):
        wrong.append(f"lr_warmup_fraction together with lr_warmup_{unit}")
    if not wrong:
        return None
    mode = "train.train_samples is set" if by_samples else "training is iteration-based"
    return Violation(f"{mode} but {', '.join(wrong)}",
                     f"use the scheduler.lr_*_{unit} fields (and at most one of "
                     f"lr_warmup_fraction / lr_warmup_{unit})")


@rule("scheduler.warmup-before-decay", "warning", ref="O4", source="skill",
      fields=("scheduler.lr_warmup_iters", "scheduler.lr_decay_iters", "train.train_iters"),
      skill=None, summary="lr_warmup_iters should be below lr_decay_iters (default train_iters)")
def _warmup_before_decay(c: TrainingConfig, d: Derived) -> Violation | None:
    # The skill states an assert; current Megatron caps the warmup with a warning instead, so
    # this is a warning: the schedule silently differs from the one written.
    s = _section(c, "scheduler")
    warmup = _count(s.get("lr_warmup_iters"))
    decay = _count(s.get("lr_decay_iters")) or _count(c.train.train_iters)
    if warmup is None or decay is None or warmup < decay:
        return None
    return Violation(f"lr_warmup_iters={warmup} ≥ lr_decay_iters={decay}: the learning rate "
                     "never decays as written", "lower scheduler.lr_warmup_iters below "
                                                f"{decay} (or raise lr_decay_iters)")


@rule("modelopt.no-grad-accum-fusion", "error", ref="O5", source="megatron-bridge",
      fields=("model.restore_modelopt_state", "model.gradient_accumulation_fusion"), skill=None,
      summary="ModelOpt / quantized model restore forbids gradient_accumulation_fusion")
def _modelopt_no_grad_accum_fusion(c: TrainingConfig, d: Derived) -> Violation | None:
    if c.model.carried().get("restore_modelopt_state") is not True or \
            not c.model.gradient_accumulation_fusion:
        return None
    return Violation("restore_modelopt_state=True with gradient_accumulation_fusion=True",
                     "set model.gradient_accumulation_fusion = false")
