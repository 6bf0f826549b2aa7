"""Install and remove all instrumentation, now for loaded libraries and on import for the rest."""

from __future__ import annotations

import functools
import logging
import sys

from rngaudit import forksafe, library_samplers
from rngaudit.capture.instrument import loaders as instrument_loaders
from rngaudit.capture.instrument import samplers as instrument_samplers
from rngaudit.capture.instrument.numpy_random import NumpyInstrumentation
from rngaudit.capture.instrument.python_random import PythonInstrumentation
from rngaudit.capture.instrument.torch_ops import TorchInstrumentation
from rngaudit.capture.recorder import RECORDER, Recorder

log = logging.getLogger("rngaudit")


def watched() -> list[str]:
    """The modules whose import installs a part (or marks samplers) while a window is open."""
    return ["torch", "numpy.random", *library_samplers.modules()]


_lock = forksafe.lock()


class Instrumentation:
    """Which parts are installed on one recorder; undone through the recorder's ledger."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.done: set[str] = set()
        self.marked: set[str] = set()  # sampler modules whose known classes are marked

    def install(self) -> None:
        """Instrument what is loaded now; what loads later is instrumented on import (the
        ledger's import hooks, removed with the rest when the window closes)."""
        with _lock:
            import random  # noqa: F401  (stdlib, cheap)

            self._part("random")
            for name in ("torch", "numpy"):
                if name in sys.modules:
                    self._part(name)
            for name in watched():
                self.rec.patches.when_imported(name, functools.partial(self._on_import, name))

    def _on_import(self, name: str, module: object) -> None:
        self.on_import(name)

    def _part(self, name: str) -> None:
        if name in self.done:
            return
        self.done.add(name)
        try:
            if name == "random":
                PythonInstrumentation(self.rec).install()
            elif name == "numpy":
                NumpyInstrumentation(self.rec).install()
            else:  # torch
                TorchInstrumentation(self.rec).install()
                self._samplers()
        except Exception:  # never stop the user's program over instrumentation
            log.warning("rngaudit: could not instrument %s", name, exc_info=True)

    def _samplers(self, name: str | None = None) -> None:
        """Wrap the loader classes and mark the known samplers of ``name`` (default: of every
        known module imported), each module once per window."""
        names = [name] if name is not None else library_samplers.modules()
        fresh = [n for n in names if n not in self.marked and n in sys.modules]
        if not fresh:
            return
        self.marked.update(fresh)
        instrument_loaders.install(self.rec)
        for module in fresh:
            self.rec.patches.mark(instrument_samplers.mark_module(module))

    def on_import(self, name: str) -> None:
        with _lock:
            if name == "numpy.random":
                self._part("numpy")
            elif name == "torch":
                self._part("torch")
            else:
                self._samplers(name)


def install(recorder: Recorder) -> None:
    """The recorder's installer (registered below): instrument for a new outermost window."""
    Instrumentation(recorder).install()


RECORDER.installer = install
