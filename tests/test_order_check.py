"""Unit tests for rngaudit.epochs.order_check in one process (no process group): the tee, the
epoch record, the loader's one name, the store keys, and the helpers the cross-rank path uses."""

from __future__ import annotations

import gc
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.data as D
from accelerate.data_loader import BatchSamplerShard, IterableDatasetShard
from torch.utils.data import BatchSampler, Sampler

import rngaudit
from rngaudit.capture import naming
from rngaudit.config import Settings
from rngaudit.epochs import judging, partition, sharded_check, sharding, surgery
from rngaudit.epochs.order_check import GUARD, Watch
from rngaudit.errors import RNGAuditWarning, RNGDivergenceError
from rngaudit.findings import EPOCH_ORDER_REPEATED, Finding
from rngaudit.ranks import session

CHAIN = "BatchSamplerShard > BatchSampler > RandomSampler"
ITEMS = 12


@pytest.fixture(autouse=True)
def _guard_released(tmp_path: Path) -> Iterator[None]:
    """Every test leaves nothing watched once its loaders are gone, and the order check
    uninstalled as the last one is collected (also a loader watched every epoch: its finalizer
    runs before the weak mapping forgets it, so only live keys count)."""
    yield
    gc.collect()
    assert len(GUARD.registry.pending) == 0 and len(GUARD.registry.observing) == 0
    assert not GUARD.installed
    assert not GUARD.patches.entries()


def _shard(ds: Any, seed: int) -> tuple[BatchSamplerShard, torch.Generator]:
    """Process 0 of 2's shard of a shuffled order drawn from a generator seeded ``seed``."""
    g = torch.Generator().manual_seed(seed)
    inner = D.BatchSampler(D.RandomSampler(ds, generator=g), 2, drop_last=False)
    return BatchSamplerShard(inner, num_processes=2, process_index=0), g


def _report(report_dir: Path) -> dict[str, Any]:
    rngaudit.wait_for_reports()
    data: dict[str, Any] = json.loads((report_dir / "report.json").read_text())
    return data


def _window_loaders(report: dict[str, Any]) -> list[str]:
    """The loaders' labels, as the windows' records name them."""
    return [entry["loader"] for rank in report["ranks"] for entry in rank.get("loaders", [])]


def _digests(batches: list[list[int]]) -> list[str]:
    tape = sharding.OrderTape()
    for batch in batches:
        tape.add(batch)
    return tape.batches


def _batches(loader: Any) -> list[list[int]]:
    return [b[0].tolist() for b in loader]


# -- one name per loader -------------------------------------------------------------------------


def test_a_report_names_each_loader_one_way(report_dir: Path) -> None:
    """The window's record, the order check's audit label and its finding name the loader
    alike; a loader of a later window is another name (the names outlive the window)."""
    ds = D.TensorDataset(torch.arange(ITEMS))
    with rngaudit.audit(report_dir=report_dir, mode="report", every_epoch=True):
        shard, g = _shard(ds, 3)
        loader = D.DataLoader(ds, batch_sampler=shard)
    epochs = []
    for _ in range(2):
        g.manual_seed(3)  # the same order again: a repeated-order warning names the loader
        epochs.append(_batches(loader))
    assert epochs[0] == epochs[1]  # measured: the order repeats
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        later = D.DataLoader(ds, batch_sampler=_shard(ds, 4)[0])
    _batches(later)
    report = _report(report_dir)
    first, second = naming.LOADERS.name(loader), naming.LOADERS.name(later)
    assert first != second and first.startswith("DataLoader#")
    labels = [a["label"] for a in report["audits"]]
    assert labels[1:3] == [f"epoch 0 of {first} ({CHAIN})", f"epoch 1 of {first} ({CHAIN})"]
    assert labels[4] == f"epoch 0 of {second} ({CHAIN})"
    assert _window_loaders(report) == [first, second]
    [repeat] = report["findings"]
    assert repeat["kind"] == EPOCH_ORDER_REPEATED and repeat["details"]["loader"] == first
    assert f"Epoch 1 of {first} ({CHAIN})" in repeat["message"]
    assert GUARD.registry.loaders[shard].label == first
    del loader, later, shard


def test_store_keys_count_loaders_in_the_order_checked_not_named(report_dir: Path) -> None:
    """The key number is the order this rank first checks a loader (every rank agrees); the
    label is the loader's name, given in the order the loaders were seen built."""
    ds = D.TensorDataset(torch.arange(ITEMS))
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        shard_a, _ = _shard(ds, 1)
        a = D.DataLoader(ds, batch_sampler=shard_a)
        shard_b, _ = _shard(ds, 2)
        b = D.DataLoader(ds, batch_sampler=shard_b)
    _batches(b)
    _batches(a)
    state_a, state_b = GUARD.registry.loaders[shard_a], GUARD.registry.loaders[shard_b]
    assert state_a.index == state_b.index + 1  # b checked first
    number = [int(s.label.split("#")[1]) for s in (state_a, state_b)]
    assert number[0] + 1 == number[1]  # a seen built first
    assert _window_loaders(_report(report_dir)) == [state_a.label, state_b.label]
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        c = D.DataLoader(ds, batch_sampler=_shard(ds, 1)[0])
        shard_d, _ = _shard(ds, 2)
        d = D.DataLoader(ds, batch_sampler=shard_d)
        _batches(d)  # checked inside the window, before c was named
    number_c, number_d = (int(naming.LOADERS.name(x).split("#")[1]) for x in (c, d))
    assert number_c + 1 == number_d  # still numbered in the order built
    assert GUARD.registry.loaders[shard_d].label == naming.LOADERS.name(d)
    del a, b, c, d, shard_a, shard_b, shard_d


def test_a_loader_never_seen_built_is_named_by_its_shard(report_dir: Path) -> None:
    ds = D.TensorDataset(torch.arange(ITEMS))
    sampler: D.DistributedSampler[Any] = D.DistributedSampler(ds, num_replicas=2, rank=0, seed=5)
    loader = D.DataLoader(ds, batch_size=2, sampler=sampler)  # built before the block
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        _batches(loader)
    label = GUARD.registry.loaders[sampler].label
    assert label == naming.LOADERS.name(sampler) and label.startswith("DistributedSampler#")
    assert f"epoch 0 of {label} (BatchSampler > DistributedSampler)" in [
        a["label"] for a in _report(report_dir)["audits"]
    ]
    del loader, sampler


# -- what the epoch record holds ------------------------------------------------------------------


def test_the_tee_digests_the_order_before_sharding_and_changes_no_batch(report_dir: Path) -> None:
    ds = D.TensorDataset(torch.arange(ITEMS))
    plain_shard, _ = _shard(ds, 7)
    plain = _batches(D.DataLoader(ds, batch_sampler=plain_shard))  # unaudited
    whole = list(_shard(ds, 7)[0].batch_sampler)  # the order before sharding, unaudited
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        shard, _ = _shard(ds, 7)
        loader = D.DataLoader(ds, batch_sampler=shard)
    assert _batches(loader) == plain == whole[::2]  # process 0 of 2: every other batch
    record = GUARD.registry.loaders[shard].previous
    assert record is not None and record["epoch"] == 0 and record["chain"] == CHAIN
    pulled = len(record["order"])
    assert 2 <= pulled <= sharding.PREFIX_BATCHES  # the batches pulled for the first one
    assert record["order"] == _digests(whole[:pulled])
    assert shard.batch_sampler is not None and type(shard.batch_sampler) is D.BatchSampler
    [draw] = record["draws"]  # the permutation, named with its generator and lines
    assert draw["op"] == "aten.randperm" and draw["sampler"] == CHAIN
    assert draw["generator"] is not None and "RandomSampler.generator" in draw["generator"]
    assert draw["call_site"] is not None and draw["call_site"]["file"].endswith("sampler.py")
    assert draw["user_call_site"] is not None
    assert draw["user_call_site"]["file"] == __file__
    del loader, shard


def test_a_distributed_sampler_record_carries_its_seed_epoch_and_draw(report_dir: Path) -> None:
    ds = D.TensorDataset(torch.arange(ITEMS))
    plain_sampler: D.DistributedSampler[Any] = D.DistributedSampler(
        ds, num_replicas=2, rank=0, seed=5
    )
    plain_sampler.set_epoch(3)
    plain = _batches(D.DataLoader(ds, batch_size=2, sampler=plain_sampler))
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        sampler: D.DistributedSampler[Any] = D.DistributedSampler(
            ds, num_replicas=2, rank=0, seed=5
        )
        loader = D.DataLoader(ds, batch_size=2, sampler=sampler)
    sampler.set_epoch(3)
    assert _batches(loader) == plain
    record = GUARD.registry.loaders[sampler].previous
    assert record is not None and record["order"] == []  # its state says the order
    state = record["sampler_state"]
    assert state is not None
    assert (state["seed"], state["epoch"], state["num_replicas"]) == (5, 3, 2)
    assert (state["shuffle"], state["dataset_len"]) == (True, ITEMS)
    [draw] = record["draws"]  # its __iter__'s permutation, from its own generator
    assert draw["op"] == "aten.randperm"
    assert draw["sampler"] == "BatchSampler > DistributedSampler"
    assert record["loader"] == naming.LOADERS.name(loader)
    del loader, sampler


class _Stream(D.IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        return iter(range(100, 140))


def test_a_split_stream_is_digested_before_it_is_split(report_dir: Path) -> None:
    plain = [int(x) for x in IterableDatasetShard(_Stream(), 2, num_processes=2)]
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        stream = IterableDatasetShard(_Stream(), 2, num_processes=2, process_index=0)
        loader = D.DataLoader(stream, batch_size=None)
    assert [int(x) for x in loader] == plain  # nothing changed
    record = GUARD.registry.loaders[stream].previous
    assert record is not None and record["chain"] == "IterableDatasetShard"
    pulled = len(record["order"])
    assert pulled >= 2  # the elements of both processes' first batch, before the split
    truth = [[sharding.digest_element(x)] for x in range(100, 100 + pulled)]
    assert record["order"] == _digests(truth)
    assert record["loader"] == naming.LOADERS.name(loader)
    del loader, stream


def test_draws_that_built_a_split_are_named_in_the_record(report_dir: Path) -> None:
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        D.random_split(D.TensorDataset(torch.arange(ITEMS)), [6, 6])
    rngaudit.wait_for_reports()
    [draw] = sharded_check.split_draws(session.for_dir(report_dir, "report"))
    assert draw["op"] == "aten.randperm"
    assert draw["user_call_site"] is not None
    assert draw["user_call_site"]["file"] == __file__
    assert sharded_check.split_draws(object()) == []  # no records: none, never a raise


# -- the helpers of the cross-rank path -----------------------------------------------------------


def test_groups_are_expanded_to_every_rank() -> None:
    exchanged = [
        {"rank": 0, "signature": "a", "order": ["x"]},
        {"rank": 1, "signature": "a", "same_as": 0},
        {"rank": 2, "signature": "b", "order": ["y"]},
        {"rank": 3, "signature": "c", "same_as": 5},  # its group's record was not read
    ]
    out = sharded_check.expand_groups(exchanged)
    assert [(r["rank"], r.get("order")) for r in out] == [(0, ["x"]), (1, ["x"]), (2, ["y"])]
    assert "same_as" not in out[1]


def _summary(**over: Any) -> dict[str, Any]:
    return {"known": True, "identity": "Items:abc", "root_size": 8, "batches": 4, **over}


def test_published_epochs_are_one_loader_only_when_alike() -> None:
    assert judging.one_loader({0: _summary(), 1: _summary()})
    assert not judging.one_loader({0: _summary()})  # one rank: nothing to compare
    assert not judging.one_loader({0: _summary(), 1: _summary(batches=5)})
    assert not judging.one_loader({0: _summary(), 1: _summary(identity="Other:1")})
    assert not judging.one_loader({0: _summary(), 1: {"known": False}})


def test_the_prefix_tee_digests_a_prefix_and_passes_everything() -> None:
    tape = sharding.OrderTape()
    items = list(range(sharding.PREFIX_BATCHES + 10))
    assert list(surgery.tee_prefix(items, tape, lambda x: x * 2)) == items
    assert tape.batches == _digests([[x * 2] for x in items[: sharding.PREFIX_BATCHES]])


def test_the_planned_epoch_is_read_from_a_list_without_a_draw() -> None:
    tape = partition.Tape([], 8)
    planned = sharded_check.planned(iter([3, 1, 3]), tape)
    summary = sharded_check.planned_summary(planned)
    assert summary is not None and (summary["taken"], summary["distinct"]) == (3, 2)

    def lazy() -> Iterator[int]:
        yield from (0, 1)

    assert sharded_check.planned(lazy(), tape) is None  # not begun: nothing delegated to yet
    begun = iter([3, 1, 3])
    next(begun)
    assert sharded_check.planned_summary(sharded_check.planned(begun, tape)) == summary  # whole
    assert sharded_check.planned_summary(sharded_check.planned(iter(begun), tape)) == summary
    assert sharded_check.planned(iter([1]), None) is None


class _Sized:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


class _Yielding(Sampler[int]):
    """A sampler whose ``__iter__`` is a generator yielding from its share."""

    def __init__(self, share: list[int]) -> None:
        self.share = share

    def __len__(self) -> int:
        return len(self.share)

    def __iter__(self) -> Iterator[int]:
        yield from self.share


def test_a_generator_that_yields_from_its_epoch_is_read_whole_without_a_draw() -> None:
    """``yield from share`` holds the whole share in the list iterator it delegates to: read
    (the generator not advanced) when its length is the sampler's, directly or as a
    BatchSampler's ``sampler_iter``; item-by-item loops and one of several segments are not."""
    tape = partition.Tape([], 8)

    def shares(share: list[int]) -> Iterator[int]:
        yield from share

    gen = shares([3, 1, 3])
    assert next(gen) == 3
    summary = sharded_check.planned_summary(sharded_check.planned(gen, tape, _Sized(3)))
    assert summary is not None and (summary["taken"], summary["distinct"]) == (3, 2)
    assert next(gen) == 1  # not advanced by the read
    fresh = shares([3, 1, 3])
    next(fresh)
    assert sharded_check.planned(fresh, tape, _Sized(4)) is None  # another length: a segment

    def segments() -> Iterator[int]:
        yield from [0, 1]
        yield from [2, 3]

    seg = segments()
    next(seg)
    assert sharded_check.planned(seg, tape, _Sized(4)) is None

    def item_by_item(share: list[int]) -> Iterator[int]:
        for i in share:
            yield i + 1  # what a loop body hands out is its own

    loop = item_by_item([0, 1, 2])
    next(loop)
    assert sharded_check.planned(loop, tape, _Sized(3)) is None

    batch_sampler = BatchSampler(_Yielding([2, 0, 2]), batch_size=2, drop_last=False)
    outer = iter(batch_sampler)
    assert next(outer) == [2, 0]
    planned = sharded_check.planned(outer, tape, batch_sampler)
    assert planned is not None and list(planned[0]) == [2, 0, 2]
    assert next(outer) == [2]  # not advanced


def _watch(tmp_path: Path, mode: str) -> Watch:
    settings = Settings(mode=mode, report_dir=tmp_path, timeout=5.0, strict=False)
    return Watch(settings, session.Session(tmp_path, mode), every_epoch=False)


def test_findings_are_raised_or_warned_as_the_mode_says(tmp_path: Path) -> None:
    error = Finding("sampler-draw-divergence", "error", "the ranks differ", [0, 1])
    warning = Finding(EPOCH_ORDER_REPEATED, "warning", "the order repeats", [0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _watch(tmp_path, "raise").act([], "epoch 0 of L")  # nothing found
    with pytest.raises(RNGDivergenceError, match="the ranks differ") as raised:
        _watch(tmp_path, "raise").act([error], "epoch 0 of L")
    assert raised.value.report is not None
    assert raised.value.report.audits == [{"index": 0, "label": "epoch 0 of L"}]
    with pytest.warns(RNGAuditWarning, match="the ranks differ"):
        _watch(tmp_path, "warn").act([error], "epoch 0 of L")
    with pytest.warns(RNGAuditWarning, match="the order repeats"):
        _watch(tmp_path, "raise").act([warning], "epoch 1 of L")


def test_every_ready_epoch_is_judged_before_the_first_error_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Epochs compared together (at a later epoch's first batch, or when the group goes): an
    error in the first never leaves the others unjudged (their findings unfiled); the first
    error is the one raised."""
    judged: list[str] = []

    def judge(epoch: Any, got: Any) -> None:
        judged.append(epoch)
        if epoch in ("e0", "e2"):
            raise RNGDivergenceError(f"corrupted {epoch}")

    monkeypatch.setattr(GUARD.judge, "judge", judge)
    with pytest.raises(RNGDivergenceError, match="corrupted e0"):
        GUARD.judge.judge_all([("e0", []), ("e1", []), ("e2", []), ("e3", [])])  # type: ignore[list-item]
    assert judged == ["e0", "e1", "e2", "e3"]
    GUARD.judge.judge_all([("e1", [])])  # type: ignore[list-item]  # nothing raised: none
