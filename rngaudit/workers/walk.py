"""The object walk: the generators a dataset graph holds, and their state fingerprints."""

from __future__ import annotations

import functools
import random
import sys
import types
from collections import deque
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from rngaudit.capture import callsite
from rngaudit.capture.fingerprint import of as state_fingerprint

# Bounds of one walk over a dataset graph: depth below the root, items looked at per
# container (list, tuple, dict), attributes per object, and objects visited in all.
MAX_DEPTH = 16
MAX_ITEMS = 64
MAX_ATTRS = 256
MAX_NODES = 4096

# Canonical names of the generator families the walk looks for.
NUMPY_GENERATOR = "numpy.random.Generator"
NUMPY_RANDOMSTATE = "numpy.random.RandomState"
PY_RANDOM = "random.Random"
TORCH_GENERATOR = "torch.Generator"

# Values that can hold no generator: never walked into.
_ATOMS: tuple[type, ...] = (
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    type(None),
    range,
    memoryview,
    type,
    types.ModuleType,
    types.CodeType,
    types.FrameType,
    random.SystemRandom,  # no state to copy: reads the OS entropy pool
)


class GeneratorRef:
    """One generator found by a walk: where it is, its family and concrete class, the object."""

    __slots__ = ("cls", "kind", "obj", "path")

    def __init__(self, path: str, kind: str, cls: str, obj: object) -> None:
        self.path = path
        self.kind = kind
        self.cls = cls
        self.obj = obj

    def __repr__(self) -> str:
        return f"GeneratorRef({self.path!r}, {self.kind!r})"


def generator_kind(obj: object) -> str | None:
    """The family of ``obj`` if it is a generator a worker would inherit, else ``None``.

    Only modules already imported are consulted: a generator of a library that was never
    imported cannot exist, so the check imports nothing.
    """
    if isinstance(obj, random.Random):
        if isinstance(obj, random.SystemRandom) or obj is getattr(random, "_inst", None):
            return None  # stateless, or the global instance PyTorch reseeds per worker
        return PY_RANDOM
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        if isinstance(obj, np_random.Generator):
            return NUMPY_GENERATOR
        if isinstance(obj, np_random.RandomState):
            return NUMPY_RANDOMSTATE
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Generator):
        return TORCH_GENERATOR
    return None


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _leaf_types() -> tuple[type, ...]:
    """Atoms plus the array and tensor types of the libraries already imported."""
    leaves = list(_ATOMS)
    np = sys.modules.get("numpy")
    if np is not None:
        leaves += [np.ndarray, np.generic]
    torch = sys.modules.get("torch")
    if torch is not None:
        leaves += [torch.Tensor, torch.dtype, torch.device]
    tempfile = sys.modules.get("tempfile")
    name_sequence = getattr(tempfile, "_RandomNameSequence", None)
    if isinstance(name_sequence, type):
        leaves.append(name_sequence)  # the stdlib's private Random for temporary names
    return tuple(leaves)


def _torch_module_type() -> type | None:
    nn = sys.modules.get("torch.nn")
    module = getattr(nn, "Module", None)
    return module if isinstance(module, type) else None


def instance_dict(obj: object) -> dict[str, Any] | None:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:
        return None
    return d if isinstance(d, dict) else None


def _slot_values(obj: object) -> Iterator[tuple[str, Any]]:
    """Values stored in ``__slots__``, read through their member descriptors only."""
    for cls in type(obj).__mro__:
        slots = cls.__dict__.get("__slots__")
        if slots is None:
            continue
        names = (slots,) if isinstance(slots, str) else slots
        for name in names:
            if not isinstance(name, str) or name in ("__dict__", "__weakref__"):
                continue
            attr = name
            if name.startswith("__") and not name.endswith("__"):
                attr = f"_{cls.__name__.lstrip('_')}{name}"
            desc = cls.__dict__.get(attr)
            if isinstance(desc, types.MemberDescriptorType):
                try:
                    yield name, desc.__get__(obj, cls)
                except AttributeError:
                    continue


def _class_generators(cls: type, cache: dict[type, list[tuple[str, Any]]]) -> list[tuple[str, Any]]:
    """Generators stored as class attributes (``class D: rng = default_rng(0)``)."""
    found = cache.get(cls)
    if found is None:
        found = []
        for klass in cls.__mro__[:-1]:  # skip object
            for name, value in islice(klass.__dict__.items(), MAX_ATTRS):
                if generator_kind(value) is not None:
                    found.append((name, value))
        cache[cls] = found
    return found


def _key_repr(key: object) -> str:
    """A dict key as written in a path; no user ``__repr__`` runs for unusual key types."""
    if isinstance(key, (str, int, float, bool, type(None))):
        return repr(key)
    return f"<{type(key).__qualname__}>"


class _Globals:
    """A user module's globals, walked as ``module.name`` (reached from its functions and from
    instances of its classes)."""

    __slots__ = ("module", "names")

    def __init__(self, module: str, names: dict[str, Any]) -> None:
        self.module = module
        self.names = names


_PARTIAL_FIELDS = tuple(
    (name, functools.partial.__dict__[name]) for name in ("func", "args", "keywords")
)


def _user_globals(filename: object, module: object, names: object) -> _Globals | None:
    """The globals of user code (not a library's, not the stdlib's), or None."""
    if not isinstance(filename, str) or not isinstance(names, dict):
        return None
    if callsite.classify(filename) != callsite.USER:
        return None
    return _Globals(module if isinstance(module, str) else "<module>", names)


def _function_children(func: types.FunctionType, path: str) -> Iterator[tuple[str, Any]]:
    """A function's closure cells, defaults and (user code only) module globals."""
    code = func.__code__
    for name, cell in zip(code.co_freevars, func.__closure__ or (), strict=False):
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield f"{path}.<closure {name}>", value
    for i, value in enumerate(func.__defaults__ or ()):
        yield f"{path}.__defaults__[{i}]", value
    for name, value in islice(dict.items(func.__kwdefaults__ or {}), MAX_ITEMS):
        yield f"{path}.__kwdefaults__[{name!r}]", value
    found = _user_globals(code.co_filename, func.__module__, func.__globals__)
    if found is not None:
        yield found.module, found


def _class_module_globals(cls: type) -> _Globals | None:
    """The module globals of a class defined in user code."""
    module = sys.modules.get(cls.__module__) if isinstance(cls.__module__, str) else None
    if module is None:
        return None
    names = instance_dict(module)
    filename = names.get("__file__") if names is not None else None
    return _user_globals(filename, cls.__module__, names)


def _children(
    obj: object,
    path: str,
    module_type: type | None,
    class_cache: dict[type, list[tuple[str, Any]]],
) -> Iterable[tuple[str, Any]]:
    if isinstance(obj, _Globals):
        return (
            (f"{obj.module}.{k}", v)
            for k, v in islice(dict.items(obj.names), MAX_ATTRS)
            if isinstance(k, str) and not k.startswith("__")
        )
    if isinstance(obj, types.FunctionType):
        return _function_children(obj, path)
    if isinstance(obj, types.MethodType):
        return ((f"{path}.__self__", obj.__self__), (f"{path}.__func__", obj.__func__))
    if isinstance(obj, (types.BuiltinFunctionType, types.MethodWrapperType)):
        owner = getattr(obj, "__self__", None)
        return () if owner is None else ((f"{path}.__self__", owner),)
    if isinstance(obj, functools.partial):
        return ((f"{path}.{n}", d.__get__(obj, type(obj))) for n, d in _PARTIAL_FIELDS)
    if isinstance(obj, types.GeneratorType):
        frame = obj.gi_frame  # a suspended generator's locals (an iterable dataset's iterator)
        if frame is None:
            return ()
        return ((f"{path}.<local {k}>", v) for k, v in islice(frame.f_locals.items(), MAX_ATTRS))
    if isinstance(obj, dict):
        return ((f"{path}[{_key_repr(k)}]", v) for k, v in islice(dict.items(obj), MAX_ITEMS))
    if isinstance(obj, list):
        return ((f"{path}[{i}]", v) for i, v in enumerate(islice(list.__iter__(obj), MAX_ITEMS)))
    if isinstance(obj, tuple):
        return ((f"{path}[{i}]", v) for i, v in enumerate(islice(tuple.__iter__(obj), MAX_ITEMS)))
    if isinstance(obj, (set, frozenset)):
        return ()
    return _attribute_children(obj, path, module_type, class_cache)


# Libraries that copy one generator into every worker on purpose: Hugging Face ``datasets``'
# iterable pipelines shuffle their shard list with it in each worker, so the workers agree on
# which shards exist before each takes its own (the buffer shuffle then runs on distinct data).
_SHARED_BY_DESIGN = ("datasets.iterable_dataset",)


def _shares_by_design(obj: object) -> bool:
    return str(getattr(type(obj), "__module__", "")).startswith(_SHARED_BY_DESIGN)


def _attribute_children(
    obj: object,
    path: str,
    module_type: type | None,
    class_cache: dict[type, list[tuple[str, Any]]],
) -> Iterator[tuple[str, Any]]:
    d = instance_dict(obj)
    if d is not None and _shares_by_design(obj):
        d = {k: v for k, v in dict.items(d) if generator_kind(v) is None}
    is_module = module_type is not None and isinstance(obj, module_type)
    if d is not None:
        for name, value in islice(dict.items(d), MAX_ATTRS):
            if not isinstance(name, str):
                continue
            if is_module and name.startswith("_"):
                if name == "_modules" and isinstance(value, dict):
                    # nn.Module children are reachable as attributes: name them so.
                    for child, sub in islice(dict.items(value), MAX_ITEMS):
                        if isinstance(child, str) and child.isidentifier():
                            yield f"{path}.{child}", sub
                        else:
                            yield f"{path}._modules[{child!r}]", sub
                continue  # parameters, buffers, hooks: no generators there
            yield f"{path}.{name}", value
    yield from ((f"{path}.{n}", v) for n, v in _slot_values(obj))
    for name, value in _class_generators(type(obj), class_cache):
        if d is None or name not in d:
            yield f"{path}.{name}", value
    found = _class_module_globals(type(obj))
    if found is not None:
        yield found.module, found


def find_generators(
    root: object,
    root_path: str = "dataset",
    *,
    max_depth: int = MAX_DEPTH,
    max_nodes: int = MAX_NODES,
    more_roots: Iterable[tuple[str, object]] = (),
) -> list[GeneratorRef]:
    """Generators reachable from ``root`` (and ``more_roots``), breadth first (shortest path
    wins), cycle-safe; each generator once.

    Reads attributes through the instance ``__dict__`` and slot descriptors only (no
    properties or ``__getattr__`` run), and enters functions (closure cells, defaults, the
    globals of user modules), bound methods, ``functools.partial`` objects and suspended
    generators' locals; looks at the first ``MAX_ITEMS`` items of each container, never
    enters arrays or tensors, and stops after ``max_nodes`` objects. Never raises.
    """
    leaves = _leaf_types()
    module_type = _torch_module_type()
    class_cache: dict[type, list[tuple[str, Any]]] = {}
    found: list[GeneratorRef] = []
    roots = [(root_path, root), *more_roots]
    seen: set[int] = set()
    queue: deque[tuple[object, str, int]] = deque()
    for path, obj in roots:
        if id(obj) not in seen and not isinstance(obj, leaves):
            seen.add(id(obj))
            queue.append((obj, path, 0))
    visited = 0
    while queue and visited < max_nodes:
        obj, path, depth = queue.popleft()
        visited += 1
        kind = generator_kind(obj)
        if kind is not None:
            found.append(GeneratorRef(path, kind, _qualname(type(obj)), obj))
            continue
        if depth >= max_depth:
            continue
        try:
            for child_path, child in _children(obj, path, module_type, class_cache):
                key = id(child.names) if isinstance(child, _Globals) else id(child)
                if isinstance(child, leaves) or key in seen:
                    continue
                seen.add(key)
                queue.append((child, child_path, depth + 1))
        except Exception:  # an unusual object: what was read of it stays, the walk goes on
            continue
    return found


def fingerprint(obj: object, kind: str) -> str:
    """A short hash of the generator's state (read, never drawn): equal states, equal hashes.

    The same fingerprint the recorder uses (``rngaudit.capture.fingerprint``), prefixed by the
    family.
    """
    fp = state_fingerprint(obj)
    if fp is None:
        raise ValueError(f"cannot read the state of {type(obj).__name__}")
    return f"{kind}:{fp}"
