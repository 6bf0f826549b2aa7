"""Cross-rank exchange of rank records: JSON through the process group's store, with a timeout."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from rngaudit import launcher
from rngaudit.ranks import store as protocol

GRACE = 1.0  # the others wait this much longer than rank 0 before deciding without it
FETCH_ALL_MAX = 64  # above this world size rank 0 fetches one record per group, like the others


class Seat(NamedTuple):
    """Where a rank takes part in an exchange: the store, its rank and the world size."""

    store: Any
    rank: int
    world: int


@dataclass
class Exchanged:
    """What came back: the records of the ranks that arrived, who did not, and what the
    ranks declared (mode, an exception raised in the block, which audit they were at)."""

    records: list[dict[str, Any]]
    world_size: int
    rank: int
    missing: list[int]
    arrived: list[int] = field(default_factory=list)
    kind: str = "complete"  # complete | abandoned | mismatch | interrupted
    modes: dict[str, list[int]] = field(default_factory=dict)  # "raise", "warn+strict", ...
    raised: dict[int, str] = field(default_factory=dict)  # rank -> "ValueError: message"
    audits: dict[str, dict[str, Any]] = field(default_factory=dict)  # mismatch: key -> where
    interrupted: list[int] = field(default_factory=list)
    why: str = "KeyboardInterrupt"  # interrupted: why that rank left (SIGTERM, Ctrl-C)


def process_group() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised (any world size)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return int(dist.get_rank()), int(dist.get_world_size())


def current_rank() -> int:
    """This process's rank: the process group's when one exists, else the launcher's."""
    where = process_group()
    return launcher.rank() if where is None else where[0]


def distributed() -> tuple[int, int] | None:
    """(rank, world size) when torch.distributed is initialised with more than one rank."""
    where = process_group()
    if where is None or where[1] <= 1:
        return None
    return where


def encode(record: Mapping[str, Any]) -> bytes:
    return zlib.compress(json.dumps(record, sort_keys=True).encode("utf-8"))


def decode(payload: bytes) -> dict[str, Any]:
    data = json.loads(zlib.decompress(payload).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError("rank record is not a JSON object")
    return data


def ranges(ranks: list[int]) -> list[list[int]]:
    """``[[0, 4095]]`` for ranks 0..4095: compact rank lists for the decision key."""
    out: list[list[int]] = []
    for r in sorted(set(ranks)):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def unranges(spans: list[list[int]]) -> list[int]:
    return [r for lo, hi in spans for r in range(int(lo), int(hi) + 1)]


def leaving(exc: BaseException) -> str:
    """Why a rank leaves on ``exc`` (not an ``Exception``): ``KeyboardInterrupt``, or
    ``SIGTERM (SystemExit: 143)`` when a signal handler raised it."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    name = raised_by_signal(exc)
    return f"{name} ({text})" if name and not isinstance(exc, KeyboardInterrupt) else text


def raised_by_signal(exc: BaseException) -> str | None:
    """``SIGTERM`` when ``exc`` was raised in the Python handler of that signal (its innermost
    frame runs the handler's code), else None."""
    import signal

    tb = exc.__traceback__
    codes: set[Any] = set()
    while tb is not None:
        codes.add(tb.tb_frame.f_code)
        tb = tb.tb_next
    for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
        if sig is None:
            continue
        handler = signal.getsignal(sig)
        code = getattr(getattr(handler, "__func__", handler), "__code__", None)
        if code is not None and code in codes:
            return signal.Signals(sig).name
    return None


def _decide(store: Any, keys: protocol.ExchangeKeys, decision: dict[str, Any]) -> dict[str, Any]:
    """Write ``decision`` unless one exists; every rank then reads the one that won."""
    value = json.dumps(decision, sort_keys=True)
    won = protocol.first_set(store, keys.decision, value)
    return dict(json.loads(won.decode()))


def _interrupted(rank: int, why: str = "KeyboardInterrupt") -> dict[str, Any]:
    """The decision of a rank that leaves (a KeyboardInterrupt, a SIGTERM handler's exit)."""
    return {"kind": "interrupted", "by": rank, "ranks": {}, "why": why}


def _read_decision(store: Any, keys: protocol.ExchangeKeys) -> dict[str, Any] | None:
    if not store.check([keys.decision]):
        return None
    return dict(json.loads(bytes(store.get(keys.decision)).decode()))


class Pending:
    """Keys a rank published, deleted once no rank can need them (see :func:`exchange`)."""

    def __init__(self) -> None:
        self.last: list[str] = []  # the previous completed exchange's keys this rank deletes
        self.stray: list[str] = []  # keys of exchanges that did not complete


PENDING: dict[tuple[int, int], Pending] = {}  # per (store id, rank), in this process


def publish(
    store: Any,
    rank: int,
    world: int,
    key: str,
    record: Mapping[str, Any],
    info: dict[str, Any],
    payload: bytes | None = None,
) -> list[str]:
    """Put this rank's arrival (signature, mode, label, exception) in the store, and its record
    when it is the first of its signature group to claim it (or the world is at most
    ``FETCH_ALL_MAX``). Returns the keys this rank wrote for the exchange."""
    keys = protocol.ExchangeKeys(key)
    signature = str(record.get("signature", ""))
    written: list[str] = [keys.arrival(rank)]
    holds = world <= FETCH_ALL_MAX
    if not holds:  # one record per signature group in the store, not one per rank
        claim = keys.claim(signature)
        holds = protocol.first_set(store, claim, str(rank)) == str(rank).encode()
        if holds:
            written.append(claim)
    if holds:
        store.set(keys.record(rank), payload if payload is not None else encode(record))
        written.append(keys.record(rank))
    arrival = dict(info, signature=signature, holds=holds)
    store.set(keys.arrival(rank), json.dumps(arrival, sort_keys=True))  # after the record
    store.set(protocol.position(rank), json.dumps({"key": key, "label": info.get("label", "")}))
    if protocol.count(store, keys.count) == world:
        store.set(keys.all, b"1")
    return written


def exchange(
    record: Mapping[str, Any],
    key: str,
    timeout: float,
    info: dict[str, Any] | None = None,
    leave: bool = False,
    report_all: bool = False,
) -> Exchanged:
    """Publish this rank's record under ``key`` and collect the others', within ``timeout``.

    Works for any backend (gloo, nccl): the data goes through the store, not a collective,
    so a missing rank cannot hang the others and can be named. Rank 0 decides: when every
    rank arrived (or at the timeout, or when the ranks wait in different audits) it writes one
    decision key with ``compare_set``; the others wait for it (``timeout`` + 1 s, then the
    first of them decides instead, with the same ``compare_set``), and a rank arriving after a
    decision adopts it. Every rank acts on that one decision: the same verdict everywhere.

    The store holds one full record per signature group (the first rank to claim the group
    publishes it; every rank up to ``FETCH_ALL_MAX`` ranks), and ranks fetch only those, unless
    ``report_all`` (rank 0, for the merged report, up to ``FETCH_ALL_MAX`` ranks); the others
    come back as stubs ``{"rank", "signature", "same_as", "events": []}``. ``leave``: publish
    and return at once, telling the others this rank was interrupted (a KeyboardInterrupt).
    """
    where = distributed()
    if where is None:
        return Exchanged([dict(record)], 1, 0, [], arrived=[0])
    rank, world = where
    return exchange_on(
        Seat(protocol.default(), rank, world), record, key, timeout, info, leave, report_all
    )


def exchange_on(
    seat: Seat,
    record: Mapping[str, Any],
    key: str,
    timeout: float,
    info: dict[str, Any] | None = None,
    leave: bool = False,
    report_all: bool = False,
    payload: bytes | None = None,
) -> Exchanged:
    """:func:`exchange` through a given store, as ``rank`` of ``world`` (the benchmark
    simulates thousands of ranks this way; ``payload``: the record already encoded)."""
    store, rank, world = seat
    start = time.monotonic()
    why = str((info or {}).get("left") or "KeyboardInterrupt")
    try:
        if leave:  # decided before this rank's arrival can complete the count: otherwise rank
            # 0 may decide "complete" first, and report a rank that raised, not one interrupted
            _decide(store, protocol.ExchangeKeys(key), _interrupted(rank, why))
        written = publish(store, rank, world, key, record, dict(info or {}), payload)
        every = report_all and world <= FETCH_ALL_MAX
        return collect(seat, record, key, timeout, every, why if leave else None, start, written)
    except Exception as exc:
        if protocol.lost(exc):
            raise protocol.unreachable(rank, exc) from None
        raise
    except BaseException as leaving_now:  # Ctrl-C while publishing or before the wait began:
        # the others are told, not left to time out (:func:`collect` decides the same inside)
        with contextlib.suppress(Exception):
            _decide(store, protocol.ExchangeKeys(key), _interrupted(rank, leaving(leaving_now)))
        raise


def collect(
    seat: Seat,
    record: Mapping[str, Any],
    key: str,
    timeout: float,
    fetch_all: bool = False,
    leaving_as: str | None = None,
    start: float | None = None,
    written: list[str] | None = None,
) -> Exchanged:
    """The second half of :func:`exchange_on`: wait for the decision, fetch, clean up
    (``leaving_as``: why this rank leaves without waiting, None when it waits; ``written``:
    the keys :func:`publish` wrote, deleted after the next complete exchange)."""
    store, rank, world = seat
    start = time.monotonic() if start is None else start
    keys = protocol.ExchangeKeys(key)
    pending = PENDING.setdefault((id(store), rank), Pending())
    try:
        # inside: every way out of the wait counts this rank out again
        protocol.count(store, protocol.WAITING)
        if leaving_as is not None:
            decision = _decide(store, keys, _interrupted(rank, leaving_as))
        else:
            try:
                decision = _await_decision(seat, keys, key, timeout, start)
            except Exception:
                raise
            except BaseException as leaving_now:  # Ctrl-C, a SIGTERM handler's sys.exit()
                with contextlib.suppress(Exception):  # the others are told, then it goes on
                    _decide(store, keys, _interrupted(rank, leaving(leaving_now)))
                raise
    finally:
        with contextlib.suppress(Exception):  # a lost store is reported by what failed first
            protocol.count(store, protocol.WAITING, -1)
    result = _result(store, keys, decision, record, rank, world, fetch_all)
    mine = list(written if written is not None else [keys.record(rank), keys.arrival(rank)])
    if decision["kind"] == "complete":
        # every rank arrived here, so every rank has read the previous exchange: clear it
        protocol.delete(store, pending.last + pending.stray)
        pending.stray = []
        pending.last = mine + ([keys.decision, keys.count, keys.all] if rank == 0 else [])
    else:  # the decision stays for late arrivals; the records go after the next complete one
        pending.stray += mine
    return result


def _await_decision(
    seat: Seat, keys: protocol.ExchangeKeys, key: str, timeout: float, start: float
) -> dict[str, Any]:
    store, rank, world = seat
    decision = _read_decision(store, keys)
    if decision is not None:
        return decision  # arrived after the others decided (timed out, interrupted)
    if rank == 0:

        def complete() -> dict[str, Any]:
            return _decide(store, keys, _complete(store, keys, world))

        def meanwhile() -> dict[str, Any] | None:
            decision = _read_decision(store, keys)
            return decision if decision is not None else _mismatch(store, keys, key, world)

        return _wait_for(seat, keys, keys.all, start, timeout, complete, meanwhile)

    def decided() -> dict[str, Any]:
        decision = _read_decision(store, keys)
        assert decision is not None
        return decision

    # after timeout + GRACE rank 0 is missing: the first of the others decides without it
    return _wait_for(seat, keys, keys.decision, start, timeout + GRACE, decided)


def _wait_for(
    seat: Seat,
    keys: protocol.ExchangeKeys,
    awaited: str,
    start: float,
    limit: float,
    found: Callable[[], dict[str, Any]],
    meanwhile: Callable[[], dict[str, Any] | None] | None = None,
) -> dict[str, Any]:
    """Wait for the key ``awaited`` in ``SLICE`` slices (a KeyboardInterrupt surfaces within
    one): ``found()`` once it is set; between slices, the decision ``meanwhile()`` returns,
    if any; ``limit`` seconds after ``start``, decide the exchange abandoned."""
    store, rank, world = seat
    waiter = protocol.Waiter(store, awaited, limit - (time.monotonic() - start))
    try:
        while True:
            if waiter.wait(protocol.SLICE):
                if waiter.found:
                    return found()
                if waiter.lost is not None:
                    raise waiter.lost
                time.sleep(protocol.SLICE)  # the store's wait ended early: idle, not a busy loop
            if meanwhile is not None:
                decision = meanwhile()
                if decision is not None:
                    return decision
            if time.monotonic() - start >= limit:
                return _decide(store, keys, _abandoned(store, keys, world, rank))
    finally:
        if awaited == keys.all and not waiter.done.is_set():
            # left before every rank arrived (decided meanwhile, abandoned, interrupted): only
            # this rank's waiter reads "all", so set it to end that wait now, not at exit. The
            # others' waiters end on the decision, which every way out of the exchange writes.
            with contextlib.suppress(Exception):
                store.set(awaited, b"1")


def _table(store: Any, keys: protocol.ExchangeKeys, ranks: list[int]) -> dict[str, Any]:
    """Signature groups, modes and exceptions of ``ranks`` (all arrived at ``keys``)."""
    groups: dict[str, list[int]] = {}
    holders: dict[str, int] = {}
    modes: dict[str, list[int]] = {}
    raised: dict[str, str] = {}
    values = protocol.get_all(store, [keys.arrival(r) for r in ranks])
    for r, value in zip(ranks, values, strict=True):
        arrival = json.loads(bytes(value).decode())
        sig = str(arrival.get("signature", ""))
        groups.setdefault(sig, []).append(r)
        if arrival.get("holds", True) and sig not in holders:
            holders[sig] = r  # the lowest rank whose record is in the store
        modes.setdefault(str(arrival.get("mode", "")), []).append(r)
        if arrival.get("raised"):
            raised[str(r)] = str(arrival["raised"])
    return {
        "ranks": {sig: ranges(rs) for sig, rs in groups.items()},
        "holders": holders,
        "modes": {mode: ranges(rs) for mode, rs in modes.items()},
        "raised": raised,
    }


def _complete(store: Any, keys: protocol.ExchangeKeys, world: int) -> dict[str, Any]:
    return dict(_table(store, keys, list(range(world))), kind="complete", by=0)


def _arrived(store: Any, keys: protocol.ExchangeKeys, world: int) -> list[int]:
    return [r for r in range(world) if store.check([keys.arrival(r)])]


def _abandoned(store: Any, keys: protocol.ExchangeKeys, world: int, rank: int) -> dict[str, Any]:
    arrived = _arrived(store, keys, world)
    missing = [r for r in range(world) if r not in arrived]
    if not missing:  # everyone came in the last moment
        return dict(_complete(store, keys, world), by=rank)
    table = _table(store, keys, arrived)
    return dict(table, kind="abandoned", by=rank, missing=ranges(missing))


def _mismatch(
    store: Any, keys: protocol.ExchangeKeys, key: str, world: int
) -> dict[str, Any] | None:
    """Rank 0, between slices: when every rank waits in an exchange and some wait in another
    (an audit opened on some ranks only), nobody can progress: decide that now."""
    if protocol.count(store, protocol.WAITING, 0) < world:
        return None
    arrived = set(_arrived(store, keys, world))
    others = [r for r in range(world) if r not in arrived]
    if not others or not store.check([protocol.position(r) for r in others]):
        return None
    where: dict[str, dict[str, Any]] = {}
    for r, value in zip(
        others, protocol.get_all(store, [protocol.position(r) for r in others]), strict=True
    ):
        pos = json.loads(bytes(value).decode())
        entry = where.setdefault(str(pos["key"]), {"label": pos.get("label", ""), "ranks": []})
        entry["ranks"].append(r)
    if key in where:
        return None  # arrived meanwhile
    for other in where:
        if _read_decision(store, protocol.ExchangeKeys(other)) is not None:
            return None  # it already left that exchange
    own = _read_arrival_label(store, keys, 0)
    where[key] = {"label": own, "ranks": sorted(arrived)}
    # A strict majority in one audit keeps waiting there (the others join it next); every
    # other audit is decided now, with the same description everywhere.
    biggest = max(where, key=lambda k: (len(where[k]["ranks"]), k))
    keep = biggest if len(where[biggest]["ranks"]) * 2 > world else None
    audits = {k: {"label": v["label"], "ranks": ranges(v["ranks"])} for k, v in where.items()}
    mine: dict[str, Any] | None = None
    for other, entry in where.items():
        if other == keep:
            continue
        other_keys = protocol.ExchangeKeys(other)
        decision = dict(
            _table(store, other_keys, entry["ranks"]), kind="mismatch", by=0, audits=audits
        )
        won = _decide(store, other_keys, decision)
        if other == key:
            mine = won
    return mine


def _read_arrival_label(store: Any, keys: protocol.ExchangeKeys, rank: int) -> str:
    arrival = json.loads(bytes(store.get(keys.arrival(rank))).decode())
    return str(arrival.get("label", ""))


def _result(
    store: Any,
    keys: protocol.ExchangeKeys,
    decision: dict[str, Any],
    record: Mapping[str, Any],
    rank: int,
    world: int,
    fetch_all: bool,
) -> Exchanged:
    groups = {sig: unranges(spans) for sig, spans in decision.get("ranks", {}).items()}
    signature_of = {r: sig for sig, rs in groups.items() for r in rs}
    arrived = sorted(signature_of)
    holders = decision.get("holders", {})
    first_of = {sig: int(holders.get(sig, min(rs))) for sig, rs in groups.items()}
    # fetch_all: only up to FETCH_ALL_MAX ranks, where every rank published its record
    wanted = [r for r in arrived if r != rank and (fetch_all or first_of[signature_of[r]] == r)]
    kind = str(decision.get("kind", "complete"))
    if kind != "complete":  # a late reader: the owners may have cleared their keys since
        wanted = [r for r in wanted if store.check([keys.record(r)])]
    received = dict(
        zip(wanted, protocol.get_all(store, [keys.record(r) for r in wanted]), strict=True)
    )
    records: list[dict[str, Any]] = []
    for r in arrived:
        if r == rank:
            records.append(dict(record))
        elif r in received:
            records.append(dict(decode(received[r]), rank=r))
        else:
            sig = signature_of[r]
            same_as = first_of[sig] if first_of[sig] != r else None
            records.append({"rank": r, "signature": sig, "same_as": same_as, "events": []})
    missing = unranges(decision.get("missing", []))
    if kind == "complete":
        missing = []
    elif kind == "abandoned" and rank not in arrived and rank not in missing:
        missing = sorted([*missing, rank])
    return Exchanged(
        records=records,
        world_size=world,
        rank=rank,
        missing=missing,
        arrived=arrived,
        kind=kind,
        modes={m: unranges(spans) for m, spans in decision.get("modes", {}).items()},
        raised={int(r): str(text) for r, text in decision.get("raised", {}).items()},
        audits=dict(decision.get("audits", {})),
        interrupted=[int(decision["by"])] if kind == "interrupted" else [],
        why=str(decision.get("why") or "KeyboardInterrupt"),
    )


def signature(payload: Any) -> str:
    """The digest equal ranks share (blake2b of the payload as sorted JSON): the store holds,
    and each rank fetches, one record per signature group."""
    data = json.dumps(payload, sort_keys=True, default=str).encode("utf-8")
    return hashlib.blake2b(data, digest_size=12).hexdigest()
