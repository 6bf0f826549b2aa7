"""Writes tests/data/{divergent,clean} from a real 2-rank run of sample_run.py, scrubbed.

Each case is one ``python -m torch.distributed.run --standalone --nproc_per_node=2`` launch of
``tests/data/sample_run.py`` (gloo on CPU, accelerate's stateful loader with 2 workers, both
ranks ``set_seed(42)``, ``rngaudit.audit(mode="warn")`` around the loader set-up). ``divergent``:
rank 0 makes one extra ``torch.rand(1)`` before ``accelerator.prepare()``; ``clean``: it does
not. The report directory the run writes (``rank-0.json``, ``rank-1.json``, ``report.json``) is
copied here with what differs from one launch or machine to the next replaced by placeholders:

- paths: a ``.../site-packages/`` prefix becomes ``/venv/site-packages/``, this checkout
  ``/repo``, the Python installation ``/python``, the run's report directory ``/reports``;
- ``run_id`` (random per launch) becomes ``sample-<case>``;
- ``pid`` (record and events) becomes 1000 + rank for each rank's process, in order of first
  appearance; ``host`` becomes ``host``;
- the environment's ``python`` version keeps major.minor only (Python is not pinned; torch,
  numpy, accelerate and torchdata are, so their versions stay).

Nothing else varies: fingerprints and digests are functions of seed 42. The files are indented
(the producer writes one line) so that a regeneration reads as a diff. Running this twice gives
byte-identical files. ``make goldens`` runs it, then rewrites tests/golden:

    .venv/bin/python tests/data/make_samples.py
    RNGAUDIT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_render.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SCENARIO = HERE / "sample_run.py"
CASES = ("divergent", "clean")
FILES = ("rank-0.json", "rank-1.json", "report.json")
WORLD_SIZE = 2
TIMEOUT_S = 300
PID_BASE = 1000
HOST = "host"
SITE_PACKAGES = re.compile(r"(?:[A-Za-z]:)?[^\s\"'()]*?[/\\](?:site|dist)-packages[/\\]")
# Variables that would change what the run draws or records, whatever the caller set.
DROPPED = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "RNGAUDIT_REPORT_DIR", "RNGAUDIT_TIMEOUT")


class SampleError(Exception):
    """The run failed, or its files still hold something that varies."""


def run_id(case: str) -> str:
    return f"sample-{case}"


def launch(case: str, report_dir: Path) -> None:
    """Run the scenario on 2 ranks; its report files land in ``report_dir``."""
    env = {k: v for k, v in os.environ.items() if k not in DROPPED and k != "RNGAUDIT"}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={WORLD_SIZE}", str(SCENARIO), case, str(report_dir),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, text=True, timeout=TIMEOUT_S,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False,
    )  # fmt: skip
    missing = [name for name in FILES if not (report_dir / name).is_file()]
    if proc.returncode != 0 or missing:
        raise SampleError(
            f"{case}: the run exited {proc.returncode}, missing {missing}:\n{proc.stdout[-4000:]}"
        )


class Scrubber:
    """Replaces what varies between launches in one case's files, the same way in each file."""

    def __init__(self, case: str, report_dir: Path, merged: dict[str, Any]) -> None:
        self.run_id = run_id(case)
        # Longest first: a prefix inside another (the venv inside the checkout) goes first.
        prefixes = {
            str(report_dir): "/reports",
            os.path.realpath(report_dir): "/reports",
            str(ROOT): "/repo",
            sys.prefix: "/python",
            sys.exec_prefix: "/python",
            sys.base_prefix: "/python",
            os.path.realpath(sys.base_prefix): "/python",
        }
        self.prefixes = sorted(
            ((p, r) for p, r in prefixes.items() if len(p) > 1), key=lambda pr: -len(pr[0])
        )
        # Each rank's process, numbered by rank; other processes (DataLoader workers) after.
        self.pids: dict[int, int] = {}
        for record in merged["ranks"]:
            self.pids.setdefault(record["pid"], PID_BASE + record["rank"])
        for record in merged["ranks"]:
            for event in record["events"]:
                self.pids.setdefault(event["pid"], PID_BASE + WORLD_SIZE + len(self.pids))

    def string(self, text: str) -> str:
        text = SITE_PACKAGES.sub("/venv/site-packages/", text)
        for prefix, placeholder in self.prefixes:
            text = re.sub(re.escape(prefix) + r"(?=[/\\]|$)", placeholder, text)
        return text

    def value(self, value: Any, key: str | None = None) -> Any:
        if isinstance(value, dict):
            return {k: self.field(k, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, str):
            return self.string(value)
        return value

    def field(self, key: str, value: Any) -> Any:
        if key == "run_id" and isinstance(value, str):
            return self.run_id
        if key == "pid" and isinstance(value, int):
            return self.pids[value]
        if key == "host" and isinstance(value, str):
            return HOST
        if key == "environment" and isinstance(value, dict) and "python" in value:
            major_minor = ".".join(str(value["python"]).split(".")[:2])
            return {**self.value(value), "python": major_minor}
        return self.value(value)


def leftovers(text: str, originals: list[str]) -> list[str]:
    """The varying strings still present in a scrubbed file."""
    return [s for s in originals if s and s in text]


def capture(case: str) -> dict[str, str]:
    """One launch of ``case``: file name -> scrubbed JSON text."""
    with tempfile.TemporaryDirectory(prefix="rngaudit-sample-") as tmp:
        report_dir = Path(tmp) / "report"
        launch(case, report_dir)
        docs = {name: json.loads((report_dir / name).read_text()) for name in FILES}
        scrubber = Scrubber(case, report_dir, docs["report.json"])
        texts = {
            name: json.dumps(scrubber.field("", doc), indent=2) + "\n" for name, doc in docs.items()
        }
        originals = [tmp, str(ROOT), docs["report.json"]["run_id"]]
        originals += [f'"pid": {pid},' for pid in scrubber.pids]
        for name, text in texts.items():
            found = leftovers(text, originals)
            if found:
                raise SampleError(f"{case}/{name}: not scrubbed: {found}")
        return texts


def main() -> int:
    captured = {case: capture(case) for case in CASES}  # both runs first: write all or nothing
    for case, texts in captured.items():
        directory = HERE / case
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        for name, text in texts.items():
            (directory / name).write_text(text, encoding="utf-8")
        print(f"wrote {directory.relative_to(ROOT)}/{{{','.join(FILES)}}}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (SampleError, subprocess.TimeoutExpired) as exc:
        print(f"make_samples: {exc}", file=sys.stderr)
        sys.exit(1)
