"""The index batches of map-style epochs: each epoch's tape opened, kept, teed and ended.

``_BaseDataLoaderIter._next_index`` hands every index batch a map-style loader draws (main
process, also with workers) to :meth:`IndexBatches.next_index`: at an epoch's first it opens the
epoch's :class:`~rngaudit.epochs.partition.Tape` (a loader a known class shards, or one no known
class shards, observed), and at its last the ranks compare what each took.
"""

from __future__ import annotations

import itertools
import logging
import sys
import types
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from rngaudit import library_samplers, peek
from rngaudit.capture.instrument import loaders as instrument_loaders
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import handed, partition, rendezvous, sharding, suspended, unsharded
from rngaudit.epochs.epoch_exchange import EpochExchange
from rngaudit.epochs.judging import Judge
from rngaudit.epochs.registry import (
    ObservedEpoch,
    ObservedLoader,
    Registry,
    ShardedEpoch,
    loader_label,
)
from rngaudit.epochs.sharded_check import ShardedCheck, planned
from rngaudit.epochs.surgery import Surgery, arm_modules, draw_summary
from rngaudit.ranks import data_parallel, exchange
from rngaudit.schema import DRAW

log = logging.getLogger("rngaudit")

TEE_MAX = partition.MAX_SKETCH_ROOT  # roots observed through a tee (at most FOLD batches held)


class IndexBatches:
    """The per-index-batch path of map-style loaders, from an epoch's first to its last."""

    def __init__(
        self,
        registry: Registry,
        surgery: Surgery,
        epochs: EpochExchange,
        judge: Judge,
        sharded: ShardedCheck,
    ) -> None:
        self.registry = registry
        self.surgery = surgery
        self.epochs = epochs
        self.judge = judge
        self.sharded = sharded

    def next_index(
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
                rendezvous.sweep()  # the first-step hooks that fired: removed between forwards
                self.epochs.left_before(instance)
                if self.epochs.later:
                    self.epochs.compare_later()
                tape = state["_rngaudit_tape"] = self._open_tape(instance)
                if tape is not None:
                    self._tee(instance, tape)
                nodes = self._draws_to_record(instance)
            if nodes:
                batch = self._recorded(state, nodes, wrapped, *args, **kw)
                with RECORDER.paused():
                    state["_rngaudit_planned"] = planned(source, tape, state.get("_index_sampler"))
                return batch
            if tape is not None and isinstance(tape.context, ObservedEpoch):
                batch = self.observe(tape, wrapped, *args, **kw)
                with RECORDER.paused():
                    self._first_index(instance, tape, source, batch)
                return batch
        return self.observe(state.get("_rngaudit_tape"), wrapped, *args, **kw)

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
            if isinstance(tape.left, handed.Left):
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
            yield handed.segment(first, fold, tape)
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
            nodes = library_samplers.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if not sharding.is_distributed_sampler(shard):
                return []
            with self.registry.lock:
                return nodes if self.registry.watch_for(shard) is not None else []
        except Exception:
            return []

    def _recorded(self, state: dict[str, Any], nodes: list[Any], pull: Any, *args: Any) -> Any:
        """The epoch's first index batch, the sampler draws made for it kept in ``state``
        (the order check compares their generator states at the first batch)."""
        window = RECORDER.begin()  # nested in the enclosing audit's, if any
        try:
            instrument_loaders.mark_samplers(RECORDER, nodes)
            return self.observe(state.get("_rngaudit_tape"), pull, *args)
        finally:
            try:
                events = RECORDER.events_since(window)
                state["_rngaudit_draws"] = [
                    draw_summary(e) for e in events if e.get("sampler") and e["kind"] == DRAW
                ]
            except Exception:
                log.debug("rngaudit: could not read the first index batch's draws", exc_info=True)
            RECORDER.end(window)

    def observe(self, tape: partition.Tape | None, pull: Callable[..., Any], *args: Any) -> Any:
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
            nodes = library_samplers.chain(peek.attr(iterator, "_index_sampler"))
            shard = sharding.shard_of(nodes)
            if shard is None:
                return self._open_observed(iterator, nodes)
            with self.registry.lock:
                watch = self.registry.watch_for(shard)
                if watch is None:
                    return None
                state = self.registry.state(shard)
            mapping = partition.root_mapping(peek.attr(iterator, "_dataset"))
            if mapping is None:
                return None
            context = ShardedEpoch(watch, shard, library_samplers.chain_name(nodes), state.checks)
            tape = partition.Tape(mapping[0], mapping[1], context)
            if sharding.has_own_iter(shard):  # its epoch may be compared as it is drawn
                tape.left = handed.left_of(iterator)
            with self.registry.lock:
                self.registry.tapes.add(tape)
            weakref.finalize(tape, self.surgery.release)  # an epoch never finished: stop waiting
            return tape
        except Exception:  # the auditor must never break the loader
            log.warning("rngaudit: could not observe the loader's partition", exc_info=True)
            return None

    def _open_observed(self, iterator: Any, nodes: list[Any]) -> partition.Tape | None:
        """An epoch of a map-style loader no known class shards, in a run of several ranks:
        announced through the store and observed (:mod:`rngaudit.epochs.unsharded`)."""
        where = exchange.distributed()
        if where is None or not nodes:
            return None
        index = nodes[0]
        with self.registry.lock:
            watch = self.registry.watch_of(index)
            if watch is None:
                return None
            known = self.registry.observed.get(index)
        dataset = peek.attr(iterator, "_dataset")
        if known is None:
            root = partition.root_of(dataset)
            identity = partition.root_identity(root)
            chain = library_samplers.chain_name(nodes)
            batch = peek.attr(index, "batch_size")
            with self.registry.lock:
                base = f"{identity}|{chain}|{batch}"
                occurrence = self.registry.occurrence(base)
                # the loader's one name if it was seen built, else named the same on every
                # rank that iterates it (never by _count: the sharded loaders' exchange keys
                # use it, and a loader one rank iterates must not move it)
                label = loader_label(index) or (
                    f"DataLoader over {type(root).__name__}(len={peek.size(root)})"
                    + (f" #{occurrence + 1}" if occurrence else "")
                )
                key = unsharded.loader_key(identity, chain, batch, occurrence)
                shards = sharding.shards_itself(nodes, *where)
                known = ObservedLoader(key, label, identity, shards=shards)
                self.registry.observed[index] = known
        if not watch.every_epoch and known.epochs > 0:
            return None
        mapping = partition.root_mapping(dataset)
        if mapping is None:
            return None
        epoch = unsharded.Epoch(
            known.key, known.epochs, known.label, library_samplers.chain_name(nodes), watch
        )
        known.epochs += 1
        self.epochs.observing(known.key)  # this rank closes it when the group goes
        unsharded.start(epoch)
        torch = sys.modules.get("torch")
        training = bool(torch.is_grad_enabled()) if torch is not None else False
        tape = partition.Tape(mapping[0], mapping[1], ObservedEpoch(watch, epoch, known, training))
        tape.left = handed.left_of(iterator)
        known.open = weakref.ref(tape)
        handed.watch(iterator, tape, self.epochs.left_early)  # a break: the iterator goes first
        with self.registry.lock:
            self.registry.tapes.add(tape)
        weakref.finalize(tape, self.surgery.release)
        return tape

    def _first_index(self, iterator: Any, tape: partition.Tape, source: Any, batch: Any) -> None:
        """An observed epoch's first index batch: what the data-parallel ranks compare at their
        next training forward (:mod:`~rngaudit.epochs.rendezvous`): the batch's root samples
        and the whole epoch when its sampler's iterator holds it (read without a draw)."""
        try:
            context = tape.context
            if not isinstance(context, ObservedEpoch):
                return
            epoch, known, training = context.epoch, context.loader, context.training
            arm_modules()
            if not data_parallel.modules():
                return  # no data-parallel module: no training forward every rank is known to make
            summary: dict[str, Any] = {"known": False}
            indices = suspended.epoch_indices(source, batch, peek.attr(iterator, "_index_sampler"))
            if indices is not None:
                size = len(batch) if isinstance(batch, list) else 1
                whole = partition.Tape(tape.maps, tape.root_size)
                whole.take_indices(indices, -(-len(indices) // max(1, size)))
                summary = dict(whole.summary(), **known.described(tape), training=training)
            record = {
                "key": epoch.key,
                "epoch": epoch.epoch,
                "first": _roots(tape, batch),
                "root_size": tape.root_size,
                "ahead": summary,
                "training": training,
            }
            rendezvous.started(rendezvous.Started(epoch, weakref.ref(tape), record, self.judge))
        except Exception:
            log.warning("rngaudit: could not read the observed epoch ahead", exc_info=True)

    def _observed_end(self, context: ObservedEpoch, tape: partition.Tape) -> None:
        """Publish what this rank took in an observed epoch; compare when every rank has."""
        epoch, known, training = context.epoch, context.loader, context.training
        handed.done(tape)
        rendezvous.unfollow(tape)
        try:
            groups = data_parallel.data_parallel_groups(scan=not known.scanned)
            known.scanned = True
            summary = dict(
                tape.summary(),
                **known.described(tape),
                training=training,
                data_parallel=groups,
            )
            summary.update(rendezvous.fields(tape))
            meant = known.shards or bool(tape.maps)  # a self-sharding sampler, a split
            got = unsharded.finish(epoch, summary, meant)
        except Exception:
            log.warning("rngaudit: could not publish the loader's observed epoch", exc_info=True)
            return
        finally:
            self.surgery.release()
        if got is None:
            self.epochs.keep(epoch)
            return
        self.judge.judge(epoch, got)

    def _epoch_end(self, tape: partition.Tape) -> None:
        """The ranks compare the samples each was handed this epoch; every rank raises on an
        overlap beyond padding."""
        context = tape.context
        if isinstance(context, ObservedEpoch):
            self._observed_end(context, tape)
        elif isinstance(context, ShardedEpoch):
            self.sharded.epoch_end(context, tape)


def _tee_classes() -> tuple[type, ...]:
    module = sys.modules.get("torch.utils.data.dataloader")
    names = ("_SingleProcessDataLoaderIter", "_MultiProcessingDataLoaderIter")
    return tuple(c for c in (getattr(module, n, None) for n in names) if isinstance(c, type))


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
