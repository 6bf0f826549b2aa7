"""Torch instrumentation: a dispatch mode for seeded ops, wrappers for seeding and state calls."""

from __future__ import annotations

from collections.abc import Callable
from sys import _getframe
from typing import Any

from rngaudit import fingerprint, naming
from rngaudit.callsite import Stack
from rngaudit.events import DRAW, SEED, STATE
from rngaudit.recorder import ROLE_LOADER, ROLE_SAMPLER, GenInfo, Recorder

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
        self.mode: Any = None
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

            @classmethod
            def _should_skip_dynamo(cls) -> bool:
                return False  # no dynamo wrapper: no 2 s import, no extra frames

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
                if op is None or not rec.enabled or getattr(local, "busy", False):
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
        self.mode = RNGAuditMode()  # type: ignore[no-untyped-call]
        self.mode.__enter__()
        rec.add_undo(self._pop_mode)

    def _pop_mode(self) -> None:
        if self.mode is not None:
            mode, self.mode = self.mode, None
            mode.__exit__(None, None, None)

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
