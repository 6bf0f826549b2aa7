"""Datasets and worker_init_fns for test_workers.py, importable by spawned workers."""

from __future__ import annotations

import os
import random
import time
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, get_worker_info

KINDS = ("numpy", "randomstate", "random", "torch")


def make_generator(kind: str, seed: int = 0) -> Any:
    if kind == "numpy":
        return np.random.default_rng(seed)
    if kind == "randomstate":
        return np.random.RandomState(seed)
    if kind == "random":
        return random.Random(seed)
    if kind == "torch":
        g = torch.Generator()
        g.manual_seed(seed)
        return g
    raise ValueError(kind)


def draw(gen: Any) -> float:
    """One uniform draw from any of the generator kinds."""
    if isinstance(gen, torch.Generator):
        return float(torch.rand(1, generator=gen).item())
    if isinstance(gen, np.random.RandomState):
        return float(gen.random_sample())
    return float(gen.random())


def worker_id() -> int:
    info = get_worker_info()
    return -1 if info is None else info.id


def row(*values: float) -> torch.Tensor:
    return torch.tensor([float(worker_id()), *values], dtype=torch.float64)


class OwnedDataset(Dataset[torch.Tensor]):
    """The bug: a generator built in __init__, copied into every worker."""

    def __init__(self, kind: str = "numpy", n: int = 8) -> None:
        self.n = n
        self.rng = make_generator(kind)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return row(float(index), draw(self.rng))


class SlowFirstOwnedDataset(OwnedDataset):
    """The bug, and sample 0 takes ``delay`` seconds: under ``in_order=False`` the other
    worker's samples come first, in an order only the workers' timing decides."""

    def __init__(self, kind: str = "numpy", n: int = 8, delay: float = 1.0) -> None:
        super().__init__(kind, n)
        self.delay = delay

    def __getitem__(self, index: int) -> torch.Tensor:
        if index == 0:
            time.sleep(self.delay)
        return super().__getitem__(index)


class Jitter:
    """A transform that owns its generator."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)

    def __call__(self, x: float) -> float:
        return x + float(self.rng.normal())


class NestedDataset(Dataset[torch.Tensor]):
    """Generators in a transform, in a list of transforms and in a dict."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.transform = Jitter(0)
        self.augs = [Jitter(1)]
        self.table = {"noise": random.Random(2)}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        a = self.transform(float(index))
        b = self.augs[0](0.0)
        c = self.table["noise"].random()
        return row(a, b, c)


class AllKindsDataset(Dataset[torch.Tensor]):
    """Every generator kind, directly and nested.

    ``with_torch=False`` leaves out the torch.Generator: PyTorch itself cannot pass one to
    spawned workers here (its state tensor fails to rebuild from shared memory).
    """

    def __init__(self, n: int = 8, with_torch: bool = True) -> None:
        self.n = n
        self.np_gen = make_generator("numpy")
        self.np_state = make_generator("randomstate")
        self.py_random = make_generator("random")
        self.torch_gen = make_generator("torch") if with_torch else make_generator("random", 3)
        self.transform = Jitter(0)
        self.augs = [Jitter(1)]
        self.table = {"noise": random.Random(2)}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        values = [draw(g) for g in (self.np_gen, self.np_state, self.py_random, self.torch_gen)]
        values += [self.transform(0.0), self.augs[0](0.0), self.table["noise"].random()]
        return row(float(index), *values)


class LazyDataset(Dataset[torch.Tensor]):
    """The fix: the generator is built in the worker from torch.initial_seed()."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.rng is None:
            self.rng = np.random.default_rng(torch.initial_seed() % 2**32)
        return row(float(index), float(self.rng.random()))


class ReseededDataset(Dataset[torch.Tensor]):
    """Owns a generator in __init__ that worker_init_fn reseeds; records the init call."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.rng = np.random.default_rng(0)
        self.lazy: random.Random | None = None
        self.init_worker = -1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy is None:
            self.lazy = random.Random(torch.initial_seed())
        return row(float(self.init_worker), float(self.rng.random()), self.lazy.random())


def reseed_worker_init_fn(worker: int) -> None:
    info = get_worker_info()
    assert info is not None
    info.dataset.rng = np.random.default_rng(info.seed)  # type: ignore[attr-defined]
    info.dataset.init_worker = worker  # type: ignore[attr-defined]


def rebuild_same_worker_init_fn(worker: int) -> None:
    """Wrong fix: rebuilds the generator with a constant seed in every worker."""
    info = get_worker_info()
    assert info is not None
    info.dataset.rng = np.random.default_rng(0)  # type: ignore[attr-defined]


def failing_worker_init_fn(worker: int) -> None:
    raise ValueError(f"boom in worker {worker}")


RELEASE_ENV = "RNGAUDIT_TEST_RELEASE"


def slow_worker_init_fn(worker: int) -> None:
    """Worker 1 starts late: it waits for the file ``$RNGAUDIT_TEST_RELEASE`` (the test makes
    it once the first-batch check gave up), so its report misses the check."""
    if worker == 1:
        release = os.environ[RELEASE_ENV]
        deadline = time.monotonic() + 120  # never hang a test run
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling for the event file, not a fixed wait


class Node:
    def __init__(self) -> None:
        self.back: Any = None
        self.kids: list[Any] = []
        self.rng = np.random.default_rng(0)


class CyclicDataset(Dataset[torch.Tensor]):
    """A dataset graph with cycles: self-reference, back-references, a list holding itself."""

    def __init__(self, n: int = 8) -> None:
        self.n = n
        self.me = self
        self.node = Node()
        self.node.back = self
        self.node.kids = [self.node, self]
        self.loop: list[Any] = []
        self.loop.append(self.loop)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        return row(float(index), float(self.node.rng.random()))


def accelerate_scenario() -> None:
    """Run in a fresh process by test_workers: the monitor is installed before torchdata is
    imported (post-import hook), workers start inside ``Accelerator.prepare()``, the monitor
    is uninstalled before the first batch, and the first batch still raises."""
    import json
    import sys

    from rngaudit.errors import WorkerDuplicateStreamError
    from rngaudit.findings import Finding
    from rngaudit.workers.monitor import TORCHDATA_DATALOADER, WorkerMonitor

    found: list[Finding] = []
    monitor = WorkerMonitor(found.append, mode="raise")
    monitor.install()
    imported_before = TORCHDATA_DATALOADER in sys.modules
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader

    config = DataLoaderConfiguration(use_stateful_dataloader=True)
    accelerator = Accelerator(cpu=True, dataloader_config=config)
    dl = DataLoader(OwnedDataset(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    prepared = accelerator.prepare(dl)
    findings_before = len(found)
    iter_class = sys.modules[TORCHDATA_DATALOADER]._StatefulMultiProcessingDataLoaderIter
    patched = iter_class.__dict__["__init__"]
    original = getattr(patched, "__wrapped__", None)
    monitor.uninstall()
    raised = ""
    try:
        for _batch in prepared:
            pass
    except WorkerDuplicateStreamError as exc:
        raised = str(exc)
    result = {
        "imported_before": imported_before,
        "was_patched": original is not None,
        "restored": original is not None and iter_class.__dict__["__init__"] is original,
        "findings_before_first_batch": findings_before,
        "raised": raised,
        "paths": [f.details["path"] for f in found],
    }
    print(json.dumps(result))
