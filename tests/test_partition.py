"""The observed partition: root mapping, tapes, overlap, and the rules that read them."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import torch.utils.data as D

from rngaudit.epochs import order_rules, partition
from rngaudit.ranks import overlap


class Wrapper(D.Dataset[int]):
    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int) -> int:
        return int(self.dataset[i])


def _summary(root: int, indices: list[int], maps: list[Any] | None = None) -> dict[str, Any]:
    tape = partition.Tape(maps or [], root)
    for i in range(0, len(indices), 3):
        tape.add(indices[i : i + 3])
    return tape.summary()


def test_indices_map_to_the_root_through_subsets_and_wrappers() -> None:
    root = list(range(10))
    inner: Any = D.Subset(root, [9, 8, 7, 6, 5])  # type: ignore[arg-type]
    outer: Any = Wrapper(D.Subset(inner, [4, 0]))
    mapping = partition.root_mapping(outer)
    assert mapping is not None and mapping[1] == 10
    tape = partition.Tape(mapping[0], mapping[1])
    tape.add([0, 1])
    summary = tape.summary()
    bits = np.unpackbits(np.frombuffer(base64.b64decode(summary["bitmap"]), np.uint8))
    assert sorted(np.flatnonzero(bits[:10]).tolist()) == [5, 9]
    assert partition.holds_split(outer) and not partition.holds_split(root)


def test_unknown_shapes_are_not_observed() -> None:
    class Lazy:
        def __init__(self) -> None:
            self.dataset = list(range(4))
            self.indices = iter([0, 1])

    assert partition.root_mapping(Lazy()) is None
    assert partition.root_mapping(object()) is None  # unsized root
    tape = partition.Tape([], 4)
    tape.add(["a", "b"])  # not indices of this dataset
    assert tape.summary() == {"known": False}
    tape = partition.Tape([], 4)
    tape.add([7])  # outside the root
    assert tape.summary() == {"known": False}


def test_an_abandoned_tape_compares_nothing() -> None:
    tape = partition.Tape([], 4)
    tape.abandon()
    tape.add([1])
    assert tape.closed and tape.summary() == {"known": False}


def test_overlap_counts_shared_and_missing_samples() -> None:
    a, b = _summary(8, [0, 1, 2, 3]), _summary(8, [2, 3, 4, 5])
    seen = overlap.measure({0: a, 1: b})
    assert seen is not None
    assert (seen["shared"], seen["union"], seen["per_rank"]) == (2, 6, {0: 4, 1: 4})
    assert overlap.measure({0: a}) is None
    assert overlap.measure({0: a, 1: {"known": False}}) is None


def test_the_rule_allows_padding_and_sampling_with_replacement() -> None:
    intact = {0: _summary(9, [0, 2, 4, 6, 8]), 1: _summary(9, [1, 3, 5, 7, 0])}  # padding: 0
    assert order_rules.partition_overlap(intact, "L", "chain", 0) is None
    corrupted = {0: _summary(8, [0, 1, 2, 3]), 1: _summary(8, [2, 3, 4, 5])}
    finding = order_rules.partition_overlap(corrupted, "L", "chain", 0)
    assert finding is not None and finding.severity == "error"
    assert "2 of 8 samples went to more than one rank, and 2 of them to none" in finding.message
    replacement = {0: _summary(8, [0, 0, 1, 1, 2]), 1: _summary(8, [1, 2, 2, 3, 3])}
    assert order_rules.partition_overlap(replacement, "L", "chain", 0) is None


def test_dataset_samples_only_for_splits() -> None:
    root = list(range(6))
    split: Any = D.Subset(root, [5, 1])  # type: ignore[arg-type]
    samples = partition.dataset_samples(split)
    assert samples is not None and samples["distinct"] == 2 and samples["root_size"] == 6
    assert partition.dataset_samples(root) is None


def test_index_lists_are_converted_only_for_a_root_small_enough() -> None:
    class Untouchable(list[int]):
        def __iter__(self) -> Any:
            raise AssertionError("converted")

    root = list(range(10))
    split: Any = D.Subset(root, Untouchable([3, 1]))  # type: ignore[arg-type]
    assert partition.holds_split(split)  # read, never converted
    assert partition.root_mapping(split, limit=9) is None  # too big a root: not converted
    assert partition.root_mapping(D.Subset(root, [3, 1]), limit=10) is not None  # type: ignore[arg-type]


def _taken(root: int, indices: list[int], **extra: Any) -> dict[str, Any]:
    return dict(_summary(root, indices), **extra)


def test_the_unsharded_rule_needs_evidence_the_loader_was_meant_to_be_sharded() -> None:
    whole = list(range(8))
    same = {0: _taken(8, whole, training=True), 1: _taken(8, whole, training=True)}
    finding, exact = order_rules.observed_overlap(same, "L", "chain", 0, None, True)
    assert finding is not None and finding.severity == "error" and not exact
    assert "every rank was handed the same 8 samples of 8" in finding.message
    assert "2-fold duplication" in finding.message
    # no data-parallel module (a tensor-parallel group), or an evaluation under no_grad
    assert order_rules.observed_overlap(same, "L", "c", 0, None, False) == (None, False)
    evaluation = {r: dict(s, training=False) for r, s in same.items()}
    assert order_rules.observed_overlap(evaluation, "L", "c", 0, None, True) == (None, False)
    split = {0: _taken(8, [0, 1, 2, 3]), 1: _taken(8, [4, 5, 6, 7])}
    assert order_rules.observed_overlap(split, "L", "c", 0, None, False) == (None, True)
    thin = {0: _taken(80, [0, 1, 2, 3]), 1: _taken(80, [4, 5, 6, 7])}  # disjoint, not a cover
    assert order_rules.observed_overlap(thin, "L", "c", 0, None, False) == (None, False)
    shifted = {0: _taken(8, [0, 1, 2, 3]), 1: _taken(8, [2, 3, 4, 5])}
    finding, _ = order_rules.observed_overlap(shifted, "L", "c", 1, -1, False)
    assert finding is not None and finding.severity == "error"
    assert "An earlier epoch of this loader partitioned the data exactly" in finding.message
    finding, _ = order_rules.observed_overlap(shifted, "L", "c", 1, None, False)
    assert finding is not None and finding.severity == "warning"
    repeats = {0: _taken(8, [0, 0, 1, 1, 2]), 1: _taken(8, [1, 2, 2, 3, 3])}
    assert order_rules.observed_overlap(repeats, "L", "c", 0, -1, True) == (None, False)


def test_root_identity_tells_ranks_own_files_apart() -> None:
    class Shard:
        def __init__(self, path: str, data: Any) -> None:
            self.path, self.data = path, data

        def __len__(self) -> int:
            return len(self.data)

    a = partition.root_identity(Shard("shard-0.npy", np.arange(16)))
    assert a == partition.root_identity(Shard("shard-0.npy", np.arange(16)))
    assert a != partition.root_identity(Shard("shard-1.npy", np.arange(16)))
    assert a != partition.root_identity(Shard("shard-0.npy", np.arange(16, 32)))
    assert partition.root_identity(object()) == partition.root_identity(object())


def test_index_batches_of_every_integer_kind_are_read_and_nothing_else() -> None:
    """Lists, tuples and ranges of ints (numpy and 0-d tensor ints too), bare indices (batching
    off) and 1-d integer arrays and tensors are read; a float, an int outside int64, a bool
    tensor or a generator makes the tape unknown, and a generator is never iterated again."""
    import torch

    batches: list[Any] = [
        [1, 2], [np.int64(3)], (4,), range(5, 7), 7, np.int32(8), torch.tensor([9, 10]),
        np.array([11]), [torch.tensor(12)],
    ]  # fmt: skip
    tape = partition.Tape([], 16)
    tape.take(batches)
    summary = tape.summary()
    assert (summary["known"], summary["taken"], summary["batches"]) == (True, 12, 9)

    pulled: list[int] = []

    def consumed() -> Any:
        pulled.append(1)
        yield 1

    for odd in ([1.5], [2**70], torch.tensor([True]), np.zeros((1, 1), dtype=np.int64)):
        tape = partition.Tape([], 16)
        tape.take([[0], odd])
        assert tape.summary() == {"known": False}, odd
    tape = partition.Tape([], 16)
    tape.add(consumed())
    assert tape.summary() == {"known": False} and not pulled
    tape = partition.Tape([], 16)
    tape.take([[3, -1]])  # a negative index: outside the root (numpy would wrap it)
    assert tape.summary() == {"known": False}


def test_datasets_of_the_ranks_own_are_told_apart_by_their_index_mappings() -> None:
    from rngaudit.epochs import judging

    train = np.arange(0, 40, 2, dtype=np.int64)  # a split of 20 of a 40-sample root

    def published(*maps: Any) -> dict[str, Any]:
        return {"known": True, "root_size": 40, "identity": "Items(40)", "batches": len(maps[0]),
                "levels": partition.levels(list(maps))}  # fmt: skip

    own = {0: published(np.arange(0, 10), train), 1: published(np.arange(10, 19), train)}
    assert overlap.cut_from(own) == 20  # cut from the split they share, not the root
    assert overlap.cut_from({0: published(np.arange(4)), 1: published(np.arange(4, 8))}) == 40
    assert judging.one_loader(own)  # 10 and 9 batches: a split gives some rank one more
    alike = {0: published(np.arange(10), train), 1: published(np.arange(10), train)}
    assert overlap.cut_from(alike) is None  # one dataset, sharded (or a tensor-parallel pair)
    assert overlap.cut_from({0: {"known": True}, 1: published(np.arange(4))}) is None
    unequal = {0: dict(alike[0], levels=[]), 1: dict(alike[1], levels=[], batches=9)}
    assert not judging.one_loader(unequal)  # nothing says it is split: not one loader
