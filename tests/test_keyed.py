"""Keyed iterable streams in one process: the key read from every batch shape, the ids hashed
deterministically, the coordinated threshold sample and its estimate, the verdict's rules, and
the per-batch path of a keyed loader (the batches it returns untouched)."""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from collections import namedtuple
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as D
from hypothesis import given, settings
from hypothesis import strategies as st
from ranks_in_process import Ranks

import rngaudit
from rngaudit import config
from rngaudit.epochs import keyed

pytestmark = pytest.mark.timeout(120)

Pair = namedtuple("Pair", ["x", "id"])


@dataclass
class Batch:
    x: Any
    id: Any


def _h(*ids: int) -> list[int]:
    return [keyed.hash_int(i) for i in ids]


@pytest.mark.parametrize(
    ("batch", "key", "ids"),
    [
        ({"id": torch.tensor([3, 4]), "x": torch.zeros(2)}, "id", _h(3, 4)),
        ({"id": [3, 4]}, "id", _h(3, 4)),
        ({"id": 7}, "id", _h(7)),  # batch_size=None: one sample
        ((torch.zeros(2), torch.tensor([5, 6])), 1, _h(5, 6)),
        ([torch.tensor([5, 6]), torch.zeros(2)], "0", _h(5, 6)),
        (Pair(torch.zeros(2), torch.tensor([8])), "id", _h(8)),
        (Pair(torch.zeros(2), torch.tensor([8])), 1, _h(8)),
        (Batch(None, np.array([[1, 2], [3, 4]])), "id", _h(1, 2, 3, 4)),
        ({"meta": {"id": torch.tensor([9])}}, "meta.id", _h(9)),
        ({"meta.id": [2]}, "meta.id", _h(2)),
        ({0: [1]}, "0", _h(1)),
        ({"id": torch.tensor([1, 2], dtype=torch.uint8)}, "id", _h(1, 2)),
        ({"id": [torch.tensor(1), torch.tensor([2])]}, "id", _h(1, 2)),
        ({"x": [1, 2]}, lambda b: [i * 10 for i in b["x"]], _h(10, 20)),
    ],
)
def test_the_key_is_read_from_every_batch_shape(batch: Any, key: Any, ids: list[int]) -> None:
    got = keyed.read(batch, key)
    assert got is not None
    assert [int(v) for v in keyed.hashed(got)] == ids


def test_str_and_bytes_ids_hash_by_blake2b() -> None:
    digest = int.from_bytes(hashlib.blake2b(b"a/b.jpg", digest_size=8).digest(), "little")
    got = keyed.hashed(keyed.read({"k": ["a/b.jpg", b"a/b.jpg", 3]}, "k"))
    assert [int(v) for v in got] == [digest, digest, keyed.hash_int(3)]


class _Raising(dict[str, Any]):
    def __contains__(self, key: object) -> bool:
        raise RuntimeError("no")


def _raises(batch: Any) -> Any:
    raise ValueError("the key raised")


@pytest.mark.parametrize(
    ("batch", "key"),
    [
        ({"x": [1]}, "id"),  # missing field
        ({"id": torch.tensor([1.5])}, "id"),  # floats are no ids
        ({"id": torch.tensor([True])}, "id"),
        ({"id": True}, "id"),
        ({"id": None}, "id"),
        ({"id": [1, 2.5]}, "id"),
        ({"id": object()}, "id"),
        ((1, 2), 5),  # out of range
        ((1, 2), "x"),
        (torch.tensor([1, 2]), "id"),
        (_Raising(id=1), "id"),
        ({"x": 1}, _raises),
        ({"id": [[[[1]]]]}, "id"),  # nested deeper than read
        ({"meta": {"x": 1}}, "meta.id"),
    ],
)
def test_an_unreadable_key_is_none_never_a_raise(batch: Any, key: Any) -> None:
    assert keyed.read(batch, key) is None


def test_int_ids_hash_by_splitmix64_the_same_in_every_process() -> None:
    assert keyed.hash_int(0) == 0xE220A8397B1DCDAF  # splitmix64's first output from state 0
    assert keyed.hash_int(-1) == keyed.hash_int((1 << 64) - 1)
    assert keyed.hash_int(1 << 70) != keyed.hash_int(0)
    code = "from rngaudit.epochs import keyed; print(int(keyed.read({'k': [b'', 'x']}, 'k')[1]))"
    outs = set()
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        proc = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        outs.add(proc.stdout.strip())
    assert outs == {str(int(keyed.read({"k": "x"}, "k")[0]))}  # not Python's salted hash()


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 3000),
    st.integers(0, 3000),
    st.integers(0, 400),
    st.integers(8, 256),
)
def test_the_kept_sample_is_coordinated_and_its_estimate_within_the_bound(
    only_a: int, only_b: int, both: int, cap: int
) -> None:
    ids_a = list(range(both)) + list(range(10_000, 10_000 + only_a))
    ids_b = list(range(both)) + list(range(20_000, 20_000 + only_b))
    summaries = {}
    for rank, ids in enumerate((ids_a, ids_b)):
        taken = keyed.Taken(cap)
        for start in range(0, len(ids), 7):
            taken.add(keyed.read(ids[start : start + 7], lambda b: b))
        kept = taken.kept()
        everything = np.array(_h(*ids), dtype=np.uint64)
        assert taken.kept().dtype == np.uint64
        assert kept.size <= cap or taken.threshold == keyed.FULL
        assert set(kept.tolist()) == set(everything[everything < taken.threshold].tolist())
        assert taken.taken == len(ids)
        summaries[rank] = taken.summary()
    seen = keyed.overlap(summaries)
    assert seen is not None
    if not seen["estimated"]:
        assert seen["shared"] == both and seen["union"] == both + only_a + only_b
    else:
        assert abs(seen["shared"] - both) <= seen["shared_bound"]
        assert seen["shared_proven"] <= both


def _summary(ids: list[int], cap: int = keyed.CAP) -> dict[str, Any]:
    taken = keyed.Taken(cap)
    taken.add(keyed.read(ids, lambda b: b))
    return taken.summary()


def test_the_verdict_allows_one_round_of_padding_and_never_a_ranks_own_repeats() -> None:
    def verdict(a: list[int], b: list[int], dp: bool = False) -> Any:
        return keyed.verdict({0: _summary(a), 1: _summary(b)}, "L", "'id'", 0, 4, dp, [])

    assert verdict(list(range(48)), list(range(48, 96))) is None  # a partition
    assert verdict(list(range(52)), list(range(44, 96))) is None  # 8 = 2 x 4 repeated: padding
    found = verdict(list(range(53)), list(range(44, 96)))
    assert found is not None and found.severity == "error" and found.kind == "partition-overlap"
    assert "9 samples (by key 'id') went to more than one rank; rank 0 took 53, rank 1 took 52, "
    assert "96 distinct in all" in found.message
    assert verdict(list(range(48)) * 3, list(range(48, 96)) * 2) is None  # own repeats
    same = verdict(list(range(48)), list(range(48)))
    assert same is not None and same.severity == "warning"  # a tensor-parallel group?
    same = verdict(list(range(48)), list(range(48)), dp=True)
    assert same is not None and same.severity == "error"
    unknown = {"keyed": True, "known": False}
    assert keyed.verdict({0: unknown, 1: _summary([1])}, "L", "'id'", 0, 4, True, []) is None


def test_a_sampled_overlap_is_estimated_and_said_so() -> None:
    a, b = list(range(6000)), list(range(3000, 9000))
    found = keyed.verdict({0: _summary(a, 512), 1: _summary(b, 512)}, "L", "'id'", 0, 4, True, [])
    assert found is not None and "about " in found.message and "hash sample" in found.message
    assert found.details["estimated"] is True


def test_sample_key_returns_its_target_and_never_raises(caplog: pytest.LogCaptureFixture) -> None:
    ds = D.TensorDataset(torch.arange(4))
    loader = D.DataLoader(ds, batch_size=2)
    assert rngaudit.sample_key(loader, "id") is loader
    assert keyed.registered(loader.batch_sampler, None) == keyed.spec_of("id")
    assert rngaudit.sample_key(ds, 0) is ds
    again = rngaudit.sample_key(D.DataLoader(ds, batch_size=2), "id")  # the same identity
    rngaudit.sample_key(again, "id")  # declared twice: one place
    assert keyed.ORDINALS[again.batch_sampler] == keyed.ORDINALS[loader.batch_sampler] + 1
    assert keyed.registered(None, ds) == keyed.spec_of(0)
    with caplog.at_level(logging.WARNING, "rngaudit"):
        odd: list[int] = []
        assert rngaudit.sample_key(odd, "id") is odd  # unhashable
        assert rngaudit.sample_key(5, "id") == 5  # not weak-referenceable
        assert rngaudit.sample_key(ds, 1.5) is ds  # not a key
    assert len([r for r in caplog.records if "sample_key ignored" in r.getMessage()]) == 3


def test_the_environment_names_the_sample_key() -> None:
    assert config.resolve(environ={"RNGAUDIT_SAMPLE_KEY": " id "}).sample_key == "id"
    assert config.resolve(environ={}).sample_key is None


class _Stream(D.IterableDataset[dict[str, Any]]):
    def __init__(self, n: int, broken_at: int | None = None) -> None:
        self.n, self.broken_at = n, broken_at

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(self.n):
            if i == self.broken_at:
                yield {"x": torch.zeros(2)}  # no id: the key cannot be read
            else:
                yield {"id": i, "x": torch.full((2,), float(i))}


def _frames(body: Any) -> list[str]:
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


def _as_lists(batches: list[Any]) -> list[Any]:
    return [{k: v.tolist() for k, v in b.items()} for b in batches]


@settings(max_examples=4, deadline=None)
@given(st.integers(1, 30), st.sampled_from([None, 1, 3]))
def test_a_keyed_loader_keeps_a_frame_per_batch_and_returns_them_untouched(
    tmp_path_factory: pytest.TempPathFactory, n: int, batch: int | None
) -> None:
    tmp_path = tmp_path_factory.mktemp("keyed")
    with pytest.MonkeyPatch.context() as patch:
        Ranks(patch, 1)  # a rank of a world on one real store (keyed loaders need a world)
        plain = list(D.DataLoader(_Stream(n), batch_size=batch))
        loader = D.DataLoader(_Stream(n), batch_size=batch)
        other = D.DataLoader(_Stream(n), batch_size=batch)
        with rngaudit.audit(report_dir=tmp_path / "r", mode="report"):
            rngaudit.sample_key(loader, "id")
            it, unkeyed = iter(loader), iter(other)
            got, rest = [next(it)], [next(unkeyed)]
            frames = _frames(lambda: got.extend(it))
            assert frames.count("pull") == len(got)  # each batch after the first, its end
            assert frames.count("read") == len(got) - 1  # its ids read
            assert _frames(lambda: rest.extend(unkeyed)) == []  # unkeyed: no rngaudit frame
            assert it.__dict__["_rngaudit_keyed"].closed  # ended: published, compared
        if batch is None:
            assert [b["id"] for b in got] == [b["id"] for b in plain]
        else:
            assert _as_lists(got) == _as_lists(plain) == _as_lists(rest)
    rngaudit.wait_for_reports()


def test_an_unreadable_batch_makes_the_epoch_unknown_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    Ranks(monkeypatch, 1)
    with caplog.at_level(logging.WARNING, "rngaudit"):
        loader = rngaudit.sample_key(D.DataLoader(_Stream(8, broken_at=4), batch_size=2), "id")
        plain = list(D.DataLoader(_Stream(8, broken_at=4), batch_size=2))
        with rngaudit.audit(report_dir=tmp_path / "r", mode="raise"):
            epochs = [list(loader), list(loader)]
        assert all(len(e) == len(plain) for e in epochs)
    said = [r for r in caplog.records if "could not be read" in r.getMessage()]
    assert len(said) == 1 and "'id'" in said[0].getMessage()
    rngaudit.wait_for_reports()


class _Checks:
    """Where the guard files a check's findings (the session's report; not under test here)."""

    def __init__(self) -> None:
        self.found: list[Any] = []

    def add_check(self, label: str, found: list[Any], ranks: Any = None) -> None:
        self.found.extend(found)


def test_an_epoch_left_early_is_published_when_the_group_goes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 breaks out of a keyed epoch and never begins another: what it took so far is
    published when the process group goes, compared with rank 1's share (played on the same
    real store), and the overlap among the partial shares raised."""
    from rngaudit.config import Settings
    from rngaudit.epochs import unsharded
    from rngaudit.epochs.order_check import EpochGuard, Watch
    from rngaudit.ranks import data_parallel

    ranks = Ranks(monkeypatch, 2)
    monkeypatch.setattr(data_parallel, "_SEARCHED", [True])  # no data-parallel module to look for
    checks = _Checks()
    guard = EpochGuard()
    guard.watch_all(Watch(Settings("raise", tmp_path, 5.0, False), checks, True))
    try:
        loader = rngaudit.sample_key(D.DataLoader(_Stream(40), batch_size=4), "id")
        for i, _ in enumerate(loader):
            if i == 4:
                break  # 20 ids taken: 0-19
        (current,) = guard.keyed_open
        epoch = current.epoch
        assert not current.closed and not ranks.has(f"{unsharded.PREFIX}/{epoch.key}/0/end/0")
        with ranks.playing(1):  # rank 1 took ids 10-29 of the same loader's epoch 0
            unsharded.start(epoch)
            taken = keyed.Taken()
            taken.add(keyed.read(list(range(10, 30)), lambda b: b))
            summary = dict(taken.summary(), batch_size=4, key_name="'id'", partial=False)
            unsharded.publish(epoch, dict(summary, data_parallel=None))
        with pytest.raises(rngaudit.RNGDivergenceError) as raised:
            guard.settle()
        assert current.closed
        message = str(raised.value)
        assert "10 samples (by key 'id') went to more than one rank" in message
        assert "rank 0 took 20, rank 1 took 20, 30 distinct in all" in message
        assert "Rank(s) 0 left the epoch early" in message
        assert [f.kind for f in checks.found] == ["partition-overlap"]
    finally:
        guard.everything = None
        guard.uninstall()
        guard.exit_patches.undo()


def test_a_persistent_keyed_iterator_is_keyed_again_at_each_epoch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Persistent workers: the same iterator, reset each epoch, is keyed again each epoch (and
    its batches are the ones the unaudited loader returns)."""
    Ranks(monkeypatch, 1)
    data = _Stream(12)
    plain = [_as_lists(list(D.DataLoader(data, batch_size=4))) for _ in range(2)]
    loader = D.DataLoader(data, batch_size=4, num_workers=1, persistent_workers=True)
    rngaudit.sample_key(loader, "id")
    with rngaudit.audit(report_dir=tmp_path / "r", mode="raise", every_epoch=True):
        seen, epochs = [], []
        for _ in range(2):
            it = iter(loader)
            epochs.append(_as_lists(list(it)))
            seen.append(it.__dict__["_rngaudit_keyed"])
    assert epochs == plain
    assert [s.epoch.epoch for s in seen] == [0, 1] and all(s.closed for s in seen)
    rngaudit.wait_for_reports()


def test_a_keyed_iterator_under_another_librarys_wrapper_is_still_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An iterator class whose ``__next__`` another library wrapped over rngaudit's keeps the
    wrapper (no plain subclass): the keyed epoch goes on through rngaudit's own wrapper."""
    import wrapt
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    Ranks(monkeypatch, 1)
    calls: list[int] = []

    def count(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        calls.append(1)
        return wrapped(*args, **kwargs)

    class Counting(D.dataloader._SingleProcessDataLoaderIter):
        pass

    loader = rngaudit.sample_key(D.DataLoader(_Stream(6), batch_size=2), "id")
    with rngaudit.audit(report_dir=tmp_path / "r", mode="raise"):
        Counting.__next__ = wrapt.FunctionWrapper(  # type: ignore[method-assign]
            _BaseDataLoaderIter.__dict__["__next__"], count
        )
        it = Counting(loader)
        assert [b["id"].tolist() for b in it] == [[0, 1], [2, 3], [4, 5]]
        assert calls == [1, 1, 1, 1] and type(it) is Counting  # never bypassed
        current = it.__dict__["_rngaudit_keyed"]
        assert current.closed and current.epoch.epoch == 0
    rngaudit.wait_for_reports()
