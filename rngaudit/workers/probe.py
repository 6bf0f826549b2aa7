"""The in-worker hook (the loader's ``worker_init_fn``): a worker's report of its generators."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rngaudit.workers import walk, worker_files


def worker_report(worker_id: int, dataset: object) -> dict[str, Any]:
    """What one worker reports: the generators its dataset copy holds, fingerprinted."""
    generators = []
    for ref in walk.find_generators(dataset):
        try:
            fp = walk.fingerprint(ref.obj, ref.kind)
        except Exception:
            continue
        generators.append({"path": ref.path, "type": ref.kind, "class": ref.cls, "fingerprint": fp})
    return {"worker_id": worker_id, "pid": os.getpid(), "status": "ok", "generators": generators}


class WorkerProbe:
    """The ``worker_init_fn`` handed to workers: observes the worker's first batch (its draws,
    see :mod:`rngaudit.workers.draws`), runs the user's function, then reports fingerprints.

    A module-level class so that it pickles under the spawn start method. The user's
    function is called with the worker id; its exceptions propagate unchanged.
    """

    def __init__(
        self, init_fn: Callable[[int], None] | None, report_dir: str, timeout: float = 30.0
    ) -> None:
        self.init_fn = init_fn
        self.report_dir = report_dir
        self.timeout = timeout

    def __call__(self, worker_id: int) -> None:
        first: Any = None
        try:
            from rngaudit.workers.draws import FirstBatch

            first = FirstBatch(self.report_dir, worker_id, getattr(self, "timeout", 30.0))
            first.start()
        except Exception:  # the observation must never break a worker: run unobserved
            first = None
        if self.init_fn is not None:
            try:
                self.init_fn(worker_id)
            except BaseException:
                if first is not None:
                    first.stop()
                worker_files.write_report(
                    self.report_dir, worker_id, {"worker_id": worker_id, "status": "init-error"}
                )
                raise
        try:
            from torch.utils.data import get_worker_info

            info = get_worker_info()
            dataset = info.dataset if info is not None else None
            report = worker_report(worker_id, dataset)
            report["observing"] = first is not None
        except Exception as exc:  # the probe must never break a worker
            report = {"worker_id": worker_id, "status": "probe-error", "error": repr(exc)}
        worker_files.write_report(self.report_dir, worker_id, report)

    def __repr__(self) -> str:
        return f"WorkerProbe({self.init_fn!r})"
