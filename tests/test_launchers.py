"""Launchers that fork their ranks in-process: accelerate's ``notebook_launcher`` and
``torch.multiprocessing.start_processes(..., start_method="fork")``.

Real 2-rank runs on CPU (gloo) of ``tests/frameworks/fork_train.py``. The notebook rows call
``notebook_launcher`` from a plain script: outside IPython (and outside Colab / Kaggle) accelerate
1.15.0 takes the same branch a notebook cell does for ``num_processes > 1`` on CPU,
``elastic_launch`` with ``start_method="fork"`` (``accelerate/launchers.py``), so the ranks are
forked from the calling process exactly as from a kernel (Jupyter is not in the pinned test
environment). Each rank logs the indices it trains on in epoch 0 (``tests/frameworks/truth.py``),
measured without the auditor; corrupted rows run in ``warn`` mode so training goes on and the
truth is logged. One launch per row (module fixtures).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import run_python

pytestmark = pytest.mark.timeout(300)

FORK = "tests/frameworks/fork_train.py"
CELL = "tests/frameworks/notebook_cell.py"  # the kernel started unaudited; a cell arms it


class Run(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    report_dir: Path
    truth_dir: Path

    def report(self) -> dict[str, Any]:
        return json.loads((self.report_dir / "report.json").read_text())  # type: ignore[no-any-return]

    def rank_file(self, rank: int) -> dict[str, Any]:
        return json.loads((self.report_dir / f"rank-{rank}.json").read_text())  # type: ignore[no-any-return]

    def files(self) -> list[str]:
        return sorted(p.name for p in self.report_dir.iterdir() if p.is_file())

    def truth(self) -> tuple[int, int, int]:
        """(distinct samples, duplicated samples, total) trained on by both ranks in epoch 0."""
        files = [self.truth_dir / f"rank-{r}.json" for r in (0, 1)]
        seen = [i for path in files for i in json.loads(path.read_text())]
        return len(set(seen)), len(seen) - len(set(seen)), len(seen)


def launch(tmp: Path, args: list[str], mode: str | None, **env: str) -> Run:
    """Run ``args`` (audited in ``mode`` when given) with a fresh report and truth dir."""
    report, truth = tmp / "report", tmp / "truth"
    truth.mkdir(parents=True)
    full = {"TRUTH_DIR": str(truth), "RNGAUDIT_TIMEOUT": "60", "RNGAUDIT_REPORT_DIR": str(report)}
    if mode is not None:
        full["RNGAUDIT"] = mode
    full.update(env)
    proc = run_python(args, env=full, timeout=280)
    return Run(proc.returncode, proc.stdout, proc.stderr, report, truth)


def errors(report: dict[str, Any]) -> list[str]:
    return [f["kind"] for f in report["findings"] if f["severity"] == "error"]


def assert_two_ranks(run: Run) -> None:
    """One file per rank and the merged report, each saying world size 2 (the parent, which
    forked the ranks, and the ranks' DataLoader workers wrote none)."""
    assert run.files() == ["rank-0.json", "rank-1.json", "report.json"], run.stderr[-3000:]
    report = run.report()
    assert report["world_size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    for rank in (0, 1):
        filed = run.rank_file(rank)
        assert (filed["rank"], filed["world_size"]) == (rank, 2)
        assert filed["run_id"] == report["run_id"]


# -- notebook_launcher ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def notebook_clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory.mktemp("nb_clean"), [FORK, "notebook", "same"], "1")


def test_notebook_launcher_correct_run_is_clean(notebook_clean: Run) -> None:
    run = notebook_clean
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("finished") == 2 and "Traceback" not in run.stderr
    assert run.truth() == (32, 0, 32)  # measured: every sample once
    assert_two_ranks(run)
    report = run.report()
    assert report["verdict"] != "error" and errors(report) == []
    assert any(a["label"].startswith("Accelerator.prepare()") for a in report["audits"])


@pytest.fixture(scope="module")
def notebook_corrupted(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # armed from a cell (docs/with-notebook-launcher.md), not by the start-up hook
    return launch(tmp_path_factory.mktemp("nb_rank"), [CELL, "warn", "rank"], None)


def test_notebook_launcher_per_rank_seed_is_an_error(notebook_corrupted: Run) -> None:
    run = notebook_corrupted
    assert run.returncode == 0, run.stderr[-3000:]
    distinct, duplicates, total = run.truth()
    assert total == 32 and distinct < 32 and duplicates > 0  # measured: corrupted
    assert_two_ranks(run)
    assert "sampler-draw-divergence" in errors(run.report())
    assert all(run.rank_file(r)["verdict"] == "error" for r in (0, 1))


# -- start_processes(start_method="fork") --------------------------------------------------------


@pytest.fixture(scope="module")
def fork_clean(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory.mktemp("fork_clean"), [FORK, "fork", "same"], "1")


def test_fork_started_ranks_correct_run_is_clean(fork_clean: Run) -> None:
    run = fork_clean
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("finished") == 2 and "Traceback" not in run.stderr
    assert run.truth() == (32, 0, 32)
    assert_two_ranks(run)
    assert errors(run.report()) == []
    summary = run_python(["-m", "rngaudit", "report", str(run.report_dir)])
    assert summary.returncode == 0 and "world size 2" in summary.stdout, summary.stdout


@pytest.fixture(scope="module")
def fork_corrupted(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return launch(tmp_path_factory.mktemp("fork_rank"), [FORK, "fork", "rank"], "warn")


def test_fork_started_ranks_per_rank_sampler_seed_is_an_error(fork_corrupted: Run) -> None:
    run = fork_corrupted
    assert run.returncode == 0, run.stderr[-3000:]
    distinct, duplicates, total = run.truth()
    assert total == 32 and distinct < 32 and duplicates > 0
    assert_two_ranks(run)
    assert errors(run.report())
    assert all(run.rank_file(r)["verdict"] == "error" for r in (0, 1))
    summary = run_python(["-m", "rngaudit", "report", str(run.report_dir)])
    assert summary.returncode == 1 and "world size 2" in summary.stdout, summary.stdout


FORKED_HELPER = """
import multiprocessing as mp, torch
def helper(q):
    q.put(float(torch.rand(1)))
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=helper, args=(q,))
    p.start(); print("drew", q.get()); p.join(); print("exit", p.exitcode)
"""


def test_forked_child_that_is_no_rank_writes_nothing(tmp_path: Path) -> None:
    """A child forked by multiprocessing arms as a rank candidate, but one that neither joins a
    process group nor prepares or iterates a loader (a helper) leaves no file, as at start-up."""
    script = tmp_path / "helper.py"
    script.write_text(FORKED_HELPER)
    run = launch(tmp_path, [str(script)], "1")
    assert run.returncode == 0 and "exit 0" in run.stdout, run.stderr[-3000:]
    assert "rngaudit" not in run.stderr
    assert not run.report_dir.exists()
