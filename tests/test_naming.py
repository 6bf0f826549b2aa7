"""Unit tests for rngaudit.capture.naming: generator families, and each DataLoader's one label."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import torch
import torch.utils.data as D

import rngaudit
from rngaudit.capture import naming


class Loader:
    """A loader-like object: its class names it."""

    def __init__(self, sampler: Any = None) -> None:
        self.batch_sampler = sampler


class Slotted:
    __slots__ = ("batch_sampler",)  # no weak reference to it

    def __init__(self) -> None:
        self.batch_sampler = None


class Unhashable(Loader):
    def __eq__(self, other: object) -> bool:  # and so no __hash__: never used as a key
        raise AssertionError("compared")


def test_loaders_are_numbered_per_class_in_order_of_sight() -> None:
    names = naming.LoaderNames()
    a, b, c = Loader(), Loader(), Slotted()
    assert [names.name(a), names.name(b), names.name(c)] == ["Loader#1", "Loader#2", "Slotted#1"]
    assert names.name(a) == "Loader#1"  # asked again: the same
    assert names.loaders() == [a, b, c]


def test_a_freed_loaders_label_is_never_given_again() -> None:
    names = naming.LoaderNames()
    first = Loader()
    assert names.name(first) == "Loader#1"
    del first
    gc.collect()
    assert names.loaders() == []  # held weakly
    assert names.name(Loader()) == "Loader#2"


def test_an_object_without_weak_references_or_a_hash_is_named() -> None:
    names = naming.LoaderNames()
    slotted, odd = Slotted(), Unhashable()
    assert names.name(slotted) == "Slotted#1" and names.name(odd) == "Unhashable#1"
    assert names.name(slotted) == "Slotted#1" and names.name(odd) == "Unhashable#1"


def test_a_loader_is_found_from_what_its_iterator_holds() -> None:
    names = naming.LoaderNames()
    inner, other = object(), object()
    seen, built = Loader(inner), Loader(other)

    def holds(loader: Any, part: Any) -> bool:
        return bool(loader.batch_sampler is part)

    names.name(seen)
    assert names.find(inner, holds, []) == "Loader#1"
    later = Loader(inner)
    assert names.find(other, holds, [later, built]) == "Loader#3"  # named now, in their order
    assert names.loaders() == [seen, later, built]
    assert names.name(later) == "Loader#2"
    assert names.find(object(), holds, [built]) is None

    def odd(loader: Any, part: Any) -> bool:
        raise RuntimeError("a user's object")

    assert names.find(inner, odd, [seen]) is None  # never a raise


def test_a_window_names_its_loaders_with_the_process_wide_labels(tmp_path: Path) -> None:
    """The record's names are the ones the order check reads after the window closed."""
    data = D.TensorDataset(torch.arange(8))
    with rngaudit.audit(report_dir=tmp_path, mode="report") as first:
        one = D.DataLoader(data, batch_size=2)
    with rngaudit.audit(report_dir=tmp_path, mode="report") as second:
        two = D.DataLoader(data, batch_size=2)
    assert first.report is not None and second.report is not None
    labels = [r["loaders"][0]["loader"] for r in (first.report.ranks[0], second.report.ranks[0])]
    assert labels == [naming.LOADERS.name(one), naming.LOADERS.name(two)]
    numbers = [int(label.split("#")[1]) for label in labels]
    assert labels[0].startswith("DataLoader#") and numbers[1] == numbers[0] + 1
    rngaudit.wait_for_reports()


def test_generator_names_keep_a_family_and_an_aggregate() -> None:
    names = naming.GeneratorNames(limit=2)
    objs = [object() for _ in range(3)]
    got = [names.name("torch.Generator", id(o), o, hint="h" if i == 0 else None)
           for i, o in enumerate(objs)]  # fmt: skip
    assert got == ["torch.Generator#1 (h)", "torch.Generator#2", "torch.Generator#>2"]
    assert naming.family(got[0]) == "torch.Generator" and naming.is_explicit(got[1])
    assert naming.is_aggregate(got[2]) and not naming.is_aggregate(got[1])
    assert [n for n, _ in names.items()] == got[:2]
    names.clear()
    assert names.items() == []
