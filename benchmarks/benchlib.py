"""Helpers shared by the benchmark scripts: child environments, subprocess runs, statistics."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
PYTHON = sys.executable


def child_env(**extra: str) -> dict[str, str]:
    """The environment of every benchmark child: one thread, no audit unless asked for."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RNGAUDIT", "_RNGAUDIT"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run(cmd: Sequence[str], env: dict[str, str], timeout: float = 600.0) -> tuple[float, str]:
    """Run a child to completion; returns (wall seconds, stdout). Raises on failure."""
    start = time.perf_counter()
    proc = subprocess.run(
        list(cmd), cwd=ROOT, env=env, timeout=timeout, text=True, capture_output=True
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(
            f"benchmark child failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}"
        )
    return wall, proc.stdout


def last_json(stdout: str) -> Any:
    """The last line of a child's stdout that is a JSON object."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError(f"no JSON result in child output:\n{stdout[-2000:]}")


def run_json(script: str, args: Sequence[str], env: dict[str, str], timeout: float = 600.0) -> Any:
    _, out = run([PYTHON, str(BENCH / script), *args], env, timeout)
    return last_json(out)


def emit(result: dict[str, Any]) -> None:
    """A child's result: one JSON line on stdout."""
    print(json.dumps(result), flush=True)


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def spread(values: Sequence[float]) -> tuple[float, float]:
    """(min, max): shown next to medians so the noise is visible."""
    return float(min(values)), float(max(values))


def main_cleaning_up(main: Callable[[], None], tmp_prefix: str) -> None:
    """Run ``main``, then remove this process's temp dirs named ``<tmp_prefix><pid>-*``."""
    try:
        main()
    finally:
        for leftover in Path(tempfile.gettempdir()).glob(f"{tmp_prefix}{os.getpid()}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
