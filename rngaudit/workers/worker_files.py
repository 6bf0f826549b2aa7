"""The files a worker writes for its parent (w<id>.json, d<id>.json), written and read back."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rngaudit import report_files

REPORT_PREFIX = "w"
REPORT_SUFFIX = ".json"
DRAW_PREFIX = "d"  # the draw report's file: d<worker id>.json (the init report is w<id>.json)


def report_name(worker_id: int, prefix: str = REPORT_PREFIX) -> str:
    return f"{prefix}{worker_id}{REPORT_SUFFIX}"


def write_report(
    report_dir: str, worker_id: int, report: dict[str, Any], prefix: str = REPORT_PREFIX
) -> bool:
    """Write one worker's report atomically; never raises (a missing directory is fine)."""
    path = Path(report_dir) / report_name(worker_id, prefix)
    try:
        report_files.write_text(path, json.dumps(report), mkdir=False)
    except Exception:
        return False
    return True


def read_reports(report_dir: str, prefix: str = REPORT_PREFIX) -> dict[int, dict[str, Any]]:
    """The reports written so far, by worker id; unreadable files are skipped."""
    out: dict[int, dict[str, Any]] = {}
    try:
        names = os.listdir(report_dir)
    except OSError:
        return out
    for name in names:
        if not (name.startswith(prefix) and name.endswith(REPORT_SUFFIX)):
            continue
        try:
            worker_id = int(name[len(prefix) : -len(REPORT_SUFFIX)])
            with open(os.path.join(report_dir, name), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out[worker_id] = data
    return out
