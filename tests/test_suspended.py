"""Reading an epoch ahead: what the index iterator holds is what it then hands out, unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, Sampler, SequentialSampler

from rngaudit.epochs import suspended


class TensorShard(Sampler[int]):
    """``yield from`` a tensor: a tuple iterator over 0-d tensors."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return len(range(0, self.n, 2))

    def __iter__(self) -> Iterator[int]:
        yield from torch.randperm(self.n)[::2]


class Lazy(Sampler[int]):
    """Draws each index as it is asked for: nothing to read ahead."""

    def __len__(self) -> int:
        return 10

    def __iter__(self) -> Iterator[int]:
        for _ in range(10):
            yield int(torch.randint(10, ()))


def _read(index_sampler: Any, seed: int) -> tuple[Any, list[int]]:
    """The epoch read after its first index batch, and every index then handed out."""
    torch.manual_seed(seed)
    it = iter(index_sampler)
    first = next(it)
    got = suspended.epoch_indices(it, first, index_sampler)
    rest = list(it)
    handed = [*first, *(i for b in rest for i in b)] if isinstance(first, list) else [first, *rest]
    return got, [int(i) for i in handed]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda: BatchSampler(RandomSampler(range(10)), 3, drop_last=False), 10),
        (lambda: BatchSampler(RandomSampler(range(10)), 3, drop_last=True), 9),
        (lambda: BatchSampler(SequentialSampler(range(7)), 2, drop_last=False), 7),
        (lambda: BatchSampler(TensorShard(12), 2, drop_last=False), 6),
        (lambda: RandomSampler(range(8)), 8),  # batching off: one index at a time
    ],
)
def test_the_epoch_read_ahead_is_what_is_handed_out(make: Any, expected: int) -> None:
    got, handed = _read(make(), 3)
    assert got is not None and got.tolist() == handed and len(handed) == expected
    _, unread = _read(make(), 3)
    assert unread == handed  # reading ahead changed nothing


@pytest.mark.parametrize(
    "make",
    [
        lambda: BatchSampler(Lazy(), 2, drop_last=False),  # yields lazily
        lambda: BatchSampler(RandomSampler(range(4), num_samples=10), 2, drop_last=False),
        lambda: BatchSampler(RandomSampler(range(10), replacement=True, num_samples=40), 4, False),
    ],
)
def test_an_epoch_that_is_not_held_whole_is_unknown(make: Any) -> None:
    got, _ = _read(make(), 3)
    assert got is None


def test_an_exhausted_or_foreign_iterator_is_unknown() -> None:
    it = iter([1, 2])
    list(it)
    assert suspended.epoch_indices(it, 1, [1, 2]) is None
    assert suspended.epoch_indices(object(), [0], None) is None
    assert suspended.epoch_indices(iter(["a", "b"]), "a", ["a", "b"]) is None  # not indices


class Probed:
    """A user's object a sampler may yield: numpy's conversion would call these."""

    calls = 0

    def __len__(self) -> int:
        Probed.calls += 1
        raise RuntimeError("len() of a user's object")

    def __getitem__(self, i: int) -> int:
        Probed.calls += 1
        raise RuntimeError("indexing a user's object")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        Probed.calls += 1
        raise RuntimeError("__array__ of a user's object")


@pytest.mark.parametrize("first", [0, "key"])
def test_an_epoch_list_of_user_objects_is_unknown_and_never_touched(first: Any) -> None:
    Probed.calls = 0
    epoch = [first, *(Probed() for _ in range(200))]
    it = iter(epoch)
    assert suspended.epoch_indices(it, next(it), epoch) is None
    assert Probed.calls == 0
