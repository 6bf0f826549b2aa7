"""Settings, read in one place in layers: defaults, environment, then arguments."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rngaudit.errors import ConfigError

# Every environment variable rngaudit reads.
ENV_MODE = "RNGAUDIT"  # 1|raise|warn|report switch the whole run on; unset or 0: off
ENV_REPORT_DIR = "RNGAUDIT_REPORT_DIR"  # where reports go (default ./rngaudit-report)
ENV_TIMEOUT = "RNGAUDIT_TIMEOUT"  # seconds a rank waits for the others (default 120)
ENV_EPOCHS = "RNGAUDIT_EPOCHS"  # all (default): order check at every epoch; first; 0: off

MODES = ("raise", "warn", "report")
DEFAULT_REPORT_DIR = "rngaudit-report"
DEFAULT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Settings:
    mode: str
    report_dir: Path
    timeout: float
    strict: bool


def env_mode(value: str | None) -> str | None:
    """The mode ``RNGAUDIT`` asks for: None when off; ConfigError when unknown."""
    if value is None:
        return None
    value = value.strip().lower()
    if value in ("", "0"):
        return None
    if value == "1":
        return "raise"
    if value in MODES:
        return value
    raise ConfigError(
        f"{ENV_MODE}={value!r} is not one of 1, raise, warn, report (or 0 to switch off)"
    )


def _timeout(value: object, source: str) -> float:
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{source}={value!r} is not a number of seconds") from None
    if not seconds > 0:
        raise ConfigError(f"{source}={value!r} must be a positive number of seconds")
    return seconds


def resolve(
    mode: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    strict: bool = False,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Layer 1 defaults, layer 2 environment, layer 3 arguments."""
    env = os.environ if environ is None else environ
    # 1. defaults
    chosen_mode = "raise"
    chosen_dir: str | os.PathLike[str] = DEFAULT_REPORT_DIR
    chosen_timeout = DEFAULT_TIMEOUT
    # 2. environment
    if env.get(ENV_REPORT_DIR):
        chosen_dir = env[ENV_REPORT_DIR]
    if env.get(ENV_TIMEOUT):
        chosen_timeout = _timeout(env[ENV_TIMEOUT], ENV_TIMEOUT)
    # 3. arguments
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"mode={mode!r} is not one of {', '.join(MODES)}")
        chosen_mode = mode
    if report_dir is not None:
        chosen_dir = report_dir
    if timeout is not None:
        chosen_timeout = _timeout(timeout, "timeout")
    return Settings(chosen_mode, Path(chosen_dir), chosen_timeout, bool(strict))


def env_epochs(environ: Mapping[str, str] | None = None) -> str:
    """Which epochs ``RNGAUDIT`` checks the sharded order at: ``all``, ``first`` or ``off``."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_EPOCHS, "").strip().lower()
    if value in ("", "1", "all"):
        return "all"
    if value in ("0", "off", "none"):
        return "off"
    if value == "first":
        return "first"
    raise ConfigError(f"{ENV_EPOCHS}={value[:40]!r} is not one of all, first, off")
