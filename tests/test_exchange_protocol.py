"""The exchange's protocol under real 2-rank torchrun runs: same verdict on every rank, whatever
goes wrong (an audit on one rank only, a late rank, other modes, an exception, Ctrl-C).

One launch runs the scenarios without a signal in turn (SHARED); each Ctrl-C scenario has its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import torchrun

pytestmark = pytest.mark.timeout(300)
SCRIPT = "tests/distributed/exchange_protocol.py"
SHARED = ["modes", "raised", "late_rank1", "late_rank0", "rank0_only"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of one launch that ran every SHARED scenario (``<dir>/<scenario>/``)."""
    root = tmp_path_factory.mktemp("protocol")
    proc = torchrun(SCRIPT, ",".join(SHARED), str(root))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return root


def results(outdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    r0, r1 = (json.loads((outdir / f"result-{r}.json").read_text()) for r in (0, 1))
    return r0, r1


def run(scenario: str, tmp_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A launch of its own for ``scenario``; its results (and report) in ``tmp_path/scenario``."""
    proc = torchrun(SCRIPT, scenario, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return results(tmp_path / scenario)


def by_name(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["name"]: a for a in result["audits"]}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """The same findings, but for the audit index (each rank counts its own audits)."""

    def strip(entry: dict[str, Any]) -> list[dict[str, Any]]:
        return [{k: v for k, v in f.items() if k != "audit"} for f in entry["findings"]]

    return strip(a) == strip(b)


def finding(entry: dict[str, Any], kind: str) -> dict[str, Any]:
    found = [f for f in entry["findings"] if f["kind"] == kind]
    assert len(found) == 1, entry["findings"]
    first: dict[str, Any] = found[0]
    return first


def test_an_audit_on_rank0_only_is_named_and_shifts_nothing_after_it(shared: Path) -> None:
    r0, r1 = results(shared / "rank0_only")
    a0, a1 = by_name(r0), by_name(r1)
    mismatch = finding(a0["A"], "audit-mismatch")
    assert mismatch["severity"] == "warning"
    assert "rank 0 at audit at exchange_protocol.py:" in mismatch["message"]
    assert "rank 1 at audit at exchange_protocol.py:" in mismatch["message"]
    # B: both ranks waited in different audits at once; both say so, the same way
    assert same(a0["B"], a1["B"])
    assert a0["B"]["kinds"] == ["audit-mismatch"]
    # C pairs with C: compared for real (rank 1 drew once more), and nobody timed out
    for entry in (a0["C"], a1["C"]):
        assert "consumption-mismatch" in entry["kinds"], entry["findings"]
        assert "x1; rank 1: x2" in finding(entry, "consumption-mismatch")["message"]
        assert entry["ranks_with_events"] == [0, 1]
    assert same(a0["C"], a1["C"])
    kinds = {k for r in (r0, r1) for a in r["audits"] for k in a["kinds"]}
    assert "rank-missing" not in kinds


@pytest.mark.parametrize("late", [1, 0])
def test_a_rank_arriving_just_after_the_timeout_reaches_the_same_verdict(
    shared: Path, late: int
) -> None:
    r0, r1 = results(shared / f"late_rank{late}")
    on_time = (r1 if late == 0 else r0)["audits"][0]
    tardy = (r0 if late == 0 else r1)["audits"][0]
    for entry in (on_time, tardy):
        assert entry["raised"] == "RNGAuditTimeoutError", entry
        assert entry["kinds"] == ["rank-missing"]
        assert finding(entry, "rank-missing")["ranks"] == [late]
    assert same(on_time, tardy)
    assert tardy["elapsed"] < 2  # it learnt the decision at once, it did not wait again


def test_ranks_in_different_modes_all_act_on_the_strictest(shared: Path) -> None:
    r0, r1 = results(shared / "modes")
    for r in (r0, r1):
        entry = r["audits"][0]
        assert entry["raised"] == "RNGDivergenceError", entry  # rank 1 asked for warn
        message = finding(entry, "mode-mismatch")["message"]
        assert "rank 0: raise; rank 1: warn" in message
        assert "strictest, raise" in message
        assert "dataset-divergence" in entry["kinds"]
    assert same(r0["audits"][0], r1["audits"][0])


def test_a_rank_that_raised_in_the_block_is_reported_as_such(shared: Path) -> None:
    r0, r1 = results(shared / "raised")
    e0, e1 = r0["audits"][0], r1["audits"][0]
    assert e1["raised"] == "ValueError: user code failed on rank 1"  # unchanged on rank 1
    assert e0["raised"] == "RNGDivergenceError"  # every rank stops
    for entry in (e0, e1):
        raised = finding(entry, "rank-raised")
        assert raised["ranks"] == [1]
        assert raised["details"]["exception"] == "ValueError: user code failed on rank 1"
        assert entry["kinds"] == ["rank-raised"]  # not a vague consumption-mismatch
    merged = json.loads((shared / "raised" / "report" / "report.json").read_text())
    assert [f["kind"] for f in merged["findings"]] == ["rank-raised"]
    ranks = {r["rank"]: r for r in merged["ranks"]}
    assert ranks[1]["exception"] == "ValueError: user code failed on rank 1"


def test_ctrl_c_inside_the_block_leaves_at_once_and_tells_the_other_rank(tmp_path: Path) -> None:
    r0, r1 = run("sigint_block", tmp_path)
    e0, e1 = r0["audits"][0], r1["audits"][0]
    assert e1["raised"] == "KeyboardInterrupt: "
    assert e1["elapsed"] < 25  # not the block's 30 s sleep, nor the 60 s timeout
    assert e0["raised"] == "RNGDivergenceError"
    assert finding(e0, "rank-interrupted")["ranks"] == [1]
    assert e0["elapsed"] < 25  # told, not left waiting for the 60 s timeout


def test_ctrl_c_during_the_exchange_wait_surfaces_within_a_second(tmp_path: Path) -> None:
    r0, r1 = run("sigint_wait", tmp_path)
    e0, e1 = r0["audits"][0], r1["audits"][0]
    assert e0["raised"] == "KeyboardInterrupt: "  # within the 60 s timeout's first second
    assert e0["caught_at"] - r1["signalled_at"] < 1.0
    assert e1["raised"] == "RNGDivergenceError"  # the other rank is told at once
    assert finding(e1, "rank-interrupted")["ranks"] == [0]
