"""The recording engine: every draw attributed to its file, line and generator."""

from __future__ import annotations

import inspect
import json
import random
import re
import threading
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from conftest import run_python

import rngaudit
from rngaudit.capture import naming

HERE = __file__


def line_of(marker: str) -> int:
    """The line of this file that carries ``# <marker>``."""
    for number, text in enumerate(Path(HERE).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(marker)


def events_of(a: rngaudit.Audit) -> list[dict[str, Any]]:
    assert a.report is not None
    # plain dicts: the tests index straight into the fields they know are set
    return cast(list[dict[str, Any]], list(a.report.ranks[0]["events"]))


def find(events: list[dict[str, Any]], op: str, line: int) -> dict[str, Any]:
    for e in events:
        cs = e["call_site"] or {}
        if e["op"] == op and cs.get("line") == line and cs.get("file") == HERE:
            return e
    raise AssertionError(f"no {op} at line {line}: {[(e['op'], e['call_site']) for e in events]}")


def test_draws_on_known_lines_have_their_files_lines_and_generators(report_dir: Path) -> None:
    with rngaudit.audit(report_dir=report_dir) as a:
        torch.manual_seed(3)  # seed-torch
        torch.rand(4)  # draw-torch
        g = torch.Generator().manual_seed(5)
        torch.randperm(10, generator=g)  # draw-generator
        random.random()  # draw-random
        random.Random(7).randint(0, 9)  # draw-random-instance
        np.random.rand(2)  # draw-numpy
        np.random.seed(1)  # seed-numpy
        rng = np.random.default_rng(0)  # create-numpy
        rng.random()
    events = events_of(a)
    assert find(events, "torch.manual_seed", line_of("seed-torch"))["generator"] == (
        "torch.default_generator"
    )
    e = find(events, "aten.uniform_", line_of("draw-torch"))
    assert e["generator"] == "torch.default_generator" and e["kind"] == "draw"
    assert find(events, "aten.randperm", line_of("draw-generator"))["generator"].startswith(
        "torch.Generator#1"
    )
    assert find(events, "random.random", line_of("draw-random"))["generator"] == "random (global)"
    assert find(events, "random.randint", line_of("draw-random-instance"))["generator"].startswith(
        "random.Random#"
    )
    assert find(events, "numpy.random.rand", line_of("draw-numpy"))["generator"] == (
        "numpy.random (global)"
    )
    assert find(events, "numpy.random.seed", line_of("seed-numpy"))["kind"] == "seed"
    created = find(events, "numpy.random.default_rng", line_of("create-numpy"))
    assert created["generator"].startswith("numpy.Generator#1 (PCG64)")
    for e in events:
        assert e["fingerprint"] is None or len(e["fingerprint"]) == 8
        assert e["phase"] == "pre-iteration"


def test_library_draws_name_the_library_line_and_the_users_line(report_dir: Path) -> None:
    with rngaudit.audit(report_dir=report_dir) as a:
        layer = torch.nn.Linear(8, 8)  # init-linear
        torch.nn.functional.dropout(torch.ones(8), 0.5)  # dropout
        torch.utils.data.random_split(range(10), [5, 5])  # type: ignore[arg-type]  # random-split
    events = events_of(a)
    init = [e for e in events if e["user_call_site"]["line"] == line_of("init-linear")]
    assert init and all(e["call_site"]["file"].endswith("torch/nn/init.py") for e in init)
    assert {e["op"] for e in init} == {"aten.uniform_"}
    assert init[0]["chain"][-1] == init[0]["user_call_site"]
    drop = [e for e in events if e["user_call_site"]["line"] == line_of("dropout")]
    assert drop and drop[0]["op"] == "aten.bernoulli_"
    split = [e for e in events if e["user_call_site"]["line"] == line_of("random-split")]
    assert split and split[0]["op"] == "aten.randperm"
    assert split[0]["call_site"]["file"].endswith("torch/utils/data/dataset.py")
    del layer


def test_repeated_draws_from_one_site_are_aggregated(report_dir: Path) -> None:
    with rngaudit.audit(report_dir=report_dir) as a:
        for _ in range(500):
            torch.rand(1)  # loop-draw
        model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(200)])
    events = events_of(a)
    assert find(events, "aten.uniform_", line_of("loop-draw"))["count"] == 500
    assert len(events) < 20  # 400 parameter draws collapse onto a few call sites
    del model


def test_sampler_draws_inside_a_stateful_loader_are_attributed(report_dir: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = torch.utils.data.TensorDataset(torch.arange(32))
    loader = StatefulDataLoader(
        data,
        batch_size=4,
        shuffle=False,
        num_workers=1,
        sampler=torch.utils.data.RandomSampler(data),
    )
    with rngaudit.audit(report_dir=report_dir) as a:
        loader.state_dict()  # state-dict
    events = events_of(a)
    sampler = [e for e in events if e["sampler"]]
    assert sampler, events
    assert sampler[0]["sampler"]["chain"].endswith("RandomSampler")
    assert sampler[0]["sampler"]["loader"].startswith("StatefulDataLoader#")
    assert sampler[0]["user_call_site"]["line"] == line_of("state-dict")
    files = [c["file"] for c in sampler[0]["chain"]]
    assert any(f.endswith("torch/utils/data/sampler.py") for f in files)
    assert any("stateful_dataloader" in f for f in files)
    assert all(e["phase"] == "pre-iteration" for e in sampler)
    del loader


def test_draws_from_other_threads_are_recorded_with_their_thread(report_dir: Path) -> None:
    def work() -> None:
        for _ in range(50):
            random.random()  # thread-draw

    with rngaudit.audit(report_dir=report_dir) as a:
        threads = [threading.Thread(target=work, name=f"worker-{i}") for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = [e for e in events_of(a) if e["call_site"]["line"] == line_of("thread-draw")]
    assert {e["thread"] for e in events} == {"worker-0", "worker-1", "worker-2"}
    assert sum(e["count"] for e in events) == 150


def test_stdlib_private_generators_are_not_recorded(report_dir: Path) -> None:
    import tempfile

    with rngaudit.audit(report_dir=report_dir) as a, tempfile.NamedTemporaryFile():
        pass
    assert not [e for e in events_of(a) if e["generator"].startswith("random.Random")]


def test_the_stdlib_caller_check_before_the_walk_says_what_the_walk_says() -> None:
    import sys

    from rngaudit.capture import callsite

    frames: list[Any] = []

    def hook(obj: Any) -> Any:
        frames.append(sys._getframe())
        return obj

    json.loads('{"a": 1}', object_hook=hook)  # called from json's (stdlib) decoder
    frame = frames[0]
    seen = []
    while frame is not None:
        seen.append(callsite.stdlib_caller(frame))
        assert seen[-1] == callsite.walk(frame).stdlib_caller, frame.f_code.co_filename
        frame = frame.f_back
    assert seen[0] is False and seen[1] is True  # this test's line; the decoder's


def test_nested_audits_each_get_their_own_window(report_dir: Path) -> None:
    with rngaudit.audit(report_dir=report_dir) as outer:
        torch.rand(1)  # outer-draw
        with rngaudit.audit(report_dir=report_dir) as inner:
            torch.rand(2)  # inner-draw
    inner_lines = {e["call_site"]["line"] for e in events_of(inner)}
    outer_lines = {e["call_site"]["line"] for e in events_of(outer)}
    assert inner_lines == {line_of("inner-draw")}
    assert {line_of("outer-draw"), line_of("inner-draw")} <= outer_lines


def test_audit_works_as_a_decorator(report_dir: Path) -> None:
    @rngaudit.audit(report_dir=report_dir, mode="report")
    def build() -> torch.Tensor:
        return torch.rand(3)

    assert build().shape == (3,)
    assert build().shape == (3,)  # a decorator opens a fresh window per call
    assert rngaudit.wait_for_reports()
    assert (report_dir / "report.json").exists()


def test_every_audit_writes_its_report(report_dir: Path) -> None:
    import json

    with rngaudit.audit(report_dir=report_dir) as a:
        torch.rand(1)
    assert a.report is not None and a.report.verdict == "ok"
    assert rngaudit.wait_for_reports()  # the files are written after the block, off its exit
    merged = json.loads((report_dir / "report.json").read_text())
    assert merged["schema_version"] == 1 and merged["world_size"] == 1
    assert {"verdict", "findings", "ranks"} <= set(merged)
    assert merged["ranks"][0]["rank"] == 0 and merged["ranks"][0]["events"]
    event = merged["ranks"][0]["events"][0]
    assert {"generator", "op", "call_site"} <= set(event)
    assert set(event["call_site"]) == {"file", "line", "function"}
    assert json.loads((report_dir / "rank-0.json").read_text())["rank"] == 0


def test_bad_arguments_raise_one_clear_error() -> None:
    with pytest.raises(rngaudit.RNGAuditError, match="mode="):
        rngaudit.audit(mode="loud")
    with pytest.raises(rngaudit.RNGAuditError, match="timeout"):
        rngaudit.audit(timeout=-1)


def test_public_api_is_exported() -> None:
    params = inspect.signature(rngaudit.audit).parameters
    assert list(params) == ["mode", "report_dir", "timeout", "strict", "every_epoch", "groups"]
    assert params["every_epoch"].default is False
    assert params["groups"].default is None  # the data-parallel groups, declared (issue 35)
    assert params["mode"].default == "raise"
    assert issubclass(rngaudit.RNGDivergenceError, rngaudit.RNGAuditError)
    assert issubclass(rngaudit.RNGAuditTimeoutError, rngaudit.RNGAuditError)
    assert issubclass(rngaudit.RNGAuditWarning, UserWarning)


def test_loaders_built_in_the_window_are_summarised(report_dir: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    data = torch.utils.data.TensorDataset(torch.arange(32))
    with rngaudit.audit(report_dir=report_dir) as a:
        early = StatefulDataLoader(
            data, batch_size=4, num_workers=1, sampler=torch.utils.data.RandomSampler(data)
        )
        early.state_dict()  # starts the worker and prefetches: the sampler draws now
        lazy = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    assert a.report is not None
    loaders = {entry["loader"]: entry for entry in a.report.ranks[0]["loaders"]}
    # each named by its class, numbered in the order the process first saw one of it
    assert re.fullmatch(r"StatefulDataLoader#\d+", naming.LOADERS.name(early))
    assert re.fullmatch(r"DataLoader#\d+", naming.LOADERS.name(lazy))
    stateful = loaders[naming.LOADERS.name(early)]
    assert stateful["drew_before_iteration"] is True and stateful["num_workers"] == 1
    assert stateful["sampler"] == "BatchSampler > RandomSampler"
    assert stateful["fingerprint"] and stateful["output_digest"]
    plain = loaders[naming.LOADERS.name(lazy)]
    assert plain["drew_before_iteration"] is False
    assert plain["generator"].startswith("torch.default_generator")
    del early, lazy


def test_an_unwritable_report_dir_warns_once_and_keeps_the_report(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with (
        pytest.warns(rngaudit.RNGAuditWarning, match="cannot write the report"),
        rngaudit.audit(report_dir=blocker / "sub") as a,
    ):
        torch.rand(1)
    assert a.report is not None and a.report.ranks[0]["events"]


# Threads: every dispatch-mode push undone on its own thread (issue 11, item 8) --------------


def dispatch_stack() -> int:
    """1 while this thread's seeded torch ops reach rngaudit (its key or its mode), else 0;
    plus any dispatch mode left on the stack."""
    from rngaudit.capture.instrument import torch_ops as instrument_torch

    return int(instrument_torch.intercepting()) or int(torch._C._len_torch_dispatch_stack())


def test_overlapping_audits_on_two_threads_leave_no_mode_on_either(report_dir: Path) -> None:
    a_open, b_open, a_closed = threading.Event(), threading.Event(), threading.Event()
    left: dict[str, int] = {}
    audits: dict[str, rngaudit.Audit] = {}

    def first() -> None:  # opens first, closes first
        with rngaudit.audit(mode="report", report_dir=report_dir) as a:
            audits["a"] = a
            a_open.set()
            assert b_open.wait(60)
            torch.rand(2)
        left["a"] = dispatch_stack()
        a_closed.set()

    def second() -> None:  # opens inside the first, closes last
        assert a_open.wait(60)
        with rngaudit.audit(mode="report", report_dir=report_dir) as b:
            audits["b"] = b
            b_open.set()
            assert a_closed.wait(60)
            torch.rand(3)  # thread-b-draw
        left["b"] = dispatch_stack()

    threads = [threading.Thread(target=f) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert left == {"a": 0, "b": 0}
    assert dispatch_stack() == 0
    # the second thread's torch draws were seen by its own mode
    assert any(
        e["op"] == "aten.uniform_" and e["call_site"]["line"] == line_of("thread-b-draw")
        for e in events_of(audits["b"])
    )


def test_a_window_closed_on_another_thread_pops_the_main_threads_mode(report_dir: Path) -> None:
    audit = rngaudit.audit(mode="report", report_dir=report_dir)
    audit.__enter__()
    assert dispatch_stack() == 1
    closer = threading.Thread(target=audit.__exit__, args=(None, None, None))
    closer.start()
    closer.join(120)
    # the pop was handed to this (main) thread: it runs at its next bytecode boundary
    for _ in range(3):
        pass
    assert dispatch_stack() == 0
    assert audit.report is not None


def test_a_library_private_generator_made_at_import_is_not_recorded(tmp_path: Path) -> None:
    """datasets (imported by accelerate) builds `fingerprint_rng = random.Random()` at import,
    seeded from the OS: noise, never a divergence of the user's run (sympy does the same)."""
    code = (
        "import random, rngaudit\n"
        f"with rngaudit.audit(report_dir={str(tmp_path)!r}, mode='report') as a:\n"
        "    import datasets.fingerprint\n"
        "    mine = random.Random()  # the user's own: recorded\n"
        "print(sorted({e['generator'].split('#')[0] for r in a.report.ranks for e in r['events']}))"
    )
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['random.Random']"
    merged = json.loads((tmp_path / "report.json").read_text())
    sites = {e["call_site"]["file"] for r in merged["ranks"] for e in r["events"]}
    assert sites == {"<string>"}


def test_report_files_are_written_after_the_block_in_order(report_dir: Path) -> None:
    import json

    from rngaudit import report_files

    gate = threading.Event()

    def hold() -> None:
        gate.wait(timeout=30)

    report_files.WRITER.submit(hold)  # hold the writer thread
    try:
        with rngaudit.audit(report_dir=report_dir) as a:
            torch.rand(1)
        assert a.report is not None and a.report.verdict == "ok"  # decided before exit returned
        assert not (report_dir / "report.json").exists()  # not written on the exit path
        assert not rngaudit.wait_for_reports(timeout=0.05)
    finally:
        gate.set()
    assert rngaudit.wait_for_reports()
    assert json.loads((report_dir / "report.json").read_text())["verdict"] == "ok"


def test_background_report_files_are_complete_when_a_process_exits(tmp_path: Path) -> None:
    """Also in a multiprocessing child, which leaves through os._exit after its target."""
    from conftest import run_python

    code = (
        "import multiprocessing as mp, sys, torch, rngaudit\n"
        "def child(d):\n"
        "    with rngaudit.audit(mode='report', report_dir=d):\n"
        "        torch.rand(1)\n"
        "if __name__ == '__main__':\n"
        "    p = mp.get_context('fork').Process(target=child, args=(sys.argv[2],))\n"
        "    p.start(); p.join(60)\n"
        "    child(sys.argv[1])\n"
    )
    script = tmp_path / "exits.py"
    script.write_text(code)
    parent, forked = tmp_path / "parent", tmp_path / "forked"
    proc = run_python([str(script), str(parent), str(forked)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    pids = []
    for directory in (parent, forked):
        assert (directory / "report.json").exists() and (directory / "rank-0.json").exists()
        record = json.loads((directory / "rank-0.json").read_text())["record"]
        assert {e["pid"] for e in record["events"]} == {record["pid"]}  # the recorder's pid
        pids.append(record["pid"])
    assert pids[0] != pids[1]  # the forked child's events carry its own pid, not the parent's
