"""Know the mesh: verdicts on world-4 layouts checked against what the ranks really trained on.

Three torchrun launches (world 4, gloo) run every set-up in tests/distributed/mesh_scenarios.py:
without rngaudit (the truth), with ``rngaudit.audit()`` around the set-up, and under
``RNGAUDIT=1``. Among them the meshes the frameworks build: accelerate's ``ParallelismConfig``,
a torchtitan-style ``ParallelDims`` and Lightning's ``ModelParallelStrategy`` (its Trainer.fit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "distributed" / "mesh_scenarios.py"
NPROC = 4
PEERS = [[0, 1], [2, 3]]  # every scenario's peers: one replica's ranks (the others: replicas)

# Stated here, independently of the scenario script; the truth test checks each claim.
# the frameworks' meshes: (mesh-built scenario, its twin fed by DistributedSampler's defaults)
FRAMEWORK_MESHES = {
    "accelerate_pc": "DeviceMesh ('dp_shard': 2, 'tp': 2)",
    "titan_dims": "DeviceMesh ('dp_shard': 2, 'cp': 2)",
    "titan_unflatten": "DeviceMesh ('dp': 2, 'cp': 2)",
    "lightning_mp": "DeviceMesh ('data_parallel': 2, 'tensor_parallel': 2)",
}
PEERS_DIFFER = {"mesh_default_sampler", "declared_default_sampler"} | {
    f"{f}_default_sampler" for f in FRAMEWORK_MESHES
}
WEIGHTS_DIFFER = {
    "hand_dp_rank_seeds", "fsdp1_no_shard_rank_seeds", "hsdp_rank_seeds", "fsdp1_hybrid_rank_seeds",
    "accelerate_pc_hsdp_rank_seeds",
}  # fmt: skip
INTACT = {
    "mesh_dp_sampler", "mesh_ddp_dp_sampler", "sampler_stated_no_mesh", "hand_dp_broadcast",
    "hand_dp_same_seed", "ddp_rank_seeds", "fsdp2_1d_rank_seeds", "tp_parallelize_rank_seeds",
    "hsdp_same_seed", "fsdp1_hybrid_broadcast", "accelerate_rank_seeds",
    "accelerate_pc_dp_sampler", "titan_dims_dp_sampler", "titan_unflatten_dp_sampler",
    "lightning_mp_sampler", "titan_unflatten_hsdp_same_seed",
}  # fmt: skip
# the replicas' random streams: an info finding, never a verdict (all intact)
STREAMS = [
    "ddp_dropout_same_seed", "ddp_dropout_rank_seeds", "ddp_same_seed_no_dropout",
    "mesh_ddp_dropout_same_seed",
]  # fmt: skip
INTACT |= set(STREAMS)
STREAMS_KIND = "replica-streams-identical"
ALL = sorted(PEERS_DIFFER | WEIGHTS_DIFFER | INTACT)
KIND = dict.fromkeys(PEERS_DIFFER, "peer-batch-divergence")
KIND.update(dict.fromkeys(WEIGHTS_DIFFER, "replica-weight-divergence"))
WORLD = [[0, 1, 2, 3]]
DP = [[0, 2], [1, 3]]  # the (2, 2) meshes' replicate groups (the first dim)
# the ranks whose local parameters must be the same (replicas); none for FSDP2 on a 1-D mesh
# (each rank keeps its own shard) and tensor parallelism (one replica)
REPLICATE = {
    "mesh_dp_sampler": DP, "mesh_default_sampler": DP, "mesh_ddp_dp_sampler": DP,
    "sampler_stated_no_mesh": DP, "declared_default_sampler": DP, "hand_dp_rank_seeds": WORLD,
    "hand_dp_broadcast": WORLD, "hand_dp_same_seed": WORLD, "fsdp1_no_shard_rank_seeds": WORLD,
    "ddp_rank_seeds": WORLD, "fsdp2_1d_rank_seeds": [], "tp_parallelize_rank_seeds": [],
    "hsdp_rank_seeds": DP, "hsdp_same_seed": DP, "fsdp1_hybrid_rank_seeds": DP,
    "fsdp1_hybrid_broadcast": DP, "accelerate_rank_seeds": WORLD,
    "ddp_dropout_same_seed": WORLD, "ddp_dropout_rank_seeds": WORLD,
    "ddp_same_seed_no_dropout": WORLD, "mesh_ddp_dropout_same_seed": DP,
}  # fmt: skip
# the frameworks' (dp, tp / cp) meshes shard the model over their data-parallel dim: no
# replicas; their HSDP meshes replicate over dp_replicate
REPLICATE.update({name: [] for name in ALL if name.startswith(tuple(FRAMEWORK_MESHES))})
REPLICATE.update(accelerate_pc_hsdp_rank_seeds=DP, titan_unflatten_hsdp_same_seed=DP)
# batches: the peers of one replica (none where the world is data-parallel)
PEER_GROUPS = dict.fromkeys(ALL, PEERS)
WORLD_DATA_PARALLEL = [  # the world is one data-parallel group: no peers
    "fsdp1_no_shard_rank_seeds", "ddp_rank_seeds", "hand_dp_rank_seeds", "hand_dp_broadcast",
    "hand_dp_same_seed", "fsdp2_1d_rank_seeds", "hsdp_rank_seeds", "hsdp_same_seed",
    "fsdp1_hybrid_rank_seeds", "fsdp1_hybrid_broadcast", "accelerate_rank_seeds",
    "accelerate_pc_hsdp_rank_seeds", "titan_unflatten_hsdp_same_seed",
    "ddp_dropout_same_seed", "ddp_dropout_rank_seeds", "ddp_same_seed_no_dropout",
]  # fmt: skip
PEER_GROUPS.update({name: [] for name in WORLD_DATA_PARALLEL})
PEER_GROUPS["tp_parallelize_rank_seeds"] = WORLD
HOWS = ["block", "env"]


def _launch(outdir: Path, how: str) -> dict[int, dict[str, Any]]:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        f"--nproc_per_node={NPROC}", str(SCRIPT), str(outdir), "--how", how,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    if how == "env":
        env.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(outdir / "report"))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-120:])
    assert proc.returncode == 0, f"{how}: torchrun exited {proc.returncode}\n{tail}"
    results = {r: json.loads((outdir / f"result-rank{r}.json").read_text()) for r in range(NPROC)}
    report = outdir / "report" / "report.json"
    if report.exists():  # the checks the report lists, with their labels
        results[0]["_audits"] = json.loads(report.read_text()).get("audits", [])
        results[0]["_report_dir"] = str(report.parent)
    return results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[int, dict[str, Any]]]:
    return {how: _launch(tmp_path_factory.mktemp(f"mesh-{how}"), how) for how in ("none", *HOWS)}


def _peers_differ(res: dict[int, dict[str, Any]], scenario: str) -> bool:
    """Did the peers of some replica train on different batches (measured unaudited)?"""
    return any(
        res[r][scenario]["batches"] != res[g[0]][scenario]["batches"]
        for g in PEER_GROUPS[scenario]
        for r in g
    )


def _replicas_overlap(res: dict[int, dict[str, Any]], scenario: str) -> bool:
    """Did the replicas (one rank of each) share a sample in some epoch?"""
    firsts = [g[0] for g in PEER_GROUPS[scenario]] or list(range(NPROC))
    epochs = len(res[0][scenario]["batches"])
    for e in range(epochs):
        taken = [i for r in firsts for b in res[r][scenario]["batches"][e] for i in b]
        if len(set(taken)) != len(taken):
            return True
    return False


def _weights_differ(res: dict[int, dict[str, Any]], scenario: str) -> bool:
    """Did replicas hold different local parameters when the first step would train them?"""
    return any(
        len({res[r][scenario]["weights"] for r in g}) > 1 for g in REPLICATE[scenario]
    )  # fmt: skip


def test_unaudited_run_never_imports_rngaudit(runs: dict[str, Any]) -> None:
    assert runs["none"][0]["_meta"]["rngaudit_imported"] is False


@pytest.mark.parametrize("scenario", ALL)
def test_truth_is_what_the_scenario_claims(runs: dict[str, Any], scenario: str) -> None:
    res = runs["none"]
    assert not any(res[r][scenario]["raised"] for r in range(NPROC))
    assert _peers_differ(res, scenario) == (scenario in PEERS_DIFFER)
    assert _weights_differ(res, scenario) == (scenario in WEIGHTS_DIFFER)
    assert not _replicas_overlap(res, scenario)
    assert all(res[r][scenario]["optimizer_steps"] > 0 for r in range(NPROC))


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", ALL)
def test_verdict_matches_truth(runs: dict[str, Any], scenario: str, how: str) -> None:
    truth = runs["none"]
    corrupted = any(
        f(truth, scenario) for f in (_peers_differ, _replicas_overlap, _weights_differ)
    )  # fmt: skip
    for r in range(NPROC):
        got = runs[how][r][scenario]
        assert "crashed" not in got, got.get("crashed")
        if not corrupted:
            assert got["raised"] is False, got.get("message")
            # the audited run trained exactly what the unaudited one did
            assert got["batches"] == truth[r][scenario]["batches"]
            continue
        assert got["raised"] is True, f"rank {r}: not found"
        assert KIND[scenario] in got["kinds"]
        assert got["optimizer_steps"] == 0  # before the first step that would train on it
        if KIND[scenario] == "peer-batch-divergence":  # at the first batch
            assert got["stage"] == "epoch 0", got["stage"]
            assert "Shard by the data-parallel rank" in got["message"]
        else:  # from the first optimizer step's pre-hook
            assert got["stage"] == "optimizer", got["stage"]
            assert "sync_module_states=True" in got["message"]


def test_peer_finding_names_the_layout_and_its_source(runs: dict[str, Any]) -> None:
    for how in HOWS:
        message = runs[how][0]["mesh_default_sampler"]["message"]
        assert "ranks 0, 1; 2, 3 must train on the same batch" in message
        assert "DeviceMesh ('dp': 2, 'tp': 2)" in message
        assert "num_replicas=4" in message
    declared = runs["block"][0]["declared_default_sampler"]["message"]
    assert "rngaudit.audit(groups=[[0, 2], [1, 3]])" in declared
    assert "RNGAUDIT_DP_GROUPS=0,2;1,3" in runs["env"][0]["declared_default_sampler"]["message"]


def test_weights_finding_names_the_group_and_under_rngaudit_the_init_line(
    runs: dict[str, Any],
) -> None:
    for how in HOWS:
        message = runs[how][0]["hand_dp_rank_seeds"]["message"]
        assert "The replicas of ranks 0, 1, 2, 3 hold different weights" in message
        assert "its gradient all-reduced over the group" in message
        fsdp = runs[how][0]["fsdp1_no_shard_rank_seeds"]["message"]
        assert "FullyShardedDataParallel(NO_SHARD)" in fsdp
        hsdp = runs[how][0]["hsdp_rank_seeds"]["message"]
        assert "The replicas of ranks 0, 2 hold different weights" in hsdp
        assert "a DTensor placed Replicate() on mesh dim 0" in hsdp
        accelerate = runs[how][0]["accelerate_pc_hsdp_rank_seeds"]["message"]
        assert "The replicas of ranks 0, 2 hold different weights" in accelerate
        assert "a DTensor placed Replicate() on mesh dim 0" in accelerate
        hybrid = runs[how][1]["fsdp1_hybrid_rank_seeds"]["message"]
        assert "The replicas of ranks 1, 3 hold different weights" in hybrid
        assert "FullyShardedDataParallel(HYBRID_SHARD)" in hybrid
    # the model was built inside RNGAUDIT's window (the block wraps only the loader)
    env = runs["env"][0]["hand_dp_rank_seeds"]["message"]
    assert "mesh_scenarios.py:" in env and "(_hand_dp), whose draws came from" in env
    block = runs["block"][0]["hand_dp_rank_seeds"]["message"]
    assert "its lines are not named" in block


def test_the_frameworks_meshes_are_read_as_the_frameworks_build_them(
    runs: dict[str, Any],
) -> None:
    """accelerate's ParallelismConfig (flattened dp, dp_shard_cp, dp_cp), torchtitan's
    ParallelDims both ways (dp_shard_cp and dp_cp flatten the whole world, and its current
    build unflattens a "world" dim: named neither, they state nothing) and Lightning's
    ModelParallelStrategy: each finding names that mesh. accelerate's Accelerator built its
    mesh and then refused the CPU process group (the mesh is the one it built)."""
    for r in range(NPROC):
        refused = runs["none"][r]["accelerate_pc_dp_sampler"]["accelerator_refused"]
        assert "but got DistributedType.MULTI_CPU" in refused
    for how in HOWS:
        for framework, mesh in FRAMEWORK_MESHES.items():
            for r in range(NPROC):
                message = runs[how][r][f"{framework}_default_sampler"]["message"]
                assert f"ranks 0, 1; 2, 3 must train on the same batch (the {mesh}" in message


# --------------------------------------------------------------------------- streams


def _shared_streams(res: dict[int, dict[str, Any]], scenario: str, rank: int) -> list[list[int]]:
    """Measured unaudited: the ranks of ``rank``'s data-parallel group that held one state of
    torch's CPU generator at the first optimizer step, where every rank's first step drew
    from it (its state moved between the first forward and the step); [] otherwise."""
    group = next(g for g in REPLICATE[scenario] if rank in g)
    notes = {r: res[r][scenario] for r in group}
    if any(n["rng_before_forward"] == n["rng_at_step"] for n in notes.values()):
        return []  # the step drew nothing
    by: dict[str, list[int]] = {}
    for r in group:
        by.setdefault(notes[r]["rng_at_step"], []).append(r)
    return sorted(sorted(g) for g in by.values() if len(g) > 1)


def test_streams_truth_is_what_the_scenarios_claim(runs: dict[str, Any]) -> None:
    res = runs["none"]
    assert _shared_streams(res, "ddp_dropout_same_seed", 0) == [[0, 1, 2, 3]]
    assert _shared_streams(res, "ddp_dropout_rank_seeds", 0) == []  # a state per rank
    assert _shared_streams(res, "ddp_same_seed_no_dropout", 0) == []  # no draw in the step
    no_drop = {res[r]["ddp_same_seed_no_dropout"]["rng_at_step"] for r in range(NPROC)}
    assert len(no_drop) == 1  # identical states, but nothing drawn from them
    mesh = "mesh_ddp_dropout_same_seed"
    assert _shared_streams(res, mesh, 0) == [[0, 2]] and _shared_streams(res, mesh, 1) == [[1, 3]]
    # the tp peers of one replica hold that state too, as meant
    assert len({res[r][mesh]["rng_at_step"] for r in range(NPROC)}) == 1


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("scenario", ALL)
def test_replica_streams_info_matches_truth(runs: dict[str, Any], scenario: str, how: str) -> None:
    """The info finding where replicas' steps drew from one state (measured), on each rank of
    the group, naming the generator, the ranks and the dropout; never raised, never warned;
    nowhere else (peers sharing a state, a state per rank, no draw, no dropout)."""
    for r in range(NPROC):
        got = runs[how][r][scenario]
        infos = [f for f in got.get("findings", []) if f["kind"] == STREAMS_KIND]
        expected = _shared_streams(runs["none"], scenario, r) if scenario in STREAMS else []
        if not expected:
            assert not infos, infos
            continue
        assert len(infos) == 1, infos
        found = infos[0]
        assert found["severity"] == "info"
        assert found["generator"] == "torch.default_generator"
        assert found["details"]["sharing"] == expected
        assert found["ranks"] == expected[0]
        assert "1 (Dropout, p=0.5)" in found["message"]
        assert found["message"].startswith("Informational, not a problem")
        assert "set_seed(seed, device_specific=True)" in found["remedy"]
        assert "torch.manual_seed(seed + dp_rank)" in found["remedy"]
        assert got["raised"] is False and got["rngaudit_warnings"] == []
        assert got["optimizer_steps"] == runs["none"][r][scenario]["optimizer_steps"]


def test_replica_streams_are_in_the_report_and_leave_its_verdict_ok(runs: dict[str, Any]) -> None:
    label = "replicas' random streams at the first optimizer step"
    for how in HOWS:
        audits = [a for a in runs[how][0]["_audits"] if a["label"] == label]
        assert len(audits) == 2 and {a["verdict"] for a in audits} == {"ok"}, audits
        shown = subprocess.run(
            [sys.executable, "-m", "rngaudit", "report", runs[how][0]["_report_dir"]],
            capture_output=True, text=True, timeout=120, cwd=ROOT,
        )  # fmt: skip
        assert f"[info] {STREAMS_KIND}" in shown.stdout, shown.stdout[-2000:]


def test_peers_sharing_a_stream_are_not_reported() -> None:
    from rngaudit.ranks import replicas

    def streams(states: list[str]) -> dict[int, Any]:
        return {
            r: {"generator": "torch.default_generator", "state": s, "draws": ["1 (Dropout)"]}
            for r, s in enumerate(states)
        }

    peers = {0: 0, 1: 0, 2: 1, 3: 1}  # ranks 0, 1 and 2, 3: one replica each
    world = [0, 1, 2, 3]
    assert replicas.streams_finding(world, streams(["a", "a", "b", "b"]), peers) is None
    shared = replicas.streams_finding(world, streams(["a", "a", "a", "a"]), peers)
    assert shared is not None and shared.details["sharing"] == [[0, 1, 2, 3]]
    found = replicas.streams_finding(world, streams(["a", "b", "a", "c"]), None)
    assert found is not None and found.details["sharing"] == [[0, 2]]
    assert found.severity == "info"
    missing = streams(["a", "a", "a", "a"])
    missing[3] = None  # its step draws nothing: no finding
    assert replicas.streams_finding(world, missing, None) is None


def test_replica_streams_info_never_raises_nor_warns_in_any_mode() -> None:
    from rngaudit.ranks import policy, replicas

    streams = {r: {"generator": "g", "state": "s", "draws": []} for r in (0, 1)}
    found = replicas.streams_finding([0, 1], streams, None)
    assert found is not None and found.severity == "info"
    for mode in ("raise", "warn", "report"):
        for strict in (False, True):
            assert not policy.fails(found, mode, strict)
        assert not policy.warns(found, mode)


def test_the_stochastic_modules_and_their_generator_are_read_without_a_draw() -> None:
    import torch

    from rngaudit.ranks import replicas

    net = torch.nn.Sequential(
        torch.nn.Linear(1, 2), torch.nn.Dropout(0.5), torch.nn.Dropout(0.0), torch.nn.RReLU()
    )  # fmt: skip
    before = torch.get_rng_state()
    assert replicas._stochastic(net) == ["1 (Dropout, p=0.5)", "3 (RReLU)"]
    name, _ = replicas._generator_of(next(net.parameters())) or ("", "")
    assert name == "torch.default_generator"
    assert torch.equal(torch.get_rng_state(), before)
    net.eval()  # no draw in eval mode
    assert replicas._stochastic(net) == []


# --------------------------------------------------------------------------- the layout alone


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("dp", "dp"), ("dp_replicate", "dp"), ("dp_shard", "dp"), ("fsdp", "dp"),
        ("replicate", "dp"), ("shard", "dp"), ("data_parallel", "dp"),  # Lightning
        ("tp", "peer"), ("cp", "peer"), ("pp", "peer"), ("tensor_parallel", "peer"),
        ("ep", "unknown"), ("dp_cp", "unknown"), ("dp_shard_cp", "unknown"),
        ("", "unknown"), ("parallel", "unknown"), ("experts", "unknown"), (None, "unknown"),
    ],
)  # fmt: skip
def test_mesh_dim_names_are_read_as_the_frameworks_name_them(name: Any, kind: str) -> None:
    from rngaudit.ranks import layout

    assert layout.dim_kind(name) == kind


def test_groups_make_a_layout_only_when_they_partition_the_world() -> None:
    from rngaudit.ranks import layout

    stated = layout.from_groups([[0, 2], [1, 3]], 4, "declared")
    assert stated is not None and stated.groups() == [[0, 1], [2, 3]] and stated.has_peers()
    assert layout.from_groups([[0, 1, 2, 3]], 4, "x") is not None  # one group: no peers
    assert not layout.from_groups([[0, 1, 2, 3]], 4, "x").has_peers()  # type: ignore[union-attr]
    for bad in ([[0, 2], [1]], [[0, 2], [2, 3]], [[0, 1]], [["a"]], None):
        assert layout.from_groups(bad, 4, "x") is None
    assert layout.parse_groups("0,2;1,3") == [[0, 2], [1, 3]]
    assert layout.parse_groups("0,x") is None


def test_samplers_state_peers_only_when_their_ranks_split_the_world_evenly() -> None:
    from rngaudit.ranks import layout

    stated = layout.sampler_layout(4, {0: [2, 0], 1: [2, 0], 2: [2, 1], 3: [2, 1]})
    assert stated is not None and stated.groups() == [[0, 1], [2, 3]]
    assert layout.sampler_layout(4, {r: [4, r] for r in range(4)}) is None  # the world
    assert layout.sampler_layout(4, {0: [2, 0], 1: [2, 0], 2: [2, 0], 3: [2, 1]}) is None
    assert layout.sampler_layout(4, {0: [2, 0], 1: [2, 1], 2: [2, 0]}) is None  # one missing
    assert layout.sampler_layout(3, {0: [2, 0], 1: [2, 1], 2: [2, 0]}) is None  # uneven


def test_declared_groups_that_are_not_lists_of_ranks_are_a_config_error() -> None:
    import rngaudit
    from rngaudit.errors import ConfigError
    from rngaudit.ranks import layout

    bads: list[Any] = [[[0, "x"]], [0, 1], "0,1", [[]], []]
    for bad in bads:
        with pytest.raises(ConfigError, match="groups="):
            rngaudit.audit(groups=bad)
    try:
        rngaudit.audit(groups=[[0, 2], [1, 3]])
        assert layout._declared[0] == [[0, 2], [1, 3]]
    finally:
        layout.declare(None)


def test_the_report_says_which_replicas_were_used_and_where_they_came_from(
    runs: dict[str, Any],
) -> None:
    for how in HOWS:
        labels = [a["label"] for a in runs[how][0]["_audits"]]
        layout = (
            "across replicas (peers of one replica together): 0, 1; 2, 3; from the DeviceMesh "
            "('dp': 2, 'tp': 2), its dims named dp data-parallel and tp peers"
        )
        # the first batch's check (peers compared) and the epoch's partition (across replicas)
        assert any(lab.startswith("epoch 0 of ") and layout in lab for lab in labels), labels
        assert any(lab.startswith("partition of epoch 0") and layout in lab for lab in labels)
        assert any("from the DistributedSampler's own num_replicas=2" in lab for lab in labels)
