"""``RNGAUDIT``: arm the audit at start in every process; ranks are found by what they do."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from rngaudit import config, forksafe
from rngaudit.capture.patching import PatchSet

log = logging.getLogger("rngaudit")
_started = False
_lock = forksafe.lock()
CONTROLLER: Any = None
# For the life of the process (a worker's loop stays wrapped): never undone.
PATCHES = PatchSet()

# rngaudit's own command line reads reports and never writes one: it does not arm.
OWN_COMMANDS = ("rngaudit",)
OWN_MODULES = ("rngaudit",)
WORKER_MODULE = "torch.utils.data._utils.worker"


def _is_own_command() -> bool:
    """``rngaudit report`` / ``rngaudit run`` (also as ``python -m rngaudit``)."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if any(os.path.basename(a) in OWN_COMMANDS for a in argv[:2]):
        return True
    return any(a == "-m" and argv[i + 1] in OWN_MODULES for i, a in enumerate(argv[:-1]))


def process_startup(environ: dict[str, str] | None = None) -> Any:
    """Called by the ``.pth`` hook when ``RNGAUDIT`` is set. Idempotent; never raises.

    Every process arms (cheaply: only what is imported gets instrumented). Whether it is a
    rank is decided later, by what it does: it joins a process group, or prepares or iterates
    a DataLoader. A process that does neither (a launcher, pip, a helper) writes nothing;
    a DataLoader worker (forked or spawned) detaches when its worker loop starts.
    Returns the controller, or None when the process runs unaudited.
    """
    global _started, CONTROLLER
    with _lock:
        if _started:
            return CONTROLLER
        _started = True
    env = os.environ if environ is None else environ
    try:
        mode = config.env_mode(env.get(config.ENV_MODE))
        if mode is None or _is_own_command():
            return None
        settings = config.resolve(mode=mode, environ=env, warn=_say)
    except Exception as exc:  # a typo must never stop Python from starting
        _say(f"{_one_line(exc)}; running unaudited")
        return None
    try:
        from rngaudit.ranks import group_end
        from rngaudit.whole_run import WholeRun

        CONTROLLER = WholeRun(settings)
        CONTROLLER.arm()
        group_end.at_exit(group_end.WINDOW, CONTROLLER.at_exit)
        PATCHES.when_imported(WORKER_MODULE, _watch_worker_loop)
    except Exception as exc:
        _say(f"could not start ({_one_line(exc, repr)}); running unaudited")
        return None
    return CONTROLLER


def _watch_worker_loop(module: Any) -> None:
    """In a process started by multiprocessing (a spawned DataLoader worker or an
    ``mp.spawn`` rank), make the DataLoader worker loop detach the audit when it starts.

    The parent pickles the worker's target by name; the child resolves the name after this
    hook ran, so it gets the wrapped loop. The main process is left untouched.
    """
    import multiprocessing

    if multiprocessing.current_process().name == "MainProcess" or PATCHES.replaced(module):
        return
    PATCHES.wrap(module, "_worker_loop", _detach_first)


def _detach_first(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    become_worker()
    return wrapped(*args, **kwargs)


def become_worker() -> None:
    """This process is a DataLoader worker: stop recording, write nothing. Never raises."""
    controller = CONTROLLER
    if controller is None:
        return
    try:
        controller.become_worker()
    except Exception:
        log.debug("rngaudit: could not detach a DataLoader worker", exc_info=True)


def _say(message: str) -> None:
    """One line on stderr: at start-up a warning filter may not be set up yet."""
    sys.stderr.write(f"rngaudit: {message}\n")


def _one_line(exc: BaseException, form: Callable[[object], str] = str) -> str:
    """An exception as one line of at most 200 characters."""
    return " ".join(form(exc).split())[:200]
