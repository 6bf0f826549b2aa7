"""DataLoader worker streams: the static scan, the in-worker probe and the monitor."""

from __future__ import annotations

from rngaudit.workers.monitor import WorkerMonitor as WorkerMonitor

__all__ = ["WorkerMonitor"]
