"""A recorder of its own with one instrumentation installed, and the events it recorded."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from rngaudit.capture.recorder import Recorder


@contextlib.contextmanager
def recording(instrumentation: Callable[[Recorder], Any]) -> Iterator[Recorder]:
    """A recorder with only ``instrumentation`` installed, undone on the way out."""
    rec = Recorder()
    rec.enabled = True
    instrumentation(rec).install()
    try:
        yield rec
    finally:
        rec.uninstrument()


def events(rec: Recorder) -> list[dict[str, Any]]:
    """Every event ``rec`` recorded, as the report writes it."""
    return [dict(e.to_dict()) for e in rec.log.since(0)]
