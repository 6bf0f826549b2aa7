"""The one rule on partition harm and its allowance table, on measured overlaps."""

from __future__ import annotations

from typing import Any

from rngaudit.epochs import harm


def seen(shared: int, union: int, root: int = 22, repeats: int = 0) -> dict[str, Any]:
    return {"root_size": root, "shared": shared, "union": union,
            "per_rank": {0: 12, 1: 12}, "repeats": {0: repeats, 1: 0}}  # fmt: skip


def test_every_allowance_named_is_in_the_table() -> None:
    names = {name for name, _ in harm.ALLOWANCES}
    rounds = harm.Sharding(rounds=8)
    cases = [seen(1, 22), seen(2, 21, repeats=3), seen(2, 22)]
    got = {harm.allowed_as(s, 2, rounds) for s in cases}
    assert got == {"DistributedSampler padding", "independent draws with replacement",
                   "accelerate even_batches"}  # fmt: skip
    assert got <= names
    assert harm.allowed_as(seen(0, 20), 2) == "nothing shared"


def test_even_batches_padding_is_allowed_only_where_the_sharder_pads_by_rounds() -> None:
    # measured in accelerate's own test_distributed_data_loop: 22 samples, batch 4, world 2
    padded = seen(2, 22)
    assert harm.harm(padded, 2)  # no known sharder: 2 shared at world 2 is beyond padding
    assert not harm.harm(padded, 2, harm.Sharding(rounds=8))


def test_even_batches_allowance_never_covers_a_dropped_sample_or_more_than_a_round() -> None:
    rounds = harm.Sharding(rounds=8)
    assert harm.harm(seen(2, 21), 2, rounds)  # a sample no rank took: different orders
    assert harm.harm(seen(9, 22), 2, rounds)  # more than one round shared
    estimated = {**seen(2, 22), "estimated": True, "shared_proven": 2}
    assert harm.harm(estimated, 2, rounds)  # a sketch cannot show that none was dropped


def test_even_batches_over_a_subset_counts_the_samples_its_order_holds() -> None:
    # generated config w2-s7-01: a Subset of 15 of a 30-sample root, batch 3, world 2:
    # accelerate re-hands 3 samples; the 15 outside the Subset were never the loader's
    over_subset = seen(3, 15, root=30)
    assert harm.harm(over_subset, 2, harm.Sharding(rounds=6))  # the root's size: unknown cover
    assert not harm.harm(over_subset, 2, harm.Sharding(rounds=6, covers=15))
    assert harm.harm(seen(3, 14, root=30), 2, harm.Sharding(rounds=6, covers=15))  # one dropped
