"""Never break a correct program: audited loaders yield exactly the unaudited batches.

A property test over loader shapes (map-style and iterable datasets, sized, unsized and
infinite samplers, ``batch_sampler``, batch sizes None / 1 / 7, ``drop_last``, a custom
``collate_fn``, workers forked or spawned, persistent workers, torchdata's
``StatefulDataLoader``, ``Accelerator.prepare()`` with ``dispatch_batches``, ``split_batches``
and ``even_batches=False``, Hugging Face map-style and iterable datasets, a DistributedSampler
of 2 replicas, so that the observed partition and the order check run). Each example is a
list of specs run three ways in real processes (``tests/loader_shapes.py``): unaudited, each
built inside ``with rngaudit.audit()``, and under ``RNGAUDIT=1``; all three must exit 0 and
print the same batches.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from conftest import ROOT, torchrun
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCRIPT = str(ROOT / "tests" / "loader_shapes.py")

_workers: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "workers": st.just(2),
            "start": st.sampled_from(["fork", "fork", "fork", "spawn"]),
            "persistent": st.booleans(),
            "init_fn": st.booleans(),
        }
    ),
)
_accelerate: st.SearchStrategy[dict[str, Any]] = st.one_of(
    st.just({}),
    st.fixed_dictionaries(
        {
            "accelerate": st.sampled_from(
                [{}, {"dispatch_batches": True}, {"split_batches": True}, {"even_batches": False}]
            )
        }
    ),
)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "seed": draw(st.integers(0, 2**16)),
        "dataset": draw(st.sampled_from(["map", "iterable", "infinite", "hf_map", "hf_iterable"])),
        "sampler": draw(st.sampled_from(["none", "random", "seeded", "infinite", "distributed"])),
        "batch_sampler": draw(st.booleans()),
        "batch_size": draw(st.sampled_from([None, 1, 7])),
        "drop_last": draw(st.booleans()),
        "shuffle": draw(st.booleans()),
        "collate": draw(st.booleans()),
        "loader": draw(st.sampled_from(["torch", "stateful"])),
    }
    spec.update(draw(_workers))
    spec.update(draw(_accelerate))
    if spec["sampler"] != "none" and spec["dataset"] in ("map", "hf_map"):
        spec["shuffle"] = False  # a sampler and shuffle=True are refused by DataLoader itself
    if spec.get("accelerate") and spec["dataset"] == "infinite":
        spec["accelerate"] = {k: v for k, v in spec["accelerate"].items() if k != "even_batches"}
    return spec


def _run(mode: str, batch: list[dict[str, Any]], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", HF_DATASETS_OFFLINE="1")
    env["HF_DATASETS_CACHE"] = str(tmp / "hf")
    if mode == "env":
        env.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(tmp / "report"), RNGAUDIT_TIMEOUT="60")
    return subprocess.run(
        [sys.executable, SCRIPT, "with" if mode == "with" else "plain", json.dumps(batch)],
        env=env,
        cwd=str(tmp),
        capture_output=True,
        text=True,
        timeout=240,
    )


@settings(
    max_examples=int(os.environ.get("RNGAUDIT_SHAPE_EXAMPLES", "3")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batch=st.lists(specs(), min_size=3, max_size=5))
def test_audited_loaders_yield_the_unaudited_batches(
    batch: list[dict[str, Any]], tmp_path_factory: Any
) -> None:
    tmp = tmp_path_factory.mktemp("shapes")
    with ThreadPoolExecutor(3) as pool:
        plain, with_block, env = pool.map(lambda m: _run(m, batch, tmp), ["plain", "with", "env"])
    want = _outcome(plain)
    for name, audited in (("with-block", with_block), ("RNGAUDIT=1", env)):
        got, tail = _outcome(audited), f"{name}: {audited.stderr[-3000:]}"
        if want[0] != 0:  # a shape the loader itself refuses: the same refusal, nothing more
            assert got[0] != 0 and got[2] == want[2], tail
            continue
        assert got[0] == 0 and "Traceback" not in audited.stderr, tail
        for spec, a, b in zip(batch, got[1], want[1], strict=True):
            assert a == b, f"{name} changed the batches of {spec}"


def _outcome(proc: subprocess.CompletedProcess[str]) -> tuple[int, Any, str]:
    """Exit code, the batches printed, and the last line of a traceback (the exception)."""
    lines = proc.stderr.strip().splitlines()
    error = lines[-1] if proc.returncode and lines else ""
    return proc.returncode, json.loads(proc.stdout) if proc.returncode == 0 else None, error


VENDORED = str(ROOT / "tests" / "vendored" / "torchdata_in_order.py")


def test_torchdata_in_order_false_tests_pass_audited_as_unaudited(tmp_path: Path) -> None:
    """torchdata 0.11.0's own in_order=False tests (out-of-order index and iterable datasets,
    with and without checkpointing: their batch order is the order the workers finish in)."""

    def run(mode: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RNGAUDIT")}
        report = tmp_path / mode
        env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", RNGAUDIT_REPORT_DIR=str(report))
        if mode in ("1", "report"):
            env["RNGAUDIT"] = mode
        elif mode == "with":
            env["RNGAUDIT_VENDORED_WITH"] = "1"
        proc = subprocess.run(
            [sys.executable, VENDORED], env=env, capture_output=True, text=True, timeout=240
        )
        return proc, report

    from importlib.metadata import version

    pinned = "0.11.0"  # requirements-test.txt; the tests were vendored at this tag
    assert version("torchdata") == pinned, "re-vendor tests/vendored/torchdata_in_order.py"
    with ThreadPoolExecutor(4) as pool:
        runs = dict(
            zip(
                ["plain", "1", "report", "with"],
                pool.map(run, ["plain", "1", "report", "with"]),
                strict=True,
            )
        )
    for mode, (proc, report) in runs.items():
        tail = f"{mode}: {proc.stderr[-3000:]}"
        assert proc.returncode == 0 and "Ran 7 tests" in proc.stderr, tail
        assert proc.stderr.rstrip().endswith("OK"), tail
        if mode == "plain":
            assert not report.exists()
            continue
        ranks = json.loads((report / "report.json").read_text())["ranks"]  # it was audited
        loaders = [ld for r in ranks for ld in r["loaders"]]
        assert any(ld["loader"].startswith("StatefulDataLoader") for ld in loaders), tail


def test_out_of_order_distributed_loader_keeps_its_order_under_rngaudit(tmp_path: Path) -> None:
    """in_order=False under a DistributedSampler, 2 ranks: the worker check and the order check
    both wrap its iterator (the order check's plain subclass built on the worker check's, which
    recursed without end); the batches come in the order they do unaudited."""
    script = str(ROOT / "tests" / "distributed" / "out_of_order.py")

    def run(audited: bool) -> dict[tuple[int, int], list[int]]:
        env = {"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(tmp_path / "report")} if audited else {}
        proc = torchrun(script, env=env, timeout=240)
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        return {(d["rank"], d["epoch"]): d["order"] for d in lines}

    with ThreadPoolExecutor(2) as pool:
        plain, audited = pool.map(run, [False, True])
    assert len(plain) == 4 and plain[(0, 0)][-2:] == [0, 4]  # worker 0's come last
    assert audited == plain
    assert json.loads((tmp_path / "report" / "report.json").read_text())["ranks"]
