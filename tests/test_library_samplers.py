"""The library samplers known by name: each a real class, and the shuffling ones really shuffle."""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data as D
from torch.utils.data.distributed import DistributedSampler

from rngaudit import library_samplers

SHUFFLING = {k.name for k in library_samplers.TABLE if k.shuffles}
HOMES = ("torch.utils.data", "torchdata.stateful_dataloader.sampler", "accelerate.data_loader")


def test_every_name_is_a_class_of_torch_torchdata_or_accelerate() -> None:
    assert library_samplers.library_names() >= SHUFFLING
    homes = [importlib.import_module(name) for name in HOMES]
    for name in library_samplers.library_names():
        assert any(isinstance(getattr(m, name, None), type) for m in homes), name


def test_every_row_names_a_class_of_its_module_with_its_marked_methods() -> None:
    rows = library_samplers.TABLE
    assert len({(k.module, k.name) for k in rows}) == len(rows)
    for known in rows:
        cls = getattr(importlib.import_module(known.module), known.name, None)
        assert isinstance(cls, type) and library_samplers.loaded(known) is cls, known
        for _, methods in known.marks:
            assert any(m in cls.__dict__ for m in methods), (known.name, methods)
        assert (known.shards is None) == (known.world is None), known


def test_every_public_sampler_of_those_libraries_is_named() -> None:
    for home in HOMES:
        module = importlib.import_module(home)
        shipped = {
            name
            for name, cls in vars(module).items()
            if isinstance(cls, type) and issubclass(cls, D.Sampler) and cls is not D.Sampler
        }
        public = {name for name in shipped if not name.startswith("_")}
        assert public and public <= library_samplers.library_names(), (home, public)


def _passes(sampler: Any) -> tuple[list[Any], list[Any]]:
    return list(sampler), list(sampler)


def test_the_shuffling_samplers_give_a_new_order_each_pass_and_the_others_repeat() -> None:
    from accelerate.data_loader import SeedableRandomSampler

    data = D.TensorDataset(torch.arange(32))
    made = {
        "RandomSampler": D.RandomSampler(data),
        "SeedableRandomSampler": SeedableRandomSampler(data, data_seed=3),
        "SubsetRandomSampler": D.SubsetRandomSampler(range(32)),
        "WeightedRandomSampler": D.WeightedRandomSampler([1.0] * 32, 32),
        "SequentialSampler": D.SequentialSampler(data),
        "BatchSampler": D.BatchSampler(D.SequentialSampler(data), 4, False),
        "DistributedSampler": DistributedSampler(data, num_replicas=2, rank=0, shuffle=True),
    }
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        repeats = {name: a == b for name, (a, b) in ((n, _passes(s)) for n, s in made.items())}
    assert {n for n, same in repeats.items() if not same} == SHUFFLING


def _fake_library() -> Any:
    """A made-up library: a shuffling sampler, an order sharder, a loader, a worker iterator."""
    module = types.ModuleType("rngaudit_test_fake_library")

    class FakeShuffler(D.Sampler[int]):
        def __iter__(self) -> Iterator[int]:
            return iter([1, 0])

    class FakeSharder(D.Sampler[int]):
        def __init__(self, ranks: int) -> None:
            self.ranks = ranks

        def __iter__(self) -> Iterator[int]:
            return iter([0])

    class FakeLoader:
        def __init__(self) -> None:
            self.built = True

    class FakeWorkers:
        def __init__(self) -> None:
            self.started = True

    for cls in (FakeShuffler, FakeSharder, FakeLoader, FakeWorkers):
        setattr(module, cls.__name__, cls)
    return module


def test_a_row_added_to_the_table_is_seen_by_every_consumer(monkeypatch: Any) -> None:
    """Adding a library class is one row: attribution, shuffling, sharding, the chain's
    library end, the loaders registered and the worker iterators patched all read it."""
    from rngaudit.capture import instrument
    from rngaudit.capture.callsite import MARKED_CODES
    from rngaudit.capture.instrument import loaders, samplers
    from rngaudit.capture.patching import PatchSet
    from rngaudit.capture.recorder import ROLE_ITERATION, ROLE_LOADER, ROLE_SAMPLER, Recorder
    from rngaudit.epochs import sharding
    from rngaudit.ranks import rules
    from rngaudit.workers import monitor

    fake = _fake_library()
    name = fake.__name__
    ls = library_samplers
    rows = (
        ls.Known("FakeShuffler", name, ls.SAMPLER, ((ls.BY_SAMPLER, ("__iter__",)),), True),
        ls.Known("FakeSharder", name, ls.SAMPLER, shards=ls.ORDER, world="ranks"),
        ls.Known("FakeLoader", name, ls.LOADER, ((ls.IN_ITERATION, ("__init__",)),)),
        ls.Known("FakeWorkers", name, ls.WORKER_ITERATOR),
    )
    shuffler, sharder = fake.FakeShuffler(), fake.FakeSharder(2)
    chain = ls.chain_name([sharder, shuffler])
    assert chain == "FakeSharder > FakeShuffler" and ls.chain_classes(chain) == [
        "FakeSharder",
        "FakeShuffler",
    ]
    monkeypatch.setitem(sys.modules, name, fake)

    def seen() -> list[bool]:
        ledger = PatchSet()
        rec = Recorder()
        rec.patches = ledger
        try:
            marked = samplers.mark_module(name)
            ledger.mark(marked)
            loaders.install(rec)
            return [
                name in instrument.watched(),
                fake.FakeShuffler.__iter__.__code__ in marked,
                ledger.replaced(fake.FakeLoader, "__init__"),
                (name, "FakeWorkers.__init__") in monitor.targets(),
                sharding.is_shuffling([shuffler]),
                sharding.shard_of([shuffler, sharder]) is sharder,
                rules._known_sampler(chain),
            ]
        finally:
            ledger.undo()

    assert seen() == [False] * 7
    monkeypatch.setattr(ls, "TABLE", (*ls.TABLE, *rows))
    assert seen() == [True] * 7
    assert sharding.shard_of([fake.FakeSharder(1)]) is None  # one rank: not sharded
    roles = {role for k in ls.TABLE for role, _ in k.marks}
    assert roles == {ROLE_SAMPLER, ROLE_LOADER, ROLE_ITERATION}  # the recorder's roles
    assert not any(code in MARKED_CODES for code in (fake.FakeShuffler.__iter__.__code__,))
