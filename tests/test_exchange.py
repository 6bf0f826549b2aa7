"""Cross-rank exchange with real processes: JSON through the store, bounded waits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import torchrun

from rngaudit.ranks import exchange
from rngaudit.ranks import store as protocol

pytestmark = pytest.mark.timeout(300)


def test_records_cross_as_json_not_pickle() -> None:
    record = {"rank": 0, "events": [{"op": "aten.rand", "count": 2}]}
    payload = exchange.encode(record)
    assert exchange.decode(payload) == record
    with pytest.raises(ValueError):
        exchange.decode(exchange.encode([1]))  # type: ignore[arg-type]


def test_single_process_exchange_is_local() -> None:
    result = exchange.exchange({"rank": 0}, "k", timeout=1)
    assert (result.world_size, result.missing, len(result.records)) == (1, [], 1)


def test_a_rank_that_never_arrives_is_named_and_nobody_hangs(tmp_path: Path) -> None:
    proc = torchrun("tests/distributed/exchange_timeout.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result-0.json").read_text())
    assert result["raised"] == "RNGAuditTimeoutError"
    assert result["missing"] == [1]
    assert "Rank(s) 1 did not arrive" in result["message"]
    assert result["kinds"] == ["rank-missing"]
    assert result["elapsed"] >= 1  # waited for the timeout (rank 1 leaves only after rank 0)
    merged = json.loads((tmp_path / "report" / "report.json").read_text())
    assert merged["verdict"] == "error"
    assert [f["kind"] for f in merged["findings"]] == ["rank-missing"]


def test_equal_ranks_fetch_one_record_per_group_but_rank0_fetches_all(tmp_path: Path) -> None:
    proc = torchrun("tests/distributed/exchange_groups.py", str(tmp_path), nproc=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"result-{r}.json").read_text()) for r in range(3)]
    assert {r["verdict"] for r in results} == {"ok"}
    assert results[0]["ranks"] == [{"rank": r, "same_as": None} for r in range(3)]
    assert results[2]["ranks"] == [
        {"rank": 0, "same_as": None},
        {"rank": 1, "same_as": 0},
        {"rank": 2, "same_as": None},
    ]
    merged = json.loads((tmp_path / "report" / "report.json").read_text())
    assert all(r["events"] for r in merged["ranks"])  # the merged report has every rank's events


def test_a_rank_whose_block_raises_still_exchanges_so_nobody_waits(tmp_path: Path) -> None:
    proc = torchrun("tests/distributed/exchange_exception.py", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"result-{r}.json").read_text()) for r in (0, 1))
    assert r1["raised"] == "ValueError: user code failed on rank 1"  # unchanged
    assert r0["raised"] is None
    assert r0["elapsed"] < 30 and r1["elapsed"] < 30  # far below the 60 s timeout
    assert r0["report"] and r1["report"]


class _RacingStore:
    """A real store on which rank 0 decides "complete" the moment the arrivals are complete,
    as it may when the leaving rank is descheduled right after its arrival."""

    def __init__(self, key: str) -> None:
        import torch.distributed as dist

        self.real = dist.HashStore()  # type: ignore[attr-defined]
        self.keys = protocol.ExchangeKeys(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def set(self, key: str, value: Any) -> None:
        self.real.set(key, value)
        if key == self.keys.all:
            exchange._decide(self.real, self.keys, exchange._complete(self.real, self.keys, 2))


def test_a_rank_leaving_on_ctrl_c_is_reported_interrupted_whoever_decides_first() -> None:
    key = protocol.audit("audit at train.py:3", 0)
    store = _RacingStore(key)
    info = {"label": "audit at train.py:3", "mode": "raise"}
    exchange.publish(store, 0, 2, key, {"signature": "s"}, dict(info, raised=None))
    raised = dict(info, raised="KeyboardInterrupt: ")
    left = exchange.exchange_on(
        exchange.Seat(store, 1, 2), {"signature": "s"}, key, 5.0, info=raised, leave=True
    )
    assert (left.kind, left.interrupted) == ("interrupted", [1])
    stayed = exchange.collect(exchange.Seat(store, 0, 2), {"signature": "s"}, key, 5.0)
    assert (stayed.kind, stayed.interrupted) == ("interrupted", [1])


class _CtrlCStore:
    """A real TCP store on which Ctrl-C arrives while rank 0 waits for the other rank."""

    def __init__(self) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        self.real = dist.TCPStore(  # type: ignore[attr-defined]
            "127.0.0.1", 0, 2, True, timeout=timedelta(seconds=30), wait_for_workers=False
        )
        self.checks = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def check(self, keys: list[str]) -> bool:
        self.checks += 1
        if self.checks == 3:  # rank 0 reads for a decision between its wait's slices
            raise KeyboardInterrupt
        return bool(self.real.check(keys))


def test_a_wait_left_on_ctrl_c_leaves_no_thread_inside_the_store() -> None:
    # A thread still in the store's C++ wait when the interpreter finalizes aborts the
    # process (std::terminate) after its work is done: every way out must end that wait.
    store = _CtrlCStore()
    key = protocol.audit("audit at train.py:9", 0)
    exchange.publish(store, 0, 2, key, {"signature": "s"}, {"label": "x", "mode": "raise"})
    with pytest.raises(KeyboardInterrupt):
        exchange.collect(exchange.Seat(store, 0, 2), {"signature": "s"}, key, 60.0)
    waiters = list(protocol.Waiter.live)
    assert all(w.done.wait(5.0) for w in waiters), "a waiter stayed in the store's wait"
    assert not protocol.Waiter.live
    decision = json.loads(bytes(store.real.get(protocol.ExchangeKeys(key).decision)).decode())
    assert decision["kind"] == "interrupted"


class _CtrlCAtCall:
    """A real in-process store on which Ctrl-C arrives right after the ``at``-th store call
    the main thread makes (its effect done), wherever in the exchange that falls."""

    def __init__(self, at: int) -> None:
        import threading

        import torch.distributed as dist

        self.real = dist.HashStore()  # type: ignore[attr-defined]
        self.at, self.calls, self.main = at, 0, threading.get_ident()

    def __getattr__(self, name: str) -> Any:
        import threading

        method = getattr(self.real, name)
        if threading.get_ident() != self.main:  # the waiter's thread: never interrupted
            return method

        def call(*args: Any) -> Any:
            value = method(*args)
            self.calls += 1
            if self.calls == self.at:
                self.at = -1
                raise KeyboardInterrupt
            return value

        return call


@pytest.mark.parametrize("at", range(1, 10))
def test_ctrl_c_anywhere_in_the_exchange_tells_the_other_rank_at_once(at: int) -> None:
    # CI saw the other rank told nothing when Ctrl-C fell between the arrival and the wait
    import time

    store = _CtrlCAtCall(at)
    key = protocol.audit("audit at train.py:5", 0)
    info = {"label": "audit at train.py:5", "mode": "raise", "raised": None}
    with pytest.raises(KeyboardInterrupt):
        exchange.exchange_on(exchange.Seat(store, 0, 2), {"signature": "s"}, key, 3.0, info)
    start = time.monotonic()
    seat = exchange.Seat(store.real, 1, 2)
    other = exchange.exchange_on(seat, {"signature": "s"}, key, 30.0, info)
    assert (other.kind, other.interrupted) == ("interrupted", [0])
    assert time.monotonic() - start < 2.0  # told, not left to time out
    assert int(store.real.add(protocol.WAITING, 0)) == 0  # nobody counted as still waiting
