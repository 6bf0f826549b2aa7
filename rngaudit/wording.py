"""How reports word things: call sites, and lists of ranks."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

_PACKAGE_DIRS = ("site-packages/", "dist-packages/")


def short_path(file: str) -> str:
    """``torch/utils/data/sampler.py`` for installed packages, the base name for user files."""
    posix = file.replace("\\", "/")
    for marker in _PACKAGE_DIRS:
        if marker in posix:
            return posix.rsplit(marker, 1)[1]
    if posix.startswith("<"):  # <string>, <frozen runpy>, <stdin>
        return posix
    return PurePosixPath(posix).name or posix


def format_site(site: Mapping[str, Any] | None, *, function: bool = True) -> str:
    """A call site as ``file:line in function`` with the file shortened; ``""`` for none."""
    if not site:
        return ""
    text = f"{short_path(str(site.get('file', '?')))}:{site.get('line', '?')}"
    if function and site.get("function"):
        text += f" in {site['function']}"
    return text


def format_ranks(ranks: list[int]) -> str:
    """``0-3, 5, 6``: sorted, with runs of three or more consecutive ranks as ranges."""
    parts: list[str] = []
    ordered = sorted(set(ranks))
    start = 0
    for i, rank in enumerate(ordered):
        if i + 1 == len(ordered) or ordered[i + 1] != rank + 1:
            run = ordered[start : i + 1]
            parts += [f"{run[0]}-{rank}"] if len(run) > 2 else [str(r) for r in run]
            start = i + 1
    return ", ".join(parts)


def ranks_phrase(ranks: list[int]) -> str:
    """``rank 3`` for one rank, ``ranks 0-3, 5`` for several."""
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
