"""The audit() context manager and decorator: what it accepts and refuses."""

from __future__ import annotations

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
    assert (report_dir / "report.json").is_file()


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
