"""The store protocol: the one key builder's layout, pinned; the waits name who is missing."""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from rngaudit.ranks import store as protocol


def test_every_namespace_is_built_by_the_one_builder_and_keeps_its_layout() -> None:
    """The strings are the protocol between ranks (and versions): pinned byte for byte."""
    keys = protocol.ExchangeKeys("a/0123/0")
    assert [keys.base, keys.decision, keys.count, keys.all] == [
        "rngaudit/a/0123/0",
        "rngaudit/a/0123/0/decision",
        "rngaudit/a/0123/0/count",
        "rngaudit/a/0123/0/all",
    ]
    assert keys.record(3) == "rngaudit/a/0123/0/record/3"
    assert keys.arrival(3) == "rngaudit/a/0123/0/arrival/3"
    assert keys.claim("sig") == "rngaudit/a/0123/0/claim/sig"
    assert protocol.audit("audit at train.py:3", 2) == "a/fa6fe5fae9ef0b79/2"
    assert protocol.WAITING == "rngaudit/waiting" and protocol.position(5) == "rngaudit/at/5"
    assert protocol.run_id("/tmp/r") == "rngaudit/agree/run-id//tmp/r"
    assert protocol.replicas("abc", 1) / 0 == "rngaudit/replicas/abc/1/0"
    assert protocol.loader("k") / "iterated" / 1 == "rngaudit/observed/k/iterated/1"
    assert protocol.epoch("k", 4) / "end" / 0 == "rngaudit/observed/k/4/end/0"
    assert protocol.first_step("g", 1) / 2 == "rngaudit/observed/step/g/1/2"
    assert protocol.so_far("g", "k", 0, 4) / 1 == "rngaudit/observed/sofar/g/k/0/4/1"
    assert protocol.attempt_prefix(2) == "rngaudit-attempt-2"
    assert protocol.per_rank(protocol.key("x"), [0, 2]) == ["rngaudit/x/0", "rngaudit/x/2"]
    assert type(protocol.key("x") / 1) is protocol.Key


def test_a_wait_names_the_ranks_that_did_not_arrive_and_the_last_reader_cleans_up() -> None:
    store: Any = dist.HashStore()  # type: ignore[attr-defined]
    base = protocol.key("t", 1)
    store.set(base / 0, b"0")
    store.set(base / 2, b"2")
    start = time.monotonic()
    assert protocol.missing_after(store, base, [0, 1, 2, 3], 0.3) == [1, 3]
    assert time.monotonic() - start < 5.0
    store.set(base / 1, b"1")
    assert protocol.missing_after(store, base, [0, 1, 2], 5.0) == []
    keys = protocol.per_rank(base, [0, 1, 2])
    assert protocol.get_all(store, keys) == [b"0", b"1", b"2"]
    protocol.read_by_all(store, base, keys, 2)
    assert store.check(keys)  # one reader of two so far
    protocol.read_by_all(store, base, keys, 2)
    assert not any(store.check([k]) for k in [*keys, base / "read"])
    assert protocol.first_set(store, "x", "a") == b"a"
    assert protocol.first_set(store, "x", "b") == b"a"
