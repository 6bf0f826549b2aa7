"""The rule on partition harm: is what the ranks took more overlap than correct sharding allows?"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Sharding:
    """What the trigger knows of how the loader is sharded (the facts an allowance needs)."""

    rounds: int = 0  # samples a shard re-hands to complete its last round (accelerate
    # even_batches: world x batch size); 0 when the sharder does not pad by rounds
    covers: int = 0  # the samples the sharded order holds (its sampler's length: a Subset's,
    # not its root's); 0 when unknown: the root's size stands in


UNKNOWN = Sharding()

# The allowance table: a correct program may hand a sample to two ranks only as one of these.
ALLOWANCES: tuple[tuple[str, str], ...] = (
    ("DistributedSampler padding", "up to world - 1 samples taken by more than one rank"),
    (
        "accelerate even_batches",
        "a BatchSamplerShard that completes its last round from the epoch's first batches: up "
        "to world x batch size samples taken twice, and no sample taken by no rank",
    ),
    ("drop_last", "samples no rank took, with none taken twice: never an overlap"),
    (
        "independent draws with replacement",
        "a rank that repeats more than world - 1 samples of its own samples with replacement; "
        "ranks that repeat none are ruled out only by replacement_ruled_out/by_chance_ruled_out",
    ),
)


def allowed_as(seen: dict[str, Any], world: int, sharding: Sharding = UNKNOWN) -> str | None:
    """The allowance (a name from :data:`ALLOWANCES`, or "nothing shared") that explains the
    ranks' overlap (:func:`~rngaudit.epochs.partition.overlap`), or None when none does:
    harm. Where the overlap is estimated (a sketch), only the samples proven shared count."""
    shared = int(seen.get("shared_proven", seen["shared"]))
    if shared == 0:
        return "nothing shared"
    if shared <= world - 1:
        return "DistributedSampler padding"
    if max(seen["repeats"].values()) > world - 1:
        return "independent draws with replacement"
    if (
        sharding.rounds > 0
        and not seen.get("estimated")
        and int(seen["union"]) == (sharding.covers or int(seen["root_size"]))
        and shared <= sharding.rounds
    ):
        return "accelerate even_batches"
    return None


def harm(seen: dict[str, Any], world: int, sharding: Sharding = UNKNOWN) -> bool:
    """Whether the ranks' measured overlap is harm: no allowance explains it."""
    return allowed_as(seen, world, sharding) is None


REPLACEMENT_ALPHA = 1e-12  # see replacement_ruled_out


def _log_poisson_cdf(m: int, mu: float) -> float:
    """log P(X <= m) for X ~ Poisson(mu > 0), summed in log space."""
    terms = [-mu + j * math.log(mu) - math.lgamma(j + 1) for j in range(m + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def replacement_ruled_out(seen: dict[str, Any], world: int) -> bool:
    """Whether the samples the ranks share (:func:`~rngaudit.epochs.partition.overlap`) are
    too many for ranks that each sample independently with replacement (an overlap by design)
    while none repeats more than ``world - 1`` of its own: with k draws a rank from n samples,
    each pair of ranks shares about k²/n and each rank repeats about k²/2n, so ``shared``
    implies about ``shared / (world (world - 1))`` repeats a rank; at most ``world - 1`` on
    every rank then has probability below ``REPLACEMENT_ALPHA`` (the plug-in; the joint
    chance over every k stays below 1e-9 at world 2, 3: computed). A prefix of such sampling
    overlaps long before it repeats (about one time in three the first check would cry wolf
    without this, simulated); a share of a permutation never repeats at all."""
    shared = int(seen.get("shared_proven", seen["shared"]))
    if world < 2 or shared <= 0:
        return False
    mu = shared / (world * (world - 1))
    return world * _log_poisson_cdf(world - 1, mu) < math.log(REPLACEMENT_ALPHA)


def by_chance_ruled_out(seen: dict[str, Any], world: int) -> bool:
    """Whether the ranks' whole epochs (:func:`~rngaudit.epochs.partition.overlap`, exact)
    cannot be independent draws with replacement from the root: under that, a rank drawing k
    of n repeats some of its own, so the chance of repeating no more than it did (exactly
    n! / ((n - k)! n^k) for none, else a Poisson tail at the exact mean) multiplied over the
    ranks must be below ``REPLACEMENT_ALPHA``. A small epoch of a big root sampled so (1,600
    of 1M a rank) shares a few samples and repeats none about one epoch in three (simulated);
    a whole permutation (every rank the whole root) cannot pass for it. An estimate (a
    sketch) falls back to :func:`replacement_ruled_out`."""
    if seen.get("estimated"):
        return replacement_ruled_out(seen, world)
    n = int(seen["root_size"])
    log_p = 0.0
    for r, distinct in seen["per_rank"].items():
        repeats = int(seen["repeats"][r])
        k = int(distinct) + repeats
        if k < 2 or n < 1:
            return False
        if repeats == 0:
            log_p += math.lgamma(n + 1) - math.lgamma(n - k + 1) - k * math.log(n)
        else:
            log_p += _log_poisson_cdf(repeats, k - n * (1.0 - (1.0 - 1.0 / n) ** k))
    return log_p < math.log(REPLACEMENT_ALPHA)
