"""The record schema: typed shapes of events, loaders and rank records, in memory and on disk."""

from __future__ import annotations

from typing import Any, TypedDict

DRAW, SEED, STATE, CREATE = "draw", "seed", "state", "create"  # event kinds
PRE_ITERATION, ITERATION = "pre-iteration", "iteration"  # event phases

# docs/report-format.md describes these fields in words; this module is their one definition.
# The producer writes every field of Event, Loader, SamplerDict and CallSiteDict. A report read
# from disk (reports.reading) is checked against these classes field by field, but it needs only
# the fields reports.reading names as required: a file written by hand or by an older rngaudit may
# lack the others or hold null, so code that reads a loaded report uses .get() with a fallback.


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


class AggregateDict(TypedDict):
    """What an event of the generators beyond the named ones adds (``Event.aggregated``)."""

    last_fingerprint: str | None  # the state before the last draw folded in
    digest: str  # crc32 chained over every folded state, in order: 8 hex digits


class _EventBase(TypedDict):
    seq: int
    audit: int
    generator: str  # named by rngaudit.capture.naming
    op: str
    kind: str  # DRAW, SEED, STATE or CREATE (above)
    call_site: CallSiteDict | None
    chain: list[CallSiteDict]
    user_call_site: CallSiteDict | None
    count: int
    fingerprint: str | None  # fingerprint.py: 8 hex digits
    thread: str
    pid: int
    phase: str  # PRE_ITERATION or ITERATION (above)
    sampler: SamplerDict | None


class Event(_EventBase, total=False):
    """One aggregated draw, seeding or state operation (``event_log.Event.to_dict()``)."""

    aggregated: AggregateDict  # only on a "<family>#>N" generator's event (naming.is_aggregate)


class _LoaderBase(TypedDict):
    loader: str
    num_workers: int
    sampler: str | None  # the sampler chain, outermost first: "BatchSampler > RandomSampler"
    generator: str
    drew_before_iteration: bool
    fingerprint: str | None
    output_digest: str | None


class Loader(_LoaderBase, total=False):
    """A DataLoader built in an audit window (``rank_record.summarize_loaders``)."""

    audit: int  # added when the rank file accumulates audits
    samples: dict[str, Any]  # partition.dataset_samples: its root samples, when it holds a Subset


class EnvironmentDict(TypedDict):
    """What a rank ran with, for ``rngaudit diff`` (``environment.describe()``)."""

    python: str
    packages: dict[str, str | None]  # distribution -> version, None when not installed
    seeds: dict[str, int]  # generator name -> the seed it was last seeded with
    variables: dict[str, str]  # PYTHONHASHSEED, CUBLAS_WORKSPACE_CONFIG when set


class RankRecord(TypedDict, total=False):
    """One rank's record: exchanged and compared per audit, accumulated in its rank file.

    ``rank_record.rank_record`` builds pid..framework; the session adds rank, run_id, audit_index
    and signature before the exchange. A rank whose record was not fetched (equal to another)
    arrives as a stub: rank, signature, same_as and an empty events list. The rank file and
    the merged report's ``ranks`` keep rank, pid, host, events, loaders, states, run_id,
    environment, and exception / same_as when set.
    """

    rank: int
    pid: int | None  # None (null) in the files for a same_as stub
    host: str | None
    label: str
    events: list[Event]
    loaders: list[Loader]
    states: dict[str, dict[str, str | None]]  # "entry" / "exit": generator name -> fingerprint
    initial_seeds: dict[str, int]  # generator name -> the seed it was last seeded with
    from_start: bool
    exception: str | None
    environment: EnvironmentDict | None
    framework: str
    run_id: str
    audit_index: int
    signature: str
    same_as: int | None


# The order check's record (exchanged at each epoch's first batch, never written to a file).


class SamplerDraw(TypedDict):
    """A sampler draw that made an epoch's order (``epochs.surgery.draw_summary``)."""

    op: str | None
    generator: str | None
    fingerprint: str | None
    output_digest: str | None
    call_site: CallSiteDict | None
    user_call_site: CallSiteDict | None
    sampler: str | None  # the sampler chain


class _EpochBase(TypedDict):
    loader: str  # "DataLoader#1"
    epoch: int  # the check's number for this loader (0 at its first batch)
    chain: str  # the sampler chain, outermost first
    shuffling: bool
    dataset: str  # sharding.describe_dataset: structure and index mapping
    content: str  # sharding.describe_content: what the rows hold (may differ by design)
    sampler_state: dict[str, Any] | None  # a DistributedSampler's seed, epoch, sizes
    position: int  # batches yielded in the epoch at its first batch (more after a resume)
    order: list[str]  # crc32 of the first batches of the order before sharding
    draws: list[SamplerDraw]


class EpochRecord(_EpochBase, total=False):
    """One rank's record of one epoch of one sharded loader; the exchange adds ``rank``."""

    rank: int
    dataset_draws: list[SamplerDraw]  # the random_split draw behind the dataset, if any
    shares: list[str]  # a stream split by shards: digests of the shards this rank reads
    signature: str  # everything the rules read but the rank: equal ranks share it


# The report files. Fields of a ``total=False`` class may be absent (the producer does not
# always write them); a base class holds the required ones (no ``NotRequired``: Python 3.10).


class _FindingBase(TypedDict):
    kind: str  # findings.KINDS
    severity: str  # findings.SEVERITIES
    message: str


class FindingDict(_FindingBase, total=False):
    """A finding as the files hold it (``Finding.to_dict()``): ranks and audit when known, the
    last five when known."""

    ranks: list[int]
    audit: int
    generator: str
    call_site: CallSiteDict
    user_call_site: CallSiteDict
    remedy: str
    details: dict[str, Any]  # fingerprints per rank, sampler, loader, worker ids, ...


class _AuditBase(TypedDict):
    index: int


class AuditDict(_AuditBase, total=False):
    """One audit (or per-epoch check) of a process, in the files' ``audits``."""

    label: str
    verdict: str  # "ok", "warning" or "error"
    mode: str  # with strict: what every rank acted on, when the ranks' modes differed
    strict: bool
    deferred: list[str] | bool  # audits that waited for the process group; True:
    # this audit itself is waiting (only on the report an audit returns, never in a file)


class _ReportBase(TypedDict):
    schema_version: int  # audit_report.SCHEMA_VERSION
    run_id: str
    world_size: int
    findings: list[FindingDict]
    ranks: list[RankRecord]


class ReportDict(_ReportBase, total=False):
    """``report.json``, written by rank 0 (``AuditReport.to_dict()``)."""

    verdict: str
    mode: str  # config.MODES
    audits: list[AuditDict]


class _RankFileBase(TypedDict):
    schema_version: int
    run_id: str
    world_size: int
    rank: int
    findings: list[FindingDict]
    record: RankRecord


class RankFileDict(_RankFileBase, total=False):
    """``rank-<R>.json``, written by every rank: its findings and its accumulated record."""

    mode: str
    verdict: str
    audits: list[AuditDict]
