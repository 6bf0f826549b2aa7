"""Report files are written atomically; a writer killed mid-write leaves nothing for long."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

from rngaudit import report_files

# Writes a report, but blocks (forever) between the temp file and the rename: the test kills it.
KILLED_WRITER = """
import os, sys, threading
from pathlib import Path
from rngaudit import report_files
real_replace = os.replace
def stuck(src, dst, **dir_fds):  # names relative to the report directory's descriptor
    part = Path(sys.argv[2] + ".part")  # the test waits for the file: it appears whole
    part.write_text(str(Path(sys.argv[1]).parent / src))
    real_replace(part, sys.argv[2])
    threading.Event().wait()
report_files.os.replace = stuck
report_files.write_json(Path(sys.argv[1]), {"big": "x" * 100000})
"""


def wait_for(path: Path, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the writer never reached the rename"
        time.sleep(0.01)  # polling for the event file, not a fixed wait


def test_a_writer_killed_mid_write_leaves_no_temp_file_after_the_next_write(
    tmp_path: Path,
) -> None:
    target = tmp_path / "rank-0.json"
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(target), str(ready)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for(ready, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    left = Path(ready.read_text())
    assert left.exists() and left.name.endswith(".tmp")  # what kill -9 leaves behind
    report_files.write_json(target, {"ok": True})
    assert json.loads(target.read_text()) == {"ok": True}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-0.json", "ready"]


def test_temp_files_of_live_writers_and_other_files_are_kept(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    host = report_files._HOST
    live = tmp_path / f".report.json.{os.getppid()}.{host}.abc.tmp"  # a live process
    other_host = tmp_path / ".report.json.999999999.elsewhere.abc.tmp"
    other_file = tmp_path / f".rank-0.json.999999999.{host}.abc.tmp"
    for path in (live, other_host, other_file):
        path.write_text("")
    report_files.write_json(target, {})
    assert live.exists() and other_host.exists() and other_file.exists()
    old = time.time() - report_files.STALE_AFTER - 60
    os.utime(other_host, (old, old))
    report_files.write_json(target, {})
    assert live.exists() and not other_host.exists() and other_file.exists()


def test_the_report_in_memory_has_the_shape_of_the_files(tmp_path: Path) -> None:
    # one schema (schema.RankRecord as filed): what a.report.ranks holds is what report.json
    # and rank-0.json keep, not the larger record the ranks exchanged
    import torch

    import rngaudit

    a = rngaudit.audit(report_dir=tmp_path)
    with a:
        torch.rand(2)
        torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4)), shuffle=True)
    rngaudit.wait_for_reports()
    assert a.report is not None
    merged = json.loads((tmp_path / "report.json").read_text())["ranks"]
    rank_file = json.loads((tmp_path / "rank-0.json").read_text())["record"]
    assert json.loads(json.dumps(a.report.ranks)) == merged == [rank_file]
    assert set(merged[0]) == {
        "rank",
        "pid",
        "host",
        "events",
        "loaders",
        "states",
        "run_id",
        "environment",
    }
    assert merged[0]["loaders"][0]["audit"] == 0 and merged[0]["events"]
