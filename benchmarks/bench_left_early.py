"""What reading an epoch left early costs: per batch (the count zipped into each teed segment)
and once per epoch left (the fold of the tee's buffer and the summary), in one process.

Per batch: the index batches of an epoch (batches of 32 Python ints) pulled through a chain of
segments as ``IndexBatches._segments`` builds them, with ``handed.segment`` (an observed epoch:
``map(itemgetter(0), zip(islice(tee, 256), count()))``) against a plain ``islice`` (a sharded
loader's, as before), least of ``--rounds``. Once per epoch: a teed epoch of 40,000 samples left
after ``--taken`` batches, folded (``handed.fold``: the segment's batches read from the tee's
buffer, mapped into the bitmap, the summary) and the ``weakref.finalize`` that watches its
iterator, made and detached. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import numpy as np

from rngaudit.epochs import handed, partition

N = 40_000
BATCH = 32


class _Holder:
    """Stands in for a DataLoader iterator (a weakly referenceable object)."""


def _epoch() -> list[list[int]]:
    perm = np.random.default_rng(0).permutation(N)
    return [perm[i : i + BATCH].tolist() for i in range(0, N, BATCH)]


def _per_batch(batches: list[list[int]], observed: bool) -> float:
    tape = partition.Tape([], N)
    if observed:
        tape.left = handed.Left(0, len(batches))
    first, second = itertools.tee(iter(batches))

    def segments() -> Any:
        while True:
            if observed:
                yield handed.segment(first, partition.FOLD, tape)
            else:
                yield itertools.islice(first, partition.FOLD)
            held = list(itertools.islice(second, partition.FOLD))  # the buffer, not folded here
            if len(held) < partition.FOLD:
                return

    start = time.perf_counter()
    for _ in itertools.chain.from_iterable(segments()):
        pass
    return (time.perf_counter() - start) / len(batches)


def _fold(batches: list[list[int]], taken: int) -> tuple[float, int]:
    tape = partition.Tape([], N)
    tape.left = handed.Left(0, len(batches))
    first, second = itertools.tee(iter(batches))
    tape.left.second = second
    pulled = list(itertools.islice(handed.segment(first, partition.FOLD, tape), taken))
    start = time.perf_counter()
    summary = handed.fold(tape)
    spent = time.perf_counter() - start
    assert summary is not None and summary["batches"] == len(pulled)
    return spent, int(summary["batches"])


def _watch() -> float:
    holders = [_Holder() for _ in range(1000)]
    tapes = [partition.Tape([], 8) for _ in holders]
    start = time.perf_counter()
    for holder, tape in zip(holders, tapes, strict=True):
        handed.watch(holder, tape, lambda t: None)
        handed.done(tape)
    return (time.perf_counter() - start) / len(holders)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--taken", type=int, default=200, help="batches taken before leaving")
    args = parser.parse_args()
    batches = _epoch()
    plain, counted, folds = [], [], []
    for _ in range(args.rounds):
        plain.append(_per_batch(batches, False))
        counted.append(_per_batch(batches, True))
        folds.append(_fold(batches, args.taken)[0])
    out = {
        "batches": len(batches),
        "per_batch_plain_ns": round(min(plain) * 1e9, 1),
        "per_batch_counted_ns": round(min(counted) * 1e9, 1),
        "per_batch_added_ns": round((min(counted) - min(plain)) * 1e9, 1),
        "fold_ms": round(min(folds) * 1e3, 3),
        "taken": args.taken,
        "watch_us_per_epoch": round(min(_watch() for _ in range(5)) * 1e6, 2),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
