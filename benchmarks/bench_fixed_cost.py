"""The fixed cost of RNGAUDIT=1 on short real runs (HF Trainer, Lightning; world 2): added
seconds with A/A noise (ABBA), and a breakdown by phase measured inside audited runs."""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchlib import PYTHON, ROOT, child_env, median, spread

TORCHRUN = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
RUNS = {
    "hf": [*TORCHRUN, "tests/frameworks/hf_train.py"],
    "lightning": [PYTHON, "tests/frameworks/lightning_train.py", "ddp", "same"],
}
SITE = ROOT / "benchmarks" / "fixed_cost_site"  # the timing harness (sitecustomize)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Bytecode:
    """rngaudit's compiled modules (``__pycache__``), moved in and out of the tree between runs:
    the environment here sets PYTHONDONTWRITEBYTECODE and rngaudit is an editable install, so
    without them every armed process compiles rngaudit's 40 modules at start; a wheel install
    has them (pip compiles at install)."""

    def __init__(self, tmp: Path) -> None:
        self.store = tmp / "pycache"
        for cached in (ROOT / "rngaudit").rglob("__pycache__"):
            shutil.rmtree(cached)
        subprocess.run([PYTHON, "-m", "compileall", "-q", str(ROOT / "rngaudit")], check=True)
        self.dirs = sorted((ROOT / "rngaudit").rglob("__pycache__"))
        self.present = True

    def use(self, present: bool) -> None:
        if present == self.present:
            return
        for i, cached in enumerate(self.dirs):
            kept = self.store / str(i)
            if present:
                kept.rename(cached)
            else:
                kept.parent.mkdir(parents=True, exist_ok=True)
                cached.rename(kept)
        self.present = present


def one(cmd: list[str], audited: bool, tmp: Path, timing: Path | None = None) -> dict[str, float]:
    """One whole run: wall seconds and the CPU seconds of every process it started."""
    truth = tmp / "truth"
    truth.mkdir(exist_ok=True)
    for old in truth.glob("rank-*.json"):  # the truth files are appended to
        old.unlink()
    extra = {"TRUTH_DIR": str(truth), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    if audited:
        extra.update(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(tmp / "report"))
    if timing is not None:
        extra.update(PYTHONPATH=str(SITE), FIXED_COST_TIMING=str(timing))
    env = child_env(**extra)
    cpu = children_cpu()
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    wall = time.perf_counter() - start
    if proc.returncode != 0 or "finished" not in proc.stdout:
        raise RuntimeError(f"run failed ({proc.returncode}): {cmd}\n{proc.stderr[-3000:]}")
    if audited and "rngaudit:" in proc.stderr:
        raise RuntimeError(f"the audit said something on a correct run:\n{proc.stderr[-3000:]}")
    return {"wall": wall, "cpu": children_cpu() - cpu}


def added(rounds: list[dict[str, list[dict[str, float]]]], arm: str, key: str) -> dict[str, Any]:
    """Per round: the arm's runs minus the unaudited runs (means), and the A/A difference of
    the round's two unaudited runs (its noise)."""
    diffs = [statistics.mean(v[key] for v in r[arm]) - statistics.mean(v[key] for v in r["off"])
             for r in rounds]  # fmt: skip
    aa = [r["off"][1][key] - r["off"][0][key] for r in rounds]
    return {
        "off": median([v[key] for r in rounds for v in r["off"]]),
        "arm": median([v[key] for r in rounds for v in r[arm]]),
        "added": median(diffs), "added_range": spread(diffs),
        "aa_median_abs": median([abs(a) for a in aa]), "aa_range": spread(aa),
        "min_added": min(v[key] for r in rounds for v in r[arm])
        - min(v[key] for r in rounds for v in r["off"]),
    }  # fmt: skip


def breakdown(cmd: list[str], tmp: Path, runs: int) -> dict[str, Any]:
    """Runs under the timing harness, alternating unaudited and audited: per process (the
    launcher, each rank) the CPU seconds it had used when site finished (the arming) and at
    its exit, and in audited runs the seconds of each timed phase (medians over runs)."""
    per: dict[str, dict[str, list[float]]] = {}
    modules: dict[str, dict[str, set[str]]] = {}
    for i in range(runs):
        for audited in (False, True) if i % 2 == 0 else (True, False):
            timing = Path(tempfile.mkdtemp(dir=tmp))
            one(cmd, audited, tmp, timing)
            arm = "on" if audited else "off"
            for f in sorted(timing.glob("*.json")):
                data = json.loads(f.read_text())
                who = "launcher" if data["argv"][:1] == ["-m"] else f"rank {data.get('rank')}"
                slot = per.setdefault(who, {})
                slot.setdefault(f"cpu at end of site ({arm})", []).append(data["cpu_at_site"])
                if "cpu_at_exit" in data:
                    slot.setdefault(f"cpu at exit ({arm})", []).append(data["cpu_at_exit"])
                modules.setdefault(who, {}).setdefault(arm, set(data.get("modules", [])))
                if audited:
                    for name, (seconds, _count) in data["phases"].items():
                        slot.setdefault(name, []).append(seconds)
    out: dict[str, Any] = {}
    for who, phases in per.items():
        row: dict[str, Any] = {k: median(v) for k, v in phases.items()}
        for what in ("end of site", "exit"):
            on, off = row.get(f"cpu at {what} (on)"), row.get(f"cpu at {what} (off)")
            if on is not None and off is not None:
                row[f"CPU added at {what}"] = on - off
        mods = modules.get(who, {})
        if "on" in mods and "off" in mods:
            only = sorted(mods["on"] - mods["off"])
            row["modules only when audited"] = len(only)
            row["_names"] = [m for m in only if not m.startswith("rngaudit")]
        out[who] = row
    return out


# What each process of the runs imports, for the arming measurement (a fresh process each).
IMPORTS = {
    "hf": {
        "launcher": "import torch.distributed.run",
        "rank": "import torch, datasets, transformers.trainer",
    },
    "lightning": {"rank": "import torch, pytorch_lightning"},
}
CPU_AT_END = "; import time, sys; sys.stdout.write(repr(time.process_time()))"


def arming(fw: str, pairs: int, tmp: Path) -> dict[str, Any]:
    """Start-up alone: a fresh process that imports what the run's processes import, with
    RNGAUDIT=1 and unset alternated (ABBA); its own CPU seconds at the end, and the wall time.
    The difference is the net cost of arming and of the import hooks (kernel registration,
    the worker check's install), imports that the program makes anyway not counted twice."""
    out: dict[str, Any] = {}
    for who, code in IMPORTS[fw].items():
        diffs: dict[str, list[float]] = {"cpu": [], "wall": []}
        for i in range(pairs):
            got: dict[bool, dict[str, float]] = {}
            for audited in (False, True) if i % 2 == 0 else (True, False):
                extra = {"RNGAUDIT": "1", "RNGAUDIT_REPORT_DIR": str(tmp / "arming")}
                env = child_env(**(extra if audited else {}))
                start = time.perf_counter()
                proc = subprocess.run([PYTHON, "-c", code + CPU_AT_END], cwd=ROOT, env=env,
                                      capture_output=True, text=True, check=True)  # fmt: skip
                got[audited] = {"wall": time.perf_counter() - start, "cpu": float(proc.stdout)}
            for key in diffs:
                diffs[key].append(got[True][key] - got[False][key])
        out[who] = {key: {"added": median(v), "range": spread(v)} for key, v in diffs.items()}
    return out


ARMS = {"off": (False, True), "on": (True, True), "raw": (True, False)}  # audited, bytecode
LABELS = {"on": "RNGAUDIT=1", "raw": "RNGAUDIT=1, rngaudit not byte-compiled"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per framework")
    parser.add_argument("--breakdown-runs", type=int, default=2, help="per arm, timed phases")
    parser.add_argument("--only", default="hf,lightning")
    parser.add_argument("--arms", default="on,raw", help="audited arms besides unset: on, raw")
    parser.add_argument("--arming-pairs", type=int, default=8, help="start-up alone, per process")
    args = parser.parse_args()
    arms = args.arms.split(",")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as name:
        tmp = Path(name)
        bytecode = Bytecode(tmp)
        try:
            for fw in args.only.split(","):
                result[fw] = measure(fw, arms, args, tmp, bytecode)
        finally:
            bytecode.use(True)
    print(json.dumps(result), flush=True)


def measure(fw: str, arms: list[str], args: Any, tmp: Path, bytecode: Bytecode) -> dict[str, Any]:
    cmd = RUNS[fw]
    sequence = ["off", *arms]
    sequence += sequence[::-1]  # ABCCBA, reversed every other round
    for arm in ("off", *arms) if args.rounds else ():  # warm the page cache
        bytecode.use(ARMS[arm][1])
        one(cmd, ARMS[arm][0], tmp)
    rounds = []
    for i in range(args.rounds):
        r: dict[str, list[dict[str, float]]] = {arm: [] for arm in ("off", *arms)}
        for arm in sequence if i % 2 == 0 else sequence[::-1]:
            bytecode.use(ARMS[arm][1])
            r[arm].append(one(cmd, ARMS[arm][0], tmp))
        rounds.append(r)
        print(f"[{fw}] round {i}: {json.dumps(r)}", file=sys.stderr, flush=True)
    out: dict[str, Any] = {"rounds": rounds}
    if args.arming_pairs:
        out["arming"] = {}
        for compiled in (True, False):
            bytecode.use(compiled)
            for who, got in arming(fw, args.arming_pairs, tmp).items():
                out["arming"][who + ("" if compiled else ", not byte-compiled")] = got
        bytecode.use(True)
        for who, got in out["arming"].items():
            c, w = got["cpu"], got["wall"]
            print(
                f"  {fw} {who} start-up alone (imports, arming, import hooks): CPU added "
                f"{c['added'] * 1e3:+.0f} ms ({c['range'][0] * 1e3:+.0f} to "
                f"{c['range'][1] * 1e3:+.0f}), wall {w['added'] * 1e3:+.0f} ms",
                file=sys.stderr,
                flush=True,
            )
    for arm in arms if rounds else ():
        out[arm] = {key: added(rounds, arm, key) for key in ("wall", "cpu")}
        w, c = out[arm]["wall"], out[arm]["cpu"]
        print(
            f"{fw}, {LABELS[arm]}: wall unset {w['off']:.2f} s, audited {w['arm']:.2f} s, added "
            f"{w['added']:+.2f} s (rounds {w['added_range'][0]:+.2f} to "
            f"{w['added_range'][1]:+.2f}; min to min {w['min_added']:+.2f}); A/A |median| "
            f"{w['aa_median_abs']:.2f} s ({w['aa_range'][0]:+.2f} to {w['aa_range'][1]:+.2f}); "
            f"CPU of all processes added {c['added']:+.2f} s (rounds {c['added_range'][0]:+.2f} "
            f"to {c['added_range'][1]:+.2f}; A/A |median| {c['aa_median_abs']:.2f} s)",
            file=sys.stderr,
            flush=True,
        )
    if args.breakdown_runs:
        bytecode.use(True)
        out["breakdown"] = breakdown(cmd, tmp, args.breakdown_runs)
        for who, phases in out["breakdown"].items():
            print(f"  {fw} {who}:", file=sys.stderr)
            for k, v in phases.items():
                if k != "_names":
                    print(f"    {k:<58} {v:8.4f}", file=sys.stderr)
            if phases.get("_names"):
                print(f"    only when audited: {' '.join(phases['_names'])}", file=sys.stderr)
    return out


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
