"""Observed loaders' epochs through the store, in process: who waits, what is returned, deleted."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from ranks_in_process import Ranks, world_of_one

from rngaudit.config import Settings
from rngaudit.epochs import unsharded
from rngaudit.epochs.order_check import Watch
from rngaudit.ranks import exchange

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's wait counts, empty for each test."""
    monkeypatch.setattr(unsharded, "WAITED", unsharded.WAITED.__class__())


def _epoch(key: str = "k", epoch: int = 0, timeout: float = 30.0) -> unsharded.Epoch:
    watch = Watch(Settings("raise", Path("r"), timeout, False), None, True)
    return unsharded.Epoch(key, epoch, f"DataLoader({key})", "MySampler", watch)


def test_a_loader_key_names_what_the_loader_is_and_its_occurrence() -> None:
    key = unsharded.loader_key("TensorDataset(8)", "MySampler", 2, 0)
    assert key == unsharded.loader_key("TensorDataset(8)", "MySampler", 2, 0)
    assert len(key) == 16 and int(key, 16) >= 0
    others = {
        unsharded.loader_key("TensorDataset(9)", "MySampler", 2, 0),
        unsharded.loader_key("TensorDataset(8)", "BatchSampler", 2, 0),
        unsharded.loader_key("TensorDataset(8)", "MySampler", 4, 0),
        unsharded.loader_key("TensorDataset(8)", "MySampler", 2, 1),
    }
    assert key not in others and len(others) == 4


def test_an_epoch_every_rank_announced_is_waited_for_and_then_read_by_both_and_deleted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    epoch = _epoch(timeout=0.2)
    base = f"{unsharded.PREFIX}/k/0"
    for rank in (0, 1):
        with ranks.playing(rank):
            unsharded.start(epoch)
    assert ranks.has(f"{base}/start/1") and ranks.has(f"{unsharded.PREFIX}/k/iterated/1")
    assert unsharded.finish(epoch, {"taken": 4}) is None  # rank 1 did not publish in 0.2 s
    assert unsharded.WAITED == {"DataLoader(k)": 1}
    with ranks.playing(1):
        got = unsharded.finish(epoch, {"taken": 5})
    assert got == [{"taken": 4, "rank": 0}, {"taken": 5, "rank": 1}]
    assert ranks.has(f"{base}/end/0")  # rank 0 has not read them yet
    assert unsharded.collect(epoch) == got  # rank 0, later: the same, never waiting
    for gone in ("end/0", "end/1", "start/0", "start/1", "read"):
        assert not ranks.has(f"{base}/{gone}"), gone
    assert ranks.has(f"{unsharded.PREFIX}/k/iterated/0")  # kept for the run
    assert unsharded.collect(epoch) is None  # read by every rank: nothing left


def test_a_loader_the_other_ranks_never_announced_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    epoch = _epoch("alone", timeout=30.0)
    unsharded.start(epoch)
    assert unsharded.finish(epoch, {"taken": 8}) is None
    assert unsharded.WAITED == {}  # a rank-0-only loader: no wait at all
    unsharded.forget(epoch)  # never published by the others: this rank's keys go
    assert not ranks.has(f"{unsharded.PREFIX}/alone/0/end/0")
    assert not ranks.has(f"{unsharded.PREFIX}/alone/0/start/0")


def test_an_epoch_of_a_loader_every_rank_iterated_before_is_waited_for_until_it_arrives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    for rank in (0, 1):
        with ranks.playing(rank):
            unsharded.start(_epoch())  # epoch 0: both iterate the loader
    later = _epoch(epoch=1)
    unsharded.start(later)  # rank 1 has not announced epoch 1 (yet)
    assert not ranks.has(f"{unsharded.PREFIX}/k/1/start/1")
    waiting = threading.Event()
    real = ranks.store

    class Store:
        """The real store, telling when rank 0 starts waiting on it."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def clone(self) -> Any:
            waiting.set()
            return real.clone()

    ranks.store = Store()

    def rank_1() -> None:
        assert waiting.wait(20)
        real.set(f"{unsharded.PREFIX}/k/1/end/1", exchange.encode({"taken": 3}))

    thread = threading.Thread(target=rank_1)
    thread.start()
    got = unsharded.finish(later, {"taken": 4})
    thread.join()
    assert got == [{"taken": 4, "rank": 0}, {"taken": 3, "rank": 1}]


def test_without_a_group_of_several_ranks_nothing_is_published(tmp_path: Path) -> None:
    with world_of_one(tmp_path):
        unsharded.start(_epoch())
        assert unsharded.finish(_epoch(), {"taken": 1}) is None
        assert unsharded.collect(_epoch()) is None
        unsharded.forget(_epoch())
        from torch.distributed import distributed_c10d

        store = distributed_c10d._get_default_store()
        assert not store.check([f"{unsharded.PREFIX}/k/0/start/0"])
        assert not store.check([f"{unsharded.PREFIX}/k/0/end/0"])
