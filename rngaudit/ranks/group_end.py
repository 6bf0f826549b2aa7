"""The process group's end: destroy_process_group wrapped once, atexit registered once, in order."""

from __future__ import annotations

import atexit
import sys
import traceback
from collections.abc import Callable
from typing import Any

from rngaudit import forksafe
from rngaudit.capture.patching import PatchSet

# The end steps, in the order they run: before ``destroy_process_group()`` runs (the steps that
# registered a wrapper with :func:`before_destroy`) and at interpreter exit (those registered
# with :func:`at_exit`). Registering a step never changes this order: its place is here.
EPOCHS = "epochs"  # observed epochs still pending: loaders closed, epochs compared (order_check)
WAITS = "waits"  # exit: store waits still live get up to 1 s to return (ranks.store.Waiter)
WINDOW = "window"  # the whole-run window's last checkpoint and files; its own waits (whole_run)
MESHES = "meshes"  # exit: the DeviceMesh.__init__ wrapper undone (ranks.layout)
REPLICAS = "replicas"  # exit: the optimizer and all-reduce hooks undone (ranks.replicas)
STEPS = (EPOCHS, WAITS, WINDOW, MESHES, REPLICAS)

DESTROY_MODULES = ("torch.distributed", "torch.distributed.distributed_c10d")

Wrapper = Callable[[Callable[..., Any], Any, tuple[Any, ...], dict[str, Any]], Any]

_lock = forksafe.lock()
_exits: dict[str, list[Callable[[], object]]] = {}  # step -> its exit callbacks, in order
_destroys: dict[str, Wrapper] = {}  # step -> its wrapper of destroy_process_group
_patches = PatchSet()  # the one wrap of destroy_process_group (per module), while any step needs it
_registered = [False]  # run_at_exit registered with atexit (once per process)


def at_exit(step: str, callback: Callable[[], object]) -> None:
    """Run ``callback`` at interpreter exit in ``step``'s place of :data:`STEPS` (once, however
    often it is registered)."""
    if step not in STEPS:
        raise ValueError(f"{step!r} is not an end step ({', '.join(STEPS)})")
    with _lock:
        callbacks = _exits.setdefault(step, [])
        if callback not in callbacks:
            callbacks.append(callback)
        if not _registered[0]:
            _registered[0] = True
            atexit.register(run_at_exit)


def run_at_exit() -> None:
    """The exit steps in :data:`STEPS` order. A step that raises is reported as ``atexit``
    reports a callback's exception, and the steps after it still run."""
    for step in STEPS:
        with _lock:
            callbacks = list(_exits.get(step, ()))
        for callback in callbacks:
            try:
                callback()
            except BaseException:
                sys.stderr.write(f"Exception ignored in atexit callback: {callback!r}\n")
                traceback.print_exc()


def before_destroy(step: str, wrapper: Wrapper) -> None:
    """Call ``wrapper(wrapped, instance, args, kwargs)`` when ``destroy_process_group`` is
    called, in ``step``'s place of :data:`STEPS` (``wrapped``: the steps after it, then torch's
    function); one wrapper per step, the latest kept. Wraps the function once, when the first
    step asks (or when torch.distributed is imported), until :func:`forget_destroy` removed
    every step."""
    if step not in STEPS:
        raise ValueError(f"{step!r} is not an end step ({', '.join(STEPS)})")
    with _lock:
        _destroys[step] = wrapper
        if not len(_patches):
            for name in DESTROY_MODULES:
                _patches.when_imported(name, _wrap)


def forget_destroy(step: str) -> None:
    """``step`` no longer runs before ``destroy_process_group``; torch's function is put back
    when no step is left."""
    with _lock:
        _destroys.pop(step, None)
        if not _destroys:
            _patches.undo()


def _wrap(module: Any) -> None:
    if callable(getattr(module, "destroy_process_group", None)) and not _patches.replaced(
        module, "destroy_process_group"
    ):
        _patches.wrap(module, "destroy_process_group", _destroying)


def _destroying(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> Any:
    """The one wrapper: the steps' wrappers nested in :data:`STEPS` order around torch's."""
    with _lock:
        chain = [_destroys[step] for step in reversed(STEPS) if step in _destroys]
    call = wrapped
    for wrapper in chain:
        call = _nested(wrapper, call, instance)
    return call(*args, **kw)


def _nested(wrapper: Wrapper, inner: Callable[..., Any], instance: Any) -> Callable[..., Any]:
    def call(*args: Any, **kw: Any) -> Any:
        return wrapper(inner, instance, args, kw)

    return call
