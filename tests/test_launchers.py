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
import os
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from conftest import run_python

from rngaudit import launcher

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
    # no rank took another rank's early file for another run's (nothing set aside, no run-*/)
    assert [p.name for p in run.report_dir.iterdir() if p.is_dir()] in ([], ["attempt-1"])
    assert "another run" not in run.stderr, run.stderr[-3000:]


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


# -- Lightning Fabric ----------------------------------------------------------------------------

FABRIC = "tests/frameworks/fabric_train.py"


@pytest.fixture(scope="module", params=["same", "rank"])
def fabric(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    # started as `python train.py`: fabric.launch() starts rank 1
    tmp = tmp_path_factory.mktemp(f"fabric_{request.param}")
    return launch(tmp, [FABRIC, request.param], "warn")


def test_fabric_verdict_matches_the_truth(fabric: Run) -> None:
    run = fabric
    assert run.returncode == 0 and run.stdout.count("finished") == 2, run.stderr[-3000:]
    assert_two_ranks(run)
    distinct, duplicates, total = run.truth()
    if "rank" in run.report_dir.parent.name:  # seed_everything(42 + rank)
        assert total == 32 and duplicates > 0  # measured: corrupted
        assert "sampler-draw-divergence" in errors(run.report())
    else:
        assert (distinct, duplicates, total) == (32, 0, 32)
        assert errors(run.report()) == []


# -- torchrun --max-restarts ----------------------------------------------------------------------

RESTART = "tests/frameworks/restart_train.py"
# torch 2.13's shared rendezvous store keeps attempt 0's gloo keys: attempt 1's
# init_process_group then connects to dead ranks, audited or not (pytorch/pytorch#135712).
RESTART_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


@pytest.fixture(scope="module", params=["same", "skew"])
def restart(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    tmp = tmp_path_factory.mktemp(f"restart_{request.param}")
    (tmp / "snap").mkdir()
    args = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "--max-restarts=1", RESTART, request.param]  # fmt: skip
    return launch(tmp, args, "warn", SNAP_DIR=str(tmp / "snap"), **RESTART_ENV)


def test_torchrun_restart_reports_per_attempt(restart: Run) -> None:
    """Attempt 0 (epoch 0 intact, then rank 1 fails) keeps its files; attempt 1 writes its own
    in attempt-1/; the restarted attempt's verdict matches what it trained on."""
    run = restart
    assert run.returncode == 0 and "rank 1 fails" in run.stdout, run.stderr[-3000:]
    assert run.stdout.count("finished") == 2
    assert_two_ranks(run)  # attempt 0, left where it was
    first = run.report()
    assert errors(first) == []
    second = Run(*run[:3], run.report_dir / "attempt-1", run.truth_dir)
    assert_two_ranks(second)
    assert second.report()["run_id"] != first["run_id"]
    distinct, duplicates, total = run.truth()  # the resumed epoch, logged by attempt 1
    if "skew" in run.report_dir.parent.name:  # the ranks resumed at epochs 2 and 1
        assert total == 32 and duplicates > 0
        found = [f for f in second.report()["findings"] if f["severity"] == "error"]
        assert found and "torchrun restart attempt 1" in found[0]["message"]
        assert found[0]["details"]["resumed"] == ["torchrun restart attempt 1"]
    else:
        assert (distinct, duplicates, total) == (32, 0, 32)
        assert errors(second.report()) == []


def test_rngaudit_report_answers_for_every_attempt(restart: Run) -> None:
    """``rngaudit report DIR`` over attempt 0 (clean) and attempt-1/: the worst verdict, each
    finding named by its attempt; ``--attempt N`` reads one; the files stay where they are."""

    def cli(*args: str) -> tuple[int, str]:
        proc = run_python(["-m", "rngaudit", "report", str(restart.report_dir), *args])
        return proc.returncode, proc.stdout + proc.stderr

    skew = "skew" in restart.report_dir.parent.name
    status, text = cli()
    assert status == (1 if skew else 0), text
    assert "attempt 0: " in text and "attempt 1: " in text  # the audits of both attempts
    status, data = cli("--format", "json")
    found = json.loads(data)["findings"]
    assert {f["details"]["attempt"] for f in found} <= {0, 1}
    assert all(f["message"].startswith(f"[attempt {f['details']['attempt']}] ") for f in found)
    errors_by_attempt = {f["details"]["attempt"] for f in found if f["severity"] == "error"}
    assert errors_by_attempt == ({1} if skew else set())
    assert "[attempt 1] " in text if skew else "[error]" not in text
    assert cli("--attempt", "0")[0] == 0  # attempt 0 alone: clean
    assert cli("--attempt", "1")[0] == (1 if skew else 0)
    status, text = cli("--attempt", "2")
    assert status == 2 and "no report of attempt 2" in text and "(attempts: 0, 1)" in text, text
    assert (restart.report_dir / "report.json").is_file()  # each attempt's files where they were
    assert (restart.report_dir / "attempt-1" / "report.json").is_file()


# -- accelerate save_state / load_state ---------------------------------------------------------

RESUME = "tests/frameworks/resume_train.py"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One saved run (epoch 0 trained, save_state), shared by the resumes."""
    tmp = tmp_path_factory.mktemp("save")
    run = launch(tmp, [*TORCHRUN, RESUME, "save", str(tmp / "ckpt")], "1")
    assert run.returncode == 0, run.stderr[-3000:]
    return tmp / "ckpt"


@pytest.fixture(scope="module", params=["intact", "rank-1-rng-missing"])
def resume(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, checkpoint: Path
) -> Run:
    tmp = tmp_path_factory.mktemp(f"resume_{request.param}")
    ckpt = tmp / "ckpt"
    ckpt.mkdir()
    for saved in checkpoint.iterdir():
        if not (request.param != "intact" and saved.name == "random_states_1.pkl"):
            (ckpt / saved.name).write_bytes(saved.read_bytes())
    return launch(tmp, [*TORCHRUN, RESUME, "resume", str(ckpt)], "warn")


def test_accelerate_resume_verdict_matches_the_truth(resume: Run) -> None:
    run = resume
    assert run.returncode == 0 and run.stdout.count("finished") == 2, run.stderr[-3000:]
    assert_two_ranks(run)
    distinct, duplicates, total = run.truth()
    if "missing" in run.report_dir.parent.name:
        assert total == 32 and duplicates > 0  # measured: rank 1 shuffled on its own state
        found = [f for f in run.report()["findings"] if f["severity"] == "error"]
        # at the resumed epoch's first batch; and (warn mode trains on) the observed partition
        # at its end, with the overlap measured above
        assert [f["kind"] for f in found] == ["sampler-draw-divergence", "partition-overlap"]
        assert found[1]["details"]["shared"] == duplicates
        assert found[1]["details"]["never"] == total - distinct
        for finding in found:
            assert (
                "The run resumed before this (Accelerator.load_state() at resume_train.py:"
                in finding["message"]
            )
    else:
        assert (distinct, duplicates, total) == (32, 0, 32)
        assert errors(run.report()) == []


STATEFUL_RESUME = "tests/frameworks/stateful_resume.py"


@pytest.fixture(scope="module", params=["same-step", "rank-1-one-step-later"])
def stateful_resume(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Run:
    skew = "0" if request.param == "same-step" else "1"
    tmp = tmp_path_factory.mktemp(f"stateful_{request.param}")
    return launch(tmp, [*TORCHRUN, STATEFUL_RESUME, skew], "warn")


def test_stateful_loader_resume_position_matches_the_truth(stateful_resume: Run) -> None:
    run = stateful_resume
    assert run.returncode == 0 and run.stdout.count("finished") == 2, run.stderr[-3000:]
    assert_two_ranks(run)
    steps = [len(json.loads((run.truth_dir / f"rank-{r}.json").read_text())) for r in (0, 1)]
    found = [f for f in run.report()["findings"] if f["severity"] == "error"]
    if "later" in run.report_dir.parent.name:
        assert steps[0] != steps[1]  # measured: the ranks train different batches after it
        assert [f["kind"] for f in found] == ["sampler-draw-divergence"]
        assert "different positions of the epoch" in found[0]["message"]
        assert found[0]["details"]["positions"] == {"0": 4, "1": 5}
    else:
        assert steps[0] == steps[1]
        assert found == []


# -- Ray Train ------------------------------------------------------------------------------------

RAY = "tests/frameworks/ray_train.py"


@pytest.fixture(scope="module", params=["same", "rank"])
def ray_train(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Run:
    if os.environ.get("RNGAUDIT_TEST_RAY") != "1":
        pytest.skip(
            "Ray Train is opt-in (RNGAUDIT_TEST_RAY=1, pip install 'ray[train]==2.60.0'): its two "
            "runs cost ~85 s of make test's 12-minute budget on 2 cores"
        )
    pytest.importorskip("ray.train")
    tmp = tmp_path_factory.mktemp(f"ray_{request.param}")
    # the driver passes RNGAUDIT* to the workers through runtime_env (ray_train.py)
    return launch(tmp, [RAY, request.param], "warn", RAY_DEDUP_LOGS="0")


def test_ray_train_verdict_matches_the_truth(ray_train: Run) -> None:
    run = ray_train
    assert run.returncode == 0 and "finished" in run.stdout, run.stderr[-3000:]
    assert_two_ranks(run)  # the driver is no rank
    distinct, duplicates, total = run.truth()
    if "rank" in run.report_dir.parent.name:  # random_split seeded with the rank
        assert total == 32 and duplicates > 0
        assert "dataset-divergence" in errors(run.report())
    else:
        assert (distinct, duplicates, total) == (32, 0, 32)
        assert errors(run.report()) == []


def test_restart_attempt_exchanges_do_not_see_earlier_attempts_keys(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempts that share one store (torch's shared rendezvous store) exchange under their own
    prefix: a decision attempt 0 left is not attempt 1's."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    from rngaudit.ranks import store as protocol

    shared = dist.HashStore()  # type: ignore[attr-defined]
    monkeypatch.setattr(distributed_c10d, "_get_default_store", lambda: shared)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    protocol.default().set("rngaudit/a/x/0/decision", b"attempt 0")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    view = protocol.default()
    assert view is protocol.default()  # one view per store (PENDING keys on its id)
    assert not view.check(["rngaudit/a/x/0/decision"])
    view.set("rngaudit/a/x/0/decision", b"attempt 1")
    assert shared.get("rngaudit/a/x/0/decision") == b"attempt 0"


def test_the_launchers_facts_are_read_in_one_place_and_never_raise() -> None:
    env = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "MASTER_ADDR": "node7",
        "MASTER_PORT": "29500",
    }
    assert launcher.rank(env) == 3 and launcher.world_size(env) == 8
    assert launcher.local_rank(env) == 1 and launcher.restart_attempt(env) == 2
    assert launcher.store_host(env) == 0 and launcher.store_address(env) == "node7:29500"
    assert launcher.store_host({"TORCHELASTIC_USE_AGENT_STORE": "True"}) is None
    for bad in ({}, {"RANK": "", "WORLD_SIZE": ""}, {"RANK": "x", "WORLD_SIZE": "-2"}):
        assert launcher.rank(bad) == 0 and launcher.world_size(bad) == 1
        assert launcher.local_rank(bad) == 0 and launcher.restart_attempt(bad) == 0
    assert launcher.restart_attempt({"TORCHELASTIC_RESTART_COUNT": "-1"}) == 0
    assert launcher.store_address({}) == "?:?"
    assert launcher.node() and not launcher.forked_since(os.getpid())
    assert launcher.forked_since(os.getpid() + 1)
