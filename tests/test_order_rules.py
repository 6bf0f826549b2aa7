"""Unit tests for rngaudit.epochs.order_rules: epoch records built from real torch samplers
and datasets (the truth: the orders the samplers really produce), judged by the rules."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from event_factory import epoch_record
from torch.utils.data import DistributedSampler, RandomSampler, Subset, TensorDataset

from rngaudit import verdict as harm
from rngaudit.epochs import order_rules, sharding
from rngaudit.findings import (
    DATASET_DIVERGENCE,
    EPOCH_ORDER_REPEATED,
    RANK_MISSING,
    SAMPLER_DRAW_DIVERGENCE,
)
from rngaudit.ranks import overlap
from rngaudit.schema import EpochRecord, SamplerDraw

DATA = TensorDataset(torch.arange(40))


def _orders_equal(a: EpochRecord, b: EpochRecord) -> bool:
    return a["order"] == b["order"]


def test_ranks_drawing_one_order_of_one_dataset_agree() -> None:
    records = [epoch_record(0, 5, DATA), epoch_record(1, 5, DATA)]
    assert _orders_equal(*records)  # the truth, measured: one order
    assert order_rules.compare(records, missing=[]) == []


def test_ranks_drawing_different_orders_are_an_error_naming_both() -> None:
    records = [epoch_record(0, 5, DATA), epoch_record(1, 6, DATA)]
    assert not _orders_equal(*records)  # the truth: the ranks shard two different orders
    (finding,) = order_rules.compare(records, missing=[])
    assert (finding.kind, finding.severity, finding.ranks) == (
        SAMPLER_DRAW_DIVERGENCE,
        "error",
        [0, 1],
    )


def test_ranks_holding_different_splits_are_a_dataset_divergence() -> None:
    records = [
        epoch_record(0, 5, Subset(DATA, range(0, 20))),
        epoch_record(1, 5, Subset(DATA, range(20, 40))),
    ]
    kinds = [f.kind for f in order_rules.compare(records, missing=[])]
    assert kinds[0] == DATASET_DIVERGENCE


def test_a_missing_rank_is_a_warning_naming_who_arrived() -> None:
    (finding,) = order_rules.compare([epoch_record(0, 5, DATA)], missing=[1], timeout=2.0)
    assert (finding.kind, finding.severity, finding.ranks) == (RANK_MISSING, "warning", [1])
    assert "within 2 s (arrived: 0)" in finding.message
    assert order_rules.compare([], missing=[1]) == []


def test_an_epoch_repeating_the_last_order_is_named() -> None:
    first, again = epoch_record(0, 5, DATA, epoch=0), epoch_record(0, 5, DATA, epoch=1)
    repeated = order_rules.repeated(again, first)
    assert repeated is not None and repeated.kind == EPOCH_ORDER_REPEATED
    assert (
        order_rules.repeated(epoch_record(0, 6, DATA, epoch=1), first) is None
    )  # advanced: a new order
    assert order_rules.repeated(first, None) is None
    unshuffled = {**again, "shuffling": False}
    assert order_rules.repeated(unshuffled, first) is None  # type: ignore[arg-type]


def test_a_distributed_sampler_state_difference_is_named_without_any_order() -> None:
    def with_state(rank: int, seed: int) -> EpochRecord:
        sampler: DistributedSampler[Any] = DistributedSampler(DATA, 2, rank, seed=seed)
        return {
            **epoch_record(rank, 5, DATA),
            "order": [],
            "sampler_state": sharding.distributed_sampler_state(sampler),
        }

    (finding,) = order_rules.compare([with_state(0, 1), with_state(1, 2)], missing=[])
    assert finding.kind == SAMPLER_DRAW_DIVERGENCE and "seed" in finding.message


def _share(
    rank: int, seed: int, n: int = 32, world: int = 2, k: int = 8, replacement: bool = False
) -> dict[str, Any]:
    """A rank's first ``k`` samples of its share (``perm[rank::world]``) of a seeded
    permutation, or (``replacement``) of its own draws with replacement, as one batch."""
    from rngaudit.epochs import partition

    generator = torch.Generator().manual_seed(seed)
    if replacement:
        taken = torch.randint(n, (k,), generator=generator).tolist()
    else:
        taken = list(RandomSampler(range(n), generator=generator))[rank::world][:k]
    tape = partition.Tape([], n)
    tape.take([taken])
    return tape.summary()


def test_first_batches_of_one_permutation_never_overlap() -> None:
    same = {r: _share(r, 5) for r in range(2)}
    assert order_rules.first_batches_overlap(same, "L", "C", 1) is None


def test_first_batches_of_different_permutations_overlapping_are_an_error() -> None:

    summaries = {0: _share(0, 5), 1: _share(1, 6)}
    seen = overlap.measure(summaries)
    assert seen is not None and seen["shared"] > 1  # the claim, measured
    finding = order_rules.first_batches_overlap(summaries, "L", "C", 1)
    assert finding is not None and finding.severity == "error"
    assert f"share {seen['shared']} samples" in finding.message
    assert "sharded by no DistributedSampler" in finding.message
    assert "An earlier epoch of this loader partitioned" in finding.message


def test_a_subclass_prefix_is_an_error_only_once_sampling_with_replacement_is_ruled_out() -> None:
    """Epoch 0 of a DistributedSampler subclass yielding lazily from per-rank draws: no earlier
    partition, so the overlap must be more than ranks sampling independently with replacement
    would show before any repeats of their own (34 shared at world 2)."""

    mine = "Mine (a DistributedSampler subclass)"
    few = {0: _share(0, 5), 1: _share(1, 6)}  # 8 samples each of 32: a few shared
    seen = overlap.measure(few)
    assert seen is not None and 1 < seen["shared"] < 34  # the claim, measured
    assert order_rules.first_batches_overlap(few, "L", "C", 0, drawn=4, sharded_by=mine) is None
    many = {r: _share(r, 5 + r, n=1024, k=256) for r in range(2)}
    seen = overlap.measure(many)
    assert seen is not None and seen["shared"] >= 34 and max(seen["repeats"].values()) == 0
    finding = order_rules.first_batches_overlap(many, "L", "C", 0, drawn=64, sharded_by=mine)
    assert finding is not None and finding.severity == "error"
    assert f"Its {mine} is there to partition" in finding.message
    assert "no DistributedSampler" not in finding.message
    assert "earlier epoch" not in finding.message
    assert "Found before training step 65 of the epoch" in finding.message
    # with replacement, as many shared come with repeats of their own: never an error
    drawn = {r: _share(r, 5 + r, n=1024, k=256, replacement=True) for r in range(2)}
    seen = overlap.measure(drawn)
    assert seen is not None and seen["shared"] > 1 and max(seen["repeats"].values()) > 1
    assert order_rules.first_batches_overlap(drawn, "L", "C", 0, drawn=64, sharded_by=mine) is None


def test_the_with_replacement_threshold_is_the_stated_poisson_bound() -> None:
    # at world 2: the least s with P(Poisson(s / 2) <= 1) ** 2 < 1e-12
    least = next(s for s in range(2, 100) if (math.exp(-s / 2) * (1 + s / 2)) ** 2 < 1e-12)
    assert harm.replacement_ruled_out({"shared": least}, 2)
    assert not harm.replacement_ruled_out({"shared": least - 1}, 2)
    assert not harm.replacement_ruled_out({"shared": 0}, 3)
    assert harm.replacement_ruled_out({"shared": 100, "shared_proven": 20}, 2) is False


def test_the_same_indices_with_different_content_are_no_evidence() -> None:
    row = {"first": [3, 1, 2], "content": "a"}
    assert order_rules.unlike_content({0: row, 1: dict(row, content="b")})
    assert not order_rules.unlike_content({0: row, 1: dict(row)})  # the same content
    assert not order_rules.unlike_content({0: row, 1: dict(row, content=None)})  # unknown
    assert not order_rules.unlike_content({0: row, 1: {"first": [4], "content": "b"}})


def _hf_stream_records(
    seeds: list[int], shards: int = 6
) -> tuple[list[EpochRecord], list[set[int]]]:
    """Per rank of ``len(seeds)``: the record of a Hugging Face stream shuffled with the rank's
    seed and split by ``split_dataset_by_node``, and the items that rank really reads."""
    datasets = pytest.importorskip("datasets")
    from datasets.distributed import split_dataset_by_node

    world = len(seeds)
    rows = datasets.Dataset.from_dict({"i": list(range(6 * shards))})
    records, items = [], []
    for rank, seed in enumerate(seeds):
        stream = rows.to_iterable_dataset(num_shards=shards).shuffle(seed=seed, buffer_size=4)
        part = split_dataset_by_node(stream, rank=rank, world_size=world)
        record = epoch_record(rank, 5, DATA)
        record["dataset"] = sharding.describe_stream(part)
        shares = sharding.stream_shares(part)
        if shares is not None:
            record["shares"] = shares
        records.append(record)
        items.append({int(row["i"]) for row in part})
    return records, items


def test_a_stream_split_by_shards_is_judged_by_the_shards_each_rank_reads() -> None:
    """Split by shards, the shuffle seed orders the shard list before each rank takes its own:
    seeds that differ may or may not leave the ranks disjoint shards; the verdict follows the
    items the ranks really read, and names the ranks that read the same shards."""
    for seeds, clash in (([100, 100, 101], (0, 2)), ([100, 100, 102], None), ([7] * 3, None)):
        records, items = _hf_stream_records(seeds)
        assert all("shares" in r for r in records)
        pairs = [(a, b) for a in range(3) for b in range(a + 1, 3) if items[a] & items[b]]
        assert pairs == ([clash] if clash else [])  # the truth, measured
        found = order_rules.compare(records, missing=[])
        if clash is None:
            assert found == [], seeds
            continue
        (finding,) = found
        assert (finding.kind, finding.severity) == (DATASET_DIVERGENCE, "error")
        shared = len(items[clash[0]] & items[clash[1]]) // 6
        never = (36 - len(set().union(*items))) // 6
        assert (
            f"{shared} of its 6 shards go to more than one rank (ranks {clash[0]}, {clash[1]} "
            f"read the same shards) and {never} to none"
        ) in finding.message


def test_a_stream_split_by_examples_or_past_its_first_epoch_has_no_shares() -> None:
    records, _ = _hf_stream_records([1, 2, 3], shards=4)  # 4 shards over 3: by examples
    assert not any("shares" in r for r in records)
    datasets = pytest.importorskip("datasets")
    from datasets.distributed import split_dataset_by_node

    stream = datasets.Dataset.from_dict({"i": list(range(12))}).to_iterable_dataset(num_shards=4)
    part = split_dataset_by_node(stream, rank=0, world_size=2)
    assert sharding.stream_shares(part) is not None
    part.set_epoch(1)  # reshuffled as it is iterated: not read
    assert sharding.stream_shares(part) is None
    assert sharding.stream_shares(object()) is None


def _split(seed: int) -> SamplerDraw:
    """The random_split draw a rank seeded with ``seed`` makes: its generator's state, read."""
    from rngaudit.capture import fingerprint

    g = torch.Generator().manual_seed(seed)
    return {
        "op": "aten.randperm",
        "generator": "torch.default_generator",
        "fingerprint": fingerprint.of(g),
        "output_digest": None,
        "call_site": {"file": "torch/utils/data/dataset.py", "line": 506, "function": "x"},
        "user_call_site": None,
        "sampler": None,
    }


def test_a_split_draw_is_named_only_where_the_ranks_drew_it_differently() -> None:
    """Differing datasets name the random_split draw the ranks recorded when its state differs
    across ranks; one drawn alike (a shared generator: another loader's split, say) is not the
    cause and is not named, nor is any split behind a stream."""
    for seeds, named in (((1, 2), True), ((3, 3), False)):
        records = [
            epoch_record(0, 5, Subset(DATA, range(0, 20))),
            epoch_record(1, 5, Subset(DATA, range(20, 40))),
        ]
        for record, seed in zip(records, seeds, strict=True):
            record["dataset_draws"] = [_split(seed)]
        (finding, *_) = order_rules.compare(records, missing=[])
        assert finding.kind == DATASET_DIVERGENCE
        assert ("The mapping was drawn by aten.randperm" in finding.message) is named, seeds
    records, _ = _hf_stream_records([1, 1, 2], shards=4)
    for record, seed in zip(records, (1, 1, 2), strict=True):
        record["dataset_draws"] = [_split(seed)]
    (finding,) = order_rules.compare(records, missing=[])
    assert "split different streams" in finding.message
    assert "The mapping was drawn" not in finding.message


def test_whole_epochs_that_independent_draws_with_replacement_could_give_are_told_apart() -> None:
    """Under a data-parallel module alone (no earlier partition), an overlap is an error only
    when the ranks' epochs cannot be independent draws with replacement: a small epoch of a
    big root shares a few samples with no repeat by chance; whole permutations never do."""
    from rngaudit.epochs import partition

    def summary(taken: list[int], n: int) -> dict[str, Any]:
        tape = partition.Tape([], n)
        tape.take([taken])
        s = tape.summary()
        s["training"] = True
        return s

    n = 1_000_000
    small = {0: summary([1, 2, *range(10, 1608)], n), 1: summary([1, 2, *range(5000, 6598)], n)}
    seen = overlap.measure(small)
    assert seen is not None and seen["shared"] == 2 and max(seen["repeats"].values()) == 0
    assert not harm.by_chance_ruled_out(seen, 2)
    finding, _ = order_rules.observed_overlap(small, "L", "C", 0, None, True)
    assert finding is None  # with replacement, by design: no evidence of harm
    finding, _ = order_rules.observed_overlap(small, "L", "C", 1, -1, True)
    assert finding is not None and finding.severity == "error"  # it partitioned before
    # 48 of 64 from each rank's own permutation: sampling with replacement would repeat
    perms = [torch.randperm(64, generator=torch.Generator().manual_seed(r)) for r in range(2)]
    whole = {r: summary(perms[r][:48].tolist(), 64) for r in range(2)}
    seen = overlap.measure(whole)
    assert seen is not None and not seen["identical"] and seen["shared"] > 1
    assert harm.by_chance_ruled_out(seen, 2)
    finding, _ = order_rules.observed_overlap(whole, "L", "C", 0, None, True)
    assert finding is not None and finding.severity == "error"
    # n! / ((n - k)! n^k) for no repeat at all: 64 distinct of 64 draws is about 1e-26
    log_p = math.lgamma(65) - math.lgamma(1) - 64 * math.log(64)
    assert log_p < math.log(1e-24)


def test_an_earlier_exact_epoch_shows_how_much_its_sharder_pads() -> None:
    """Generated configs w2-s12-13, w3-s11-07: an exact epoch with no sample taken twice, then
    one rank a step behind: one sample on two ranks is no padding for a sharder that padded
    none before (over an epoch of as many samples), and is for one that padded one."""
    from rngaudit.epochs import judging, partition

    def summary(taken: list[int]) -> dict[str, Any]:
        tape = partition.Tape([], 4)
        tape.take([taken])
        return dict(tape.summary(), training=False)

    exact = {0: summary([0, 1]), 1: summary([2, 3])}
    judge = judging.Judge()
    judge._partitioned("L", exact)
    later = {0: summary([0, 1]), 1: summary([1, 3])}
    assert judge._padded("L", later) == 0
    finding, exact_now = order_rules.observed_overlap(later, "L", "C", 1, 0, False)
    assert finding is not None and finding.severity == "error" and not exact_now
    unknown, _ = order_rules.observed_overlap(later, "L", "C", 1, -1, False)
    assert unknown is None  # up to world - 1 may be padding
    padded = {0: summary([0, 1, 2]), 1: summary([3, 0])}  # 5 taken of 4: one pad
    judge._partitioned("P", padded)
    assert judge._padded("P", {0: summary([0, 1, 2]), 1: summary([2, 1])}) == 1
    assert judge._padded("P", later) == -1  # an epoch of another length: unknown
