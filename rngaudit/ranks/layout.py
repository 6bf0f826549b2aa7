"""The data-parallel layout: which ranks are replicas (disjoint shards), which are peers."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any

from rngaudit import peek
from rngaudit.capture.patching import PatchSet
from rngaudit.config import ENV_GROUPS, shown
from rngaudit.errors import ConfigError
from rngaudit.ranks import group_end

log = logging.getLogger("rngaudit")

# a mesh dimension is data-parallel when every "_"-separated part of its name is one of these
DP_PARTS = frozenset({"dp", "ddp", "fsdp", "hsdp", "data", "replicate", "shard", "batch"})
# and a peer dimension (one replica's ranks, fed the same batch) when some part is one of these;
# any other name (an expert-parallel "ep" among them: DeepSpeed-MoE feeds those ranks different
# data) leaves the mesh's layout unknown
PEER_PARTS = frozenset(
    {"tp", "cp", "pp", "sp", "mp", "tensor", "context", "pipeline", "pipe", "model", "seq"}
)
NEUTRAL_PARTS = frozenset({"parallel", "parallelism", "dim"})  # Lightning: "data_parallel"


@dataclass(frozen=True)
class Layout:
    """Each rank's replica (peers share one) and where that came from."""

    replica: dict[int, int]
    source: str

    def peers_of(self, rank: int) -> list[int]:
        mine = self.replica.get(rank)
        return sorted(r for r, v in self.replica.items() if v == mine)

    def groups(self) -> list[list[int]]:
        """The ranks of each replica (peers), in replica order."""
        out: dict[int, list[int]] = {}
        for r in sorted(self.replica):
            out.setdefault(self.replica[r], []).append(r)
        return [out[k] for k in sorted(out)]

    def has_peers(self) -> bool:
        return len(set(self.replica.values())) < len(self.replica)

    def describe(self) -> str:
        parts = "; ".join(", ".join(str(r) for r in g) for g in self.groups())
        return f"replicas (peers of one replica together): {parts}; from {self.source}"

    def as_dict(self) -> dict[str, Any]:
        return {"replicas": self.groups(), "source": self.source}


_declared: list[Any] = [None]  # the groups rngaudit.audit(groups=...) was given
_meshes: list[Any] = []  # weak references to the meshes noted, oldest first
_scanned = [False]  # the heap searched for meshes built before the wrapper (once)
_patches = PatchSet()  # DeviceMesh.__init__ noted, from the first audit until exit
_armed = [False]


def from_groups(groups: Any, world: int, source: str) -> Layout | None:
    """A layout from data-parallel groups (each a list of ranks, as a DDP process group): a
    rank's replica is its position in its group; None unless the groups are equal-sized,
    disjoint and cover ranks 0 .. world - 1."""
    try:
        norm = [[int(r) for r in g] for g in groups]
    except Exception:
        return None
    flat = sorted(r for g in norm for r in g)
    if not norm or flat != list(range(world)) or len({len(g) for g in norm}) != 1:
        return None
    return Layout({r: i for g in norm for i, r in enumerate(g)}, source)


def parse_groups(text: str) -> list[list[int]] | None:
    """``"0,2;1,3"`` as ``[[0, 2], [1, 3]]``; None when unreadable."""
    try:
        groups = [[int(x) for x in part.split(",") if x.strip()] for part in text.split(";")]
    except ValueError:
        return None
    groups = [g for g in groups if g]
    return groups or None


def declare(groups: Any) -> None:
    """The data-parallel groups ``rngaudit.audit(groups=...)`` was given (None: none), as
    lists of ranks; checked against the world when used. ConfigError when not lists of
    ranks."""
    if groups is None:
        _declared[0] = None
        return
    try:
        norm = [[int(r) for r in g] for g in groups]
        if not norm or any(not g or isinstance(g, str | bytes) for g in groups):
            raise ValueError
    except (TypeError, ValueError):
        raise ConfigError(
            f"groups={shown(groups)} is not a list of data-parallel groups, each a list of "
            "ranks (as [[0, 2], [1, 3]])"
        ) from None
    _declared[0] = norm


def _declared_layout(world: int) -> Layout | None:
    if _declared[0] is not None:
        said = f"declared with rngaudit.audit(groups={_declared[0]})"
        return from_groups(_declared[0], world, said)
    text = os.environ.get(ENV_GROUPS)
    if text:
        groups = parse_groups(text)
        if groups is not None:
            return from_groups(groups, world, f"declared with {ENV_GROUPS}={text}")
    return None


def dim_kind(name: Any) -> str:
    """``"dp"``, ``"peer"`` or ``"unknown"`` for a mesh dimension's name."""
    if not isinstance(name, str) or not name:
        return "unknown"
    parts = set(name.lower().split("_")) - NEUTRAL_PARTS
    if not parts:
        return "unknown"
    if parts <= DP_PARTS:
        return "dp"
    if parts & PEER_PARTS and not parts - DP_PARTS - PEER_PARTS:
        return "peer" if not parts & DP_PARTS else "unknown"
    return "unknown"


def arm() -> None:
    """Note every ``DeviceMesh`` built from now on (its ``__init__`` wrapped, undone at
    exit); those built before are found on the heap when first needed. Never raises."""
    with contextlib.suppress(Exception):
        if _armed[0]:
            return
        _armed[0] = True
        # no mesh can predate the wrapper when torch's mesh module is not yet imported
        _scanned[0] = _scanned[0] or "torch.distributed.device_mesh" not in sys.modules
        _patches.when_imported("torch.distributed.device_mesh", _on_import)
        group_end.at_exit(group_end.MESHES, _patches.undo)


def _on_import(module: Any) -> None:
    cls = getattr(module, "DeviceMesh", None)
    if isinstance(cls, type) and "__init__" in cls.__dict__ and not _patches.replaced(cls):
        _patches.wrap(cls, "__init__", _noted)


def _noted(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    result = wrapped(*args, **kw)
    if instance is not None:
        note_mesh(instance)
    return result


def note_mesh(mesh: Any) -> None:
    with contextlib.suppress(Exception):
        if all(ref() is not mesh for ref in _meshes):
            _meshes.append(weakref.ref(mesh))
            _meshes[:] = [ref for ref in _meshes if ref() is not None]


def _find_meshes() -> list[Any]:
    """The live meshes, oldest first (those found on the heap first of all)."""
    mod = sys.modules.get("torch.distributed.device_mesh")
    cls = getattr(mod, "DeviceMesh", None)
    if not isinstance(cls, type):
        return []
    if not _scanned[0] and _groups_beyond_default():
        _scanned[0] = True
        with contextlib.suppress(Exception):
            found = [obj for obj in gc.get_objects() if issubclass(type(obj), cls)]
            _meshes[:0] = [weakref.ref(m) for m in found]
    return [m for m in (ref() for ref in _meshes) if m is not None]


def _groups_beyond_default() -> bool:
    """Whether the program made a process group besides the default one (a mesh of two or
    more dims does): no heap search for a mesh otherwise (a plain DDP program pays nothing)."""
    try:
        c10d = sys.modules["torch.distributed.distributed_c10d"]
        return len(c10d._world.pg_map) > 1
    except Exception:
        return True


def mesh_layout(world: int) -> Layout | None:
    """The layout the program's DeviceMesh states: its dims named data-parallel make the
    replica, the others (tp, cp, pp, ...) its peers. Only a mesh over the whole world with
    every dim named and recognised counts (a mesh of data-parallel dims alone states no
    peers, and counts as one); of meshes that state different layouts, the one built last,
    and the layout's source says so."""
    layouts: list[Layout] = []
    for mesh in _find_meshes():
        layout = _one_mesh(mesh, world)
        if layout is not None:
            layouts.append(layout)
    if not layouts:
        return None
    last = layouts[-1]
    if any(other.replica != last.replica for other in layouts):
        return Layout(last.replica, f"{last.source} (the last built of {len(layouts)} meshes)")
    return last


def _one_mesh(mesh: Any, world: int) -> Layout | None:
    try:
        names = peek.attr(mesh, "mesh_dim_names")
        ranks = peek.attr(mesh, "mesh")
        if not isinstance(names, tuple) or ranks is None:
            return None
        shape = [int(s) for s in ranks.shape]
        flat = [int(r) for r in ranks.flatten().tolist()]
        if len(names) != len(shape) or sorted(flat) != list(range(world)):
            return None
        kinds = [dim_kind(n) for n in names]
        if "unknown" in kinds:
            return None
        replica: dict[int, int] = {}
        for pos, r in enumerate(flat):
            coords, rest = [], pos
            for size in reversed(shape):
                coords.append(rest % size)
                rest //= size
            coords.reverse()
            index = 0
            for c, size, kind in zip(coords, shape, kinds, strict=True):
                if kind == "dp":
                    index = index * size + c
            replica[r] = index
        dims = ", ".join(f"{n!r}: {s}" for n, s in zip(names, shape, strict=True))
        return Layout(replica, f"the DeviceMesh ({dims}), its dims named {_named(names, kinds)}")
    except Exception:
        log.debug("rngaudit: could not read a device mesh", exc_info=True)
        return None


def _named(names: tuple[Any, ...], kinds: list[str]) -> str:
    dp = [str(n) for n, k in zip(names, kinds, strict=True) if k == "dp"]
    peer = [str(n) for n, k in zip(names, kinds, strict=True) if k == "peer"]
    return f"{'/'.join(dp) or 'none'} data-parallel and {'/'.join(peer)} peers"


def current(world: int, sampler_ranks: dict[int, Any] | None = None) -> Layout | None:
    """The layout the program states, first found of: the user's declaration, the device mesh,
    the samplers' own ``num_replicas`` / ``rank`` (``sampler_ranks``: rank -> (num_replicas,
    rank), as exchanged). None: every rank its own replica (the world is one data-parallel
    group), as without a mesh."""
    return _declared_layout(world) or mesh_layout(world) or sampler_layout(world, sampler_ranks)


def sampler_layout(world: int, sampler_ranks: dict[int, Any] | None) -> Layout | None:
    """The samplers' statement: every rank's ``DistributedSampler`` shards over ``R`` replicas
    (``R`` below the world, dividing it) and each of its ranks is held by ``world / R`` ranks:
    those are one replica's peers."""
    if not sampler_ranks or len(sampler_ranks) != world:
        return None
    try:
        pairs = {int(k): (int(v[0]), int(v[1])) for k, v in sampler_ranks.items()}
    except Exception:
        return None
    replicas = {n for n, _ in pairs.values()}
    if len(replicas) != 1:
        return None
    n = replicas.pop()
    if not 1 <= n < world or world % n:
        return None
    counts: dict[int, int] = {}
    for _, r in pairs.values():
        counts[r] = counts.get(r, 0) + 1
    if sorted(counts) != list(range(n)) or set(counts.values()) != {world // n}:
        return None
    return Layout(
        {k: r for k, (_, r) in pairs.items()},
        f"the DistributedSampler's own num_replicas={n} and rank",
    )


def sampler_rank(shard: Any) -> list[int] | None:
    """A DistributedSampler's ``[num_replicas, rank]``, read without a call; None otherwise."""
    n = peek.integer(peek.attr(shard, "num_replicas"), -1)
    r = peek.integer(peek.attr(shard, "rank"), -1)
    return [n, r] if n > 0 and r >= 0 else None
