"""Peers of one replica take the same batch; replicas are judged as one rank each."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from rngaudit import findings as fk
from rngaudit.capture import batch_digest
from rngaudit.findings import Finding
from rngaudit.ranks import exchange, layout

log = logging.getLogger("rngaudit")

REMEDY = (
    "Shard by the data-parallel rank, not the global one: "
    "DistributedSampler(ds, num_replicas=mesh['dp'].size(), rank=mesh['dp'].get_local_rank()) "
    "(the data-parallel dims of your DeviceMesh, flattened if several), so that every peer of "
    "one replica (tensor-, context-, pipeline-parallel) takes the same batch. Declare the "
    "groups with rngaudit.audit(groups=...) or RNGAUDIT_DP_GROUPS where no mesh says them."
)


def _world() -> int:
    where = exchange.distributed()
    return int(where[1]) if where is not None else 1


def first_fields(shard: Any, batch: Any) -> dict[str, Any]:
    """What a rank adds to its first-batch record where the program states peers (a mesh's
    tensor-, context-, pipeline-parallel dims, or declared groups): the sampler's
    ``[num_replicas, rank]`` and a digest of the batch it returned (the batch the step trains
    on; never read beyond what the loader already returned). Empty otherwise (the record,
    and its cost, as without a mesh). The samplers' own statement is not enough here: ranks a
    sampler hands the same indices may read different samples by design (a dataset picking
    its part by rank); it only lets identical peers count as one replica at the epoch's end."""
    with contextlib.suppress(Exception):
        world = _world()
        stated = layout.current(world)
        if world < 2 or stated is None or not stated.has_peers():
            return {}
        return {
            "peer": {"sampler": layout.sampler_rank(shard), "digest": batch_digest.digest(batch)}
        }
    return {}


def _sampler_ranks(records: list[dict[str, Any]]) -> dict[int, Any]:
    out: dict[int, Any] = {}
    for r in records:
        peer = r.get("peer")
        sampler = peer.get("sampler") if isinstance(peer, dict) else None
        if sampler is None:
            sampler = r.get("sampler")
        if isinstance(sampler, list) and len(sampler) == 2:
            out[int(r["rank"])] = sampler
    return out


def check_first(records: list[dict[str, Any]], loader: str, chain: str) -> list[Finding]:
    """An error when peers of one replica (the layout the program states) were handed
    different first batches: the evidence is the batches' content, compared by digest."""
    if not any(isinstance(r.get("peer"), dict) for r in records):
        return []
    world = len(records)
    stated = layout.current(world)  # the program's statement: declared, or the mesh
    if stated is None or not stated.has_peers() or len(stated.replica) != world:
        return []
    digests = {
        int(r["rank"]): (r.get("peer") or {}).get("digest")
        for r in records
        if isinstance(r.get("peer"), dict)
    }
    split: list[list[int]] = []
    for group in stated.groups():
        seen = {digests[r] for r in group if digests.get(r) is not None}
        if len(seen) > 1:
            split.append(group)
    if not split:
        return []
    sampler = _sampler_ranks(records)
    said = ""
    if sampler:
        n = {v[0] for v in sampler.values()}
        said = (
            f" Its sampler shards over num_replicas={'/'.join(str(x) for x in sorted(n))} "
            f"replicas (ranks {', '.join(f'{k}: {v[1]}' for k, v in sorted(sampler.items()))})."
        )
    groups = "; ".join(", ".join(str(r) for r in g) for g in split)
    message = (
        f"The peers of one replica were handed different batches at the first batch of "
        f"{loader} ({chain}): ranks {groups} must train on the same batch ({stated.source}), "
        f"and the batches they are about to train on differ.{said} Each replica's model "
        "parts would combine activations and gradients of different samples."
    )
    return [
        Finding(
            kind=fk.PEER_BATCH_DIVERGENCE,
            severity="error",
            message=message,
            ranks=sorted(r for g in split for r in g),
            remedy=REMEDY,
            details={
                "loader": loader,
                "chain": chain,
                "layout": stated.as_dict(),
                "differing": split,
            },
        )
    ]


def label(records: list[dict[str, Any]]) -> str:
    """`` across <the layout>`` for a first-batch check whose peers were compared, else ""."""
    with contextlib.suppress(Exception):
        if any(isinstance(r.get("peer"), dict) for r in records):
            stated = layout.current(len(records))
            if stated is not None:
                return f" across {stated.describe()}"
    return ""


def end_fields(shard: Any) -> dict[str, Any]:
    """What a rank adds to its epoch-end partition record: its sampler's statement."""
    mine = layout.sampler_rank(shard)
    return {"sampler": mine} if mine is not None else {}


def as_replicas(
    summaries: dict[int, dict[str, Any]], records: list[dict[str, Any]]
) -> tuple[dict[int, dict[str, Any]], layout.Layout | None]:
    """The partition summaries judged across replicas: the peers of one replica that took
    exactly the same samples count as one rank (the lowest); peers that differ are kept,
    every one, as the world would judge them. Unchanged without a stated layout."""
    world = len(summaries)
    try:
        stated = layout.current(world, _sampler_ranks(records))
    except Exception:
        return summaries, None
    if stated is None or not stated.has_peers() or set(stated.replica) != set(summaries):
        return summaries, None
    out: dict[int, dict[str, Any]] = {}
    for group in stated.groups():
        first = summaries[group[0]]
        if all(summaries[r] == first for r in group):
            out[group[0]] = first
        else:
            out.update({r: summaries[r] for r in group})
    return out, stated
