"""The store protocol: every key rngaudit puts in the group's store; its waits, reads, writes."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, ClassVar

from rngaudit import forksafe, launcher
from rngaudit.errors import RNGAuditStoreError
from rngaudit.ranks import group_end

PREFIX = "rngaudit"
SLICE = 0.2  # seconds per wait: a KeyboardInterrupt surfaces within one slice


class Key(str):
    """A store key; ``key / part`` is the key one level below it."""

    __slots__ = ()

    def __truediv__(self, part: object) -> Key:
        return Key(f"{self}/{part}")


def key(*parts: object) -> Key:
    """The one key builder: ``rngaudit/<part>/<part>...``. Every key rngaudit uses in the
    store is made here, or below a key made here (``key(...) / part``)."""
    return Key("/".join([PREFIX, *(str(p) for p in parts)]))


# The namespaces, one builder each (the layout of the store, in one place).
WAITING = key("waiting")  # how many ranks are inside an exchange now


def audit(label: str, occurrence: int) -> str:
    """The id of the ``occurrence``-th audit opened at ``label`` on a rank (``a/<digest>/<n>``),
    the exchange's name below :data:`PREFIX`."""
    digest = hashlib.blake2b(label.encode("utf-8"), digest_size=8).hexdigest()
    return f"a/{digest}/{occurrence}"


class ExchangeKeys:
    """The keys of one exchange, named ``name`` (an audit id, or an epoch check's name)."""

    def __init__(self, name: str) -> None:
        self.base = key(name)
        self.decision = self.base / "decision"
        self.count = self.base / "count"
        self.all = self.base / "all"

    def record(self, rank: int) -> Key:
        return self.base / "record" / rank

    def arrival(self, rank: int) -> Key:
        return self.base / "arrival" / rank

    def claim(self, signature: str) -> Key:
        return self.base / "claim" / signature


def position(rank: int) -> Key:
    """One slot per rank, overwritten: the exchange it is in."""
    return key("at", rank)


def run_id(report_dir: object) -> Key:
    """The run id every rank of the group agrees on, per report directory."""
    return key("agree", "run-id", report_dir)


def replicas(group: str, comparison: int) -> Key:
    """A group's ``comparison``-th swap of replicated parameters' digests (``/<rank>`` below)."""
    return key("replicas", group, comparison)


def loader(loader_key: str) -> Key:
    """An observed loader's keys: ``/iterated/<rank>``, ``/closed/<rank>``, ``/<epoch>``."""
    return key("observed", loader_key)


def epoch(loader_key: str, number: int) -> Key:
    """One epoch of an observed loader: ``/start/<rank>``, ``/end/<rank>``, ``/read``."""
    return loader(loader_key) / number


def first_step(group: str, comparison: int) -> Key:
    """A data-parallel group's ``comparison``-th first-step swap (``/<rank>`` below)."""
    return key("observed", "step", group, comparison)


def so_far(group: str, loader_key: str, number: int, forwards: int) -> Key:
    """What each rank of ``group`` was handed of an epoch by its ``forwards``-th forward."""
    return key("observed", "sofar", group, loader_key, number, forwards)


def attempt_prefix(attempt: int) -> str:
    """The prefix of a torchrun restart attempt's view of a store shared by the attempts."""
    return f"{PREFIX}-attempt-{attempt}"


def per_rank(base: Key, ranks: Iterable[int]) -> list[Key]:
    """``base/<rank>`` for each of ``ranks``."""
    return [base / r for r in ranks]


_PREFIXED: dict[int, tuple[Any, Any]] = {}  # id(default store) -> (it, its attempt's view)


def default() -> Any:
    """The default process group's store; in a torchrun restart attempt N > 0 its view under
    :func:`attempt_prefix`: the attempts may share one store (torch's shared rendezvous store),
    and keys an earlier attempt left there must not answer this one's exchanges."""
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    attempt = launcher.restart_attempt()
    if attempt == 0:
        return store
    cached = _PREFIXED.get(id(store))
    if cached is None or cached[0] is not store:  # one view per store: PENDING keys on its id
        cached = _PREFIXED[id(store)] = (
            store,
            distributed_c10d.PrefixStore(attempt_prefix(attempt), store),
        )
    return cached[1]


def agree(name: Key, mine: str) -> str | None:
    """The value every rank of the process group agrees on for ``name``: the first one set
    (``compare_set`` never waits); None without a usable store."""
    try:
        value = default().compare_set(name, "", mine)
    except Exception:  # no store, or one without compare_set: the caller waits for an exchange
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def first_set(store: Any, name: str, value: str) -> bytes:
    """Set ``name`` to ``value`` unless it is set; what it holds then (``compare_set``)."""
    return bytes(store.compare_set(name, "", value))


def count(store: Any, name: str, by: int = 1) -> int:
    """Add ``by`` to the counter ``name``; its new value (``add``)."""
    return int(store.add(name, by))


def get_all(store: Any, keys: Sequence[str]) -> list[bytes]:
    """The values of ``keys`` (all set), in one round trip where the store can."""
    if not keys:
        return []
    if hasattr(store, "multi_get"):
        return list(store.multi_get(keys))
    return [store.get(k) for k in keys]


def delete(store: Any, keys: Iterable[str]) -> None:
    """Delete ``keys``; on a store without ``delete_key`` (old torch), leave them."""
    for k in keys:
        try:
            store.delete_key(k)
        except Exception:
            return


def read_by_all(store: Any, base: Key, keys: Sequence[str], readers: int) -> None:
    """This rank has read ``keys``: the last of ``readers`` to say so deletes them (and the
    counter ``base/read``)."""
    if count(store, base / "read") == readers:
        delete(store, [*keys, base / "read"])


class Waiter:
    """Waits for one key on a clone of the store, in a daemon thread, so the caller can wait in
    short slices (a KeyboardInterrupt surfaces within one) without a store timeout, which c10d
    logs as a warning, at every slice. Without ``clone()``, it polls ``check`` each slice."""

    _idle: ClassVar[dict[int, list[Any]]] = {}  # free clones per store (id)
    live: ClassVar[set[Waiter]] = set()  # threads still inside the store's wait
    _settling: ClassVar[bool] = False  # settle_all registered as an end step
    _lock: ClassVar[Any] = forksafe.lock()

    def __init__(self, store: Any, name: str, seconds: float) -> None:
        self.store, self.key = store, name
        self.done = threading.Event()
        self.found = False
        self.lost: BaseException | None = None  # the store's connection broke (its host died)
        self.clone: Any = None
        if hasattr(store, "clone"):
            with self._lock:
                idle = self._idle.setdefault(id(store), [])
                self.clone = idle.pop() if idle else None
            try:
                self.clone = self.clone or store.clone()
            except Exception:
                self.clone = None
        if self.clone is not None:
            with self._lock:
                if not Waiter._settling:  # once per process: the group's end, step "waits"
                    group_end.at_exit(group_end.WAITS, Waiter.settle_all)
                    Waiter._settling = True
                self.live.add(self)
            threading.Thread(target=self._run, args=(seconds,), daemon=True).start()

    def _run(self, seconds: float) -> None:
        try:
            self.clone.wait([self.key], timedelta(seconds=max(0.001, seconds)))
            self.found = True
        except Exception as exc:  # the store's timeout, or its host is gone
            self.found = False
            self.lost = exc if lost(exc) else None
        with self._lock:
            self._idle.setdefault(id(self.store), []).append(self.clone)
            self.live.discard(self)
        self.done.set()

    @classmethod
    def settle_all(cls, seconds: float = 1.0) -> None:
        """At exit: give threads still in a store wait (their key set just now, as the
        exchange they served was decided) up to ``seconds`` to return. A thread that returns
        from the store's C++ wait while the interpreter finalizes is killed by a forced unwind
        that C++ turns into ``std::terminate``: the process aborts after its work is done."""
        deadline = time.monotonic() + seconds
        for waiter in list(cls.live):
            waiter.done.wait(max(0.0, deadline - time.monotonic()))

    def wait(self, seconds: float) -> bool:
        """True once the wait ended (then ``found`` says how); False after ``seconds``."""
        if self.clone is not None:
            return self.done.wait(max(0.0, seconds))
        if self.store.check([self.key]):
            self.found = True
            return True
        time.sleep(max(0.0, seconds))
        return False


def settle(seconds: float = 1.0) -> None:
    """At the end of an exit step that exchanged: let the store waits it started return (see
    :meth:`Waiter.settle_all`, which the step "waits" ran before it)."""
    Waiter.settle_all(seconds)


def wait_all(store: Any, keys: Iterable[str], seconds: float) -> None:
    """Until every key of ``keys`` is set or ``seconds`` passed: woken by the store as each
    arrives (a :class:`Waiter`, in slices, so a KeyboardInterrupt surfaces)."""
    deadline = time.monotonic() + seconds
    for name in keys:
        if store.check([name]):
            continue
        waiter = Waiter(store, name, max(0.0, deadline - time.monotonic()))
        while not waiter.wait(min(SLICE, max(0.0, deadline - time.monotonic()))):
            if time.monotonic() >= deadline:
                return
        if not waiter.found:
            return


def missing_after(store: Any, base: Key, ranks: Iterable[int], seconds: float) -> list[int]:
    """Wait (up to ``seconds``) for ``base/<rank>`` of each of ``ranks``; the ranks whose key
    did not arrive (none: every rank published)."""
    ranks = list(ranks)
    keys = per_rank(base, ranks)
    wait_all(store, keys, seconds)
    return [r for r, k in zip(ranks, keys, strict=True) if not store.check([k])]


def lost(exc: BaseException) -> bool:
    """Is ``exc`` the store's connection breaking (torch's ``DistNetworkError``: broken pipe,
    connection reset), not its timeout?"""
    return type(exc).__name__ == "DistNetworkError" or isinstance(exc, ConnectionError)


def unreachable(rank: int, cause: BaseException) -> RNGAuditStoreError:
    """The error of ``rank`` that lost the store in an exchange."""
    host = launcher.store_host()
    where = launcher.store_address()
    who = (
        f"rank {host} (the store host, at {where}) is unreachable: it died or left during the audit"
        if host is not None
        else f"the launcher's store at {where} is unreachable: the launcher died"
    )
    reason = " ".join(str(cause).split())[:200] or type(cause).__name__
    return RNGAuditStoreError(
        f"rngaudit: rank {rank} lost the process group's store while the ranks exchanged: {who} "
        f"({type(cause).__name__}: {reason}). Nothing was compared. See rank "
        f"{host if host is not None else 0}'s log for why it stopped; a launcher that hosts "
        "the store itself (torchrun) names the rank that died.",
        missing=() if host is None else (host,),
    )
