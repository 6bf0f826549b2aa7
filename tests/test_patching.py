"""The undo ledger: every wrap, code mark and import hook is undone, checked entry by entry."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import wrapt
from conftest import run_python
from torch.utils.data import DataLoader, RandomSampler

import rngaudit
from rngaudit.capture import patching
from rngaudit.capture.callsite import MARKED_CODES
from rngaudit.capture.patching import ATTR, HOOK, MARKS, MISSING, UNDO, Entry, PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.epochs import order_check
from rngaudit.workers import monitor as workers


def assert_restored(entries: list[Entry]) -> None:
    """Each entry's original is back, by identity (``is``), or gone as the entry says."""
    for entry in entries:
        if entry.kind == ATTR:
            now = vars(entry.owner).get(entry.name, MISSING)
            assert now is entry.original, f"{entry.owner!r}.{entry.name}"
        elif entry.kind == MARKS:
            assert all(code not in MARKED_CODES for code in entry.codes), entry.codes
        elif entry.kind == HOOK:
            assert all(cb is not entry.original for cb in patching.routes(entry.name)), entry.name


def describe(entries: list[Entry]) -> set[str]:
    return {f"{e.kind}:{getattr(e.owner, '__name__', '')}.{e.name}" for e in entries}


def test_a_ledger_undoes_wraps_sets_marks_hooks_and_callbacks_last_first() -> None:
    owner = types.SimpleNamespace(f=lambda: 1)
    original_f = owner.f
    calls: list[str] = []
    code = (lambda: 0).__code__
    ledger = PatchSet()
    ledger.wrap(owner, "f", lambda wrapped, instance, args, kw: 2)
    ledger.set(owner, "g", 3)
    MARKED_CODES[code] = "sampler"
    ledger.mark([code])
    ledger.add_undo(lambda: calls.append("first"))
    ledger.when_imported("rngaudit_test_never_imported", lambda m: calls.append("hook"))
    ledger.add_undo(lambda: calls.append("second"))
    assert owner.f() == 2 and owner.g == 3
    entries = ledger.entries()
    assert [e.kind for e in entries] == [ATTR, ATTR, MARKS, UNDO, HOOK, UNDO]
    ledger.undo()
    ledger.undo()  # safe twice
    assert calls == ["second", "first"]
    assert owner.f is original_f and not hasattr(owner, "g")
    assert_restored(entries)
    assert len(ledger) == 0


def test_a_kept_plan_reuses_its_wrappers_and_wraps_what_replaced_an_original() -> None:
    class Owner:
        @staticmethod
        def f() -> int:
            return 1

    module = types.SimpleNamespace(g=lambda: 10)
    built: list[int] = []

    def build(plan: patching.Plan) -> None:
        built.append(1)
        plan.wrap(Owner, "f", lambda wrapped, instance, args, kw: wrapped() + 1)
        plan.wrap(module, "g", lambda wrapped, instance, args, kw: wrapped() + 1)

    ledger = PatchSet()
    static_f, original_g = vars(Owner)["f"], module.g
    ledger.apply("k", build)
    first = (vars(Owner)["f"], module.g)
    assert Owner.f() == 2 and module.g() == 11
    entries = ledger.entries()
    assert [e.kind for e in entries] == [ATTR, ATTR]
    ledger.undo()
    assert vars(Owner)["f"] is static_f and module.g is original_g
    ledger.apply("k", build)  # the same wrapper objects, swapped in again
    assert (vars(Owner)["f"], module.g) == first and built == [1]
    ledger.undo()
    module.g = lambda: 20  # replaced between windows: the plan wraps the new one
    ledger.apply("k", build)
    assert module.g() == 21 and module.g is not first[1] and Owner.f() == 2
    replaced = ledger.entries()
    ledger.undo()
    assert module.g() == 20
    assert_restored(entries[:1] + replaced)
    ledger.apply("k", build, guard=object())  # for another object: planned again
    assert built == [1, 1]
    ledger.undo()
    assert vars(Owner)["f"] is static_f and module.g() == 20


def test_a_function_replaced_between_windows_is_wrapped_as_it_is_then(
    report_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import random

    with rngaudit.audit(report_dir=report_dir, mode="report"):
        random.random()
    mine = random.Random(5).random
    monkeypatch.setattr(random, "random", mine)
    with rngaudit.audit(report_dir=report_dir, mode="report") as second:
        assert random.random is not mine
        value = random.random()
    assert random.random is mine and value == random.Random(5).random()
    assert second.report is not None
    ops = [e["op"] for r in second.report.ranks for e in r["events"]]
    assert "random.random" in ops


def test_the_import_router_calls_only_ledgers_still_holding_the_hook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"rngaudit_test_routed_{tmp_path.name}"
    (tmp_path / f"{name}.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    gone, kept = PatchSet(), PatchSet()
    seen: list[tuple[str, Any]] = []
    gone.when_imported(name, lambda m: seen.append(("gone", m)))
    kept.when_imported(name, lambda m: seen.append(("kept", m)))
    assert seen == []  # not imported yet
    gone.undo()
    try:
        module = importlib.import_module(name)
        assert seen == [("kept", module)]
        later = PatchSet()
        later.when_imported(name, lambda m: seen.append(("later", m)))  # imported: called now
        assert seen[-1] == ("later", module)
        later.undo()
        kept.undo()
        assert patching.routes(name) == []
    finally:
        sys.modules.pop(name, None)


def test_a_failing_undo_step_does_not_stop_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    owner = types.SimpleNamespace(x=1)
    ledger = PatchSet()
    ledger.set(owner, "x", 2)

    def boom() -> None:
        raise RuntimeError("boom")

    ledger.add_undo(boom)
    ledger.undo()
    assert owner.x == 1
    assert "1 undo step(s) failed" in caplog.text


def test_every_change_of_an_audit_window_is_undone(report_dir: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(8.0))
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        loader: DataLoader[Any] = DataLoader(data, sampler=RandomSampler(data), batch_size=2)
        next(iter(loader))
        np.random.random()
        entries = (
            RECORDER.patches.entries()
            + order_check.GUARD.patches.entries()
            + workers.PATCHES.entries()
        )
    kinds = {e.kind for e in entries}
    assert {ATTR, MARKS, HOOK, UNDO} <= kinds
    described = describe(entries)
    assert "attr:DataLoader.__init__" in described
    assert "attr:_MultiProcessingDataLoaderIter.__init__" in described
    assert "attr:_BaseDataLoaderIter.__next__" in described
    assert any(e.kind == MARKS and RandomSampler.__iter__.__code__ in e.codes for e in entries)
    assert any(e.kind == HOOK and e.name == "numpy.random" for e in entries)
    assert_restored(entries)
    assert not RECORDER.patches.entries() and not workers.PATCHES.entries()
    assert not order_check.GUARD.patches.entries()


SCRIPT = """
import json, sys
import torch
import wrapt
from torch.utils.data import DataLoader, RandomSampler
from rngaudit import startup
from rngaudit.epochs import order_check
from rngaudit.capture import patching
from rngaudit.workers import monitor as workers
from rngaudit.capture.recorder import RECORDER

run = startup.CONTROLLER
import accelerate  # after start-up: its prepare() hooks are wrapped on import
import accelerate.data_loader
from accelerate import Accelerator

def snapshot(entries):
    out = []
    for e in entries:
        if e.kind == patching.ATTR:
            now = vars(e.owner).get(e.name, patching.MISSING)
            out.append(["attr", f"{getattr(e.owner, '__name__', '')}.{e.name}", now is e.original])
        elif e.kind == patching.MARKS:
            from rngaudit.capture.callsite import MARKED_CODES
            out.append(["marks", len(e.codes), all(c not in MARKED_CODES for c in e.codes)])
        elif e.kind == patching.HOOK:
            gone = all(cb is not e.original for cb in patching.routes(e.name))
            out.append(["hook", e.name, gone])
    return out

data = torch.arange(8.0)
loader = DataLoader(data, sampler=RandomSampler(data), batch_size=2)
window = run.patches.entries() + RECORDER.patches.entries()
before = snapshot(window)
next(iter(loader))  # alone, the first iteration closes the window
after_window = snapshot(window)
lasting = run.monitor_hooks.entries() + workers.PATCHES.entries()
run.become_worker()
print(json.dumps({"before": before, "after": after_window, "lasting": snapshot(lasting),
                  "left": len(run.patches) + len(RECORDER.patches) + len(workers.PATCHES)}))
"""


def test_every_change_of_the_whole_run_audit_is_undone(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {"RNGAUDIT": "report", "RNGAUDIT_REPORT_DIR": str(tmp_path / "r")}
    proc = run_python([str(script)], env=env)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    before = {(kind, name) for kind, name, _ in result["before"]}
    assert ("attr", "Accelerator.prepare") in before
    assert ("attr", "accelerate.data_loader.prepare_data_loader") in before
    assert ("attr", "DataLoader.__iter__") in before
    assert ("attr", "DataLoader.__init__") in before
    assert ("hook", "accelerate.accelerator") in before
    assert any(kind == "marks" for kind, _ in before)
    assert not any(ok for kind, _, ok in result["before"] if kind == "attr")  # wrapped then
    assert all(ok for _, _, ok in result["after"]), result["after"]
    assert any(kind == "attr" for kind, _, _ in result["lasting"])
    assert all(ok for _, _, ok in result["lasting"]), result["lasting"]
    assert result["left"] == 0


def test_a_window_must_be_closed_innermost_first() -> None:
    outer = RECORDER.begin(7)
    try:
        inner = RECORDER.begin()
        assert inner.index == 7 and RECORDER.depth == 2
        with pytest.raises(rngaudit.RNGAuditError, match="out of order"):
            RECORDER.end(outer)
        assert RECORDER.depth == 2  # the refused end changed nothing
        RECORDER.end(inner)
        with pytest.raises(rngaudit.RNGAuditError, match="out of order"):
            RECORDER.end(inner)  # closed already
    finally:
        RECORDER.end(outer)
    assert RECORDER.depth == 0 and len(RECORDER.patches) == 0


def test_a_window_opened_on_another_thread_is_not_closed_from_here() -> None:
    import threading

    opened: list[Any] = []
    ready = threading.Event()
    closed = threading.Event()

    def other() -> None:
        opened.append(RECORDER.begin(0))
        ready.set()
        closed.wait(60)
        RECORDER.end(opened[0])

    outer = RECORDER.begin(0)
    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert ready.wait(60)
        inner = RECORDER.begin(0)  # this thread's innermost is not the other thread's window
        RECORDER.end(inner)
    finally:
        closed.set()
        thread.join(60)
        RECORDER.end(outer)
    assert RECORDER.depth == 0


def test_the_whole_run_window_may_end_before_a_window_opened_inside_it() -> None:
    run = RECORDER.begin(3, overlapping=True)
    inner = RECORDER.begin(4)  # a framework callback's audit
    RECORDER.end(run)
    assert RECORDER.depth == 1 and intercepting_python()
    RECORDER.end(inner)
    assert RECORDER.depth == 0 and len(RECORDER.patches) == 0 and not intercepting_python()


def intercepting_python() -> bool:
    import random

    return isinstance(random.random, wrapt.FunctionWrapper)


def test_replaced_asks_whether_this_ledger_wrapped_an_attribute() -> None:
    class Owner:
        def method(self) -> int:
            return 1

    patches, other = PatchSet(), PatchSet()
    other.wrap(Owner, "method", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    assert not patches.replaced(Owner, "method") and other.replaced(Owner, "method")
    patches.wrap(Owner, "method", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    assert patches.replaced(Owner, "method") and patches.replaced(Owner)
    assert not patches.replaced(Owner, "other")
    patches.undo()
    other.undo()
    assert not patches.replaced(Owner) and Owner().method() == 1


def test_the_order_check_installs_over_another_librarys_wrapt_wrapper() -> None:
    import torch.utils.data.dataloader as dl

    cls = dl._BaseDataLoaderIter
    original = cls.__dict__["__next__"]
    foreign = wrapt.FunctionWrapper(original, lambda w, i, a, k: w(*a, **k))
    cls.__next__ = foreign  # type: ignore[method-assign]
    guard = order_check.EpochGuard()
    try:
        guard.install()
        ours = cls.__dict__["__next__"]
        assert ours is not foreign and ours.__wrapped__ is foreign  # wrapped, not skipped
        guard._on_import(dl)  # a second import hook call wraps nothing twice
        assert cls.__dict__["__next__"] is ours
        guard.uninstall()
        assert cls.__dict__["__next__"] is foreign
    finally:
        guard.uninstall()
        cls.__next__ = original  # type: ignore[method-assign]
