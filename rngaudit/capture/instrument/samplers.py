"""Known samplers and loaders: mark their code so draws made inside them are attributed."""

from __future__ import annotations

import sys
from types import CodeType
from typing import Any

from rngaudit import library_samplers
from rngaudit.capture.callsite import MARKED_CODES
from rngaudit.capture.recorder import ROLE_SAMPLER


def known(module_name: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(role, class name, method names) for the known classes of a module, from the table."""
    return [
        (role, k.name, methods)
        for k in library_samplers.TABLE
        if k.module == module_name
        for role, methods in k.marks
    ]


def _code(cls: Any, method: str) -> CodeType | None:
    func = cls.__dict__.get(method)
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    return code if isinstance(code, CodeType) else None


def mark_module(module_name: str) -> list[CodeType]:
    """Mark the known classes of an imported module; returns the codes marked."""
    module = sys.modules.get(module_name)
    if module is None:
        return []
    marked: list[CodeType] = []
    for role, cls_name, methods in known(module_name):
        cls = getattr(module, cls_name, None)
        if cls is None:
            continue
        for method in methods:
            code = _code(cls, method)
            if code is not None and code not in MARKED_CODES:
                MARKED_CODES[code] = role
                marked.append(code)
    return marked


def mark_objects(samplers: list[Any]) -> list[CodeType]:
    """Mark the iteration code of the classes of ``samplers`` (a user's own samplers too)."""
    marked: list[CodeType] = []
    for sampler in samplers:
        for klass in type(sampler).__mro__:
            if klass is object:
                break
            for method in ("__iter__", "__next__"):
                code = _code(klass, method)
                if code is not None and code not in MARKED_CODES:
                    MARKED_CODES[code] = ROLE_SAMPLER
                    marked.append(code)
    return marked
