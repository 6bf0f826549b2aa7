"""Cross-rank exchange of rank records: JSON through the process group's store, with a timeout."""

from __future__ import annotations

import json
import sys
import time
import zlib
from dataclasses import dataclass
from datetime import timedelta
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
    others = [r for r in range(world) if r != rank]
    try:
        store.wait([keys[r] for r in others], timedelta(seconds=timeout))
        missing: list[int] = []
    except Exception:  # the store's timeout (DistStoreError): find out who is missing
        missing = [r for r in others if not store.check([keys[r]])]
    arrived = [r for r in others if r not in missing]
    payloads = _get_all(store, [keys[r] for r in arrived])
    received = dict(zip(arrived, payloads, strict=True))
    records = [
        record if r == rank else decode(received[r]) for r in range(world) if r not in missing
    ]
    return Exchanged(records, world, rank, missing, time.monotonic() - start)


def _get_all(store: Any, keys: list[str]) -> list[bytes]:
    if not keys:
        return []
    if hasattr(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(k) for k in keys]
