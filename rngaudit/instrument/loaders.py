"""Loaders built inside the window: which sampler, which generator, whether it drew early."""

from __future__ import annotations

import sys
from typing import Any, Literal

from rngaudit import events as events_mod
from rngaudit import naming, records
from rngaudit.instrument import samplers as instrument_samplers
from rngaudit.recorder import Recorder

# (module, class) whose __init__ registers the new loader with the recorder.
LOADER_CLASSES = (
    ("torch.utils.data.dataloader", "DataLoader"),
    ("torchdata.stateful_dataloader.stateful_dataloader", "StatefulDataLoader"),
)
_MAX_DEPTH = 6


def install(rec: Recorder) -> None:
    """Wrap the ``__init__`` of the loader classes that are imported."""
    for module_name, cls_name in LOADER_CLASSES:
        cls = getattr(sys.modules.get(module_name), cls_name, None)
        if cls is None or "__init__" not in cls.__dict__:
            continue
        if any(owner is cls for owner in rec.patches.owners()):
            continue
        rec.patches.wrap(cls, "__init__", _register(rec))


def _register(rec: Recorder) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        result = wrapped(*args, **kw)
        if rec.enabled and instance is not None and all(instance is not x for x in rec.new_loaders):
            rec.new_loaders.append(instance)
            mark_chain(rec, instance)
        return result

    return wrapper


def mark_chain(rec: Recorder, loader: Any) -> None:
    """Mark the samplers of ``loader`` (a user's own among them) until the window closes."""
    mark_samplers(rec, sampler_chain(loader))


def mark_samplers(rec: Recorder, samplers: list[Any]) -> None:
    """Mark the iteration code of ``samplers``' classes; unmarked when the window closes."""
    try:
        codes = instrument_samplers.mark_objects(samplers)
    except Exception:  # never break the loader over attribution
        return
    rec.patches.mark(codes)


def sampler_chain(loader: Any) -> list[Any]:
    """The loader's batch sampler and the samplers inside it, outermost first."""
    chain: list[Any] = []
    node = getattr(loader, "batch_sampler", None) or getattr(loader, "sampler", None)
    while node is not None and len(chain) < _MAX_DEPTH and all(node is not c for c in chain):
        chain.append(node)
        node = getattr(node, "batch_sampler", None) or getattr(node, "sampler", None)
    return chain


def summarize(rec: Recorder, events: list[records.Event]) -> list[records.Loader]:
    """One entry per loader built in the window (report field ``loaders``)."""
    out: list[records.Loader] = []
    for loader in rec.new_loaders:
        name = rec.loaders.name(type(loader).__name__, id(loader), loader)
        chain = sampler_chain(loader)
        generator = None
        for sampler in reversed(chain):
            generator = getattr(sampler, "generator", None)
            if generator is not None:
                break
        early = [
            e
            for e in events
            if _sampler_field(e, "loader") == name and e["phase"] == events_mod.PRE_ITERATION
        ]
        out.append(
            {
                "loader": name,
                "num_workers": int(getattr(loader, "num_workers", 0) or 0),
                "sampler": " > ".join(type(s).__name__ for s in chain) or None,
                "generator": _generator_name(rec, generator),
                "drew_before_iteration": bool(early),
                "fingerprint": early[0]["fingerprint"] if early else None,
                "output_digest": _sampler_field(early[0], "output_digest") if early else None,
            }
        )
    return out


def _sampler_field(event: records.Event, key: Literal["loader", "output_digest"]) -> str | None:
    """``event["sampler"][key]``, None when the draw was not for a sampler."""
    sampler = event["sampler"]
    return sampler[key] if sampler else None


def _generator_name(rec: Recorder, generator: Any) -> str:
    if generator is None:
        return f"{naming.TORCH_DEFAULT} (no generator of its own)"
    cdata = getattr(generator, "_cdata", None)
    for name, obj in rec.names.items():
        if getattr(obj, "_cdata", None) == cdata:
            return name
    return "torch.Generator (not drawn from in the window)"
