"""Tests for rngaudit.reports.run_diff and ``rngaudit diff``: pairs of real runs of one program."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, run_python

from rngaudit.cli import main
from rngaudit.reports.diff_text import render_diff_text
from rngaudit.reports.reading import load_report_dir
from rngaudit.reports.run_diff import diff_dirs, diff_reports

SCRIPT = "tests/envmode/seeded_diff.py"
VARIANTS: dict[str, dict[str, str]] = {
    "base": {},
    "again": {},
    "extra": {"EXTRA": "1"},  # one more torch.rand at init
    "seed": {"SEED": "1"},
    "workers": {"WORKERS": "2"},
}


def line_of(marker: str) -> int:
    for number, text in enumerate((ROOT / SCRIPT).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each variant of the program run once under RNGAUDIT=1: its report directory."""
    root = tmp_path_factory.mktemp("diff-runs")
    dirs = {}
    for name, extra in VARIANTS.items():
        report = root / name
        env = {"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(report), **extra}
        proc = run_python([SCRIPT], env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.strip() == "8"
        dirs[name] = report
    return dirs


def diff_json(capsys: pytest.CaptureFixture[str], a: Path, b: Path) -> tuple[int, Any]:
    status = main(["diff", str(a), str(b), "--format", "json"])
    return status, json.loads(capsys.readouterr().out)


def test_each_rank_records_its_environment(runs: dict[str, Path]) -> None:
    import numpy
    import torch

    merged = json.loads((runs["seed"] / "report.json").read_text())
    own = json.loads((runs["seed"] / "rank-0.json").read_text())
    env = merged["ranks"][0]["environment"]
    assert env == own["record"]["environment"]
    assert env["packages"]["torch"] == str(torch.__version__)
    assert env["packages"]["numpy"] == numpy.__version__
    assert env["seeds"] == {"torch.default_generator": 1}
    assert env["python"] == ".".join(map(str, sys.version_info[:3]))


def test_the_same_program_twice_is_identical(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", str(runs["base"]), str(runs["again"])]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rngaudit diff: IDENTICAL\n")
    assert "Rank 0: identical (" in out
    status, data = diff_json(capsys, runs["base"], runs["again"])
    assert status == 0 and data["identical"] is True
    assert data["environment"] == [] and data["setup"] == []
    assert data["ranks"][0]["position"] is None


def test_an_extra_draw_is_named_at_its_line(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, data = diff_json(capsys, runs["base"], runs["extra"])
    assert status == 1 and data["identical"] is False
    assert data["environment"] == []  # same seed, same versions: only the draws differ
    rank = data["ranks"][0]
    assert rank["reason"] == "only-in-b"
    extra = rank["b"]
    # torch.rand is seen as its leaf op: the call site says what the user called
    assert (extra["op"], extra["generator"]) == ("aten.uniform_", "torch.default_generator")
    assert extra["call_site"]["file"].endswith("seeded_diff.py")
    assert extra["call_site"]["line"] == line_of("extra-draw")
    assert rank["a"]["user_call_site"]["line"] == line_of("model-init")  # where A goes on
    assert rank["before"][-1]["op"] == "torch.manual_seed"
    after = {
        (c["op"], c["count_a"], c["count_b"], c["states_differ"], c["site"].split(" ")[0])
        for c in rank["after"]
    }
    extra_site = f"seeded_diff.py:{line_of('extra-draw')}"
    assert ("aten.uniform_", 0, 1, False, extra_site) in after
    # the model's init drew from another state
    assert any(a[:4] == ("aten.uniform_", 1, 1, True) and a[4] != extra_site for a in after)

    assert main(["diff", str(runs["base"]), str(runs["extra"])]) == 1
    text = capsys.readouterr().out
    assert text.startswith("rngaudit diff: DIFFERENT\n")
    assert "a draw present in run B only" in text
    assert f"at seeded_diff.py:{line_of('extra-draw')} in <module>" in text

    reverse = diff_dirs(runs["extra"], runs["base"])
    assert reverse.ranks[0].reason == "only-in-a"
    assert reverse.ranks[0].a is not None and reverse.ranks[0].a["op"] == "aten.uniform_"


def test_a_different_seed_is_listed_first_then_the_first_draw_it_changed(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, data = diff_json(capsys, runs["base"], runs["seed"])
    assert status == 1
    assert data["environment"] == [
        {"what": "seed of torch.default_generator", "a": "0", "b": "1", "ranks": []}
    ]
    rank = data["ranks"][0]
    assert rank["reason"] == "different-state"
    assert rank["a"]["user_call_site"]["line"] == line_of("model-init")
    assert rank["a"]["fingerprint"] != rank["b"]["fingerprint"]
    main(["diff", str(runs["base"]), str(runs["seed"])])
    text = capsys.readouterr().out
    assert text.index("Environment differences:") < text.index("Rank 0:")
    assert "  seed of torch.default_generator: A 0, B 1\n" in text


def test_a_different_number_of_workers_is_a_setup_difference(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    status, data = diff_json(capsys, runs["base"], runs["workers"])
    assert status == 1
    assert {"what": "DataLoader#1 num_workers", "a": "0", "b": "2", "ranks": []} in data["setup"]
    main(["diff", str(runs["base"]), str(runs["workers"])])
    assert "  DataLoader#1 num_workers: A 0, B 2\n" in capsys.readouterr().out


def test_markdown_and_html(runs: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", str(runs["base"]), str(runs["extra"]), "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    assert md.startswith("# rngaudit diff: DIFFERENT\n")
    assert f"seeded_diff.py:{line_of('extra-draw')} in &lt;module&gt;" in md
    assert main(["diff", str(runs["base"]), str(runs["extra"]), "--format", "html"]) == 1
    page = capsys.readouterr().out
    assert page.startswith("<!DOCTYPE html>")
    assert page.count('id="first-divergence"') == 1
    assert "only in B" in page


def _widened(directory: Path, size: int, pattern: list[Path]) -> Any:
    """A report of ``size`` ranks made of real rank records: rank r repeats the record of
    the run ``pattern[r % len(pattern)]`` (what a wide world of equal ranks records)."""
    reports = [load_report_dir(path) for path in pattern]
    wide = copy.deepcopy(load_report_dir(directory))
    wide.world_size = size
    wide.ranks = []
    for rank in range(size):
        record = copy.deepcopy(reports[rank % len(pattern)].ranks[0])
        record["rank"] = rank
        wide.ranks.append(record)
    return wide


def test_a_wide_world_groups_ranks_with_the_same_outcome(runs: dict[str, Path]) -> None:
    a = _widened(runs["base"], 64, [runs["base"]])
    b = _widened(runs["base"], 64, [runs["base"], runs["extra"]])  # odd ranks drew once more
    diff = diff_reports(a, b, "a", "b")
    assert [(d.ranks, d.reason) for d in diff.ranks] == [
        (list(range(0, 64, 2)), ""),
        (list(range(1, 64, 2)), "only-in-b"),
    ]
    text = render_diff_text(diff)
    assert len(text.splitlines()) < 60
    assert "Ranks 1, 3, 5," in text


def test_unusable_input_is_one_line_and_exit_2(runs: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(runs["base"], broken)
    (broken / "report.json").write_text('{"schema_version": 1,')
    for args in (["missing-dir", str(runs["base"])], [str(runs["base"]), str(broken)]):
        proc = subprocess.run(
            [sys.executable, "-m", "rngaudit", "diff", *args],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == ""
        assert "Traceback" not in proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("rngaudit: error: ")
