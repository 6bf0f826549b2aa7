"""Unit tests for rngaudit.epochs.sharding on real torch samplers and datasets: what a loader
shards, and the digests that say whether two ranks hold the same order and mapping."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)

from rngaudit import library_samplers
from rngaudit.epochs import sharding

DATA = TensorDataset(torch.arange(12))


def _distributed(rank: int = 0, shuffle: bool = True, seed: int = 0) -> DistributedSampler[Any]:
    return DistributedSampler(DATA, num_replicas=2, rank=rank, shuffle=shuffle, seed=seed)


def test_the_chain_of_a_loader_is_its_samplers_outermost_first() -> None:
    loader = DataLoader(DATA, sampler=_distributed(), batch_size=3)
    nodes = library_samplers.loader_chain(loader)
    assert library_samplers.chain_name(nodes) == "BatchSampler > DistributedSampler"
    assert sharding.shard_of(nodes) is nodes[1]
    assert sharding.loader_is_sharded(loader)


def test_a_single_replica_or_a_plain_sampler_shards_nothing() -> None:
    one: DistributedSampler[Any] = DistributedSampler(DATA, num_replicas=1, rank=0)
    assert sharding.shard_of(library_samplers.chain(BatchSampler(one, 3, False))) is None
    plain = DataLoader(DATA, batch_size=3, shuffle=True)
    assert sharding.shard_of(library_samplers.loader_chain(plain)) is None
    assert not sharding.loader_is_sharded(plain)


def test_the_chain_stops_at_a_cycle_and_never_takes_a_truth_value() -> None:
    class Unsized:
        def __len__(self) -> int:
            raise TypeError("unsized")

    node: Any = Unsized()
    node.sampler = node  # a sampler holding itself
    assert library_samplers.chain(node) == [node]


def test_shuffling_is_read_from_the_sampler_classes_and_the_shuffle_flag() -> None:
    assert sharding.is_shuffling([BatchSampler(RandomSampler(DATA), 3, False), RandomSampler(DATA)])
    assert not sharding.is_shuffling([SequentialSampler(DATA)])
    assert sharding.is_shuffling([_distributed(shuffle=True)])
    assert not sharding.is_shuffling([_distributed(shuffle=False), RandomSampler(DATA)])


def test_a_distributed_samplers_state_is_the_same_on_every_rank() -> None:
    state = sharding.distributed_sampler_state(_distributed(rank=0, seed=7))
    assert state == sharding.distributed_sampler_state(_distributed(rank=1, seed=7))
    assert state["seed"] == 7 and state["num_replicas"] == 2 and state["dataset_len"] == 12
    assert state != sharding.distributed_sampler_state(_distributed(rank=0, seed=8))


def test_describe_dataset_names_the_index_mapping() -> None:
    a, b = Subset(DATA, [0, 1, 2]), Subset(DATA, [0, 1, 3])
    assert sharding.describe_dataset(a) != sharding.describe_dataset(b)
    assert sharding.describe_dataset(a) == sharding.describe_dataset(Subset(DATA, [0, 1, 2]))
    digest = f"{zlib.crc32(np.array([0, 1, 2], dtype=np.int64).tobytes()):08x}"
    assert (
        sharding.describe_dataset(a) == f"Subset(len=3, indices={digest}, of=TensorDataset(len=12))"
    )
    both = sharding.describe_dataset(ConcatDataset([a, b]))
    assert both.startswith("ConcatDataset(len=6, [Subset(len=3")


def test_indices_digest_the_same_whatever_holds_them() -> None:
    as_list = sharding.describe_dataset(Subset(DATA, [3, 1, 2]))
    assert as_list == sharding.describe_dataset(Subset(DATA, torch.tensor([3, 1, 2])))  # type: ignore[arg-type]
    assert as_list == sharding.describe_dataset(Subset(DATA, np.array([3, 1, 2])))  # type: ignore[arg-type]
    ranged = sharding.describe_dataset(Subset(DATA, range(0, 6, 2)))
    assert "indices=range(0,6,2)" in ranged
    odd = sharding.describe_dataset(Subset(DATA, iter([1, 2])))  # type: ignore[arg-type]
    assert "indices=unknown:list_iterator" in odd  # named, never iterated


def test_the_order_tape_digests_the_first_batches_only() -> None:
    tape = sharding.OrderTape()
    for batch in [[0, 1], [2, 3], ["x"]] + [[4, 5]] * (sharding.PREFIX_BATCHES + 5):
        tape.add(batch)
    assert len(tape.batches) == sharding.PREFIX_BATCHES
    assert tape.batches[0] == f"{zlib.crc32(repr([0, 1]).encode()):08x}"
    assert tape.batches[2] == f"{zlib.crc32(repr(['x']).encode()):08x}"  # not ints: its repr


def test_digest_element_reads_tensors_by_their_bytes() -> None:
    assert sharding.digest_element(torch.tensor([1, 2])) == sharding.digest_element(
        torch.tensor([1, 2]).clone()
    )
    assert sharding.digest_element(torch.tensor([1, 2])) != sharding.digest_element(
        torch.tensor([2, 1])
    )
    assert sharding.digest_element({"x": [1, 2]}) == sharding.digest_element({"x": [1, 2]})


def test_a_subclass_with_its_own_iter_is_told_from_the_class_never_the_instance() -> None:
    from torch.utils.data import DistributedSampler

    class Own(DistributedSampler[int]):
        def __iter__(self) -> Iterator[int]:
            yield from range(self.rank, len(self.dataset), self.num_replicas)  # type: ignore[arg-type]

    class Plain(DistributedSampler[int]):
        pass

    data = TensorDataset(torch.arange(8))
    assert sharding.has_own_iter(Own(data, num_replicas=2, rank=0))
    assert not sharding.has_own_iter(Plain(data, num_replicas=2, rank=0))
    assert not sharding.has_own_iter(DistributedSampler(data, num_replicas=2, rank=0))

    class Hostile:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            raise AssertionError("read its __class__")

    assert not sharding.has_own_iter(Hostile())


def test_a_sampler_holding_this_rank_and_the_world_shards_itself() -> None:
    class Own:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    assert sharding.shards_itself([Own(rank=1, world=2)], 1, 2)
    assert sharding.shards_itself([object(), Own(rank=0, num_replicas=3)], 0, 3)
    assert not sharding.shards_itself([Own(rank=1, world=4)], 1, 2)  # a mesh's dp group
    assert not sharding.shards_itself([Own(rank=True, world=2)], 1, 2)  # no int: unread
    assert not sharding.shards_itself([Own(rank=1)], 1, 2)


def test_a_distributed_samplers_padding_is_its_total_size_beyond_its_data() -> None:
    from torch.utils.data.distributed import DistributedSampler

    def ds(n: int, drop_last: bool = False) -> Any:
        data: Any = list(range(n))
        return DistributedSampler(data, num_replicas=2, rank=0, drop_last=drop_last)

    assert sharding.allowance(ds(9)).pads == 1
    assert sharding.allowance(ds(8)).pads == 0
    assert sharding.allowance(ds(9, drop_last=True)).pads == 0
