"""`make demo`: rngaudit catches the stateful-prefetch bug on 2 CPU ranks, a fix passes."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "audited_prepare.py"
REPORTS = ROOT / "rngaudit-report" / "demo"  # or the directory given as the one argument
TIMEOUT_S = 240
LAUNCHER_LOG = re.compile(r"^[IWE]\d{4} \d\d:\d\d:\d\d")  # torchrun's own log lines


def shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it, else whole."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def header(text: str) -> None:
    print(f"\n{'=' * 78}\n{text}\n{'=' * 78}", flush=True)


def tidy(output: str) -> str:
    """Drop library UserWarnings and torchrun's ChildFailedError dump; keep what the ranks said."""
    lines = output.splitlines()
    if "ChildFailedError" in output:  # torchrun's own traceback + failure table: summarise it
        starts = [i for i, ln in enumerate(lines) if ln.startswith("Traceback")]
        cut = starts[-1] if starts else len(lines)
        lines = [*lines[:cut], "(torchrun: ranks exited non-zero)"]
    kept: list[str] = []
    skip_next = False
    for ln in lines:
        if skip_next and ln.startswith(" "):
            skip_next = False
            continue
        skip_next = "Warning: " in ln
        if not skip_next and ln.strip() and not LAUNCHER_LOG.match(ln):
            kept.append(ln)
    return "\n".join("  | " + ln for ln in kept)


def torchrun(seeding: str, report_dir: Path) -> tuple[int, str]:
    shutil.rmtree(report_dir, ignore_errors=True)  # never mix two runs in one report dir
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(SCRIPT), seeding, "--mode", "raise", "--report-dir", str(report_dir),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RNGAUDIT", None)  # the example audits explicitly; no start-up hook on top
    print("$ python " + " ".join(cmd[1:]).replace(str(ROOT) + os.sep, ""), flush=True)
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env, text=True, timeout=TIMEOUT_S,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else ""
        print(tidy(out) + f"\n  (timed out after {TIMEOUT_S} s)", flush=True)
        return 124, out
    print(tidy(proc.stdout), flush=True)
    print(f"  exit status: {proc.returncode}", flush=True)
    return proc.returncode, proc.stdout


def show_report(report_dir: Path) -> None:
    find = importlib.util.find_spec
    has_cli = find("rngaudit.cli") is not None and find("rngaudit.__main__") is not None
    if has_cli:
        cmd = [sys.executable, "-m", "rngaudit", "report", str(report_dir)]
        print("$ python -m rngaudit report " + shown(report_dir), flush=True)
        rc = subprocess.run(cmd, cwd=ROOT, timeout=60).returncode
        meaning = {0: "verdict below error", 1: "error verdict"}.get(rc, "report unusable")
        print(f"  exit status: {rc} ({meaning})", flush=True)
        return
    merged = report_dir / "report.json"
    if merged.is_file():
        print(f"(rngaudit.cli not available yet; raw {shown(merged)})", flush=True)
        print(json.dumps(json.loads(merged.read_text()), indent=2), flush=True)
    else:
        print(f"(no rngaudit.cli and no {shown(merged)}: nothing to show)", flush=True)


def write_html(report_dir: Path) -> None:
    """The run's report as one HTML page (``rngaudit report --format html``); print its path."""
    page = report_dir / "report.html"
    cmd = [sys.executable, "-m", "rngaudit", "report", str(report_dir), "--format", "html"]
    proc = subprocess.run(cmd, cwd=ROOT, timeout=60, text=True, stdout=subprocess.PIPE)
    if proc.returncode in (0, 1) and proc.stdout:
        page.write_text(proc.stdout, encoding="utf-8")
        print(f"HTML report of the divergent run (open it in a browser): {page}", flush=True)
    else:
        print(f"(no HTML report: rngaudit report exited {proc.returncode})", flush=True)


def main(argv: list[str]) -> int:
    reports = Path(argv[0]).resolve() if argv else REPORTS
    header("1/3  Unseeded ranks, stateful loader, 6 workers: prepare() must raise")
    rc_bad, out_bad = torchrun("noseed", reports / "noseed")
    caught = rc_bad != 0 and "RNGDivergenceError" in out_bad

    header("2/3  The merged report of that run")
    show_report(reports / "noseed")

    header("3/3  Same script with torch.manual_seed(1234) on every rank: must pass")
    rc_good, out_good = torchrun("seed", reports / "seed")
    clean = rc_good == 0 and "RNGDivergenceError" not in out_good

    header("Result")
    print(f"noseed raised RNGDivergenceError: {'yes' if caught else 'NO'} (expected yes)")
    print(f"seed ran clean:                   {'yes' if clean else 'NO'} (expected yes)")
    ok = caught and clean
    print("demo OK" if ok else "demo FAILED: rngaudit did not behave as expected", flush=True)
    write_html(reports / "noseed")  # the last line: where the page is
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
