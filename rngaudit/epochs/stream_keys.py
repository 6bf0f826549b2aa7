"""The keyed-stream path: iterable-style loaders whose batches carry a declared sample key.

At an epoch's first batch the loader is keyed (by :func:`~rngaudit.epochs.keyed.sample_key`,
or by ``RNGAUDIT_SAMPLE_KEY`` when its batch holds that field) and its epoch announced; each
batch's ids are kept (:class:`~rngaudit.epochs.keyed.Taken`), and at the epoch's end this rank's
share is published and judged when every rank has
(:class:`~rngaudit.epochs.epoch_exchange.EpochExchange`).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rngaudit import peek
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import keyed, rendezvous, unsharded
from rngaudit.epochs.epoch_exchange import EpochExchange
from rngaudit.epochs.judging import Judge
from rngaudit.epochs.registry import Registry, loader_label
from rngaudit.epochs.surgery import KEYED, arm_modules
from rngaudit.ranks import data_parallel, exchange

log = logging.getLogger("rngaudit")


@dataclass
class KeyedLoader:
    """An iterable-style loader whose batches are compared by a declared sample key."""

    key: str  # the loader's cross-rank identity
    label: str
    spec: keyed.Spec
    batch_size: int | None
    epochs: int = 0
    scanned: bool = False  # the heap searched once for data-parallel modules
    current: KeyedEpoch | None = None
    unknown_logged: bool = False


@dataclass(eq=False)  # hashed by identity (rendezvous keeps it in a weak dictionary)
class KeyedEpoch:
    """One epoch of a keyed loader on this rank: the ids taken so far."""

    loader: KeyedLoader
    epoch: unsharded.Epoch
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


class KeyedStreams:
    """This rank's keyed loaders and the epochs of them it has begun."""

    def __init__(self, registry: Registry, epochs: EpochExchange, judge: Judge) -> None:
        self.registry = registry
        self.epochs = epochs
        self.judge = judge
        # iterable-style loaders keyed by a sample key (index sampler -> it; None: not keyed)
        self.keyed: weakref.WeakKeyDictionary[Any, KeyedLoader | None] = weakref.WeakKeyDictionary()
        self.keyed_open: list[KeyedEpoch] = []  # epochs begun and not published yet
        epochs.before_settle.append(self.publish_open)

    def publish_open(self) -> None:
        """The keyed epochs this rank left early (a ``break``) and never ended: what each took
        so far is published (an overlap among partial shares is duplication too), to be
        compared with the other pending epochs."""
        with self.registry.lock:
            left, self.keyed_open = [e for e in self.keyed_open if not e.closed], []
        for current in left:
            current.closed = True
            with contextlib.suppress(Exception):
                summary = dict(
                    current.taken.summary(),
                    batch_size=current.loader.batch_size,
                    key_name=current.loader.spec.name,
                    partial=True,
                    data_parallel=data_parallel.data_parallel_groups(scan=False),
                )
                unsharded.publish(current.epoch, summary)
                self.epochs.keep(current.epoch)

    def first(self, iterator: Any, batch: Any) -> bool:
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
            with self.registry.lock:
                try:
                    seen = index in self.keyed
                except TypeError:  # an unhashable index sampler: never keyed
                    return False
                known = self.keyed.get(index)
            if not seen:
                known = self._keyed_loader(index, dataset, batch)
            if known is None:
                return False
            with self.registry.lock:
                watch = self.registry.watch_of(index)
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
            epoch = unsharded.Epoch(
                known.key, known.epochs, known.label, f"keyed by {known.spec.name}", watch
            )
            known.epochs += 1
            self.epochs.observing(known.key)  # this rank closes it when the group goes
            unsharded.start(epoch)
            current = KeyedEpoch(known, epoch, iterator.__dict__.get("_sampler_iter"))
            current.add(batch)
            known.current = current
            with self.registry.lock:
                self.keyed_open = [e for e in self.keyed_open if not e.closed][
                    -unsharded.MAX_PENDING :
                ]
                self.keyed_open.append(current)
            iterator.__dict__[KEYED] = current
        except Exception:
            log.warning("rngaudit: could not observe the keyed loader", exc_info=True)
            return False
        self._keyed_first_step(current, batch)
        return True

    def _keyed_first_step(self, current: KeyedEpoch, batch: Any) -> None:
        """Under a data-parallel module, the keyed epoch's first batch: its ids compared by the
        group at the module's next training forward (:mod:`~rngaudit.epochs.rendezvous`),
        before the step; a first batch two ranks share is proof of duplication."""
        try:
            arm_modules()
            if not data_parallel.modules():
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
            item = rendezvous.Started(current.epoch, weakref.ref(current), record, self.judge)
            rendezvous.started(item)
        except Exception:
            log.warning("rngaudit: could not arm the keyed first-step check", exc_info=True)

    def _keyed_pending(self, key: str) -> None:
        """The earlier epochs of the keyed loader ``key`` this rank published before the
        others had announced them (it ran ahead): compared now, waited for when every rank
        has announced them since (they are drawing them)."""
        with self.registry.lock:
            mine = [e for e in self.epochs.later if e.key == key]
        for epoch in mine:  # (a rank never waits here for an epoch it alone iterates)
            try:
                got = unsharded.announced(epoch)
            except Exception:
                log.debug("rngaudit: could not read a keyed epoch", exc_info=True)
                continue
            if got is None:
                continue
            with self.registry.lock:
                self.epochs.later = [e for e in self.epochs.later if e is not epoch]
            self.judge.judge(epoch, got)  # may raise: the epochs still waiting are kept

    def _keyed_loader(self, index: Any, dataset: Any, batch: Any) -> KeyedLoader | None:
        """The keyed loader of ``index`` (its declared key, or the environment's field when
        its first batch holds it), remembered (None: not keyed)."""
        spec = keyed.registered(index, dataset)
        if spec is None:
            with self.registry.lock:
                watch = self.registry.watch_of(index)
            field_name = watch.settings.sample_key if watch is not None else None
            if field_name and keyed.read(batch, field_name) is not None:
                spec = keyed.spec_of(field_name)
        if spec is None:
            with contextlib.suppress(TypeError), self.registry.lock:
                self.keyed[index] = None
            return None
        batch_size = peek.attr(index, "batch_size")
        size = batch_size if isinstance(batch_size, int) and batch_size > 0 else None
        cls = type(dataset)
        identity = keyed.identity(dataset, spec, size)
        with self.registry.lock:
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
                occurrence = self.registry.occurrence(base)
                where = "iterated"
            label = loader_label(index) or (
                f"DataLoader over {cls.__name__}" + (f" #{occurrence + 1}" if occurrence else "")
            )
            known = KeyedLoader(
                unsharded.loader_key(identity, f"keyed {where}", size, occurrence),
                label,
                spec,
                size,
            )
            try:
                self.keyed[index] = known
            except TypeError:
                return None
        return known

    def pull(self, current: KeyedEpoch, pull: Callable[..., Any], *args: Any, **kw: Any) -> Any:
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

    def _keyed_end(self, current: KeyedEpoch, partial: bool = False) -> None:
        """Publish what this rank took in a keyed epoch (``partial``: it left the epoch early);
        compare when every rank has, else later (as an observed epoch)."""
        current.closed = True
        known, epoch = current.loader, current.epoch
        try:
            groups = data_parallel.data_parallel_groups(scan=not known.scanned)
            known.scanned = True
            summary = dict(
                current.taken.summary(),
                batch_size=known.batch_size,
                key_name=known.spec.name,
                partial=partial,
                data_parallel=groups,
            )
            current.taken = keyed.Taken()  # published: the ids are not held any longer
            unsharded.publish(epoch, summary)
        except Exception:
            log.warning("rngaudit: could not publish the keyed loader's epoch", exc_info=True)
            return
        self._keyed_pending(known.key)  # earlier epochs first (may raise)
        try:
            got = unsharded.finish(epoch, summary)
        except Exception:
            log.warning("rngaudit: could not publish the keyed loader's epoch", exc_info=True)
            return
        if got is None:
            self.epochs.keep(epoch)
            return
        self.judge.judge(epoch, got)
