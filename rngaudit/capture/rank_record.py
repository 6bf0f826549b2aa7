"""This rank's record of an audit window: its events, the loaders built in it, its states."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal

from rngaudit import launcher, library_samplers, peek, schema
from rngaudit.capture import environment, event_log, framework, naming
from rngaudit.capture.recorder import RECORDER, Recorder

SamplesReader = Callable[[Any], "dict[str, Any] | None"]
# How a loader's dataset's root samples are read for its record (``samples``): given by the
# owner of the partition summary (epochs.partition, at its import: every entry imports it).
_read_samples: list[SamplesReader] = []


def read_samples_with(reader: SamplesReader) -> None:
    """Have each loader's record carry the root samples its dataset holds, as ``reader``
    summarises them (None: no split of a root dataset); until then it carries none."""
    _read_samples[:] = [reader]


def rank_record(
    label: str,
    events: list[schema.Event],
    loaders: list[schema.Loader],
    states: dict[str, Any],
    *,
    from_start: bool,
    exception: str | None = None,
) -> schema.RankRecord:
    """This rank's record of one audit window, as it is exchanged and compared."""
    return {
        "pid": os.getpid(),
        "host": launcher.node(),
        "label": label,
        "events": events,
        "loaders": loaders,
        "states": states,
        "initial_seeds": RECORDER.initial_seeds(),
        "from_start": from_start,
        "exception": exception,
        "environment": environment.describe(),
        "framework": framework.detect(),  # compare's advice fits the run (rank 0's wins)
    }


def merge_deferred(
    earlier: list[schema.RankRecord], record: schema.RankRecord, index: int
) -> schema.RankRecord:
    """Deferred records and the current one as one record of audit ``index``: events in
    order, entry states from the first, exit states from the last."""
    chunks = [*earlier, record]
    events: list[schema.Event] = [
        {**e, "audit": index} for rec in chunks for e in rec.get("events", [])
    ]
    loaders = [loader for rec in chunks for loader in rec.get("loaders", [])]
    states = {
        "entry": chunks[0].get("states", {}).get("entry", {}),
        "exit": record.get("states", {}).get("exit", {}),
    }
    exception = next((rec["exception"] for rec in chunks if rec.get("exception")), None)
    merged: schema.RankRecord = {
        **record,
        "events": events,
        "loaders": loaders,
        "states": states,
        "exception": exception,
    }
    merged["from_start"] = any(bool(rec.get("from_start")) for rec in chunks)
    return merged


def summarize_loaders(rec: Recorder, events: list[schema.Event]) -> list[schema.Loader]:
    """One entry per loader built in the window (report field ``loaders``)."""
    out: list[schema.Loader] = []
    for loader in rec.new_loaders:
        name = naming.LOADERS.name(loader)
        chain = library_samplers.loader_chain(loader)
        generator = None
        for sampler in reversed(chain):
            generator = peek.attr(sampler, "generator")
            if generator is not None:
                break
        early = [
            e
            for e in events
            if _sampler_field(e, "loader") == name and e["phase"] == event_log.PRE_ITERATION
        ]
        entry: schema.Loader = {
            "loader": name,
            "num_workers": peek.integer(peek.attr(loader, "num_workers"), 0),
            "sampler": library_samplers.chain_name(chain) or None,
            "generator": _generator_name(rec, generator),
            "drew_before_iteration": bool(early),
            "fingerprint": early[0]["fingerprint"] if early else None,
            "output_digest": _sampler_field(early[0], "output_digest") if early else None,
        }
        dataset = peek.attr(loader, "dataset")
        samples = next((read(dataset) for read in _read_samples), None)
        if samples is not None:
            entry["samples"] = samples
        out.append(entry)
    return out


def _sampler_field(event: schema.Event, key: Literal["loader", "output_digest"]) -> str | None:
    """``event["sampler"][key]``, None when the draw was not for a sampler."""
    sampler = event["sampler"]
    return sampler[key] if sampler else None


def _generator_name(rec: Recorder, generator: Any) -> str:
    if generator is None:
        return f"{naming.TORCH_DEFAULT} (no generator of its own)"
    cdata = peek.attr(generator, "_cdata")
    if cdata is None:  # not a torch.Generator: a user's own object in that attribute
        return f"{type(generator).__name__} (not a torch.Generator)"
    for name, obj in rec.names.items():
        if getattr(obj, "_cdata", None) == cdata:
            return name
    return "torch.Generator (not drawn from in the window)"
