"""The data-parallel modules of a process: noted as built, found once on the heap, read total."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from ranks_in_process import world_of_one

from rngaudit.ranks import data_parallel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's data-parallel modules, empty for each test."""
    monkeypatch.setattr(data_parallel, "_FOUND", weakref.WeakValueDictionary())
    monkeypatch.setattr(data_parallel, "_GROUPS", {})
    monkeypatch.setattr(data_parallel, "_SEARCHED", [False])


def test_data_parallel_groups_are_the_modules_noted_or_found_once_on_the_heap(
    tmp_path: Path,
) -> None:
    with world_of_one(tmp_path):
        assert data_parallel.data_parallel_groups(scan=True) is None  # none exists
        assert data_parallel.data_parallel_groups(scan=True) is None
        built_before = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        assert data_parallel.data_parallel_groups(scan=True) is None  # searched once already
        data_parallel.installed(torch_loaded=True)  # a new installation of the guard
        assert data_parallel.data_parallel_groups(scan=False) is None  # not asked to search
        assert data_parallel.data_parallel_groups(scan=True) == [[0]]  # found on the heap
        assert data_parallel._FOUND[id(built_before)] is built_before  # and noted
        del built_before
        gc.collect()
        assert data_parallel.data_parallel_groups(scan=True) is None  # gone; not searched again
        module = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        data_parallel.note_module(module)  # built while the guard is installed
        assert data_parallel.data_parallel_groups(scan=False) == [[0]]
        assert data_parallel._group_ranks(torch.nn.Linear(2, 2)) == [0]  # no group: the world's
        del module
        gc.collect()
        unnoted = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        data_parallel.installed(torch_loaded=False)  # torch was not imported: none can exist
        assert data_parallel.data_parallel_groups(scan=True) is None  # so the heap is not searched
        assert id(unnoted) not in data_parallel._FOUND


class Disguised:
    """A user's object whose ``__class__`` is a property (``isinstance`` would call it)."""

    reads = 0

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        Disguised.reads += 1
        raise RuntimeError("__class__ of a user's object")


def test_the_heap_search_reads_each_objects_type_never_its_class_attribute(
    tmp_path: Path,
) -> None:
    Disguised.reads = 0
    keep = Disguised()
    with world_of_one(tmp_path):
        module = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        data_parallel.installed(torch_loaded=True)
        assert data_parallel.data_parallel_groups(scan=True) == [[0]]
        del module
    assert Disguised.reads == 0 and keep is not None
