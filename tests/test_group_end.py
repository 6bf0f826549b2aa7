"""The group's end: one destroy_process_group wrap, one atexit callback, steps in STEPS order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed import distributed_c10d

from rngaudit.ranks import group_end

EXIT_SCRIPT = """
import atexit
from rngaudit.ranks import group_end
say = lambda text: (lambda: print(text, flush=True))
def fails():
    raise ValueError("a step that fails")
for step in reversed(group_end.STEPS):  # registered last first: run in STEPS order all the same
    group_end.at_exit(step, say(step))
group_end.at_exit(group_end.WINDOW, fails)
twice = say("once")
group_end.at_exit(group_end.REPLICAS, twice)
group_end.at_exit(group_end.REPLICAS, twice)
atexit.register(say("registered after: runs first"))
"""


def test_the_exit_steps_run_once_each_in_the_stated_order() -> None:
    done = subprocess.run(
        [sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [
        "registered after: runs first",
        *group_end.STEPS,
        "once",
    ]
    assert "ValueError: a step that fails" in done.stderr  # reported; the steps after it ran


def test_an_unknown_step_is_refused() -> None:
    with pytest.raises(ValueError, match="not an end step"):
        group_end.at_exit("later", print)
    with pytest.raises(ValueError, match="not an end step"):
        group_end.before_destroy("later", lambda wrapped, instance, args, kw: None)


def test_destroy_is_wrapped_once_and_runs_the_steps_in_order_then_is_put_back(
    tmp_path: Path,
) -> None:
    original = dist.destroy_process_group
    assert distributed_c10d.destroy_process_group is original
    ran: list[str] = []

    def step(name: str) -> group_end.Wrapper:
        def wrapper(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
            ran.append(name)
            return wrapped(*args, **kw)

        return wrapper

    group_end.before_destroy(group_end.WINDOW, step("window"))  # registered first, runs second
    group_end.before_destroy(group_end.EPOCHS, step("epochs"))
    try:
        assert dist.destroy_process_group is not original
        assert distributed_c10d.destroy_process_group is not original
        store = dist.FileStore(str(tmp_path / "store"), 1)  # type: ignore[attr-defined]
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        dist.destroy_process_group()
        assert ran == ["epochs", "window"] and not dist.is_initialized()
        group_end.forget_destroy(group_end.EPOCHS)
        assert dist.destroy_process_group is not original  # the window still needs it
    finally:
        group_end.forget_destroy(group_end.EPOCHS)
        group_end.forget_destroy(group_end.WINDOW)
    assert dist.destroy_process_group is original
    assert distributed_c10d.destroy_process_group is original
