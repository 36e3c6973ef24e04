"""torchrun's failure summary: the last root cause's rank and exit code are read from the log's
tail (torchrun exits 1 whatever its workers exited with)."""

from __future__ import annotations

from pathlib import Path

from mbridge_perf.bench.executors import torchrun_root_cause

SUMMARY = """[rank1]: Traceback (most recent call last):
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-12-02_04:00:00
  host      : node1
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 1234)
  error_file: <N/A>
============================================================
"""


def test_the_last_root_cause_is_read(tmp_path: Path) -> None:
    log = tmp_path / "slurm.out"
    log.write_text("step 1\n" + SUMMARY.format(rank=3, code=-9) + "retry\n"
                   + SUMMARY.format(rank=1, code=137))
    assert torchrun_root_cause(log) == (1, 137)


def test_no_summary_or_a_broken_one_is_none(tmp_path: Path) -> None:
    log = tmp_path / "slurm.out"
    log.write_text("iteration 10 | loss 2.1\n")
    assert torchrun_root_cause(log) is None
    log.write_text("Root Cause (first observed failure):" + " " * 5000 + "rank : 2\n")
    assert torchrun_root_cause(log) is None
