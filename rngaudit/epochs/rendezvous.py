"""Before the first training step of an observed epoch, the data-parallel ranks compare it.

A loader no known class shards may be iterated by one rank alone (a rank-0-only evaluation), so
no rank waits at its first batch. The ranks of a data-parallel group do meet at every training
forward of their ``DistributedDataParallel`` / FSDP module, so that is where they compare: while
an observed epoch has started and not been compared, a one-shot forward pre-hook is armed on
the data-parallel modules (inert once it fires, and removed between forwards: a hook removed
inside a forward keeps ``torch.compile`` from compiling the module). At the module's next
forward in training mode with gradients enabled, each rank of its group publishes the epochs
it started and is still drawing (their first index batch, its content's digest and the whole
epoch when it could be read ahead) and, when it has any, waits for the others (a timeout is a
warning, and ends these rendezvous for that group); the epochs
every rank published are compared, the others (one rank's evaluation loader) are not.

Every rank must fire at the same forward: a module is armed from when it is noted until its
first training forward (every rank builds it and trains it), and then again only when an epoch
starts of a loader every rank of the group trained on together at an earlier rendezvous.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from rngaudit import forksafe
from rngaudit.capture import batch_digest
from rngaudit.capture.recorder import RECORDER
from rngaudit.config import DEFAULT_TIMEOUT
from rngaudit.epochs import unsharded
from rngaudit.ranks import data_parallel, exchange
from rngaudit.ranks import store as protocol

log = logging.getLogger("rngaudit")

MAX_PENDING = 64  # started epochs kept until a rendezvous, per process


class Verdicts(Protocol):
    """What the rendezvous hands the group's published epochs to (the epoch checks' judge)."""

    def judge_first(self, epoch: unsharded.Epoch, published: dict[int, dict[str, Any]]) -> bool:
        """The verdict at the first training step; True: compared again at later forwards."""
        ...

    def judge_so_far(
        self,
        epoch: unsharded.Epoch,
        published: dict[int, dict[str, Any]],
        forwards: int,
        sharded_by: str | None = None,
    ) -> bool:
        """The verdict on what each rank was handed by a later forward; True when decided."""
        ...

    def warn_first(
        self, epoch: unsharded.Epoch, missing: list[int], arrived: list[int], timeout: float
    ) -> None:
        """Ranks of the group did not reach the training forward: a warning."""
        ...


@dataclass
class Started:
    """One observed epoch this rank started, waiting for the group's next training forward."""

    epoch: unsharded.Epoch
    tape: Any  # weakref.ref to its partition.Tape
    record: dict[str, Any]  # what is published: key, epoch, first, content, ahead, ...
    verdicts: Verdicts  # where the group's published epochs are judged


_lock = forksafe.lock()
_pending: list[Started] = []
_by_tape: weakref.WeakKeyDictionary[Any, Started] = weakref.WeakKeyDictionary()
_hooks: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()  # module -> handle
_fired: weakref.WeakSet[Any] = weakref.WeakSet()  # modules that had their first rendezvous
_agreed: set[str] = set()  # loaders a whole group trained on together
_counts: dict[str, int] = {}  # group -> rendezvous so far
# modules whose group's ranks did not all arrive once (a module built later, as a run that
# builds a new model per stage does, is given its own chance)
_given_up: weakref.WeakSet[Any] = weakref.WeakSet()
DECIDED: set[tuple[str, int]] = set()  # (loader key, epoch) judged with a finding here


def _group_key(ranks: list[int]) -> str:
    text = ",".join(str(r) for r in ranks)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


# (the module, weakly; its hook's handle) of hooks that fired or went idle: removed outside a
# forward, unless an epoch followed on that module takes the handle over first
_spent: list[tuple[Any, Any]] = []


def _sweep() -> None:
    """Remove the hooks that fired or follow nothing and are not armed (with the lock held;
    never inside a forward: a hook removed while ``torch.compile`` traces the module's call
    keeps dynamo from ever compiling it, measured)."""
    for key in list(_following):
        entry = _following[key]
        module = entry[0]()
        if module is not None and (entry[2] or module in _hooks):
            continue  # still counting, or armed: its rendezvous is at this hook
        del _following[key]
        _spent.append((entry[0], entry[1]))
    while _spent:
        with contextlib.suppress(Exception):
            _spent.pop()[1].remove()


def sweep() -> None:
    """The hooks that fired or went idle, removed (at an epoch's end or left, or a new epoch's
    first index batch: outside any forward)."""
    with _lock:
        _sweep()


def _arm(module: Any) -> None:
    """The one-shot hook on ``module`` (with the lock held); never raises."""
    _sweep()  # a spent hook of the module's last rendezvous goes first: one hook a module
    if module in _hooks or module in _given_up:
        return
    entry = _following.get(id(module))
    if entry is not None and entry[0]() is module:
        _hooks[module] = None  # the hook counting its forwards meets there too: one hook
        return
    try:
        _hooks[module] = module.register_forward_pre_hook(_uncompiled("_hook"), prepend=True)
    except Exception:
        log.debug("rngaudit: could not arm the first-step check", exc_info=True)


def noted(module: Any) -> None:
    """A data-parallel module noted (built, or found on the heap): armed until its first
    training forward."""
    with contextlib.suppress(Exception):
        if exchange.distributed() is None:
            return
        with _lock:
            if module not in _fired:
                _arm(module)


def started(item: Started) -> None:
    """An observed epoch's first index batch was drawn: kept for the group's next training
    forward (the modules armed again when every rank trained this loader together before)."""
    with _lock:
        _sweep()
        _pending.append(item)
        del _pending[:-MAX_PENDING]
        tape = item.tape()
        if tape is not None:
            _by_tape[tape] = item
        if item.epoch.key in _agreed:
            for module in list(data_parallel.modules()):
                _arm(module)


def content(tape: Any, batch: Any) -> None:
    """The epoch's first batch as the loop receives it: its content digested (once)."""
    with _lock:
        item = _by_tape.get(tape)
    if item is not None and "content" not in item.record:
        item.record["content"] = batch_digest.digest(batch)


def fields(tape: Any) -> dict[str, Any]:
    """What the epoch's end publishes besides its bitmap: the first batch and its digest."""
    with _lock:
        item = _by_tape.get(tape)
    if item is None:
        return {}
    return {"first": item.record.get("first"), "content": item.record.get("content")}


def _hook(module: Any, args: Any) -> None:
    """The one hook rngaudit puts on a data-parallel module: at its training forwards, the
    epochs followed on it counted (published or compared when due) and, while armed, the
    rendezvous; otherwise inert until removed (outside a forward)."""
    entry = _following.get(id(module))
    follows = entry[2] if entry is not None and entry[0]() is module else None
    armed = module in _hooks
    if not follows and not armed:
        return  # fired, idle, or a copy of a module that carries it: inert
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled() or module.training is not True:
        return  # an evaluation forward: not counted, stay armed
    if follows:
        _count(module, follows)  # may raise: an epoch followed found corrupted
    if armed:
        with RECORDER.paused():
            _rendezvous(module)


def _rendezvous(module: Any) -> None:
    ranks = data_parallel.group_of(module)
    key = _group_key(ranks)
    armed = [module]
    with _lock:
        for other in list(_hooks.keys()):  # one rendezvous per group and arming
            if _group_key(data_parallel.group_of(other)) == key:
                handle = _hooks.pop(other)
                if handle is not None:  # (None: the counting hook's, kept)
                    _spent.append((weakref.ref(other), handle))  # removed later
                _fired.add(other)
                armed.append(other)
        _fired.add(module)
        n = _counts.get(key, 0)
        _counts[key] = n + 1
        mine = [s for s in _pending if _drawing(s)]
        _pending.clear()
    where = exchange.distributed()
    if where is None or where[0] not in ranks or len(ranks) < 2:
        return
    rank = where[0]
    timeout = max((float(s.epoch.watch.settings.timeout) for s in mine), default=DEFAULT_TIMEOUT)
    missing: list[int] = []
    try:
        store = protocol.default()
        base = protocol.first_step(key, n)
        store.set(base / rank, exchange.encode({"epochs": [s.record for s in mine]}))
        keys = protocol.per_rank(base, ranks)
        if not mine:  # nothing of its own to compare: its (empty) record is all the others need
            protocol.read_by_all(store, base, keys, len(ranks))
            return
        missing = protocol.missing_after(store, base, ranks, timeout)
        arrived = [r for r in ranks if r not in missing]
        if missing:
            with _lock:
                for given in armed:
                    with contextlib.suppress(TypeError):
                        _given_up.add(given)
        else:
            payloads = protocol.get_all(store, keys)
            protocol.read_by_all(store, base, keys, len(ranks))
    except Exception:
        log.warning("rngaudit: the first-step comparison could not exchange", exc_info=True)
        return
    if missing:  # a warning (raised only in strict mode), never a wait beyond the timeout
        mine[0].verdicts.warn_first(mine[0].epoch, missing, arrived, timeout)
        return
    per_rank: dict[int, dict[tuple[str, int], dict[str, Any]]] = {}
    for r, payload in zip(ranks, payloads, strict=True):
        epochs = exchange.decode(bytes(payload)).get("epochs") or []
        per_rank[r] = {(str(e["key"]), int(e["epoch"])): e for e in epochs}
    common = set.intersection(*(set(d) for d in per_rank.values()))
    by_key = {(s.epoch.key, s.epoch.epoch): s for s in mine}
    for ident in sorted(common):  # the same order on every rank: the same raise
        with _lock:
            _agreed.add(ident[0])
        item = by_key[ident]
        if item.verdicts.judge_first(item.epoch, {r: per_rank[r][ident] for r in ranks}):
            follow(item, module)  # read lazily and not yet decided: compared again later


FIRST_DUE = 2  # the training forward (of the epoch) whose batches are first compared again
FOLLOW_WAIT = 5.0  # seconds a rank waits for the others' records at a later forward, at most


@dataclass(eq=False)
class Follow:
    """An observed epoch whose sampler yields lazily, compared again at later training
    forwards: what each rank has been handed so far is published at the ``due``-th (2, 4,
    8, ...) and compared at the next, when every rank of the group has published it."""

    item: Started
    group: str  # the data-parallel group's key
    ranks: list[int]
    forwards: int = 1  # training forwards of the epoch so far (the rendezvous was the first)
    due: int = FIRST_DUE
    compare_at: int = 0  # the forward at which the records published last are compared


# id(module) -> (the module, weakly; its counting hook's handle; the epochs it follows). The
# hook is a plain function (a module pickled or deep-copied mid-epoch carries nothing of ours
# but its name; a copy follows nothing).
_following: dict[int, tuple[Any, Any, list[Follow]]] = {}


def follow(item: Started, module: Any, forwards: int = 1) -> None:
    """Compare ``item``'s epoch again at later training forwards of ``module``: the hook that
    just fired there (taken back from the spent ones: nothing is added or removed inside the
    forward) counts them, a few attribute reads a forward, until the module follows no epoch;
    never raises. ``forwards``: the epoch's training forwards so far (0 when it is followed
    from its first batch, outside a forward: the module's armed hook, if any, counts, else
    one is added there)."""
    with contextlib.suppress(Exception):
        ranks = data_parallel.group_of(module)
        with _lock:
            entry = _following.get(id(module))
            if entry is None or entry[0]() is not module:
                mine = [s for s in _spent if s[0]() is module]
                if mine:
                    _spent.remove(mine[0])
                    handle = mine[0][1]
                elif _hooks.get(module) is not None:  # armed: its hook counts too (one hook)
                    handle, _hooks[module] = _hooks[module], None
                else:  # not armed here (called outside a forward)
                    handle = module.register_forward_pre_hook(_uncompiled("_hook"), prepend=True)
                entry = (weakref.ref(module), handle, [])
                _following[id(module)] = entry
            entry[2].append(Follow(item, _group_key(ranks), ranks, forwards=forwards))


def following() -> list[Follow]:
    """Every epoch followed now, on any module."""
    with _lock:
        return [f for _, _, follows in list(_following.values()) for f in follows]


def unfollow(tape: Any) -> None:
    """``tape``'s epoch ended or was left: not compared again at a forward (its end is); the
    hooks that fired or follow nothing are removed (this is outside any forward)."""
    with _lock:
        for _, _, follows in list(_following.values()):
            follows[:] = [f for f in follows if f.item.tape() not in (None, tape)]
        _sweep()


def _uncompiled(name: str) -> Any:
    """This module's hook ``name``, kept out of ``torch.compile``'s tracing: traced, the count
    of forwards is guarded on (a recompile at every step until dynamo gives up on the module,
    measured). The disabled wrapper replaces the function under its own name, so a module
    holding it still pickles by reference."""
    hook = globals()[name]
    if not getattr(hook, "_rngaudit_uncompiled", False):
        with contextlib.suppress(Exception):
            hook = sys.modules["torch"].compiler.disable(hook)
            hook._rngaudit_uncompiled = True
            globals()[name] = hook
    return hook


def _count(module: Any, follows: list[Follow]) -> None:
    """A training forward of a module that follows epochs: counted; published or compared
    when due."""
    due = False
    for f in follows:
        f.forwards += 1
        due = due or f.forwards in (f.due, f.compare_at)
    if due:
        with RECORDER.paused():
            _advance(module, follows)


def _advance(module: Any, follows: list[Follow]) -> None:
    """A training forward at which some epoch ``module`` follows is due: published or
    compared; an epoch found corrupted raises here, before the step."""
    with _lock:
        follows[:] = [f for f in follows if _drawing(f.item)]
        mine = list(follows)  # an idle hook stays, inert, until swept outside a forward
    for f in mine:
        if f.forwards == f.compare_at:
            _compare_so_far(module, f, f.compare_at - 1)  # may raise: the verdict
        if f.forwards == f.due:
            f.due *= 2
            if _publish_so_far(module, f):
                f.compare_at = f.forwards + 1


def _base(f: Follow, forwards: int) -> protocol.Key:
    e = f.item.epoch
    return protocol.so_far(f.group, e.key, e.epoch, forwards)


def _publish_so_far(module: Any, f: Follow) -> bool:
    from rngaudit.epochs import handed

    where = exchange.distributed()
    tape = f.item.tape()
    summary = handed.snapshot(tape) if tape is not None else None
    if where is None or summary is None:
        _drop(module, f)  # every rank drops it at the same forward when none can read it
        return False
    record = dict(summary, training=f.item.record.get("training"))
    try:
        protocol.default().set(_base(f, f.forwards) / where[0], exchange.encode(record))
    except Exception:
        log.debug("rngaudit: could not publish an epoch so far", exc_info=True)
        _drop(module, f)
        return False
    return True


def _compare_so_far(module: Any, f: Follow, forwards: int) -> None:
    base = _base(f, forwards)
    keys = protocol.per_rank(base, f.ranks)
    try:
        store = protocol.default()
        # published before the step all-reduced
        if protocol.missing_after(store, base, f.ranks, FOLLOW_WAIT):
            log.info(
                "rngaudit: epoch %d of %s: not every rank published what it was handed by its "
                "training forward %d; compared at the epoch's end",
                f.item.epoch.epoch, f.item.epoch.label, forwards,
            )  # fmt: skip
            _drop(module, f)
            return
        payloads = protocol.get_all(store, keys)
        protocol.read_by_all(store, base, keys, len(f.ranks))
    except Exception:
        log.debug("rngaudit: could not compare an epoch so far", exc_info=True)
        _drop(module, f)
        return
    published = {r: exchange.decode(bytes(p)) for r, p in zip(f.ranks, payloads, strict=True)}
    try:
        decided = f.item.verdicts.judge_so_far(
            f.item.epoch, published, forwards, f.item.record.get("sharded_by")
        )
    except BaseException:
        _drop(module, f)  # the verdict raised: never compared again
        raise
    if decided:
        _drop(module, f)  # warned: never compared again


def _drop(module: Any, f: Follow) -> None:
    with _lock:
        entry = _following.get(id(module))
        if entry is not None:
            with contextlib.suppress(ValueError):
                entry[2].remove(f)  # the hook, idle, is swept outside a forward


def _drawing(item: Started) -> bool:
    """Whether the epoch is still being drawn (its last index batch not yet drawn)."""
    tape = item.tape()
    return tape is not None and not tape.closed
