"""Locks that a forked child gets back released when a thread gone in the child held them."""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

_LOCKS: weakref.WeakSet[Any] = weakref.WeakSet()


def lock() -> Any:
    """A re-entrant lock for rngaudit's own state, safe across ``fork``.

    A child inherits every lock in the state it had at the fork, and only the forking thread
    lives on in it: a lock another thread held then (naming a generator, say) would stay held
    forever and the child's first audit would hang. After a fork every such lock is
    re-initialised; one the forking thread itself holds is kept, to be released as usual.
    """
    new = threading.RLock()
    _LOCKS.add(new)
    return new


def _after_fork_in_child() -> None:
    for held in list(_LOCKS):
        if not held._is_owned():  # held by a thread that does not exist here, or by no one
            held._at_fork_reinit()


os.register_at_fork(after_in_child=_after_fork_in_child)
