"""The per-batch cost of a keyed loader: an IterableDataset loop, keyed against the same unkeyed.

One process, one rank of a world played on a real in-memory store (``torch.distributed``'s
``HashStore``; a keyed loader is observed only in a run of several ranks, and the per-batch
path is the same whatever the world). Two loaders over the same stream of dicts (``"id"`` and an
8-float ``"x"``, a tiny matmul per batch): one built in an ``rngaudit.audit()`` block and keyed
by ``rngaudit.sample_key(loader, "id")``, the other never audited. Epochs alternate (ABAB) after
one warm-up each; each epoch of the keyed loader ends in its publication and comparison (its
cost is in the epoch's time). Prints one JSON object: per batch size the median epoch of each
arm, their ratio, and the keyed work alone per batch (timed in a loop: robust at any load) with
its share of the unaudited epoch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=32_768)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--batch-sizes", default="1,32,256")
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, IterableDataset

    import rngaudit
    from rngaudit.epochs import keyed as keyed_module
    from rngaudit.ranks import exchange

    store = dist.HashStore()  # type: ignore[attr-defined]
    exchange.distributed = lambda: (0, 1)  # type: ignore[assignment]
    exchange._store = lambda: store

    class Stream(IterableDataset[dict[str, Any]]):
        def __init__(self, n: int) -> None:
            self.n = n
            self.x = torch.randn(n, 8)

        def __iter__(self) -> Iterator[dict[str, Any]]:
            for i in range(self.n):
                yield {"id": i, "x": self.x[i]}

    weight = torch.randn(8, 8)

    def epoch(loader: Any) -> float:
        t0 = time.perf_counter()
        for batch in loader:
            (batch["x"] @ weight).sum()
        return time.perf_counter() - t0

    out: dict[str, Any] = {"samples": args.samples, "pairs": args.pairs, "batch_sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for size in (int(s) for s in args.batch_sizes.split(",")):
            data = Stream(args.samples)
            plain = DataLoader(data, batch_size=size)
            with rngaudit.audit(report_dir=Path(tmp) / str(size), mode="report"):
                keyed = rngaudit.sample_key(DataLoader(data, batch_size=size), "id")
            epoch(plain), epoch(keyed)  # warm-up
            times: dict[str, list[float]] = {"plain": [], "keyed": []}
            for _ in range(args.pairs):
                times["plain"].append(epoch(plain))
                times["keyed"].append(epoch(keyed))
            a, b = statistics.median(times["plain"]), statistics.median(times["keyed"])
            batches = -(-args.samples // size)
            # the keyed work alone, per batch (robust at any load): the ids of one collated
            # batch read and kept, as the keyed iterator's __next__ does after the original
            batch = next(iter(plain))
            kept = keyed_module.Taken()
            reps = 20_000 if size < 256 else 5_000
            t0 = time.perf_counter()
            for _ in range(reps):
                kept.add(keyed_module.read(batch, "id"))
            direct = (time.perf_counter() - t0) / reps
            out["batch_sizes"][str(size)] = {
                "plain_epoch_s": round(a, 4),
                "keyed_epoch_s": round(b, 4),
                "ratio": round(b / a, 3),
                "per_batch_us": round((b - a) / batches * 1e6, 2),
                "keyed_work_us": round(direct * 1e6, 2),
                "keyed_work_share": round(direct * batches / a, 4),
                "ratios": [
                    round(k / p, 3) for p, k in zip(times["plain"], times["keyed"], strict=True)
                ],
            }
    rngaudit.wait_for_reports()
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
