"""Settings, read in one place in layers: defaults, environment, then arguments."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from rngaudit import launcher
from rngaudit.errors import ConfigError, RNGAuditWarning

# Every environment variable of rngaudit's own (what the launcher sets: rngaudit.launcher).
ENV_MODE = "RNGAUDIT"  # 1|raise|warn|report switch the whole run on; unset or 0: off
ENV_REPORT_DIR = "RNGAUDIT_REPORT_DIR"  # where reports go (default ./rngaudit-report)
ENV_TIMEOUT = "RNGAUDIT_TIMEOUT"  # seconds a rank waits for the others (default 120)
ENV_EPOCHS = "RNGAUDIT_EPOCHS"  # all (default): order check at every epoch; first; 0: off
ENV_SAMPLE_KEY = "RNGAUDIT_SAMPLE_KEY"  # a batch field: iterable-style loaders holding it keyed
ENV_GROUPS = "RNGAUDIT_DP_GROUPS"  # "0,2;1,3": the data-parallel groups, as DDP would be given

MODES = ("raise", "warn", "report")
DEFAULT_REPORT_DIR = "rngaudit-report"
DEFAULT_TIMEOUT = 120.0
MAX_TIMEOUT = 86400.0  # one day; more is a typo (and 1e15 overflows the store's deadline)
SHOWN_CHARS = 60  # a value quoted in a message is cut to this many characters


@dataclass(frozen=True)
class Settings:
    mode: str
    report_dir: Path
    timeout: float
    strict: bool
    sample_key: str | None = None  # RNGAUDIT_SAMPLE_KEY: the field keying iterable streams


def shown(value: object) -> str:
    """``repr(value)``, cut to :data:`SHOWN_CHARS` characters for a one-line message."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    size = len(value) if isinstance(value, str) else len(text)
    return f"{text[:SHOWN_CHARS]}... ({size} characters)"


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
        f"{ENV_MODE}={shown(value)} is not one of 1, raise, warn, report (or 0 to switch off)"
    )


def parse_timeout(value: object, source: str) -> float:
    """Seconds to wait: a finite number above 0 and at most :data:`MAX_TIMEOUT`."""
    if isinstance(value, bool):
        raise ConfigError(f"{source}={shown(value)} is not a number of seconds")
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{source}={shown(value)} is not a number of seconds") from None
    if not 0 < seconds <= MAX_TIMEOUT:  # also nan and inf
        raise ConfigError(
            f"{source}={shown(value)} must be a number of seconds above 0 and at most "
            f"{MAX_TIMEOUT:g}"
        )
    return seconds


def parse_report_dir(value: str | os.PathLike[str], source: str) -> Path:
    """A report directory: a path that resolves and is not an existing non-directory."""
    path = Path(value)
    try:
        resolved = path.resolve()
        if resolved.exists() and not resolved.is_dir():
            raise ConfigError(f"{source}={shown(str(value))} is not a directory")
    except (OSError, RuntimeError, ValueError) as exc:  # symlink loop, name too long
        reason = " ".join(str(exc).split())[:SHOWN_CHARS]
        raise ConfigError(f"{source}={shown(str(value))} is not a usable path ({reason})") from None
    return path


def warn_setting(message: str) -> None:
    """How an unusable environment value is reported by default: one RNGAuditWarning."""
    warnings.warn(f"rngaudit: {message}", RNGAuditWarning, stacklevel=2)


def resolve(
    mode: str | None = None,
    report_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    strict: bool = False,
    environ: Mapping[str, str] | None = None,
    warn: Callable[[str], None] = warn_setting,
) -> Settings:
    """Layer 1 defaults, layer 2 environment, layer 3 arguments.

    An unusable environment value is passed to ``warn`` and its default kept (an environment
    problem never stops the program); an unusable argument raises :class:`ConfigError`.
    """
    env = os.environ if environ is None else environ
    # 1. defaults
    chosen_mode = "raise"
    chosen_dir = Path(DEFAULT_REPORT_DIR)
    chosen_timeout = DEFAULT_TIMEOUT
    # 2. environment
    try:
        if env.get(ENV_REPORT_DIR):
            chosen_dir = parse_report_dir(env[ENV_REPORT_DIR], ENV_REPORT_DIR)
    except ConfigError as exc:
        warn(f"{exc}; using {DEFAULT_REPORT_DIR}")
    try:
        if env.get(ENV_TIMEOUT):
            chosen_timeout = parse_timeout(env[ENV_TIMEOUT], ENV_TIMEOUT)
    except ConfigError as exc:
        warn(f"{exc}; using {DEFAULT_TIMEOUT:g}")
    # 3. arguments
    if mode is not None:
        if mode not in MODES:
            raise ConfigError(f"mode={shown(mode)} is not one of {', '.join(MODES)}")
        chosen_mode = mode
    if report_dir is not None:
        chosen_dir = parse_report_dir(report_dir, "report_dir")
    if timeout is not None:
        chosen_timeout = parse_timeout(timeout, "timeout")
    sample_key = env.get(ENV_SAMPLE_KEY, "").strip() or None
    return Settings(
        chosen_mode, attempt_dir(chosen_dir, env), chosen_timeout, bool(strict), sample_key
    )


def attempt_dir(report_dir: Path, environ: Mapping[str, str] | None = None) -> Path:
    """Where a restart attempt writes: the first in ``report_dir``, attempt N in
    ``report_dir/attempt-N``, so no attempt moves or overwrites another's files."""
    attempt = launcher.restart_attempt(environ)
    return report_dir / f"attempt-{attempt}" if attempt > 0 else report_dir


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
    raise ConfigError(f"{ENV_EPOCHS}={shown(value)} is not one of all, first, off")
