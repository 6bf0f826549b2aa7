"""Torch instrumentation: kernels for seeded aten ops at a spare dispatch key; seeding wrappers."""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from sys import _getframe
from typing import Any

from rngaudit import forksafe
from rngaudit.capture import callsite, fingerprint, naming
from rngaudit.capture.callsite import Stack
from rngaudit.capture.event_log import DRAW, SEED, STATE
from rngaudit.capture.instrument import seeded_ops
from rngaudit.capture.patching import Plan
from rngaudit.capture.recorder import ROLE_LOADER, ROLE_SAMPLER, GenInfo, Recorder

log = logging.getLogger("rngaudit")

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

# The functionality dispatch key the kernels are registered at: declared by torch (2.13) below
# Autograd and Python, above BackendSelect, with nothing registered on it. A key that has
# anything registered is refused (a later torch may use it): the dispatch mode is used then.
KEY_NAME = "Fake"
# Ops that must have no kernel at the key (besides the seeded ones) for it to count as unused.
_PROBE_OPS = ("aten::add.Tensor", "aten::empty.memory_format", "aten::mm", "aten::copy_")

NOT_A_DRAW = object()  # what OpSpec.generator returns for a call that draws nothing
Handler = Callable[["OpSpec", tuple[Any, ...], dict[str, Any], Any], Any]


class OpSpec:
    """One seeded op: its report name and where its schema keeps generator, tensor and flags."""

    __slots__ = (
        "call", "gen_pos", "name", "no_draw", "op", "plain", "tensor_kw", "tensor_pos",
    )  # fmt: skip

    def __init__(self, op: Any) -> None:
        self.op = op
        self.call = getattr(op, "_op", op)  # the C++ op itself: no OpOverload.__call__ frame
        self.name = f"aten.{op.overloadpacket.__name__}"
        self.gen_pos: int | None = None  # positional index of `generator` (None: keyword-only)
        self.tensor_pos: int | None = None  # first positional Tensor argument
        self.tensor_kw: str | None = None  # else a keyword-only one (`out`)
        self.no_draw: list[tuple[int | None, str, Any, Any]] = []  # (pos, name, default, value)
        for index, arg in enumerate(op._schema.arguments):
            pos = None if arg.kwarg_only else index
            if arg.name == "generator":
                self.gen_pos = pos
            elif str(arg.type) == "Tensor":
                if pos is not None and self.tensor_pos is None:
                    self.tensor_pos = pos
                elif pos is None and self.tensor_kw is None:
                    self.tensor_kw = arg.name
            if arg.name in seeded_ops.NO_DRAW_WHEN:
                default = arg.default_value if arg.has_default_value() else None
                self.no_draw.append((pos, arg.name, default, seeded_ops.NO_DRAW_WHEN[arg.name]))
        # the common shape (uniform_, normal_, bernoulli_, ...): always a draw, the tensor
        # first and required, the generator a keyword (the handler's shortest path)
        first = op._schema.arguments[0] if op._schema.arguments else None
        self.plain = (
            not self.no_draw
            and self.gen_pos is None
            and self.tensor_pos == 0
            and first is not None
            and not first.has_default_value()
        )

    def generator(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The generator argument (None: the device's default), or NOT_A_DRAW."""
        for pos, name, default, value in self.no_draw:
            given = args[pos] if pos is not None and pos < len(args) else kwargs.get(name, default)
            if given == value:
                return NOT_A_DRAW
        pos = self.gen_pos
        if pos is not None and pos < len(args):
            return args[pos]
        return kwargs.get("generator")

    def tensor(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        pos = self.tensor_pos
        if pos is not None and pos < len(args):
            return args[pos]
        return kwargs.get(self.tensor_kw) if self.tensor_kw else None


# -- the process-wide kernels (registered once, inert while the key is off) -------------------
class KeyedKernels:
    """Python kernels for :data:`seeded_ops.LEAF_OPS` at one dispatch key, registered once.

    While the key is off on a thread they cost nothing measurable; :meth:`on` / :meth:`off`
    switch it per thread. ``handler`` receives every seeded call made with the key on.
    """

    def __init__(self, torch: Any, key: Any) -> None:
        self.key = key
        self.handler: Handler | None = None
        self._set = torch._C._dispatch_tls_set_dispatch_key_included
        self._is = torch._C._dispatch_tls_is_dispatch_key_included
        self.specs: dict[str, OpSpec] = {}
        fallback = torch.library.Library("_", "IMPL")
        fallback.fallback(torch.library.fallthrough_kernel, KEY_NAME)
        lib = torch.library.Library("aten", "IMPL")
        for qualified in seeded_ops.LEAF_OPS:
            packet, _, overload = qualified.partition(".")
            op = getattr(getattr(torch.ops.aten, packet, None), overload, None)
            if op is None:  # not in this torch
                continue
            spec = OpSpec(op)
            self.specs[qualified] = spec
            lib.impl(qualified.removesuffix(".default"), self._kernel(spec), KEY_NAME)
        self._libs = (fallback, lib)  # kept alive: a Library deregisters when collected
        # At interpreter exit weakref's finalizers deregister every Library (torch's fallthrough
        # at the key included): any op a thread then runs with the key still on fails
        # (NotImplementedError "... from the 'Fake' backend"), the exit report's reads too.
        # Registered after those finalizers' exit hook, this runs before it: the key goes off.
        atexit.register(self._off_at_exit)

    def _kernel(self, spec: OpSpec) -> Callable[..., Any]:
        key, switch, op = self.key, self._set, spec.call

        def kernel(*args: Any, **kwargs: Any) -> Any:
            switch(key, False)  # what runs below (and the recorder's own ops) is not seen again
            try:
                handler = self.handler
                if handler is None:
                    return op(*args, **kwargs)
                try:
                    caller = _getframe(1)
                except ValueError:  # a thread with no Python frame (C++ only): nothing to name
                    return op(*args, **kwargs)
                return handler(spec, args, kwargs, caller)
            finally:
                switch(key, True)

        return kernel

    def _off_at_exit(self) -> None:
        with contextlib.suppress(Exception):
            self.off()

    def on(self) -> None:
        """Switch the key on for this thread (threads started later do not inherit it)."""
        self._set(self.key, True)

    def off(self) -> None:
        self._set(self.key, False)

    def is_on(self) -> bool:
        return bool(self._is(self.key))


_keyed: KeyedKernels | None = None
_keyed_state = "unknown"  # "unknown", "ready", "refused"
_keyed_lock = forksafe.lock()
FORCE_DISPATCH_MODE = False  # tests force the fallback


def key_is_free(torch: Any, name: str = KEY_NAME) -> Any:
    """The dispatch key ``name`` when it exists and nothing is registered at it, else None."""
    try:
        key = torch._C._parse_dispatch_key(name)
    except Exception:
        return None
    if key is None or not hasattr(torch._C, "_dispatch_tls_set_dispatch_key_included"):
        return None
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    if torch._C._dispatch_has_backend_fallback(key):
        return None
    probes = [*_PROBE_OPS, *(f"aten::{op}".removesuffix(".default") for op in seeded_ops.LEAF_OPS)]
    for op_name in probes:
        try:
            if has_kernel(op_name, name):
                return None
        except RuntimeError:  # an op this torch does not have
            continue
    return key


def keyed_kernels() -> KeyedKernels | None:
    """The process's kernels, registered on first use (3-10 ms); None to use the dispatch mode."""
    global _keyed, _keyed_state
    if FORCE_DISPATCH_MODE:
        return None
    if _keyed_state != "unknown":
        return _keyed
    with _keyed_lock:
        if _keyed_state == "unknown":
            import torch

            try:
                key = key_is_free(torch)
                _keyed = KeyedKernels(torch, key) if key is not None else None
            except Exception:
                log.debug("rngaudit: no kernels at the %s key", KEY_NAME, exc_info=True)
                _keyed = None
            _keyed_state = "ready" if _keyed is not None else "refused"
        return _keyed


def intercepting() -> bool:
    """Whether this thread's seeded torch ops reach rngaudit now (the key, or the mode)."""
    import sys

    if "torch" not in sys.modules:
        return False
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    keyed = _keyed
    if keyed is not None and keyed.is_on() and keyed.handler is not None:
        return True
    mode: Any = _get_current_dispatch_mode()
    return mode is not None and bool(getattr(mode, "active", True))


def prepare() -> None:
    """Register the kernels now if torch is loaded (called when arming, off the window path)."""
    import sys

    if "torch" in sys.modules:
        keyed_kernels()


# -- generators ------------------------------------------------------------------------------
def _default_cpu(torch: Any) -> GenInfo:
    gen = torch.default_generator
    return naming.TORCH_DEFAULT, fingerprint.TorchFingerprint(gen)


def _cuda_default(torch: Any, index: int | None) -> GenInfo:
    if index is None:
        index = torch.cuda.current_device()
    gen = torch.cuda.default_generators[index]
    return naming.cuda_default(index), fingerprint.TorchFingerprint(gen)


class TorchInstrumentation:
    """Installs and removes the torch side of the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        self.rec = recorder
        self.mode_class: Any = None  # the fallback dispatch mode's class (the key is taken)
        self.keyed: KeyedKernels | None = None
        self.threads: dict[int, Any] = {}  # thread ident -> its mode, None for the key
        self._threads_lock = forksafe.lock()
        self._cpu_info: GenInfo | None = None
        self.torch: Any = None
        self._gens: dict[int, GenInfo] = {}
        # per thread (its __dict__): callsite.lines_to_user key -> (event, audit index,
        # iteration flag, log, code objects): the repeat path of _handle
        self._repeats = threading.local()

    def _cpu(self, stack: Stack) -> GenInfo:
        info = self._cpu_info
        if info is None:
            import torch

            info = self._cpu_info = _default_cpu(torch)
        return info

    # -- which generator ---------------------------------------------------------------------
    def _explicit(self, gen: Any, stack: Stack) -> GenInfo:
        """The name of an explicit generator, fixed at first sight (cached by its C address:
        a named generator is held by the names, so its address is not reused; one beyond the
        named ones is neither held nor cached)."""
        cdata = gen._cdata
        info = self._gens.get(cdata)
        if info is None:
            info = self._name_explicit(gen, cdata, stack)
            if not naming.is_aggregate(info[0]):
                self._gens[cdata] = info
        return info

    def _name_explicit(self, gen: Any, cdata: int, stack: Stack) -> GenInfo:
        torch = self.torch
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
        return name, fingerprint.TorchFingerprint(gen)

    def _by_device(self, device: Any) -> Callable[[Stack], GenInfo | None]:
        torch = self.torch
        if device.type == "cuda":
            return lambda stack: _cuda_default(torch, device.index)
        name = f"torch.{device.type}.default_generator"
        return lambda stack: (name, lambda: None)

    # -- the draw handler (both mechanisms) ----------------------------------------------------
    def _handle(
        self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], frame: Any
    ) -> Any:
        """The draw handler of both mechanisms (:meth:`install` uses :meth:`_handler`'s
        faster copy with the process's recorder)."""
        rec = self.rec
        op = spec.call
        if not rec.enabled or rec.busy():
            return op(*args, **kwargs)
        try:
            gen = spec.generator(args, kwargs)
            if gen is NOT_A_DRAW:
                return op(*args, **kwargs)
            tensor = spec.tensor(args, kwargs)
            event = self._slow(spec, gen, tensor, frame, None)
        except Exception:  # the auditor must never break what it audits
            log.debug("rngaudit: recording failed", exc_info=True)
            event = None
        out = op(*args, **kwargs)
        if event is not None and event.sampler is not None:
            self._digest(event, out, args)
        return out

    def _slow(
        self, spec: OpSpec, gen: Any, tensor: Any, frame: Any, key: tuple[Any, ...] | None
    ) -> Any:
        """Record a draw with a stack walk; with a repeat ``key``, remember its event for it.
        None when it is no draw or not a new event."""
        resolve: GenInfo | Callable[[Stack], GenInfo | None]
        if tensor is not None and not tensor.is_cpu and tensor.is_meta:
            return None  # initialising a meta model draws nothing
        if gen is not None:
            known = self._gens.get(gen._cdata)
            resolve = known or (lambda stack: self._explicit(gen, stack))
        elif tensor is None or tensor.is_cpu:
            resolve = self._cpu_info or self._cpu
        else:
            resolve = self._by_device(tensor.device)
        if key is None:
            return self.rec.record(resolve, spec.name, DRAW, frame)
        found: list[Any] = []
        event = self.rec.record(resolve, spec.name, DRAW, frame, found=found)
        if found and found[0].digest is None:
            self._remember(key, found[0], frame)
        return event

    def _handler(self) -> Handler:
        """:meth:`_handle` for the process's :class:`Recorder`, with the repeat path: a draw
        whose lines up to user code (``callsite.lines_to_user``), generator and op were seen
        already on this thread, in this window state, is one dict lookup and a count."""
        rec = self.rec
        local = rec._local
        repeats = self._repeats
        gens = self._gens
        lines_to_user = callsite.lines_to_user
        kinds, user, marks = callsite.FILE_KINDS, callsite.USER, callsite.MARKED_CODES.by_id
        not_a_draw = NOT_A_DRAW

        def handle(spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any], frame: Any) -> Any:
            op = spec.call
            try:  # rec.busy(), inline (a missing thread-local attribute costs 0.3 µs: set it)
                busy = local.busy
            except AttributeError:
                busy = local.busy = False
            if busy or not rec.enabled:
                return op(*args, **kwargs)
            try:
                if spec.plain:  # spec.generator() and spec.tensor(), inline
                    gen = kwargs.get("generator")
                    tensor = args[0]
                else:
                    gen = spec.generator(args, kwargs)
                    if gen is not_a_draw:
                        return op(*args, **kwargs)
                    tensor = spec.tensor(args, kwargs)
                on_cpu = tensor is None or tensor.is_cpu
                key = None
                if gen is None:
                    gkey = None if on_cpu else not_a_draw  # (another device: walked)
                else:
                    gkey = gen._cdata
                    if gkey not in gens or not (on_cpu or not tensor.is_meta):
                        gkey = not_a_draw
                if gkey is not not_a_draw:
                    code = frame.f_code  # lines_to_user's first step, inline
                    if kinds.get(code.co_filename) == user and id(code) not in marks:
                        key = (spec, gkey, id(code), frame.f_lasti)
                    else:
                        key = lines_to_user(frame, spec, gkey)
                if key is not None:
                    hit = repeats.__dict__.get(key)  # type: ignore[call-overload]
                    if (
                        hit is not None
                        and hit[1] == rec.audit_index
                        and hit[2] is rec.iteration_started
                        and hit[3] is rec.log
                    ):
                        hit[0].count += 1
                        return op(*args, **kwargs)
                event = self._slow(spec, gen, tensor, frame, key)
            except Exception:  # the auditor must never break what it audits
                log.debug("rngaudit: recording failed", exc_info=True)
                event = None
            out = op(*args, **kwargs)
            if event is not None and event.sampler is not None:
                self._digest(event, out, args)
            return out

        return handle

    def _remember(self, key: tuple[Any, ...], event: Any, frame: Any) -> None:
        """Keep ``event`` as the repeat of ``key`` on this thread, with the window state it
        is valid for and the code objects whose ids ``key`` holds (so they are not reused)."""
        repeats = self._repeats.__dict__
        if len(repeats) >= _MAX_REPEATS:
            repeats.clear()
        codes = [frame.f_code]
        for _ in range((len(key) - 4) // 2):
            frame = frame.f_back
            codes.append(frame.f_code)
        rec = self.rec
        repeats[key] = (event, rec.audit_index, rec.iteration_started, rec.log, codes)  # type: ignore[index]

    @staticmethod
    def _digest(event: Any, out: Any, args: tuple[Any, ...]) -> None:
        try:
            import torch

            tensor = out if isinstance(out, torch.Tensor) else args[0]
            flat = tensor.detach().reshape(-1)
            n = int(flat.shape[0])
            if n <= _FULL_OUTPUT:
                data = flat.cpu().contiguous().numpy()
                event.sampler.output_digest = fingerprint.digest_bytes(data)
                return
            # a long order (randperm of a 45M-sample split: 360 MB) by its length and evenly
            # spaced entries: orders that differ across ranks differ there almost everywhere,
            # and two told equal that are not can only hide a finding, never make one
            data = flat[:: n // _SAMPLED_OUTPUT][:_SAMPLED_OUTPUT].cpu().contiguous().numpy()
            event.sampler.output_digest = f"{n}:{fingerprint.digest_bytes(data)}"
        except Exception:
            pass

    # -- install -------------------------------------------------------------------------------
    def install(self) -> None:
        import importlib
        import sys

        import torch

        rec = self.rec
        self.torch = torch

        def plan(plan: Plan) -> None:
            for module_name, attr, kind in SEEDING:
                module = sys.modules.get(module_name)  # loaded with torch (import_module: 5 µs)
                if module is None:
                    try:
                        module = importlib.import_module(module_name)
                    except ImportError:
                        continue
                if hasattr(module, attr):
                    plan.wrap(module, attr, self._seeding_wrapper(torch, module_name, attr, kind))

        rec.patches.apply("torch", plan, guard=torch)  # made once per recorder
        keyed = keyed_kernels()
        # (a recorder of its own, a worker's DrawRecorder, gets the plain handler)
        handle = self._handler() if type(rec) is Recorder else self._handle
        if keyed is not None:
            self.keyed = keyed
            keyed.handler = handle
        else:
            self.mode_class = _dispatch_mode(torch, handle)
        rec.torch = self
        rec.patches.add_undo(self.pop_all)
        self.push_here()

    # -- per thread ------------------------------------------------------------------------------
    # The dispatch key's inclusion and a TorchDispatchMode stack are both thread-local: each
    # thread that opens a window switches torch's interception on for itself, and off on that
    # same thread when its last window there closes.
    def push_here(self) -> None:
        """Switch the interception on for this thread (once per thread)."""
        ident = threading.get_ident()
        with self._threads_lock:
            if ident in self.threads:
                return
            if self.keyed is not None:
                self.threads[ident] = None
            elif self.mode_class is not None:
                self.threads[ident] = self.mode_class()
            else:
                return
            mode = self.threads[ident]
        if mode is None:
            assert self.keyed is not None
            self.keyed.on()
        else:
            mode.__enter__()

    def pop_here(self) -> None:
        """Switch this thread's interception off, if it switched it on."""
        ident = threading.get_ident()
        with self._threads_lock:
            if ident not in self.threads:
                return
            mode = self.threads.pop(ident)
        if mode is None:
            if self.keyed is not None:
                self.keyed.off()
        else:
            _pop_own(mode)

    def forget_other_threads(self) -> None:
        """In a forked child only the forking thread exists: the others' switches are gone."""
        ident = threading.get_ident()
        with self._threads_lock:
            self.threads = {i: m for i, m in self.threads.items() if i == ident}

    def pop_all(self) -> None:
        """At the outermost window's end: switch this thread off. Another thread that still has
        the interception on gets pass-through kernels (the key's handler is cleared: a seeded op
        there costs a redispatch, other ops nothing); a mode left on another thread is retired
        and popped on its own thread (the main thread's at its next bytecode boundary)."""
        self.rec.torch = None
        self.pop_here()
        with self._threads_lock:
            others, self.threads = self.threads, {}
            self.mode_class = None
        keyed, self.keyed = self.keyed, None
        if keyed is not None:
            keyed.handler = None
        for ident, mode in others.items():
            on_main = ident == threading.main_thread().ident
            if mode is None:  # the key, left on another thread: pass-through from now on,
                if on_main and keyed is not None:  # and switched off there when it can be
                    _on_main_thread(keyed.off)
                continue
            mode.active = False
            if on_main and _on_main_thread(functools.partial(_pop_own, mode)):
                continue
            log.warning(
                "rngaudit: the audit window was opened on thread %s and closed on %s; its "
                "dispatch mode cannot be removed from the other thread and now only passes "
                "ops through. Open and close each audit on one thread.",
                ident,
                threading.current_thread().name,
            )

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


def _dispatch_mode(torch: Any, handle: Handler) -> Any:
    """The fallback: a Python dispatch mode class (one instance pushed per thread) that sees
    every aten op (+5 µs on each)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seeded_tag = torch.Tag.nondeterministic_seeded
    specs: dict[Any, OpSpec | None] = {}  # op -> its spec, None when not seeded

    class RNGAuditMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """Sees every seeded aten op (rand, randperm, random_, bernoulli_, ...)."""

        active = True  # False once retired: a mode that could not be popped passes through

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False  # no dynamo wrapper: no 2 s import, no extra frames

        @classmethod
        def ignore_compile_internals(cls) -> bool:
            # torch.compile traces as if no mode were pushed (otherwise dynamo skips the frame
            # for good and the model runs eager); the compiled code's own ops are still seen
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
                spec = specs[func]
            except KeyError:
                seeded = seeded_tag in func.tags and _qualified(func) not in seeded_ops.NOT_DRAWS
                spec = specs[func] = OpSpec(func) if seeded else None
            if spec is None or not self.active:
                return func(*args, **kwargs)
            try:
                caller = _getframe(1)
            except ValueError:  # a thread with no Python frame (C++ only): nothing to name
                return func(*args, **kwargs)
            return handle(spec, args, kwargs, caller)

    return RNGAuditMode


def _qualified(op: Any) -> str:
    return f"{op.overloadpacket.__name__}.{op._overloadname}"


_MAX_REPEATS = 4096  # repeat keys kept per thread (then forgotten and rebuilt)
_FULL_OUTPUT = 1 << 20  # sampler outputs up to this many entries digested whole
_SAMPLED_OUTPUT = 1 << 16  # longer ones: their length and this many evenly spaced entries
_PENDING: list[Any] = []  # ctypes callbacks handed to the main thread: kept alive for good


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
