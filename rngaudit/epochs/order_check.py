"""The sharded-order check: at each epoch's first batch, every rank must shard the same order.

Two class-level wrappers, installed while something is watched:
- ``BatchSamplerShard.__iter__`` (accelerate): tees the batches of the order *before* sharding
  into an :class:`~rngaudit.epochs.sharding.OrderTape`, and records the sampler draws made while the
  first batch is pulled (a short recording window), so a divergence names its draw.
- ``_BaseDataLoaderIter.__next__`` (torch, and torchdata's stateful iterators through it): at
  the first batch of each epoch of a sharded loader, before the batch is returned, the ranks
  exchange what they are about to shard (the dataset's index mapping, the DistributedSampler's
  seed/epoch, the teed order) and every rank raises on a difference.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import wrapt

from rngaudit import findings as fk
from rngaudit import forksafe, peek, schema
from rngaudit.capture import naming
from rngaudit.capture.instrument import loaders as instrument_loaders
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.config import Settings
from rngaudit.epochs import (
    ahead,
    early,
    first_step,
    keyed,
    observed,
    order_rules,
    partition,
    sharding,
    unpublished,
)
from rngaudit.errors import RNGAuditError
from rngaudit.findings import Finding
from rngaudit.ranks import exchange, group_end, layout, peers, replicas
from rngaudit.ranks.policy import act, fails
from rngaudit.reports.model import AuditReport
from rngaudit.schema import DRAW
from rngaudit.wording import ranks_phrase

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


@dataclass
class _Observed:
    """A loader no known class shards, whose epochs are published and compared lazily."""

    key: str
    label: str
    identity: str
    epochs: int = 0
    scanned: bool = False  # the heap searched once for data-parallel modules
    open: Any = None  # weakref.ref to the tape of its latest epoch on this rank


@dataclass
class _KeyedLoader:
    """An iterable-style loader whose batches are compared by a declared sample key."""

    key: str  # the loader's cross-rank identity
    label: str
    spec: keyed.Spec
    batch_size: int | None
    epochs: int = 0
    scanned: bool = False  # the heap searched once for data-parallel modules
    current: _KeyedEpoch | None = None
    unknown_logged: bool = False


@dataclass(eq=False)  # hashed by identity (first_step keeps it in a weak dictionary)
class _KeyedEpoch:
    """One epoch of a keyed loader on this rank: the ids taken so far."""

    loader: _KeyedLoader
    epoch: observed.Epoch
    source: Any  # the iterator's _sampler_iter of this epoch (held: its id is not reused)
    taken: keyed.Taken = field(default_factory=keyed.Taken)
    closed: bool = False

    def add(self, batch: Any) -> None:
        """The ids of one batch the loader returned (never raises; the batch is not touched)."""
        if not self.taken.known:
            return
        hashed = keyed.read(batch, self.loader.spec.key)
        if hashed is None:
            self.taken.known = False
            if not self.loader.unknown_logged:
                self.loader.unknown_logged = True
                log.warning(
                    "rngaudit: epoch %d of %s is not compared: the sample key %s could not be "
                    "read from one of its batches (logged once per loader)",
                    self.epoch.epoch, self.loader.label, self.loader.spec.name,
                )  # fmt: skip
            return
        self.taken.add(hashed)


@dataclass
class _LoaderState:
    index: int
    label: str
    checks: int = 0
    previous: schema.EpochRecord | None = None
    tape: sharding.OrderTape = field(default_factory=sharding.OrderTape)


class _Tee:
    """Stands in for a BatchSamplerShard's inner batch sampler while its first batch is pulled.

    Iterating it iterates the real one and digests each batch; attributes are the real one's.
    """

    def __init__(self, inner: Any, tape: sharding.OrderTape) -> None:
        self.__dict__["_rngaudit_inner"] = inner
        self.__dict__["_rngaudit_tape"] = tape

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_rngaudit_inner"], name)

    def __len__(self) -> int:
        return len(self.__dict__["_rngaudit_inner"])

    def __iter__(self) -> Iterator[Any]:
        return _tee_prefix(self.__dict__["_rngaudit_inner"], self.__dict__["_rngaudit_tape"], None)


def _tee_prefix(
    inner: Any, tape: sharding.OrderTape, digest: Callable[[Any], int] | None
) -> Iterator[Any]:
    """Iterate ``inner``, adding each item (or its ``digest``) to ``tape`` until the tape holds
    ``PREFIX_BATCHES`` entries; the rest passes through untouched."""
    it = iter(inner)
    for item in it:
        tape.add(item if digest is None else [digest(item)])
        yield item
        if len(tape.batches) >= sharding.PREFIX_BATCHES:
            break
    yield from it


class EpochGuard:
    """Process-wide: what is watched, and the wrappers that watch it."""

    def __init__(self) -> None:
        self.patches = PatchSet()
        self.installed = False
        self._lock = forksafe.lock()
        self.everything: Watch | None = None  # RNGAUDIT: every sharded loader
        self.open: list[Watch] = []  # with-blocks open now: sharded loaders in them
        self.pending: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()
        self.loaders: weakref.WeakKeyDictionary[Any, _LoaderState] = weakref.WeakKeyDictionary()
        self.seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.tapes: weakref.WeakSet[partition.Tape] = weakref.WeakSet()  # epochs observed now
        # loaders no known class shards, built in a with-block: index sampler -> its watch
        self.observing: weakref.WeakKeyDictionary[Any, Watch] = weakref.WeakKeyDictionary()
        self.observed: weakref.WeakKeyDictionary[Any, _Observed] = weakref.WeakKeyDictionary()
        self._occurrences: dict[str, int] = {}
        self.later: list[observed.Epoch] = []  # published epochs not compared yet
        # observed epochs this rank left early, folded, not published yet (early.fold)
        self.left: list[tuple[observed.Epoch, dict[str, Any]]] = []
        self.partitioned: set[str] = set()  # loaders an epoch of which partitioned the data
        # iterable-style loaders keyed by a sample key (index sampler -> it; None: not keyed)
        self.keyed: weakref.WeakKeyDictionary[Any, _KeyedLoader | None] = (
            weakref.WeakKeyDictionary()
        )
        self.keyed_open: list[_KeyedEpoch] = []  # epochs begun and not published yet
        # (iterator class, observing, keyed) -> its subclass without our wrappers
        self._plain: dict[tuple[type, bool, bool], type] = {}
        self._count = 0
        # destroy_process_group wrapped once a loader is observed, until the group goes (kept
        # past the guard's own uninstall: the loaders may be gone, their epochs not compared)
        self.exit_patches = PatchSet()
        self._observed_keys: set[str] = set()  # every observed loader this process iterated
        self._exit_registered = False

    # -- what is watched ---------------------------------------------------------------------
    def watch_all(self, watch: Watch) -> None:
        """Under RNGAUDIT: check every sharded loader (every epoch if ``watch.every_epoch``)."""
        with self._lock:
            self.everything = watch
            self.install()
        replicas.arm(watch)  # replicas' weights, at the first optimizer step
        layout.arm()  # device meshes noted as they are built

    def enter(self, watch: Watch) -> None:
        """A with-block opened: loaders sharded inside it are watched."""
        with self._lock:
            self.open.append(watch)
            self.install()
        replicas.arm(watch)  # replicas' weights, at the first optimizer step
        layout.arm()  # device meshes noted as they are built

    def leave(self, watch: Watch, loaders: list[Any]) -> None:
        """A with-block closed: keep watching the sharded ``loaders`` built in it until checked
        (none when the block's own verdict already reported an error for them)."""
        observing = False
        with self._lock:
            if watch in self.open:
                self.open.remove(watch)
            kept = []
            for loader in loaders:
                shard = sharding.shard_of(sharding.loader_chain(loader))
                if shard is None:
                    shard = sharding.stream_shard(peek.attr(loader, "dataset"))
                if shard is not None:
                    kept.append(shard)
                    self.pending[shard] = watch
                    weakref.finalize(shard, self._dropped)  # never iterated: stop waiting
                elif exchange.distributed() is not None:
                    index = peek.first_attr(loader, "batch_sampler", "sampler")
                    with contextlib.suppress(TypeError):  # an unhashable sampler: not observed
                        self.observing[index] = watch
                        weakref.finalize(index, self._dropped)
                        observing = True
            for tape in list(self.tapes):  # epochs drawn inside the block (a prefetch)
                if tape.context[0] is watch and all(tape.context[1] is not k for k in kept):
                    tape.abandon()  # the block's verdict already covered that loader
            self._maybe_uninstall()
        if observing:  # every rank leaves the block: every rank arms the same modules
            _arm_modules()

    def _dropped(self) -> None:
        with self._lock:
            self._maybe_uninstall()

    def _watch_for(self, shard: Any) -> Watch | None:
        watch = self.pending.get(shard)
        if watch is not None:
            return watch
        if self.open:
            return self.open[-1]
        return self.everything

    def _maybe_uninstall(self) -> None:
        if (
            self.everything is None
            and not self.open
            and not any(True for _ in self.pending)  # live keys: a finalizer runs before the
            and not any(True for _ in self.observing)  # dictionary forgets the dead one
            and not any(not t.closed for t in self.tapes)
        ):
            self.uninstall()

    # -- wrappers ----------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the iterator classes now or when imported (the ledger's import hooks)."""
        with self._lock:
            if self.installed:
                return
            self.installed = True
            observed.installed(torch_loaded="torch" in sys.modules)
            for name in ("torch.utils.data.dataloader", "accelerate.data_loader"):
                self.patches.when_imported(name, self._on_import)
            for name, _ in observed.DATA_PARALLEL_CLASSES[:2]:
                self.patches.when_imported(name, self._on_import)
            for name in observed.FULLY_SHARD_MODULES:
                self.patches.when_imported(name, self._on_import)

    def _on_import(self, module: Any) -> None:
        with self._lock:
            if not self.installed:
                return
            name = getattr(module, "__name__", "")
            if name == "torch.utils.data.dataloader":
                cls = module._BaseDataLoaderIter
                if not self.patches.replaced(cls, "__next__"):
                    self.patches.wrap(cls, "__next__", self._next)
                if not self.patches.replaced(cls, "_next_index"):
                    self.patches.wrap(cls, "_next_index", self._next_index)
            elif name in dict(observed.DATA_PARALLEL_CLASSES[:2]):  # DDP, FSDP
                cls = getattr(module, dict(observed.DATA_PARALLEL_CLASSES)[name], None)
                init = cls.__dict__.get("__init__") if isinstance(cls, type) else None
                if init is not None and not self.patches.replaced(cls, "__init__"):
                    self.patches.wrap(cls, "__init__", _note_module)
            elif name in observed.FULLY_SHARD_MODULES:
                shard = getattr(module, "fully_shard", None)
                if callable(shard) and not self.patches.replaced(module, "fully_shard"):
                    self.patches.wrap(module, "fully_shard", _note_sharded)
            elif name == "accelerate.data_loader":
                cls = module.BatchSamplerShard
                if not self.patches.replaced(cls, "__iter__"):
                    self.patches.wrap(cls, "__iter__", self._shard_iter)
                stream = module.IterableDatasetShard
                if not self.patches.replaced(stream, "__iter__"):
                    self.patches.wrap(stream, "__iter__", self._stream_iter)

    def _destroy(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        """Before the process group goes (every rank calls this): the observed epochs some
        rank had not published are compared now (:mod:`~rngaudit.epochs.unpublished`)."""
        if not args and not kw:  # the default group (a subgroup's end leaves the store)
            with RECORDER.paused():
                self.settle()
        return wrapped(*args, **kw)

    def _hook_destroy(self) -> None:
        """This rank observes a loader no known class shards: before the process group goes
        (or at exit) it closes it and compares the epochs still waiting in ``later``."""
        try:
            if not len(self.exit_patches):  # the group's end, step "epochs"
                group_end.before_destroy(group_end.EPOCHS, self._destroy)
                self.exit_patches.add_undo(lambda: group_end.forget_destroy(group_end.EPOCHS))
            if not self._exit_registered:
                self._exit_registered = True
                group_end.at_exit(group_end.EPOCHS, self._at_exit)
        except Exception:
            log.debug("rngaudit: could not watch destroy_process_group", exc_info=True)

    def _at_exit(self) -> None:
        """At interpreter exit with the process group still alive and not settled (no
        ``destroy_process_group()``): the same, never raising (an error found is printed)."""
        try:
            if len(self.exit_patches) and exchange.distributed() is not None:
                self.settle()
        except Exception as exc:
            sys.stderr.write(f"{exc}\n")

    def settle(self) -> None:
        """Close this rank's observed loaders, wait (``unpublished.WAIT`` at most) for the
        other ranks to publish or close the epochs still pending here, and judge those every
        rank published; those some rank did not are named in a warning (not compared)."""
        self._publish_open()
        for tape in list(self.tapes):  # epochs still open here: left early, published now
            if tape.context[1] is None and not tape.closed:
                self._left_early(tape)
        with self._lock:
            left, self.left = self.left, []
        for epoch, summary in left:
            early.publish(epoch, summary)  # before this rank closes the loader
        with self._lock:
            waiting, self.later = [*self.later, *(e for e, _ in left)], []
            keys = sorted(self._observed_keys)
        if not keys and not waiting:
            return
        try:
            unpublished.close(keys)
            timeout = min([unpublished.WAIT, *(e.watch.settings.timeout for e in waiting)])
            settled = unpublished.settle(waiting, float(timeout))
        except Exception as exc:  # the store gone first (its host rank ended): one line
            log.warning("rngaudit: could not compare the epochs still pending (%r)", exc)
            return
        with self._lock:
            self.exit_patches.undo()  # the process group goes: nothing more to close
        for epoch, published, missing in settled:
            if published is None and missing:
                log.warning(
                    "rngaudit: epoch %d of %s was not compared: %s did not publish it before "
                    "the process group was destroyed (a rank still iterating, or one that "
                    "never began it)",
                    epoch.epoch,
                    epoch.label,
                    ranks_phrase(missing),
                )
        self._judge_all([(e, got) for e, got, _ in settled if got is not None])

    def _publish_open(self) -> None:
        """The keyed epochs this rank left early (a ``break``) and never ended: what each took
        so far is published (an overlap among partial shares is duplication too), to be
        compared with the other pending epochs."""
        with self._lock:
            left, self.keyed_open = [e for e in self.keyed_open if not e.closed], []
        for current in left:
            current.closed = True
            with contextlib.suppress(Exception):
                summary = dict(
                    current.taken.summary(),
                    batch_size=current.loader.batch_size,
                    key_name=current.loader.spec.name,
                    partial=True,
                    data_parallel=observed.data_parallel_groups(scan=False),
                )
                observed.publish(current.epoch, summary)
                self._later(current.epoch)

    def uninstall(self) -> None:
        with self._lock:
            self.installed = False
            self.patches.undo()
            self._plain.clear()  # built over this installation's wrappers

    def _state(self, shard: Any) -> _LoaderState:
        state = self.loaders.get(shard)
        if state is None:
            # the store keys number the loader in the order this rank first checks it (the
            # same on every rank); its label is the loader's one name (naming.LOADERS), or the
            # shard's own for a loader never seen built (``DistributedSampler#1``)
            self._count += 1
            label = _loader_label(shard) or naming.LOADERS.name(shard)
            state = _LoaderState(self._count, label)
            self.loaders[shard] = state
        return state

    def _shard_iter(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        gen = wrapped(*args, **kw)
        if not self.installed or instance is None:
            return gen
        state = self._state(instance)
        state.tape = sharding.OrderTape()
        return _teed(instance, gen, state.tape)

    def _stream_iter(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        gen = wrapped(*args, **kw)
        if not self.installed or instance is None or sharding.stream_shard(instance) is None:
            return gen
        state = self._state(instance)
        state.tape = sharding.OrderTape()
        return _teed_stream(instance, gen, state.tape)

    def _next(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        if instance is None or RECORDER.busy():
            return wrapped(*args, **kw)
        current = instance.__dict__.get(_KEYED)
        if current is not None and current.source is instance.__dict__.get("_sampler_iter"):
            return self._keyed_pull(current, wrapped, *args, **kw)  # no plain subclass for it
        batch = wrapped(*args, **kw)
        epoch_key = id(getattr(instance, "_sampler_iter", None))
        if self.seen.get(instance) == epoch_key:
            return batch  # not the first batch of an epoch: nothing to do
        try:
            self.seen[instance] = epoch_key
        except TypeError:
            return batch
        with RECORDER.paused():  # the check's own work is not audited, nor re-entered
            self._first_batch(instance, batch)
        tape = instance.__dict__.get("_rngaudit_tape")
        if tape is not None and tape.context[1] is None:  # an observed epoch: its content
            with RECORDER.paused():
                first_step.content(tape, batch)
        with RECORDER.paused():
            keyed_epoch = self._keyed_first(instance, batch)
        # nothing to observe until the next epoch begins, or only the index batches
        self._go_plain(
            instance,
            observing=tape is not None and not tape.closed and not tape.teed,
            keyed=keyed_epoch,
        )
        return batch

    def _go_plain(self, iterator: Any, observing: bool = False, keyed: bool = False) -> None:
        """The rest of the epoch runs without any rngaudit frame: the iterator becomes a
        subclass of its own class whose ``__next__`` / ``_next_index`` are the originals where
        its class would reach this guard's wrappers (another library's wrapper, or an override
        of its own, is kept), and whose ``_reset`` (persistent workers: the next epoch) turns it
        back first; ``keyed``: its ``__next__`` still keeps each batch's sample ids. Never
        raises."""
        try:
            cls = type(iterator)
            if cls.__dict__.get(_PLAIN_MARK, False):
                return
            with self._lock:
                plain = self._plain.get((cls, observing, keyed))
                if plain is None:
                    plain = self._plain_subclass(cls, observing, keyed)
                    self._plain[(cls, observing, keyed)] = plain
            if plain is not cls:
                iterator.__class__ = plain
        except Exception:
            log.debug("rngaudit: could not take the order check off an iterator", exc_info=True)

    def _plain_subclass(self, cls: type, observing: bool, keyed: bool = False) -> type:
        """``cls`` without this guard's per-batch wrappers; ``observing``: its ``_next_index``
        still keeps each index batch (a plain function, no wrapper), or ``cls`` itself when
        that cannot be arranged."""
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "_reset": _plain_reset,
            _PLAIN_MARK: True,
        }
        ours = {(id(e.owner), e.name): e.original for e in self.patches.entries()}
        for name in ("__next__", "_next_index"):
            owner = next((k for k in cls.__mro__ if name in k.__dict__), None)
            attr = owner.__dict__[name] if owner is not None else None
            original = ours.get((id(owner), name))
            if isinstance(attr, wrapt.FunctionWrapper) and attr.__wrapped__ is original:
                namespace[name] = original  # our wrapper, with nothing over it
        if observing:
            if "_next_index" not in namespace:
                return cls  # the observation must go on through the wrapper
            namespace["_next_index"] = _observing_next_index(namespace["_next_index"], self)
        if keyed:
            if "__next__" not in namespace:
                return cls  # the keyed batches must go on through the wrapper
            namespace["__next__"] = _keyed_next(namespace["__next__"], self)
        if len(namespace) == 4:  # nothing of ours on its per-batch path
            return cls
        return type(cls.__name__, (cls,), namespace)

    def _next_index(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        """Every index batch a map-style sharded loader draws (main process, also with
        workers): observed into this epoch's :class:`~rngaudit.epochs.partition.Tape`."""
        if instance is None or RECORDER.busy():
            return wrapped(*args, **kw)
        state = instance.__dict__
        key = id(state.get("_sampler_iter"))
        if state.get("_rngaudit_epoch") != key:  # the epoch's first index batch
            state["_rngaudit_epoch"] = key
            state.pop("_rngaudit_draws", None)
            state.pop("_rngaudit_planned", None)
            source = state.get("_sampler_iter")  # before a tee replaces it
            with RECORDER.paused():
                first_step.sweep()  # the first-step hooks that fired: removed between forwards
                self._left_before(instance)
                if self.later:
                    self._compare_later()
                tape = state["_rngaudit_tape"] = self._open_tape(instance)
                if tape is not None:
                    self._tee(instance, tape)
                nodes = self._draws_to_record(instance)
            if nodes:
                batch = self._recorded(state, nodes, wrapped, *args, **kw)
                with RECORDER.paused():
                    state["_rngaudit_planned"] = _planned(source, tape, state.get("_index_sampler"))
                return batch
            if tape is not None and tape.context[1] is None:
                batch = self._observe(tape, wrapped, *args, **kw)
                with RECORDER.paused():
                    self._first_index(instance, tape, source, batch)
                return batch
        return self._observe(state.get("_rngaudit_tape"), wrapped, *args, **kw)

    def _tee(self, iterator: Any, tape: partition.Tape) -> None:
        """Observe the epoch with no rngaudit frame per batch: the iterator's index iterator
        becomes a chain of ``islice(tee_a, FOLD)`` segments (C code), the other tee branch
        holds the segment's index batches, and between segments a generator of ours folds
        them into the tape (once per ``FOLD`` batches); the segment that comes up short ends
        the epoch and compares it. Only torch's own iterators (torchdata's stateful ones save
        ``_sampler_iter``'s state), and roots up to ``TEE_MAX`` samples."""
        try:
            if type(iterator) not in _tee_classes() or tape.root_size > TEE_MAX:
                return
            state = iterator.__dict__
            source = state["_sampler_iter"]
            # a generator (BatchSampler's) or a builtin iterator stays exhausted once it is:
            # the second branch's last next() draws nothing (another iterator might restart)
            builtin = type(source).__module__ == "builtins"
            if not (isinstance(source, types.GeneratorType) or builtin):
                return
            first, second = itertools.tee(source)
            if isinstance(tape.left, early.Left):
                tape.left.second = second
            tape.teed = True
            segments = self._segments(first, second, tape)
            state["_sampler_iter"] = itertools.chain.from_iterable(segments)
            state["_rngaudit_epoch"] = id(state["_sampler_iter"])
        except Exception:
            log.debug("rngaudit: could not tee the index batches", exc_info=True)

    def _segments(self, first: Any, second: Any, tape: partition.Tape) -> Iterator[Any]:
        """The teed epoch's index batches, ``partition.FOLD`` at a time, each segment folded
        into ``tape`` when the next is asked for; a short one ends the epoch (the source is
        a generator or a builtin iterator: exhausted, it stays so)."""
        fold = partition.FOLD
        while True:
            yield early.segment(first, fold, tape)
            with RECORDER.paused():
                batches = list(itertools.islice(second, fold))
                tape.take(batches)
                if len(batches) < fold:
                    if not tape.closed:
                        self._epoch_end(tape)
                    return

    def _draws_to_record(self, iterator: Any) -> list[Any]:
        """The sampler chain of a watched DistributedSampler (whose ``__iter__`` may be a
        subclass's own), to record its draws while the epoch's first index batch is drawn."""
        try:
            nodes = sharding.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if not sharding.is_distributed_sampler(shard):
                return []
            with self._lock:
                return nodes if self._watch_for(shard) is not None else []
        except Exception:
            return []

    def _recorded(self, state: dict[str, Any], nodes: list[Any], pull: Any, *args: Any) -> Any:
        """The epoch's first index batch, the sampler draws made for it kept in ``state``
        (the order check compares their generator states at the first batch)."""
        window = RECORDER.begin()  # nested in the enclosing audit's, if any
        try:
            instrument_loaders.mark_samplers(RECORDER, nodes)
            return self._observe(state.get("_rngaudit_tape"), pull, *args)
        finally:
            try:
                events = RECORDER.events_since(window)
                state["_rngaudit_draws"] = [
                    _draw_summary(e) for e in events if e.get("sampler") and e["kind"] == DRAW
                ]
            except Exception:
                log.debug("rngaudit: could not read the first index batch's draws", exc_info=True)
            RECORDER.end(window)

    def _observe(self, tape: partition.Tape | None, pull: Callable[..., Any], *args: Any) -> Any:
        """One index batch from ``pull``, kept in ``tape``; when the rank has drawn its whole
        share of the epoch (StopIteration), the ranks compare the epoch."""
        if tape is None or tape.teed:
            return pull(*args)
        try:
            batch = pull(*args)
        except StopIteration:
            if not tape.closed:
                with RECORDER.paused():
                    self._epoch_end(tape)
            raise
        tape.add(batch)
        return batch

    def _open_tape(self, iterator: Any) -> partition.Tape | None:
        try:
            if peek.integer(peek.attr(iterator, "_dataset_kind"), 1) != 0:  # not map-style
                return None
            nodes = sharding.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if shard is None:
                return self._open_observed(iterator, nodes)
            with self._lock:
                watch = self._watch_for(shard)
                if watch is None:
                    return None
                state = self._state(shard)
            mapping = partition.root_mapping(peek.attr(iterator, "_dataset"))
            if mapping is None:
                return None
            context = (watch, shard, sharding.chain_name(nodes), state.checks)
            tape = partition.Tape(mapping[0], mapping[1], context)
            if sharding.has_own_iter(shard):  # its epoch may be compared as it is drawn
                tape.left = early.left_of(iterator)
            with self._lock:
                self.tapes.add(tape)
            weakref.finalize(tape, self._dropped)  # an epoch never finished: stop waiting
            return tape
        except Exception:  # the auditor must never break the loader
            log.warning("rngaudit: could not observe the loader's partition", exc_info=True)
            return None

    def _open_observed(self, iterator: Any, nodes: list[Any]) -> partition.Tape | None:
        """An epoch of a map-style loader no known class shards, in a run of several ranks:
        announced through the store and observed (:mod:`rngaudit.epochs.observed`)."""
        if exchange.distributed() is None or not nodes:
            return None
        index = nodes[0]
        with self._lock:
            watch = self.observing.get(index) or (self.open[-1] if self.open else self.everything)
            if watch is None:
                return None
            known = self.observed.get(index)
        dataset = peek.attr(iterator, "_dataset")
        if known is None:
            root = partition.root_of(dataset)
            identity = partition.root_identity(root)
            chain = sharding.chain_name(nodes)
            batch = peek.attr(index, "batch_size")
            with self._lock:
                base = f"{identity}|{chain}|{batch}"
                occurrence = self._occurrences.get(base, 0)
                self._occurrences[base] = occurrence + 1
                # the loader's one name if it was seen built, else named the same on every
                # rank that iterates it (never by _count: the sharded loaders' exchange keys
                # use it, and a loader one rank iterates must not move it)
                label = _loader_label(index) or (
                    f"DataLoader over {type(root).__name__}(len={peek.size(root)})"
                    + (f" #{occurrence + 1}" if occurrence else "")
                )
                known = _Observed(observed.loader_key(identity, chain, batch, occurrence), label,
                                  identity)  # fmt: skip
                self.observed[index] = known
        if not watch.every_epoch and known.epochs > 0:
            return None
        mapping = partition.root_mapping(dataset)
        if mapping is None:
            return None
        epoch = observed.Epoch(
            known.key, known.epochs, known.label, sharding.chain_name(nodes), watch
        )
        known.epochs += 1
        self._observed_keys.add(known.key)
        self._hook_destroy()  # this rank closes the loader there: no rank waits for it
        observed.start(epoch)
        torch = sys.modules.get("torch")
        training = bool(torch.is_grad_enabled()) if torch is not None else False
        tape = partition.Tape(mapping[0], mapping[1], (watch, None, epoch, known, training))
        tape.left = early.left_of(iterator)
        known.open = weakref.ref(tape)
        early.watch(iterator, tape, self._left_early)  # a break: the iterator goes first
        with self._lock:
            self.tapes.add(tape)
        weakref.finalize(tape, self._dropped)
        return tape

    def _first_index(self, iterator: Any, tape: partition.Tape, source: Any, batch: Any) -> None:
        """An observed epoch's first index batch: what the data-parallel ranks compare at their
        next training forward (:mod:`~rngaudit.epochs.first_step`): the batch's root samples
        and the whole epoch when its sampler's iterator holds it (read without a draw)."""
        try:
            _, _, epoch, known, training = tape.context
            _arm_modules()
            if len(observed._FOUND) == 0:
                return  # no data-parallel module: no training forward every rank is known to make
            summary: dict[str, Any] = {"known": False}
            indices = ahead.epoch_indices(source, batch, peek.attr(iterator, "_index_sampler"))
            if indices is not None:
                size = len(batch) if isinstance(batch, list) else 1
                whole = partition.Tape(tape.maps, tape.root_size)
                whole.take_indices(indices, -(-len(indices) // max(1, size)))
                summary = dict(whole.summary(), identity=known.identity, training=training)
            record = {
                "key": epoch.key,
                "epoch": epoch.epoch,
                "first": _roots(tape, batch),
                "root_size": tape.root_size,
                "ahead": summary,
                "training": training,
            }
            first_step.started(first_step.Started(epoch, weakref.ref(tape), record, self))
        except Exception:
            log.warning("rngaudit: could not read the observed epoch ahead", exc_info=True)

    def _judge_first(self, epoch: observed.Epoch, published: dict[int, dict[str, Any]]) -> bool:
        """The verdict on an observed epoch at its first training step, from every rank of the
        data-parallel group (the same on each): the whole epoch each rank's sampler holds.
        True when the epoch is to be compared again at later training forwards (a loader that
        partitioned before, read lazily, whose first batches do not overlap)."""
        if any(p.get("keyed") for p in published.values()):
            self._judge_keyed_first(epoch, published)
            return False
        found: list[Finding] = []
        again = False
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            unlike = order_rules.unlike_content(published)
            summaries = {r: p.get("ahead") or {} for r, p in published.items()}
            if _one_loader(summaries):
                finding, exact = order_rules.observed_overlap(
                    summaries, epoch.label, epoch.chain, epoch.epoch,
                    epoch.key in self.partitioned, True, ahead=True,
                )  # fmt: skip
                if exact:
                    self.partitioned.add(epoch.key)
            elif epoch.key in self.partitioned:  # read lazily: its first batches are evidence
                finding = order_rules.first_batches_overlap(
                    _first_batches(published), epoch.label, epoch.chain, epoch.epoch
                )
                again = finding is None and not unlike
            else:
                return False
            if finding is not None and unlike:
                finding = order_rules.content_differs(finding)
            if finding is not None:
                found = _decided_early(epoch, label, finding, published)
        except Exception:
            log.warning("rngaudit: the first-step comparison could not compare", exc_info=True)
        _act(found, epoch.watch, label)
        return again

    def _judge_so_far(
        self,
        epoch: observed.Epoch,
        published: dict[int, dict[str, Any]],
        forwards: int,
        sharded_by: str | None = None,
    ) -> bool:
        """The verdict on a lazily read epoch of a loader that partitioned before (or that
        ``sharded_by``, a DistributedSampler subclass, shards from draws that differ), from what
        every rank of the group had been handed by its ``forwards``-th training forward of it
        (the same on each rank); True when decided (a finding: raised or warned)."""
        found: list[Finding] = []
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            finding = order_rules.first_batches_overlap(
                published, epoch.label, epoch.chain, epoch.epoch, forwards, sharded_by
            )
            if finding is not None:
                found = _decided_early(epoch, label, finding, published)
        except Exception:
            log.warning("rngaudit: the observed partition could not compare", exc_info=True)
        _act(found, epoch.watch, label)
        return bool(found)

    def _warn_first(
        self, epoch: observed.Epoch, missing: list[int], arrived: list[int], timeout: float
    ) -> None:
        """Ranks of the data-parallel group did not reach the training forward: a warning."""
        finding = fk.rank_missing(
            missing, arrived,
            where="reach the first training step of an observed epoch", timeout=timeout,
            unseen="the epochs they were about to train on", severity="warning",
            remedy="Nothing to fix if only some ranks train this module; the epoch is still "
            "compared when every rank has drawn it.",
            details={"loader": epoch.label, "epoch": epoch.epoch, "check": "first-step"},
        )  # fmt: skip
        label = f"first training step of epoch {epoch.epoch} of {epoch.label}"
        with contextlib.suppress(Exception):
            epoch.watch.session.add_check(label, [finding], arrived)
        _act([finding], epoch.watch, label)

    def _observed_end(self, tape: partition.Tape) -> None:
        """Publish what this rank took in an observed epoch; compare when every rank has."""
        _, _, epoch, known, training = tape.context
        early.done(tape)
        first_step.unfollow(tape)
        try:
            groups = observed.data_parallel_groups(scan=not known.scanned)
            known.scanned = True
            summary = dict(
                tape.summary(), identity=known.identity, training=training, data_parallel=groups
            )
            summary.update(first_step.fields(tape))
            got = observed.finish(epoch, summary)
        except Exception:
            log.warning("rngaudit: could not publish the loader's observed epoch", exc_info=True)
            return
        finally:
            with self._lock:
                self._maybe_uninstall()
        if got is None:
            self._later(epoch)
            return
        self._judge(epoch, got)

    def _left_early(self, tape: partition.Tape) -> None:
        """This rank left ``tape``'s observed epoch before its end (its iterator went, the
        loader began a new epoch, or the process group goes): what it was handed is kept to be
        published (:func:`~rngaudit.epochs.early.fold`). Takes no lock (a finalizer may run it
        anywhere); never raises."""
        try:
            _, _, epoch, known, training = tape.context
            first_step.unfollow(tape)
            folded = early.fold(tape)
            if folded is None:
                return
            groups = observed.data_parallel_groups(scan=False)
            summary = dict(folded, identity=known.identity, training=training,
                           data_parallel=groups)  # fmt: skip
            summary.update(first_step.fields(tape))
            self.left.append((epoch, summary))
            del self.left[: -observed.MAX_PENDING]
        except Exception:
            log.debug("rngaudit: could not keep an epoch left early", exc_info=True)

    def _left_before(self, iterator: Any) -> None:
        """A new epoch of an observed loader whose previous epoch this rank left early (a
        ``break``, then a new ``for``): what the rank took of it is published and compared now,
        as at an epoch's end (:func:`~rngaudit.epochs.observed.finish`); raises as the verdict
        says."""
        try:
            nodes = sharding.chain(peek.attr(iterator, "_index_sampler"))
            known = self.observed.get(nodes[0]) if nodes else None
            if known is None:
                return
            tape = known.open() if known.open is not None else None
            if tape is not None and not tape.closed:
                self._left_early(tape)
            mine = [item for item in list(self.left) if item[0].key == known.key]
            for item in mine:  # in place: a finalizer may append meanwhile
                with contextlib.suppress(ValueError):
                    self.left.remove(item)
        except Exception:
            log.debug("rngaudit: could not look for an epoch left early", exc_info=True)
            return
        for epoch, summary in mine:
            try:
                got = observed.finish(epoch, summary)
            except Exception:
                log.warning(
                    "rngaudit: could not publish the loader's observed epoch", exc_info=True
                )
                continue
            if got is None:
                with self._lock:
                    self.later.append(epoch)
                    del self.later[: -observed.MAX_PENDING]
            else:
                self._judge(epoch, got)

    def _compare_later(self) -> None:
        """The published epochs every rank has published since: compared now, oldest first."""
        with self._lock:
            waiting, self.later = self.later, []
        ready = []
        for epoch in waiting:
            try:
                got = observed.collect(epoch)
            except Exception:
                log.debug("rngaudit: could not read an observed epoch", exc_info=True)
                continue
            if got is None:
                with self._lock:
                    self.later.append(epoch)
            else:
                ready.append((epoch, got))
        self._judge_all(ready)  # the epochs still waiting are kept above

    def _judge_all(self, ready: list[tuple[observed.Epoch, list[dict[str, Any]]]]) -> None:
        """Judge every epoch, oldest first, each one's findings filed in the report; the
        first error is raised once all are judged (an earlier epoch's error never leaves a
        later one uncompared and unreported)."""
        first: RNGAuditError | None = None
        for epoch, got in ready:
            try:
                self._judge(epoch, got)
            except RNGAuditError as exc:
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def _judge(self, epoch: observed.Epoch, published: list[dict[str, Any]]) -> None:
        """The verdict on one observed epoch, from every rank's summary (the same on every
        rank): raised or warned as the watch's mode says."""
        if any(r.get("keyed") for r in published):
            self._judge_keyed(epoch, published)
            return
        found: list[Finding] = []
        label = f"observed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            summaries = {int(r["rank"]): r for r in published}
            if (epoch.key, epoch.epoch) in first_step.DECIDED:
                return  # judged, with a finding, before its first training step
            left = any(s.get("partial") for s in summaries.values())
            if not _one_loader(summaries, left):
                if left:
                    log.info("rngaudit: epoch %d of %s was left early and not compared (what "
                             "a rank took is unknown)", epoch.epoch, epoch.label)  # fmt: skip
                return
            unlike = order_rules.unlike_content(summaries)
            # a data-parallel signal only when every rank published one; the overlap is then
            # judged within this rank's data-parallel group
            data_parallel, summaries = _within_group(summaries)
            finding, exact = order_rules.observed_overlap(
                summaries, epoch.label, epoch.chain, epoch.epoch,
                epoch.key in self.partitioned, data_parallel,
                left=early.phrase(summaries) if left else None,
            )  # fmt: skip
            if exact and not left:  # a partial epoch is no evidence that the loader partitions
                self.partitioned.add(epoch.key)
            if finding is not None and unlike:
                finding = order_rules.content_differs(finding)
            if finding is not None:
                found.append(finding)
                epoch.watch.session.add_check(label, found, _ranks_of(published))
        except Exception:
            log.warning("rngaudit: the observed partition could not compare", exc_info=True)
        _act(found, epoch.watch, label)

    # -- keyed streams -------------------------------------------------------------------------
    def _keyed_first(self, iterator: Any, batch: Any) -> bool:
        """The first batch of an epoch of an iterable-style loader: when it is keyed (by
        :func:`~rngaudit.epochs.keyed.sample_key`, or by ``RNGAUDIT_SAMPLE_KEY`` when its batch
        holds that field), its epoch is announced and this batch's ids kept; an earlier epoch
        left early is published first. Whether the epoch is observed; never raises but what
        the published earlier epoch's verdict raises."""
        try:
            if exchange.distributed() is None:
                return False
            if peek.integer(peek.attr(iterator, "_dataset_kind"), 0) != 1:  # map-style
                return False
            index = peek.attr(iterator, "_index_sampler")
            dataset = peek.attr(iterator, "_dataset")
            with self._lock:
                try:
                    seen = index in self.keyed
                except TypeError:  # an unhashable index sampler: never keyed
                    return False
                known = self.keyed.get(index)
            if not seen:
                known = self._keyed_loader(index, dataset, batch)
            if known is None:
                return False
            with self._lock:
                watch = self.observing.get(index) or (
                    self.open[-1] if self.open else self.everything
                )
        except Exception:
            log.warning("rngaudit: could not observe the keyed loader", exc_info=True)
            return False
        if watch is None:
            return False
        if known.current is not None and not known.current.closed:  # the last epoch, left early
            self._keyed_end(known.current, partial=True)
        self._keyed_pending(known.key)
        if not watch.every_epoch and known.epochs > 0:
            return False
        try:
            epoch = observed.Epoch(
                known.key, known.epochs, known.label, f"keyed by {known.spec.name}", watch
            )
            known.epochs += 1
            self._observed_keys.add(known.key)
            self._hook_destroy()  # this rank closes the loader there: no rank waits for it
            observed.start(epoch)
            current = _KeyedEpoch(known, epoch, iterator.__dict__.get("_sampler_iter"))
            current.add(batch)
            known.current = current
            with self._lock:
                self.keyed_open = [e for e in self.keyed_open if not e.closed][
                    -observed.MAX_PENDING :
                ]
                self.keyed_open.append(current)
            iterator.__dict__[_KEYED] = current
        except Exception:
            log.warning("rngaudit: could not observe the keyed loader", exc_info=True)
            return False
        self._keyed_first_step(current, batch)
        return True

    def _keyed_first_step(self, current: _KeyedEpoch, batch: Any) -> None:
        """Under a data-parallel module, the keyed epoch's first batch: its ids compared by the
        group at the module's next training forward (:mod:`~rngaudit.epochs.first_step`),
        before the step; a first batch two ranks share is proof of duplication."""
        try:
            _arm_modules()
            if len(observed._FOUND) == 0:
                return  # no data-parallel module: no training forward every rank makes
            ids = keyed.read(batch, current.loader.spec.key)
            if ids is None:
                return
            first = keyed.Taken()
            first.add(ids)
            record = {
                "key": current.epoch.key,
                "epoch": current.epoch.epoch,
                "keyed": True,
                "first_ids": first.summary(),
                "key_name": current.loader.spec.name,
            }
            item = first_step.Started(current.epoch, weakref.ref(current), record, self)
            first_step.started(item)
        except Exception:
            log.warning("rngaudit: could not arm the keyed first-step check", exc_info=True)

    def _keyed_pending(self, key: str) -> None:
        """The earlier epochs of the keyed loader ``key`` this rank published before the
        others had announced them (it ran ahead): compared now, waited for when every rank
        has announced them since (they are drawing them)."""
        with self._lock:
            mine = [e for e in self.later if e.key == key]
        for epoch in mine:  # (a rank never waits here for an epoch it alone iterates)
            try:
                got = observed.announced(epoch)
            except Exception:
                log.debug("rngaudit: could not read a keyed epoch", exc_info=True)
                continue
            if got is None:
                continue
            with self._lock:
                self.later = [e for e in self.later if e is not epoch]
            self._judge(epoch, got)  # may raise: the epochs still waiting are kept

    def _keyed_loader(self, index: Any, dataset: Any, batch: Any) -> _KeyedLoader | None:
        """The keyed loader of ``index`` (its declared key, or the environment's field when
        its first batch holds it), remembered (None: not keyed)."""
        spec = keyed.registered(index, dataset)
        if spec is None:
            with self._lock:
                watch = self.observing.get(index) or (
                    self.open[-1] if self.open else self.everything
                )
            field_name = watch.settings.sample_key if watch is not None else None
            if field_name and keyed.read(batch, field_name) is not None:
                spec = keyed.spec_of(field_name)
        if spec is None:
            with contextlib.suppress(TypeError), self._lock:
                self.keyed[index] = None
            return None
        batch_size = peek.attr(index, "batch_size")
        size = batch_size if isinstance(batch_size, int) and batch_size > 0 else None
        cls = type(dataset)
        identity = keyed.identity(dataset, spec, size)
        with self._lock:
            # the loader's place among those of its identity: in the order sample_key keyed
            # them (every rank runs that code), else the order this rank first iterates them
            try:
                ordinal: int | None = keyed.ORDINALS.get(index)
            except TypeError:
                ordinal = None
            if ordinal is not None:
                occurrence, where = ordinal, "declared"
            else:
                base = f"keyed|{identity}"
                occurrence = self._occurrences.get(base, 0)
                self._occurrences[base] = occurrence + 1
                where = "iterated"
            label = _loader_label(index) or (
                f"DataLoader over {cls.__name__}" + (f" #{occurrence + 1}" if occurrence else "")
            )
            known = _KeyedLoader(
                observed.loader_key(identity, f"keyed {where}", size, occurrence), label, spec, size
            )
            try:
                self.keyed[index] = known
            except TypeError:
                return None
        return known

    def _keyed_pull(
        self, current: _KeyedEpoch, pull: Callable[..., Any], *args: Any, **kw: Any
    ) -> Any:
        """One batch of a keyed epoch, its ids kept; at the epoch's end (StopIteration) this
        rank's share is published and compared."""
        try:
            batch = pull(*args, **kw)
        except StopIteration:
            if not current.closed:
                with RECORDER.paused():
                    self._keyed_end(current)
            raise
        current.add(batch)
        return batch

    def _keyed_end(self, current: _KeyedEpoch, partial: bool = False) -> None:
        """Publish what this rank took in a keyed epoch (``partial``: it left the epoch early);
        compare when every rank has, else later (as an observed epoch)."""
        current.closed = True
        known, epoch = current.loader, current.epoch
        try:
            groups = observed.data_parallel_groups(scan=not known.scanned)
            known.scanned = True
            summary = dict(
                current.taken.summary(),
                batch_size=known.batch_size,
                key_name=known.spec.name,
                partial=partial,
                data_parallel=groups,
            )
            current.taken = keyed.Taken()  # published: the ids are not held any longer
            observed.publish(epoch, summary)
        except Exception:
            log.warning("rngaudit: could not publish the keyed loader's epoch", exc_info=True)
            return
        self._keyed_pending(known.key)  # earlier epochs first (may raise)
        try:
            got = observed.finish(epoch, summary)
        except Exception:
            log.warning("rngaudit: could not publish the keyed loader's epoch", exc_info=True)
            return
        if got is None:
            self._later(epoch)
            return
        self._judge(epoch, got)

    def _later(self, epoch: observed.Epoch) -> None:
        with self._lock:
            self.later.append(epoch)
            dropped = self.later[: -observed.MAX_PENDING]
            self.later = self.later[-observed.MAX_PENDING :]
        for old in dropped:  # never published by every rank (one rank's loader)
            observed.forget(old)

    def _judge_keyed_first(
        self, epoch: observed.Epoch, published: dict[int, dict[str, Any]]
    ) -> None:
        """The data-parallel group's first batches of a keyed epoch, at the module's first
        training forward on it: an id two ranks' first batches share is an error (no padding
        comes first), raised before the step."""
        found: list[Finding] = []
        label = f"first batches of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            if not all(p.get("keyed") for p in published.values()):
                return
            firsts = {r: p.get("first_ids") or {} for r, p in published.items()}
            name = str(published[min(published)].get("key_name"))
            finding = keyed.verdict(firsts, epoch.label, name, epoch.epoch, 0, True, [], True)
            if finding is not None:
                found.append(finding)
                first_step.DECIDED.add((epoch.key, epoch.epoch))
                epoch.watch.session.add_check(label, found, published)
        except Exception:
            log.warning("rngaudit: the keyed first-step comparison failed", exc_info=True)
        _act(found, epoch.watch, label)

    def _judge_keyed(self, epoch: observed.Epoch, published: list[dict[str, Any]]) -> None:
        """The verdict on one keyed epoch (the same on every rank): raised or warned."""
        found: list[Finding] = []
        label = f"keyed partition of epoch {epoch.epoch} of {epoch.label} ({epoch.chain})"
        try:
            if (epoch.key, epoch.epoch) in first_step.DECIDED:
                return  # judged, with a finding, before its first training step
            summaries = {int(r["rank"]): r for r in published}
            if not all(s.get("keyed") for s in summaries.values()):
                return
            data_parallel, summaries = _within_group(summaries)
            mine = summaries.get(exchange.current_rank(), {})
            partial = sorted(r for r, s in summaries.items() if s.get("partial"))
            finding = keyed.verdict(
                summaries, epoch.label, str(mine.get("key_name")), epoch.epoch,
                mine.get("batch_size"), data_parallel, partial,
            )  # fmt: skip
            if finding is not None:
                found.append(finding)
                epoch.watch.session.add_check(label, found, _ranks_of(published))
        except Exception:
            log.warning("rngaudit: the keyed partition could not compare", exc_info=True)
        _act(found, epoch.watch, label)

    def _epoch_end(self, tape: partition.Tape) -> None:
        """The ranks compare the samples each was handed this epoch; every rank raises on an
        overlap beyond padding."""
        if tape.context[1] is None:
            self._observed_end(tape)
            return
        watch, shard, chain, epoch = tape.context
        found: list[Finding] = []
        first_step.unfollow(tape)
        with self._lock:
            state = self._state(shard)
        label = f"partition of epoch {epoch} of {state.label} ({chain})"
        if (_shard_key(state), epoch) in first_step.DECIDED:
            with self._lock:  # found as it was drawn, on every rank: not judged again
                self._maybe_uninstall()
            return
        try:
            record: dict[str, Any] = {
                "loader": state.label,
                "epoch": epoch,
                "chain": chain,
                "partition": tape.summary(),
                **peers.end_fields(shard),
            }
            result = self._swap(record, f"partition/{state.index}/{epoch}", watch, "partition")
            if result is not None:
                summaries = {int(r["rank"]): r["partition"] for r in result[0] if "partition" in r}
                summaries, stated = peers.as_replicas(summaries, result[0])  # across replicas
                if stated is not None:
                    label += f" across {stated.describe()}"
                finding = order_rules.partition_overlap(
                    summaries, state.label, chain, epoch, sharding.allowance(shard)
                )
                if finding is not None:
                    found.append(finding)
                    watch.session.add_check(label, found, _ranks_of(result[0]))
                elif stated is not None:  # the report says which replicas were judged
                    watch.session.add_check(label, found, _ranks_of(result[0]))
        except Exception:
            log.warning("rngaudit: the partition check could not compare", exc_info=True)
        finally:
            with self._lock:
                self._maybe_uninstall()
        _act(found, watch, label)

    def _measure_planned(
        self,
        found: list[Finding],
        record: schema.EpochRecord,
        watch: Watch,
        state: _LoaderState,
        planned: Any,
    ) -> list[Finding]:
        """The sampler drew its order from state that differs across ranks while its seed and
        epoch agree: the harm is decided by what the ranks are about to be handed. Each rank's
        whole epoch, read from the list its sampler's ``__iter__`` returned (no draw), is
        exchanged (every rank takes this branch: the rules saw the same records); see
        :func:`~rngaudit.epochs.order_rules.planned_overlap` for the verdict."""
        mine = {
            "loader": record["loader"],
            "epoch": record["epoch"],
            "planned": _planned_summary(planned) or {"known": False},
        }
        result = self._swap(mine, f"planned/{state.index}/{state.checks}", watch, "order")
        rows = result[0] if result is not None else []
        summaries = {int(r["rank"]): r["planned"] for r in rows if "planned" in r}
        return order_rules.planned_overlap(summaries, found, len(rows) == len(summaries) > 1)

    def _swap(
        self, record: dict[str, Any], key: str, watch: Watch, what: str
    ) -> tuple[list[dict[str, Any]], list[int]] | None:
        """Exchange ``record`` under ``key``: every rank's record (groups expanded) and the
        ranks that did not arrive, or None. The signature covers everything the rules read but
        the rank: equal ranks form one group, and each rank fetches one record per group
        (O(groups), not O(world), per rank and check)."""
        comparable = {k: v for k, v in record.items() if k not in ("rank", "signature")}
        record["signature"] = exchange.signature(comparable)
        where = exchange.distributed()
        record["rank"] = where[0] if where is not None else 0
        info = {"label": f"{what} check of {record['loader']}", "mode": watch.settings.mode}
        try:
            result = exchange.exchange(record, key, watch.settings.timeout, info=info)
        except Exception:
            log.warning("rngaudit: the %s check could not exchange", what, exc_info=True)
            return None
        return cast(list[dict[str, Any]], expand_groups(result.records)), list(result.missing)

    # -- the check -----------------------------------------------------------------------------
    def _first_batch(self, iterator: Any, batch: Any = None) -> None:
        try:
            nodes = sharding.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if shard is None:  # an iterable dataset that splits one stream between ranks
                shard = sharding.stream_shard(peek.attr(iterator, "_dataset"))
                if shard is None:
                    return
                nodes = [shard]
            with self._lock:
                watch = self._watch_for(shard)
                if watch is None:
                    return
                state = self._state(shard)
                if not watch.every_epoch and state.checks > 0:
                    return
                record = self._record(iterator, nodes, shard, state)
            record.update(peers.first_fields(shard, batch))  # type: ignore[typeddict-item]
        except Exception:  # the auditor must never break the loader
            log.warning("rngaudit: could not prepare the order check", exc_info=True)
            return
        planned = (peek.attr(iterator, "__dict__") or {}).pop("_rngaudit_planned", None)
        found = self._exchange(record, watch, state, planned)
        del planned  # the epoch's list, kept only for this check
        if any(f.details.get("shares") == "unread" for f in found):
            self._follow_drawn(iterator, shard, state, record, watch)
        with self._lock:
            state.checks += 1
            state.previous = record
            if not watch.every_epoch and self.pending.get(shard) is watch:
                del self.pending[shard]
                self._maybe_uninstall()
        _act(found, watch, f"epoch {record['epoch']} of {record['loader']}")

    def _follow_drawn(
        self,
        iterator: Any,
        shard: Any,
        state: _LoaderState,
        record: schema.EpochRecord,
        watch: Watch,
    ) -> None:
        """A DistributedSampler subclass drew its epoch from state that differs across ranks
        and yields it lazily (its shares could not be read ahead, a warning): under the one
        data-parallel module of the whole world, what each rank was handed is compared at its
        training forwards 2, 4, 8, ... of the epoch (:func:`~rngaudit.epochs.first_step.follow`),
        each before the next step; the epoch's end is the check without one. Every rank takes
        this branch (the finding came from the same records); never raises."""
        try:
            tape = (peek.attr(iterator, "__dict__") or {}).get("_rngaudit_tape")
            where = exchange.distributed()
            if tape is None or tape.closed or where is None or not tape.known:
                return
            _arm_modules()
            modules = list(observed._FOUND.values())
            replicas = peek.integer(peek.attr(shard, "num_replicas"), -1)
            if len(modules) != 1 or replicas != where[1]:
                return  # which module's steps every rank takes is not known: the epoch's end
            if first_step._group(modules[0]) != list(range(where[1])):
                return
            epoch = observed.Epoch(
                _shard_key(state), record["epoch"], state.label, record["chain"], watch
            )
            torch = sys.modules.get("torch")
            item = first_step.Started(
                epoch,
                weakref.ref(tape),
                {
                    "training": bool(torch.is_grad_enabled()) if torch is not None else False,
                    "sharded_by": f"{type(shard).__name__} (a DistributedSampler subclass)",
                },
                self,
            )
            first_step.follow(item, modules[0], forwards=0)
        except Exception:
            log.debug("rngaudit: could not follow the epoch as it is drawn", exc_info=True)

    def _record(
        self, iterator: Any, nodes: list[Any], shard: Any, state: _LoaderState
    ) -> schema.EpochRecord:
        record: schema.EpochRecord = {
            "loader": state.label,
            "epoch": state.checks,
            "chain": sharding.chain_name(nodes),
            "shuffling": sharding.is_shuffling(nodes),
            "dataset": (
                sharding.describe_stream(shard)
                if shard is nodes[0] and sharding.stream_shard(shard) is not None
                else sharding.describe_dataset(peek.attr(iterator, "_dataset"))
            ),
            "content": sharding.describe_content(peek.attr(iterator, "_dataset")),
            "sampler_state": None,
            # batches this epoch had yielded when its first batch came back (1, or more after a
            # resume: a StatefulDataLoader restored mid-epoch)
            "position": peek.integer(peek.attr(iterator, "_num_yielded"), -1),
            "order": [],
            "draws": [],
        }
        shares = sharding.stream_shares(shard) if shard is nodes[0] else None
        if shares is not None:  # a stream split by shards: which shards this rank reads
            record["shares"] = shares
        if sharding.is_distributed_sampler(shard):
            record["sampler_state"] = sharding.distributed_sampler_state(shard)
            # what its __iter__ drew for this epoch's first index batch (a subclass's own order)
            record["draws"] = list(iterator.__dict__.get("_rngaudit_draws") or [])
        else:
            record["order"] = list(state.tape.batches)
            record["draws"] = list(state.tape.draws)
        return record

    def _exchange(
        self,
        record: schema.EpochRecord,
        watch: Watch,
        state: _LoaderState,
        planned: Any = None,
    ) -> list[Finding]:
        record["dataset_draws"] = _split_draws(watch.session)
        exchanged = self._swap(
            cast(dict[str, Any], record), f"epoch/{state.index}/{state.checks}", watch, "order"
        )
        if exchanged is None:
            return []
        try:
            found = order_rules.compare(
                cast(list[schema.EpochRecord], exchanged[0]), exchanged[1], watch.settings.timeout
            )
        except Exception:
            log.warning("rngaudit: the order check could not compare", exc_info=True)
            return []
        found += peers.check_first(exchanged[0], record["loader"], record["chain"])
        if order_rules.only_draws_differ(found):
            found = self._measure_planned(found, record, watch, state, planned)
        repeat = order_rules.repeated(record, state.previous)
        if repeat is not None:
            found.append(repeat)
        label = f"epoch {record['epoch']} of {record['loader']} ({record['chain']})"
        label += peers.label(exchanged[0])  # the layout its peers were held to, if stated
        try:
            watch.session.add_check(label, found, _ranks_of(exchanged[0]))
        except Exception:
            log.warning("rngaudit: could not write the order check's report", exc_info=True)
        return found


def _ranks_of(records: Any) -> list[int]:
    """The ranks of exchanged records (those that took part in a check)."""
    return [int(r["rank"]) for r in records if isinstance(r, dict) and "rank" in r]


def _shard_key(state: _LoaderState) -> str:
    """The cross-rank key of a loader a known class shards, as an epoch compared as it is
    drawn names it (:meth:`EpochGuard._follow_drawn`)."""
    return f"shard/{state.index}"


def _decided_early(
    epoch: observed.Epoch, label: str, finding: Finding, published: dict[int, Any]
) -> list[Finding]:
    """A finding on an epoch before its end: filed in the report, and the epoch's end does not
    judge it again."""
    first_step.DECIDED.add((epoch.key, epoch.epoch))
    epoch.watch.session.add_check(label, [finding], published)
    return [finding]


def _planned(
    source: Any, tape: partition.Tape | None, index_sampler: Any = None
) -> tuple[Any, Any] | None:
    """This rank's whole epoch as its sampler's ``__iter__`` returned it, read without a draw
    or a ``next``: the sequence a builtin iterator walks (``__reduce__`` hands it over), found
    as the index iterator itself, the iterator a generator ``__iter__`` delegates to with
    ``yield from`` (its sequence's length must be the sampler's: the whole epoch, not one of
    several segments), or either as ``BatchSampler.__iter__``'s ``sampler_iter``, with
    ``tape`` (whose maps take it to root samples); None when the sampler yields lazily (a
    generator that yields item by item: what its loop body hands out is its own) or the epoch
    cannot be mapped. Only the sequence is kept here (no copy): it is summarised by
    :func:`_planned_summary` if the check needs it (draws alone differ)."""
    try:
        if tape is None or not tape.known:
            return None
        sampler = index_sampler
        it = source
        if isinstance(source, types.GeneratorType) and ahead.delegate(source) is None:
            frame = source.gi_frame
            it = frame.f_locals.get("sampler_iter") if frame is not None else None
            sampler = peek.attr(index_sampler, "sampler")
        inner = ahead.delegate(it)
        found = ahead.sequence(inner) if inner is not None else None
        if found is None:
            return None  # exhausted, or of another kind
        items = found[0]
        if inner is not it and peek.size(sampler) != len(items):
            return None  # one segment of a generator's epoch, or a length it does not tell
        return items, tape
    except Exception:
        log.debug("rngaudit: could not read the epoch the sampler returned", exc_info=True)
        return None


def _planned_summary(planned: Any) -> dict[str, Any] | None:
    """The root samples of the epoch :func:`_planned` kept, as a tape summarises them."""
    try:
        if not isinstance(planned, tuple):
            return None
        items, tape = planned
        values = ahead.ints(items)
        if values is None:
            return None
        epoch = partition.Tape(tape.maps, tape.root_size)
        epoch.take_indices(values, 1)
        summary = epoch.summary()
        return summary if summary.get("known") else None
    except Exception:
        log.debug("rngaudit: could not read the epoch the sampler returned", exc_info=True)
        return None


_KEYED = "_rngaudit_keyed"  # an iterator's keyed epoch (in its __dict__)


def _keyed_next(original: Callable[[Any], Any], guard: EpochGuard) -> Any:
    """``__next__`` of a keyed epoch, after its first batch: the original, each batch's sample
    ids kept, the epoch published when the loader's iterator ends."""

    def __next__(self: Any) -> Any:
        current = self.__dict__.get(_KEYED)
        if current is None or current.closed:
            return original(self)
        return guard._keyed_pull(current, original, self)

    return __next__


def _within_group(summaries: dict[int, dict[str, Any]]) -> tuple[bool, dict[int, dict[str, Any]]]:
    """Whether every rank published a data-parallel signal, and the summaries of this rank's
    data-parallel group (all of them when there is no signal or one group)."""
    data_parallel = all(s.get("data_parallel") for s in summaries.values())
    mine = exchange.current_rank()
    groups = summaries.get(mine, {}).get("data_parallel") or []
    group = next((g for g in groups if mine in g), None)
    if data_parallel and group is not None and 1 < len(group) < len(summaries):
        summaries = {r: s for r, s in summaries.items() if r in group}
    return data_parallel, summaries


_PLAIN_MARK = "_rngaudit_plain"
TEE_MAX = partition.MAX_SKETCH_ROOT  # roots observed through a tee (at most FOLD batches held)


def _tee_classes() -> tuple[type, ...]:
    module = sys.modules.get("torch.utils.data.dataloader")
    names = ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter")
    return tuple(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))


def _observing_next_index(original: Callable[[Any], Any], guard: EpochGuard) -> Any:
    """``_next_index`` of an observed epoch, after its first batch: the original, each index
    batch kept in the epoch's tape, the epoch compared when the rank has drawn its last."""

    def _next_index(self: Any) -> Any:
        return guard._observe(self.__dict__.get("_rngaudit_tape"), original, self)

    return _next_index


def _plain_reset(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A new epoch of a persistent iterator: back to its own class (checked again), then reset."""
    cls = type(self)
    if cls.__dict__.get(_PLAIN_MARK, False):
        self.__class__ = cls.__base__
    return self._reset(*args, **kwargs)


def expand_groups(exchanged: list[dict[str, Any]]) -> list[schema.EpochRecord]:
    """Every rank's epoch record: a rank not fetched (``same_as``: equal to that rank's record,
    signature and all) gets a copy of it under its own rank; one whose group's record could
    not be read (a late reader after the owners cleared it) is left out."""
    full = {int(r["rank"]): r for r in exchanged if "same_as" not in r}
    out: list[dict[str, Any]] = []
    for r in exchanged:
        if "same_as" not in r:
            out.append(r)
        elif r.get("same_as") in full:
            out.append(dict(full[int(r["same_as"])], rank=int(r["rank"])))
    return cast(list[schema.EpochRecord], out)  # the ranks' own records, decoded from JSON


def _teed(shard: Any, gen: Iterator[Any], tape: sharding.OrderTape) -> Iterator[Any]:
    """``gen`` (a BatchSamplerShard iteration), its inner order teed into ``tape``."""
    inner = shard.__dict__.get("batch_sampler")
    if inner is None:
        yield from gen
        return
    shard.__dict__["batch_sampler"] = _Tee(inner, tape)
    try:
        window = RECORDER.begin()  # nested in the enclosing audit's, if any
        instrument_loaders.mark_samplers(RECORDER, sharding.chain(inner))
        try:
            first = next(gen)  # the inner order is drawn and its first batches pulled here
        finally:
            try:
                events = RECORDER.events_since(window)
                tape.draws = [
                    _draw_summary(e) for e in events if e.get("sampler") and e["kind"] == DRAW
                ]
            except Exception:
                log.debug("rngaudit: could not read the first batch's draws", exc_info=True)
            RECORDER.end(window)
    except StopIteration:
        return
    finally:
        shard.__dict__["batch_sampler"] = inner
    yield first
    yield from gen


class _StreamTee:
    """Stands in for an ``IterableDatasetShard``'s dataset while its first batch is pulled:
    iterating it iterates the real one and digests each element (the stream before it is split)."""

    def __init__(self, inner: Any, tape: sharding.OrderTape) -> None:
        self.inner, self.tape = inner, tape

    def __iter__(self) -> Iterator[Any]:
        return _tee_prefix(self.inner, self.tape, sharding.digest_element)


def _teed_stream(shard: Any, gen: Iterator[Any], tape: sharding.OrderTape) -> Iterator[Any]:
    """``gen`` (an IterableDatasetShard iteration), the stream it splits teed into ``tape``."""
    inner = shard.__dict__.get("dataset")
    if inner is None:
        yield from gen
        return
    shard.__dict__["dataset"] = _StreamTee(inner, tape)
    try:
        first = next(gen)  # the body takes iter(self.dataset) here: the tee's
    except StopIteration:
        return
    finally:
        shard.__dict__["dataset"] = inner
    yield first
    yield from gen


def _note_module(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    """A DistributedDataParallel / FSDP module built: the data-parallel signal."""
    result = wrapped(*args, **kw)
    if instance is not None:
        observed.note_module(instance)
        first_step.noted(instance)
    return result


def _note_sharded(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    """FSDP2's ``fully_shard`` returned the module(s) it sharded: the data-parallel signal."""
    result = wrapped(*args, **kw)
    with contextlib.suppress(Exception):
        for module in result if isinstance(result, list | tuple) else [result]:
            observed.note_module(module)
            first_step.noted(module)
    return result


def _roots(tape: partition.Tape, batch: Any) -> list[int] | None:
    """The root samples of one index batch (at most 4096), or None."""
    try:
        np = sys.modules["numpy"]
        idx = np.asarray(batch if isinstance(batch, list) else [batch], dtype=np.int64)
        if idx.ndim != 1 or idx.size > 4096:
            return None
        for arr in tape.maps:
            idx = arr[idx]
        return [int(i) for i in idx.tolist()]
    except Exception:
        return None


def _first_batches(published: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Each rank's first batch as a partition summary (unknown where it was not read)."""
    out: dict[int, dict[str, Any]] = {}
    for rank, record in published.items():
        first, size = record.get("first"), record.get("root_size")
        out[rank] = {"known": False}
        if isinstance(first, list) and isinstance(size, int) and first:
            tape = partition.Tape([], size)
            tape.take([first])
            out[rank] = tape.summary()
    return out


def _arm_modules() -> None:
    """Every data-parallel module of this process armed for its first training forward (the
    heap searched once per installation for those built before the guard)."""
    with contextlib.suppress(Exception):
        observed.data_parallel_groups(scan=True)
        for module in list(observed._FOUND.values()):
            first_step.noted(module)


def _one_loader(summaries: dict[int, dict[str, Any]], left: bool = False) -> bool:
    """Whether the ranks' published epochs are one loader's: the same root dataset (identity
    and size), as many index batches on every rank (a data-parallel loop steps together);
    ``left``: an epoch some rank left early, whose length, where every rank knows it, is the
    same on every rank."""
    if len(summaries) < 2 or not all(s.get("known") for s in summaries.values()):
        return False
    same = all(
        len({str(s.get(k)) for s in summaries.values()}) == 1 for k in ("identity", "root_size")
    )
    if not left:
        return same and len({str(s.get("batches")) for s in summaries.values()}) == 1
    lengths = {
        s.get("length") if s.get("partial") else s.get("batches") for s in summaries.values()
    }
    return same and (None in lengths or len(lengths) == 1)


def _loader_label(part: Any) -> str | None:
    """The one label (:data:`~rngaudit.capture.naming.LOADERS`) of the loader whose sampler
    chain holds ``part`` (its shard or index sampler) or whose dataset is ``part`` (a stream
    shard): among the loaders named so far and those built in the open window."""
    return naming.LOADERS.find(part, _holds, RECORDER.built_loaders())


def _holds(loader: Any, part: Any) -> bool:
    chain = sharding.loader_chain(loader)
    return any(s is part for s in chain) or peek.attr(loader, "dataset") is part


def _draw_summary(event: schema.Event) -> schema.SamplerDraw:
    sampler = event.get("sampler")
    return {
        "op": event.get("op"),
        "generator": event.get("generator"),
        "fingerprint": event.get("fingerprint"),
        "output_digest": sampler["output_digest"] if sampler else None,
        "call_site": event.get("call_site"),
        "user_call_site": event.get("user_call_site"),
        "sampler": sampler["chain"] if sampler else None,
    }


def _split_draws(session: Any) -> list[schema.SamplerDraw]:
    """The first recorded draw that built a dataset split (random_split), to name in a finding."""
    own = getattr(session, "records", {}).get(getattr(session, "rank", 0), {})
    for event in own.get("events", []):
        if any(site.get("function") == "random_split" for site in event.get("chain", [])):
            return [_draw_summary(event)]
    return []


def _act(found: list[Finding], watch: Watch, label: str) -> None:
    """Raise or warn on every rank, as the watch's mode says (``label``: what was checked)."""
    if not found:
        return
    session = watch.session
    if watch.before_raise is not None and any(
        fails(f, watch.settings.mode, watch.settings.strict) for f in found
    ):
        try:
            watch.before_raise(label)
        except Exception:  # the check's own verdict still stands and is raised
            log.warning("rngaudit: could not conclude the audit window", exc_info=True)
    report = AuditReport(
        findings=found,
        world_size=int(getattr(session, "world_size", 1)),
        run_id=str(getattr(session, "run_id", "")),
        mode=watch.settings.mode,
        audits=[{"index": found[0].audit, "label": label}],
    )
    act(report, watch.settings.mode, watch.settings.strict)


GUARD = EpochGuard()
