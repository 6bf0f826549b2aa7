"""Writing report files: ``rank-<R>.json`` per rank and the merged ``report.json``, atomically."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

RANK_FILE = "rank-{rank}.json"
MERGED_FILE = "report.json"


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to ``path`` atomically (temp file + rename in the same directory)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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


def rank_path(report_dir: Path, rank: int) -> Path:
    return report_dir / RANK_FILE.format(rank=rank)


def merged_path(report_dir: Path) -> Path:
    return report_dir / MERGED_FILE
