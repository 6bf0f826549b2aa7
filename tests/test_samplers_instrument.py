"""Sampler marks, in process: which code gets which role, what a mark attributes, undone."""

from __future__ import annotations

import importlib
import random
from collections.abc import Iterator
from typing import Any

import torch.utils.data as D
from torch.utils.data import dataloader, sampler

from rngaudit.capture.callsite import MARKED_CODES
from rngaudit.capture.instrument import samplers
from rngaudit.capture.instrument.python_random import PythonInstrumentation
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import ROLE_ITERATION, ROLE_LOADER, ROLE_SAMPLER, Recorder


def test_a_known_module_is_marked_once_with_each_methods_role_and_unmarked_by_the_ledger() -> None:
    codes = {
        D.RandomSampler.__iter__.__code__: ROLE_SAMPLER,
        D.BatchSampler.__iter__.__code__: ROLE_SAMPLER,
        D.DataLoader._get_iterator.__code__: ROLE_LOADER,
        D.DataLoader.__iter__.__code__: ROLE_ITERATION,
        dataloader._BaseDataLoaderIter.__next__.__code__: ROLE_ITERATION,
    }
    assert not any(code in MARKED_CODES for code in codes)  # no window is open
    ledger = PatchSet()
    try:
        for name in ("torch.utils.data.sampler", "torch.utils.data.dataloader"):
            marked = samplers.mark_module(name)
            assert marked and all(MARKED_CODES.get(c) is not None for c in marked)
            assert samplers.mark_module(name) == []  # marked already: once
            ledger.mark(marked)
        assert {c: MARKED_CODES.get(c) for c in codes} == codes
        assert D.SequentialSampler.__iter__.__code__ not in MARKED_CODES  # draws nothing
    finally:
        ledger.undo()
    assert not any(code in MARKED_CODES for code in codes)
    assert samplers.mark_module("rngaudit_test_never_imported") == []
    assert samplers.mark_module("json") == []  # imported, but nothing of it is known


def test_every_class_and_method_named_for_torch_and_torchdata_exists() -> None:
    for name in ("torch.utils.data.sampler", "torch.utils.data.distributed",
                 "torch.utils.data.dataloader", "torchdata.stateful_dataloader.sampler",
                 "torchdata.stateful_dataloader.stateful_dataloader"):  # fmt: skip
        module = importlib.import_module(name)
        for _, cls, methods in samplers.known(name):
            found = [m for m in methods if samplers._code(getattr(module, cls), m)]
            assert found, f"{name}.{cls} has none of {methods}"


class Base(sampler.Sampler[int]):
    def __iter__(self) -> Iterator[int]:
        random.random()
        return iter(range(2))

    def __len__(self) -> int:
        return 2


class Own(Base):
    def __next__(self) -> int:
        return 0


def test_a_users_samplers_classes_are_marked_up_the_mro_and_their_draws_attributed() -> None:
    ledger = PatchSet()
    rec = Recorder()
    rec.enabled = True
    PythonInstrumentation(rec).install()
    try:
        list(Own())  # not marked: a draw of no sampler
        marked = samplers.mark_objects([Own(), Own()])
        ledger.mark(marked)
        assert set(marked) == {
            Own.__next__.__code__,
            Base.__iter__.__code__,
            sampler.Sampler.__iter__.__code__,
        }
        assert all(MARKED_CODES.get(c) == ROLE_SAMPLER for c in marked)
        assert samplers.mark_objects([Own()]) == []  # marked already
        list(Own())
    finally:
        rec.uninstrument()
        ledger.undo()
    assert not any(c in MARKED_CODES for c in marked)
    draws: list[Any] = [e.to_dict() for e in rec.log.since(0)]
    assert [(e["op"], e["sampler"]) for e in draws] == [
        ("random.random", None),
        ("random.random", {"chain": "Own", "loader": None, "output_digest": None}),
    ]


class Odd(sampler.Sampler[int]):
    @staticmethod
    def __next__() -> int:
        return 0

    __iter__ = None  # type: ignore[assignment]


def test_a_static_method_is_marked_by_its_function_and_a_non_function_is_left_alone() -> None:
    assert samplers._code(Odd, "__next__") is Odd.__dict__["__next__"].__func__.__code__
    assert samplers._code(Odd, "__iter__") is None
    assert samplers._code(Odd, "__len__") is None  # not its own
