"""Torch instrumentation: a dispatch mode for seeded ops, wrappers for seeding and state calls."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from sys import _getframe
from typing import Any

from rngaudit import fingerprint, naming
from rngaudit.callsite import Stack
from rngaudit.events import DRAW, SEED, STATE
from rngaudit.recorder import ROLE_LOADER, ROLE_SAMPLER, GenInfo, Recorder

log = logging.getLogger("rngaudit")
_PENDING: list[Any] = []  # ctypes callbacks handed to the main thread: kept alive for good

# (module path, attribute, kind) of the Python-level seeding and state functions.
SEEDING = (
    ("torch", "manual_seed", SEED),
    ("torch", "seed", SEED),
    ("torch", "set_rng_state", STATE),
    ("torch.random", "manual_seed", SEED),
    ("torch.random", "seed", SEED),
    ("torch.random", "set_rng_state", STATE),
    ("torch.random", "fork_rng", STATE),
    ("torch.cuda", "manual_seed", SEED),
    ("torch.cuda", "manual_seed_all", SEED),
    ("torch.cuda", "seed", SEED),
    ("torch.cuda", "seed_all", SEED),
    ("torch.cuda", "set_rng_state", STATE),
    ("torch.cuda", "set_rng_state_all", STATE),
)


def _default_cpu(torch: Any) -> GenInfo:
    gen = torch.default_generator
    return naming.TORCH_DEFAULT, lambda: fingerprint.torch_generator(gen)


def _cuda_default(torch: Any, index: int | None) -> GenInfo:
    if index is None:
        index = torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    return naming.cuda_default(index), lambda: fingerprint.torch_generator(gen)


def _device_of(torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    device = kwargs.get("device")
    if device is not None:
        return device if isinstance(device, torch.device) else torch.device(device)
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
    return None


class TorchInstrumentation:
    """Installs and removes the torch side of the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.mode_class: Any = None
        self.modes: dict[int, Any] = {}  # thread ident -> the mode pushed on that thread
        self._modes_lock = threading.Lock()
        self._cpu_info: GenInfo | None = None

    def _cpu(self, stack: Stack) -> GenInfo:
        if self._cpu_info is None:
            import torch

            self._cpu_info = _default_cpu(torch)
        return self._cpu_info

    # -- which generator ---------------------------------------------------------------------
    def _explicit(self, torch: Any, gen: Any, stack: Stack) -> GenInfo:
        cdata = gen._cdata
        if cdata == torch.default_generator._cdata:
            return _default_cpu(torch)
        if gen.device.type == "cuda" and torch.cuda.is_initialized():
            for index, default in enumerate(torch.cuda.default_generators):
                if default._cdata == cdata:
                    return _cuda_default(torch, index)
        hint = None
        for role, obj in stack.marked:
            owned = getattr(obj, "generator", None) if role in (ROLE_SAMPLER, ROLE_LOADER) else None
            if owned is not None and getattr(owned, "_cdata", None) == cdata:
                hint = f"{type(obj).__name__}.generator"
                break
        name = self.rec.names.name("torch.Generator", cdata, gen, hint)
        return name, lambda: fingerprint.torch_generator(gen)

    def _resolve(
        self, torch: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Callable[[Stack], GenInfo | None]:
        gen = kwargs.get("generator")
        if gen is None:
            device = _device_of(torch, args, kwargs)
            if device is None or device.type == "cpu":
                return self._cpu  # the common case: no per-call closure
        return lambda stack: self._resolve_slow(torch, gen, args, kwargs, stack)

    def _resolve_slow(
        self, torch: Any, gen: Any, args: tuple[Any, ...], kwargs: dict[str, Any], stack: Stack
    ) -> GenInfo | None:
        if gen is not None:
            return self._explicit(torch, gen, stack)
        device = _device_of(torch, args, kwargs)
        if device.type == "cuda":
            return _cuda_default(torch, device.index)
        return f"torch.{device.type}.default_generator", lambda: None

    # -- install -------------------------------------------------------------------------------
    def install(self) -> None:
        import importlib

        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        rec = self.rec
        seeded_tag = torch.Tag.nondeterministic_seeded
        op_names: dict[Any, str | None] = {}  # op -> report name, None when not seeded
        local = rec._local
        outer = self

        class RNGAuditMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
            """Sees every seeded aten op (rand, randperm, random_, bernoulli_, ...)."""

            active = True  # False once retired: a mode that could not be popped passes through

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False  # no dynamo wrapper: no 2 s import, no extra frames

            @classmethod
            def ignore_compile_internals(cls) -> bool:
                # torch.compile traces and compiles as if no mode were pushed (otherwise dynamo
                # skips the frame for good and the model runs eager, drawing other values);
                # the compiled code's own runtime ops are still seen.
                return True

            def __torch_dispatch__(
                self,
                func: Any,
                types: Any,
                args: tuple[Any, ...] = (),
                kwargs: dict[str, Any] | None = None,
            ) -> Any:
                kwargs = kwargs or {}
                try:
                    op = op_names[func]
                except KeyError:
                    seeded = seeded_tag in func.tags
                    op = f"aten.{func.overloadpacket.__name__}" if seeded else None
                    op_names[func] = op
                if op is None or not self.active or not rec.enabled:
                    return func(*args, **kwargs)
                if getattr(local, "busy", False):
                    return func(*args, **kwargs)
                return outer._record_op(torch, func, op, args, kwargs)

        for module_name, attr, kind in SEEDING:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            if hasattr(module, attr):
                wrapper = self._seeding_wrapper(torch, module_name, attr, kind)
                rec.patches.wrap(module, attr, wrapper)
        self.mode_class = RNGAuditMode
        rec.torch = self
        rec.add_undo(self.pop_all)
        self.push_here()

    # -- the dispatch mode, one per thread -----------------------------------------------------
    # TorchDispatchMode stacks are thread-local: a mode is pushed on each thread that opens a
    # window and popped on that same thread when its last window there closes.
    def push_here(self) -> None:
        """Push a mode on this thread's dispatch stack (once per thread)."""
        ident = threading.get_ident()
        with self._modes_lock:
            if ident in self.modes or self.mode_class is None:
                return
            mode = self.modes[ident] = self.mode_class()
        mode.__enter__()

    def pop_here(self) -> None:
        """Pop this thread's mode, if it pushed one."""
        with self._modes_lock:
            mode = self.modes.pop(threading.get_ident(), None)
        if mode is not None:
            _pop_own(mode)

    def forget_other_threads(self) -> None:
        """In a forked child only the forking thread exists: the others' modes are gone."""
        ident = threading.get_ident()
        with self._modes_lock:
            self.modes = {i: m for i, m in self.modes.items() if i == ident}

    def pop_all(self) -> None:
        """At the outermost window's end: pop this thread's mode; another thread's mode is
        retired at once and popped on its own thread (the main thread's at its next bytecode
        boundary), or, for a thread that cannot be reached, left retired with a warning."""
        self.rec.torch = None
        self.pop_here()
        with self._modes_lock:
            others, self.modes = self.modes, {}
            self.mode_class = None
        for ident, mode in others.items():
            mode.active = False
            if ident == threading.main_thread().ident and _on_main_thread(
                functools.partial(_pop_own, mode)
            ):
                continue
            log.warning(
                "rngaudit: the audit window was opened on thread %s and closed on %s; its "
                "dispatch mode cannot be removed from the other thread and now only passes "
                "ops through. Open and close each audit on one thread.",
                ident,
                threading.current_thread().name,
            )

    def _record_op(
        self, torch: Any, func: Any, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        rec = self.rec
        local = rec._local
        local.busy = True
        try:
            try:
                event = rec.record(self._resolve(torch, args, kwargs), op, DRAW, _getframe(1))
            except Exception:  # the auditor must never break what it audits
                event = None
            out = func(*args, **kwargs)
            if event is not None and event.sampler is not None:
                try:
                    tensor = out if isinstance(out, torch.Tensor) else args[0]
                    data = tensor.detach().cpu().contiguous().numpy()
                    event.sampler.output_digest = fingerprint.digest_bytes(data)
                except Exception:
                    pass
            return out
        finally:
            local.busy = False

    def _seeding_wrapper(self, torch: Any, module_name: str, attr: str, kind: str) -> Any:
        rec = self.rec
        op = f"{module_name}.{attr}"
        on_cuda = module_name == "torch.cuda"

        def wrapper(
            wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
        ) -> Any:
            def resolve(stack: Stack) -> GenInfo | None:
                if on_cuda:
                    if not torch.cuda.is_initialized():
                        return naming.cuda_default(0) + " (lazy)", lambda: None
                    return _cuda_default(torch, None)
                return _default_cpu(torch)

            return rec.call(wrapped, args, kw, resolve, op, kind)

        return wrapper


def _pop_own(mode: Any) -> None:
    """Pop ``mode`` from this thread's stack if it is on top; otherwise retire it."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    mode.active = False
    current: Any = _get_current_dispatch_mode()
    if current is mode:
        mode.__exit__(None, None, None)
    else:  # another mode was pushed over it and is still open: popping would remove that one
        log.warning("rngaudit: another dispatch mode is open over the audit's; it stays, inert")


def _on_main_thread(func: Callable[[], None]) -> bool:
    """Run ``func`` on the main thread at its next bytecode boundary, as CPython runs signal
    handlers (``Py_AddPendingCall``). False when it cannot be scheduled."""
    import ctypes

    def call(_: Any) -> int:
        try:
            func()
        except Exception:  # never raise into the main thread's code
            log.debug("rngaudit: could not pop the main thread's mode", exc_info=True)
        return 0

    callback = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(call)
    _PENDING.append(callback)
    try:
        return int(ctypes.pythonapi.Py_AddPendingCall(callback, None)) == 0
    except (AttributeError, OSError):
        return False
