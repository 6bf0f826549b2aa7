"""Install and remove all instrumentation, now for loaded libraries and on import for the rest."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable

import wrapt

from rngaudit import instrument_loaders, instrument_samplers
from rngaudit.instrument_numpy import NumpyInstrumentation
from rngaudit.instrument_python import PythonInstrumentation
from rngaudit.instrument_torch import TorchInstrumentation
from rngaudit.recorder import Recorder

log = logging.getLogger("rngaudit")
_hooks_registered = False
_lock = threading.RLock()


class Instrumentation:
    """Which parts are installed on one recorder; undone through the recorder's undo stack."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.done: set[str] = set()
        self.active = False

    def install(self) -> None:
        """Instrument what is loaded now; what loads later is instrumented on import."""
        with _lock:
            self.active = True
            self.rec.add_undo(self._deactivate)
            import random  # noqa: F401  (stdlib, cheap)

            self._part("random")
            for name in ("torch", "numpy"):
                if name in sys.modules:
                    self._part(name)
            _register_hooks(self)

    def _deactivate(self) -> None:
        self.active = False
        self.done.clear()

    def _part(self, name: str) -> None:
        if not self.active or name in self.done:
            return
        self.done.add(name)
        try:
            if name == "random":
                PythonInstrumentation(self.rec).install()
            elif name == "numpy":
                NumpyInstrumentation(self.rec).install()
            elif name == "torch":
                TorchInstrumentation(self.rec).install()
                self._samplers()
            else:
                self._samplers()
        except Exception:  # never stop the user's program over instrumentation
            log.warning("rngaudit: could not instrument %s", name, exc_info=True)

    def _samplers(self) -> None:
        instrument_loaders.install(self.rec)
        codes = instrument_samplers.mark_imported()
        if codes:
            self.rec.add_undo(lambda: instrument_samplers.unmark(codes))

    def on_import(self, name: str) -> None:
        with _lock:
            if name == "numpy.random":
                self._part("numpy")
            elif name == "torch":
                self._part("torch")
            elif self.active:
                self._samplers()


_current: list[Instrumentation] = []


def _register_hooks(inst: Instrumentation) -> None:
    """Post-import hooks (registered once per process) route to the active instrumentation."""
    global _hooks_registered
    _current[:] = [inst]
    if _hooks_registered:
        return
    _hooks_registered = True

    def hook_for(name: str) -> Callable[[object], None]:
        def hook(module: object) -> None:
            for active in _current:
                active.on_import(name)

        return hook

    for name in ("torch", "numpy.random", *instrument_samplers.KNOWN):
        wrapt.register_post_import_hook(hook_for(name), name)
