"""Writing report files: ``rank-<R>.json`` per rank and the merged ``report.json``, atomically."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

RANK_FILE = "rank-{rank}.json"
MERGED_FILE = "report.json"
PREVIOUS_DIR = "previous"  # the run before the latest one, moved aside whole
_RUN_ID = re.compile(rb'"run_id":\s*"([^"\\]*)"')
_HEAD = 4096  # run_id is written near the start of every file (after schema_version)


STALE_AFTER = 3600.0  # seconds: a temp file this old is stale whoever wrote it
_HOST = socket.gethostname().replace(".", "_")


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename in the same directory).

    Temp files left by an earlier writer of ``path`` that was killed (``kill -9``) are removed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.{_HOST}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            # json.dumps, not json.dump: dump() to a file runs the pure-Python encoder (4x slower)
            fh.write(json.dumps(data, separators=(",", ":")) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_stale_temps(path: Path) -> None:
    """Remove ``path``'s temp files whose writer, on this host, is dead, or that are old."""
    now = time.time()
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
        with contextlib.suppress(OSError):
            if _writer_is_dead(tmp.name[len(path.name) + 2 :]) or (
                now - tmp.stat().st_mtime > STALE_AFTER
            ):
                tmp.unlink()


def _writer_is_dead(rest: str) -> bool:
    """From ``PID.HOST.RANDOM.tmp``: is PID a process of this host that no longer exists?"""
    pid, _, rest = rest.partition(".")
    if not pid.isdigit() or not rest.startswith(f"{_HOST}.") or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


def rank_path(report_dir: Path, rank: int) -> Path:
    return report_dir / RANK_FILE.format(rank=rank)


def merged_path(report_dir: Path) -> Path:
    return report_dir / MERGED_FILE


def report_files(report_dir: Path) -> list[Path]:
    """``report.json`` and the ``rank-<R>.json`` files in ``report_dir`` (no sub-directory)."""
    if not report_dir.is_dir():
        return []
    pattern = RANK_FILE.format(rank="*")
    return sorted(p for p in report_dir.iterdir() if p.name == MERGED_FILE or p.match(pattern))


def run_id_of(path: Path) -> str | None:
    """The run id a report file names (read from its first bytes), None if unreadable."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_HEAD)
    except OSError:
        return None
    match = _RUN_ID.search(head)
    return match.group(1).decode("utf-8", "replace") if match else None


def set_aside(report_dir: Path, run_id: str | None = None) -> list[Path]:
    """Move the report files of runs other than ``run_id`` to ``report_dir/previous/``.

    ``previous/`` keeps one run: files there from yet another run are deleted first. Safe
    when several ranks of the new run call it at once: a file of ``run_id`` is never moved,
    and a file another rank moved first is skipped. Returns the files moved.
    """
    stale = [p for p in report_files(report_dir) if run_id is None or run_id_of(p) != run_id]
    if not stale:
        return []
    previous = report_dir / PREVIOUS_DIR
    incoming = {run_id_of(p) for p in stale}
    with contextlib.suppress(OSError):
        for old in report_files(previous):
            if run_id_of(old) not in incoming:
                old.unlink()
        for tmp in previous.glob(".*.tmp") if previous.is_dir() else []:
            tmp.unlink()
    moved = []
    for path in stale:
        try:
            previous.mkdir(exist_ok=True)
            os.replace(path, previous / path.name)
            moved.append(path)
        except FileNotFoundError:  # another rank moved it first
            continue
    return moved

