"""Tests for rngaudit.workers: dataset-owned generators duplicated across DataLoader workers."""

from __future__ import annotations

import gc
import glob
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data.dataloader as torch_dataloader
import worker_datasets as wd
from torch.utils.data import DataLoader

from rngaudit.errors import ConfigError, RNGAuditWarning, WorkerDuplicateStreamError
from rngaudit.findings import PERSISTENT_WORKER_STREAM, WORKER_DUPLICATE_STREAM, Finding
from rngaudit.workers.monitor import WorkerMonitor, analyse
from rngaudit.workers.probe import WorkerProbe
from rngaudit.workers.walk import (
    MAX_ITEMS,
    NUMPY_GENERATOR,
    NUMPY_RANDOMSTATE,
    PY_RANDOM,
    TORCH_GENERATOR,
    GeneratorRef,
    find_generators,
    fingerprint,
)

pytestmark = [
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated:UserWarning"),
]

KIND_NAMES = {
    "numpy": NUMPY_GENERATOR,
    "randomstate": NUMPY_RANDOMSTATE,
    "random": PY_RANDOM,
    "torch": TORCH_GENERATOR,
}
MP_ITER = torch_dataloader._MultiProcessingDataLoaderIter
ORIGINAL_INIT = MP_ITER.__dict__["__init__"]


def _report_dirs() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), f"rngaudit-workers-{os.getpid()}-*")))


@pytest.fixture(autouse=True)
def _no_leftovers() -> Iterator[None]:
    before = _report_dirs()
    yield
    gc.collect()
    assert MP_ITER.__dict__["__init__"] is ORIGINAL_INIT
    assert _report_dirs() <= before


class Monitored:
    """A monitor installed for the test, with the findings its sink received."""

    def __init__(self, mode: str = "report", timeout: float = 30.0) -> None:
        self.found: list[Finding] = []
        self.monitor = WorkerMonitor(self.found.append, mode=mode, timeout=timeout)

    def of(self, kind: str, severity: str | None = None) -> list[Finding]:
        return [
            f for f in self.found if f.kind == kind and (severity is None or f.severity == severity)
        ]

    def by_path(self, severity: str = "error") -> dict[str, Finding]:
        return {f.details["path"]: f for f in self.of(WORKER_DUPLICATE_STREAM, severity)}


@pytest.fixture
def monitored() -> Iterator[Callable[..., Monitored]]:
    made: list[Monitored] = []

    def make(mode: str = "report", timeout: float = 30.0) -> Monitored:
        m = Monitored(mode, timeout)
        m.monitor.install()
        made.append(m)
        return m

    yield make
    for m in made:
        m.monitor.uninstall()


def loader(dataset: Any, ctx: str = "fork", **kwargs: Any) -> DataLoader[Any]:
    kwargs.setdefault("num_workers", 2)
    kwargs.setdefault("batch_size", 2)
    return DataLoader(dataset, multiprocessing_context=ctx, **kwargs)


def consume(dl: Any, epochs: int = 1) -> list[torch.Tensor]:
    return [batch for _ in range(epochs) for batch in dl]


# --- static scan and fingerprints (no workers) ---------------------------------------------


def test_import_does_not_import_torch_or_numpy() -> None:
    code = (
        "import sys, rngaudit.workers.monitor; "
        "print('torch' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_find_generators_paths_and_types() -> None:
    refs = {r.path: r.kind for r in find_generators(wd.AllKindsDataset())}
    assert refs == {
        "dataset.np_gen": NUMPY_GENERATOR,
        "dataset.np_state": NUMPY_RANDOMSTATE,
        "dataset.py_random": PY_RANDOM,
        "dataset.torch_gen": TORCH_GENERATOR,
        "dataset.transform.rng": NUMPY_GENERATOR,
        "dataset.augs[0].rng": NUMPY_GENERATOR,
        "dataset.table['noise']": PY_RANDOM,
    }


def test_find_generators_skips_stdlib_private_and_global_ones() -> None:
    class Holder:
        def __init__(self) -> None:
            self.global_inst = random._inst
            self.system = random.SystemRandom()
            self.names = tempfile._RandomNameSequence()  # type: ignore[attr-defined]
            self.names.rng  # noqa: B018 - creates its private Random
            self.module = random
            self.func = random.random

    assert find_generators(Holder()) == []


def test_find_generators_module_children_slots_and_class_attributes() -> None:
    class Flip(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gen = torch.Generator()

    class Slotted:
        __slots__ = ("__private", "rng")

        def __init__(self) -> None:
            self.rng = random.Random(1)
            self.__private = np.random.default_rng(1)

    class WithClassRng:
        rng = np.random.default_rng(0)

        def __init__(self) -> None:
            self.transform = torch.nn.Sequential(Flip())
            self.slotted = Slotted()

    paths = {r.path for r in find_generators(WithClassRng())}
    assert paths == {
        "dataset.rng",
        "dataset.transform._modules['0'].gen",
        "dataset.slotted.rng",
        "dataset.slotted.__private",
    }


def test_find_generators_is_bounded_and_cycle_safe() -> None:
    class Big:
        def __init__(self) -> None:
            self.items = list(range(1_000_000))
            self.table = {i: [i] for i in range(200_000)}
            self.array = np.zeros((2000, 2000))
            self.tensor = torch.zeros(2000, 2000)
            self.early = [None] * (MAX_ITEMS - 1) + [random.Random(0)]
            self.late = [None] * MAX_ITEMS + [random.Random(0)]
            self.me = self
            deep: Any = random.Random(0)
            for _ in range(20):  # deeper than MAX_DEPTH
                deep = [deep]
            self.deep = deep

    big = Big()
    paths = [r.path for r in find_generators(big)]
    assert paths == [f"dataset.early[{MAX_ITEMS - 1}]"]  # bounded: late and deep are blind spots
    cyclic = find_generators(wd.CyclicDataset())
    assert [r.path for r in cyclic] == ["dataset.node.rng"]


@pytest.mark.parametrize("kind", wd.KINDS)
def test_fingerprint_reads_state_without_drawing(kind: str) -> None:
    gen = wd.make_generator(kind, seed=5)
    twin = wd.make_generator(kind, seed=5)
    name = KIND_NAMES[kind]
    assert fingerprint(gen, name) == fingerprint(gen, name) == fingerprint(twin, name)
    assert wd.draw(gen) == wd.draw(twin)  # reading did not advance gen
    before = fingerprint(gen, name)
    wd.draw(gen)
    assert fingerprint(gen, name) != before
    assert fingerprint(wd.make_generator(kind, seed=6), name) != fingerprint(
        wd.make_generator(kind, seed=5), name
    )


def test_probe_pickles_and_reports_init_errors(tmp_path: Any) -> None:
    probe = pickle.loads(pickle.dumps(WorkerProbe(wd.failing_worker_init_fn, str(tmp_path))))
    with pytest.raises(ValueError, match="boom in worker 3"):
        probe(3)
    assert os.listdir(tmp_path) == ["w3.json"]


def _report(worker: int, **fps: str) -> dict[str, Any]:
    gens = [{"path": f"dataset.{p}", "type": PY_RANDOM, "fingerprint": fp} for p, fp in fps.items()]
    return {"worker_id": worker, "status": "ok", "generators": gens}


SITE = {"file": "/src/aug.py", "line": 7, "function": "jitter"}


def _draws(worker: int, states: list[dict[str, Any]] | None = None, **holders: Any) -> Any:
    """A worker's draw report: per holder, the fingerprints before its draws at SITE."""
    draws = [
        {
            "generator": "random.Random#1",
            "type": PY_RANDOM,
            "holder": f"dataset.{h}",
            "op": "random.random",
            "site": SITE,
            "user_site": None,
            "count": len(fps),
            "fingerprints": list(fps),
        }
        for h, fps in holders.items()
    ]
    return {"worker_id": worker, "status": "ok", "draws": draws, "states": states or []}


def test_analyse_groups_diversity_and_confirmation() -> None:
    static = [GeneratorRef("dataset.a", PY_RANDOM, "random.Random", None)]
    static.append(GeneratorRef("dataset.b", PY_RANDOM, "random.Random", None))
    inits = {w: _report(w, a="x", b="same") for w in range(4)}  # equal state after init
    draws = {
        0: _draws(0, a=["x", "x1"], b=["10", "11"]),
        1: _draws(1, a=["x", "x1"], b=["20", "21"]),
        2: _draws(2, a=["y", "y1"], b=["30", "31"]),
        3: _draws(3, a=["x", "x1"], b=["40", "41"]),
    }
    (finding,) = analyse(static, inits, 4, persistent=False, draws=draws, waited_in_vain=[])
    assert finding.severity == "error" and finding.details["path"] == "dataset.a"
    assert finding.details["worker_ids"] == [0, 1, 3] and finding.details["evidence"] == "draws"
    assert finding.details["call_sites"] == ["aug.py:7 in jitter"]
    assert finding.details["distinct_streams"] == 2 and finding.details["diversity"] == 0.5
    assert "aug.py:7 in jitter" in finding.message and "2/4" in finding.message
    assert "torch.initial_seed()" in (finding.remedy or "")
    assert "worker_init_fn" in (finding.remedy or "") and "index" in (finding.remedy or "")

    # Equal state after worker_init_fn, but the draws differ (or none were made): no finding.
    only_b = {w: _draws(w, b=r["draws"][1]["fingerprints"]) for w, r in draws.items()}
    assert analyse(static, inits, 4, persistent=False, draws=only_b, waited_in_vain=[]) == []
    # A generator reset to the same state for every sample repeats within each worker: its
    # draws would repeat without workers too, so it is not a duplicated worker stream.
    reset = {w: _draws(w, a=["r", "r"]) for w in range(2)}
    assert analyse([], {}, 2, persistent=False, draws=reset, waited_in_vain=[]) == []
    # One draw per worker at the site (batch_size=1) cannot tell that reset from a shared
    # stream: unconfirmed, a warning; once two workers drew there twice, confirmed.
    once = {w: _draws(w, a=["x"]) for w in range(3)}
    (single,) = analyse([], {}, 3, persistent=False, draws=once, waited_in_vain=[])
    assert single.severity == "warning" and single.details["confirmed"] is False
    assert single.details["worker_ids"] == [0, 1, 2] and "unconfirmed" in single.message
    once[1] = _draws(1, a=["x", "x1"])
    (still,) = analyse([], {}, 3, persistent=False, draws=once, waited_in_vain=[])
    assert still.severity == "warning"  # one worker's stream is not two
    once[2] = _draws(2, a=["x", "x1"])
    (both,) = analyse([], {}, 3, persistent=False, draws=once, waited_in_vain=[])
    assert both.severity == "error" and both.details["worker_ids"] == [0, 1, 2]

    # Workers did not report their draws in time: unconfirmed, severity warning.
    (unconfirmed,) = analyse(static[:1], {0: _report(0, a="x")}, 4, persistent=False)
    assert unconfirmed.severity == "warning" and unconfirmed.details["confirmed"] is False
    assert unconfirmed.details["worker_ids"] == [0, 1, 2, 3]
    # ... but not when the other workers had no work (fewer batches than workers)
    one = {0: _draws(0, a=["x"])}
    assert analyse(static[:1], {}, 4, persistent=False, draws=one, waited_in_vain=[]) == []

    # Distinct in every worker: clean; with persistent workers only an info note.
    distinct = {w: _draws(w, b=[str(w)]) for w in range(4)}
    assert analyse(static[1:], inits, 4, persistent=False, draws=distinct, waited_in_vain=[]) == []
    (note,) = analyse(static[1:], {}, 4, persistent=True, draws=distinct, waited_in_vain=[])
    assert (note.kind, note.severity) == (PERSISTENT_WORKER_STREAM, "info")


def _state(path: str | None, before: str | None, after: str, created: Any = None) -> Any:
    return {"path": path, "type": NUMPY_GENERATOR, "created_at": created, "before": before,
            "after": after}  # fmt: skip


def test_analyse_one_holder_at_two_sites() -> None:
    """A holder drawn at two call sites: a confirmed site's evidence wins over an unconfirmed
    one's, whichever comes first; sites of the same standing are merged."""
    other = {"file": "/src/aug.py", "line": 9, "function": "crop"}

    def report(worker: int, once_first: bool) -> Any:
        r = _draws(worker, a=["s", "s1"])
        single = {**r["draws"][0], "site": other, "fingerprints": ["t"], "count": 1}
        r["draws"] = [single, r["draws"][0]] if once_first else [r["draws"][0], single]
        return r

    for once_first in (True, False):
        draws = {w: report(w, once_first) for w in range(2)}
        (finding,) = analyse([], {}, 2, persistent=False, draws=draws, waited_in_vain=[])
        assert finding.severity == "error" and finding.details["path"] == "dataset.a"
        assert finding.details["call_sites"] == ["aug.py:7 in jitter"]
    both = {w: _draws(w, a=["s", "s1"]) for w in range(2)}
    for w in both:
        both[w]["draws"].append({**both[w]["draws"][0], "site": other, "fingerprints": ["u", "v"]})
    (merged,) = analyse([], {}, 2, persistent=False, draws=both, waited_in_vain=[])
    assert merged.details["call_sites"] == ["aug.py:7 in jitter", "aug.py:9 in crop"]


def test_analyse_state_evidence() -> None:
    """numpy generators: the same state advancing identically in two workers over the first
    batch, their draws not seen: one transition each, so unconfirmed (a generator reset to a
    constant before every sample advances the same way)."""
    advanced = {w: _draws(w, [_state("dataset.rng", "s0", "s1")]) for w in range(3)}
    (finding,) = analyse([], {}, 3, False, draws=advanced, waited_in_vain=[])
    assert finding.severity == "warning" and finding.details["evidence"] == "state"
    assert finding.details["confirmed"] is False and "unconfirmed" in finding.message
    assert finding.details["worker_ids"] == [0, 1, 2] and "1/3" in finding.message
    unused = {w: _draws(w, [_state("dataset.rng", "s0", "s0")]) for w in range(3)}
    assert analyse([], {}, 3, False, draws=unused, waited_in_vain=[]) == []  # never drawn
    per_worker = {w: _draws(w, [_state("dataset.rng", "s0", f"s{w + 1}")]) for w in range(3)}
    assert analyse([], {}, 3, False, draws=per_worker, waited_in_vain=[]) == []
    # created in the batch (default_rng) at one site, with one seed: named by the site
    made = {w: _draws(w, [_state(None, "c", "c1", SITE)]) for w in range(2)}
    (created,) = analyse([], {}, 2, False, draws=made, waited_in_vain=[])
    assert created.details["path"] == "created at aug.py:7 in jitter"
    assert created.severity == "warning"
    # per sample: created twice in each worker from one seed: not a worker duplicate
    twice = {w: _draws(w, [_state(None, "c", "c1", SITE)] * 2) for w in range(2)}
    assert analyse([], {}, 2, False, draws=twice, waited_in_vain=[]) == []
    # appeared in the batch, constructor not observed: unconfirmed warning at most
    fresh = {w: _draws(w, [_state("dataset.rs", None, "f")]) for w in range(2)}
    (warning,) = analyse([], {}, 2, False, draws=fresh, waited_in_vain=[])
    assert warning.severity == "warning" and warning.details["confirmed"] is False


def test_mode_and_timeout_are_validated() -> None:
    with pytest.raises(ConfigError):
        WorkerMonitor(print, mode="loud")
    with pytest.raises(ConfigError):
        WorkerMonitor(print, timeout=-1)


def test_install_is_idempotent_and_uninstall_restores_originals() -> None:
    from torchdata.stateful_dataloader import stateful_dataloader as sdl

    td_iter = sdl._StatefulMultiProcessingDataLoaderIter
    td_init = td_iter.__dict__["__init__"]
    monitor = WorkerMonitor(print)
    with pytest.raises(RuntimeError, match="user error"):
        try:
            monitor.install()
            monitor.install()
            assert monitor.installed
            assert MP_ITER.__dict__["__init__"] is not ORIGINAL_INIT
            assert td_iter.__dict__["__init__"] is not td_init
            raise RuntimeError("user error")
        finally:
            monitor.uninstall()
    assert not monitor.installed
    assert MP_ITER.__dict__["__init__"] is ORIGINAL_INIT
    assert MP_ITER.__init__ is ORIGINAL_INIT
    assert td_iter.__dict__["__init__"] is td_init
    monitor.uninstall()  # twice is fine


def test_monitors_uninstalled_in_any_order_restore_originals() -> None:
    first, second = WorkerMonitor(print), WorkerMonitor(print)
    first.install()
    patched = MP_ITER.__dict__["__init__"]
    second.install()
    assert MP_ITER.__dict__["__init__"] is patched  # one shared patch
    first.uninstall()
    assert second.installed and not first.installed
    assert MP_ITER.__dict__["__init__"] is patched
    second.uninstall()
    assert MP_ITER.__dict__["__init__"] is ORIGINAL_INIT


# --- real workers, fork --------------------------------------------------------------------


@pytest.mark.parametrize("kind", wd.KINDS)
def test_owned_generator_is_a_confirmed_duplicate(monitored: Any, kind: str) -> None:
    m = monitored()
    batches = consume(loader(wd.OwnedDataset(kind)))
    draws: dict[int, list[Any]] = {int(r[0]): [] for b in batches for r in b}
    for b in batches:
        for r in b:
            draws[int(r[0])].append(float(r[2]))
    assert draws[0] == draws[1]  # the bug is real: both workers draw the same numbers
    (finding,) = m.found
    assert (finding.kind, finding.severity) == (WORKER_DUPLICATE_STREAM, "error")
    assert finding.generator == KIND_NAMES[kind]
    assert finding.details["path"] == "dataset.rng"
    assert finding.details["type"] == KIND_NAMES[kind]
    assert finding.details["worker_ids"] == [0, 1]
    assert finding.details["diversity"] == 0.5 and finding.details["confirmed"] is True
    assert "1/2" in finding.message and "dataset.rng" in finding.message


def test_nested_transform_list_and_dict(monitored: Any) -> None:
    m = monitored()
    consume(loader(wd.NestedDataset(), num_workers=3, batch_size=2))
    found = m.by_path()
    assert set(found) == {"dataset.transform.rng", "dataset.augs[0].rng", "dataset.table['noise']"}
    assert all(f.details["worker_ids"] == [0, 1, 2] for f in found.values())
    assert found["dataset.table['noise']"].generator == PY_RANDOM
    assert "1/3" in found["dataset.transform.rng"].message


def test_lazy_generator_is_clean(monitored: Any) -> None:
    m = monitored()
    it = iter(loader(wd.LazyDataset()))
    assert type(it) is not MP_ITER  # armed: the workers' draws decide, not the parent's walk
    rows = torch.cat(list(it))
    assert m.found == []
    by_worker = {int(r[0]): float(r[2]) for r in rows}
    assert by_worker[0] != by_worker[1]


def test_reseeding_in_worker_init_fn_is_clean_and_user_fn_runs(monitored: Any) -> None:
    m = monitored()
    rows = torch.cat(consume(loader(wd.ReseededDataset(), worker_init_fn=wd.reseed_worker_init_fn)))
    assert m.found == []
    assert all(int(r[0]) == int(r[1]) for r in rows)  # the user's fn ran in each worker
    assert len({float(r[2]) for r in rows}) == len(rows)


def test_rebuilding_with_a_constant_seed_is_still_a_duplicate(monitored: Any) -> None:
    m = monitored()
    consume(loader(wd.ReseededDataset(), worker_init_fn=wd.rebuild_same_worker_init_fn))
    assert set(m.by_path()) == {"dataset.rng"}


def test_num_workers_zero_is_clean_and_not_armed(monitored: Any) -> None:
    m = monitored()
    dl = DataLoader(wd.OwnedDataset(), batch_size=2, num_workers=0)
    it = iter(dl)
    assert type(it) is torch_dataloader._SingleProcessDataLoaderIter
    assert "_rngaudit_worker_check" not in vars(it)
    list(it)
    assert m.found == []


def test_persistent_workers_finding(monitored: Any) -> None:
    m = monitored()
    dl = loader(wd.OwnedDataset(), persistent_workers=True)
    consume(dl, epochs=2)
    assert [f.severity for f in m.of(WORKER_DUPLICATE_STREAM)] == ["error"]
    (persistent,) = m.of(PERSISTENT_WORKER_STREAM)
    assert persistent.severity == "warning" and persistent.details["path"] == "dataset.rng"


def test_raise_mode_raises_from_the_first_batch(monitored: Any) -> None:
    m = monitored(mode="raise")
    it = iter(loader(wd.OwnedDataset("random")))
    with pytest.raises(WorkerDuplicateStreamError, match=r"dataset\.rng"):
        next(it)
    assert [f.severity for f in m.found] == ["error"]  # the sink saw it too
    assert type(it) is MP_ITER
    assert len(list(it)) == 3  # the iterator stays usable, unchecked


def test_out_of_order_loader_keeps_its_order_and_is_still_checked(monitored: Any) -> None:
    # in_order=False yields batches as the workers finish them: a check that waited for
    # every worker's first batch at the first __next__ let slow sample 0 catch up (it came
    # 2nd, not last). The check looks without waiting and decides once all have reported.
    def order() -> list[int]:
        dl = loader(wd.SlowFirstOwnedDataset(n=12), in_order=False)
        return [int(b[0][1]) for b in dl]  # each batch's first sample

    unaudited = order()
    assert unaudited.index(0) >= 3  # the slow sample comes late: the premise holds
    m = monitored()
    assert order() == unaudited
    (finding,) = m.found
    assert (finding.kind, finding.severity) == (WORKER_DUPLICATE_STREAM, "error")
    assert finding.details["worker_ids"] == [0, 1] and finding.details["confirmed"] is True


def test_first_batch_check_removes_itself(monitored: Any) -> None:
    monitored()
    it = iter(loader(wd.OwnedDataset()))
    assert type(it) is not MP_ITER and isinstance(it, MP_ITER)
    next(it)
    assert type(it) is MP_ITER
    assert "_rngaudit_worker_check" not in vars(it)


def test_warn_mode_warns_and_does_not_change_the_data(monitored: Any) -> None:
    def run() -> tuple[list[torch.Tensor], Any]:
        torch.manual_seed(0)
        random.seed(0)
        np.random.seed(0)
        batches = consume(loader(wd.AllKindsDataset(), shuffle=True), epochs=2)
        state: Any = np.random.get_state()
        return batches, (torch.get_rng_state(), random.getstate(), state[1])

    plain, plain_state = run()
    m = monitored(mode="warn")
    with pytest.warns(RNGAuditWarning, match="share one random stream") as record:
        audited, audited_state = run()
    assert len(m.by_path()) == 7
    assert len(record) == 7  # one per path: the second epoch repeats nothing
    assert all(torch.equal(a, b) for a, b in zip(plain, audited, strict=True))
    assert torch.equal(plain_state[0], audited_state[0])
    assert plain_state[1] == audited_state[1]
    assert np.array_equal(plain_state[2], audited_state[2])


@pytest.mark.timeout(120)  # the monitor waits up to an hour: only not waiting passes
def test_user_init_errors_propagate_without_waiting(monitored: Any) -> None:
    monitored(mode="raise", timeout=3600.0)
    dl = loader(wd.OwnedDataset(), worker_init_fn=wd.failing_worker_init_fn)
    it = iter(dl)
    with pytest.raises(ValueError, match="boom in worker"):
        next(it)
    assert dl.worker_init_fn is wd.failing_worker_init_fn
    workers: Any = it._workers  # type: ignore[attr-defined]
    for w in workers:  # PyTorch joins failed workers slowly (5 s each): end them here
        w.terminate()


def test_slow_workers_give_an_unconfirmed_warning(
    monitored: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = tmp_path / "release"
    monkeypatch.setenv(wd.RELEASE_ENV, str(release))  # worker 1 waits for this file
    m = monitored(mode="raise", timeout=0.2)
    it = iter(loader(wd.OwnedDataset(), worker_init_fn=wd.slow_worker_init_fn))
    with pytest.warns(RNGAuditWarning, match="Unconfirmed: 1 of 2 workers"):
        next(it)  # batch 0 comes from worker 0; worker 1 is still in its init fn
    release.touch()
    del it
    (finding,) = m.found
    assert finding.severity == "warning" and finding.details["confirmed"] is False
    assert finding.details["reporting_workers"] == [0]


def test_cyclic_dataset_does_not_hang(monitored: Any) -> None:
    m = monitored()
    consume(loader(wd.CyclicDataset()))
    assert set(m.by_path()) == {"dataset.node.rng"}


def test_confirmed_replaces_unconfirmed_once(monitored: Any) -> None:
    m = monitored(mode="report")
    unconfirmed = analyse(
        [GeneratorRef("dataset.rng", PY_RANDOM, "random.Random", None)], {}, 2, False, "D"
    )
    m.monitor._publish(unconfirmed)
    confirmed = analyse(
        [],
        {},
        2,
        False,
        "D",
        draws={0: _draws(0, rng=["x", "y"]), 1: _draws(1, rng=["x", "y"])},
        waited_in_vain=[],
    )
    m.monitor._publish(confirmed)
    m.monitor._publish(unconfirmed)  # a later timeout does not downgrade it
    assert [f.severity for f in m.found] == ["warning", "error"]
    assert [f.severity for f in m.monitor.findings] == ["error"]


# --- torchdata's stateful loader: workers start in state_dict(), batches come later ----------


def test_stateful_loader_check_survives_uninstall() -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    found: list[Finding] = []
    monitor = WorkerMonitor(found.append, mode="raise")
    monitor.install()
    try:
        dl = StatefulDataLoader(
            wd.OwnedDataset("torch"), batch_size=2, num_workers=2, multiprocessing_context="fork"
        )
        dl.state_dict()  # what accelerate's prepare() does: starts the workers
    finally:
        monitor.uninstall()
    assert found == []
    with pytest.raises(WorkerDuplicateStreamError):
        next(iter(dl))
    assert [f.details["path"] for f in found] == ["dataset.rng"]


def test_accelerate_prepare_then_uninstall_still_checks_first_batch() -> None:
    pytest.importorskip("accelerate")
    code = "import worker_datasets; worker_datasets.accelerate_scenario()"
    env = {**os.environ, "PYTHONPATH": os.path.dirname(wd.__file__)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["imported_before"] is False  # patched through the post-import hook
    assert result["was_patched"] and result["restored"]
    assert result["findings_before_first_batch"] == 0
    assert "dataset.rng" in result["raised"]
    assert result["paths"] == ["dataset.rng"]


# --- real workers, spawn -------------------------------------------------------------------


def test_spawn_all_kinds_raise_by_first_batch(monitored: Any) -> None:
    m = monitored(mode="raise")
    it = iter(loader(wd.AllKindsDataset(with_torch=False), ctx="spawn"))
    with pytest.raises(WorkerDuplicateStreamError):
        next(it)
    found = m.by_path()
    assert {p: f.generator for p, f in found.items()} == {
        "dataset.np_gen": NUMPY_GENERATOR,
        "dataset.np_state": NUMPY_RANDOMSTATE,
        "dataset.py_random": PY_RANDOM,
        "dataset.torch_gen": PY_RANDOM,
        "dataset.transform.rng": NUMPY_GENERATOR,
        "dataset.augs[0].rng": NUMPY_GENERATOR,
        "dataset.table['noise']": PY_RANDOM,
    }
    assert all(f.details["worker_ids"] == [0, 1] for f in found.values())


def test_spawn_reseed_and_lazy_are_clean(monitored: Any) -> None:
    m = monitored(mode="raise")
    dl = loader(wd.ReseededDataset(), ctx="spawn", worker_init_fn=wd.reseed_worker_init_fn)
    rows = torch.cat(consume(dl))
    assert m.found == []
    assert all(int(r[0]) == int(r[1]) for r in rows)
    assert len({float(r[3]) for r in rows}) == len(rows)  # the lazy Random differs per worker


def test_spawn_unpicklable_init_fn_fails_as_before_and_restores(monitored: Any) -> None:
    monitored()

    def closure(worker: int) -> None:  # not picklable under spawn
        return None

    dl = loader(wd.OwnedDataset(), ctx="spawn", worker_init_fn=closure)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises((AttributeError, pickle.PicklingError, TypeError)):
            iter(dl)
    assert dl.worker_init_fn is closure
