"""Writing report files: ``rank-<R>.json`` per rank and the merged ``report.json``, atomically."""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import math
import os
import re
import stat as stat_module
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rngaudit import launcher

log = logging.getLogger("rngaudit")

RANK_FILE = "rank-{rank}.json"
MERGED_FILE = "report.json"
PREVIOUS_DIR = "previous"  # the run before the latest one, moved aside whole
_RUN_ID = re.compile(rb'"run_id":\s*"([^"\\]*)"')
_HEAD = 4096  # run_id is written near the start of every file (after schema_version)


STALE_AFTER = 3600.0  # seconds: a temp file this old is stale whoever wrote it
_HOST = launcher.node().replace(".", "_")


def encode(data: Mapping[str, Any]) -> str:
    # json.dumps, not json.dump: dump() to a file runs the pure-Python encoder (4x slower)
    try:
        return json.dumps(data, separators=(",", ":"), allow_nan=False) + "\n"
    except ValueError:  # a NaN or an infinity somewhere: not JSON
        return json.dumps(finite(data), separators=(",", ":"), allow_nan=False) + "\n"


def finite(data: Any) -> Any:
    """``data`` with every NaN and infinity replaced by the string JSON readers keep of it
    (``"NaN"``, ``"Infinity"``, ``"-Infinity"``): what is written is valid JSON. Containers
    are copied only where something changed."""
    if isinstance(data, float):
        if data != data:
            return "NaN"
        if data in (math.inf, -math.inf):
            return "Infinity" if data > 0 else "-Infinity"
        return data
    if isinstance(data, Mapping):
        items = {key: finite(value) for key, value in data.items()}
        same = all(items[key] is value for key, value in data.items())
        return data if same else items
    if isinstance(data, (list, tuple)):
        values = [finite(value) for value in data]
        return data if all(a is b for a, b in zip(values, data, strict=True)) else values
    return data


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename in the same directory)."""
    write_text(path, encode(data))


# Inside a report directory nothing is followed: every file is opened, created, renamed and
# removed relative to the directory's own descriptor, by name, with O_NOFOLLOW; a planted
# symbolic link is replaced or moved as a link, never written or deleted through.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@contextlib.contextmanager
def _directory(path: Path) -> Iterator[int]:
    """A descriptor of the report directory ``path`` (the directory the user named, links in
    its own path followed as they asked)."""
    fd = os.open(path, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    try:
        yield fd
    finally:
        os.close(fd)


def write_text(path: Path, text: str, *, mkdir: bool = True) -> None:
    """Write ``text`` to ``path`` atomically (temp file + rename in the same directory).

    Temp files left by an earlier writer of ``path`` that was killed (``kill -9``) are removed.
    ``mkdir=False``: a missing directory is an error (OSError), not created. Nothing outside
    ``path``'s directory is touched: a symbolic link at ``path`` is replaced, not followed.
    """
    if mkdir:
        path.parent.mkdir(parents=True, exist_ok=True)
    with _directory(path.parent) as fd:
        _remove_stale_temps(fd, path.name)
        tmp = f".{path.name}.{os.getpid()}.{_HOST}.{os.urandom(6).hex()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
        out = os.open(tmp, flags, 0o644, dir_fd=fd)
        try:
            with os.fdopen(out, "w", encoding="utf-8") as fh:
                os.fchmod(fh.fileno(), 0o644)  # whatever the umask: other users read reports
                fh.write(text)
            os.replace(tmp, path.name, src_dir_fd=fd, dst_dir_fd=fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=fd)
            raise


def _is_temp(name: str, of: str | None = None) -> bool:
    """A temp file's name: ``.NAME.PID.HOST.RANDOM.tmp`` (of the file ``of``, or any)."""
    return name.endswith(".tmp") and name.startswith(f".{of}." if of is not None else ".")


def _remove_stale_temps(fd: int, name: str) -> None:
    """Remove ``name``'s temp files (in the directory ``fd``) whose writer, on this host, is
    dead, or that are old."""
    now = time.time()
    with contextlib.suppress(OSError), os.scandir(fd) as entries:
        for entry in entries:
            if not _is_temp(entry.name, name):
                continue
            with contextlib.suppress(OSError):
                stat = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                if _writer_is_dead(entry.name[len(name) + 2 :]) or (
                    now - stat.st_mtime > STALE_AFTER
                ):
                    os.unlink(entry.name, dir_fd=fd)


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


def _is_report_name(name: str) -> bool:
    prefix, suffix = RANK_FILE.split("{rank}")
    return name == MERGED_FILE or (
        name.startswith(prefix) and name.endswith(suffix) and len(name) > len(prefix + suffix)
    )


def _report_names(fd: int) -> list[str]:
    """``report.json`` and the ``rank-<R>.json`` entries of the directory ``fd`` (files or
    links, never a sub-directory's)."""
    with os.scandir(fd) as entries:
        return sorted(
            e.name
            for e in entries
            if _is_report_name(e.name) and not e.is_dir(follow_symlinks=False)
        )


def report_files(report_dir: Path) -> list[Path]:
    """``report.json`` and the ``rank-<R>.json`` files in ``report_dir`` (no sub-directory)."""
    try:
        with _directory(report_dir) as fd:
            return [report_dir / name for name in _report_names(fd)]
    except OSError:
        return []


def run_id_of(path: Path) -> str | None:
    """The run id a report file names (read from its first bytes), None if unreadable (or a
    symbolic link: never followed)."""
    try:
        with _directory(path.parent) as fd:
            return _run_id_at(fd, path.name)
    except OSError:
        return None


def _run_id_at(fd: int, name: str) -> str | None:
    match = _RUN_ID.search(_head_at(fd, name))
    return match.group(1).decode("utf-8", "replace") if match else None


def _head_at(fd: int, name: str) -> bytes:
    """The first bytes of the regular file ``name`` in ``fd`` (empty: absent, unreadable, a
    link or not a file)."""
    try:
        file = os.open(name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return b""
    try:
        if not stat_module.S_ISREG(os.fstat(file).st_mode):
            return b""  # a FIFO or a device planted under a report's name
        return os.read(file, _HEAD)
    except OSError:
        return b""
    finally:
        os.close(file)


def _previous(top: int) -> int:
    """A descriptor of ``previous/`` in the report directory ``top``, created when missing. A
    symbolic link (or a file) planted under that name is removed first, never followed."""
    for attempt in range(3):  # several ranks of one run may get here at once
        try:
            return os.open(
                PREVIOUS_DIR, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=top
            )
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(PREVIOUS_DIR, dir_fd=top)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENOTDIR) or attempt == 2:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.unlink(PREVIOUS_DIR, dir_fd=top)  # the link itself, not what it names
    return os.open(PREVIOUS_DIR, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=top)


def set_aside(report_dir: Path, run_id: str | None = None) -> list[Path]:
    """Move the report files of runs other than ``run_id`` to ``report_dir/previous/``.

    ``previous/`` keeps one run: files there from yet another run are deleted first. Safe
    when several ranks of the new run call it at once: a file of ``run_id`` is never moved,
    and a file another rank moved first is skipped. Nothing outside ``report_dir`` is touched
    (see :func:`_previous`). Returns the files moved.
    """
    with _directory(report_dir) as top:
        stale = [n for n in _report_names(top) if run_id is None or _run_id_at(top, n) != run_id]
        if not stale:
            return []
        incoming = {_run_id_at(top, n) for n in stale}
        previous = _previous(top)
        try:
            with contextlib.suppress(OSError):
                for old in _report_names(previous):
                    if _run_id_at(previous, old) not in incoming:
                        os.unlink(old, dir_fd=previous)
                with os.scandir(previous) as entries:
                    temps = [e.name for e in entries if _is_temp(e.name)]
                for tmp in temps:
                    os.unlink(tmp, dir_fd=previous)
            moved = []
            for name in stale:
                try:
                    os.replace(name, name, src_dir_fd=top, dst_dir_fd=previous)
                    moved.append(report_dir / name)
                except FileNotFoundError:  # another rank moved it first
                    continue
            return moved
        finally:
            os.close(previous)


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
