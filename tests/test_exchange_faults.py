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
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

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
