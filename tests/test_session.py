"""Unit tests for rngaudit.ranks.session (and its policy) in one process: findings, files."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from rngaudit.audit_report import AuditReport
from rngaudit.errors import RNGAuditTimeoutError, RNGAuditWarning, RNGDivergenceError
from rngaudit.findings import (
    PERSISTENT_WORKER_STREAM,
    RANK_MISSING,
    WORKER_DUPLICATE_STREAM,
    Finding,
    severity_rank,
    worst,
)
from rngaudit.ranks import session as session_mod
from rngaudit.ranks.policy import act, fails, warns
from rngaudit.ranks.session import Session, for_dir


def _worker(dataset: str, path: str = "self.rng", severity: str = "warning") -> Finding:
    return Finding(
        kind=WORKER_DUPLICATE_STREAM,
        severity=severity,
        message=f"{dataset}.{path} is copied into every worker",
        ranks=[0],
        details={"dataset": dataset, "path": path},
    )


def _files(report_dir: Path) -> dict[str, Any]:
    return {p.name: json.loads(p.read_text()) for p in sorted(report_dir.glob("*.json"))}


def test_two_dataset_classes_each_holding_self_rng_keep_two_findings(tmp_path: Path) -> None:
    s = Session(tmp_path, "report")
    s.add_finding(_worker("TrainSet"))
    s.add_finding(_worker("EvalSet"))
    assert [f.details["dataset"] for f in s.findings] == ["TrainSet", "EvalSet"]
    on_disk = _files(tmp_path)["rank-0.json"]["findings"]
    assert [f["details"]["dataset"] for f in on_disk] == ["TrainSet", "EvalSet"]


def test_a_later_check_of_the_same_dataset_and_path_replaces_the_earlier(tmp_path: Path) -> None:
    s = Session(tmp_path, "report")
    s.add_finding(_worker("TrainSet", severity="warning"))
    s.add_finding(_worker("TrainSet", path="self.other"))
    s.add_finding(_worker("TrainSet", severity="error"))
    assert [(f.details["path"], f.severity) for f in s.findings] == [
        ("self.other", "warning"),
        ("self.rng", "error"),
    ]


def test_a_finding_without_a_path_is_never_replaced(tmp_path: Path) -> None:
    s = Session(tmp_path, "report")
    for _ in range(2):
        s.add_finding(Finding(PERSISTENT_WORKER_STREAM, "info", "no path", [0]))
    assert len(s.findings) == 2


def test_a_check_is_one_audit_with_its_verdict_in_the_files(tmp_path: Path) -> None:
    s = Session(tmp_path, "raise")
    s.add_check("epoch 0 of Loader#1", [])
    s.add_check("epoch 1 of Loader#1", [_worker("TrainSet", severity="error")])
    assert [(a["index"], a["verdict"]) for a in s.audits] == [(0, "ok"), (1, "error")]
    assert s.findings[0].audit == 1
    files = _files(tmp_path)
    assert sorted(files) == ["rank-0.json", "report.json"]  # rank 0 writes the merged report
    assert files["report.json"]["verdict"] == "error"
    assert files["rank-0.json"]["audits"] == files["report.json"]["audits"]
    assert s.report().verdict == "error"


def test_reserve_counts_audits_and_for_dir_keeps_one_session_per_directory(
    tmp_path: Path,
) -> None:
    s = Session(tmp_path, "warn")
    assert [s.reserve() for _ in range(3)] == [0, 1, 2]
    first = for_dir(tmp_path / "a", "warn")
    assert for_dir(tmp_path / "a" / ".." / "a", "raise") is first
    assert first.mode == "raise"  # the latest audit's mode
    assert for_dir(tmp_path / "b", "warn") is not first
    session_mod._sessions.clear()


def test_an_unwritable_directory_warns_and_keeps_the_report(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    s = Session(blocker / "reports", "report")
    with pytest.warns(RNGAuditWarning, match="cannot write the report"):
        s.add_check("epoch 0", [_worker("TrainSet")])
    assert len(s.report().findings) == 1


def _report(*findings: Finding) -> AuditReport:
    return AuditReport(findings=list(findings), mode="raise")


def test_act_raises_on_errors_and_names_every_failing_finding() -> None:
    error = Finding("state-divergence", "error", "ranks differ", [0, 1], remedy="seed them")
    with pytest.raises(RNGDivergenceError) as raised:
        act(_report(error, _worker("TrainSet")), "raise")
    assert "rngaudit found 1 problem(s)" in str(raised.value)
    assert "[state-divergence] ranks differ\nFix: seed them" in str(raised.value)
    assert raised.value.report is not None


def test_act_raises_a_timeout_error_naming_the_missing_ranks() -> None:
    missing = Finding(RANK_MISSING, "error", "rank 1 did not arrive", [1])
    with pytest.raises(RNGAuditTimeoutError) as raised:
        act(_report(missing), "raise")
    assert raised.value.missing_ranks == (1,)


def test_act_warns_in_warn_mode_and_stays_silent_in_report_mode() -> None:
    findings = (_worker("A", severity="error"), _worker("B"), _worker("C", severity="info"))
    with pytest.warns(RNGAuditWarning) as warned:
        act(_report(*findings), "warn")
    assert [str(w.message).split()[1] for w in warned] == ["A.self.rng", "B.self.rng"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        act(_report(*findings), "report")


def test_strict_makes_warnings_fail() -> None:
    with pytest.warns(RNGAuditWarning):
        act(_report(_worker("A")), "raise")  # a warning alone does not raise
    with pytest.raises(RNGDivergenceError):
        act(_report(_worker("A")), "raise", strict=True)


def test_the_severity_order_and_finding_identity() -> None:
    assert [severity_rank(s) for s in ("ok", "info", "warning", "error")] == [-1, 0, 1, 2]
    assert worst("ok", "warning") == "warning" and worst(None, "info") == "info"
    assert worst("error", "warning") == "error" and worst(None, "bogus") == "ok"
    assert _worker("A").key() == (WORKER_DUPLICATE_STREAM, "A", "self.rng")
    assert _worker("A").key() != _worker("B").key()


def test_the_policy_per_finding_is_the_one_act_applies() -> None:
    error, warning, info = (_worker("A", severity=s) for s in ("error", "warning", "info"))
    assert [fails(f, "raise") for f in (error, warning, info)] == [True, False, False]
    assert [fails(f, "raise", strict=True) for f in (error, warning, info)] == [True, True, False]
    assert not fails(error, "warn") and not fails(error, "report")
    assert [warns(f, "warn") for f in (error, warning, info)] == [True, True, False]
    assert not warns(error, "report")
