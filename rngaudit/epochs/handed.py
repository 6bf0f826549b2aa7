"""An observed epoch a rank left early: the index batches it was handed, folded without a draw.

A rank that leaves an epoch of a loader no known class shards (a ``break``, ``max_steps``, an
exception it caught) never draws the epoch's last index batch, so the epoch never ends on its
own. What the rank was handed until then is still known: the batches already folded into the
epoch's :class:`~rngaudit.epochs.partition.Tape` and those drawn since, held by the tape
(``pending``) or, on the teed path, by the tee branch that has not read the current segment yet
(its count kept by a C counter zipped into the segment: reading that many values from the
branch reads its buffer, never the source). Batches an iterator drew ahead of those it yielded
(a multi-process iterator's prefetch) are left out; where that cannot be told, the epoch is
unknown (not compared), never guessed. The fold is taken when the iterator goes (a finalizer:
the usual ``break``), when the same loader starts a new epoch, or when the process group goes;
:func:`snapshot` reads the same without closing the epoch (what a rank has been handed so far).
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import operator
import re
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rngaudit import peek
from rngaudit.epochs import partition, unsharded
from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol

log = logging.getLogger("rngaudit")


@dataclass
class Left:
    """How to read what a rank took of an observed epoch, should it leave it early."""

    ahead: int | None  # index batches the iterator draws ahead of those it yields (None: unknown)
    length: int | None  # the epoch's index batches (the index sampler's length), if known
    second: Any = None  # the teed path: the tee branch behind the current segment
    counter: Any = None  # the teed path: the current segment's count of batches drawn


def ahead(iterator: Any) -> int | None:
    """Index batches ``iterator`` draws before it yields them: none in one process; its
    ``prefetch_factor * num_workers`` for torch's in-order multi-process iterator (each batch
    it yields draws one more); None for any other (unknown)."""
    module = sys.modules.get("torch.utils.data.dataloader")
    single = getattr(module, "_SingleProcessDataLoaderIter", None)
    multi = getattr(module, "_MultiProcessingDataLoaderIter", None)
    kind = type(iterator)
    if isinstance(single, type) and kind is single:
        return 0
    if not (isinstance(multi, type) and kind is multi):
        return None
    if peek.flag(peek.attr(iterator, "_in_order")) is False:
        return None  # batches come back out of order: which were yielded is not known
    factor = peek.integer(peek.attr(iterator, "_prefetch_factor"), -1)
    workers = peek.integer(peek.attr(iterator, "_num_workers"), -1)
    return factor * workers if factor >= 0 and workers > 0 else None


def left_of(iterator: Any) -> Left:
    """How to read what ``iterator``'s epoch has handed out: the index batches it draws ahead
    and the epoch's length (its index sampler's, if it tells)."""
    return Left(ahead(iterator), peek.size(peek.attr(iterator, "_index_sampler")))


def segment(first: Any, fold: int, tape: Any) -> Iterator[Any]:
    """The next ``fold`` index batches of the tee branch ``first``, counted in C when the tape
    may be left early (no Python frame per batch)."""
    left = tape.left
    part = itertools.islice(first, fold)
    if not isinstance(left, Left):
        return part
    counter = itertools.count()
    left.counter = counter  # islice first: the counter moves only for a batch drawn
    return map(operator.itemgetter(0), zip(part, counter, strict=False))


_COUNT = re.compile(r"count\((\d+)\)")


def _counted(counter: Any) -> int | None:
    if counter is None:
        return 0
    found = _COUNT.fullmatch(repr(counter))
    return int(found.group(1)) if found else None


_WATCHED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # tape -> finalizer


def watch(iterator: Any, tape: Any, gone: Callable[[Any], None]) -> None:
    """``gone(tape)`` when ``iterator`` goes while the tape is still open (a ``break``)."""
    with contextlib.suppress(Exception):
        finalizer = weakref.finalize(iterator, gone, tape)
        finalizer.atexit = False  # at exit the process group's settle takes what is open
        _WATCHED[tape] = finalizer


def done(tape: Any) -> None:
    """The tape's epoch ended (or was folded): its iterator is no longer watched for it."""
    with contextlib.suppress(Exception):
        finalizer = _WATCHED.pop(tape, None)
        if finalizer is not None:
            finalizer.detach()


def _handed(tape: Any, left: Left) -> list[Any] | None:
    """The index batches handed to the loop since ``tape``'s last fold, read without moving
    anything: on the teed path from the other branch's buffer (a copy of the branch: it stays
    put), else the tape's pending list; those drawn ahead of the loop left out. None when that
    cannot be told (a batch drawn ahead was folded already, the count unreadable)."""
    if left.second is not None:  # teed: the current segment is in the other branch
        count = _counted(left.counter)
        if count is None:
            return None
        held = list(itertools.islice(copy.copy(left.second), count))
    else:
        held = list(tape.pending)
    handed = tape.batches + len(held) - int(left.ahead or 0)
    if handed < tape.batches:
        return None
    return held[: handed - tape.batches]


def fold(tape: Any) -> dict[str, Any] | None:
    """The summary of what this rank was handed of ``tape``'s epoch, which it left before its
    end, marked partial (``batches``: the index batches it was handed; ``length``: the
    epoch's); None when the tape was closed already. Reads nothing from the sampler."""
    done(tape)
    if tape.closed:
        return None
    left = tape.left
    summary: dict[str, Any] = {"known": False}
    try:
        if isinstance(left, Left) and left.ahead is not None and tape.known:
            handed = _handed(tape, left)
            if handed is not None:
                tape.pending = []  # in ``handed``, or drawn ahead: never folded
                tape.take(handed)
                summary = tape.summary()
    except Exception:
        log.debug("rngaudit: could not fold an epoch left early", exc_info=True)
        summary = {"known": False}
    tape.abandon()  # nothing more is observed of it (it may be iterated on: not compared)
    if isinstance(left, Left):
        left.second = left.counter = None
    summary["partial"] = True
    summary["length"] = left.length if isinstance(left, Left) else None
    return summary


def snapshot(tape: Any) -> dict[str, Any] | None:
    """What this rank has been handed of ``tape``'s epoch so far, summarised like an epoch's
    end (marked partial), the tape and the sampler left exactly as they are: the bitmap
    copied, the batches held since the last fold read from the tee branch's buffer (a copy)
    or the tape's pending list, those drawn ahead of the loop left out. None when the tape is
    closed or unknown, its root is a sketch's, or what was handed cannot be told."""
    left = tape.left
    if tape.closed or not tape.known or tape.seen is None:
        return None
    if not isinstance(left, Left) or left.ahead is None:
        return None
    try:
        handed = _handed(tape, left)
        if handed is None:
            return None
        part = partition.Tape(tape.maps, tape.root_size)
        part.seen = tape.seen.copy()
        part.taken, part.batches = tape.taken, tape.batches
        part.take(handed)
        summary: dict[str, Any] = part.summary()
    except Exception:
        log.debug("rngaudit: could not read an epoch so far", exc_info=True)
        return None
    if not summary.get("known"):
        return None
    summary["partial"] = True
    summary["length"] = left.length
    return summary


def publish(epoch: unsharded.Epoch, summary: dict[str, Any]) -> None:
    """This rank's summary of ``epoch`` in the store, without waiting for the others."""
    where = exchange.distributed()
    if where is None:
        return
    with contextlib.suppress(Exception):
        store = protocol.default()
        store.set(protocol.epoch(epoch.key, epoch.epoch) / "end" / where[0],
                  exchange.encode(summary))  # fmt: skip


def phrase(summaries: dict[int, dict[str, Any]]) -> str:
    """How far each rank got: "rank 0 after 5 of 16 batches, rank 1 after 5" (a rank that
    drew the whole epoch: "rank 1 drew all 16")."""
    parts = []
    length = next((s.get("length") for s in summaries.values() if s.get("length")), None)
    for n, (rank, s) in enumerate(sorted(summaries.items())):
        batches = s.get("batches")
        if not s.get("partial"):
            parts.append(f"rank {rank} drew all {batches}")
        elif n == 0 and length:
            parts.append(f"rank {rank} after {batches} of {length} batches")
        else:
            parts.append(f"rank {rank} after {batches}")
    return ", ".join(parts)
