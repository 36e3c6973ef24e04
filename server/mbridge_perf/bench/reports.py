"""What the benchmark operations return (the MCP tools' output schemas). Pure models, kept apart
from the service so the server can describe its tools without importing the executors."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from mbridge_perf.bench.predicted import PredictedChange
from mbridge_perf.bench.result import BenchmarkResult, Comparison


class RunHandle(BaseModel):
    run_id: str | None = Field(description="opaque id for benchmark_status / _result / "
                                           "_cancel; None for a dry run")
    dry_run: bool
    state: str
    executor: str
    external_id: str | None = Field(description="Slurm job id or local pid")
    profile: str
    steps: int
    script: str = Field(description="the rendered batch script (what sbatch receives)")
    contract: dict[str, Any] = Field(description="the frozen measurement contract")
    poll_after_s: int
    message: str


class RunStatus(BaseModel):
    run_id: str
    state: str = Field(description="pending | running | completed | failed | cancelled | "
                                   "timeout | lost | unknown")
    terminal: bool
    executor: str
    external_id: str | None
    exit_code: int | None
    last_iteration: int | None = Field(description="last iteration the log reports")
    steps: int | None = Field(description="steps the run was asked for")
    progress_pct: float | None
    message: str
    log_path: str | None
    created_at: str
    updated_at: str


class RunResult(BaseModel):
    run_id: str | None
    state: str
    result: BenchmarkResult
    evidence: dict[str, Any] = Field(description="JSON evidence bundle (result + contract)")
    markdown: str = Field(description="the same evidence as a Markdown report")


class RunComparison(BaseModel):
    a: str
    b: str
    comparison: Comparison
    predicted: PredictedChange | None = Field(
        None, description="the step-time model's expected change for the two configs, beside "
                          "the measured one (bench/predicted.py)")
