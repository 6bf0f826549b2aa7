"""Two jobs given one report directory at once: each job's report survives, whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

AUDITS = 30

# One job: AUDITS audits in one process, each written before the next. It pauses after
# audit ``argv[3]`` until the file ``argv[4]`` exists (the other job's signal) and creates
# ``argv[5]`` when it reached that point; "-" skips either.
JOB = r"""
import random, sys, time
from pathlib import Path
import rngaudit
from rngaudit import report_files
report_dir, audits, pause_after, wait_for, signal = sys.argv[1:6]
audits, pause_after = int(audits), int(pause_after)
for i in range(audits):
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        random.random()
    report_files.flush()
    if i == pause_after:
        if signal != "-":
            Path(signal).touch()
        if wait_for != "-":
            deadline = time.monotonic() + 120
            while not Path(wait_for).exists():
                assert time.monotonic() < deadline, "the other job never signalled"
                time.sleep(0.01)  # polling for the other job's signal file, not a fixed wait
print("finished")
"""


def start(report_dir: Path, pause_after: int, wait_for: str, signal: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(PYTHONPATH=str(ROOT), PYTHONWARNINGS="default")
    args = [str(report_dir), str(AUDITS), str(pause_after), wait_for, signal]
    return subprocess.Popen(
        [sys.executable, "-c", JOB, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def audits_in(path: Path) -> tuple[str, int]:
    doc = json.loads(path.read_text())
    return doc["run_id"], len(doc["audits"])


def test_two_jobs_writing_into_one_directory_both_keep_their_whole_report(tmp_path: Path) -> None:
    shared = tmp_path / "report"
    halfway, started = tmp_path / "a-halfway", tmp_path / "b-started"
    # job A writes 15 audits, waits until job B (started then) has written its first audit
    # (which sets A's files aside, as a new run does), then writes its other 15
    job_a = start(shared, AUDITS // 2 - 1, str(started), str(halfway))
    deadline = time.monotonic() + 120
    while not halfway.exists():
        assert job_a.poll() is None, job_a.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)  # polling for job A's signal file, not a fixed wait
    job_b = start(shared, 0, "-", str(started))
    out_b, err_b = job_b.communicate(timeout=240)
    out_a, err_a = job_a.communicate(timeout=240)
    assert job_a.returncode == 0 and job_b.returncode == 0, (err_a[-3000:], err_b[-3000:])
    assert "finished" in out_a and "finished" in out_b

    # B, the latest run, holds the directory's top level: every one of its audits
    run_b, count_b = audits_in(shared / "report.json")
    assert count_b == AUDITS and audits_in(shared / "rank-0.json") == (run_b, AUDITS)
    # A was told, once, and its whole report is in run-<its id>/
    moved = [p for p in shared.iterdir() if p.name.startswith("run-")]
    assert len(moved) == 1, sorted(p.name for p in shared.iterdir())
    run_a = moved[0].name[len("run-") :]
    assert run_a != run_b
    assert audits_in(moved[0] / "report.json") == (run_a, AUDITS)
    assert audits_in(moved[0] / "rank-0.json") == (run_a, AUDITS)
    assert err_a.count("another run") == 1, err_a[-3000:]
    assert f"run id {run_b}" in err_a and str(moved[0]) in err_a
    assert "another run" not in err_b, err_b[-3000:]


def test_one_job_alone_is_never_told_of_another_run(tmp_path: Path) -> None:
    shared = tmp_path / "report"
    shared.mkdir()
    # an earlier run's files are there (as after any earlier run): set aside, no warning
    earlier = start(shared, -1, "-", "-")
    assert earlier.communicate(timeout=240)[1].count("another run") == 0
    job = start(shared, -1, "-", "-")
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    assert "another run" not in err, err[-3000:]
    assert sorted(p.name for p in shared.iterdir()) == ["previous", "rank-0.json", "report.json"]
    assert audits_in(shared / "report.json")[1] == AUDITS
    assert audits_in(shared / "previous" / "report.json")[1] == AUDITS
