"""Hostile reports through the real CLI (issue 23, items 1-6): nothing live in Markdown, nothing
touched outside the report directory, repeats refused, any string rendered, any size in linear
time, only valid JSON out."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

DATA = Path(__file__).parent / "data"
ENV_NAMES = ("RNGAUDIT", "RNGAUDIT_REPORT_DIR", "RNGAUDIT_TIMEOUT")

# Everything CommonMark, GitHub's extensions and the raw HTML GitHub allows would make live
PAYLOAD = (
    "![x](http://e.example/i.png) <img src=x onerror=alert(1)> <script>alert(1)</script> "
    "<iframe srcdoc='<b>x</b>'></iframe> <meta http-equiv=refresh content='0;url=http://e.example'>"
    " [a](javascript:alert(1)) [r][ref] <http://e.example/a> www.e.example a@e.example @octocat"
    " (#12) *em* _em_ __strong__ ~~del~~ `code` ``x`` $x^2$ &amp; &#x3C; \\ | cell | [^1] :+1:"
    "\n# heading\n- item\n+ item\n2. item\n3) item\n> quote\n    indented\n\n---\n===\n```\n"
    "<!-- c --><details open>\n[ref]: http://e.example/r\n\t\ttab\r\nend"
)
# Free text of a report file; the fields whose values the reader checks keep theirs
KEEP = {"severity", "phase", "schema_version"}
KEYED = {"details", "variables", "packages", "seeds", "entry", "exit"}  # their keys are text too

# What GitHub turns into a link in text, after Markdown (no escape prevents these): its
# extended autolinks (www., http(s)://, e-mail, mailto:, xmpp:), @mentions and #references
GITHUB_LINKED = re.compile(
    r"www\.|https?://|ftp://|mailto:|xmpp:|[\w.+-]@[\w-]+\.|(?<![\w`])@\w|(?<![\w])#\d",
    re.IGNORECASE,
)
ALLOWED_INLINE = {"text", "code_inline", "softbreak", "strong_open", "strong_close"}


@pytest.fixture(autouse=True)
def _no_audit_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rngaudit ARGS`` in a fresh interpreter."""
    full = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    return subprocess.run(
        [sys.executable, "-m", "rngaudit", *args],
        capture_output=True,
        text=True,
        errors="surrogateescape",
        env={**full, **(env or {})},
        timeout=120,
    )


def plant(value: Any, key: str = "", payload: str = PAYLOAD) -> Any:
    """``value`` with ``payload`` appended to every free-text string in it."""
    if isinstance(value, dict):
        return {
            (k + payload if key in KEYED else k): v if k in KEEP else plant(v, k, payload)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [plant(v, key, payload) for v in value]
    return value + payload if isinstance(value, str) else value


def copy_run(sample: str, to: Path, payload: str | None = PAYLOAD) -> Path:
    """The real run ``tests/data/SAMPLE``, every text in it planted with ``payload``."""
    to.mkdir(parents=True)
    for path in sorted((DATA / sample).glob("*.json")):
        doc = json.loads(path.read_text())
        if payload is not None:
            doc = plant(doc, payload=payload)
            for record in doc.get("ranks") or [doc.get("record")]:
                record["environment"]["variables"]["CUBLAS_WORKSPACE_CONFIG"] = payload
        (to / path.name).write_text(json.dumps(doc))
    return to


def tokens(markdown: str) -> list[Token]:
    """Every token of ``markdown`` rendered as CommonMark with GitHub's tables and
    strikethrough, raw HTML allowed (as GitHub allows some): blocks, and inline children."""
    parser = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
    out = []
    for token in parser.parse(markdown):
        out.append(token)
        out += token.children or []
    return out


def shown(markdown: str) -> str:
    """The text a reader sees, whitespace collapsed."""
    parts = []
    for token in tokens(markdown):
        if token.type in ("text", "code_inline"):
            parts.append(token.content)
        elif token.type in ("softbreak", "hardbreak", "html_inline", "inline"):
            parts.append(" ")
    return " ".join("".join(parts).split())


BLOCKS = {"paragraph", "heading", "bullet_list", "list_item", "table", "thead", "tbody", "tr"}
BLOCKS |= {"th", "td"}


def assert_nothing_live(markdown: str, clean: str | None = None) -> None:
    """No HTML but the renderer's ``<br>``, no link, image, emphasis, strikethrough, code
    block, quote, rule or ordered list; no text GitHub would link; no live ``$``."""
    found = tokens(markdown)
    for token in found:
        if token.type == "inline":
            continue
        if token.level < 0 or token.type in ALLOWED_INLINE or token.type == "html_inline":
            inline = True
        else:
            inline = token.type not in {t for b in BLOCKS for t in (b + "_open", b + "_close")}
        if token.type == "html_inline":
            assert token.content == "<br>", token  # the renderer's own line break in a cell
        elif inline:
            assert token.type in ALLOWED_INLINE, token
        if token.type == "text":
            assert not GITHUB_LINKED.search(token.content), token.content
    if clean is not None:  # the same blocks and the same emphasis as the report without payload
        skip = ("text", "code_inline", "softbreak")
        structure = [t.type for t in found if t.type not in skip]
        assert structure == [t.type for t in tokens(clean) if t.type not in skip]
    # GitHub's math: every $ is escaped or in a code span
    assert not re.search(r"(?<!\\)\$", re.sub(r"(`+)(?:(?!\1).)+\1", "", markdown))


def normal(text: str) -> str:
    return " ".join(text.split())


# 1. Markdown injection ---------------------------------------------------------------------


def test_report_markdown_of_a_planted_real_run_shows_the_text_and_nothing_live(
    tmp_path: Path,
) -> None:
    planted = cli("report", str(copy_run("divergent", tmp_path / "p")), "--format", "markdown")
    clean = cli("report", str(DATA / "divergent"), "--format", "markdown")
    assert planted.returncode == clean.returncode == 1, planted.stderr[-2000:]
    assert_nothing_live(planted.stdout, clean.stdout)
    # every field shown is shown as written: the payload many times, whole
    assert shown(planted.stdout).count(normal(PAYLOAD)) >= 20


def test_diff_markdown_of_planted_real_runs_shows_the_text_and_nothing_live(
    tmp_path: Path,
) -> None:
    a = copy_run("divergent", tmp_path / "a")
    result = cli("diff", str(a), str(DATA / "clean"), "--format", "markdown")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "CUBLAS_WORKSPACE_CONFIG" in result.stdout
    assert_nothing_live(result.stdout)
    assert shown(result.stdout).count(normal(PAYLOAD)) >= 5
    found = tokens(result.stdout)
    headings = [found[i + 1].content for i, t in enumerate(found) if t.type == "heading_open"]
    assert headings == [  # none from the payload
        "rngaudit diff: DIFFERENT",
        "Environment differences",
        "Set-up differences",
        "Rank 0",
        "Rank 1",
    ]


# 2. Planted symbolic links -----------------------------------------------------------------


def snapshot(root: Path) -> dict[str, tuple[bool, bytes | str, int]]:
    """Every entry under ``root``: link or not, its content (or target), its mtime."""
    out: dict[str, tuple[bool, bytes | str, int]] = {}
    for path in sorted(root.rglob("*")):
        stat = path.lstat()
        if path.is_symlink():
            out[str(path)] = (True, os.readlink(path), stat.st_mtime_ns)
        elif path.is_file():
            out[str(path)] = (False, path.read_bytes(), stat.st_mtime_ns)
    out[str(root)] = (False, "dir", root.stat().st_mtime_ns)
    return out


def planted_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A report directory holding an earlier run, whose ``previous`` is a link to another
    directory (with report files and a temp file of its own), and whose ``rank-5.json`` and
    ``report.json`` are links to files there."""
    outside = tmp_path / "outside"
    copy_run("divergent", outside, payload=None)
    shutil.copy(outside / "rank-1.json", outside / "rank-3.json")
    (outside / ".rank-3.json.1.host.x.tmp").write_text("")
    report_dir = copy_run("clean", tmp_path / "report", payload=None)
    (report_dir / "report.json").unlink()
    (report_dir / "report.json").symlink_to(outside / "report.json")
    (report_dir / "rank-5.json").symlink_to(outside / "rank-3.json")
    (report_dir / "previous").symlink_to(outside, target_is_directory=True)
    return report_dir, outside


WITH_BLOCK = """
import random, sys
import rngaudit
with rngaudit.audit(mode="report", report_dir=sys.argv[1]):
    random.random()
rngaudit.wait_for_reports()
"""


def test_a_with_block_audit_never_touches_what_planted_links_name(tmp_path: Path) -> None:
    report_dir, outside = planted_dir(tmp_path)
    before = snapshot(outside)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    result = subprocess.run(
        [sys.executable, "-c", WITH_BLOCK, str(report_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert snapshot(outside) == before
    previous = report_dir / "previous"
    assert previous.is_dir() and not previous.is_symlink()
    # the earlier run (and the planted links, as links) went to previous/, the new run is on top
    assert sorted(p.name for p in previous.iterdir()) == [
        "rank-0.json",
        "rank-1.json",
        "rank-5.json",
        "report.json",
    ]
    assert (previous / "rank-5.json").is_symlink()
    assert sorted(p.name for p in report_dir.iterdir()) == [
        "previous",
        "rank-0.json",
        "report.json",
    ]
    assert not (report_dir / "report.json").is_symlink()
    assert cli("report", str(report_dir)).returncode == 0


def test_rngaudit_run_never_touches_what_planted_links_name(tmp_path: Path) -> None:
    report_dir, outside = planted_dir(tmp_path)
    before = snapshot(outside)
    result = cli(
        "run",
        "--report-dir",
        str(report_dir),
        "--",
        sys.executable,
        "-S",
        "-c",
        "import sys; sys.exit(3)",
    )
    assert result.returncode == 3, result.stderr[-2000:]
    assert snapshot(outside) == before
    assert (report_dir / "previous").is_dir() and not (report_dir / "previous").is_symlink()
    assert not list(report_dir.glob("*.json"))  # every earlier file set aside, none followed


# 3. Repeated ranks -------------------------------------------------------------------------


@pytest.mark.parametrize("merged", [True, False])
def test_a_rank_file_under_two_names_is_refused(tmp_path: Path, merged: bool) -> None:
    run = copy_run("divergent", tmp_path / "r", payload=None)
    if not merged:
        (run / "report.json").unlink()
    shutil.copy(run / "rank-0.json", run / "rank-00.json")
    for args in (["report", str(run)], ["report", str(run), "--format", "json"]):
        result = cli(*args)
        assert result.returncode == 2, result.stdout[-500:]
        assert result.stderr == (
            f"rngaudit: error: {run / 'rank-0.json'} and rank-00.json in {run} are both rank 0:"
            " remove the copy\n"
        )
    assert cli("diff", str(run), str(DATA / "clean")).returncode == 2


# 4. Strings that are not UTF-8 -------------------------------------------------------------

LATIN1_SCRIPT = """
import random, sys
import rngaudit
with rngaudit.audit(mode="report", report_dir=sys.argv[1]):
    random.random()
rngaudit.wait_for_reports()
"""


@pytest.fixture(scope="module")
def latin1_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real audit of a script whose file name holds a Latin-1 byte (``tr\\xe9in.py``)."""
    root = tmp_path_factory.mktemp("latin1")
    script = os.path.join(os.fsencode(root), b"tr\xe9in.py")
    with open(script, "w") as fh:
        fh.write(LATIN1_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    result = subprocess.run(
        [sys.executable, script, root / "report"], capture_output=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return root / "report"


@pytest.mark.parametrize("fmt", ["text", "markdown", "html", "json"])
def test_report_and_diff_render_surrogates_in_every_format(
    tmp_path: Path, latin1_run: Path, fmt: str
) -> None:
    assert "\\udce9" in (latin1_run / "rank-0.json").read_text()  # the byte, escaped by JSON
    lone = copy_run("divergent", tmp_path / "lone", payload="\ud800 and \udce9")
    for args, status in (
        (["report", str(latin1_run)], 0),
        (["report", str(lone)], 1),
        (["diff", str(latin1_run), str(latin1_run)], 0),
        (["diff", str(lone), str(DATA / "divergent")], 1),
    ):
        for env in ({}, {"PYTHONIOENCODING": "ascii"}):
            result = cli(*args, "--format", fmt, env=env)
            assert result.returncode == status, result.stderr[-2000:]
            assert result.stderr == ""
            if fmt == "json":
                json.loads(result.stdout)
            elif args[0] == "report" and args[1] == str(latin1_run):
                assert "tr\\xe9in.py" in result.stdout


# 5. Text rendering in linear time ----------------------------------------------------------


def test_a_huge_word_is_wrapped_whole_within_the_width(tmp_path: Path) -> None:
    # 16 MiB took 62 s with textwrap alone (quadratic); the benchmark measures the time
    run = copy_run("divergent", tmp_path / "r", payload=None)
    word = "".join(chr(ord("a") + i % 26) for i in range(4 << 20))
    doc = json.loads((run / "report.json").read_text())
    doc["findings"][0]["message"] = f"before {word} after"
    (run / "report.json").write_text(json.dumps(doc))
    result = cli("report", str(run))
    assert result.returncode == 1, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    first = next(i for i, line in enumerate(lines) if "before" in line)
    last = next(i for i, line in enumerate(lines) if "after" in line)
    assert "".join("".join(lines[first : last + 1]).split()) == f"before{word}after"


# 6. NaN and Infinity -----------------------------------------------------------------------


def strict(text: str) -> Any:
    def refuse(literal: str) -> None:
        raise AssertionError(f"not JSON: {literal}")

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("merged", [True, False])
def test_nan_and_infinity_come_out_as_valid_json(tmp_path: Path, merged: bool) -> None:
    run = copy_run("divergent", tmp_path / "r", payload=None)
    if not merged:
        (run / "report.json").unlink()
    for path in run.glob("*.json"):
        text = path.read_text()
        text = text.replace('"findings": [{', '"findings": [{"unknown": [NaN, -Infinity], ', 1)
        text = text.replace('"details": {', '"details": {"x": NaN, "y": Infinity, "z": 1e400, ', 1)
        text = text.replace('"run_id"', '"extra": {"n": NaN}, "run_id"', 1)
        path.write_text(text)
    result = cli("report", str(run), "--format", "json")
    assert result.returncode == 1, result.stderr[-2000:]
    finding = strict(result.stdout)["findings"][0]
    assert finding["details"]["x"] == "NaN" and finding["details"]["y"] == "Infinity"
    assert finding["details"]["z"] == "1e400"  # no data lost: the number as written
    diff = cli("diff", str(run), str(DATA / "clean"), "--format", "json")
    assert diff.returncode == 1, diff.stderr[-2000:]
    strict(diff.stdout)
    for fmt in ("text", "markdown", "html"):
        assert cli("report", str(run), "--format", fmt).returncode == 1
