"""The epoch checks' facade: what is watched, installed over the parts that check it.

The parts, each owning one thing: :mod:`~rngaudit.epochs.registry` (the watches and each
loader's state), :mod:`~rngaudit.epochs.surgery` (the wrapped classes, tees and plain
subclasses), :mod:`~rngaudit.epochs.sharded_check` (loaders a known class shards, at an
epoch's first batch and end), :mod:`~rngaudit.epochs.index_batches` (every index batch of a
map-style epoch), :mod:`~rngaudit.epochs.stream_keys` (keyed streams),
:mod:`~rngaudit.epochs.epoch_exchange` (observed epochs between ranks, and the group's end) and
:mod:`~rngaudit.epochs.judging` (the verdicts). Nothing calls back into this facade.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from rngaudit import library_samplers, peek
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import rendezvous, sharding
from rngaudit.epochs.epoch_exchange import EpochExchange
from rngaudit.epochs.index_batches import IndexBatches
from rngaudit.epochs.judging import Judge
from rngaudit.epochs.registry import ObservedEpoch, Registry, ShardedEpoch
from rngaudit.epochs.registry import Watch as Watch
from rngaudit.epochs.sharded_check import ShardedCheck
from rngaudit.epochs.stream_keys import KeyedEpoch, KeyedStreams
from rngaudit.epochs.surgery import KEYED, Surgery, arm_modules
from rngaudit.ranks import exchange, layout, replicas


class EpochGuard:
    """Process-wide: what is watched, and the parts that watch it."""

    def __init__(self) -> None:
        self.registry = Registry()
        self.judge = Judge()
        self.epochs = EpochExchange(self.registry, self.judge)
        self.keyed = KeyedStreams(self.registry, self.epochs, self.judge)
        self.surgery = Surgery(self.registry)
        self.sharded = ShardedCheck(self.registry, self.surgery, self.judge)
        self.index = IndexBatches(
            self.registry, self.surgery, self.epochs, self.judge, self.sharded
        )
        self.surgery.hand(self._next, self.index.next_index, self.index.observe, self.keyed.pull)
        self._lock = self.registry.lock
        self.patches: PatchSet = self.surgery.patches
        self.exit_patches: PatchSet = self.epochs.exit_patches

    @property
    def installed(self) -> bool:
        return self.surgery.installed

    @property
    def everything(self) -> Watch | None:
        return self.registry.everything

    @everything.setter
    def everything(self, watch: Watch | None) -> None:
        self.registry.everything = watch

    @property
    def keyed_open(self) -> list[KeyedEpoch]:
        return self.keyed.keyed_open

    # -- what is watched ---------------------------------------------------------------------
    def watch_all(self, watch: Watch) -> None:
        """Under RNGAUDIT: check every sharded loader (every epoch if ``watch.every_epoch``)."""
        with self._lock:
            self.registry.everything = watch
            self.install()
        replicas.arm(watch)  # replicas' weights, at the first optimizer step
        layout.arm()  # device meshes noted as they are built

    def enter(self, watch: Watch) -> None:
        """A with-block opened: loaders sharded inside it are watched."""
        with self._lock:
            self.registry.open.append(watch)
            self.install()
        replicas.arm(watch)  # replicas' weights, at the first optimizer step
        layout.arm()  # device meshes noted as they are built

    def leave(self, watch: Watch, loaders: list[Any]) -> None:
        """A with-block closed: keep watching the sharded ``loaders`` built in it until checked
        (none when the block's own verdict already reported an error for them)."""
        observing = False
        registry = self.registry
        with self._lock:
            if watch in registry.open:
                registry.open.remove(watch)
            kept = []
            for loader in loaders:
                shard = sharding.shard_of(library_samplers.loader_chain(loader))
                if shard is None:
                    shard = sharding.stream_shard(peek.attr(loader, "dataset"))
                if shard is not None:
                    kept.append(shard)
                    registry.pending[shard] = watch
                    weakref.finalize(shard, self.surgery.release)  # never iterated: stop waiting
                elif exchange.distributed() is not None:
                    index = peek.first_attr(loader, "batch_sampler", "sampler")
                    with contextlib.suppress(TypeError):  # an unhashable sampler: not observed
                        registry.observing[index] = watch
                        weakref.finalize(index, self.surgery.release)
                        observing = True
            for tape in list(registry.tapes):  # epochs drawn inside the block (a prefetch)
                context = tape.context
                if not isinstance(context, ShardedEpoch | ObservedEpoch):
                    continue
                shard = context.shard if isinstance(context, ShardedEpoch) else None
                if context.watch is watch and all(shard is not k for k in kept):
                    tape.abandon()  # the block's verdict already covered that loader
            self._maybe_uninstall()
        if observing:  # every rank leaves the block: every rank arms the same modules
            arm_modules()

    def _maybe_uninstall(self) -> None:
        self.surgery.release()

    # -- wrappers ----------------------------------------------------------------------------
    def install(self) -> None:
        """Wrap the iterator classes now or when imported (the ledger's import hooks)."""
        self.surgery.install()

    def _on_import(self, module: Any) -> None:
        self.surgery.on_import(module)

    def uninstall(self) -> None:
        self.surgery.uninstall()

    def settle(self) -> None:
        """The observed epochs still pending, settled as the process group goes
        (:meth:`~rngaudit.epochs.epoch_exchange.EpochExchange.settle`)."""
        self.epochs.settle()

    def _next(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        """``__next__``: at the first batch of each epoch, the checks of that batch; the rest
        of the epoch runs on a plain subclass (:meth:`Surgery.go_plain`)."""
        if instance is None or RECORDER.busy():
            return wrapped(*args, **kw)
        current = instance.__dict__.get(KEYED)
        if current is not None and current.source is instance.__dict__.get("_sampler_iter"):
            return self.keyed.pull(current, wrapped, *args, **kw)  # no plain subclass for it
        batch = wrapped(*args, **kw)
        epoch_key = id(getattr(instance, "_sampler_iter", None))
        if self.registry.seen.get(instance) == epoch_key:
            return batch  # not the first batch of an epoch: nothing to do
        try:
            self.registry.seen[instance] = epoch_key
        except TypeError:
            return batch
        with RECORDER.paused():  # the check's own work is not audited, nor re-entered
            self.sharded.first_batch(instance, batch)
        tape = instance.__dict__.get("_rngaudit_tape")
        if tape is not None and isinstance(tape.context, ObservedEpoch):  # its content
            with RECORDER.paused():
                rendezvous.content(tape, batch)
        with RECORDER.paused():
            keyed_epoch = self.keyed.first(instance, batch)
        # nothing to observe until the next epoch begins, or only the index batches
        self.surgery.go_plain(
            instance,
            observing=tape is not None and not tape.closed and not tape.teed,
            keyed=keyed_epoch,
        )
        return batch


GUARD = EpochGuard()
