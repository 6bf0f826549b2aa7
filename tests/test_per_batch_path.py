"""The order check's guard: no rngaudit frame on the per-batch path once an epoch is checked."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as D
import wrapt
from torch.utils.data.dataloader import _BaseDataLoaderIter

import rngaudit


class _Items(D.Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def test_after_the_first_batch_the_iterator_runs_the_originals(tmp_path: Path) -> None:
    loader = D.DataLoader(_Items(12), batch_size=2, shuffle=True)
    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        torch.manual_seed(0)
        it = iter(loader)
        first = next(it)
        cls = type(it)
        assert cls.__dict__.get("_rngaudit_plain") is True  # switched after the first batch
        assert isinstance(cls.__dict__["__next__"], type(lambda: 0))  # the original function
        assert not isinstance(cls.__dict__["__next__"], wrapt.FunctionWrapper)
        assert isinstance(_BaseDataLoaderIter.__dict__["__next__"], wrapt.FunctionWrapper)
        rest = list(it)
    torch.manual_seed(0)
    assert [b.tolist() for b in [first, *rest]] == [b.tolist() for b in loader]
    rngaudit.wait_for_reports()


def _rngaudit_frames(body: Any) -> list[str]:
    """The rngaudit functions that run (Python frames) while ``body()`` runs."""
    seen: list[str] = []
    root = str(Path(rngaudit.__file__).parent)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        body()
    finally:
        sys.setprofile(None)
    return seen


def test_no_rngaudit_frame_runs_per_batch_after_the_first(tmp_path: Path) -> None:
    loader = D.DataLoader(_Items(40), batch_size=2, shuffle=True)
    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        it = iter(loader)
        next(it)
        rest = _rngaudit_frames(lambda: [next(it) for _ in range(18)])
    assert rest == []
    rngaudit.wait_for_reports()


def test_an_observed_epoch_runs_no_rngaudit_frame_per_batch(tmp_path: Path) -> None:
    """A sharded loader's partition is observed through a tee of its index batches: after its
    first batch no rngaudit code runs per batch, and every batch is still counted and the
    epoch compared at its end."""
    from torch.utils.data.distributed import DistributedSampler

    data = _Items(40)
    sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=2, rank=0, seed=1)
    loader = D.DataLoader(data, batch_size=2, sampler=sampler)
    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        it = iter(loader)
        first = next(it)
        rest = _rngaudit_frames(lambda: [next(it) for _ in range(8)])
        tape = it.__dict__["_rngaudit_tape"]
        assert rest == [] and tape.teed and not tape.closed
        last = list(it)
        assert len(last) == 1 and tape.closed  # drawn to its end: compared
        assert tape.taken == 20 and tape.batches == 10
    plain = [b.tolist() for b in D.DataLoader(data, batch_size=2, sampler=sampler)]
    assert plain[0] == first.tolist() and plain[-1] == last[0].tolist()  # the same batches
    rngaudit.wait_for_reports()


def test_an_untee_able_epoch_keeps_only_the_index_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the index batches cannot be teed (a root over TEE_MAX samples here), after the
    first batch the only rngaudit code per batch keeps the index batch (no wrapper, no
    first-batch detection), and the epoch is still compared at its end."""
    from torch.utils.data.distributed import DistributedSampler

    from rngaudit.epochs import index_batches

    monkeypatch.setattr(index_batches, "TEE_MAX", 0)
    data = _Items(40)
    sampler: DistributedSampler[int] = DistributedSampler(data, num_replicas=2, rank=0, seed=1)
    loader = D.DataLoader(data, batch_size=2, sampler=sampler)
    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        it = iter(loader)
        next(it)
        frames = _rngaudit_frames(lambda: [next(it) for _ in range(8)])
        tape = it.__dict__["_rngaudit_tape"]
        assert set(frames) <= {"_next_index", "observe", "add"}  # no wrapper, no detection
        assert frames.count("_next_index") == frames.count("observe") == 8
        assert sum(len(b) for b in tape.pending) == 18 and not tape.closed  # 9 batches kept
        assert len(list(it)) == 1 and tape.closed  # drawn to its end: compared
    rngaudit.wait_for_reports()


def test_a_persistent_iterator_is_checked_again_at_its_next_epoch(tmp_path: Path) -> None:
    loader = D.DataLoader(_Items(8), batch_size=2, num_workers=1, persistent_workers=True)
    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        epochs = []
        for _ in range(2):
            it = iter(loader)
            assert not type(it).__dict__.get("_rngaudit_plain", False)  # reset: its own class
            epochs.append([b.tolist() for b in it])
            assert type(it).__dict__.get("_rngaudit_plain") is True
    assert epochs == [[[0, 1], [2, 3], [4, 5], [6, 7]]] * 2
    rngaudit.wait_for_reports()


def test_another_librarys_wrapper_is_kept(tmp_path: Path) -> None:
    calls: list[int] = []

    def count(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append(1)
        return wrapped(*args, **kwargs)

    class Counting(D.dataloader._SingleProcessDataLoaderIter):
        pass

    with rngaudit.audit(report_dir=tmp_path, mode="report"):
        Counting.__next__ = wrapt.FunctionWrapper(  # type: ignore[method-assign]
            _BaseDataLoaderIter.__dict__["__next__"], count
        )
        it = Counting(D.DataLoader(_Items(6), batch_size=2))
        assert len(list(it)) == 3
        assert calls == [1, 1, 1, 1]  # three batches and the StopIteration: never bypassed
    rngaudit.wait_for_reports()
