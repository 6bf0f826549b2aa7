"""The audit() context manager and decorator: what it accepts and refuses."""

from __future__ import annotations

import inspect
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import torch

import rngaudit


def test_decorating_a_plain_function_audits_each_call(report_dir: Path) -> None:
    @rngaudit.audit(report_dir=report_dir)
    def draw() -> float:
        return float(torch.rand(1))

    draw()
    draw()
    assert rngaudit.wait_for_reports()  # report files are written after each call returns
    report = json.loads((report_dir / "report.json").read_text())
    assert [(a["index"], a["verdict"]) for a in report["audits"]] == [(0, "ok"), (1, "ok")]
    line = inspect.getsourcelines(draw)[1] + 2  # the line of torch.rand(1) (unwrapped)
    drawn = [
        (e["audit"], e["op"], e["count"], e["call_site"]["line"])
        for e in report["ranks"][0]["events"]
        if e["kind"] == "draw"
    ]
    assert drawn == [(0, "aten.uniform_", 1, line), (1, "aten.uniform_", 1, line)]


def test_decorating_a_generator_function_is_refused() -> None:
    with pytest.raises(TypeError, match=r"generator function .*gen.*its body runs later"):

        @rngaudit.audit()
        def gen() -> Iterator[int]:
            yield 1


def test_decorating_an_async_def_is_refused() -> None:
    with pytest.raises(TypeError, match=r"coroutine function \(async def\) .*coro"):

        @rngaudit.audit()
        async def coro() -> None:
            return None


def test_decorating_an_async_generator_is_refused() -> None:
    with pytest.raises(TypeError, match=r"async generator function .*agen"):

        @rngaudit.audit()
        async def agen() -> AsyncIterator[int]:
            yield 1
