"""Thousands of generators in one window: a bounded report, nothing held after, verdicts kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import run_python

from rngaudit import findings as fk
from rngaudit.capture import naming
from rngaudit.ranks import rules

N = 3000  # generators of each family: well beyond naming.NAMED_PER_FAMILY

# One process, one audit: N numpy generators created, N torch generators drawn from, then a
# loader whose sampler has its own generator (seeded with argv[2]) draws its order inside the
# block, before its first batch (a sampler iterated outside any loader proves nothing).
MANY = r"""
import gc, json, sys, weakref
import numpy as np, torch
import rngaudit
from rngaudit import report_files
from torchdata.stateful_dataloader import StatefulDataLoader
n, seed, report_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]

class Perm(torch.utils.data.Sampler):  # draws its whole order when its iterator is made
    def __init__(self, generator):
        self.generator = generator
    def __len__(self):
        return 16
    def __iter__(self):
        return iter(torch.randperm(16, generator=self.generator).tolist())

def numpy_alive():
    return sum(isinstance(o, np.random.Generator) for o in gc.get_objects())

torch_refs = []
with rngaudit.audit(report_dir=report_dir, mode="report") as audit:
    for i in range(n):
        np.random.default_rng(i)
        g = torch.Generator().manual_seed(i)
        torch_refs.append(weakref.ref(g))
        torch.rand(1, generator=g)
        del g
    gc.collect()
    numpy_during = numpy_alive()
    own = torch.Generator().manual_seed(seed)
    loader = StatefulDataLoader(range(16), sampler=Perm(own), batch_size=None)
    loader.state_dict()  # makes its iterator: the order is drawn before the first batch
    del loader, own
report_files.flush()
del audit
gc.collect()
print(json.dumps({
    "numpy_during": numpy_during,
    "numpy_after": numpy_alive(),
    "torch_after": sum(r() is not None for r in torch_refs),
    "torch_total": len(torch_refs),
}))
"""


def run_many(tmp_path: Path, seed: int) -> tuple[dict[str, Any], Path]:
    report_dir = tmp_path / f"report-{seed}"
    proc = run_python(["-c", MANY, str(N), str(seed), str(report_dir)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), report_dir


def test_many_generators_bound_the_report_release_everything_and_keep_the_verdict(
    tmp_path: Path,
) -> None:
    alive, report_dir = run_many(tmp_path, 1)
    # nothing the audit saw is held once the block is over; inside it, at most the named ones
    assert alive["torch_total"] == N and alive["torch_after"] == 0
    assert alive["numpy_after"] == 0
    assert alive["numpy_during"] <= naming.NAMED_PER_FAMILY
    rank_file = report_dir / "rank-0.json"
    # 2 x 3000 events unbounded (about 2.6 MB); bounded: the named ones and one per call site
    assert rank_file.stat().st_size < 400_000
    doc = json.loads(rank_file.read_text())
    events = doc["record"]["events"]
    assert len(events) <= 2 * (naming.NAMED_PER_FAMILY + 1) + 2
    beyond = [e for e in events if naming.is_aggregate(e["generator"])]
    counts = {(e["generator"], e["kind"]): e["count"] for e in beyond if not e["sampler"]}
    over = N - naming.NAMED_PER_FAMILY
    assert counts[(f"numpy.Generator#>{naming.NAMED_PER_FAMILY}", "create")] == over
    assert counts[(f"torch.Generator#>{naming.NAMED_PER_FAMILY}", "draw")] == over
    assert all(e["aggregated"]["digest"] for e in beyond)
    notice = [f for f in doc["findings"] if f["kind"] == fk.EVENTS_AGGREGATED]
    assert len(notice) == 1 and notice[0]["severity"] == "info"
    assert notice[0]["details"]["events"]["numpy.Generator"] == over
    assert doc["verdict"] == "ok"
    merged = json.loads((report_dir / "report.json").read_text())
    assert [f["kind"] for f in merged["findings"]] == [fk.EVENTS_AGGREGATED]

    # Two ranks: the same run (the sampler seeded alike) agrees; a sampler generator seeded
    # differently (beyond the named ones: its draw is in an aggregate) is still an error.
    _, other_dir = run_many(tmp_path, 2)
    same = doc["record"]
    other = json.loads((other_dir / "rank-0.json").read_text())["record"]

    def as_rank(rec: dict[str, Any], rank: int) -> dict[str, Any]:
        out = {**rec, "rank": rank, "audit_index": 0}
        out["signature"] = rules.signature(out)  # type: ignore[arg-type]
        return out

    alike = rules.compare([as_rank(same, 0), as_rank(same, 1)], 2, [])  # type: ignore[list-item]
    assert [f.kind for f in alike] == [fk.EVENTS_AGGREGATED]
    unlike = rules.compare([as_rank(same, 0), as_rank(other, 1)], 2, [])  # type: ignore[list-item]
    kinds = [f.kind for f in unlike]
    assert fk.SAMPLER_DRAW_DIVERGENCE in kinds, [f.message for f in unlike]
    sampler = next(f for f in unlike if f.kind == fk.SAMPLER_DRAW_DIVERGENCE)
    assert sampler.generator == f"torch.Generator#>{naming.NAMED_PER_FAMILY}"
