"""Command-line interface: ``rngaudit report``, ``rngaudit diff`` and ``rngaudit run``."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from rngaudit import __version__
from rngaudit.audit_report import AuditReport
from rngaudit.config import (
    DEFAULT_REPORT_DIR,
    ENV_MODE,
    ENV_REPORT_DIR,
    ENV_TIMEOUT,
    MAX_TIMEOUT,
    MODES,
    parse_timeout,
)
from rngaudit.errors import ConfigError, ReportError, RNGAuditError
from rngaudit.report_files import set_aside, write_text
from rngaudit.reports.diff_text import render_diff_json, render_diff_markdown, render_diff_text
from rngaudit.reports.html_page import render_diff_html, render_html
from rngaudit.reports.reading import attempt_dirs, load_run
from rngaudit.reports.report_text import (
    render_json,
    render_markdown,
    render_summary,
    render_text,
    write_json,
)
from rngaudit.reports.run_diff import RunDiff, diff_dirs

OK, FINDINGS, UNUSABLE = 0, 1, 2  # exit statuses
HTML_FILE = "report.html"  # what ``rngaudit run --html`` writes into the report directory

RENDERERS: dict[str, Callable[[AuditReport], str]] = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "html": render_html,
}
DIFF_RENDERERS: dict[str, Callable[[RunDiff], str]] = {
    "text": render_diff_text,
    "markdown": render_diff_markdown,
    "json": render_diff_json,
    "html": render_diff_html,
}


def main(argv: list[str] | None = None) -> int:
    """Run the ``rngaudit`` command; returns the exit status."""
    for stream in (sys.stdout, sys.stderr):  # a terminal that cannot show a character
        with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
            stream.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    args = _parser().parse_args(argv)
    try:
        status: int = args.func(args)
    except RNGAuditError as exc:
        _error(str(exc))
        return UNUSABLE
    return status


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rngaudit",
        description="Audit where PyTorch training draws its randomness, and report it.",
        epilog=(
            "example:\n"
            "  rngaudit run -- torchrun --nproc_per_node=2 train.py\n\n"
            "rngaudit COMMAND --help describes each command."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"rngaudit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    report = commands.add_parser(
        "report",
        help="show the report in a report directory",
        description=(
            "Show the audit report in DIR (report.json, or the rank files merged); when DIR "
            "holds several torchrun restart attempts (attempt-N/), all of them: each finding "
            "named by its attempt, the verdict the worst."
        ),
        epilog=(
            "example:\n"
            "  rngaudit report rngaudit-report --format html > report.html\n\n"
            "exit status: 0 no error findings, 1 error findings (or warnings with\n"
            "--fail-on warning), 2 unusable input."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    report.add_argument(
        "dir",
        nargs="?",
        metavar="DIR",
        help=f"report directory (default: ${ENV_REPORT_DIR} or ./{DEFAULT_REPORT_DIR})",
    )
    report.add_argument("--format", choices=tuple(RENDERERS), default="text")
    report.add_argument(
        "--attempt",
        type=_attempt_number,
        metavar="N",
        help="only torchrun restart attempt N (0: the first, in DIR; N: DIR/attempt-N)",
    )
    _add_fail_on(report)
    report.set_defaults(func=_report)

    diff = commands.add_parser(
        "diff",
        help="compare two runs: where their random draws part, and why",
        description="Compare the reports of two runs of the same program: where their draws part.",
        epilog=(
            "example:\n"
            "  rngaudit diff run-a/rngaudit-report run-b/rngaudit-report\n\n"
            "It shows the settings that differ (versions, world size, seeds, loaders), then per\n"
            "rank the first draw whose generator state differs or that only one run made, and\n"
            "what differs after it.\n"
            "exit status: 0 identical, 1 different, 2 unusable input."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diff.add_argument("dir_a", metavar="A", help="report directory of the first run")
    diff.add_argument("dir_b", metavar="B", help="report directory of the second run")
    diff.add_argument("--format", choices=tuple(DIFF_RENDERERS), default="text")
    diff.set_defaults(func=_diff)

    run = commands.add_parser(
        "run",
        help="run a command under the audit, then summarise its report",
        description=f"Run CMD with {ENV_MODE} and {ENV_REPORT_DIR} set, then summarise its report.",
        epilog=(
            "example:\n"
            "  rngaudit run --html -- torchrun --nproc_per_node=2 train.py\n\n"
            "exit status: CMD's when it fails, else 0 no error findings, 1 error findings,\n"
            "2 no usable report."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [-h] [--mode {raise,warn,report}] [--report-dir D] [--timeout S] "
        "[--fail-on {error,warning}] [--html] -- CMD ...",
    )
    run.add_argument(
        "--mode", choices=MODES, default="raise", help="what the audit does on an error finding"
    )
    run.add_argument(
        "--report-dir",
        metavar="D",
        help=f"where ranks write their reports (default: ${ENV_REPORT_DIR} or "
        f"./{DEFAULT_REPORT_DIR})",
    )
    run.add_argument(
        "--timeout",
        metavar="S",
        help=f"seconds ranks wait for each other, above 0 and at most {MAX_TIMEOUT:g} "
        f"(sets {ENV_TIMEOUT})",
    )
    _add_fail_on(run)
    run.add_argument(
        "--html",
        action="store_true",
        help=f"also write the report as one HTML page, {HTML_FILE} in the report directory",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD", help="the command to run")
    run.set_defaults(func=_run)
    return parser


def _add_fail_on(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fail-on",
        choices=("error", "warning"),
        default="error",
        help="the lowest severity that makes the exit status 1 (default: error)",
    )


def _attempt_number(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"not an attempt number (0, 1, ...): {text!r}")
    return int(text)


def _report(args: argparse.Namespace) -> int:
    report = load_run(_report_dir(args.dir), args.attempt)
    if args.format == "json":
        write_json(report, sys.stdout)  # a large report is not held twice; JSON escapes all
    else:
        sys.stdout.write(printable(RENDERERS[args.format](report)))
    return _status(report, args.fail_on)


def _diff(args: argparse.Namespace) -> int:
    compared = diff_dirs(args.dir_a, args.dir_b)
    sys.stdout.write(printable(DIFF_RENDERERS[args.format](compared)))
    return OK if compared.identical else FINDINGS


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` without lone surrogates, which no encoding can write: a byte a file name kept
    as a surrogate escape (``\\udce9``) is shown as ``\\xe9``, any other as ``\\ud800``."""
    return _SURROGATE.sub(_show_surrogate, text)


def _show_surrogate(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"


def _run(args: argparse.Namespace) -> int:
    if args.timeout is not None:
        parse_timeout(args.timeout, "--timeout")  # the ranks read it with the same rules
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise ConfigError("run needs a command after '--', e.g. rngaudit run -- python train.py")
    directory = Path(_report_dir(args.report_dir)).absolute()
    if directory.exists() and not directory.is_dir():
        raise ReportError(f"report directory is not a directory: {directory}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        set_aside(directory)  # the last run's files go to previous/, never deleted
    except OSError as exc:
        raise ReportError(f"cannot prepare report directory {directory}: {exc}") from None

    env = dict(os.environ)
    env[ENV_MODE] = args.mode
    env[ENV_REPORT_DIR] = str(directory)
    if args.timeout is not None:
        env[ENV_TIMEOUT] = args.timeout
    try:
        returncode = subprocess.run(cmd, env=env, check=False).returncode
    except FileNotFoundError:
        raise ConfigError(f"cannot run {cmd[0]!r}: command not found") from None
    except PermissionError:
        raise ConfigError(f"cannot run {cmd[0]!r}: permission denied") from None
    except OSError as exc:
        raise ConfigError(f"cannot run {cmd[0]!r}: {exc.strerror or exc}") from None
    except KeyboardInterrupt:
        return 130
    if returncode < 0:  # killed by a signal: report it the way a shell does
        returncode = 128 - returncode

    if not attempt_dirs(directory):
        if returncode:
            _error(f"no report was written to {directory}", note=True)
            return returncode
        raise ReportError(
            f"no report was written to {directory}: did the command run Python with rngaudit "
            "installed, and start an audit?"
        )
    try:
        report = load_run(directory)
    except ReportError as exc:
        if returncode:
            _error(str(exc), note=True)
            return returncode
        raise
    sys.stderr.write(render_summary(report))
    sys.stderr.write(f"rngaudit: full report: rngaudit report {directory}\n")
    if args.html:
        page = directory / HTML_FILE
        try:
            write_text(page, printable(render_html(report)), mkdir=False)
        except OSError as exc:
            raise ReportError(f"cannot write {page}: {exc.strerror or exc}") from None
        sys.stderr.write(f"rngaudit: HTML report: {page}\n")
    return returncode or _status(report, args.fail_on)


def _report_dir(given: str | None) -> str:
    return given or os.environ.get(ENV_REPORT_DIR) or DEFAULT_REPORT_DIR


def _status(report: AuditReport, fail_on: str) -> int:
    failing = ("error",) if fail_on == "error" else ("error", "warning")
    return FINDINGS if report.verdict in failing else OK


def _error(message: str, *, note: bool = False) -> None:
    sys.stderr.write(f"rngaudit: {'' if note else 'error: '}{message}\n")
