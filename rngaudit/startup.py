"""``RNGAUDIT=1``: arm the audit at interpreter start, compare at the end of every ``prepare()``."""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from rngaudit import config

log = logging.getLogger("rngaudit")
_started = False
_lock = threading.Lock()
CONTROLLER: Any = None


# Processes that inherit RNGAUDIT but are not training ranks: the torchrun launcher, and
# rngaudit's own command line (which reads reports and must never write one).
LAUNCHERS = ("torchrun", "rngaudit")
LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch", "rngaudit")


def _is_launcher() -> bool:
    """A launcher (torchrun, ``rngaudit run``) inherits RNGAUDIT but is not a rank."""
    argv = list(getattr(sys, "orig_argv", sys.argv))
    if any(os.path.basename(a) in LAUNCHERS for a in argv[:2]):
        return True
    return any(a == "-m" and argv[i + 1] in LAUNCHER_MODULES for i, a in enumerate(argv[:-1]))


def _is_child() -> bool:
    """A process started by an audited one (spawned DataLoader worker, helper process)."""
    if "--multiprocessing-fork" in sys.argv:
        return True
    owner = os.environ.get(config.ENV_OWNER)
    return owner is not None and owner != str(os.getpid())


def process_startup(environ: dict[str, str] | None = None) -> Any:
    """Called by the ``.pth`` hook when ``RNGAUDIT`` is set. Idempotent; never raises.

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
        if mode is None or _is_launcher() or _is_child():
            return None
        settings = config.resolve(mode=mode, environ=env, warn=_say)
    except Exception as exc:  # a typo must never stop Python from starting
        _say(f"{_one_line(exc)}; running unaudited")
        return None
    try:
        from rngaudit.run_audit import RunAudit

        os.environ[config.ENV_OWNER] = str(os.getpid())
        CONTROLLER = RunAudit(settings)
        CONTROLLER.arm()
        atexit.register(CONTROLLER.at_exit)
    except Exception as exc:
        _say(f"could not start ({_one_line(exc, repr)}); running unaudited")
        return None
    return CONTROLLER


def _say(message: str) -> None:
    """One line on stderr: at start-up a warning filter may not be set up yet."""
    sys.stderr.write(f"rngaudit: {message}\n")


def _one_line(exc: BaseException, form: Callable[[object], str] = str) -> str:
    """An exception as one line of at most 200 characters."""
    return " ".join(form(exc).split())[:200]


Callback = Callable[[], None]
