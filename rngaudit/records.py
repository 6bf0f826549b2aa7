"""The record schema: typed shapes of events, loaders and rank records, in memory and on disk."""

from __future__ import annotations

from typing import Any, TypedDict

# docs/report-format.md describes these fields in words; this module is their one definition.


class CallSiteDict(TypedDict):
    """A source location (``CallSite.to_dict()``)."""

    file: str
    line: int
    function: str


class SamplerDict(TypedDict):
    """The sampler (and loader) a draw was made for (``SamplerInfo.to_dict()``)."""

    chain: str
    loader: str | None
    output_digest: str | None


class Event(TypedDict):
    """One aggregated draw, seeding or state operation (``events.Event.to_dict()``)."""

    seq: int
    audit: int
    generator: str  # named by rngaudit.naming
    op: str
    kind: str  # events.DRAW, SEED, STATE or CREATE
    call_site: CallSiteDict | None
    chain: list[CallSiteDict]
    user_call_site: CallSiteDict | None
    count: int
    fingerprint: str | None  # fingerprint.py: 8 hex digits
    thread: str
    pid: int
    phase: str  # events.PRE_ITERATION or ITERATION
    sampler: SamplerDict | None


class _LoaderBase(TypedDict):
    loader: str
    num_workers: int
    sampler: str | None  # the sampler chain, outermost first: "BatchSampler > RandomSampler"
    generator: str
    drew_before_iteration: bool
    fingerprint: str | None
    output_digest: str | None


class Loader(_LoaderBase, total=False):
    """A DataLoader built in an audit window (``record.summarize_loaders``)."""

    audit: int  # added when the rank file accumulates audits


class RankRecord(TypedDict, total=False):
    """One rank's record: exchanged and compared per audit, accumulated in its rank file.

    ``record.rank_record`` builds pid..framework; the session adds rank, run_id, audit_index
    and signature before the exchange. A rank whose record was not fetched (equal to another)
    arrives as a stub: rank, signature, same_as and an empty events list. The rank file and
    the merged report's ``ranks`` keep rank, pid, host, events, loaders, states, run_id,
    environment, and exception / same_as when set.
    """

    rank: int
    pid: int
    host: str
    label: str
    events: list[Event]
    loaders: list[Loader]
    states: dict[str, dict[str, Any]]  # "entry" / "exit": generator name -> fingerprint
    initial_seeds: dict[str, Any]
    from_start: bool
    exception: str | None
    environment: dict[str, Any] | None
    framework: str
    run_id: str
    audit_index: int
    signature: str
    same_as: int | None
