"""Torchrun-able world-4 set-ups on a device mesh: peers' batches, replicas' shards and weights.

One launch runs every scenario in turn, as told: ``block`` (``rngaudit.audit()`` around the
set-up), ``env`` (``RNGAUDIT=1`` set by the test) or ``none`` (rngaudit never imported: the
truth). Each rank writes ``result-rank<R>.json``: per scenario, the batch it trained on at
each step, a digest of its parameters before its first optimizer step, how many optimizer
steps it took, and what rngaudit raised (and where).
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import gc
import hashlib
import json
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import frozen_libraries  # a sibling: the script's folder is sys.path[0]
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

WATCHDOG_S = float(os.environ.get("RNGAUDIT_SCENARIO_WATCHDOG_S", "300"))
AUDIT_TIMEOUT_S = 60.0
PG_TIMEOUT = datetime.timedelta(seconds=90)
N = 32
DP_GROUPS = [[0, 2], [1, 3]]  # the (2, 2) mesh's data-parallel groups, stated by hand


class Items(Dataset[int]):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> int:
        return i


@dataclass
class Ctx:
    how: str
    rank: int
    world: int
    report_dir: Path
    stage: str = "set-up"
    optimizer_steps: int = 0
    groups: list[list[int]] | None = None  # declared to rngaudit (block: groups=; env: variable)
    notes: dict[str, Any] = field(default_factory=dict)  # what a scenario saw, in its result

    def audited(self, body: Callable[[], Any]) -> Any:
        if self.how != "block":
            return body()
        import rngaudit

        with rngaudit.audit(
            report_dir=self.report_dir, timeout=AUDIT_TIMEOUT_S, groups=self.groups
        ):
            return body()


@dataclass
class Plan:
    loader: Any
    sampler: Any
    step: Callable[[Any], None]
    model: Any  # what the first optimizer step's parameters are read from (the truth)
    epochs: int = 2
    keep: list[Any] = field(default_factory=list)
    # a framework's own loop in place of the loader loop: fills the result's batches and
    # weights, counts ctx.optimizer_steps
    fit: Callable[[dict[str, Any]], None] | None = None


def _mesh() -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))


def _hand_step(ctx: Ctx, model: Any, group: Any, size: int) -> Callable[[Any], None]:
    """The torch tutorial's data-parallel step: backward, gradients averaged with all_reduce."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        ctx.stage = "forward"
        x = torch.as_tensor(batch, dtype=torch.float32).view(-1, 1)
        model(x).sum().backward()
        ctx.stage = "all-reduce"
        for p in model.parameters():
            dist.all_reduce(p.grad, group=group)
            p.grad /= size
        ctx.stage = "optimizer"
        opt.step()
        opt.zero_grad()
        ctx.optimizer_steps += 1
        ctx.stage = "loop"

    return step


def _wrapped_step(ctx: Ctx, model: Any) -> Callable[[Any], None]:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        ctx.stage = "forward"
        x = torch.as_tensor(batch, dtype=torch.float32).view(-1, 1)
        model(x).sum().backward()
        ctx.stage = "optimizer"
        opt.step()
        opt.zero_grad()
        ctx.optimizer_steps += 1
        ctx.stage = "loop"

    return step


def _rng() -> str:
    """A digest of torch's global CPU generator's state (read, never drawn)."""
    return hashlib.blake2b(torch.get_rng_state().numpy().tobytes(), digest_size=8).hexdigest()


def _stream_step(ctx: Ctx, model: Any) -> Callable[[Any], None]:
    """The wrapped step, noting the generator's state before the first forward and at the
    first optimizer step (the truth of what the step drew, and from which state)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(batch: Any) -> None:
        first = not ctx.optimizer_steps
        if first:
            ctx.notes["rng_before_forward"] = _rng()
        ctx.stage = "forward"
        x = torch.as_tensor(batch, dtype=torch.float32).view(-1, 1)
        model(x).sum().backward()
        ctx.stage = "optimizer"
        if first:
            ctx.notes["rng_at_step"] = _rng()
        opt.step()
        opt.zero_grad()
        ctx.optimizer_steps += 1
        ctx.stage = "loop"

    return step


def _loader(ctx: Ctx, sampler: Any) -> Any:
    return ctx.audited(lambda: DataLoader(Items(), batch_size=2, sampler=sampler))


# --------------------------------------------------------------------------- batches


def mesh_dp_sampler(ctx: Ctx) -> Plan:
    """A 2x2 (dp, tp) mesh fed by DistributedSampler(num_replicas=dp size, rank=dp rank): tensor-
    parallel peers take the same batch by design, replicas disjoint shards (intact)."""
    mesh = _mesh()
    dp = mesh["dp"]
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    sampler: DistributedSampler[int] = DistributedSampler(
        Items(), num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
    )
    step = _hand_step(ctx, model, dp.get_group(), dp.size())
    return Plan(_loader(ctx, sampler), sampler, step, model, keep=[mesh])


def mesh_default_sampler(ctx: Ctx) -> Plan:
    """The same mesh fed by DistributedSampler(ds) with its defaults (num_replicas = world): the
    tensor-parallel peers of each replica take different batches at every step."""
    mesh = _mesh()
    dp = mesh["dp"]
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    sampler: DistributedSampler[int] = DistributedSampler(Items(), shuffle=True, seed=0)
    step = _hand_step(ctx, model, dp.get_group(), dp.size())
    return Plan(_loader(ctx, sampler), sampler, step, model, keep=[mesh])


def mesh_ddp_dp_sampler(ctx: Ctx) -> Plan:
    """The mesh, DDP over its dp group, fed by the data-parallel rank (intact)."""
    mesh = _mesh()
    dp = mesh["dp"]
    torch.manual_seed(100 + ctx.rank)  # per-rank init seeds: DDP broadcasts from its rank 0
    inner = torch.nn.Linear(1, 1)
    model = torch.nn.parallel.DistributedDataParallel(inner, process_group=dp.get_group())
    sampler: DistributedSampler[int] = DistributedSampler(
        Items(), num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
    )
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model,
        keep=[mesh],
    )  # fmt: skip


def sampler_stated_no_mesh(ctx: Ctx) -> Plan:
    """No mesh: DistributedSampler(num_replicas=2, rank=rank // 2) states the replicas itself;
    gradients averaged over the ranks that take different data (intact)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    dp_group = None
    for g in ([0, 2], [1, 3]):  # every rank creates every group, in one order
        made = dist.new_group(g)
        if ctx.rank in g:
            dp_group = made
    sampler: DistributedSampler[int] = DistributedSampler(
        Items(), num_replicas=2, rank=ctx.rank // 2, shuffle=True, seed=0
    )  # fmt: skip
    step = _hand_step(ctx, model, dp_group, 2)
    return Plan(_loader(ctx, sampler), sampler, step, model)


def declared_default_sampler(ctx: Ctx) -> Plan:
    """No mesh, the data-parallel groups declared to rngaudit (ranks 0 and 1 peers), fed by
    DistributedSampler's defaults: the peers take different batches."""
    ctx.groups = DP_GROUPS
    torch.manual_seed(0)
    model = torch.nn.Linear(1, 1)
    dp_group = None
    for g in DP_GROUPS:
        made = dist.new_group(g)
        if ctx.rank in g:
            dp_group = made
    sampler: DistributedSampler[int] = DistributedSampler(Items(), shuffle=True, seed=0)
    if ctx.how == "env":
        os.environ["RNGAUDIT_DP_GROUPS"] = ";".join(",".join(map(str, g)) for g in DP_GROUPS)
    step = _hand_step(ctx, model, dp_group, 2)
    return Plan(_loader(ctx, sampler), sampler, step, model)


# --------------------------------------------------------------------------- weights


def _world_sampler() -> Any:
    return DistributedSampler(Items(), shuffle=True, seed=0)  # the world is data-parallel


def _hand_dp(ctx: Ctx, seed: int, broadcast: bool) -> Plan:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    if broadcast:  # every parameter from rank 0 before training
        for p in model.parameters():
            dist.broadcast(p.data, src=0)
    sampler = _world_sampler()
    step = _hand_step(ctx, model, None, ctx.world)
    return Plan(_loader(ctx, sampler), sampler, step, model)


def hand_dp_rank_seeds(ctx: Ctx) -> Plan:
    """The torch tutorial's loop (gradients averaged with all_reduce), per-rank seeds before
    the model is built, no broadcast: every rank trains a different model."""
    return _hand_dp(ctx, 100 + ctx.rank, broadcast=False)


def hand_dp_broadcast(ctx: Ctx) -> Plan:
    """The same with every parameter broadcast from rank 0 before training (intact)."""
    return _hand_dp(ctx, 100 + ctx.rank, broadcast=True)


def hand_dp_same_seed(ctx: Ctx) -> Plan:
    """The same loop with one seed on every rank (intact)."""
    return _hand_dp(ctx, 0, broadcast=False)


def fsdp1_no_shard_rank_seeds(ctx: Ctx) -> Plan:
    """FSDP1 NO_SHARD without sync_module_states, per-rank seeds: replicas differ forever."""
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    torch.manual_seed(100 + ctx.rank)
    inner = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    model = FullyShardedDataParallel(
        inner, device_id=torch.device("cpu"), sharding_strategy=ShardingStrategy.NO_SHARD
    )
    sampler = _world_sampler()
    return Plan(_loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model)


def ddp_rank_seeds(ctx: Ctx) -> Plan:
    """DDP over the world with per-rank init seeds: DDP broadcasts at construction (intact)."""
    torch.manual_seed(100 + ctx.rank)
    inner = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    model = torch.nn.parallel.DistributedDataParallel(inner)
    sampler = _world_sampler()
    return Plan(_loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model)


def accelerate_rank_seeds(ctx: Ctx) -> Plan:
    """accelerate's prepare() (DDP) with per-rank init seeds: DDP broadcasts (intact)."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(100 + ctx.rank)
    inner = torch.nn.Sequential(torch.nn.Linear(1, 4), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(inner.parameters(), lr=0.01)
    sampler: DistributedSampler[int] = _world_sampler()
    model, opt = acc.prepare(inner, opt)

    def step(batch: Any) -> None:
        ctx.stage = "forward"
        x = torch.as_tensor(batch, dtype=torch.float32).view(-1, 1)
        acc.backward(model(x).sum())
        ctx.stage = "optimizer"
        opt.step()
        opt.zero_grad()
        ctx.optimizer_steps += 1
        ctx.stage = "loop"

    return Plan(_loader(ctx, sampler), sampler, step, model)


# --------------------------------------------------------------------------- streams


def _ddp_dropout(ctx: Ctx, dropout: bool, per_rank_after: bool) -> Plan:
    torch.manual_seed(0)  # one seed on every rank (accelerate's set_seed(0)'s default)
    drop = [torch.nn.Dropout(0.5)] if dropout else []
    inner = torch.nn.Sequential(torch.nn.Linear(1, 8), *drop, torch.nn.Linear(8, 1))
    model = torch.nn.parallel.DistributedDataParallel(inner)
    if per_rank_after:  # what set_seed(0, device_specific=True) does, after the model
        torch.manual_seed(0 + ctx.rank)
    sampler = _world_sampler()
    return Plan(_loader(ctx, sampler), sampler, _stream_step(ctx, model), model)


def ddp_dropout_same_seed(ctx: Ctx) -> Plan:
    """DDP with dropout, one seed on every rank: the replicas draw identical masks for
    different samples (informational: the tools' default)."""
    return _ddp_dropout(ctx, dropout=True, per_rank_after=False)


def ddp_dropout_rank_seeds(ctx: Ctx) -> Plan:
    """The same, seeded per rank after the model is built: a stream per replica."""
    return _ddp_dropout(ctx, dropout=True, per_rank_after=True)


def ddp_same_seed_no_dropout(ctx: Ctx) -> Plan:
    """DDP, one seed on every rank, no dropout: the step draws nothing."""
    return _ddp_dropout(ctx, dropout=False, per_rank_after=False)


def mesh_ddp_dropout_same_seed(ctx: Ctx) -> Plan:
    """The (dp, tp) mesh, DDP with dropout over its dp group, one seed on every rank: the
    replicas (0, 2 and 1, 3) share a stream; so do the tp peers (0, 1 and 2, 3), as meant."""
    mesh = _mesh()
    dp = mesh["dp"]
    torch.manual_seed(0)
    inner = torch.nn.Sequential(
        torch.nn.Linear(1, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1)
    )  # fmt: skip
    model = torch.nn.parallel.DistributedDataParallel(inner, process_group=dp.get_group())
    sampler: DistributedSampler[int] = DistributedSampler(
        Items(), num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
    )
    return Plan(_loader(ctx, sampler), sampler, _stream_step(ctx, model), model, keep=[mesh])


def fsdp2_1d_rank_seeds(ctx: Ctx) -> Plan:
    """FSDP2 fully_shard on a 1-D mesh, per-rank seeds: each rank keeps its own shard, no
    replicas (intact)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (ctx.world,), mesh_dim_names=("dp_shard",))
    torch.manual_seed(100 + ctx.rank)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=mesh)
    sampler = _world_sampler()
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh]
    )  # fmt: skip


def tp_parallelize_rank_seeds(ctx: Ctx) -> Plan:
    """Tensor parallelism (parallelize_module on a 1-D "tp" mesh, per-rank seeds): distributed
    from the mesh's first rank; every rank a peer of one replica, fed the same batch (intact)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (ctx.world,), mesh_dim_names=("tp",))
    torch.manual_seed(100 + ctx.rank)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "1": RowwiseParallel()})
    sampler: DistributedSampler[int] = DistributedSampler(
        Items(), num_replicas=1, rank=0, shuffle=True, seed=0
    )
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh]
    )  # fmt: skip


def _hsdp(ctx: Ctx, seed: int) -> Plan:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=mesh)  # HSDP: shards over dp_shard, replicas over dp_replicate
    sampler = _world_sampler()
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh]
    )  # fmt: skip


def hsdp_rank_seeds(ctx: Ctx) -> Plan:
    """HSDP (FSDP2 fully_shard on a (dp_replicate, dp_shard) mesh), per-rank seeds, no
    broadcast: each replica's shards come from different initialisations."""
    return _hsdp(ctx, 100 + ctx.rank)


def hsdp_same_seed(ctx: Ctx) -> Plan:
    """The same with one seed on every rank (intact)."""
    return _hsdp(ctx, 0)


def _fsdp1_hybrid(ctx: Ctx, broadcast: bool) -> Plan:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    torch.manual_seed(100 + ctx.rank)
    inner = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    model = FullyShardedDataParallel(
        inner,
        device_id=torch.device("cpu"),
        sharding_strategy=ShardingStrategy.HYBRID_SHARD,
        device_mesh=mesh,
    )
    if broadcast:  # each local shard over the replicate group (sync_module_states needs a GPU)
        group = mesh.get_group("dp_replicate")
        for p in model.parameters():
            dist.broadcast(p.data, src=dist.get_process_group_ranks(group)[0], group=group)
    sampler: DistributedSampler[int] = _world_sampler()
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh]
    )  # fmt: skip


def fsdp1_hybrid_rank_seeds(ctx: Ctx) -> Plan:
    """HSDP the FSDP1 way (HYBRID_SHARD on a (dp_replicate, dp_shard) mesh), per-rank seeds,
    no sync_module_states: each replica's shard comes from a different initialisation."""
    return _fsdp1_hybrid(ctx, broadcast=False)


def fsdp1_hybrid_broadcast(ctx: Ctx) -> Plan:
    """The same with each local shard broadcast over the replicate group first (intact)."""
    return _fsdp1_hybrid(ctx, broadcast=True)


# --------------------------------------------------------------------------- framework meshes


def _tp_fsdp(mesh: Any, tp: str, shard: str) -> Any:
    """A model parallelized over the ``tp`` dim and FSDP2-sharded over ``shard``, as the
    frameworks do it (per-rank init seeds: distributed from each tp group's first rank)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    parallelize_module(model, mesh[tp], {"0": ColwiseParallel(), "1": RowwiseParallel()})
    fully_shard(model, mesh=mesh[shard])
    return model


def _accelerate_pc(ctx: Ctx, by_dp_rank: bool) -> Plan:
    """The mesh accelerate 1.15's ParallelismConfig builds (Accelerator.__init__ calls
    get_device_mesh(device.type) and then refuses a CPU process group: MULTI_CPU is not
    FSDP2 nor Multi{Device}): dims (dp_shard, tp), flattened dp, dp_shard_cp and dp_cp; the
    model parallelized over tp and sharded over dp_shard_cp as its prepare() does."""
    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.state import AcceleratorState

    pc = ParallelismConfig(dp_shard_size=2, tp_size=2)
    AcceleratorState._reset_state()  # a fresh Accelerator (accelerate_rank_seeds made one)
    try:  # builds the mesh, then refuses the CPU process group
        Accelerator(cpu=True, parallelism_config=pc)
    except ValueError as exc:
        ctx.notes["accelerator_refused"] = str(exc)
    mesh = pc.get_device_mesh("cpu")  # the mesh the Accelerator built
    torch.manual_seed(100 + ctx.rank)
    model = _tp_fsdp(mesh, "tp", pc.fsdp_dim_names[0])
    dp = mesh["dp"]
    sampler: DistributedSampler[int] = (
        DistributedSampler(
            Items(), num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
        )
        if by_dp_rank
        else DistributedSampler(Items(), shuffle=True, seed=0)
    )
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh, pc]
    )  # fmt: skip


def accelerate_pc_dp_sampler(ctx: Ctx) -> Plan:
    """accelerate's ParallelismConfig(dp_shard_size=2, tp_size=2) mesh, fed by the dp rank
    (intact)."""
    return _accelerate_pc(ctx, by_dp_rank=True)


def accelerate_pc_default_sampler(ctx: Ctx) -> Plan:
    """The same fed by DistributedSampler's defaults: tp peers take different batches."""
    return _accelerate_pc(ctx, by_dp_rank=False)


def accelerate_pc_hsdp_rank_seeds(ctx: Ctx) -> Plan:
    """HSDP on accelerate's ParallelismConfig(dp_replicate_size=2, dp_shard_size=2) mesh, as
    its prepare() shards (fully_shard over ("dp_replicate", "dp_shard_cp")), per-rank seeds,
    no broadcast: each replica's shards come from different initialisations."""
    from accelerate.parallelism_config import ParallelismConfig
    from torch.distributed.fsdp import fully_shard

    pc = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2)
    mesh = pc.get_device_mesh("cpu")
    torch.manual_seed(100 + ctx.rank)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=mesh[tuple(pc.fsdp_dim_names)])
    sampler = _world_sampler()
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[mesh, pc]
    )  # fmt: skip


@dataclass
class TitanParallelDims:
    """torchtitan's ``ParallelDims`` mesh construction, both ways torchtitan has built it
    (written from its ``torchtitan/distributed/parallel_dims.py``, pytorch/torchtitan)."""

    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    pp: int = 1

    def build_mesh(self) -> Any:
        """``_build_mesh_without_ep`` (its ``build_mesh`` until the ``_unflatten`` rewrite):
        every dim above 1 in the order pp, dp_replicate, dp_shard, cp, tp; then "dp" (data
        loading), "dp_shard_cp" (parameter sharding) and "dp_cp" (loss all-reduce) flattened
        from it. Returns the mesh."""
        from torch.distributed.device_mesh import init_device_mesh

        dims, names = [], []
        for d, name in zip(
            [self.pp, self.dp_replicate, self.dp_shard, self.cp, self.tp],
            ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
            strict=True,
        ):
            if d > 1:
                dims.append(d)
                names.append(name)
        mesh = init_device_mesh("cpu", tuple(dims), mesh_dim_names=tuple(names))
        dp, dp_shard_cp, dp_cp = [], [], []
        if self.dp_replicate > 1:
            dp.append("dp_replicate")
            dp_cp.append("dp_replicate")
        if self.dp_shard > 1:
            dp.append("dp_shard")
            dp_shard_cp.append("dp_shard")
            dp_cp.append("dp_shard")
        if self.cp > 1:
            dp_shard_cp.append("cp")
            dp_cp.append("cp")
        for flat, parts in (("dp", dp), ("dp_shard_cp", dp_shard_cp), ("dp_cp", dp_cp)):
            if parts:
                mesh[tuple(parts)]._flatten(mesh_dim_name=flat)
        return mesh

    def build_mesh_unflatten(self) -> dict[str, Any]:
        """Its ``build_mesh`` now: a 1-D world mesh, unflattened into a data mesh
        (dp = dp_replicate x dp_shard, cp, tp: "dp" decides what a rank reads; dp_cp flattened
        from it for the loss) and a computation mesh (dp_replicate, dp_shard_cp, tp). Returns
        the data and computation meshes."""
        from torch.distributed.device_mesh import init_device_mesh

        world = init_device_mesh(
            "cpu",
            (self.pp * self.dp_replicate * self.dp_shard * self.cp * self.tp,),
            mesh_dim_names=("world",),  # torch 2.13 unflattens only a named dim
        )
        data = [
            ("pp", self.pp),
            ("dp", self.dp_replicate * self.dp_shard),
            ("cp", self.cp),
            ("tp", self.tp),
        ]
        compute = [
            ("pp", self.pp), ("dp_replicate", self.dp_replicate),
            ("dp_shard_cp", self.dp_shard * self.cp if self.dp_shard > 1 else 1), ("tp", self.tp),
        ]  # fmt: skip
        meshes = {}
        for key, dims in (("data", data), ("compute", compute)):
            kept = [(n, d) for n, d in dims if d > 1]
            meshes[key] = world._unflatten(
                0, tuple(d for _, d in kept), tuple(n for n, _ in kept)
            )  # fmt: skip
        cp = ("dp", "cp") if self.cp > 1 else ("dp",)
        meshes["data"][cp]._flatten(mesh_dim_name="dp_cp")
        meshes["world"] = world
        return meshes


def _titan(ctx: Ctx, by_dp_rank: bool, unflatten: bool = False) -> Plan:
    """A torchtitan-style (dp_shard 2, cp 2) mesh: dp_shard_cp and dp_cp flatten the whole
    world; the model sharded over dp_shard_cp (context-parallel peers shard the sequence
    inside the step, fed the same batch)."""
    from torch.distributed.fsdp import fully_shard

    dims = TitanParallelDims(dp_replicate=1, dp_shard=2, cp=2, tp=1)
    if unflatten:
        meshes = dims.build_mesh_unflatten()
        shard, dp, keep = meshes["compute"]["dp_shard_cp"], meshes["data"]["dp"], [meshes]
    else:
        mesh = dims.build_mesh()
        shard, dp, keep = mesh["dp_shard_cp"], mesh["dp"], [mesh]
    torch.manual_seed(100 + ctx.rank)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=shard)
    sampler: DistributedSampler[int] = (
        DistributedSampler(
            Items(), num_replicas=dp.size(), rank=dp.get_local_rank(), shuffle=True, seed=0
        )
        if by_dp_rank
        else DistributedSampler(Items(), shuffle=True, seed=0)
    )
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=keep
    )  # fmt: skip


def titan_dims_dp_sampler(ctx: Ctx) -> Plan:
    """torchtitan-style ParallelDims(dp_shard=2, cp=2), fed by the dp rank (intact)."""
    return _titan(ctx, by_dp_rank=True)


def titan_dims_default_sampler(ctx: Ctx) -> Plan:
    """The same fed by DistributedSampler's defaults: cp peers take different batches."""
    return _titan(ctx, by_dp_rank=False)


def titan_unflatten_dp_sampler(ctx: Ctx) -> Plan:
    """torchtitan's current ParallelDims (meshes unflattened from the world), fed by the
    data mesh's dp rank (intact)."""
    return _titan(ctx, by_dp_rank=True, unflatten=True)


def titan_unflatten_default_sampler(ctx: Ctx) -> Plan:
    """The same fed by DistributedSampler's defaults: cp peers take different batches."""
    return _titan(ctx, by_dp_rank=False, unflatten=True)


def titan_unflatten_hsdp_same_seed(ctx: Ctx) -> Plan:
    """HSDP on torchtitan's current ParallelDims(dp_replicate=2, dp_shard=2) computation mesh
    (dp_replicate, dp_shard_cp), one seed on every rank (intact)."""
    from torch.distributed.fsdp import fully_shard

    meshes = TitanParallelDims(dp_replicate=2, dp_shard=2, cp=1, tp=1).build_mesh_unflatten()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))
    fully_shard(model, mesh=meshes["compute"])
    sampler = _world_sampler()
    return Plan(
        _loader(ctx, sampler), sampler, _wrapped_step(ctx, model), model, keep=[meshes]
    )  # fmt: skip


def _lightning(ctx: Ctx, own_sampler: bool) -> Plan:
    """Lightning 2.6's ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2) on
    CPU / gloo: Trainer.fit builds its (data_parallel, tensor_parallel) mesh; the module is
    parallelized and sharded in configure_model."""
    import pytorch_lightning as pl
    from pytorch_lightning.strategies import ModelParallelStrategy

    result: dict[str, Any] = {}

    class Module(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Linear(8, 1))

        def configure_model(self) -> None:
            self.net = _tp_fsdp(self.device_mesh, "tensor_parallel", "data_parallel")

        def on_train_epoch_start(self) -> None:
            ctx.stage = f"epoch {self.current_epoch}"
            result["batches"].append([])

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if not ctx.optimizer_steps and "weights" not in result:
                result["weights"] = _digest(self)
            result["batches"][-1].append([int(i) for i in batch.tolist()])
            ctx.stage = "forward"
            return self.net(batch.float().view(-1, 1)).sum()

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            ctx.stage = "optimizer"

        def on_train_batch_end(self, *args: Any) -> None:
            ctx.optimizer_steps += 1
            ctx.stage = "loop"

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> Any:
            if own_sampler:  # the classic mistake: sharded over the world
                sampler: DistributedSampler[int] = DistributedSampler(Items(), shuffle=True, seed=0)
                return DataLoader(Items(), batch_size=2, sampler=sampler)
            return DataLoader(Items(), batch_size=2, shuffle=True)

    torch.manual_seed(100 + ctx.rank)
    module = Module()
    trainer = pl.Trainer(
        accelerator="cpu", devices=ctx.world, max_epochs=2,
        strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2),
        use_distributed_sampler=not own_sampler, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip

    def fit(out: dict[str, Any]) -> None:
        result.update(out)
        try:
            ctx.audited(lambda: trainer.fit(module))  # the block wraps the whole fit
        finally:
            out.update(result)

    return Plan(None, None, lambda batch: None, module, fit=fit)


def lightning_mp_sampler(ctx: Ctx) -> Plan:
    """Lightning's own distributed sampler (sharded by the data-parallel rank) (intact)."""
    return _lightning(ctx, own_sampler=False)


def lightning_mp_default_sampler(ctx: Ctx) -> Plan:
    """The module's own DistributedSampler(ds) with use_distributed_sampler=False: the
    tensor-parallel peers take different batches."""
    return _lightning(ctx, own_sampler=True)


SCENARIOS: dict[str, Callable[[Ctx], Plan]] = {
    # no mesh first: a mesh built by a scenario may outlive it (torch caches meshes), and the
    # last built states the layout
    # first: under RNGAUDIT=1 its model is built inside the window (until the first loader's
    # first batch), so the finding names the initialisation's line
    "hand_dp_rank_seeds": hand_dp_rank_seeds,
    "sampler_stated_no_mesh": sampler_stated_no_mesh,
    "hand_dp_broadcast": hand_dp_broadcast,
    "hand_dp_same_seed": hand_dp_same_seed,
    "fsdp1_no_shard_rank_seeds": fsdp1_no_shard_rank_seeds,
    "ddp_rank_seeds": ddp_rank_seeds,
    "accelerate_rank_seeds": accelerate_rank_seeds,
    "ddp_dropout_same_seed": ddp_dropout_same_seed,
    "ddp_dropout_rank_seeds": ddp_dropout_rank_seeds,
    "ddp_same_seed_no_dropout": ddp_same_seed_no_dropout,
    "fsdp2_1d_rank_seeds": fsdp2_1d_rank_seeds,
    "hsdp_rank_seeds": hsdp_rank_seeds,
    "hsdp_same_seed": hsdp_same_seed,
    "fsdp1_hybrid_rank_seeds": fsdp1_hybrid_rank_seeds,
    "fsdp1_hybrid_broadcast": fsdp1_hybrid_broadcast,
    "tp_parallelize_rank_seeds": tp_parallelize_rank_seeds,
    "mesh_dp_sampler": mesh_dp_sampler,
    "mesh_default_sampler": mesh_default_sampler,
    "mesh_ddp_dp_sampler": mesh_ddp_dp_sampler,
    "mesh_ddp_dropout_same_seed": mesh_ddp_dropout_same_seed,
    "accelerate_pc_dp_sampler": accelerate_pc_dp_sampler,
    "accelerate_pc_default_sampler": accelerate_pc_default_sampler,
    "titan_dims_dp_sampler": titan_dims_dp_sampler,
    "titan_dims_default_sampler": titan_dims_default_sampler,
    "titan_unflatten_dp_sampler": titan_unflatten_dp_sampler,
    "titan_unflatten_default_sampler": titan_unflatten_default_sampler,
    "accelerate_pc_hsdp_rank_seeds": accelerate_pc_hsdp_rank_seeds,
    "titan_unflatten_hsdp_same_seed": titan_unflatten_hsdp_same_seed,
    "lightning_mp_sampler": lightning_mp_sampler,
    "lightning_mp_default_sampler": lightning_mp_default_sampler,
    # last: a declaration holds for the rest of the process
    "declared_default_sampler": declared_default_sampler,
}


# --------------------------------------------------------------------------- running


def _digest(model: Any) -> str:
    """A digest of this rank's local parameters (a DTensor's local shard)."""
    h = hashlib.blake2b(digest_size=8)
    for p in model.parameters():
        t = p.detach()
        local = getattr(t, "to_local", None)
        t = local() if callable(local) else t
        h.update(t.contiguous().view(-1).to(torch.float64).numpy().tobytes())
    return h.hexdigest()


def _session_findings(ctx: Ctx) -> list[dict[str, Any]]:
    """The findings this process's audit session holds (none unaudited)."""
    if ctx.how == "none":
        return []
    from rngaudit.ranks import session

    found = session._sessions.get(ctx.report_dir.resolve())
    return [dict(f.to_dict()) for f in found.findings] if found is not None else []


def run_one(name: str, ctx: Ctx) -> dict[str, Any]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        before = len(_session_findings(ctx))
        out = _run_one(name, ctx)
        out["findings"] = _session_findings(ctx)[before:]  # what this scenario added
    out["rngaudit_warnings"] = [
        str(w.message)[:300] for w in caught if w.category.__name__ == "RNGAuditWarning"
    ]
    return out


def _run_one(name: str, ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {"batches": [], "raised": False}
    plan = None
    try:
        plan = SCENARIOS[name](ctx)
        if plan.fit is not None:
            plan.fit(out)
        for epoch in range(plan.epochs if plan.fit is None else 0):
            ctx.stage = f"epoch {epoch}"
            plan.sampler.set_epoch(epoch)
            batches: list[list[int]] = []
            out["batches"].append(batches)
            for batch in plan.loader:
                if not ctx.optimizer_steps and "weights" not in out:
                    out["weights"] = _digest(plan.model)  # as the first step would train it
                batches.append([int(i) for i in batch.tolist()])
                plan.step(batch)
    except Exception as exc:
        if type(exc).__module__.split(".")[0] != "rngaudit":
            raise
        report: Any = getattr(exc, "report", None)
        out.update(
            raised=True,
            stage=ctx.stage,
            error_type=type(exc).__name__,
            message=str(exc),
            kinds=sorted({f.kind for f in report.findings}) if report is not None else [],
        )
    out["optimizer_steps"] = ctx.optimizer_steps
    out.update(ctx.notes)
    if plan is not None and "weights" not in out:
        out["weights"] = _digest(plan.model)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir", type=Path)
    parser.add_argument("--how", choices=("block", "env", "none"), required=True)
    parser.add_argument("--only", default="", help="comma-separated scenario names")
    args = parser.parse_args(argv)
    faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
    dist.init_process_group(backend="gloo", timeout=PG_TIMEOUT)
    rank, world = dist.get_rank(), dist.get_world_size()
    args.outdir.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    frozen_libraries.freeze(("accelerate", "pytorch_lightning"))
    results: dict[str, Any] = {}
    status = 0
    started = time.perf_counter()
    try:
        for name in names:
            ctx = Ctx(args.how, rank, world, args.outdir / "report")
            t0 = time.perf_counter()
            try:
                results[name] = run_one(name, ctx)
            except Exception:
                traceback.print_exc()
                results[name] = {"crashed": traceback.format_exc()}
                status = 1
            results[name]["seconds"] = time.perf_counter() - t0
            gc.collect()
            dist.barrier()
        results["_meta"] = {
            "rngaudit_imported": "rngaudit" in sys.modules,
            "world": world,
            "seconds": time.perf_counter() - started,
        }
        path = args.outdir / f"result-rank{rank}.json"
        path.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    finally:
        faulthandler.cancel_dump_traceback_later()
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
