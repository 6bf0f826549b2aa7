"""A real two-node run on one machine: two torchrun launchers (c10d rendezvous), two ranks each.

One pair of launchers runs both scenarios in turn (tests/distributed/scenarios.py runs several
in one launch, each from a fresh process's RNG states); the tests read them per scenario.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "distributed" / "scenarios.py"
WORLD = 4  # 2 nodes x 2 ranks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CASES = [("extra_draw_rank0", True), ("repro_seed", False)]


def launch_two_nodes(scenarios: list[str], outdir: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    launchers = []
    for node in (0, 1):
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
            "--nproc_per_node=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=rngaudit-two-nodes", str(SCRIPT), ",".join(scenarios), str(outdir),
        ]  # fmt: skip
        launchers.append(
            subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=env,
                text=True,
                start_new_session=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = []
    for proc in launchers:
        try:
            outputs.append(proc.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            for p in launchers:
                os.killpg(p.pid, signal.SIGKILL)
            raise
    for proc, output in zip(launchers, outputs, strict=True):
        assert proc.returncode == 0, output[-4000:]


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    outdir = tmp_path_factory.mktemp("two-nodes")
    launch_two_nodes([scenario for scenario, _ in CASES], outdir)
    return outdir


@pytest.mark.parametrize(("scenario", "corrupt"), CASES)
def test_two_launchers_give_one_report_and_one_verdict(
    two_nodes: Path, scenario: str, corrupt: bool
) -> None:
    outdir = two_nodes / scenario
    results: dict[int, dict[str, Any]] = {
        r: json.loads((outdir / f"result-rank{r}.json").read_text()) for r in range(WORLD)
    }
    # truth, measured: the epoch-0 partition the four ranks really drew
    partition = results[0]["partition"]
    assert all(results[r]["partition"] == partition for r in range(WORLD))
    measured = partition["missing"] > 0 or partition["duplicates"] > 0
    assert measured == corrupt, partition
    assert {results[r]["world_size"] for r in range(WORLD)} == {WORLD}
    for r in range(WORLD):
        audit = results[r]["audit"]
        assert audit["raised"] == corrupt, (r, audit["error_type"], audit["error_message"])
        if corrupt:
            assert audit["error_type"] == "RNGDivergenceError"
    verdicts = {results[r]["audit"]["report"]["verdict"] for r in range(WORLD)}
    assert len(verdicts) == 1, verdicts  # the same verdict on all four ranks
    report_dir = outdir / "report"
    assert sorted(p.name for p in report_dir.glob("rank-*.json")) == [
        f"rank-{r}.json" for r in range(WORLD)
    ]
    merged = json.loads((report_dir / "report.json").read_text())
    assert merged["world_size"] == WORLD
    assert [rec["rank"] for rec in merged["ranks"]] == list(range(WORLD))
    assert merged["verdict"] == verdicts.pop()
    for r in range(WORLD):  # one file per rank, each with that rank's record and verdict
        rank_file = json.loads((report_dir / f"rank-{r}.json").read_text())
        assert (rank_file["rank"], rank_file["record"]["rank"]) == (r, r)
        assert rank_file["world_size"] == WORLD
        assert rank_file["verdict"] == merged["verdict"]
