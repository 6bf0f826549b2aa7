"""Epochs still uncompared when the group goes, in process: what is settled, skipped and named."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from ranks_in_process import Ranks, world_of_one

from rngaudit.config import Settings
from rngaudit.epochs import uncompared, unsharded
from rngaudit.epochs.order_check import Watch
from rngaudit.ranks import exchange

pytestmark = pytest.mark.timeout(60)  # a wait that ignored a closed rank runs into it


def _epoch(key: str, epoch: int = 0) -> unsharded.Epoch:
    watch = Watch(Settings("raise", Path("r"), 30.0, False), None, True)
    return unsharded.Epoch(key, epoch, f"DataLoader({key})", "MySampler", watch)


def _iterated(ranks: Ranks, key: str, who: tuple[int, ...]) -> None:
    for rank in who:
        with ranks.playing(rank):
            unsharded.start(_epoch(key))


def _published(ranks: Ranks, epoch: unsharded.Epoch, rank: int, taken: int) -> None:
    """``rank`` published ``epoch`` (at its end, without waiting for the others)."""
    with ranks.playing(rank):
        key = f"{unsharded.PREFIX}/{epoch.key}/{epoch.epoch}/end/{rank}"
        ranks.store.set(key, exchange.encode({"taken": taken}))


def test_closing_marks_each_loader_closed_for_this_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(monkeypatch, 2)
    with ranks.playing(1):
        uncompared.close(["a", "b"])
    assert ranks.has(f"{unsharded.PREFIX}/a/closed/1") and ranks.has(
        f"{unsharded.PREFIX}/b/closed/1"
    )
    assert not ranks.has(f"{unsharded.PREFIX}/a/closed/0")


def test_what_every_rank_published_is_returned_and_the_rest_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    _iterated(ranks, "both", (0, 1))
    _iterated(ranks, "left", (0, 1))
    _iterated(ranks, "mine", (0,))  # rank 1 never iterated it: a rank-0-only loader
    both, left, mine = _epoch("both", 1), _epoch("left"), _epoch("mine")
    _published(ranks, both, 0, 4)
    _published(ranks, both, 1, 5)
    _published(ranks, left, 0, 6)
    _published(ranks, mine, 0, 7)
    with ranks.playing(1):
        uncompared.close(["both", "left"])  # rank 1 left "left" early: it never publishes
    settled = uncompared.settle([both, left, mine], 600.0)  # rank 1 closed: no wait
    assert settled == [
        (both, [{"taken": 4, "rank": 0}, {"taken": 5, "rank": 1}], []),
        (left, None, [1]),
    ]
    assert not ranks.has(f"{unsharded.PREFIX}/left/0/end/0")  # forgotten
    assert not ranks.has(f"{unsharded.PREFIX}/mine/0/end/0")  # skipped, and forgotten


def test_a_rank_that_neither_publishes_nor_closes_is_named_after_the_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    _iterated(ranks, "k", (0, 1))
    epoch = _epoch("k")
    _published(ranks, epoch, 0, 4)
    assert uncompared.settle([epoch], 0.1) == [(epoch, None, [1])]
    assert uncompared.settle([], 0.1) == []


def test_an_epoch_published_during_the_wait_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    ranks = Ranks(monkeypatch, 2)
    _iterated(ranks, "k", (0, 1))
    epoch = _epoch("k")
    _published(ranks, epoch, 0, 4)
    looked = threading.Event()
    real = ranks.store

    class Store:
        """The real store, telling when rank 0 first looks for rank 1's close."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def check(self, keys: list[str]) -> bool:
            if keys == [f"{unsharded.PREFIX}/k/closed/1"]:
                looked.set()
            return bool(real.check(keys))

    ranks.store = Store()

    def rank_1() -> None:
        assert looked.wait(20)
        real.set(f"{unsharded.PREFIX}/k/0/end/1", exchange.encode({"taken": 5}))

    thread = threading.Thread(target=rank_1)
    thread.start()
    settled = uncompared.settle([epoch], 30.0)
    thread.join()
    assert settled == [(epoch, [{"taken": 4, "rank": 0}, {"taken": 5, "rank": 1}], [])]


def test_without_a_group_of_several_ranks_nothing_settles(tmp_path: Path) -> None:
    with world_of_one(tmp_path):
        uncompared.close(["k"])
        assert uncompared.settle([_epoch("k")], 0.1) == []
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        assert not store.check([f"{unsharded.PREFIX}/k/closed/0"])
