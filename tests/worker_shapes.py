"""Real augmentation shapes that duplicate (or do not) a worker's random stream, one column each.

Importable by spawned workers; ``main(cells)`` iterates the loaders of each cell (a start
method, ``-iterable``, ``-persistent``) with no rngaudit code and prints every batch as JSON
(the ``RNGAUDIT`` test runs it with and without the variable).
"""

from __future__ import annotations

import functools
import json
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, IterableDataset, get_worker_info

N = 12
WORKERS = 3

# -- a user's augmentation module ----------------------------------------------------------
_RNG = np.random.default_rng(0)  # module level, built at import: copied into every worker
_GOOD_RNG = np.random.default_rng(0)  # module level too, but rebuilt per worker (good_init)


def module_jitter(x: float) -> float:
    return x + float(_RNG.normal())


def good_module_jitter(x: float) -> float:
    return x + float(_GOOD_RNG.normal())


def make_closure(seed: int) -> Callable[[float], float]:
    rng = np.random.default_rng(seed)

    def closure_jitter(x: float) -> float:
        return x + float(rng.normal())

    return closure_jitter


def partial_jitter(x: float, rng: Any) -> float:
    return x + float(rng.normal())


class Compose:
    def __init__(self, transforms: list[Any]) -> None:
        self.transforms = transforms

    def __call__(self, x: float) -> float:
        for t in self.transforms:
            x = t(x)
        return x


class RandomApply(Compose):
    """Applies its transforms (always: p=1 keeps the columns aligned)."""


class ToFloat:
    def __call__(self, x: float) -> float:
        return float(x)


class Augmenter:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def jitter(self, x: float) -> float:
        return x + float(self.rng.normal())


class Jitter:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, x: float) -> float:
        return x + self.rng.random()


class Inner(Dataset[float]):
    def __init__(self, transform: Any) -> None:
        self.transform = transform

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> float:
        return float(self.transform(0.0))


def _worker() -> int:
    info = get_worker_info()
    return -1 if info is None else info.id


# -- the shapes that duplicate a stream (issue 22) -------------------------------------------
BAD = {
    # column: the holder (or call site) the finding must name
    "lazy_constant": "dataset.lazy",
    "module_level": "worker_shapes._RNG",
    "closure": "dataset.closure_fn.<closure rng>",
    "partial": "dataset.partial_fn.keywords['rng']",
    "lambda_in_compose": "dataset.lam.transforms[0].<closure rng5>",
    "bound_method": "dataset.bound.transforms[1].__self__.rng",
    "deep_pipeline": "dataset.deep.datasets[0].transform.transforms[1].transforms[0].rng",
    "init_constant": "dataset.init_made",
    "seedsequence_child": "dataset.ss_rng",
    "collate": "collate_fn.rng",
}
# -- their correct twins, and issue 20's correct patterns -------------------------------------
GOOD = (
    "lazy_initial_seed",
    "reseeded_in_init",
    "module_reseeded_in_init",
    "seedsequence_spawn",
    "reseeded_per_index",
    "replaced_on_first_use",
    "split_only_then_torch_rand",
    "python_random_per_index",
    "collate",
)


# Closures and lambdas cannot be pickled to spawn or forkserver workers (by PyTorch itself).
FORK_ONLY = ("closure", "lambda_in_compose")


def _zero(x: float) -> float:
    return 0.0


class BadShapes(Dataset[torch.Tensor]):
    def __init__(self, fork: bool = True) -> None:
        self.lazy: Any = None
        self.closure_fn = make_closure(1) if fork else _zero
        self.partial_fn = functools.partial(partial_jitter, rng=np.random.default_rng(2))
        rng5 = np.random.default_rng(5)
        self.lam = Compose([lambda x: x + float(rng5.normal())] if fork else [_zero])
        self.bound = Compose([ToFloat(), Augmenter(6).jitter])
        self.deep: ConcatDataset[float] = ConcatDataset(
            [Inner(Compose([ToFloat(), RandomApply([Jitter(7)])]))]
        )
        self.init_made: Any = None  # the worker_init_fn builds it, with a constant seed
        self.ss = np.random.SeedSequence(9)
        self.ss_rng: Any = None

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy is None:
            self.lazy = np.random.default_rng(0)
        if self.ss_rng is None:
            self.ss_rng = np.random.default_rng(self.ss.spawn(1)[0])
        values = [
            float(self.lazy.normal()),
            module_jitter(0.0),
            self.closure_fn(0.0),
            self.partial_fn(0.0),
            self.lam(0.0),
            self.bound(0.0),
            self.deep[index % len(self.deep)],
            float(self.init_made.normal()) if self.init_made is not None else 0.0,
            float(self.ss_rng.normal()),
        ]
        return torch.tensor([float(_worker()), float(index), *values], dtype=torch.float64)


class SpawnBad(BadShapes):
    """The bad shapes under spawn: a class of their own, so are their findings."""


class ForkserverBad(BadShapes):
    """The bad shapes under forkserver: a class of their own, so are their findings."""


BAD_CLASSES = {"fork": BadShapes, "spawn": SpawnBad, "forkserver": ForkserverBad}


def label(method: str, iterable: bool = False) -> str:
    """The bad loader's dataset class, as the findings name it (``details["dataset"]``)."""
    cls = Streamed if iterable else BAD_CLASSES[method]
    return f"{cls.__module__}.{cls.__qualname__}"


def _shapes(dataset: Any) -> Any:
    return getattr(dataset, "shapes", dataset)  # the shapes behind a Streamed wrapper


def bad_init(worker: int) -> None:
    info = get_worker_info()
    assert info is not None
    _shapes(info.dataset).init_made = np.random.default_rng(8)


class NoisyCollate:
    """A collate_fn that owns its generator: one noise column per batch row."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def __call__(self, rows: list[torch.Tensor]) -> torch.Tensor:
        batch = torch.stack(rows)
        noise = torch.tensor([[self.rng.random()] for _ in rows], dtype=torch.float64)
        return torch.cat([batch, noise], dim=1)


class ReseedingCollate:
    """The collate_fn's correct twin: its generator is rebuilt from torch.initial_seed()."""

    def __init__(self) -> None:
        self.rng: random.Random | None = None

    def __call__(self, rows: list[torch.Tensor]) -> torch.Tensor:
        if self.rng is None:
            self.rng = random.Random(torch.initial_seed())
        batch = torch.stack(rows)
        noise = torch.tensor([[self.rng.random()] for _ in rows], dtype=torch.float64)
        return torch.cat([batch, noise], dim=1)


class GoodShapes(Dataset[torch.Tensor]):
    def __init__(self) -> None:
        self.lazy: Any = None
        self.reseeded = np.random.default_rng(0)  # replaced in good_init from the worker seed
        self.children = np.random.SeedSequence(3).spawn(WORKERS)
        self.child_rng: Any = None
        self.rs = np.random.RandomState(4)  # reseeded per index
        self.fallback = np.random.default_rng(0)  # for num_workers=0; replaced on first use
        self.replaced = False
        self.split_rng = np.random.default_rng(6)  # used only here, to split
        self.order = self.split_rng.permutation(N)
        self.py = random.Random(7)

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> torch.Tensor:
        if self.lazy is None:
            self.lazy = np.random.default_rng(torch.initial_seed() % 2**32)
        if self.child_rng is None:
            self.child_rng = np.random.default_rng(self.children[max(_worker(), 0)])
        if not self.replaced:
            self.fallback = np.random.default_rng(torch.initial_seed() % 2**32)
            self.replaced = True
        self.rs.seed(100 + index)
        self.py.seed(200 + index)
        values = [
            float(self.lazy.normal()),
            float(self.reseeded.normal()),
            good_module_jitter(0.0),
            float(self.child_rng.normal()),
            float(self.rs.random_sample()),
            float(self.fallback.normal()),
            float(torch.rand(1).item()) + float(self.order[index]),
            self.py.random(),
        ]
        return torch.tensor([float(_worker()), float(index), *values], dtype=torch.float64)


def good_init(worker: int) -> None:
    global _GOOD_RNG
    info = get_worker_info()
    assert info is not None
    _shapes(info.dataset).reseeded = np.random.default_rng(info.seed)
    _GOOD_RNG = np.random.default_rng(info.seed)


class Streamed(IterableDataset[torch.Tensor]):
    """An IterableDataset over the same shapes: each worker yields its share of indices."""

    def __init__(self, shapes: Dataset[torch.Tensor]) -> None:
        self.shapes = shapes

    def __iter__(self) -> Iterator[torch.Tensor]:
        info = get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for index in range(start, N, step):
            yield self.shapes[index]


def loaders(method: str, *, iterable: bool = False, persistent: bool = False) -> dict[str, Any]:
    """The bad and the good loader for one start method."""
    kwargs: dict[str, Any] = {
        "batch_size": 2,
        "num_workers": WORKERS,
        "multiprocessing_context": method,
        "persistent_workers": persistent,
    }
    bad: Any = BAD_CLASSES[method](fork=method == "fork")
    good: Any = GoodShapes()
    if iterable:
        bad, good = Streamed(bad), Streamed(good)
    return {
        "bad": DataLoader(bad, worker_init_fn=bad_init, collate_fn=NoisyCollate(10), **kwargs),
        "good": DataLoader(good, worker_init_fn=good_init, collate_fn=ReseedingCollate(), **kwargs),
    }


def columns(which: str) -> list[str]:
    return [*BAD] if which == "bad" else list(GOOD)


def truth(batches: list[torch.Tensor], which: str) -> dict[str, bool]:
    """Per column, whether two workers drew a same value (measured from the data alone)."""
    rows = torch.cat(batches)
    out = {}
    for offset, name in enumerate(columns(which)):
        by_worker: dict[int, set[float]] = {}
        for row in rows:
            by_worker.setdefault(int(row[0]), set()).add(float(row[2 + offset]))
        values = list(by_worker.values())
        out[name] = any(a & b for i, a in enumerate(values) for b in values[i + 1 :])
    return out


def run(method: str, epochs: int = 1, **kwargs: Any) -> dict[str, list[torch.Tensor]]:
    return {
        which: [batch for _ in range(epochs) for batch in dl]
        for which, dl in loaders(method, **kwargs).items()
    }


def cell(name: str) -> dict[str, Any]:
    """A cell's loader options: ``spawn-persistent`` is spawn, persistent workers, 2 epochs."""
    method, *flags = name.split("-")
    persistent = "persistent" in flags
    return {
        "method": method,
        "iterable": "iterable" in flags,
        "persistent": persistent,
        "epochs": 2 if persistent else 1,
    }


def main(cells: list[str]) -> None:
    out = {}
    for name in cells:
        torch.manual_seed(0)  # the workers' base seed: equal in both runs
        batches = run(**cell(name))
        out[name] = {which: [b.tolist() for b in bs] for which, bs in batches.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])


class Reseeded(Dataset[torch.Tensor]):
    """Held numpy generators drawn once per sample: one reseeded per index (correct), one
    reseeded to a constant per sample (correct: every sample gets the same draw, with or
    without workers) and one never reseeded (a stream every worker copies)."""

    def __init__(self, n: int = 4) -> None:
        self.n = n
        self.per_index = np.random.RandomState(4)
        self.constant = np.random.RandomState(5)
        self.shared = np.random.RandomState(6)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> torch.Tensor:
        self.per_index.seed(100 + index)
        self.constant.seed(0)
        values = [
            float(self.per_index.random_sample()),
            float(self.constant.random_sample()),
            float(self.shared.random_sample()),
        ]
        return torch.tensor([float(_worker()), float(index), *values], dtype=torch.float64)


RESEEDED = ("per_index", "constant", "shared")
