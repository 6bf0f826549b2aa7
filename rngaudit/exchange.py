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


def process_group() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised (any world size)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def distributed() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised with more than one rank."""
    where = process_group()
    if where is None or where[1] <= 1:
        return None
    return where


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


def exchange(
    record: dict[str, Any], key: str, timeout: float, fetch_all: bool = False
) -> Exchanged:
    """Publish this rank's record under ``key`` and collect the others', within ``timeout``.

    Works for any backend (gloo, nccl): the data goes through the store, not a collective,
    so a missing rank cannot hang the others and can be named. Each rank publishes its
    record, then its signature (``record["signature"]``); ranks wait for the signatures and
    fetch full records only from the lowest rank of each signature group, unless
    ``fetch_all`` (rank 0, which writes the merged report). The ranks not fetched come back
    as stubs ``{"rank", "signature", "same_as", "events": []}``: equal signatures mean equal
    records for the comparison.
    """
    where = distributed()
    if where is None:
        return Exchanged([record], 1, 0, [], 0.0)
    rank, world = where
    store = _store()
    rec_keys = [f"{KEY_PREFIX}/{key}/record/{r}" for r in range(world)]
    sig_keys = [f"{KEY_PREFIX}/{key}/signature/{r}" for r in range(world)]
    signature = str(record.get("signature", ""))
    store.set(rec_keys[rank], encode(record))
    store.set(sig_keys[rank], signature.encode())  # after the record: a signature means both
    start = time.monotonic()
    others = [r for r in range(world) if r != rank]
    try:
        store.wait([sig_keys[r] for r in others], timedelta(seconds=timeout))
        missing: list[int] = []
    except Exception:  # the store's timeout (DistStoreError): find out who is missing
        missing = [r for r in others if not store.check([sig_keys[r]])]
    arrived = [r for r in others if r not in missing]
    signatures = {
        r: bytes(v).decode()
        for r, v in zip(arrived, _get_all(store, [sig_keys[r] for r in arrived]), strict=True)
    }
    signatures[rank] = signature
    first_of: dict[str, int] = {}
    for r in sorted(signatures):
        first_of.setdefault(signatures[r], r)
    wanted = [r for r in arrived if fetch_all or not signature or first_of[signatures[r]] == r]
    received = dict(zip(wanted, _get_all(store, [rec_keys[r] for r in wanted]), strict=True))
    records: list[dict[str, Any]] = []
    for r in sorted(signatures):
        if r == rank:
            records.append(record)
        elif r in received:
            records.append(decode(received[r]))
        else:
            same_as = first_of[signatures[r]]
            records.append(
                {"rank": r, "signature": signatures[r], "same_as": same_as, "events": []}
            )
    return Exchanged(records, world, rank, missing, time.monotonic() - start)


def _get_all(store: Any, keys: list[str]) -> list[bytes]:
    if not keys:
        return []
    if hasattr(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(k) for k in keys]
