"""Report size and writing cost: thousands of parameter draws, distinct sites, repeated audits."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
import torch
from torch import nn

import rngaudit
from rngaudit.reports import files

TMP_PREFIX = "rngaudit-bench-report-"  # removed at exit, with the generated files and reports


def layer_stack(layers: int) -> nn.Module:
    """A stack of many small layers, built in a loop: 2 parameter draws per layer."""
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(layers)])


def distinct_sites_module(path: Path, lines: int) -> Any:
    """A user module with ``lines`` distinct layer-building lines (2 events per line)."""
    body = [f"    model.l{i} = nn.Linear(8, 8)" for i in range(lines)]
    path.write_text(
        "from torch import nn\n\n\ndef build():\n    model = nn.Module()\n"
        + "\n".join(body)
        + "\n    return model\n"
    )
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sizes(report_dir: Path) -> dict[str, int]:
    return {
        "rank_bytes": files.rank_path(report_dir, 0).stat().st_size,
        "merged_bytes": files.merged_path(report_dir).stat().st_size,
    }


def audited(report_dir: Path, fn: Any) -> tuple[rngaudit.Audit, float]:
    """Run ``fn`` in an audit window; returns the audit and the seconds from its exit until its
    files are written (conclude, then the background write: ``wait_for_reports``)."""
    audit = rngaudit.audit(mode="report", report_dir=report_dir)
    audit.__enter__()
    try:
        fn()
    finally:
        start = time.perf_counter()
        audit.__exit__(None, None, None)
        rngaudit.wait_for_reports()
    return audit, time.perf_counter() - start


def counts(audit: rngaudit.Audit) -> tuple[int, int]:
    """(events, draws) in the audit's own rank record."""
    assert audit.report is not None
    events = audit.report.ranks[0]["events"]
    return len(events), sum(int(e["count"]) for e in events)


def encode_costs(doc: dict[str, Any], reps: int = 5) -> dict[str, float]:
    """Seconds to serialise one rank document as the report writer does vs. compactly."""

    def best(fn: Any) -> float:
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    class Sink:
        def write(self, _: str) -> None:
            pass

    return {
        "indent1_dump_s": best(lambda: json.dump(doc, Sink(), indent=1)),  # the former encoding
        "compact_dumps_s": best(lambda: json.dumps(doc, separators=(",", ":"))),
        "compact_bytes": len(json.dumps(doc, separators=(",", ":"))),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=2000)
    parser.add_argument("--lines", type=int, default=400, help="distinct layer lines")
    parser.add_argument("--repeat", type=int, default=6, help="audits into one report dir")
    args = parser.parse_args()
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    out: dict[str, Any] = {}

    # 1. Thousands of parameter draws from a loop: aggregated per call site.
    audit, exit_s = audited(tmp / "stack", lambda: layer_stack(args.layers))
    events, draws = counts(audit)
    out["stack"] = {"layers": args.layers, "events": events, "draws": draws, "exit_s": exit_s}
    out["stack"].update(sizes(tmp / "stack"))

    # 2. Every layer built on its own source line: one event per (site, parameter).
    module = distinct_sites_module(tmp / "rngaudit_bench_sites.py", args.lines)
    audit, exit_s = audited(tmp / "sites", module.build)
    events, draws = counts(audit)
    out["sites"] = {"lines": args.lines, "events": events, "draws": draws, "exit_s": exit_s}
    out["sites"].update(sizes(tmp / "sites"))
    out["sites"]["bytes_per_event"] = out["sites"]["rank_bytes"] / max(1, events)
    doc = json.loads(files.rank_path(tmp / "sites", 0).read_text())
    out["sites"].update(encode_costs(doc))

    # 3. The same audit repeated into one report dir (one session): each conclude rewrites
    #    every event of every earlier audit.
    growth = []
    for _ in range(args.repeat):
        audit, exit_s = audited(tmp / "repeat", module.build)
        growth.append({"exit_s": exit_s, **sizes(tmp / "repeat")})
    out["repeat"] = growth
    benchlib.emit(out)


if __name__ == "__main__":
    benchlib.main_cleaning_up(main, TMP_PREFIX)
