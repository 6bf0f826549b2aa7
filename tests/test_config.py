"""Settings layers: defaults, environment, arguments; bad values give one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from rngaudit import config
from rngaudit.errors import ConfigError, RNGAuditWarning


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


BAD_TIMEOUTS = ["soon", "0", "-3", "inf", "-inf", "nan", "1e309", "1e15", "86400.5", "1" * 400]


@pytest.mark.parametrize("value", BAD_TIMEOUTS)
def test_bad_timeout_in_the_environment_warns_once_and_keeps_the_default(value: str) -> None:
    said: list[str] = []
    settings = config.resolve(environ={"RNGAUDIT_TIMEOUT": value}, warn=said.append)
    assert settings.timeout == config.DEFAULT_TIMEOUT
    assert len(said) == 1 and said[0].startswith("RNGAUDIT_TIMEOUT=")
    assert len(said[0]) < 200  # a long value is cut


@pytest.mark.parametrize("value", [*BAD_TIMEOUTS, True, float("inf"), 1e15])
def test_bad_timeout_argument_is_a_config_error(value: object) -> None:
    with pytest.raises(ConfigError, match="timeout=") as caught:
        config.resolve(timeout=value, environ={})  # type: ignore[arg-type]
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize(("value", "seconds"), [("0.5", 0.5), ("86400", 86400.0), (7, 7.0)])
def test_timeouts_up_to_the_maximum(value: object, seconds: float) -> None:
    assert config.parse_timeout(value, "t") == seconds


def test_bad_report_dir_in_the_environment_warns_and_keeps_the_default(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    for value in ("a-file", "loop1/x", "x" * 5000):
        said: list[str] = []
        env = {"RNGAUDIT_REPORT_DIR": str(tmp_path / value)}
        assert config.resolve(environ=env, warn=said.append).report_dir == Path("rngaudit-report")
        assert len(said) == 1 and said[0].startswith("RNGAUDIT_REPORT_DIR="), said
        assert len(said[0]) < 300


def test_bad_report_dir_argument_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ConfigError, match=r"report_dir=.* is not a directory"):
        config.resolve(report_dir=tmp_path / "a-file", environ={})


def test_default_warning_is_an_rngaudit_warning() -> None:
    with pytest.warns(RNGAuditWarning, match="RNGAUDIT_TIMEOUT='soon'"):
        config.resolve(environ={"RNGAUDIT_TIMEOUT": "soon"})


def test_a_huge_mode_value_is_cut_in_the_message() -> None:
    with pytest.raises(ConfigError) as caught:
        config.env_mode("y" * 100_000)
    assert len(str(caught.value)) < 200 and "100000 characters" in str(caught.value)
