"""The class surgery of the epoch checks: wrapped iterator classes, tees and plain subclasses.

Two class-level wrappers, installed while something is watched:
- ``BatchSamplerShard.__iter__`` (accelerate): tees the batches of the order *before* sharding
  into an :class:`~rngaudit.epochs.sharding.OrderTape`, and records the sampler draws made while the
  first batch is pulled (a short recording window), so a divergence names its draw.
- ``_BaseDataLoaderIter.__next__`` / ``_next_index`` (torch, and torchdata's stateful iterators
  through them): handed to the triggers given at construction; after an epoch's first batch the
  iterator becomes a plain subclass of its own class, without a frame of ours per batch.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import wrapt

from rngaudit import library_samplers, schema
from rngaudit.capture.instrument import loaders as instrument_loaders
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import rendezvous, sharding
from rngaudit.epochs.registry import Registry
from rngaudit.ranks import data_parallel
from rngaudit.schema import DRAW

log = logging.getLogger("rngaudit")

# wrapt's wrapper signature: (wrapped, instance, args, kwargs)
Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]
Pull = Callable[..., Any]

KEYED = "_rngaudit_keyed"  # an iterator's keyed epoch (in its __dict__)
_PLAIN_MARK = "_rngaudit_plain"


class Surgery:
    """The wrapped classes (installed while anything is watched) and the plain subclasses an
    iterator takes for the rest of its epoch."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.patches = PatchSet()
        self.installed = False
        self._next: Wrapper = _unwatched  # __next__: the first batch of each epoch
        self._next_index: Wrapper = _unwatched  # every index batch of a map-style epoch
        self._observe: Callable[..., Any] = _pulled  # (tape, pull, *args): an index batch kept
        self._keyed_pull: Callable[..., Any] = _pulled  # (keyed epoch, pull, *args): ids kept
        # (iterator class, observing, keyed) -> its subclass without our wrappers
        self._plain: dict[tuple[type, bool, bool], type] = {}

    def hand(
        self,
        next_: Wrapper,
        next_index: Wrapper,
        observe: Callable[..., Any],
        keyed_pull: Callable[..., Any],
    ) -> None:
        """The triggers the wrapped methods and plain subclasses hand each call to."""
        self._next, self._next_index = next_, next_index
        self._observe, self._keyed_pull = observe, keyed_pull

    def install(self) -> None:
        """Wrap the iterator classes now or when imported (the ledger's import hooks)."""
        with self.registry.lock:
            if self.installed:
                return
            self.installed = True
            data_parallel.installed(torch_loaded="torch" in sys.modules)
            for name in ("torch.utils.data.dataloader", "accelerate.data_loader"):
                self.patches.when_imported(name, self.on_import)
            for name, _ in data_parallel.DATA_PARALLEL_CLASSES[:2]:
                self.patches.when_imported(name, self.on_import)
            for name in data_parallel.FULLY_SHARD_MODULES:
                self.patches.when_imported(name, self.on_import)

    def on_import(self, module: Any) -> None:
        with self.registry.lock:
            if not self.installed:
                return
            name = getattr(module, "__name__", "")
            if name == "torch.utils.data.dataloader":
                cls = module._BaseDataLoaderIter
                if not self.patches.replaced(cls, "__next__"):
                    self.patches.wrap(cls, "__next__", self._next)
                if not self.patches.replaced(cls, "_next_index"):
                    self.patches.wrap(cls, "_next_index", self._next_index)
            elif name in dict(data_parallel.DATA_PARALLEL_CLASSES[:2]):  # DDP, FSDP
                cls = getattr(module, dict(data_parallel.DATA_PARALLEL_CLASSES)[name], None)
                init = cls.__dict__.get("__init__") if isinstance(cls, type) else None
                if init is not None and not self.patches.replaced(cls, "__init__"):
                    self.patches.wrap(cls, "__init__", _note_module)
            elif name in data_parallel.FULLY_SHARD_MODULES:
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

    def uninstall(self) -> None:
        with self.registry.lock:
            self.installed = False
            self.patches.undo()
            self._plain.clear()  # built over this installation's wrappers

    def release(self) -> None:
        """Uninstalled when nothing is watched any longer."""
        with self.registry.lock:
            if self.registry.idle():
                self.uninstall()

    def _shard_iter(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        gen = wrapped(*args, **kw)
        if not self.installed or instance is None:
            return gen
        state = self.registry.state(instance)
        state.tape = sharding.OrderTape()
        return _teed(instance, gen, state.tape)

    def _stream_iter(
        self, wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
    ) -> Any:
        gen = wrapped(*args, **kw)
        if not self.installed or instance is None or sharding.stream_shard(instance) is None:
            return gen
        state = self.registry.state(instance)
        state.tape = sharding.OrderTape()
        return _teed_stream(instance, gen, state.tape)

    def go_plain(self, iterator: Any, observing: bool = False, keyed: bool = False) -> None:
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
            with self.registry.lock:
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
            namespace["_next_index"] = _observing_next_index(
                namespace["_next_index"], self._observe
            )
        if keyed:
            if "__next__" not in namespace:
                return cls  # the keyed batches must go on through the wrapper
            namespace["__next__"] = _keyed_next(namespace["__next__"], self._keyed_pull)
        if len(namespace) == 4:  # nothing of ours on its per-batch path
            return cls
        return type(cls.__name__, (cls,), namespace)


def _unwatched(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    return wrapped(*args, **kw)


def _pulled(_: Any, pull: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    return pull(*args, **kw)


def _keyed_next(original: Callable[[Any], Any], pull: Callable[..., Any]) -> Any:
    """``__next__`` of a keyed epoch, after its first batch: the original, each batch's sample
    ids kept, the epoch published when the loader's iterator ends."""

    def __next__(self: Any) -> Any:
        current = self.__dict__.get(KEYED)
        if current is None or current.closed:
            return original(self)
        return pull(current, original, self)

    return __next__


def _observing_next_index(original: Callable[[Any], Any], observe: Callable[..., Any]) -> Any:
    """``_next_index`` of an observed epoch, after its first batch: the original, each index
    batch kept in the epoch's tape, the epoch compared when the rank has drawn its last."""

    def _next_index(self: Any) -> Any:
        return observe(self.__dict__.get("_rngaudit_tape"), original, self)

    return _next_index


def _plain_reset(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A new epoch of a persistent iterator: back to its own class (checked again), then reset."""
    cls = type(self)
    if cls.__dict__.get(_PLAIN_MARK, False):
        self.__class__ = cls.__base__
    return self._reset(*args, **kwargs)


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
        return tee_prefix(self.__dict__["_rngaudit_inner"], self.__dict__["_rngaudit_tape"], None)


def tee_prefix(
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


def _teed(shard: Any, gen: Iterator[Any], tape: sharding.OrderTape) -> Iterator[Any]:
    """``gen`` (a BatchSamplerShard iteration), its inner order teed into ``tape``."""
    inner = shard.__dict__.get("batch_sampler")
    if inner is None:
        yield from gen
        return
    shard.__dict__["batch_sampler"] = _Tee(inner, tape)
    try:
        window = RECORDER.begin()  # nested in the enclosing audit's, if any
        instrument_loaders.mark_samplers(RECORDER, library_samplers.chain(inner))
        try:
            first = next(gen)  # the inner order is drawn and its first batches pulled here
        finally:
            try:
                events = RECORDER.events_since(window)
                tape.draws = [
                    draw_summary(e) for e in events if e.get("sampler") and e["kind"] == DRAW
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
        return tee_prefix(self.inner, self.tape, sharding.digest_element)


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
        data_parallel.note_module(instance)
        rendezvous.noted(instance)
    return result


def _note_sharded(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    """FSDP2's ``fully_shard`` returned the module(s) it sharded: the data-parallel signal."""
    result = wrapped(*args, **kw)
    with contextlib.suppress(Exception):
        for module in result if isinstance(result, list | tuple) else [result]:
            data_parallel.note_module(module)
            rendezvous.noted(module)
    return result


def arm_modules() -> None:
    """Every data-parallel module of this process armed for its first training forward (the
    heap searched once per installation for those built before the guard)."""
    with contextlib.suppress(Exception):
        data_parallel.data_parallel_groups(scan=True)
        for module in data_parallel.modules():
            rendezvous.noted(module)


def draw_summary(event: schema.Event) -> schema.SamplerDraw:
    """A recorded sampler draw, as an epoch record names it."""
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
