"""Unit tests for rngaudit.whole_run in one process (no process group): the window from arming
to the first iteration, its checkpoints, what ends it, and what a process that is no rank leaves."""

from __future__ import annotations

import gc
import json
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import accelerate.data_loader as acc_data
import pytest
import torch
import torch.utils.data as D
import wrapt
from torch.utils.data._utils import worker as torch_worker
from torchdata.stateful_dataloader import StatefulDataLoader

import rngaudit
from rngaudit import whole_run
from rngaudit.capture.recorder import RECORDER
from rngaudit.config import ENV_EPOCHS, Settings
from rngaudit.epochs.order_check import GUARD
from rngaudit.whole_run import WholeRun

HERE = Path(__file__).name
ITEMS = 8


def _line(marker: str) -> int:
    for number, text in enumerate(Path(__file__).read_text().splitlines(), start=1):
        if text.rstrip().endswith(f"# {marker}"):
            return number
    raise AssertionError(marker)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WholeRun]:
    """A whole-run controller over ``tmp_path / "report"`` (armed by the test); afterwards
    every wrapper it installed is gone and no window is open."""
    for name in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", ENV_EPOCHS):
        monkeypatch.delenv(name, raising=False)
    originals = (D.DataLoader.__dict__["__iter__"], StatefulDataLoader.__dict__["__iter__"])
    settings = Settings(mode="report", report_dir=tmp_path / "report", timeout=5.0, strict=False)
    controller = WholeRun(settings)
    yield controller
    if controller.window_open:
        controller.window_open = False
        controller._detach()
    for ledger in (controller.monitor_hooks, controller.fork_hooks, controller.resume_hooks):
        ledger.undo()
    if controller.monitor is not None:
        controller.monitor.uninstall()
    with GUARD._lock:
        GUARD.everything = None
        GUARD._maybe_uninstall()
    rngaudit.wait_for_reports()
    assert RECORDER.depth == 0
    assert not GUARD.installed
    assert (D.DataLoader.__dict__["__iter__"], StatefulDataLoader.__dict__["__iter__"]) == (
        originals
    )


def _report(controller: WholeRun) -> dict[str, Any]:
    rngaudit.wait_for_reports()
    data: dict[str, Any] = json.loads((controller.settings.report_dir / "report.json").read_text())
    return data


def test_the_window_records_from_arming_to_the_first_iteration(run: WholeRun) -> None:
    run.arm()
    assert run.window_open and RECORDER.depth == 1
    assert isinstance(D.DataLoader.__dict__["__iter__"], wrapt.FunctionWrapper)
    torch.rand(2)  # before-iteration
    loader = D.DataLoader(D.TensorDataset(torch.arange(ITEMS)), batch_size=2, shuffle=True)
    batches = [b[0].tolist() for b in loader]  # the first iteration: the window closes here
    torch.rand(2)  # after-iteration
    assert sorted(i for batch in batches for i in batch) == list(range(ITEMS))
    assert not run.window_open and run.is_rank and RECORDER.depth == 0
    assert run.patches.entries() == []  # the prepare/iteration wrappers are gone
    report = _report(run)
    assert [a["label"] for a in report["audits"]] == ["first DataLoader iteration"]
    events = report["ranks"][0]["events"]
    lines = {e["call_site"]["line"] for e in events if e["call_site"]["file"].endswith(HERE)}
    assert _line("before-iteration") in lines  # recorded
    assert _line("after-iteration") not in lines  # the window was closed
    assert [entry["loader"] for entry in report["ranks"][0]["loaders"]] != []
    # the resume wrap and the order check outlive the window
    assert run.resume_hooks.entries() and GUARD.installed and GUARD.everything is not None


def test_prepare_concludes_a_segment_named_by_its_caller(run: WholeRun) -> None:
    run.arm()
    loader = D.DataLoader(D.TensorDataset(torch.arange(ITEMS)), batch_size=2)
    torch.rand(1)
    prepare = acc_data.prepare_data_loader  # the module attribute: wrapped
    prepared = prepare(loader, num_processes=1, process_index=0)  # prepare-line
    assert run.window_open and run.is_rank  # the window goes on: the next segment
    assert run.index == 1
    expected = f"prepare_data_loader() at {HERE}:{_line('prepare-line')} in "
    audits = _report(run)["audits"]
    assert [a["label"][: len(expected)] for a in audits] == [expected]
    list(prepared)
    assert [a["label"] for a in _report(run)["audits"]][1] == "first DataLoader iteration"


def test_in_a_run_of_several_ranks_only_the_training_loader_ends_the_window(
    run: WholeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = D.TensorDataset(torch.arange(ITEMS))
    plain = D.DataLoader(ds, batch_size=2)
    assert run._ends_window(plain)  # alone: any loader
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert not run._ends_window(plain)  # not sharded: evaluation, a sanity check
    shuffled = D.DataLoader(ds, sampler=D.DistributedSampler(ds, num_replicas=2, rank=0))
    assert run._ends_window(shuffled)
    in_order = D.DataLoader(
        ds, sampler=D.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
    )
    assert not run._ends_window(in_order)  # a sequential loader: its second epoch
    assert run._ends_window(in_order)
    split = D.Subset(ds, torch.randperm(ITEMS)[::2].tolist())
    assert run._ends_window(D.DataLoader(split, batch_size=2, shuffle=True))  # a split of its own
    assert not run._ends_window(D.DataLoader(split, batch_size=2))


def test_a_sequential_loader_built_where_a_dropped_one_was_is_in_its_first_epoch(
    run: WholeRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """accelerate's own test_distributed_data_loop builds loader after loader: one built at a
    dropped loader's address is in its first epoch, not its second (a memory of ids ended the
    window on the rank where the address was reused alone: audit-mismatch, intermittent in
    make test)."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = D.TensorDataset(torch.arange(ITEMS))
    for _ in range(20):
        sampler: D.DistributedSampler[Any] = D.DistributedSampler(
            ds, num_replicas=2, rank=0, shuffle=False
        )
        loader = D.DataLoader(ds, sampler=sampler)
        assert not run._ends_window(loader)
        del loader, sampler
        gc.collect()

    class Unhashable(D.DataLoader[Any]):
        def __hash__(self) -> int:
            raise RuntimeError("a user's own __hash__")

    sampler = D.DistributedSampler(ds, num_replicas=2, rank=0, shuffle=False)
    odd = Unhashable(ds, sampler=sampler)
    assert not run._ends_window(odd) and not run._ends_window(odd)  # unknown, never a raise


def test_a_checkpoint_before_the_announced_group_is_said_at_exit(
    run: WholeRun, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """WORLD_SIZE says 2 but no process group ever comes: the audit waits, and exit says so."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    run.arm()
    loader = D.DataLoader(D.TensorDataset(torch.arange(ITEMS)), batch_size=2)
    acc_data.prepare_data_loader(loader, num_processes=1, process_index=0)
    assert not (run.settings.report_dir / "report.json").exists()  # not compared yet
    run.at_exit()
    err = capsys.readouterr().err
    assert "audit(s) (prepare_data_loader() at" in err and "WORLD_SIZE=2" in err
    assert "never created: not compared" in err


def test_a_process_that_is_no_rank_leaves_nothing(run: WholeRun) -> None:
    run.arm()
    torch.rand(1)
    run.at_exit()  # no group, no prepare, no iteration: a launcher, a helper
    assert not run.window_open and RECORDER.depth == 0
    assert not run.settings.report_dir.exists()


def test_a_dataloader_worker_detaches_for_good(run: WholeRun) -> None:
    run.arm()
    run.become_worker()
    assert run.worker and not run.window_open and RECORDER.depth == 0
    assert run.patches.entries() == [] and run.resume_hooks.entries() == []
    torch.rand(1)
    list(D.DataLoader(D.TensorDataset(torch.arange(ITEMS)), batch_size=4))
    run.at_exit()
    assert not run.settings.report_dir.exists()


def test_a_restore_is_named_for_later_findings(run: WholeRun) -> None:
    run.arm()
    loader = StatefulDataLoader(D.TensorDataset(torch.arange(ITEMS)), batch_size=2)
    state = loader.state_dict()
    for _ in range(2):  # the same place again: one entry
        loader.load_state_dict(state)  # restore-line
    assert run.session.resumes == [
        f"StatefulDataLoader.load_state_dict() at {HERE}:{_line('restore-line')} in "
        "test_a_restore_is_named_for_later_findings"
    ]


def test_a_bad_epochs_setting_checks_every_epoch_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ENV_EPOCHS, "sometimes")
    settings = Settings(mode="warn", report_dir=tmp_path, timeout=1.0, strict=False)
    assert WholeRun(settings).epochs == "all"
    assert f"{ENV_EPOCHS}='sometimes' is not one of all, first, off" in capsys.readouterr().err
    monkeypatch.setenv(ENV_EPOCHS, "first")
    assert WholeRun(settings).epochs == "first"


def _helper() -> None:
    pass


def test_a_forked_child_running_a_loader_worker_loop_stays_passive() -> None:
    ctx = multiprocessing.get_context("fork")
    worker = ctx.Process(target=torch_worker._worker_loop)
    assert whole_run._runs_loader_worker(worker)

    def wrapped() -> None:
        pass

    wrapped.__wrapped__ = torch_worker._worker_loop  # type: ignore[attr-defined]
    assert whole_run._runs_loader_worker(ctx.Process(target=wrapped))  # start-up's wrap
    assert not whole_run._runs_loader_worker(ctx.Process(target=_helper))
    assert not whole_run._runs_loader_worker(object())


def test_a_failure_to_conclude_is_named_in_one_line() -> None:
    """What rngaudit prints when it could not conclude at exit: the failure's type, the package
    it was raised in, its first sentence; never a torch dispatcher dump."""
    try:
        torch.ops.aten.detach.default("not a tensor")
    except Exception as exc:
        line = whole_run.cause(exc)
    assert "\n" not in line and len(line) < 250, line
    assert line.startswith(("RuntimeError", "TypeError")) and " in torch" in line, line
    assert whole_run.cause(ValueError("")) == "ValueError"
    assert whole_run.cause(OSError("disk full. Then more")) == "OSError (disk full)"


def test_a_failure_whose_text_fails_is_named_by_its_type() -> None:
    class Hostile(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert whole_run.cause(Hostile()) == "Hostile"
