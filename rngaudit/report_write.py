"""Writing report files: ``rank-<R>.json`` per rank and the merged ``report.json``, atomically."""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import logging
import os
import re
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger("rngaudit")

RANK_FILE = "rank-{rank}.json"
MERGED_FILE = "report.json"
PREVIOUS_DIR = "previous"  # the run before the latest one, moved aside whole
_RUN_ID = re.compile(rb'"run_id":\s*"([^"\\]*)"')
_HEAD = 4096  # run_id is written near the start of every file (after schema_version)


STALE_AFTER = 3600.0  # seconds: a temp file this old is stale whoever wrote it
_HOST = socket.gethostname().replace(".", "_")


def encode(data: Mapping[str, Any]) -> str:
    # json.dumps, not json.dump: dump() to a file runs the pure-Python encoder (4x slower)
    return json.dumps(data, separators=(",", ":")) + "\n"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename in the same directory)."""
    write_text(path, encode(data))


def write_text(path: Path, text: str, *, mkdir: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename in the same directory).

    Temp files left by an earlier writer of ``path`` that was killed (``kill -9``) are removed.
    ``mkdir=False``: a missing directory is an error (OSError), not created.
    """
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(path)
    fd, tmp = tempfile.mkstemp(
        prefix=f".{path.name}.{os.getpid()}.{_HOST}.", suffix=".tmp", dir=path.parent
    )
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
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


class _Writer:
    """Runs file-writing jobs in order on one background thread, off the audit's exit path.

    The thread is started once and waits for jobs (handing it one is a list append and a
    notify: no thread start on the exit path). At shutdown, also of a multiprocessing child,
    :func:`flush` runs before the interpreter stops threads; a forked child drops the queue.
    """

    def __init__(self) -> None:
        self._jobs: deque[Callable[[], None]] = deque()
        self._cond = threading.Condition()
        self._pending = 0
        self._thread: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            self._jobs.append(job)
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rngaudit-report-writer", daemon=True
                )
                self._thread.start()
                _at_shutdown(self.flush)
            else:
                self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs:
                    self._cond.wait()
                job = self._jobs.popleft()
            try:
                job()
            except Exception:  # the verdict was given; the report stays in memory
                log.warning("rngaudit: could not write a report file", exc_info=True)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def flush(self, timeout: float | None = 60.0) -> bool:
        """Wait until every submitted write is done; False if ``timeout`` passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def reset_in_child(self) -> None:
        self._jobs.clear()
        self._pending = 0
        self._thread = None
        self._cond = threading.Condition()


def _at_shutdown(callback: Callable[[], object]) -> None:
    """Run ``callback`` when the interpreter shuts down, before daemon threads stop: at
    ``threading._shutdown`` (which multiprocessing children run too), else at exit."""
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is not None:
            register(callback)
            return
    except RuntimeError:  # already shutting down
        pass
    atexit.register(callback)


WRITER = _Writer()
os.register_at_fork(after_in_child=WRITER.reset_in_child)


def flush(timeout: float | None = 60.0) -> bool:
    """Wait for report files written in the background (after ``audit()`` exits)."""
    return WRITER.flush(timeout)
