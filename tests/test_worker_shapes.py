"""Issue 22's shapes of duplicated worker streams, judged by the draws; their correct twins.

The truth is measured first with no rngaudit: the draw values each worker really makes (a
value two workers both drew is a duplicated stream). Every shape sits in one column of one
loader (tests/worker_shapes.py), so each cell of the matrix (a start method, map-style or
iterable, persistent workers over two epochs or not, an entry point) costs one audited and
one plain run of all shapes; the ``RNGAUDIT=warn`` cells share one audited and one plain
process. Cells: ``with rngaudit.audit()`` under fork (map, iterable), spawn (persistent) and
forkserver (iterable); ``RNGAUDIT=warn`` under fork (map, iterable), spawn (persistent) and
forkserver (map). The collate_fn shape is in every cell. A closure or a lambda holding the
generator (``closure``, ``lambda_in_compose``) exists only under fork, by nature: PyTorch
pickles the dataset to spawn and forkserver workers, and a closure or a lambda cannot be
pickled, so those loaders hold a plain function there instead.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch
import worker_shapes as ws
from conftest import run_python

import rngaudit

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
    pytest.mark.filterwarnings("ignore::rngaudit.RNGAuditWarning"),
]

DUP = "worker-duplicate-stream"
GOOD_LABEL = "worker_shapes.GoodShapes"


def _expected(method: str, iterable: bool) -> dict[str, str]:
    out = {}
    for column, holder in ws.BAD.items():
        if method != "fork" and column in ws.FORK_ONLY:
            continue  # PyTorch cannot pickle a closure or a lambda to these workers
        if iterable and holder.startswith("dataset."):
            holder = "dataset.shapes." + holder.removeprefix("dataset.")
        out[column] = holder
    return out


def _check(
    name: str,
    plain: dict[str, list[torch.Tensor]],
    audited: dict[str, list[Any]],
    findings: list[dict[str, Any]],
) -> None:
    """One cell: the truth, bit-identical batches, and the verdict on this cell's loaders."""
    cell = ws.cell(name)
    method, iterable = cell["method"], cell["iterable"]
    # the truth, without rngaudit: every bad column duplicated, every good one distinct
    truth_bad, truth_good = ws.truth(plain["bad"], "bad"), ws.truth(plain["good"], "good")
    expected = _expected(method, iterable)
    assert all(truth_bad[c] for c in expected), truth_bad
    assert not any(truth_good.values()), truth_good
    # the audited run made exactly the unaudited run's batches
    for which in ("bad", "good"):
        assert len(plain[which]) == len(audited[which])
        for a, b in zip(plain[which], audited[which], strict=True):
            assert torch.equal(a, torch.as_tensor(b, dtype=torch.float64))
    # the verdict matches the truth: each bad shape named by its holder and its call site
    # (and the correct twins, in the other loader, are named by no error)
    mine = [f for f in findings if f["details"].get("dataset") == ws.label(method, iterable)]
    errors = {
        f["details"]["path"]: f for f in mine if f["kind"] == DUP and f["severity"] == "error"
    }
    assert sorted(errors) == sorted(expected.values()), name
    for holder in expected.values():
        details = errors[holder]["details"]
        assert details["call_sites"] and all(
            "worker_shapes.py:" in s for s in details["call_sites"]
        )
        assert details["worker_ids"] == [0, 1, 2] and details["confirmed"] is True
    assert not [f for f in findings if f["details"].get("dataset") == GOOD_LABEL
                and f["severity"] == "error"]  # fmt: skip
    if cell["persistent"]:
        persistent = {
            f["details"]["path"]
            for f in mine
            if f["kind"] == "persistent-worker-stream" and f["severity"] == "warning"
        }
        assert "dataset.lazy" in persistent and "collate_fn.rng" in persistent


def _as_dicts(findings: list[Any]) -> list[dict[str, Any]]:
    return [f.to_dict() if hasattr(f, "to_dict") else f for f in findings]


def _audited_cell(name: str, report_dir: Path) -> None:
    """One cell in this process: the plain run, then the same loaders inside the block."""
    cell = ws.cell(name)
    torch.manual_seed(0)
    plain = ws.run(**cell)
    torch.manual_seed(0)
    built = ws.loaders(cell["method"], iterable=cell["iterable"], persistent=cell["persistent"])
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:
        epochs = range(cell["epochs"])
        audited = {which: [b for _ in epochs for b in dl] for which, dl in built.items()}
    assert a.report is not None
    _check(name, plain, audited, _as_dicts(a.report.findings))


@pytest.mark.parametrize("name", ["fork", "fork-iterable"])
def test_fork_shapes_with_block(report_dir: Path, name: str) -> None:
    _audited_cell(name, report_dir)
    # raise mode: the correct twins raise nothing
    cell = ws.cell(name)
    torch.manual_seed(0)
    plain_good = ws.run(**cell)["good"]
    torch.manual_seed(0)
    again = ws.loaders("fork", iterable=cell["iterable"])
    list(again["bad"])  # unaudited, so the good loader starts from the plain run's seeds
    with rngaudit.audit(mode="raise", report_dir=report_dir / "raise") as b:
        batches = list(again["good"])
    assert b.report is not None and b.report.verdict != "error"
    assert all(torch.equal(x, y) for x, y in zip(plain_good, batches, strict=True))


@pytest.mark.parametrize("name", ["spawn-persistent", "forkserver-iterable"])
def test_spawned_shapes_with_block(report_dir: Path, name: str) -> None:
    _audited_cell(name, report_dir)


ENV_CELLS = ["fork", "fork-iterable", "forkserver"]  # spawn-persistent: with a block above


def test_rngaudit_env_cells(tmp_path: Path) -> None:
    """RNGAUDIT=warn: every cell in one audited process, compared with one plain process."""
    script = ["-c", f"import sys; sys.path.insert(0, 'tests'); import worker_shapes as ws; "
              f"ws.main({ENV_CELLS!r})"]  # fmt: skip
    env = {"RNGAUDIT": "warn", "RNGAUDIT_REPORT_DIR": str(tmp_path), "PYTHONWARNINGS": "default"}
    with ThreadPoolExecutor(2) as pool:  # the two processes at once: half the wall time
        plain_run = pool.submit(run_python, script)
        audited_run = pool.submit(run_python, script, env)
        plain_proc, audited_proc = plain_run.result(), audited_run.result()
    assert plain_proc.returncode == 0, plain_proc.stderr[-3000:]
    assert audited_proc.returncode == 0, audited_proc.stderr[-3000:]
    plain_out = json.loads(plain_proc.stdout.strip().splitlines()[-1])
    audited_out = json.loads(audited_proc.stdout.strip().splitlines()[-1])
    assert plain_out == audited_out  # bit-identical batches (floats printed exactly)
    assert "share one random stream" in audited_proc.stderr  # warned
    merged = json.loads((tmp_path / "report.json").read_text())
    for name in ENV_CELLS:
        plain = {w: [torch.tensor(b, dtype=torch.float64) for b in bs]
                 for w, bs in plain_out[name].items()}  # fmt: skip
        _check(name, plain, audited_out[name], merged["findings"])


def test_worker_observation_is_undone_and_bounded() -> None:
    """In a worker, the observation ends with the first fetch: nothing is left patched; the
    parent registered the torch kernels that the forked worker uses."""
    code = (
        "import sys; sys.path.insert(0, 'tests'); import json, random, torch, numpy as np\n"
        "from torch.utils.data import DataLoader\n"
        "import worker_shapes as ws\n"
        "from rngaudit.workers.monitor import WorkerMonitor\n"
        "def probe(ds):\n"
        "    import torch.utils.data._utils.fetch as f\n"
        "    return [hasattr(random.Random.random, '__wrapped__'),\n"
        "            hasattr(f._MapDatasetFetcher.fetch, '__wrapped__'),\n"
        "            sys.getprofile() is None]\n"
        "class Probe(torch.utils.data.Dataset):\n"
        "    def __len__(self): return 4\n"
        "    def __getitem__(self, i): return torch.tensor(probe(self), dtype=torch.float64)\n"
        "found = []\n"
        "m = WorkerMonitor(found.append, mode='report'); m.install()\n"
        "rows = torch.cat(list(DataLoader(Probe(), batch_size=1, num_workers=1,"
        " multiprocessing_context='fork'))).tolist()\n"
        "from rngaudit.capture.instrument import torch_ops\n"
        "m.uninstall(); print(json.dumps([rows, torch_ops._keyed_state]))\n"
    )
    proc = run_python(["-c", code])
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows, parent_kernels = json.loads(proc.stdout.strip().splitlines()[-1])
    # the torch kernels were registered in the parent, once, for the forked workers to inherit
    assert parent_kernels == "ready"
    # the first batch is observed (patched, profiled); every later one runs unpatched
    assert rows[0] == [1.0, 1.0, 0.0]
    assert all(row == [0.0, 0.0, 1.0] for row in rows[1:])


def _values(batches: list[torch.Tensor], column: int) -> dict[int, list[float]]:
    by_worker: dict[int, list[float]] = {}
    for row in torch.cat(batches):
        by_worker.setdefault(int(row[0]), []).append(float(row[2 + column]))
    return by_worker


def test_batch_size_one_reseeded_per_sample_is_no_error(report_dir: Path) -> None:
    """batch_size=1: each worker draws once from each held generator in its first batch. A
    generator reseeded per index, or to a constant per sample, is correct code and raises
    nothing; one draw cannot tell the constant reseed from a copied stream, so the copied one
    is an unconfirmed warning at this batch size (confirmed from two draws, see the shapes)."""
    from torch.utils.data import DataLoader

    def run(workers: int) -> list[torch.Tensor]:
        return list(DataLoader(ws.Reseeded(), batch_size=1, num_workers=workers,
                               multiprocessing_context="fork" if workers else None))  # fmt: skip

    plain, serial = run(2), run(0)
    # the truth, without rngaudit: the draw values each worker made
    per_index, constant, shared = (_values(plain, c) for c in range(3))
    assert sorted(per_index) == [0, 1] and len(plain) == 4  # both workers drew, twice each
    assert not set(per_index[0]) & set(per_index[1])  # distinct per index
    # the constant reseed: the same draw in every worker, as without workers (no loss)
    assert set(constant[0]) == set(constant[1]) == {float(serial[0][0][3])}
    assert len({float(b[0][3]) for b in serial}) == 1
    # the copied stream: the workers drew the same values; without workers they all differ
    assert shared[0] == shared[1] and len({float(b[0][4]) for b in serial}) == 4
    with rngaudit.audit(mode="raise", report_dir=report_dir) as a:
        audited = run(2)
    assert all(torch.equal(x, y) for x, y in zip(plain, audited, strict=True))
    assert a.report is not None and a.report.verdict != "error"
    found = {f.details["path"]: f for f in a.report.findings if f.kind == DUP}
    assert "dataset.per_index" not in found
    assert all(f.severity == "warning" and f.details["confirmed"] is False for f in found.values())
    assert "dataset.shared" in found and "unconfirmed" in found["dataset.shared"].message
