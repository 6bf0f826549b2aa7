"""The observed epochs between ranks: published, kept until every rank has, and settled at the end.

An observed or keyed epoch is published at its end (or when a rank left it early) and judged
once every rank has published it: then, at a later epoch's first index batch, or when the
process group goes (``destroy_process_group()``, or at exit), where every rank closes its
observed loaders, waits a bounded time and judges what all published
(:mod:`~rngaudit.epochs.uncompared`).
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable
from typing import Any

from rngaudit import library_samplers, peek
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import handed, partition, rendezvous, uncompared, unsharded
from rngaudit.epochs.judging import Judge
from rngaudit.epochs.registry import ObservedEpoch, Registry
from rngaudit.ranks import data_parallel, exchange, group_end
from rngaudit.wording import ranks_phrase

log = logging.getLogger("rngaudit")


class EpochExchange:
    """This rank's published epochs not judged yet, its epochs left early, and the group's end."""

    def __init__(self, registry: Registry, judge: Judge) -> None:
        self.registry = registry
        self.judge = judge
        self.later: list[unsharded.Epoch] = []  # published epochs not compared yet
        # observed epochs this rank left early, folded, not published yet (handed.fold)
        self.left: list[tuple[unsharded.Epoch, dict[str, Any]]] = []
        # run first when the group goes (the keyed epochs left open are published there)
        self.before_settle: list[Callable[[], None]] = []
        # destroy_process_group wrapped once a loader is observed, until the group goes (kept
        # past the guard's own uninstall: the loaders may be gone, their epochs not compared)
        self.exit_patches = PatchSet()
        self.observed_keys: set[str] = set()  # every observed loader this process iterated
        self._exit_registered = False

    def observing(self, key: str) -> None:
        """This rank iterates the observed loader ``key``: it closes it when the group goes
        (no rank waits for it)."""
        self.observed_keys.add(key)
        self._hook_destroy()

    def keep(self, epoch: unsharded.Epoch) -> None:
        """``epoch``, published, compared later (the oldest dropped past ``MAX_PENDING``)."""
        with self.registry.lock:
            self.later.append(epoch)
            dropped = self.later[: -unsharded.MAX_PENDING]
            self.later = self.later[-unsharded.MAX_PENDING :]
        for old in dropped:  # never published by every rank (one rank's loader)
            unsharded.forget(old)

    def compare_later(self) -> None:
        """The published epochs every rank has published since: compared now, oldest first."""
        with self.registry.lock:
            waiting, self.later = self.later, []
        ready = []
        for epoch in waiting:
            try:
                got = unsharded.collect(epoch)
            except Exception:
                log.debug("rngaudit: could not read an observed epoch", exc_info=True)
                continue
            if got is None:
                with self.registry.lock:
                    self.later.append(epoch)
            else:
                ready.append((epoch, got))
        self.judge.judge_all(ready)  # the epochs still waiting are kept above

    def left_early(self, tape: partition.Tape) -> None:
        """This rank left ``tape``'s observed epoch before its end (its iterator went, the
        loader began a new epoch, or the process group goes): what it was handed is kept to be
        published (:func:`~rngaudit.epochs.handed.fold`). Takes no lock (a finalizer may run it
        anywhere); never raises."""
        try:
            context = tape.context
            if not isinstance(context, ObservedEpoch):
                return
            rendezvous.unfollow(tape)
            folded = handed.fold(tape)
            if folded is None:
                return
            groups = data_parallel.data_parallel_groups(scan=False)
            summary = dict(folded, **context.loader.described(tape),
                           training=context.training, data_parallel=groups)  # fmt: skip
            summary.update(rendezvous.fields(tape))
            self.left.append((context.epoch, summary))
            del self.left[: -unsharded.MAX_PENDING]
        except Exception:
            log.debug("rngaudit: could not keep an epoch left early", exc_info=True)

    def left_before(self, iterator: Any) -> None:
        """A new epoch of an observed loader whose previous epoch this rank left early (a
        ``break``, then a new ``for``): what the rank took of it is published and compared now,
        as at an epoch's end (:func:`~rngaudit.epochs.unsharded.finish`); raises as the verdict
        says."""
        try:
            nodes = library_samplers.chain(peek.attr(iterator, "_index_sampler"))
            known = self.registry.observed.get(nodes[0]) if nodes else None
            if known is None:
                return
            tape = known.open() if known.open is not None else None
            if tape is not None and not tape.closed:
                self.left_early(tape)
            mine = [item for item in list(self.left) if item[0].key == known.key]
            for item in mine:  # in place: a finalizer may append meanwhile
                with contextlib.suppress(ValueError):
                    self.left.remove(item)
        except Exception:
            log.debug("rngaudit: could not look for an epoch left early", exc_info=True)
            return
        for epoch, summary in mine:
            try:
                got = unsharded.finish(epoch, summary)
            except Exception:
                log.warning(
                    "rngaudit: could not publish the loader's observed epoch", exc_info=True
                )
                continue
            if got is None:
                with self.registry.lock:
                    self.later.append(epoch)
                    del self.later[: -unsharded.MAX_PENDING]
            else:
                self.judge.judge(epoch, got)

    def _destroy(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        """Before the process group goes (every rank calls this): the observed epochs some
        rank had not published are compared now (:mod:`~rngaudit.epochs.uncompared`)."""
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
        """Close this rank's observed loaders, wait (``uncompared.WAIT`` at most) for the
        other ranks to publish or close the epochs still pending here, and judge those every
        rank published; those some rank did not are named in a warning (not compared)."""
        for hook in self.before_settle:
            hook()
        for tape in list(self.registry.tapes):  # epochs still open here: left early, published now
            if isinstance(tape.context, ObservedEpoch) and not tape.closed:
                self.left_early(tape)
        with self.registry.lock:
            left, self.left = self.left, []
        for epoch, summary in left:
            handed.publish(epoch, summary)  # before this rank closes the loader
        with self.registry.lock:
            waiting, self.later = [*self.later, *(e for e, _ in left)], []
            keys = sorted(self.observed_keys)
        if not keys and not waiting:
            return
        try:
            uncompared.close(keys)
            timeout = min([uncompared.WAIT, *(e.watch.settings.timeout for e in waiting)])
            settled = uncompared.settle(waiting, float(timeout))
        except Exception as exc:  # the store gone first (its host rank ended): one line
            log.warning("rngaudit: could not compare the epochs still pending (%r)", exc)
            return
        with self.registry.lock:
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
        self.judge.judge_all([(e, got) for e, got, _ in settled if got is not None])
