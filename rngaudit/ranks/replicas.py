"""Replicas start from the same weights: replicated parameters compared at the first optimizer step.

A parameter is replicated over a group where the program says so: a ``DistributedDataParallel``
module's process group, an FSDP1 module sharding ``NO_SHARD`` (its group) or ``HYBRID_SHARD``
(its inter-node group), a DTensor placed ``Replicate()`` on a mesh dim (that dim's group: HSDP's
replicate dim, a tensor-parallel replicated bias), or gradients averaged by hand with
``dist.all_reduce(p.grad, group=...)`` before the step (the group reduced over). At each
optimizer's first step that holds such parameters (a global pre-hook: before any replica
moves), each rank digests them (shape, dtype and up to :data:`SAMPLED` evenly spaced elements
of the local tensor) and the ranks of each group compare them through the store, with the
audit's timeout; a difference is an error raised from ``step()``, before the step. After
that an optimizer's steps cost a dictionary look-up; an ``all_reduce`` one dictionary entry.
The hook and the wrapper are undone at exit.

The same exchange carries, where a DDP / FSDP1 module holding the optimizer's parameters has a
stochastic module in training mode (dropout: the training step draws), the state of the
generator it draws from; replicas (ranks the layout does not make peers) holding identical
states are reported, as information only (``replica-streams-identical``).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import sys
import weakref
from typing import Any

from rngaudit import findings as fk
from rngaudit import forksafe
from rngaudit.capture.patching import PatchSet
from rngaudit.capture.recorder import RECORDER
from rngaudit.findings import Finding
from rngaudit.ranks import data_parallel, exchange, group_end, layout
from rngaudit.ranks import store as protocol

log = logging.getLogger("rngaudit")

SAMPLED = 4096  # elements of a parameter digested, evenly spaced
MAX_TRIES = 16  # optimizer steps looked at for replicated parameters, at most
MAX_GRADS = 100_000  # all-reduced tensors remembered before the first step, at most

REMEDY = (
    "Start every replica from the same weights: FSDP(..., sync_module_states=True) where the "
    "device allows; or broadcast each parameter (each local shard, over the replicate group) "
    "before training: for p in model.parameters(): dist.broadcast(p.data, src=group_rank_0, "
    "group=replicate_group); or seed every rank identically before the model is built (and "
    "use per-rank seeds only after it: dropout, augmentation). DDP broadcasts at construction."
)

STREAMS_REMEDY = (
    "Only if each replica should draw its own dropout / noise stream: seed per data-parallel "
    "rank after the model is built: accelerate.utils.set_seed(seed, device_specific=True), or "
    "torch.manual_seed(seed + dp_rank) (per-rank seeds before the model is built, without a "
    "broadcast, give the replicas different weights). Nothing needs fixing otherwise."
)
# modules whose training forward draws from the default generator of their device
STOCHASTIC = frozenset(
    {"Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "AlphaDropout", "FeatureAlphaDropout"}
    | {"RReLU"}
)
MAX_DRAWS = 8  # stochastic modules named, at most
STREAMS_LABEL = "replicas' random streams at the first optimizer step"
WEIGHTS_LABEL = "replicas' weights at the first optimizer step"

_lock = forksafe.lock()
_patches = PatchSet()  # the optimizer hook (never removed inside its own call: at exit)
_reduce = PatchSet()  # the all_reduce wrapper
_watch: list[Any] = [None]  # the Watch (settings, session) findings are acted on by
_state = {"armed": False}
# id(tensor) -> (the tensor, weakly; the ranks it was all-reduced over); by id: a tensor's
# __eq__ is elementwise
_grads: dict[int, tuple[Any, tuple[int, ...]]] = {}
_optimizers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # -> steps seen
_counts: dict[tuple[int, ...], int] = {}  # group -> comparisons so far (the store keys)
# id(process group) -> (the group, its ranks): held, so that an id is never another group's
_group_ranks: dict[int, tuple[Any, tuple[int, ...]]] = {}


def arm(watch: Any) -> None:
    """Compare replicated parameters at the first optimizer step (``watch``: how to act);
    the first arming's watch is kept. Never raises."""
    with contextlib.suppress(Exception), _lock:
        if _state["armed"]:
            return
        _state["armed"] = True
        _watch[0] = watch
        _patches.when_imported("torch.optim.optimizer", _on_optim)
        _patches.when_imported("torch.distributed", _on_dist)
        group_end.at_exit(group_end.REPLICAS, disarm)


def disarm() -> None:
    """Every hook and wrapper undone."""
    with _lock:
        _reduce.undo()
        _patches.undo()
        _state["armed"] = False


def _on_optim(module: Any) -> None:
    register = getattr(module, "register_optimizer_step_pre_hook", None)
    if callable(register):
        handle = register(_pre_step)
        _patches.add_undo(handle.remove)


def _on_dist(module: Any) -> None:
    if _reduce.replaced(module, "all_reduce"):
        return
    if callable(getattr(module, "all_reduce", None)):
        _reduce.wrap(module, "all_reduce", _all_reduce)


def _ranks_of(group: Any) -> tuple[int, ...] | None:
    dist = sys.modules["torch.distributed"]
    key = id(group)
    entry = _group_ranks.get(key)
    if entry is not None and entry[0] is group:
        return entry[1]
    if group is None:
        found = tuple(range(int(dist.get_world_size())))
    else:
        found = tuple(sorted(int(r) for r in dist.get_process_group_ranks(group)))
    _group_ranks[key] = (group, found)
    return found


def _all_reduce(wrapped: Any, instance: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
    """``dist.all_reduce``: which group each tensor (a gradient, maybe) was reduced over."""
    with contextlib.suppress(Exception):
        tensor = args[0] if args else kw.get("tensor")
        group = args[2] if len(args) > 2 else kw.get("group")
        if tensor is not None and _state["armed"]:
            ranks = _ranks_of(group)
            if len(_grads) >= MAX_GRADS:
                for key in [k for k, (ref, _) in _grads.items() if ref() is None]:
                    del _grads[key]
            if ranks is not None and len(_grads) < MAX_GRADS:
                _grads[id(tensor)] = (weakref.ref(tensor), ranks)
    return wrapped(*args, **kw)


def _pre_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    """An optimizer's first step with replicated parameters (its first :data:`MAX_TRIES`
    steps looked at): compared there; a few attribute reads a step otherwise."""
    try:
        if _optimizers.get(optimizer, 0) >= MAX_TRIES:
            return  # looked at: the one look-up of every later step
    except TypeError:
        return
    with _lock:
        if not _state["armed"]:
            return
        watch = _watch[0]
        try:
            steps = _optimizers.get(optimizer, 0)
            if steps >= MAX_TRIES:
                return
            _optimizers[optimizer] = steps + 1
        except TypeError:
            return
    if exchange.distributed() is None or watch is None:
        return
    with RECORDER.paused():
        try:
            groups = _replicated(optimizer)
        except Exception:
            log.debug("rngaudit: could not read the replicated parameters", exc_info=True)
            groups = {}
        if not groups:
            return  # nothing replicated yet: its next step's gradients may be
        with _lock:
            _optimizers[optimizer] = MAX_TRIES  # compared once
        sources = _stream_sources(optimizer)
        found = _check(groups, watch, sources)
    for label, part in (
        (STREAMS_LABEL, [f for f in found if f.kind == fk.REPLICA_STREAMS_IDENTICAL]),
        (WEIGHTS_LABEL, [f for f in found if f.kind != fk.REPLICA_STREAMS_IDENTICAL]),
    ):
        if part:
            with contextlib.suppress(Exception):
                watch.session.add_check(label, part)
            watch.act(part, label)


def _replicated(optimizer: Any) -> dict[tuple[int, ...], dict[str, tuple[str, Any]]]:
    """group ranks -> {parameter key: (what says it is replicated, the local tensor)}."""
    wrapped = _wrapper_groups()
    out: dict[tuple[int, ...], dict[str, tuple[str, Any]]] = {}
    index = 0
    for group in list(getattr(optimizer, "param_groups", []) or []):
        for p in list(group.get("params", []) or []):
            index += 1
            key = f"{index - 1}:{tuple(int(s) for s in p.shape)}"
            for ranks, said, local in _groups_of(p, wrapped):
                if len(ranks) > 1:
                    out.setdefault(ranks, {})[key] = (said, local)
    return out


def _wrapper_groups() -> dict[int, tuple[tuple[int, ...], str]]:
    """id(parameter) -> (its replicate group, the wrapper) for DDP and FSDP1 modules."""
    data_parallel.data_parallel_groups(scan=True)  # those built before rngaudit was (once)
    out: dict[int, tuple[tuple[int, ...], str]] = {}
    for module in list(data_parallel.modules()):
        with contextlib.suppress(Exception):
            replicated = _replicate_group(module)
            if replicated is not None:
                for p in module.parameters():
                    out[id(p)] = replicated
    return out


def _replicate_group(module: Any) -> tuple[tuple[int, ...], str] | None:
    """The group a DDP or FSDP1 module keeps its parameters replicated over, and the wrapper
    that says so (``FullyShardedDataParallel(<strategy>)``); None when it replicates none."""
    name = type(module).__name__
    if name == "DistributedDataParallel":
        ranks = _ranks_of(getattr(module, "process_group", None))
        said = "DistributedDataParallel"
    elif name == "FullyShardedDataParallel":
        strategy = getattr(getattr(module, "sharding_strategy", None), "name", "")
        if strategy == "NO_SHARD":
            ranks = _ranks_of(getattr(module, "process_group", None))
        elif "HYBRID" in strategy:
            ranks = _ranks_of(getattr(module, "_inter_node_pg", None))
        else:
            return None
        said = f"FullyShardedDataParallel({strategy})"
    else:
        return None
    return None if ranks is None else (ranks, said)


def _groups_of(
    p: Any, wrapped: dict[int, tuple[tuple[int, ...], str]]
) -> list[tuple[tuple[int, ...], str, Any]]:
    found: list[tuple[tuple[int, ...], str, Any]] = []
    placements = getattr(p, "placements", None)
    mesh = getattr(p, "device_mesh", None)
    if placements is not None and mesh is not None:  # a DTensor: each Replicate() dim's group
        local = p.to_local()
        for dim, placement in enumerate(placements):
            if type(placement).__name__ == "Replicate":
                ranks = _ranks_of(mesh.get_group(dim))
                if ranks is not None:
                    found.append((ranks, f"a DTensor placed Replicate() on mesh dim {dim}", local))
        return found
    if id(p) in wrapped:
        ranks, said = wrapped[id(p)]
        found.append((ranks, said, p))
    grad = getattr(p, "grad", None)
    entry = _grads.get(id(grad)) if grad is not None else None
    if entry is not None and entry[0]() is grad:
        ranks = entry[1]
        if all(r != ranks for r, _, _ in found):
            found.append((ranks, "its gradient all-reduced over the group", p))
    return found


def digest(tensor: Any) -> str:
    """Shape, dtype and up to :data:`SAMPLED` evenly spaced elements of a local tensor."""
    h = hashlib.blake2b(digest_size=8)
    t = tensor.detach()
    h.update(f"{tuple(t.shape)}:{t.dtype};".encode())
    flat = t.reshape(-1)
    step = max(1, flat.numel() // SAMPLED)
    sample = flat[::step][:SAMPLED].to("cpu").contiguous()
    h.update(sample.view(-1).view(sys.modules["torch"].uint8).numpy().tobytes())
    return h.hexdigest()


def _check(
    groups: dict[tuple[int, ...], dict[str, tuple[str, Any]]],
    watch: Any,
    sources: dict[tuple[int, ...], dict[str, Any]] | None = None,
) -> list[Finding]:
    """Each group's digests compared (``sources``: group -> this rank's stream, published
    with them)."""
    where = exchange.distributed()
    if where is None:
        return []
    rank = where[0]
    found: list[Finding] = []
    timeout = float(watch.settings.timeout)
    for ranks in sorted(groups):
        if rank not in ranks:
            continue
        params = groups[ranks]
        try:
            mine = {k: digest(t) for k, (_, t) in params.items()}
            inits = _init_sites(watch.session)
            payload: dict[str, Any] = {"digests": mine, "inits": inits}
            if sources and ranks in sources:
                payload["streams"] = sources[ranks]
            published = _swap(ranks, rank, payload, timeout)
        except Exception:
            log.warning("rngaudit: the replicas' weights could not be compared", exc_info=True)
            continue
        if isinstance(published, list):
            found.append(
                fk.rank_missing(
                    published,
                    [r for r in ranks if r not in published],
                    where="reach the first optimizer step",
                    timeout=timeout,
                    unseen="the replicas' weights",
                    severity="warning",
                    details={"group": list(ranks)},
                )
            )
            continue
        digests = {r: dict(p.get("digests") or {}) for r, p in published.items()}
        differ = sorted(
            (k for k in mine if len({d.get(k) for d in digests.values()}) > 1),
            key=lambda k: int(k.split(":")[0]),
        )
        if differ:
            said = sorted({params[k][0] for k in differ})
            sites = _differing_sites({r: dict(p.get("inits") or {}) for r, p in published.items()})
            found.append(_finding(list(ranks), differ, len(mine), said, sites))
        with contextlib.suppress(Exception):
            streams = {r: p.get("streams") for r, p in published.items()}
            stated = layout.current(int(where[1]))
            info = streams_finding(list(ranks), streams, stated.replica if stated else None)
            if info is not None:
                found.append(info)
    return found


def _swap(
    ranks: tuple[int, ...], rank: int, mine: dict[str, Any], timeout: float
) -> dict[int, dict[str, Any]] | list[int]:
    """Every rank's digests, or the ranks missing after ``timeout``."""
    store = protocol.default()
    name = hashlib.blake2b(",".join(map(str, ranks)).encode(), digest_size=6).hexdigest()
    with _lock:
        n = _counts[ranks] = _counts.get(ranks, 0) + 1
    base = protocol.replicas(name, n)
    store.set(base / rank, exchange.encode(mine))
    missing = protocol.missing_after(store, base, ranks, timeout)
    if missing:
        return missing
    keys = protocol.per_rank(base, ranks)
    payloads = protocol.get_all(store, keys)
    protocol.read_by_all(store, base, keys, len(ranks))
    return {r: exchange.decode(bytes(p)) for r, p in zip(ranks, payloads, strict=True)}


INIT_FUNCTIONS = frozenset({"reset_parameters", "_reset_parameters"})
MAX_SITES = 64


def _init_sites(session: Any) -> dict[str, str]:
    """The initialisation draws this rank's audit windows recorded (``reset_parameters`` or
    ``torch.nn.init``): the user's call site -> the generator state before its first draw."""
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        rank = exchange.current_rank()
        record = (getattr(session, "records", {}) or {}).get(rank) or {}
        for event in record.get("events") or []:
            if event.get("kind") != "draw" or not event.get("fingerprint"):
                continue
            chain = [event.get("call_site") or {}, *(event.get("chain") or [])]
            if not any(
                c.get("function") in INIT_FUNCTIONS
                or str(c.get("file", "")).replace("\\", "/").endswith("torch/nn/init.py")
                for c in chain
                if isinstance(c, dict)
            ):
                continue
            site = event.get("user_call_site") or event.get("call_site") or {}
            key = f"{site.get('file')}:{site.get('line')} ({site.get('function')})"
            out.setdefault(key, str(event["fingerprint"]))
            if len(out) >= MAX_SITES:
                break
    return out


def _differing_sites(inits: dict[int, dict[str, str]]) -> list[str]:
    """The call sites every rank recorded whose generator states differ across the ranks."""
    common = set.intersection(*(set(d) for d in inits.values())) if inits else set()
    return sorted(k for k in common if len({d[k] for d in inits.values()}) > 1)


def _finding(
    ranks: list[int], differ: list[str], total: int, said: list[str], sites: list[str]
) -> Finding:
    shown = ", ".join(f"#{k.split(':')[0]} (shape {k.split(':', 1)[1]})" for k in differ[:4]) + (
        ", ..." if len(differ) > 4 else ""
    )
    message = (
        f"The replicas of ranks {', '.join(map(str, ranks))} hold different weights at the "
        f"first optimizer step: {len(differ)} of the {total} parameters they replicate differ "
        f"(the optimizer's parameters {shown}; replicated as {' and '.join(said)}). Nothing "
        "re-syncs them: each replica trains its own model with one averaged gradient. "
    )
    if sites:
        message += (
            f"They were initialised at {'; '.join(sites[:4])}{', ...' if len(sites) > 4 else ''}"
            ", whose draws came from generator states that differ across the ranks, and were "
            "never broadcast."
        )
    else:
        message += (
            "They were initialised from generator states that differ across the ranks (per-rank "
            "seeds, or none, before the model was built; the initialisation was not inside an "
            "audit window, so its lines are not named) and never broadcast."
        )
    return Finding(
        kind=fk.REPLICA_WEIGHT_DIVERGENCE,
        severity="error",
        message=message,
        ranks=ranks,
        remedy=REMEDY,
        details={
            "group": ranks,
            "parameters": differ,
            "replicated_as": said,
            "init_call_sites": sites,
        },
    )


def _stream_sources(optimizer: Any) -> dict[tuple[int, ...], dict[str, Any]]:
    """Group ranks -> this rank's stream where the step draws: a DDP (or FSDP1 ``NO_SHARD``)
    module holding the optimizer's parameters with a stochastic module in training mode
    (dropout, p > 0): the generator it draws from (its device's default one), that
    generator's state now, and the modules. Read only (never a draw); empty when none."""
    out: dict[tuple[int, ...], dict[str, Any]] = {}
    with contextlib.suppress(Exception):
        held = {id(p) for g in optimizer.param_groups for p in g.get("params", [])}
        for module in data_parallel.modules():
            with contextlib.suppress(Exception):
                replicated = _replicate_group(module)
                if replicated is None or "HYBRID" in replicated[1]:
                    continue  # sharded within the replica: its step's stream is not compared
                ranks, kind = replicated[0], type(module).__name__
                params = list(module.parameters())
                if not any(id(p) in held for p in params):
                    continue
                draws = _stochastic(module)
                generator = _generator_of(params[0]) if draws else None
                if generator is not None:
                    name, state = generator
                    out[ranks] = {"generator": name, "state": state, "draws": draws, "by": kind}
    return out


def _stochastic(module: Any) -> list[str]:
    """The stochastic modules in training mode inside ``module`` (qualified name, class, p)."""
    found: list[str] = []
    for qual, sub in module.named_modules():
        name = type(sub).__name__
        if name not in STOCHASTIC or not getattr(sub, "training", False):
            continue
        p = getattr(sub, "p", None)
        if isinstance(p, int | float) and p <= 0:
            continue  # dropout with p=0 draws nothing
        found.append(f"{qual or '(the module)'} ({name}{f', p={p:g}' if p is not None else ''})")
        if len(found) >= MAX_DRAWS:
            break
    return found


def _generator_of(param: Any) -> tuple[str, str] | None:
    """The name and state fingerprint of the default generator of a parameter's device (what
    its module's dropout draws from): torch's CPU one, or CUDA's for that device."""
    from rngaudit.capture import fingerprint, naming

    torch = sys.modules["torch"]
    device = param.device
    if device.type == "cpu":
        return naming.TORCH_DEFAULT, fingerprint.torch_generator(torch.default_generator)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        gen = torch.cuda.default_generators[index]
        return naming.cuda_default(index), fingerprint.torch_generator(gen)
    return None


def streams_finding(
    ranks: list[int], streams: dict[int, Any], replica: dict[int, int] | None
) -> Finding | None:
    """Information when replicas of one group, every one of whose training step draws,
    hold identical states of the generator it draws from. ``streams``: rank -> what it
    published (None where its step draws nothing: no finding); ``replica``: the layout's rank
    -> replica (ranks of one replica are peers, meant to share a stream; None: every rank its
    own replica)."""
    if len(ranks) < 2 or any(not isinstance(streams.get(r), dict) for r in ranks):
        return None
    shared: dict[tuple[str, str], list[int]] = {}
    for r in ranks:
        s = streams[r]
        shared.setdefault((str(s.get("generator")), str(s.get("state"))), []).append(r)
    sharing = [
        sorted(rs)
        for rs in shared.values()
        if len({replica.get(r, -1 - r) if replica else r for r in rs}) > 1
    ]
    if not sharing:
        return None
    sharing.sort()
    generators = sorted({str(streams[g[0]].get("generator")) for g in sharing})
    draws = list(streams[sharing[0][0]].get("draws") or [])
    by = str(streams[sharing[0][0]].get("by") or "data-parallel")
    who = "; ".join(", ".join(map(str, g)) for g in sharing)
    shown = ", ".join(draws[:4]) + (", ..." if len(draws) > 4 else "")
    message = (
        f"Informational, not a problem: the data-parallel replicas of ranks {who} take "
        f"different data but hold identical states of {' and '.join(generators)} at the first "
        f"optimizer step, and their training step draws from it (the {by} module's {shown}; "
        "the call site itself is not recorded: the step runs outside the audit window). They "
        "apply the same dropout masks / noise to different samples. The average gradient is "
        "not biased (the masks do not depend on the data), and one seed on every rank is what "
        "accelerate's set_seed(seed), Lightning's seed_everything and transformers' Trainer "
        "do by default; what is lost is the masks' independence across replicas."
    )
    return Finding(
        kind=fk.REPLICA_STREAMS_IDENTICAL,
        severity="info",
        message=message,
        ranks=sorted(r for g in sharing for r in g),
        generator=generators[0],
        remedy=STREAMS_REMEDY,
        details={
            "group": list(ranks),
            "sharing": sharing,
            "generators": generators,
            "draws": draws,
        },
    )
