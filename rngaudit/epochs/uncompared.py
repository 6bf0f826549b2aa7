"""Observed epochs still uncompared when the process group goes: compared once every rank closed.

A rank that published an epoch of a loader no known class shards before the others had
(ranks unsynchronised: no collective between them) compares it at a later observed epoch; its
last such epoch has none. When the process group is destroyed (or the process ends with it
alive) every rank marks its observed loaders closed (it will publish no more), then waits, at
most ``WAIT`` seconds in all, until every rank of each pending epoch has published it or
closed; what all published is compared, and the ranks that did neither, or closed without
publishing, are named (an epoch a rank left early it publishes, partial, before it closes:
:mod:`~rngaudit.epochs.handed`). A loader some rank never iterated is skipped (a rank-only
loader: never compared, never waited for).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from rngaudit.epochs import unsharded
from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol

WAIT = 10.0  # seconds, in all, a closing rank waits for the others' publications
_POLL = 0.02  # seconds between looks at the store while waiting


def _closed(key: str, rank: int) -> str:
    return protocol.loader(key) / "closed" / rank


def close(keys: list[str]) -> None:
    """This rank publishes no more epochs of the loaders ``keys`` (never raises)."""
    where = exchange.distributed()
    if where is None:
        return
    with contextlib.suppress(Exception):
        store = protocol.default()
        for key in keys:
            store.set(_closed(key, where[0]), b"1")


def settle(
    epochs: list[unsharded.Epoch], seconds: float
) -> list[tuple[unsharded.Epoch, list[dict[str, Any]] | None, list[int]]]:
    """Per pending epoch of a loader every rank iterated: every rank's summary when all
    published it (else None) and the ranks that did not publish it."""
    where = exchange.distributed()
    if where is None or not epochs:
        return []
    world = where[1]
    store = protocol.default()
    deadline = time.monotonic() + seconds
    out: list[tuple[unsharded.Epoch, list[dict[str, Any]] | None, list[int]]] = []
    for epoch in epochs:
        base = protocol.epoch(epoch.key, epoch.epoch)
        iterated = protocol.per_rank(protocol.loader(epoch.key) / "iterated", range(world))
        if not store.check(iterated):
            unsharded.forget(epoch)  # some rank never iterated this loader: not compared
            continue

        while _unsettled(store, base, epoch.key, world) and time.monotonic() < deadline:
            time.sleep(_POLL)
        got = unsharded.collect(epoch)
        if got is not None:
            out.append((epoch, got, []))
            continue
        missing = [r for r in range(world) if not store.check([base / "end" / r])]
        unsharded.forget(epoch)
        out.append((epoch, None, missing))
    return out


def _unsettled(store: Any, base: protocol.Key, key: str, world: int) -> list[int]:
    """The ranks that have neither published the epoch under ``base`` nor closed."""
    return [
        r
        for r in range(world)
        if not store.check([base / "end" / r]) and not store.check([_closed(key, r)])
    ]
