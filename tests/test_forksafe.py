"""Fork safety: a lock held by another thread at a fork is released in the child."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from conftest import ROOT, run_python

from rngaudit import forksafe


def _child_can_take(lock: object) -> bool:
    """Fork; the child tries ``lock`` for 5 s and exits 0 if it got it."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child reports through its exit code)
        got = lock.acquire(timeout=5)  # type: ignore[attr-defined]
        os._exit(0 if got else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def test_a_lock_another_thread_holds_at_the_fork_is_free_in_the_child() -> None:
    lock = forksafe.lock()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait()
    try:
        assert _child_can_take(lock)
    finally:
        release.set()
        thread.join()


def test_a_lock_the_forking_thread_holds_stays_its_own_in_the_child() -> None:
    lock = forksafe.lock()
    with lock:
        pid = os.fork()
        if pid == 0:  # pragma: no cover
            owned = lock._is_owned()
            lock.release()  # the with-block's own release in the child must not fail
            os._exit(0 if owned else 1)
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_children_forked_while_a_thread_names_generators_never_hang(tmp_path: Path) -> None:
    proc = run_python([str(ROOT / "tests" / "forking" / "fork_while_naming.py"), str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-2:] == ["hung", "0"], proc.stdout + proc.stderr[-2000:]
