"""The framework callbacks take audit()'s window keywords, checked when the callback is built."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from rngaudit.errors import ConfigError
from rngaudit.with_block import Audit, WindowOptions


def test_the_window_options_are_audits_keywords_but_every_epoch() -> None:
    keywords = set(inspect.signature(Audit.__init__).parameters) - {"self"}
    # groups: the process's data-parallel layout, declared once (RNGAUDIT_DP_GROUPS under a
    # framework), not a window's option
    assert WindowOptions.__optional_keys__ == keywords - {"every_epoch", "groups"}


@pytest.mark.parametrize("framework", ["lightning", "hf_trainer"])
def test_a_callback_takes_the_window_options_and_refuses_others(framework: str) -> None:
    cls: Any = pytest.importorskip(f"rngaudit.integrations.{framework}").RNGAuditCallback
    built = cls(mode="warn", timeout=5.0, strict=True)
    assert built.report is None  # nothing audited before the framework's hooks run
    with pytest.raises(ConfigError, match="mode='bogus'"):
        cls(mode="bogus")
    with pytest.raises(TypeError, match="every_epoch"):
        cls(every_epoch=True)
    with pytest.raises(TypeError):
        cls("warn")
