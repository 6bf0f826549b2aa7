"""Total reads: hostile attributes, sizes and truth values never raise, never iterate."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch.utils.data as D

from rngaudit import library_samplers, peek
from rngaudit.epochs import sharding


class Hostile:
    """Every read raises something other than AttributeError; iterating it is a test failure."""

    @property
    def sampler(self) -> Any:
        raise RuntimeError("property that raises")

    def __getattr__(self, name: str) -> Any:
        raise ValueError(name)

    def __len__(self) -> int:
        raise TypeError("unsized")

    def __bool__(self) -> bool:
        raise AssertionError("a truth value was taken")

    def __iter__(self) -> Iterator[int]:
        raise AssertionError("iterated")


class Infinite(D.Sampler[int]):
    def __init__(self) -> None:
        pass

    def __iter__(self) -> Iterator[int]:
        raise AssertionError("iterated")


def test_reads_of_a_hostile_object_answer_none() -> None:
    h = Hostile()
    assert peek.attr(h, "sampler") is None
    assert peek.attr(h, "anything") is None
    assert peek.first_attr(h, "batch_sampler", "sampler") is None
    assert peek.size(h) is None
    assert peek.integer(h, 3) == 3
    assert peek.flag(h) is None


def test_sizes_ints_and_flags() -> None:
    assert peek.size([1, 2]) == 2 and peek.size(object()) is None and peek.size(None) is None
    assert peek.integer(None, 1) == 1 and peek.integer(True, 0) == 1 and peek.integer("4", 0) == 4
    assert peek.integer("x", 7) == 7 and peek.integer(np.int64(5), 0) == 5
    assert peek.flag(True) is True and peek.flag(np.bool_(False)) is False and peek.flag(1) is None


def test_the_chain_takes_no_truth_value_of_an_unsized_batch_sampler() -> None:
    batch = D.BatchSampler(Infinite(), 4, drop_last=False)  # bool(batch) would call len()
    loader: D.DataLoader[Any] = D.DataLoader(list(range(8)), batch_sampler=batch)  # type: ignore[arg-type]
    assert [type(n).__name__ for n in library_samplers.loader_chain(loader)] == [
        "BatchSampler",
        "Infinite",
    ]
    assert sharding.shard_of(library_samplers.loader_chain(loader)) is None
    assert not sharding.is_shuffling(library_samplers.loader_chain(loader))


def test_a_hostile_dataset_and_sampler_are_described_not_read() -> None:
    assert library_samplers.chain(Hostile())[0].__class__ is Hostile
    assert sharding.describe_dataset(Hostile()) == "Hostile(len=?)"
    assert sharding.describe_content(Hostile()) == ""
    state = sharding.distributed_sampler_state(Hostile())
    assert state["class"] == "Hostile" and state["seed"] is None and state["dataset_len"] is None


def test_index_objects_it_cannot_read_safely_are_named_never_iterated() -> None:
    class Lazy(D.Dataset[int]):
        def __init__(self) -> None:
            self.dataset = list(range(4))
            self.indices = iter([3, 2, 1])  # an iterator: reading it would consume it

        def __len__(self) -> int:
            return 3

    lazy = Lazy()
    assert "indices=unknown:list_iterator" in sharding.describe_dataset(lazy)
    assert list(lazy.indices) == [3, 2, 1]  # untouched
    subset: Any = D.Subset(list(range(9)), np.arange(3))  # type: ignore[arg-type]
    assert "indices=" in sharding.describe_dataset(subset)
