"""Cross-rank exchange of rank records: JSON through the process group's store, with a timeout."""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import dataclass
from typing import Any

KEY_PREFIX = "rngaudit"


@dataclass
class Exchanged:
    """What came back: the records of the ranks that arrived, and who did not."""

    records: list[dict[str, Any]]
    world_size: int
    rank: int
    missing: list[int]
    waited: float


def distributed() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised with more than one rank."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    world = int(dist.get_world_size())
    if world <= 1:
        return None
    return int(dist.get_rank()), world


def _store() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d._get_default_store()


def encode(record: dict[str, Any]) -> bytes:
    return zlib.compress(json.dumps(record, sort_keys=True).encode("utf-8"))


def decode(payload: bytes) -> dict[str, Any]:
    data = json.loads(zlib.decompress(payload).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("rank record is not a JSON object")
    return data


def exchange(record: dict[str, Any], key: str, timeout: float) -> Exchanged:
    """Publish this rank's record under ``key`` and collect every rank's, within ``timeout``.

    Works for any backend (gloo, nccl): the data goes through the store, not a collective,
    so a missing rank cannot hang the others and can be named.
    """
    where = distributed()
    if where is None:
        return Exchanged([record], 1, 0, [], 0.0)
    rank, world = where
    store = _store()
    keys = [f"{KEY_PREFIX}/{key}/{r}" for r in range(world)]
    store.set(keys[rank], encode(record))
    start = time.monotonic()
    deadline = start + timeout
    pending = set(range(world))
    pending.discard(rank)
    delay = 0.005
    while pending:
        for r in sorted(pending):
            if store.check([keys[r]]):
                pending.discard(r)
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(delay)
        delay = min(delay * 2, 0.1)
    records: list[dict[str, Any]] = []
    for r in range(world):
        if r == rank:
            records.append(record)
        elif r not in pending:
            records.append(decode(store.get(keys[r])))
    return Exchanged(records, world, rank, sorted(pending), time.monotonic() - start)
