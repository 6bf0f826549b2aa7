"""Python ``random`` instrumentation: the global generator and user ``random.Random`` objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rngaudit.capture import fingerprint, naming
from rngaudit.capture.callsite import Stack
from rngaudit.capture.event_log import DRAW, SEED, STATE
from rngaudit.capture.patching import Plan
from rngaudit.capture.recorder import GenInfo, Recorder

DRAWS = (
    "random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample",
    "gauss", "normalvariate", "lognormvariate", "expovariate", "vonmisesvariate",
    "gammavariate", "betavariate", "paretovariate", "weibullvariate", "triangular",
    "getrandbits", "randbytes", "binomialvariate",
)  # fmt: skip
STATE_OPS = {"seed": SEED, "setstate": STATE}


def _kind(name: str) -> str:
    return STATE_OPS.get(name, DRAW)


class PythonInstrumentation:
    """Wraps the ``random`` module's functions and ``random.Random``'s methods."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder

    def _resolve(self, rng: Any) -> Callable[[Stack], GenInfo | None]:
        import random

        def resolve(stack: Stack) -> GenInfo | None:
            if rng is random._inst:
                name = naming.PYTHON_GLOBAL
            elif isinstance(rng, random.SystemRandom):
                return None  # os.urandom: no state to audit
            else:
                name = self.rec.names.name("random.Random", id(rng), rng)
            return name, lambda: fingerprint.python_random(rng)

        return resolve

    def install(self) -> None:
        """Wrap them (the wrappers are made once per recorder, see ``PatchSet.apply``)."""
        import random

        self.rec.patches.apply("random", self._plan, guard=random._inst)

    def _plan(self, plan: Plan) -> None:
        import random

        names = [n for n in (*DRAWS, *STATE_OPS) if hasattr(random.Random, n)]
        for name in names:
            op, kind = f"random.{name}", _kind(name)
            if hasattr(random, name):
                plan.wrap(random, name, self._module_wrapper(random._inst, op, kind))
            plan.wrap(random.Random, name, self._method_wrapper(op, kind))

    def _module_wrapper(self, rng: Any, op: str, kind: str) -> Any:
        rec = self.rec
        resolve = self._resolve(rng)

        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            return rec.call(wrapped, args, kw, resolve, op, kind)

        return wrapper

    def _method_wrapper(self, op: str, kind: str) -> Any:
        rec = self.rec

        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            if instance is None or not rec.enabled or rec.busy():
                return wrapped(*args, **kw)
            # Draws made by the stdlib's private instances (tempfile, ...) are noise.
            return rec.call(wrapped, args, kw, self._resolve(instance), op, kind, True)

        return wrapper
