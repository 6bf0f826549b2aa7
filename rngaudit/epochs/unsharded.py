"""Loaders no known class shards: each epoch's samples published through the store, compared lazily.

A loader sharded by nothing rngaudit recognises (a sampler of one's own that takes
``perm[rank::world]``, a shuffled loader with no ``DistributedSampler`` under DDP) may be
iterated by every rank or by one (a rank-0-only evaluation), so no rank may wait for the others
at its first batch. Each rank instead announces each epoch of such a loader (``start``) and, when
it has drawn the epoch's last index batch, publishes what it took (``end``: the bitmap of root
samples, :class:`~rngaudit.epochs.partition.Tape`); it waits for the others' only when every rank
announced that epoch or iterated the loader before, and otherwise compares later (at the first
index batch of its next observed epoch), once every rank has published. A loader one rank
iterates alone is never compared.

Loaders are matched across ranks by what they are, not by object: the root dataset's
identity (class, size, attributes), the sampler chain's classes and the batch size, and the
order in which the rank first iterated loaders of that identity.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
from dataclasses import dataclass
from typing import Any

from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol

PREFIX = protocol.key("observed")
END_WAIT = 10.0  # seconds a rank waits at an epoch's end for ranks that all announced it
START_WAIT = 3.0  # seconds a rank waits for the others to announce a loader meant to be split
ALONE: set[str] = set()  # loaders meant to be split that some rank did not announce in time
MAX_PENDING = 64  # epochs kept for a later comparison, per process
WAITED: collections.Counter[str] = collections.Counter()  # loader label -> epochs waited for


@dataclass
class Epoch:
    """One epoch of one observed loader on this rank."""

    key: str  # the loader's cross-rank identity
    epoch: int
    label: str
    chain: str
    watch: Any  # rngaudit.epochs.registry.Watch


def loader_key(identity: str, chain: str, batch_size: Any, occurrence: int) -> str:
    text = f"{identity}|{chain}|{batch_size}|{occurrence}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _base(epoch: Epoch) -> protocol.Key:
    return protocol.epoch(epoch.key, epoch.epoch)


def start(epoch: Epoch) -> None:
    """Announce that this rank began ``epoch``, and (kept for the run) that it iterates the
    loader at all (never waits)."""
    where = exchange.distributed()
    if where is None:
        return
    with contextlib.suppress(Exception):
        store = protocol.default()
        store.set(_base(epoch) / "start" / where[0], b"1")
        if epoch.epoch == 0:
            store.set(protocol.loader(epoch.key) / "iterated" / where[0], b"1")


def finish(
    epoch: Epoch, summary: dict[str, Any], meant: bool = False
) -> list[dict[str, Any]] | None:
    """Publish what this rank took in ``epoch``; every rank's summary when all have published
    (waited for, up to ``END_WAIT``, only when every rank announced this epoch or iterated
    the loader before), else None. ``meant``: the loader is meant to be split between the
    ranks (its sampler shards itself, its dataset is a split of a root): a rank that drew its
    epoch before the others announced theirs (a loop with no data-parallel module: nothing
    holds the ranks together) waits up to ``START_WAIT`` for their announcements first, once
    per loader (a loader one rank iterates alone costs that wait once)."""
    where = exchange.distributed()
    if where is None:
        return None
    world = where[1]
    store = protocol.default()
    base = _base(epoch)
    publish(epoch, summary)
    starts = protocol.per_rank(base / "start", range(world))
    iterated = protocol.per_rank(protocol.loader(epoch.key) / "iterated", range(world))
    ends = protocol.per_rank(base / "end", range(world))
    if meant and epoch.key not in ALONE and not store.check(iterated):
        protocol.wait_all(store, starts, min(START_WAIT, float(epoch.watch.settings.timeout)))
        if not store.check(starts):
            ALONE.add(epoch.key)  # some rank does not iterate it: never waited for again
    if store.check(starts) or store.check(iterated):
        WAITED[epoch.label] += 1
        protocol.wait_all(store, ends, min(END_WAIT, float(epoch.watch.settings.timeout)))
    return collect(epoch)


def announced(epoch: Epoch) -> list[dict[str, Any]] | None:
    """Every rank's summary of an epoch published earlier, waited for (up to ``END_WAIT``)
    only when every rank has announced it by now (each is drawing it: its end is near), else
    collected without a wait; None when not all have published."""
    where = exchange.distributed()
    if where is None:
        return None
    store = protocol.default()
    base = _base(epoch)
    if store.check(protocol.per_rank(base / "start", range(where[1]))):
        WAITED[epoch.label] += 1
        ends = protocol.per_rank(base / "end", range(where[1]))
        protocol.wait_all(store, ends, min(END_WAIT, float(epoch.watch.settings.timeout)))
    return collect(epoch)


def publish(epoch: Epoch, summary: dict[str, Any]) -> None:
    """Publish what this rank took in ``epoch`` (never waits)."""
    where = exchange.distributed()
    if where is not None:
        protocol.default().set(_base(epoch) / "end" / where[0], exchange.encode(summary))


def collect(epoch: Epoch) -> list[dict[str, Any]] | None:
    """Every rank's summary of ``epoch`` when all have published (never waits), else None;
    the last rank to read them deletes the epoch's keys."""
    where = exchange.distributed()
    if where is None:
        return None
    world = where[1]
    store = protocol.default()
    base = _base(epoch)
    ends = protocol.per_rank(base / "end", range(world))
    if not store.check(ends):
        return None
    out = []
    for r, payload in enumerate(protocol.get_all(store, ends)):
        out.append(dict(exchange.decode(bytes(payload)), rank=r))
    starts = protocol.per_rank(base / "start", range(world))
    protocol.read_by_all(store, base, [*ends, *starts], world)
    return out


def forget(epoch: Epoch) -> None:
    """Delete this rank's keys of an epoch the other ranks never published."""
    where = exchange.distributed()
    if where is None:
        return
    base = _base(epoch)
    with contextlib.suppress(Exception):
        protocol.delete(protocol.default(), [base / "end" / where[0], base / "start" / where[0]])
