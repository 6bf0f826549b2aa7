"""The sketch of root samples above the bitmap's size: its estimates within their stated bound."""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.utils.data as D
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data.distributed import DistributedSampler

import rngaudit
from rngaudit.capture import sketch
from rngaudit.epochs import order_rules, partition


def _summary(size: int, keys: np.ndarray, batches: bool = False) -> dict[str, Any]:
    """What a rank's tape summarises after taking ``keys`` (as index batches, or at once)."""
    tape = partition.Tape([], size)
    if batches:
        tape.take([keys[i : i + 4096].tolist() for i in range(0, keys.size, 4096)])
    else:  # the fold's own step, on the array (no list to convert)
        assert tape.sample is not None
        tape.sample.add(keys.astype(np.int64))
        tape.taken, tape.batches = int(keys.size), 1
    return tape.summary()


SMALL_CAP = 2048  # the sample's size in the generated cases: small roots, the same statistics


def _kept_summary(size: int, keys: np.ndarray) -> dict[str, Any]:
    """What a sketched tape summarises after taking ``keys`` (its fold's own step)."""
    sample = sketch.Sample(size)
    sample.add(keys.astype(np.int64))
    return {"known": True, "root_size": size, "taken": int(keys.size), "sketch": sample.summary()}


@st.composite
def _epochs(draw: Any) -> tuple[int, list[np.ndarray]]:
    """A root 8 to 64 times the sample's size and what each rank took: a share of one order,
    of an order of its own (an overlap), a strided or contiguous block, with or without
    repeats."""
    size = draw(st.integers(SMALL_CAP * 8, SMALL_CAP * 64))
    world = draw(st.integers(2, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    shared_order = rng.permutation(size)
    out = []
    for r in range(world):
        kind = draw(st.sampled_from(["share", "own", "block", "strided", "replace"]))
        if kind == "share":
            out.append(shared_order[r::world])
        elif kind == "own":
            out.append(rng.permutation(size)[r::world])
        elif kind == "block":
            start = draw(st.integers(0, size - 1))
            out.append(np.arange(start, min(size, start + size // world), dtype=np.int64))
        elif kind == "strided":
            out.append(np.arange(r, size, draw(st.integers(1, 7)), dtype=np.int64))
        else:
            out.append(rng.integers(0, size, size // world, dtype=np.int64))
    return size, out


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(_epochs())
def test_the_estimates_lie_within_their_stated_bound(case: tuple[int, list[np.ndarray]]) -> None:
    size, taken = case
    with mock.patch.object(sketch, "CAP", SMALL_CAP):
        seen = sketch.overlap({r: _kept_summary(size, k) for r, k in enumerate(taken)}, size)
        p = sketch.rate(size)
    bound = functools.partial(sketch.bound_at, p=p)
    assert seen is not None and seen["estimated"]
    per_sample = np.zeros(size, dtype=np.int64)
    for k in taken:
        per_sample += np.bincount(np.unique(k), minlength=size)
    shared, never = int((per_sample > 1).sum()), int((per_sample == 0).sum())
    assert seen["shared_proven"] <= shared  # kept keys two ranks took: proven, never guessed
    assert abs(seen["shared"] - shared) <= bound(shared)
    assert abs(seen["union"] - int((per_sample > 0).sum())) <= bound(int((per_sample > 0).sum()))
    if shared:
        assert abs(seen["never_estimate"] - never) <= bound(never)
    else:
        assert seen["shared"] == 0
    for r, k in enumerate(taken):
        distinct = int(np.unique(k).size)
        assert abs(seen["per_rank"][r] - distinct) <= bound(distinct)


def test_an_overlap_is_an_error_only_when_proven_beyond_padding() -> None:
    size = partition.MAX_ROOT + 1000
    order = np.random.default_rng(0).permutation(size)
    intact = {r: _summary(size, order[r::2], batches=r == 0) for r in range(2)}
    padded = {0: intact[0], 1: _summary(size, np.append(order[1::2], order[0]))}
    for ok in (intact, padded):
        assert order_rules.partition_overlap(ok, "L", "chain", 0) is None
    other = np.random.default_rng(1).permutation(size)
    corrupted = {0: intact[0], 1: _summary(size, other[1::2])}
    finding = order_rules.partition_overlap(corrupted, "L", "chain", 0)
    assert finding is not None and finding.severity == "error"
    assert "about " in finding.message and "hash sample" in finding.message
    shared = int(np.intersect1d(order[0::2], other[1::2]).size)
    assert abs(finding.details["shared"] - shared) <= sketch.bound(shared, size)
    replaced = {
        r: _summary(size, np.random.default_rng(r).integers(0, size, size // 2)) for r in (0, 1)
    }
    assert order_rules.partition_overlap(replaced, "L", "chain", 0) is None  # with replacement


class _Items(D.Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i

    def __getitems__(self, indices: list[int]) -> list[int]:
        return list(indices)


def test_a_sketched_epoch_hands_out_what_the_unaudited_loader_does(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A random_split of a root over the bitmap's size, sharded by a DistributedSampler: the
    epoch is observed by the sketch, and batches and the global generator are as unaudited."""
    summarised: list[int] = []
    real = sketch.Sample.summary

    def counting(self: sketch.Sample) -> dict[str, Any]:
        summarised.append(self.root_size)
        return real(self)

    monkeypatch.setattr(sketch.Sample, "summary", counting)
    size = partition.MAX_ROOT + 1000
    split = D.random_split(_Items(size), [0.5, 0.5], generator=torch.Generator().manual_seed(0))

    def loader() -> D.DataLoader[int]:
        sampler: DistributedSampler[int] = DistributedSampler(split[0], num_replicas=2, rank=1)
        return D.DataLoader(split[0], batch_size=4096, sampler=sampler, collate_fn=list)

    plain = loader()
    torch.manual_seed(3)
    expected = [b for b in plain]
    state = torch.get_rng_state()
    with rngaudit.audit(report_dir=tmp_path, mode="report", every_epoch=True):
        audited = loader()
    torch.manual_seed(3)
    got = [b for b in audited]
    assert got == expected and torch.equal(torch.get_rng_state(), state)
    assert summarised and set(summarised) == {size}  # read ahead, and at the end
    rngaudit.wait_for_reports()


def test_a_long_index_list_over_a_big_root_is_converted_once_and_read_afresh_when_moved() -> None:
    indices = list(range(200_000))
    big = D.Subset(_Items(partition.MAX_ROOT + 1), indices)
    first = partition.root_mapping(big)
    again = partition.root_mapping(big)
    assert first is not None and again is not None and again[0][0] is first[0][0]
    random.Random(0).shuffle(indices)  # in place: the evenly spaced entries move
    moved = partition.root_mapping(big)
    assert moved is not None and moved[0][0] is not first[0][0]
    assert moved[0][0].tolist() == indices
    small = D.Subset(_Items(partition.MAX_ROOT), list(range(200_000)))  # a bitmap's: exact
    a, b = partition.root_mapping(small), partition.root_mapping(small)
    assert a is not None and b is not None and a[0][0] is not b[0][0]
