"""The environment a rank ran in: package versions and seeds, for comparing two runs."""

from __future__ import annotations

import functools
import os
import platform
import sys

from rngaudit.capture.recorder import RECORDER
from rngaudit.schema import EnvironmentDict

# Distributions whose version changes what a program draws (a release that draws once more).
PACKAGES = ("torch", "numpy", "accelerate", "torchdata")
# Environment variables that change randomness when set.
VARIABLES = ("PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG")


def describe() -> EnvironmentDict:
    """This process's ``environment`` block of the rank record (small: a few short strings).

    Reads versions and seeds; never imports torch, numpy or accelerate, never draws.
    """
    return {
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "seeds": RECORDER.initial_seeds(),
        "variables": {name: os.environ[name] for name in VARIABLES if name in os.environ},
    }


def _version(name: str) -> str | None:
    module = sys.modules.get(name)
    version = getattr(module, "__version__", None)
    return str(version) if version is not None else _installed(name)


@functools.cache
def _installed(name: str) -> str | None:
    import importlib.metadata  # only when a package was not imported: costs a directory scan

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
