"""Settings layers: defaults, environment, arguments; bad values give one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from rngaudit import config
from rngaudit.errors import ConfigError


def test_defaults() -> None:
    s = config.resolve(environ={})
    assert s == config.Settings("raise", Path("rngaudit-report"), 120.0, False)


def test_environment_then_arguments() -> None:
    env = {"RNGAUDIT_REPORT_DIR": "/tmp/x", "RNGAUDIT_TIMEOUT": "5"}
    assert config.resolve(environ=env).report_dir == Path("/tmp/x")
    assert config.resolve(environ=env).timeout == 5.0
    s = config.resolve(mode="warn", report_dir="/y", timeout=2, environ=env)
    assert (s.mode, s.report_dir, s.timeout) == ("warn", Path("/y"), 2.0)


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, None),
        ("", None),
        ("0", None),
        ("1", "raise"),
        ("raise", "raise"),
        ("warn", "warn"),
        ("REPORT", "report"),
    ],
)
def test_env_mode_values(value: str | None, mode: str | None) -> None:
    assert config.env_mode(value) == mode


@pytest.mark.parametrize("value", ["yes", "2", "rase"])
def test_unknown_env_mode_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="RNGAUDIT="):
        config.env_mode(value)


@pytest.mark.parametrize("value", ["soon", "0", "-3"])
def test_bad_timeout(value: str) -> None:
    with pytest.raises(ConfigError, match="RNGAUDIT_TIMEOUT"):
        config.resolve(environ={"RNGAUDIT_TIMEOUT": value})
