"""Worker stream checks through the public ways in: audit() and RNGAUDIT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_python
from torch.utils.data import DataLoader
from worker_datasets import LazyDataset, OwnedDataset

import rngaudit

pytestmark = pytest.mark.timeout(300)


def test_audit_block_raises_by_the_first_batch(report_dir: Path) -> None:
    loader = DataLoader(OwnedDataset("numpy"), batch_size=2, num_workers=2)
    with (
        pytest.raises(rngaudit.WorkerDuplicateStreamError, match=r"dataset\.rng"),
        rngaudit.audit(report_dir=report_dir),
    ):
        next(iter(loader))
    assert rngaudit.wait_for_reports()
    merged = json.loads((report_dir / "report.json").read_text())
    kinds = {(f["kind"], f["severity"]) for f in merged["findings"]}
    assert ("worker-duplicate-stream", "error") in kinds


def test_workers_started_inside_prepare_are_checked_after_the_block(report_dir: Path) -> None:
    loader = DataLoader(OwnedDataset("random"), batch_size=2, num_workers=2)
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        it = iter(loader)  # workers start inside the window (as in state_dict())
    batches = list(it)  # the first batch, after the window, confirms the duplicate
    assert batches
    merged = json.loads((report_dir / "report.json").read_text())
    assert merged["verdict"] == "error"
    assert [f["details"]["path"] for f in merged["findings"]] == ["dataset.rng"]


def test_lazy_generators_are_clean(report_dir: Path) -> None:
    loader = DataLoader(LazyDataset(), batch_size=2, num_workers=2)
    with rngaudit.audit(report_dir=report_dir) as a:
        list(loader)
    assert a.report is not None and a.report.verdict == "ok"


def test_rngaudit_env_reports_duplicate_worker_streams(tmp_path: Path) -> None:
    env = {"RNGAUDIT": "report", "RNGAUDIT_REPORT_DIR": str(tmp_path)}
    proc = run_python(["tests/envmode/worker_dup.py"], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    merged = json.loads((tmp_path / "report.json").read_text())
    dup = [f for f in merged["findings"] if f["kind"] == "worker-duplicate-stream"]
    assert dup and dup[0]["severity"] == "error"
    assert dup[0]["details"]["worker_ids"] == [0, 1]


def test_rngaudit_env_raise_mode_stops_at_the_first_batch(tmp_path: Path) -> None:
    env = {"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(tmp_path)}
    proc = run_python(["tests/envmode/worker_dup.py"], env=env)
    assert proc.returncode != 0
    assert "WorkerDuplicateStreamError" in proc.stderr


def test_workers_of_a_loader_prepared_in_the_block_are_checked_after_it(report_dir: Path) -> None:
    """accelerate's default loader starts its workers at the first batch, after the block."""
    from accelerate import Accelerator
    from torch.utils.data import dataloader

    original = dataloader._MultiProcessingDataLoaderIter.__init__
    loader = DataLoader(OwnedDataset("numpy"), batch_size=2, num_workers=2)
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        prepared = Accelerator(cpu=True).prepare(loader)
    assert dataloader._MultiProcessingDataLoaderIter.__init__ is not original  # still armed
    assert list(prepared)
    merged = json.loads((report_dir / "report.json").read_text())
    dup = [f for f in merged["findings"] if f["kind"] == "worker-duplicate-stream"]
    assert dup and dup[0]["severity"] == "error"
    # once the block's loader has started its workers, the check is gone
    assert dataloader._MultiProcessingDataLoaderIter.__init__ is original


def test_the_worker_check_kept_for_a_loader_dropped_unstarted_is_removed(report_dir: Path) -> None:
    """A loader with workers built in the block and never iterated keeps the check only while
    it lives: once collected, nothing of the check is left (also when its finalizer runs
    before the set of waiting loaders forgets it)."""
    import gc

    from torch.utils.data import dataloader

    from rngaudit.workers import monitor

    original = dataloader._MultiProcessingDataLoaderIter.__init__
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        loader = DataLoader(OwnedDataset("numpy"), batch_size=2, num_workers=2)
    assert dataloader._MultiProcessingDataLoaderIter.__init__ is not original  # waiting for it
    del loader
    gc.collect()
    assert dataloader._MultiProcessingDataLoaderIter.__init__ is original
    assert len(monitor.PATCHES) == 0 and not monitor._active
