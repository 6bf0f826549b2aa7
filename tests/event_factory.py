"""The one factory of hand-written events for the tests, in the shape the producer writes."""

from __future__ import annotations

from typing import Any, cast

from rngaudit.schema import DRAW, PRE_ITERATION, CallSiteDict, Event, SamplerDict


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
