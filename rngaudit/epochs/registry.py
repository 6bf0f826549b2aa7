"""What the epoch checks watch: the watches open now, and each loader's state on this rank."""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rngaudit import forksafe, library_samplers, peek, schema
from rngaudit.audit_report import AuditReport
from rngaudit.capture import naming
from rngaudit.capture.recorder import RECORDER
from rngaudit.config import Settings
from rngaudit.epochs import partition, sharding, unsharded
from rngaudit.findings import Finding
from rngaudit.ranks.policy import act, fails

log = logging.getLogger("rngaudit")


@dataclass
class Watch:
    """How to act on one loader's checks."""

    settings: Settings
    session: Any  # rngaudit.ranks.session.Session
    every_epoch: bool
    # Called on every rank (with the check's label) before a check raises: the whole-run
    # audit concludes its open window there, so the report holds every rank's events even if
    # the program is then killed before its exit handlers run.
    before_raise: Callable[[str], None] | None = None

    def act(self, found: list[Finding], label: str) -> None:
        """Raise or warn on every rank, as this watch's mode says (``label``: what was
        checked)."""
        if not found:
            return
        session = self.session
        if self.before_raise is not None and any(
            fails(f, self.settings.mode, self.settings.strict) for f in found
        ):
            try:
                self.before_raise(label)
            except Exception:  # the check's own verdict still stands and is raised
                log.warning("rngaudit: could not conclude the audit window", exc_info=True)
        report = AuditReport(
            findings=found,
            world_size=int(getattr(session, "world_size", 1)),
            run_id=str(getattr(session, "run_id", "")),
            mode=self.settings.mode,
            audits=[{"index": found[0].audit, "label": label}],
        )
        act(report, self.settings.mode, self.settings.strict)


@dataclass
class ObservedLoader:
    """A loader no known class shards, whose epochs are published and compared lazily."""

    key: str
    label: str
    identity: str
    epochs: int = 0
    scanned: bool = False  # the heap searched once for data-parallel modules
    open: Any = None  # weakref.ref to the tape of its latest epoch on this rank
    shards: bool = False  # a sampler of its chain holds this rank and the world: it shards

    def described(self, tape: partition.Tape) -> dict[str, Any]:
        """What the ranks compare of an epoch of it besides the samples taken: its root's
        identity, the levels of ``tape``'s index mapping (datasets of the ranks' own) and
        whether a sampler of its chain shards it."""
        return {
            "identity": self.identity,
            "levels": tape.levels,
            "shards_self": self.shards,
        }


@dataclass
class LoaderState:
    """A loader a known class shards, as this rank checks it."""

    index: int
    label: str
    checks: int = 0
    previous: schema.EpochRecord | None = None
    tape: sharding.OrderTape = field(default_factory=sharding.OrderTape)


@dataclass(eq=False)
class ShardedEpoch:
    """What a tape observes: one epoch of a loader a known class shards."""

    watch: Watch
    shard: Any
    chain: str
    epoch: int


@dataclass(eq=False)
class ObservedEpoch:
    """What a tape observes: one epoch of a loader no known class shards."""

    watch: Watch
    epoch: unsharded.Epoch
    loader: ObservedLoader
    training: bool


class Registry:
    """Process-wide: the watches, and the loaders, tapes and iterators watched under them."""

    def __init__(self) -> None:
        self.lock = forksafe.lock()
        self.everything: Watch | None = None  # RNGAUDIT: every sharded loader
        self.open: list[Watch] = []  # with-blocks open now: sharded loaders in them
        self.pending: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()
        self.loaders: weakref.WeakKeyDictionary[Any, LoaderState] = weakref.WeakKeyDictionary()
        self.seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.tapes: weakref.WeakSet[partition.Tape] = weakref.WeakSet()  # epochs observed now
        # loaders no known class shards, built in a with-block: index sampler -> its watch
        self.observing: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()
        self.observed: weakref.WeakKeyDictionary[Any, ObservedLoader] = weakref.WeakKeyDictionary()
        self._occurrences: dict[str, int] = {}
        self._count = 0

    def watch_for(self, shard: Any) -> Watch | None:
        """The watch of a sharded loader's shard (with the lock held)."""
        watch = self.pending.get(shard)
        if watch is not None:
            return watch
        if self.open:
            return self.open[-1]
        return self.everything

    def watch_of(self, index: Any) -> Watch | None:
        """The watch of a loader no known class shards, by its index sampler (lock held)."""
        return self.observing.get(index) or (self.open[-1] if self.open else self.everything)

    def state(self, shard: Any) -> LoaderState:
        """The state of the loader ``shard`` shards (with the lock held)."""
        state = self.loaders.get(shard)
        if state is None:
            # the store keys number the loader in the order this rank first checks it (the
            # same on every rank); its label is the loader's one name (naming.LOADERS), or the
            # shard's own for a loader never seen built (``DistributedSampler#1``)
            self._count += 1
            label = loader_label(shard) or naming.LOADERS.name(shard)
            state = LoaderState(self._count, label)
            self.loaders[shard] = state
        return state

    def occurrence(self, base: str) -> int:
        """How many loaders of identity ``base`` this rank met before (lock held)."""
        occurrence = self._occurrences.get(base, 0)
        self._occurrences[base] = occurrence + 1
        return occurrence

    def idle(self) -> bool:
        """Whether nothing is watched any longer (with the lock held)."""
        return (
            self.everything is None
            and not self.open
            and not any(True for _ in self.pending)  # live keys: a finalizer runs before the
            and not any(True for _ in self.observing)  # dictionary forgets the dead one
            and not any(not t.closed for t in self.tapes)
        )


def loader_label(part: Any) -> str | None:
    """The one label (:data:`~rngaudit.capture.naming.LOADERS`) of the loader whose sampler
    chain holds ``part`` (its shard or index sampler) or whose dataset is ``part`` (a stream
    shard): among the loaders named so far and those built in the open window."""
    return naming.LOADERS.find(part, _holds, RECORDER.built_loaders())


def _holds(loader: Any, part: Any) -> bool:
    chain = library_samplers.loader_chain(loader)
    return any(s is part for s in chain) or peek.attr(loader, "dataset") is part
