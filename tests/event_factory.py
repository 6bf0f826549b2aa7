"""The one factory of hand-written events for the tests, in the shape the producer writes."""

from __future__ import annotations

from typing import Any, cast

from rngaudit.schema import DRAW, PRE_ITERATION, CallSiteDict, EpochRecord, Event, SamplerDict


def site(file: str, line: int, function: str = "main") -> CallSiteDict:
    return {"file": file, "line": line, "function": function}


def make_event(
    seq: int,
    *,
    call_site: CallSiteDict | None = None,
    user_call_site: CallSiteDict | None = None,
    chain: list[CallSiteDict] | None = None,
    sampler: SamplerDict | None = None,
    **fields: Any,
) -> Event:
    """A draw event of ``torch.default_generator`` (``aten.uniform_``, as ``torch.rand`` is
    recorded); ``fields`` override any other field of :class:`~rngaudit.schema.Event`."""
    chain = chain if chain is not None else [s for s in (call_site, user_call_site) if s]
    event: dict[str, Any] = {
        "seq": seq,
        "audit": 0,
        "generator": "torch.default_generator",
        "op": "aten.uniform_",
        "kind": DRAW,
        "call_site": call_site,
        "chain": chain,
        "user_call_site": user_call_site,
        "count": 1,
        "fingerprint": "0000abcd",
        "thread": "MainThread",
        "pid": 1,
        "phase": PRE_ITERATION,
        "sampler": sampler,
    }
    unknown = set(fields) - set(event) - {"aggregated"}
    assert not unknown, f"not fields of an event: {sorted(unknown)}"
    event.update(fields)
    return cast(Event, event)


def epoch_record(rank: int, seed: int, dataset: Any, epoch: int = 0) -> EpochRecord:
    """Rank ``rank``'s record of one epoch of ``dataset``: the order a seeded RandomSampler
    really draws, in batches of 4, as the order check records it."""
    import torch
    from torch.utils.data import BatchSampler, RandomSampler

    from rngaudit.epochs import sharding

    batches = BatchSampler(
        RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)), 4, False
    )
    tape = sharding.OrderTape()
    for batch in batches:
        tape.add(list(batch))
    return {
        "loader": "DataLoader#1",
        "epoch": epoch,
        "chain": "BatchSampler > RandomSampler",
        "shuffling": True,
        "dataset": sharding.describe_dataset(dataset),
        "content": "",
        "sampler_state": None,
        "position": 0,
        "order": tape.batches,
        "draws": [],
        "rank": rank,
    }
