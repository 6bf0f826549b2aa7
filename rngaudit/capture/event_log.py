"""Events: one record per (generator, op, call site), aggregated with counts, thread-safe."""

from __future__ import annotations

import itertools
import os
import zlib
from dataclasses import dataclass
from typing import Any

from rngaudit import forksafe, schema
from rngaudit.capture import fingerprint
from rngaudit.capture.callsite import CallSite
from rngaudit.schema import CREATE as CREATE
from rngaudit.schema import DRAW as DRAW
from rngaudit.schema import ITERATION as ITERATION
from rngaudit.schema import PRE_ITERATION as PRE_ITERATION
from rngaudit.schema import SEED as SEED
from rngaudit.schema import STATE as STATE


@dataclass
class SamplerInfo:
    """The sampler (and loader) a draw was made for, and a digest of what it drew."""

    chain: str
    loader: str | None = None
    output_digest: str | None = None

    def to_dict(self) -> schema.SamplerDict:
        return {"chain": self.chain, "loader": self.loader, "output_digest": self.output_digest}


@dataclass(slots=True)
class Event:
    """An aggregated draw, seeding or state operation on one generator at one call site."""

    seq: int
    audit: int
    generator: str
    op: str
    kind: str
    call_site: CallSite | None
    chain: tuple[CallSite, ...]
    user_call_site: CallSite | None
    fingerprint: str | None
    thread: str
    pid: int
    phase: str
    sampler: SamplerInfo | None = None
    count: int = 1
    # Only for generators beyond the named ones (naming.is_aggregate): the last state seen and
    # a crc32 chained over every state seen, in order, so unequal generators still differ.
    last_fingerprint: str | None = None
    digest: int | None = None
    # A torch state read before the first draw and not hashed yet (the recorder defers the
    # hash off the draw path): hashed into ``fingerprint`` when the event is first read.
    state: Any = None

    def start_aggregate(self) -> None:
        self.digest = 0
        self.fold(self.fingerprint)

    def fold(self, fingerprint: str | None) -> None:
        self.last_fingerprint = fingerprint
        self.digest = zlib.crc32(str(fingerprint).encode(), self.digest or 0)

    def to_dict(self) -> schema.Event:
        if self.state is not None:
            state, self.state = self.state, None
            try:
                self.fingerprint = fingerprint.torch_state_hex(state)
            except Exception:  # a state that cannot be hashed is unknown, as when read
                self.fingerprint = None
        out: schema.Event = {
            "seq": self.seq,
            "audit": self.audit,
            "generator": self.generator,
            "op": self.op,
            "kind": self.kind,
            "call_site": self.call_site.to_dict() if self.call_site else None,
            "chain": [c.to_dict() for c in self.chain],
            "user_call_site": self.user_call_site.to_dict() if self.user_call_site else None,
            "count": self.count,
            "fingerprint": self.fingerprint,
            "thread": self.thread,
            "pid": self.pid,
            "phase": self.phase,
            "sampler": self.sampler.to_dict() if self.sampler else None,
        }
        if self.digest is not None:
            out["aggregated"] = {
                "last_fingerprint": self.last_fingerprint,
                "digest": f"{self.digest:08x}",
            }
        return out


AggKey = tuple[Any, ...]
# Events per log whose torch state is kept unhashed until read (5 KiB each for a CPU
# generator: at most 20 MiB, in a window with 4,096 distinct torch events); later first
# occurrences hash at once.
DEFERRED_STATES = 4096


class EventLog:
    """Thread-safe, aggregating store of events for one process."""

    def __init__(self) -> None:
        self._lock = forksafe.lock()
        self._events: dict[AggKey, Event] = {}
        self._seq = itertools.count()
        self.pid = os.getpid()
        self.deferred_left = DEFERRED_STATES  # states the recorder may still keep unhashed

    def next_seq(self) -> int:
        return next(self._seq)

    def get(self, key: AggKey) -> Event | None:
        """The event of ``key`` (no lock: a dict lookup is atomic)."""
        return self._events.get(key)

    def add(self, key: AggKey, event: Event) -> Event:
        """Store ``event`` under ``key``, or count one more on the event already there;
        returns the event stored."""
        with self._lock:
            existing = self._events.get(key)
            if existing is not None:
                existing.count += 1
                return existing
            self._events[key] = event
            return event

    def since(self, seq: int) -> list[Event]:
        """Events whose first occurrence has sequence number >= ``seq``, in order."""
        with self._lock:
            events = [e for e in self._events.values() if e.seq >= seq]
        return sorted(events, key=lambda e: e.seq)

    def __len__(self) -> int:
        return len(self._events)
