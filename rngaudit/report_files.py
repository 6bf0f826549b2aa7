"""Writing report files: ``rank-<R>.json`` per rank and the merged ``report.json``, atomically."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

RANK_FILE = "rank-{rank}.json"
MERGED_FILE = "report.json"


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
