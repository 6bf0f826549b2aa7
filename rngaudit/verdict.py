"""The one verdict on partition harm: from which samples each rank took, the finding or none."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Sharding:
    """What the trigger knows of how the loader is sharded (the facts an allowance needs)."""

    rounds: int = 0  # samples a shard re-hands to complete its last round (accelerate
    # even_batches: world x batch size); 0 when the sharder does not pad by rounds
    covers: int = 0  # the samples the sharded order holds (its sampler's length: a Subset's,
    # not its root's); 0 when unknown: the root's size stands in
    pads: int = -1  # the samples a DistributedSampler pads its epoch with (its total_size
    # - len(dataset)); -1 when unknown: up to world - 1
    complete: bool = False  # a correct sharding takes every one of ``covers`` in a whole epoch
    # (the ranks' own datasets, cut from one of that size): padding then leaves none out


UNKNOWN = Sharding()

# The allowance table: a correct program may hand a sample to two ranks only as one of these.
ALLOWANCES: tuple[tuple[str, str], ...] = (
    (
        "DistributedSampler padding",
        "up to world - 1 samples each taken by two ranks (a DistributedSampler: at most "
        "the samples it pads with, total_size - len(dataset)); where the ranks read datasets of "
        "their own cut from one (a per-rank Subset), only with none of its samples left out "
        "(padding completes a round: it never drops one)",
    ),
    (
        "accelerate even_batches",
        "a BatchSamplerShard that completes its last round from the epoch's first batches: up "
        "to world x batch size samples taken twice, and no sample taken by no rank; a stream "
        "by key (IterableDatasetShard): one round, world x batch size ids, the first batches "
        "none",
    ),
    ("drop_last", "samples no rank took, with none taken twice: never an overlap"),
    (
        "independent draws with replacement",
        "a rank that repeats more than world - 1 samples of its own samples with replacement; "
        "ranks that repeat none are ruled out only by replacement_ruled_out/by_chance_ruled_out",
    ),
)

Scope = Literal["epoch", "planned", "prefix", "left", "datasets"]


@dataclass(frozen=True)
class Taken:
    """Which samples each rank took, compared across the ranks: the one quantity every
    partition verdict is made on, whatever its source (index batches mapped to root samples,
    :func:`~rngaudit.ranks.overlap.measure`; declared keys,
    :func:`~rngaudit.epochs.keyed.overlap`; the datasets the ranks built).

    ``scope``: an ``epoch`` (also read ahead, before its first step), a ``planned`` epoch (the
    shares a sampler returned before its first batch), a ``prefix`` (the first batches, or
    those handed so far), an epoch ``left`` early by some rank, or the ``datasets`` the ranks
    built (their root samples). ``by_key``: samples are named by a declared key (its ids are
    the identity: no root, no repeats counted), else by root index."""

    seen: Mapping[str, Any]  # the measured overlap: shared, union, per_rank, identical, ...
    world: int
    scope: Scope = "epoch"
    by_key: bool = False

    @property
    def shared(self) -> int:
        """Samples proven taken by more than one rank (of the sampled ones, for an estimate)."""
        return int(self.seen.get("shared_proven", self.seen["shared"]))

    @property
    def identical(self) -> bool:
        return bool(self.seen.get("identical"))


@dataclass(frozen=True)
class Facts:
    """What the trigger knows of the loader, besides what the ranks took.

    ``sharding``: the sharder's padding by rounds; ``key_round``: a stream by key's one round
    of padding (world x batch; 0 for the first batches). ``sharded``: a sampler the program
    put there to partition the data (a DistributedSampler or its subclass, a BatchSamplerShard)
    shards it; ``partitioned_before``: an earlier epoch of the loader partitioned the data
    exactly; ``data_parallel``: every rank trains it under a DDP / FSDP module (gradients on);
    ``own_data``: every rank reads a dataset of its own (an index mapping no other rank's
    loader reads, a per-rank Subset) cut from one root: the program split the data itself.
    ``identity_shown``: False where the ranks' first batches hold different content for the
    same indices (the indices may name different samples on each rank). The causes (a seed,
    a generator state, ``set_epoch``, a draw before the sync) are no fact here: they explain
    the finding in its wording, and convict alone only as :func:`by_cause` says."""

    sharding: Sharding = UNKNOWN
    key_round: int = 0
    sharded: bool = False
    partitioned_before: bool = False
    data_parallel: bool = False
    own_data: bool = False
    identity_shown: bool = True  # False: the same indices hold different content on the ranks


@dataclass(frozen=True)
class Verdict:
    """The verdict on a harmful (or doubtful) overlap: its severity and why."""

    severity: Literal["error", "warning"]
    why: str  # the evidence that makes it harm, or what is missing for an error


def allowed_as(seen: Mapping[str, Any], world: int, sharding: Sharding = UNKNOWN) -> str | None:
    """The allowance (a name from :data:`ALLOWANCES`, or "nothing shared") that explains the
    ranks' overlap (:func:`~rngaudit.ranks.overlap.measure`), or None when none does:
    harm. Where the overlap is estimated (a sketch), only the samples proven shared count."""
    shared = int(seen.get("shared_proven", seen["shared"]))
    if shared == 0:
        return "nothing shared"
    padding = world - 1 if sharding.pads < 0 else min(sharding.pads, world - 1)
    if shared <= padding and _once_each(seen) and not _left_out(seen, sharding):
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


def _once_each(seen: Mapping[str, Any]) -> bool:
    """Whether every sample padding re-hands went to one more rank only: a sharder pads with
    up to ``world - 1`` copies of distinct samples (a sample on three ranks is no padding,
    unless the data holds fewer samples than the ranks). Unknown (a sketch) counts as so."""
    most = seen.get("most")
    return not isinstance(most, int) or most <= 2 or int(seen["root_size"]) < most


def _left_out(seen: Mapping[str, Any], sharding: Sharding) -> bool:
    """Whether a sharding that is complete by design (:attr:`Sharding.complete`) left samples
    out of the whole epoch (known exactly): its overlap is then no padding."""
    return (
        sharding.complete
        and not seen.get("estimated")
        and int(seen["union"]) < (sharding.covers or int(seen["root_size"]))
    )


def _allowed(taken: Taken, facts: Facts) -> str | None:
    """The allowance that explains what the ranks took, by index or by key."""
    if not taken.by_key:
        return allowed_as(taken.seen, taken.world, facts.sharding)
    if taken.shared == 0:
        return "nothing shared"
    if int(taken.seen["shared"]) - float(taken.seen.get("shared_bound", 0.0)) <= facts.key_round:
        return "accelerate even_batches"  # one round of padding: at least, by the estimate
    return None


def partitions(taken: Taken, covers: int = 0) -> bool:
    """Whether what the ranks took in a whole epoch partitions the data: nothing shared beyond
    padding, known exactly (a bitmap), covering (nearly) all of the ``covers`` samples the
    loader's dataset holds (0: the root's; a split's size where it reads one). The evidence
    :attr:`Facts.partitioned_before` carries to the loader's later epochs."""
    seen = taken.seen
    if taken.by_key or taken.scope != "epoch" or seen.get("estimated"):
        return False
    if allowed_as(seen, taken.world) not in ("nothing shared", "DistributedSampler padding"):
        return False
    return bool(int(seen["union"]) * 10 >= (covers or int(seen["root_size"])) * 9)


def _evidence(taken: Taken, facts: Facts) -> str | None:
    """Why an overlap beyond every allowance is no sampling by design, or None when nothing
    rules that out."""
    if taken.by_key:
        return "the ranks took the same ids of a declared key"
    if facts.partitioned_before:
        return "an earlier epoch partitioned the data exactly"
    if taken.scope == "datasets":
        return "the ranks built different datasets of one root that overlap"
    if taken.scope == "left":
        return "what the ranks took before leaving the epoch overlaps"
    if taken.scope != "prefix" and facts.sharded:
        return "the sampler is there to partition the data"
    if taken.scope != "prefix" and facts.own_data:
        return "each rank reads a dataset of its own, cut from one: the program split the data"
    if taken.scope != "prefix" and taken.identical:
        return "every rank took the same samples"
    if taken.scope == "prefix":
        ruled_out = replacement_ruled_out(taken.seen, taken.world)
    else:
        ruled_out = by_chance_ruled_out(taken.seen, taken.world)
    return "independent draws with replacement are ruled out" if ruled_out else None


def decide(taken: Taken, facts: Facts) -> Verdict | None:
    """The one decision on partition harm: what the ranks took (``taken``) against what a
    correct program may hand out (:data:`ALLOWANCES`) and what the trigger knows (``facts``).

    Nothing when an allowance explains the overlap. Else, with no sign the loader is meant to
    be partitioned (no sharder, no datasets of the ranks' own, no earlier exact epoch, no
    data-parallel module, no declared key): a warning (may be by design), nothing where every
    rank took the same samples (a tensor-parallel group, a replicated evaluation). Else an
    error where something rules out sampling by design (:func:`_evidence`); ranks that took
    identical ids of a declared key with no data-parallel module are a warning (a
    tensor-parallel group reads the same stream); anything else is nothing: no evidence of
    harm."""
    if _allowed(taken, facts) is not None:
        return None
    meant = facts.sharded or facts.own_data or facts.partitioned_before or taken.scope == "datasets"
    if not meant and not facts.data_parallel:
        if taken.identical:
            if taken.by_key:
                return Verdict("warning", "identical ids and no data-parallel module")
            return None
        if not taken.by_key:
            return Verdict("warning", "no data-parallel module, no earlier partition")
    why = _evidence(taken, facts)
    if why is None:
        return None
    return Verdict(unshown_identity("error", facts.identity_shown), why)


def unshown_identity(severity: str, shown: bool = False) -> Literal["error", "warning"]:
    """The severity an overlap keeps where sample identity is not shown (the same indices,
    different content on different ranks): a warning at most, never an error."""
    return "error" if shown and severity == "error" else "warning"


# The causes that convict alone, before any overlap is measurable: each proves that the ranks
# take shares of different orders (or datasets) of one root. A sampler's state, an order before
# sharding and a dataset mapping convict only where the shares the ranks are about to be handed
# cannot be read before the epoch (a sampler that yields lazily, a BatchSamplerShard); where they
# can, the measured shares decide (order_rules.planned_overlap). Any other cause (a sampler's
# draws whose seed and epoch agree) explains a finding and waits for the measured overlap.
CONVICTING: dict[str, str] = {
    "drawn before the sync": "a loader's sampler drew its epoch-0 order before iteration "
    "(a stateful loader's prefetch in prepare()) from state that differs across ranks",
    "sampler state": "a shuffling DistributedSampler's seed, epoch, size or drop_last differs: "
    "the ranks shard different permutations",
    "order before sharding": "the order a BatchSamplerShard splits differs in its first batches",
    "dataset mapping": "the index mapping each rank shards differs (its split, its stream)",
    "resume position": "the ranks resume one epoch at different batches",
}


def by_cause(cause: str) -> Verdict:
    """The verdict a cause gives alone: an error for the causes of :data:`CONVICTING`, else a
    warning that says the overlap is still to be measured."""
    if cause in CONVICTING:
        return Verdict("error", CONVICTING[cause])
    return Verdict("warning", f"{cause}: the overlap is still to be measured")


REPLACEMENT_ALPHA = 1e-12  # see replacement_ruled_out


def _log_poisson_cdf(m: int, mu: float) -> float:
    """log P(X <= m) for X ~ Poisson(mu > 0), summed in log space."""
    terms = [-mu + j * math.log(mu) - math.lgamma(j + 1) for j in range(m + 1)]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms))


def replacement_ruled_out(seen: Mapping[str, Any], world: int) -> bool:
    """Whether the samples the ranks share (:func:`~rngaudit.ranks.overlap.measure`) are
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


def by_chance_ruled_out(seen: Mapping[str, Any], world: int) -> bool:
    """Whether the ranks' whole epochs (:func:`~rngaudit.ranks.overlap.measure`, exact)
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
