"""Epochs left early, in process: what a rank took until it stopped, folded without a draw."""

from __future__ import annotations

import base64
import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from ranks_in_process import Ranks
from torch.utils.data import DataLoader, Dataset, Sampler

from rngaudit.config import Settings
from rngaudit.epochs import handed, judging, order_check, order_rules, partition, unsharded
from rngaudit.epochs.order_check import Watch
from rngaudit.errors import RNGDivergenceError
from rngaudit.ranks import exchange

pytestmark = pytest.mark.timeout(60)

N = 40


class Items(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


class DrawEach(Sampler[int]):
    """Draws every index as it is asked for: one more ``next()`` would move its generator."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __len__(self) -> int:
        return N

    def __iter__(self) -> Iterator[int]:
        for _ in range(N):
            yield int(torch.randint(N, (1,), generator=self.generator))


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Iterator[order_check.EpochGuard]:
    """A guard of its own (watching every loader once ``_watch``-ed), as rank 0 of two on
    one store."""
    Ranks(monkeypatch, 2)
    guard = order_check.EpochGuard()
    try:
        yield guard
    finally:
        guard.everything = None
        guard.uninstall()
        guard.exit_patches.undo()


def _watch(guard: order_check.EpochGuard) -> None:
    guard.watch_all(Watch(Settings("raise", Path("r"), 5.0, False), None, True))


def _samples(summary: dict[str, Any]) -> set[int]:
    bits = np.frombuffer(base64.b64decode(summary["bitmap"]), dtype=np.uint8)
    return {int(i) for i in np.flatnonzero(np.unpackbits(bits)[:N])}


def _left_after(loader: DataLoader[int], taken: int) -> tuple[list[list[int]], bool]:
    """The batches taken before a break, and whether their epoch was teed (audited)."""
    it = iter(loader)
    batches = [next(it).tolist() for _ in range(taken)]
    tape = it.__dict__.get("_rngaudit_tape")
    teed = tape is not None and tape.teed
    del it, tape  # a break: the iterator goes
    gc.collect()
    return batches, teed


@pytest.mark.parametrize("workers", [0, 1])
def test_a_teed_epoch_left_early_is_folded_from_the_tees_buffer_without_a_draw(
    guard: order_check.EpochGuard, workers: int
) -> None:
    """The rank took 3 batches and left: the fold reads the batches still in the tee's buffer
    (never the sampler: its generator is where the unaudited run leaves it) and, with a
    worker, leaves out the batches drawn ahead (prefetch) that were never handed over."""
    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw.update(prefetch_factor=2, multiprocessing_context="fork")
    plain_gen = torch.Generator().manual_seed(5)
    plain, _ = _left_after(DataLoader(Items(), batch_size=2, sampler=DrawEach(plain_gen), **kw), 3)
    _watch(guard)
    gen = torch.Generator().manual_seed(5)
    audited, teed = _left_after(DataLoader(Items(), batch_size=2, sampler=DrawEach(gen), **kw), 3)
    assert teed  # observed with no rngaudit frame per batch: the batches were in the tee
    assert audited == plain  # the auditor changes no batch
    assert torch.equal(gen.get_state(), plain_gen.get_state())  # nor draws one more
    [(epoch, summary)] = guard.epochs.left
    assert summary["partial"] and summary["known"]
    assert summary["batches"] == 3 and summary["length"] == N // 2
    assert _samples(summary) == {i for batch in plain for i in batch}
    assert epoch.epoch == 0


def test_an_epoch_still_open_when_the_group_goes_is_folded_there(
    guard: order_check.EpochGuard,
) -> None:
    """The iterator is still alive (kept by the user) at settle: folded in place, once."""
    _watch(guard)
    gen = torch.Generator().manual_seed(7)
    it = iter(DataLoader(Items(), batch_size=4, sampler=DrawEach(gen)))
    taken = [next(it).tolist() for _ in range(2)]
    state = gen.get_state().clone()
    [tape] = [t for t in guard.registry.tapes if not t.closed]
    assert tape.teed
    guard.epochs.left_early(tape)
    guard.epochs.left_early(tape)  # a second fold finds it closed
    assert torch.equal(gen.get_state(), state)
    [(_, summary)] = guard.epochs.left
    assert summary["batches"] == 2 and _samples(summary) == {i for b in taken for i in b}
    del it


def _partial(indices: list[int], batches: int, length: int = 16, **kw: Any) -> dict[str, Any]:
    tape = partition.Tape([], 32)
    tape.take([indices])
    return dict(tape.summary(), batches=batches, partial=True, length=length, **kw)


def test_a_partial_overlap_says_how_far_each_rank_got_and_claims_nothing_missing() -> None:
    summaries = {
        0: _partial(list(range(0, 10)), 5, training=True),
        1: _partial(list(range(4, 14)), 5, training=True),
    }
    phrase = handed.phrase(summaries)
    assert phrase == "rank 0 after 5 of 16 batches, rank 1 after 5"
    finding, exact = order_rules.observed_overlap(
        summaries, "DataLoader", "MySampler", 0, None, True, left=phrase
    )
    assert finding is not None and not exact
    assert finding.severity == "error"  # trained under a data-parallel module
    assert (
        "Epoch 0 of DataLoader (MySampler, sharded by no DistributedSampler) was left early: "
        "rank 0 after 5 of 16 batches, rank 1 after 5: by then 6 of 32 samples had gone to "
        "more than one rank"
    ) in finding.message
    assert "none" not in finding.message and finding.details["never"] is None
    warning, _ = order_rules.observed_overlap(
        summaries, "DataLoader", "MySampler", 0, None, False, left=phrase
    )
    assert warning is not None and warning.severity == "warning"


def test_a_partial_epoch_is_no_partition_and_its_padding_no_error() -> None:
    whole = {0: _partial(list(range(0, 32, 2)), 8), 1: _partial(list(range(1, 32, 2)), 8)}
    finding, exact = order_rules.observed_overlap(whole, "L", "S", 0, -1, True, left="x")
    assert finding is None and not exact  # disjoint, and all covered: still no evidence
    full, exact = order_rules.observed_overlap(whole, "L", "S", 0, -1, True)
    assert full is None and exact  # the same shares from a finished epoch are
    padded = {0: _partial([0, 2, 4, 6], 2), 1: _partial([6, 1, 3, 5], 2)}
    finding, _ = order_rules.observed_overlap(padded, "L", "S", 0, -1, True, left="x")
    assert finding is None  # one sample shared: a DistributedSampler's padding at world 2


def test_ranks_that_left_at_different_batches_are_one_loader() -> None:
    same: dict[str, Any] = {"identity": "i", "root_size": 32}
    left = {0: _partial([1], 2, **same), 1: _partial([2], 3, **same)}
    assert judging.one_loader(left, True) and not judging.one_loader(left)
    other = {0: left[0], 1: _partial([2], 3, length=12, **same)}
    assert not judging.one_loader(other, True)  # epochs of different lengths


def test_a_persistent_iterators_epoch_left_early_is_published_at_its_next_epoch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Persistent workers: the iterator outlives the break, and the loader's next epoch resets
    it. The epoch left is folded there (the batches drawn ahead by the prefetch left out),
    published to the store and kept for a later comparison (rank 1 never began it: no wait)."""
    ranks = Ranks(monkeypatch, 2)
    guard = order_check.EpochGuard()
    try:
        _watch(guard)
        gen = torch.Generator().manual_seed(9)
        loader = DataLoader(
            Items(), batch_size=2, sampler=DrawEach(gen), num_workers=1, prefetch_factor=2,
            persistent_workers=True, multiprocessing_context="fork",
        )  # fmt: skip
        it = iter(loader)
        taken = [next(it).tolist() for _ in range(3)]
        first = next(iter(loader)).tolist()  # the next epoch: the same iterator, reset
        [epoch] = guard.epochs.later
        summary = ranks.get(f"{unsharded.PREFIX}/{epoch.key}/0/end/0")
        assert summary["partial"] and summary["batches"] == 3 and summary["length"] == N // 2
        assert _samples(summary) == {i for batch in taken for i in batch}
        assert len(first) == 2 and not guard.epochs.left
        del it
    finally:
        guard.everything = None
        guard.uninstall()
        guard.exit_patches.undo()


class _Session:
    """What a verdict is recorded in."""

    def __init__(self) -> None:
        self.checks: list[tuple[str, list[Any]]] = []

    def add_check(self, label: str, found: list[Any], ranks: Any = None) -> None:
        self.checks.append((label, found))


def test_an_epoch_left_open_when_the_group_goes_raises_there_on_an_overlap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 holds its iterator after 2 batches; rank 1 took the same samples and closed. At
    the group's end (settle, as destroy_process_group() runs it) rank 0 folds its open epoch,
    publishes it and compares: after an epoch that partitioned, an error raised there."""
    ranks = Ranks(monkeypatch, 2)
    guard = order_check.EpochGuard()
    session = _Session()
    try:
        guard.watch_all(Watch(Settings("raise", Path("r"), 5.0, False), session, True))
        it = iter(DataLoader(Items(), batch_size=4, sampler=DrawEach(torch.Generator())))
        taken = [next(it).tolist() for _ in range(2)]
        [known] = list(guard.registry.observed.values())
        guard.judge.partitioned[known.key] = (0, -1)  # an earlier epoch partitioned the data
        tape = partition.Tape([], N)
        mine = {i for batch in taken for i in batch}
        others = [i for i in range(N) if i not in mine][:4]
        tape.take([taken[0], others])  # rank 1 was handed rank 0's first batch, and others
        theirs = dict(tape.summary(), partial=True, length=N // 4, identity=known.identity,
                      training=True, data_parallel=None)  # fmt: skip
        assert not guard.epochs.later and not guard.epochs.left
        with ranks.playing(1):
            ranks.store.set(f"{unsharded.PREFIX}/{known.key}/iterated/1", b"1")
            ranks.store.set(f"{unsharded.PREFIX}/{known.key}/0/end/1", exchange.encode(theirs))
        with pytest.raises(RNGDivergenceError) as raised:
            guard.settle()
        shared = len(set(taken[0]))
        assert (
            f"was left early: rank 0 after 2 of 10 batches, rank 1 after 2: by then {shared} of "
            f"{N} samples had gone to more than one rank"
        ) in str(raised.value)
        assert [label for label, _ in session.checks] == [
            f"observed partition of epoch 0 of {known.label} (BatchSampler > DrawEach)"
        ]
        del it
    finally:
        guard.everything = None
        guard.uninstall()
        guard.exit_patches.undo()


@pytest.mark.parametrize("workers", [0, 1])
def test_an_epoch_so_far_is_read_without_a_draw_and_the_epoch_goes_on_unchanged(
    guard: order_check.EpochGuard, workers: int
) -> None:
    """Mid-epoch, :func:`handed.snapshot` summarises the batches handed so far (from the tee's
    buffer, the prefetch left out) and leaves the tape, the tee and the sampler as they are:
    the epoch goes on to the same batches and the same generator state as unaudited."""
    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw.update(prefetch_factor=2, multiprocessing_context="fork")
    plain_gen = torch.Generator().manual_seed(7)
    plain = [
        b.tolist() for b in DataLoader(Items(), batch_size=2, sampler=DrawEach(plain_gen), **kw)
    ]
    _watch(guard)
    gen = torch.Generator().manual_seed(7)
    it = iter(DataLoader(Items(), batch_size=2, sampler=DrawEach(gen), **kw))
    audited = [next(it).tolist() for _ in range(3)]
    tape = it.__dict__["_rngaudit_tape"]
    before = (tape.batches, list(tape.pending), tape.closed)
    summary = handed.snapshot(tape)
    assert summary is not None and summary["partial"] and summary["known"]
    assert summary["batches"] == 3 and summary["length"] == N // 2
    assert _samples(summary) == {i for batch in plain[:3] for i in batch}
    assert (tape.batches, list(tape.pending), tape.closed) == before
    audited += [b.tolist() for b in it]
    assert audited == plain
    assert torch.equal(gen.get_state(), plain_gen.get_state())
    assert handed.snapshot(tape) is None  # the epoch ended: nothing so far to read
