"""Tests for rngaudit.cli: ``rngaudit report``, ``rngaudit run``, exit statuses, start-up cost."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from rngaudit.cli import _parser, main

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
ENV_NAMES = ("RNGAUDIT", "RNGAUDIT_REPORT_DIR", "RNGAUDIT_TIMEOUT")

# The audited command of the `run` tests: it records the environment it was given, then writes
# the sample's rank files into $RNGAUDIT_REPORT_DIR the way ranks do, and exits with a code.
# It runs with `python -S` so that the rngaudit start-up hook (a .pth file) stays out of it.
CHILD = r"""
import json, os, sys
sample, code, env_out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
names = ("RNGAUDIT", "RNGAUDIT_REPORT_DIR", "RNGAUDIT_TIMEOUT")
with open(env_out, "w") as fh:
    json.dump({name: os.environ.get(name) for name in names}, fh)
out = os.environ["RNGAUDIT_REPORT_DIR"]
if sample == "malformed":
    with open(os.path.join(out, "rank-0.json"), "w") as fh:
        fh.write('{"schema_version": 1,')
elif sample != "none":
    for name in sorted(os.listdir(sample)):
        if name.startswith("rank-"):
            with open(os.path.join(sample, name)) as src:
                doc = json.load(src)
            with open(os.path.join(out, name), "w") as dst:
                json.dump(doc, dst)
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@pytest.fixture(autouse=True)
def _no_audit_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ENV_NAMES}


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rngaudit ARGS`` in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "rngaudit", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        cwd=cwd,
        timeout=60,
    )


def child(sample: str, code: int, env_out: Path) -> list[str]:
    source = str(DATA / sample) if sample in ("divergent", "clean") else sample
    return [sys.executable, "-S", "-c", CHILD, source, str(code), str(env_out)]


def assert_one_error_line(err: str) -> None:
    assert "Traceback" not in err
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert err.startswith("rngaudit: error: "), err


# rngaudit report ---------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "status"), [("divergent", 1), ("clean", 0)])
@pytest.mark.parametrize(("fmt", "ext"), [("text", "txt"), ("markdown", "md"), ("json", "json")])
def test_report_prints_rendering_and_exits_by_verdict(
    capsys: pytest.CaptureFixture[str], name: str, status: int, fmt: str, ext: str
) -> None:
    assert main(["report", str(DATA / name), "--format", fmt]) == status
    out, err = capsys.readouterr()
    assert out == (GOLDEN / f"{name}.{ext}").read_text(encoding="utf-8")
    assert err == ""


def test_report_text_is_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    main(["report", str(DATA / "divergent")])
    assert capsys.readouterr().out == (GOLDEN / "divergent.txt").read_text(encoding="utf-8")


@pytest.mark.parametrize("fmt", ["text", "markdown", "json", "html"])
def test_report_of_several_attempts_is_their_worst(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str
) -> None:
    shutil.copytree(DATA / "clean", tmp_path, dirs_exist_ok=True)  # attempt 0: clean
    shutil.copytree(DATA / "divergent", tmp_path / "attempt-1")  # the restarted attempt
    (tmp_path / "attempt-x").mkdir()  # not an attempt
    assert main(["report", str(tmp_path), "--format", fmt]) == 1
    out = capsys.readouterr().out.replace("\\[", "[").replace("\\]", "]")  # (Markdown escapes)
    assert "[attempt 1] " in out and "attempt 0: " in out and "attempt 1: " in out
    if fmt == "json":
        data = json.loads(out)
        assert data["verdict"] == "error"
        assert {f["details"]["attempt"] for f in data["findings"]} == {1}
        divergent = json.loads((DATA / "divergent" / "report.json").read_text())
        assert len(data["findings"]) == len(divergent["findings"])
        assert [r["rank"] for r in data["ranks"]] == [0, 1]
        events = [len(r["events"]) for r in data["ranks"]]
        clean = json.loads((DATA / "clean" / "report.json").read_text())
        assert events == [
            len(a["events"]) + len(b["events"])
            for a, b in zip(clean["ranks"], divergent["ranks"], strict=True)
        ]
    assert main(["report", str(tmp_path), "--attempt", "0"]) == 0
    assert main(["report", str(tmp_path), "--attempt", "1"]) == 1
    capsys.readouterr()
    assert main(["report", str(tmp_path), "--attempt", "3"]) == 2
    assert capsys.readouterr().err == (
        f"rngaudit: error: no report of attempt 3 in {tmp_path} (attempts: 0, 1)\n"
    )


def warning_only_dir(tmp_path: Path) -> Path:
    doc = json.loads((DATA / "clean" / "report.json").read_text())
    doc["findings"] = [
        {"kind": "state-divergence", "severity": "warning", "message": "m", "ranks": [1]}
    ]
    (tmp_path / "report.json").write_text(json.dumps(doc))
    return tmp_path


def test_fail_on_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = str(warning_only_dir(tmp_path))
    assert main(["report", directory]) == 0
    assert main(["report", directory, "--fail-on", "warning"]) == 1
    assert main(["report", str(DATA / "clean"), "--fail-on", "warning"]) == 0
    assert main(["report", str(DATA / "divergent"), "--fail-on", "warning"]) == 1
    capsys.readouterr()


def test_report_dir_from_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RNGAUDIT_REPORT_DIR", str(DATA / "divergent"))
    assert main(["report"]) == 1
    assert capsys.readouterr().out.startswith("rngaudit: ERROR")


def test_report_dir_defaults_to_rngaudit_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(DATA / "clean", tmp_path / "rngaudit-report")
    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    assert capsys.readouterr().out.startswith("rngaudit: OK")


def test_report_merges_rank_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(DATA / "clean" / "rank-0.json", tmp_path / "rank-0.json")
    assert main(["report", str(tmp_path)]) == 1  # rank 1 is missing: an error finding
    assert "[error] rank-missing" in capsys.readouterr().out


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path.parent


def _rank(rank: int, run_id: str) -> str:
    doc = json.loads((DATA / "clean" / f"rank-{rank}.json").read_text())
    return json.dumps({**doc, "run_id": run_id})


UNUSABLE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing directory": (lambda d: d / "nope", "report directory not found"),
    "file, not directory": (lambda d: _write(d / "f" / "x", "") / "x", "not a directory"),
    "no report files": (lambda d: _write(d / "notes.txt", "x"), "no report files in"),
    "malformed JSON": (
        lambda d: _write(d / "report.json", '{\n"run_id": 1,,\n}'),
        "report.json: invalid JSON at line 2",
    ),
    "unknown schema": (
        lambda d: _write(d / "report.json", '{"schema_version": 9}'),
        "unsupported schema_version 9 (this rngaudit reads schema_version 1)",
    ),
    "not an object": (
        lambda d: _write(d / "rank-0.json", "[]"),
        "rank-0.json: top level is an array, expected a JSON object",
    ),
    "missing fields": (
        lambda d: _write(d / "report.json", '{"schema_version": 1, "run_id": "r"}'),
        "missing required fields 'world_size', 'findings', 'ranks'",
    ),
    "mixed runs": (
        lambda d: (
            _write(d / "rank-0.json", _rank(0, "run-a")),
            _write(d / "rank-1.json", _rank(1, "run-b")),
        )[0],
        "rank files from different runs",
    ),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_report_unusable_input_exits_2_with_one_line(tmp_path: Path, case: str) -> None:
    make, expected = UNUSABLE[case]
    result = cli("report", str(make(tmp_path)))
    assert result.returncode == 2
    assert result.stdout == ""
    assert_one_error_line(result.stderr)
    assert expected in result.stderr


def test_report_usage_error_exits_2() -> None:
    result = cli("report", "--format", "yaml")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "invalid choice: 'yaml'" in result.stderr


# rngaudit run ------------------------------------------------------------------------------


def run_main(*args: str) -> int:
    return main(["run", *args])


def test_run_clean_exits_0_and_sets_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports, env_out = tmp_path / "reports", tmp_path / "env.json"
    assert run_main("--report-dir", str(reports), "--", *child("clean", 0, env_out)) == 0
    assert json.loads(env_out.read_text()) == {
        "RNGAUDIT": "raise",
        "RNGAUDIT_REPORT_DIR": str(reports),
        "RNGAUDIT_TIMEOUT": None,
    }
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "rngaudit: OK, no findings; run sample-clean, world size 2, mode warn",
        f"rngaudit: full report: rngaudit report {reports}",
    ]


def test_run_passes_mode_and_timeout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env_out = tmp_path / "env.json"
    args = ["--mode", "warn", "--timeout", "30", "--report-dir", str(tmp_path / "r")]
    assert run_main(*args, "--", *child("clean", 0, env_out)) == 0
    env = json.loads(env_out.read_text())
    assert (env["RNGAUDIT"], env["RNGAUDIT_TIMEOUT"]) == ("warn", "30")
    capsys.readouterr()


def test_run_error_report_exits_1_with_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "r"
    assert run_main("--report-dir", str(reports), "--", *child("divergent", 0, tmp_path / "e")) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0].startswith("rngaudit: ERROR, 3 findings (1 error, 2 warnings)")
    assert lines[1].startswith("rngaudit:   error sampler-draw-divergence: ")
    firsts = [line for line in lines[1:] if line.startswith("rngaudit:   ") and line[12] != " "]
    finding = firsts[1]
    assert finding.startswith("rngaudit:   warning consumption-mismatch: ")
    assert lines[-1] == f"rngaudit: full report: rngaudit report {reports}"
    joined = " ".join(line.removeprefix("rngaudit:").strip() for line in lines)
    assert "..." not in err and "duplicates some samples and drops others." in joined  # not cut
    assert all(len(line) <= 100 for line in lines[:-1])


def test_run_failing_command_keeps_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "r"
    assert run_main("--report-dir", str(reports), "--", *child("divergent", 5, tmp_path / "e")) == 5
    assert "rngaudit: ERROR" in capsys.readouterr().err
    assert run_main("--report-dir", str(reports), "--", *child("clean", 3, tmp_path / "e")) == 3


def test_run_without_report_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "r"
    assert run_main("--report-dir", str(reports), "--", *child("none", 0, tmp_path / "e")) == 2
    err = capsys.readouterr().err
    assert_one_error_line(err)
    assert f"no report was written to {reports}" in err


def test_run_failing_without_report_keeps_its_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reports = tmp_path / "r"
    assert run_main("--report-dir", str(reports), "--", *child("none", 7, tmp_path / "e")) == 7
    assert capsys.readouterr().err == f"rngaudit: no report was written to {reports}\n"


def test_run_with_unusable_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "r"
    assert run_main("--report-dir", str(reports), "--", *child("malformed", 0, tmp_path / "e")) == 2
    err = capsys.readouterr().err
    assert_one_error_line(err)
    assert "rank-0.json: invalid JSON" in err
    assert run_main("--report-dir", str(reports), "--", *child("malformed", 4, tmp_path / "e")) == 4
    assert "rank-0.json: invalid JSON" in capsys.readouterr().err


def test_run_moves_stale_reports_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = tmp_path / "r"
    shutil.copytree(DATA / "divergent", reports)
    before = sorted(p.name for p in reports.iterdir())
    (reports / "notes.txt").write_text("kept")
    assert run_main("--report-dir", str(reports), "--", *child("none", 0, tmp_path / "e")) == 2
    assert sorted(p.name for p in reports.iterdir()) == ["notes.txt", "previous"]
    assert sorted(p.name for p in (reports / "previous").iterdir()) == before
    capsys.readouterr()


def test_run_makes_report_dir_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    env_out = tmp_path / "env.json"
    assert run_main("--report-dir", "rel/dir", "--", *child("clean", 0, env_out)) == 0
    assert json.loads(env_out.read_text())["RNGAUDIT_REPORT_DIR"] == str(tmp_path / "rel" / "dir")
    capsys.readouterr()


def test_run_report_dir_from_environment_or_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    env_out = tmp_path / "env.json"
    assert run_main("--", *child("clean", 0, env_out)) == 0
    assert json.loads(env_out.read_text())["RNGAUDIT_REPORT_DIR"] == str(
        tmp_path / "rngaudit-report"
    )
    monkeypatch.setenv("RNGAUDIT_REPORT_DIR", str(tmp_path / "from-env"))
    assert run_main("--", *child("clean", 0, env_out)) == 0
    assert json.loads(env_out.read_text())["RNGAUDIT_REPORT_DIR"] == str(tmp_path / "from-env")
    capsys.readouterr()


def test_run_without_double_dash(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = str(tmp_path / "r")
    assert run_main("--report-dir", reports, *child("divergent", 0, tmp_path / "e")) == 1
    capsys.readouterr()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_run_command_killed_by_signal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    reports = str(tmp_path / "r")
    code = -int(signal.SIGTERM)
    assert run_main("--report-dir", reports, "--", *child("none", code, tmp_path / "e")) == 143
    capsys.readouterr()


def test_run_end_to_end(tmp_path: Path) -> None:
    reports = tmp_path / "r"
    result = cli("run", "--report-dir", str(reports), "--", *child("divergent", 0, tmp_path / "e"))
    assert result.returncode == 1
    assert "rngaudit: ERROR" in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in reports.iterdir()) == ["rank-0.json", "rank-1.json"]


def test_run_rejects_report_dir_that_is_a_file(tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    result = cli("run", "--report-dir", str(target), "--", sys.executable, "-c", "pass")
    assert result.returncode == 2
    assert_one_error_line(result.stderr)


def _not_executable(tmp_path: Path) -> str:
    path = tmp_path / "script.sh"
    path.write_text("echo hi\n")
    path.chmod(0o644)
    return str(path)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (lambda d: ["run"], "run needs a command after '--'"),
        (lambda d: ["run", "--"], "run needs a command after '--'"),
        (lambda d: ["run", "--mode", "warn", "--"], "run needs a command after '--'"),
        (lambda d: ["run", "--", str(d / "no-such-cmd")], "command not found"),
        (lambda d: ["run", "--", _not_executable(d)], "permission denied"),
    ],
)
def test_run_unusable_command_exits_2_with_one_line(
    tmp_path: Path, args: Callable[[Path], list[str]], expected: str
) -> None:
    result = cli(*args(tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert_one_error_line(result.stderr)
    assert expected in result.stderr


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "1e309", "1e15", "86401", "soon"])
def test_run_rejects_bad_timeout_in_one_line(tmp_path: Path, value: str) -> None:
    ran = tmp_path / "ran"
    code = f"open({str(ran)!r}, 'w')"
    result = cli("run", f"--timeout={value}", "--", sys.executable, "-c", code)
    assert result.returncode == 2
    assert_one_error_line(result.stderr)
    assert f"--timeout={value!r}" in result.stderr
    assert not ran.exists()  # rejected before the command ran


def test_run_accepts_the_maximum_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    env_out = tmp_path / "env.json"
    args = ["--timeout", "86400", "--report-dir", str(tmp_path / "r")]
    assert run_main(*args, "--", *child("clean", 0, env_out)) == 0
    assert json.loads(env_out.read_text())["RNGAUDIT_TIMEOUT"] == "86400"
    capsys.readouterr()


# Entry points and start-up cost ------------------------------------------------------------


def test_python_m_rngaudit_help() -> None:
    result = cli("--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: rngaudit")
    assert "report" in result.stdout and "run" in result.stdout


@pytest.mark.parametrize("command", [[], ["report"], ["diff"], ["run"]], ids=str)
def test_help_says_in_one_line_what_it_does_with_an_example_that_parses(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command, "--help"])
    assert exit_.value.code == 0
    paragraphs = capsys.readouterr().out.split("\n\n")
    assert paragraphs[0].startswith(" ".join(["usage: rngaudit", *command]))
    assert "\n" not in paragraphs[1].strip(), paragraphs[1]  # the description: one line
    example = next(p for p in paragraphs if p.startswith("example:")).splitlines()[1].split()
    assert example[0] == "rngaudit"
    argv = example[1 : example.index(">")] if ">" in example else example[1:]  # no redirection
    assert _parser().parse_args(argv).command == (command or ["run"])[0]


def test_no_command_is_a_usage_error() -> None:
    result = cli()
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_version() -> None:
    result = cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("rngaudit ")


def test_cli_import_does_not_import_heavy_modules() -> None:
    code = (
        "import sys, rngaudit.cli, rngaudit.reports.report_text, rngaudit.reports.reading\n"
        "print(sorted(m for m in ('torch', 'numpy', 'accelerate') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# Hostile input (issue 11, item 14) ---------------------------------------------------------


def hostile(tmp_path: Path, kind: str) -> Path:
    doc = json.loads((DATA / "clean" / "rank-0.json").read_text())
    if kind == "deep":
        text = "[" * 100_000 + "]" * 100_000
    elif kind == "loaders":
        doc["record"]["loaders"] = "x"
        text = json.dumps(doc)
    else:
        doc["world_size"] = int(float(kind))
        text = json.dumps(doc)
    (tmp_path / "rank-0.json").write_text(text)
    return tmp_path


@pytest.mark.parametrize("kind", ["deep", "loaders", "2e7", "1e9"])
@pytest.mark.parametrize("fmt", ["text", "json"])
def test_report_on_hostile_input_exits_2_with_one_line(tmp_path: Path, kind: str, fmt: str) -> None:
    result = cli("report", str(hostile(tmp_path, kind)), "--format", fmt)
    assert result.returncode == 2, result.stderr[-500:]
    assert_one_error_line(result.stderr)
    assert result.stdout == ""


MEASURE = """
import resource, sys
from rngaudit.cli import _parser, main
with open(sys.argv[2], "w") as out:
    sys.stdout = out
    status = main(["report", sys.argv[1], "--format", "json"])
sys.stderr.write(f"{status} {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}")
"""


def peak_kb(directory: Path, out: Path) -> int:
    # not under `make test`'s coverage: its tracer would slow the 20 000-event report ~3x and
    # add to the peak measured (the same code runs measured on small reports above)
    env = {k: v for k, v in clean_env().items() if not k.startswith("COVERAGE_")}
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(directory), str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    status, peak = result.stderr.split()[-2:]
    assert status in ("0", "1"), result.stderr[-2000:]
    return int(peak)


def test_report_json_of_a_large_report_stays_within_a_small_multiple_of_its_size(
    tmp_path: Path,
) -> None:
    doc = json.loads((DATA / "divergent" / "report.json").read_text())
    template = doc["ranks"][0]["events"][0]
    events = [dict(template, seq=i, fingerprint=f"{i:08x}") for i in range(20_000)]
    for record in doc["ranks"]:
        record["events"] = events
    big = tmp_path / "big"
    big.mkdir()
    (big / "report.json").write_text(json.dumps(doc, separators=(",", ":")))
    size_kb = (big / "report.json").stat().st_size // 1024
    assert size_kb > 10_000
    baseline = peak_kb(DATA / "divergent", tmp_path / "small.json")
    grown = peak_kb(big, tmp_path / "big.json") - baseline
    assert grown < 8 * size_kb, (grown, size_kb)  # parsed objects take ~5x; the text is streamed
    assert json.loads((tmp_path / "big.json").read_text()) == json.loads(
        (big / "report.json").read_text()
    )
