"""Call sites: which library line drew, and which user line led there."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType, FrameType
from typing import Any, NamedTuple

from rngaudit import schema
from rngaudit.wording import format_site

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # rngaudit/

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
FILE_KINDS = _classes  # file name -> its kind, for files classified so far (read-only)


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

    def to_dict(self) -> schema.CallSiteDict:
        return {"file": self.file, "line": self.line, "function": self.function}

    def short(self) -> str:
        return format_site(self.to_dict())


class Stack(NamedTuple):
    """What a stack walk found above a draw (a tuple: built in C on the hot path)."""

    call_site: CallSite | None
    chain: tuple[CallSite, ...]
    user_site: CallSite | None
    marked: tuple[tuple[str, Any], ...]  # (role, frame `self`) for marked code objects
    stdlib_caller: bool  # the first caller outside rngaudit/random.py: stdlib, or a library import


_new = tuple.__new__  # CallSite/Stack without the Python-level namedtuple __new__ (0.3 µs)
_NO_MARKS: tuple[tuple[str, Any], ...] = ()
# id(code) -> (code, {instruction offset: CallSite}): a frame's line number costs 0.3 µs to
# compute and a CallSite 0.2 µs to build; a call site that draws again gets its cached one.
# The code objects are held (their ids are not reused); cleared when it grows past _MAX_SITES.
_SITES: dict[int, tuple[CodeType, dict[int, CallSite]]] = {}
_MAX_SITES = 20_000


def _site(frame: FrameType, code: CodeType) -> CallSite:
    entry = _SITES.get(id(code))
    if entry is None:
        if len(_SITES) >= _MAX_SITES:
            _SITES.clear()
        entry = _SITES[id(code)] = (code, {})
    sites = entry[1]
    lasti = frame.f_lasti
    site = sites.get(lasti)
    if site is None:
        site = sites[lasti] = _new(CallSite, (code.co_filename, frame.f_lineno, code.co_name))
    return site


class MarkedCodes:
    """Code objects whose frames carry meaning (sampler ``__iter__``, loader ``state_dict``,
    ...) -> role. Looked up by ``id``: a code object's hash is recomputed at every lookup
    (0.2-0.5 µs a frame); the code objects are held, so their ids are not reused."""

    def __init__(self) -> None:
        self.by_id: dict[int, str] = {}
        self._codes: dict[int, CodeType] = {}

    def __contains__(self, code: object) -> bool:
        return id(code) in self.by_id

    def __setitem__(self, code: CodeType, role: str) -> None:
        self.by_id[id(code)] = role
        self._codes[id(code)] = code

    def __len__(self) -> int:
        return len(self.by_id)

    def get(self, code: object) -> str | None:
        return self.by_id.get(id(code))

    def pop(self, code: object, default: str | None = None) -> str | None:
        self._codes.pop(id(code), None)
        return self.by_id.pop(id(code), default)


# Filled by the instrumentation when it installs.
MARKED_CODES = MarkedCodes()

_RANDOM_PY = os.path.join("", "random.py")


def walk(frame: FrameType | None, max_depth: int = 80) -> Stack:
    """Walk from ``frame`` outwards to the first user frame (the recorder's hot path)."""
    call_site: CallSite | None = None
    chain: list[CallSite] = []
    marked: list[tuple[str, Any]] | None = None
    stdlib_caller = False
    first_outside = True
    depth = 0
    marks = MARKED_CODES.by_id
    classes = _classes
    cache = _SITES
    while frame is not None and depth < max_depth:
        depth += 1
        code = frame.f_code
        role = marks.get(id(code)) if marks else None
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
        if first_outside and not filename.endswith(_RANDOM_PY):
            # the first caller outside rngaudit and random.py itself (Random.__init__ seeds):
            # the stdlib's private instances (tempfile), and a library's own made at import
            # (a module body: datasets' fingerprint_rng, sympy's) are noise, not the user's run
            first_outside = False
            stdlib_caller = kind == STDLIB or (kind == LIBRARY and code.co_name == "<module>")
        if kind >= LIBRARY:  # LIBRARY or USER: a call site (cached per code and instruction)
            entry = cache.get(id(code))
            site = entry[1].get(frame.f_lasti) if entry is not None else None
            if site is None:
                site = _site(frame, code)
            if kind == USER:
                if role is not None:  # a user's sampler: find the loader frames above it
                    assert marked is not None
                    marked.extend(_marks_above(frame.f_back, max_depth - depth))
                marks_found = tuple(marked) if marked else _NO_MARKS
                if call_site is None:  # drawn right from user code: the common case
                    return _new(Stack, (site, (site,), site, marks_found, stdlib_caller))
                chain.append(site)
                return _new(Stack, (call_site, tuple(chain), site, marks_found, stdlib_caller))
            if call_site is None:
                call_site = site
            chain.append(site)
        frame = frame.f_back
    return _new(
        Stack,
        (call_site, tuple(chain), None, tuple(marked) if marked else _NO_MARKS, stdlib_caller),
    )


def stdlib_caller(frame: FrameType | None, max_depth: int = 80) -> bool:
    """``walk(frame).stdlib_caller``, read from the first caller outside rngaudit and
    random.py without walking further (the stdlib's private instances draw from deep stacks:
    tempfile names a multiprocessing queue's semaphores)."""
    depth = 0
    classes = _classes
    while frame is not None and depth < max_depth:
        depth += 1
        code = frame.f_code
        filename = code.co_filename
        kind = classes.get(filename)
        if kind is None:
            kind = classify(filename)
        if kind != RNGAUDIT and not filename.endswith(_RANDOM_PY):
            return kind == STDLIB or (kind == LIBRARY and code.co_name == "<module>")
        frame = frame.f_back
    return False


def lines_to_user(frame: FrameType | None, op: Any, gen: Any) -> tuple[Any, ...] | None:
    """``(op, gen)`` + (id(code), instruction offset) of each frame from ``frame`` out to the
    first user frame, when every one of them is library or user code and none is marked (at
    most 8): then :func:`walk` of any frame at the same lines returns the same stack, so this
    is a key for what a draw there is counted as. None for any other stack (``walk`` it).

    The ids stand for their code objects only while the caller holds those."""
    if frame is None:
        return None
    marks = MARKED_CODES.by_id
    classes = _classes
    code = frame.f_code
    kind = classes.get(code.co_filename)
    if kind is None or kind < LIBRARY or id(code) in marks:
        return None
    if kind == USER:  # drawn right from user code: the common case
        return (op, gen, id(code), frame.f_lasti)
    key = [op, gen, id(code), frame.f_lasti]
    for _ in range(7):
        frame = frame.f_back
        if frame is None:
            return None
        code = frame.f_code
        kind = classes.get(code.co_filename)
        if kind is None or kind < LIBRARY or id(code) in marks:
            return None
        key += (id(code), frame.f_lasti)
        if kind == USER:
            return tuple(key)
    return None


def _marks_above(frame: FrameType | None, budget: int) -> list[tuple[str, Any]]:
    """Marked frames further out (only their marks: the call site is already known)."""
    out: list[tuple[str, Any]] = []
    marks = MARKED_CODES.by_id
    while frame is not None and budget > 0:
        budget -= 1
        role = marks.get(id(frame.f_code))
        if role is not None:
            out.append((role, frame.f_locals.get("self")))
        frame = frame.f_back
    return out


def here(skip: int = 1) -> Stack:
    """Walk the caller's stack (``skip`` frames above this one)."""
    return walk(sys._getframe(skip + 1))
