"""numpy instrumentation: the legacy global ``np.random`` functions and new generator objects."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rngaudit.capture import fingerprint, naming
from rngaudit.capture.callsite import Stack
from rngaudit.capture.event_log import CREATE, DRAW, SEED, STATE
from rngaudit.capture.patching import Plan
from rngaudit.capture.recorder import GenInfo, Recorder

DRAWS = (
    "rand", "randn", "randint", "random", "random_sample", "ranf", "sample", "choice",
    "shuffle", "permutation", "uniform", "normal", "standard_normal", "binomial", "poisson",
    "beta", "exponential", "gamma", "bytes", "random_integers", "multinomial",
    "multivariate_normal", "laplace", "logistic", "lognormal", "geometric", "dirichlet",
    "standard_exponential", "standard_gamma", "standard_t", "triangular", "weibull",
)  # fmt: skip
STATE_OPS = {"seed": SEED, "set_state": STATE}


class NumpyInstrumentation:
    """Wraps ``numpy.random``'s module-level functions (legacy global RNG) and ``default_rng``.

    numpy ``Generator``/``RandomState`` methods cannot be patched (C types): generators made
    by ``default_rng`` inside the window are named and observed through their state.
    """

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder

    def install(self) -> None:
        import importlib

        # importlib, not `import numpy.random as npr`: inside numpy's own lazy import of
        # numpy.random (a post-import hook) the parent attribute is not bound yet.
        npr = importlib.import_module("numpy.random")
        glob = npr.mtrand._rand

        def plan(plan: Plan) -> None:
            def resolve(stack: Stack) -> GenInfo | None:
                return naming.NUMPY_GLOBAL, lambda: fingerprint.numpy_random_state(glob)

            for name in (*DRAWS, *STATE_OPS):
                if hasattr(npr, name):
                    kind = STATE_OPS.get(name, DRAW)
                    plan.wrap(npr, name, self._wrapper(resolve, f"numpy.random.{name}", kind))
            plan.wrap(npr, "default_rng", self._creation_wrapper())

        # made once per recorder (see PatchSet.apply), for this global RandomState
        self.rec.patches.apply("numpy", plan, guard=glob)

    def _wrapper(self, resolve: Callable[[Stack], GenInfo | None], op: str, kind: str) -> Any:
        rec = self.rec

        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            return rec.call(wrapped, args, kw, resolve, op, kind)

        return wrapper

    def _creation_wrapper(self) -> Any:
        rec = self.rec

        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            gen = wrapped(*args, **kw)
            if rec.enabled and not rec.busy():
                bitgen = type(gen.bit_generator).__name__

                def resolve(stack: Stack) -> GenInfo | None:
                    name = rec.names.name("numpy.Generator", id(gen), gen, bitgen)
                    return name, lambda: fingerprint.numpy_generator(gen)

                with rec.paused():
                    rec.record(resolve, "numpy.random.default_rng", CREATE, _caller())
            return gen

        return wrapper


def _caller() -> Any:
    import sys

    return sys._getframe(2)
