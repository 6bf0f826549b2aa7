"""Call sites: which library line drew, and which user line led there."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import PurePosixPath
from types import CodeType, FrameType
from typing import Any, NamedTuple

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

# Library frames that only route a call (dispatch plumbing): never a call site.
_PLUMBING = (
    os.sep + os.path.join("torch", "utils", "_python_dispatch.py"),
    os.sep + os.path.join("torch", "_ops.py"),
    os.sep + os.path.join("torch", "overrides.py"),
    os.sep + os.path.join("torch", "_dynamo") + os.sep,
    os.sep + os.path.join("torch", "utils", "_contextlib.py"),
    os.sep + os.path.join("torch", "random.py"),
    os.sep + os.path.join("torch", "cuda", "random.py"),
    os.sep + "wrapt" + os.sep,
)

RNGAUDIT, STDLIB, PLUMBING, LIBRARY, USER = range(5)


def _stdlib_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


def _library_dirs() -> tuple[str, ...]:
    dirs = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    dirs.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(os.path.abspath(d) + os.sep for d in dirs)


_STDLIB_DIRS = _stdlib_dirs()
_LIBRARY_DIRS = _library_dirs()
_classes: dict[str, int] = {}


def classify(filename: str) -> int:
    """Which kind of code a file holds: rngaudit, stdlib, plumbing, library or user."""
    kind = _classes.get(filename)
    if kind is None:
        path = os.path.abspath(filename)
        if path.startswith(_PKG_DIR):
            kind = RNGAUDIT
        elif any(p in path for p in _PLUMBING):
            kind = PLUMBING
        elif path.startswith(_LIBRARY_DIRS):
            kind = LIBRARY
        elif path.startswith(_STDLIB_DIRS) or filename.startswith("<frozen"):
            kind = STDLIB
        else:
            kind = USER
        _classes[filename] = kind
    return kind


class CallSite(NamedTuple):
    """A source line: file, line number and function (a tuple: cheap to hash as a key)."""

    file: str
    line: int
    function: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}

    def short(self) -> str:
        return format_site(self.to_dict())


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


def format_site(site: dict[str, Any] | None, *, function: bool = True) -> str:
    """A call site as ``file:line in function`` with the file shortened; ``""`` for none."""
    if not site:
        return ""
    text = f"{short_path(str(site.get('file', '?')))}:{site.get('line', '?')}"
    if function and site.get("function"):
        text += f" in {site['function']}"
    return text


class Stack(NamedTuple):
    """What a stack walk found above a draw (a tuple: built in C on the hot path)."""

    call_site: CallSite | None
    chain: tuple[CallSite, ...]
    user_site: CallSite | None
    marked: tuple[tuple[str, Any], ...]  # (role, frame `self`) for marked code objects
    stdlib_caller: bool  # the first frame outside rngaudit is stdlib (not `random`)


_new = tuple.__new__  # CallSite/Stack without the Python-level namedtuple __new__ (0.3 µs)
_NO_MARKS: tuple[tuple[str, Any], ...] = ()


# Code objects whose frames carry meaning (sampler __iter__, loader state_dict, ...):
# code -> role. Filled by the instrumentation when it installs.
MARKED_CODES: dict[CodeType, str] = {}

_RANDOM_PY = os.path.join("", "random.py")


def walk(frame: FrameType | None, max_depth: int = 80) -> Stack:
    """Walk from ``frame`` outwards to the first user frame (the recorder's hot path)."""
    call_site: CallSite | None = None
    chain: list[CallSite] = []
    marked: list[tuple[str, Any]] | None = None
    stdlib_caller = False
    first_outside = True
    depth = 0
    marks = MARKED_CODES
    classes = _classes
    while frame is not None and depth < max_depth:
        depth += 1
        code = frame.f_code
        role = marks.get(code) if marks else None
        if role is not None:
            if marked is None:
                marked = []
            marked.append((role, frame.f_locals.get("self")))
        filename = code.co_filename
        kind = classes.get(filename)
        if kind is None:
            kind = classify(filename)
        if kind == RNGAUDIT:
            frame = frame.f_back
            continue
        if first_outside:
            first_outside = False
            if kind == STDLIB and not filename.endswith(_RANDOM_PY):
                stdlib_caller = True
        if kind >= LIBRARY:  # LIBRARY or USER
            site: CallSite = _new(CallSite, (filename, frame.f_lineno, code.co_name))
            if call_site is None:
                call_site = site
            chain.append(site)
            if kind == USER:
                if role is not None:  # a user's sampler: find the loader frames above it
                    assert marked is not None
                    marked.extend(_marks_above(frame.f_back, max_depth - depth))
                return _new(
                    Stack,
                    (call_site, tuple(chain), site, tuple(marked) if marked else _NO_MARKS,
                     stdlib_caller),
                )  # fmt: skip
        frame = frame.f_back
    return _new(
        Stack,
        (call_site, tuple(chain), None, tuple(marked) if marked else _NO_MARKS, stdlib_caller),
    )


def _marks_above(frame: FrameType | None, budget: int) -> list[tuple[str, Any]]:
    """Marked frames further out (only their marks: the call site is already known)."""
    out: list[tuple[str, Any]] = []
    while frame is not None and budget > 0:
        budget -= 1
        role = MARKED_CODES.get(frame.f_code)
        if role is not None:
            out.append((role, frame.f_locals.get("self")))
        frame = frame.f_back
    return out


def here(skip: int = 1) -> Stack:
    """Walk the caller's stack (``skip`` frames above this one)."""
    return walk(sys._getframe(skip + 1))
