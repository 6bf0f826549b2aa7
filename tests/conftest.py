"""Shared fixtures: a report directory per test and a subprocess helper."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# The slowest files first (where their tests started and ended in a make test under load,
# 2026-12-04, and the days before): make test's two xdist workers each run a file whole
# (--dist loadfile), in this order, so a long file handed out last would run alone at the end
# while the other worker idles. Within a file, and among the files not named here, the
# collection order is kept (the sort is stable).
SLOW_FIRST = [
    "test_launchers.py",
    "test_frameworks.py",
    "test_harm_matrix.py",
    "test_generated_configs.py",
    "test_mesh.py",
    "test_odd_rank.py",
    "test_accelerate_own_tests.py",
    "test_exchange_faults.py",
    "test_worker_shapes.py",
    "test_startup.py",
    "test_workers.py",
    "test_demo.py",
    "test_never_break.py",
    "test_exchange_protocol.py",
    "test_exchange.py",
    "test_distributed_matrix.py",
    "test_two_nodes.py",
    "test_observer_effect.py",
    "test_render_html.py",
    "test_diff.py",
]


def pytest_configure(config: pytest.Config) -> None:
    # pytest-xdist hands the files out in the collection order only without its default
    # reordering (the files with the most tests first: the long launch files with few tests,
    # test_launchers and test_frameworks among them, then ran last, one worker idle meanwhile)
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    place = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: place.get(item.path.name, len(place)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Everything imported so far (torch, the test modules) lives to the end: leave it out of
    every later ``gc.collect()``, which then takes milliseconds instead of ~0.3 s."""
    gc.freeze()


@pytest.fixture
def report_dir(tmp_path: Path) -> Path:
    return tmp_path / "report"


def run_python(
    args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 240,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the venv's Python with ``args`` and a clean, deterministic environment."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    full["OMP_NUM_THREADS"] = "1"
    full["PYTHONWARNINGS"] = "ignore"
    full.update(env or {})
    return subprocess.run(
        [sys.executable, *args],
        env=full,
        cwd=str(cwd or ROOT),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def torchrun(
    script: str, *args: str, nproc: int = 2, **kw: object
) -> subprocess.CompletedProcess[str]:
    return run_python(
        ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, *args],
        **kw,  # type: ignore[arg-type]
    )
