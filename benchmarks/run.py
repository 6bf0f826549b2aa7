"""`make bench`: rngaudit's overheads against the targets of docs/performance.md, as one table."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib
from benchlib import PYTHON, child_env, median, run, run_json

IMPORT = "import torch, numpy"
# Both start-up arms run the same harness: -S, then site.main() by hand, so they differ only
# in whether site processes rngaudit_startup.pth (arm "skip" drops that one file).
ARM_HOOK = f"import site; site.main(); {IMPORT}"
ARM_SKIP = (
    "import site; _add = site.addpackage; "
    "site.addpackage = lambda d, n, k: None if n == 'rngaudit_startup.pth' else _add(d, n, k); "
    f"site.main(); {IMPORT}"
)
PTH_COST = r"""
import json, os, site, timeit
os.environ.pop("RNGAUDIT", None)
pth = "rngaudit_startup.pth"
dirs = [d for d in site.getsitepackages() if os.path.exists(os.path.join(d, pth))]
if not dirs:
    print(json.dumps({"installed": False}))
    raise SystemExit
d = dirs[0]
per_file = min(timeit.repeat(lambda: site.addpackage(d, "rngaudit_startup.pth", set()),
                             number=2000, repeat=5)) / 2000
with open(os.path.join(d, "rngaudit_startup.pth")) as fh:
    code = compile(fh.read(), "rngaudit_startup.pth", "exec")
per_line = min(timeit.repeat(lambda: exec(code, {}), number=100000, repeat=5)) / 100000
print(json.dumps({"installed": True, "per_file_s": per_file, "per_line_s": per_line}))
"""
ARMED_CHECK = "import site; site.main(); import sys; print('rngaudit.startup' in sys.modules)"

Row = tuple[str, str, str, str, str, str]  # measurement, unaudited, audited, ratio, target, met


# --------------------------------------------------------------------------- formatting


def us(seconds_or_us: float, already_us: bool = False) -> str:
    value = seconds_or_us if already_us else seconds_or_us * 1e6
    return f"{value:.2f} µs" if abs(value) < 100 else f"{value:.0f} µs"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def secs(seconds: float) -> str:
    return f"{seconds:.3f} s"


def kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1024 / 1024:.2f} MiB"


def met(ok: bool | None) -> str:
    return "info" if ok is None else ("yes" if ok else "**no**")


def within_noise(ratios: list[float]) -> tuple[float, float, bool]:
    """(median ratio, noise band, met): noise is half the inter-quartile range, at least 1 %."""
    mid = median(ratios)
    if len(ratios) >= 4:
        q = statistics.quantiles(ratios, n=4)
        band = max(0.01, (q[2] - q[0]) / 2)
    else:
        band = max(0.01, (max(ratios) - min(ratios)) / 2)
    return mid, band, abs(mid - 1.0) <= band


# --------------------------------------------------------------------------- sections


def bench_startup(pairs: int, armed_runs: int, tmp: Path) -> dict[str, Any]:
    env = child_env()
    armed_env = child_env(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(tmp / "armed-report"))
    # Self-check of the harness: with RNGAUDIT=1 the hook arm arms, the skip arm does not.
    check_skip = ARM_SKIP.replace(IMPORT, "import sys; print('rngaudit.startup' in sys.modules)")
    hook_arms = run([PYTHON, "-S", "-c", ARMED_CHECK], armed_env)[1].strip() == "True"
    skip_arms = run([PYTHON, "-S", "-c", check_skip], armed_env)[1].strip() == "True"
    pth = json.loads(run([PYTHON, "-c", PTH_COST], env)[1])
    run([PYTHON, "-c", IMPORT], env)  # warm the page cache
    hook: list[float] = []
    skip: list[float] = []
    normal: list[float] = []
    armed: list[float] = []
    for i in range(pairs):
        arms: list[tuple[list[float], list[str], dict[str, str]]] = [
            (hook, [PYTHON, "-S", "-c", ARM_HOOK], env),
            (skip, [PYTHON, "-S", "-c", ARM_SKIP], env),
        ]
        if i < armed_runs:  # plain start-up, unset and armed (informative rows)
            arms += [
                (normal, [PYTHON, "-c", IMPORT], env),
                (armed, [PYTHON, "-c", IMPORT], armed_env),
            ]
        if i % 2:
            arms.reverse()
        for sink, cmd, arm_env in arms:
            sink.append(run(cmd, arm_env)[0])
    return {
        "hook_s": hook,
        "skip_s": skip,
        "normal_s": normal,
        "armed_s": armed,
        "ratios": [h / s for h, s in zip(hook, skip, strict=True)],
        "armed_ratios": [a / n for a, n in zip(armed, normal, strict=True)],
        "pth": pth,
        "harness_ok": hook_arms and not skip_arms,
    }


def bench_after_window(pairs: int, tmp: Path) -> dict[str, Any]:
    env = child_env()
    armed = child_env(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(tmp / "loop-report"))
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    run_json("train_loop.py", [], env)  # warm-up
    for i in range(pairs):
        order = [(off, env), (on, armed)]
        for sink, arm_env in order if i % 2 == 0 else reversed(order):
            sink.append(run_json("train_loop.py", [], arm_env))
    return {"off": off, "on": on}


def bench_exchange(sizes: list[int], sites: int, rounds: int, tmp: Path) -> dict[str, Any]:
    module = tmp / "rngaudit_bench_exchange_sites.py"
    module.write_text(
        "import torch\n\n\ndef draw():\n" + "".join("    torch.rand(1)\n" for _ in range(sites))
    )
    out: dict[str, Any] = {"sites": sites, "rounds": rounds, "runs": {}}
    for n in sizes:
        where = tmp / f"exchange-{n}"
        cmd = [
            PYTHON, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}",
            str(benchlib.BENCH / "exchange_rank.py"), "--sites", str(module),
            "--report-dir", str(where / "report"), "--out", str(where / "out"),
            "--rounds", str(rounds),
        ]  # fmt: skip
        wall, _ = run(cmd, child_env(), timeout=600)
        ranks = [json.loads(p.read_text()) for p in sorted((where / "out").glob("rank-*.json"))]
        # Round 0 pays first-use costs (lazy imports, first store keys): report the rest.
        timed = [r for rank in ranks for r in rank["rounds"][1:]] or [
            r for rank in ranks for r in rank["rounds"]
        ]
        rank0 = [r for rank in ranks if rank["rank"] == 0 for r in rank["rounds"][1:]]
        out["runs"][n] = {
            "launch_wall_s": wall,
            "exit_s": median([r["exit_s"] for r in timed]),
            "exit_max_s": max(r["exit_s"] for r in timed),
            "exchange_s": median([r.get("exchange_s", 0.0) for r in timed]),
            "compare_s": median([r.get("compare_s", 0.0) for r in timed]),
            "write_s": median([r.get("write_s", 0.0) for r in timed]),
            "rank0_write_s": median([r.get("write_s", 0.0) for r in rank0]) if rank0 else None,
            "verdicts": sorted({r["verdict"] for r in timed}),
        }
    return out


# --------------------------------------------------------------------------- table


def rows_startup(r: dict[str, Any]) -> list[Row]:
    mid, band, ok = within_noise(r["ratios"])
    rows: list[Row] = [
        (
            f"Off: start + `{IMPORT}`, hook installed and RNGAUDIT unset vs. the hook's "
            f".pth skipped (ABAB x{len(r['ratios'])}, -S + site.main() in both)",
            secs(median(r["skip_s"])),
            secs(median(r["hook_s"])),
            f"{mid:.3f}x (noise ±{band:.3f}; pairs {min(r['ratios']):.3f}-{max(r['ratios']):.3f})",
            "1.00 (within noise)",
            met(ok and r["harness_ok"]),
        )
    ]
    pth = r["pth"]
    if pth.get("installed"):
        start = median(r["hook_s"])
        rows.append(
            (
                "  direct: processing rngaudit_startup.pth (site.addpackage), RNGAUDIT unset",
                "-",
                us(pth["per_file_s"]) + f" (its line alone {us(pth['per_line_s'])})",
                f"{1 + pth['per_file_s'] / start:.6f}x",
                "1.00",
                met(pth["per_file_s"] / start < 0.001),
            )
        )
    if r["armed_s"]:
        rows.append(
            (
                f"  info: plain start + `{IMPORT}`, RNGAUDIT=1 (armed) vs unset "
                f"(x{len(r['armed_ratios'])})",
                secs(median(r["normal_s"])),
                secs(median(r["armed_s"])),
                f"{median(r['armed_ratios']):.3f}x",
                "-",
                met(None),
            )
        )
    return rows


UNRELATED_OPS = ("x.add(1)", "Linear(16, 16) forward")


def rows_draws(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for label, e in r["ops"].items():
        unrelated = label in UNRELATED_OPS
        paths = (
            (("repeated", ""),) if unrelated else (("repeated", ""), ("first occurrence", "_first"))
        )
        for path, key in paths:
            added = e[f"added{key}_us"]
            torch_draw = "null_added_us" in e  # issue 26: <= 3 µs repeated, <= 8 µs first
            if unrelated:
                target, ok = "<= 0.2 µs added", added <= 0.2
            elif torch_draw:
                limit = 8.0 if key else 3.0
                target, ok = f"<= {limit:.0f} µs added", added <= limit
            elif key:
                target, ok = "< 10 µs added", added < 10.0
            else:
                target, ok = "< 5 µs added", added < 5.0
            rows.append(
                (
                    f"In window: `{label}`, {path}" + (" (not recorded)" if unrelated else ""),
                    us(e[f"off{key}_us"], True),
                    us(e[f"on{key}_us"], True),
                    f"{'+' if added >= 0 else ''}{us(added, True)}",
                    target,
                    met(ok),
                )
            )
        if "null_added_us" in e:
            rows.append(
                (
                    f"  floors, `{label}`: rngaudit's kernels with a do-nothing handler / "
                    "a do-nothing Python TorchDispatchMode",
                    us(e["off_us"], True),
                    "-",
                    f"+{us(e['nullkey_added_us'], True)} / +{us(e['null_added_us'], True)}",
                    "-",
                    met(None),
                )
            )
    rows.append(
        (
            f"  info: audit() window open / close ({r['events_per_window']} events, fresh dir)",
            "-",
            f"{r['window_open_ms']:.1f} ms / {r['window_close_ms']:.1f} ms",
            "-",
            "-",
            met(None),
        )
    )
    return rows


def rows_workers(r: dict[str, Any]) -> list[Row]:
    later = r["later_audited"] / r["later_plain"]
    return [
        (
            f"Worker-stream check: first batch of a loader ({r['workers']} fork workers; each "
            f"worker observes its first batch, the parent waits for their reports)",
            ms(r["first_plain"]),
            ms(r["first_audited"]),
            f"+{(r['first_audited'] - r['first_plain']) * 1e3:.0f} ms",
            "-",
            met(None),
        ),
        (
            f"Worker-stream check: later batches (median per batch, {r['batches'] - 1} a run)",
            ms(r["later_plain"]),
            ms(r["later_audited"]),
            f"{later:.3f}x",
            "1.00x (full speed)",
            met(later <= 1.05),
        ),
    ]


def rows_prepare(r: dict[str, Any]) -> list[Row]:
    lo, hi = r["ratio_range"]
    return [
        (
            f"In window: {r['params'] / 1e6:.1f}M-param model init + accelerate prepare() of a "
            f"stateful loader ({r['workers']} workers), x{r['pairs']} alternating",
            secs(r["unaudited_s"]),
            secs(r["audited_s"]),
            f"{r['ratio']:.3f}x (pairs {lo:.2f}-{hi:.2f}"
            + (
                f"; A/A {r['aa_ratio']:.3f}x, {r['aa_range'][0]:.2f}-{r['aa_range'][1]:.2f})"
                if "aa_ratio" in r
                else ")"
            ),
            "<= 1.05x",
            met(r["ratio"] <= 1.05),
        ),
        (
            "  audited split: enter / body / exit (exit: compare, undo patches, write reports)",
            "-",
            f"{r['enter_ms']:.1f} ms / {r['body_s'] * 1e3:.1f} ms / {r['exit_ms']:.1f} ms",
            f"body +{(r['body_s'] - r['unaudited_s']) * 1e3:.1f} ms over unaudited; "
            f"without exit {(r['audited_s'] - r['exit_ms'] / 1e3) / r['unaudited_s']:.3f}x",
            "-",
            met(None),
        ),
    ]


def bench_epochs(pairs: int, tmp: Path) -> dict[str, Any]:
    """2 ranks (torchrun, gloo), 6 epochs of an accelerate-prepared loader, RNGAUDIT=1 vs unset."""
    env = child_env()
    armed = child_env(RNGAUDIT="1", RNGAUDIT_REPORT_DIR=str(tmp / "epoch-report"))
    cmd = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(benchlib.BENCH / "epoch_loop.py")]  # fmt: skip
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    benchlib.last_json(run(cmd, env)[1])  # warm-up
    for i in range(pairs):
        order = [(off, env), (on, armed)]
        for sink, arm_env in order if i % 2 == 0 else reversed(order):
            sink.append(benchlib.last_json(run(cmd, arm_env)[1]))
    return {"off": off, "on": on}


def rows_epochs(r: dict[str, Any]) -> list[Row]:
    off, on = r["off"], r["on"]
    # epochs 1..: epoch 0's first batch also closes the RNGAUDIT window (its own checkpoint)
    first_off = [t for run_ in off for t in run_["first_batch_s"][1:]]
    first_on = [t for run_ in on for t in run_["first_batch_s"][1:]]
    added = median(first_on) - median(first_off)
    rest_ratios = [median(b["rest_s"]) / median(a["rest_s"]) for a, b in zip(off, on, strict=True)]
    mid, band, ok = within_noise(rest_ratios)
    return [
        (
            "Order check: first batch of epochs 1-5, 2 ranks (gloo), accelerate loader, "
            f"RNGAUDIT=1 vs unset, x{len(off)} runs",
            ms(median(first_off)),
            ms(median(first_on)),
            f"+{added * 1e3:.1f} ms per epoch per loader",
            "one exchange (tens of ms)",
            met(added < 0.1),
        ),
        (
            f"Order check: rest of each epoch ({on[0]['steps']} steps), between checks",
            secs(median([median(a["rest_s"]) for a in off])),
            secs(median([median(b["rest_s"]) for b in on])),
            f"{mid:.3f}x (noise ±{band:.3f}; runs {min(rest_ratios):.2f}-{max(rest_ratios):.2f})",
            "1.00x (within noise)",
            met(ok),
        ),
    ]


def rows_after(r: dict[str, Any]) -> list[Row]:
    off, on = r["off"], r["on"]
    rows: list[Row] = []
    for key, label in (
        ("epoch0_s", "epoch 0 after the first batch (its workers forked inside the window)"),
        ("epoch1_s", "epoch 1 (workers forked after the window)"),
    ):
        ratios = [b[key] / a[key] for a, b in zip(off, on, strict=True)]
        ratio = median(ratios)
        rows.append(
            (
                f"After window: training loop, {label}, RNGAUDIT=1 vs unset, x{len(ratios)}",
                secs(median([a[key] for a in off])),
                secs(median([b[key] for b in on])),
                f"{ratio:.3f}x (pairs {min(ratios):.2f}-{max(ratios):.2f})",
                "<= 1.01x",
                met(ratio <= 1.01),
            )
        )
    with_mode = median([b["worker_batches_with_mode"] for b in on])
    main_modes = max(b["main_dispatch_modes"] for b in on)
    rows.append(
        (
            "  diagnostic: worker time per sample in epoch 0 (median); batches whose worker "
            f"were still intercepted by rngaudit (main process after batch 1: {main_modes})",
            f"{median([a['epoch0_sample_us'] for a in off]):.1f} µs; "
            f"{median([a['worker_batches_with_mode'] for a in off]):.0f}",
            f"{median([b['epoch0_sample_us'] for b in on]):.1f} µs; {with_mode:.0f}",
            f"{median([b['epoch0_sample_us'] for b in on]) / median([a['epoch0_sample_us'] for a in off]):.2f}x",  # noqa: E501
            "-",
            met(None),
        )
    )
    return rows


def rows_compare(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for s in r["scale"]:
        target = "< 1 s" if s["ranks"] == 1024 else "linear"
        rows.append(
            (
                f"compare(): {s['ranks']} ranks x {r['events']} events",
                "-",
                ms(s["seconds"]),
                f"{s['seconds'] / s['ranks'] * 1e6:.2f} µs per rank",
                target,
                met(s["seconds"] < 1.0) if s["ranks"] == 1024 else met(None),
            )
        )
    # Growth: the cost per rank must not rise with the world (linear or better). Below 256
    # ranks a fixed ~0.1 ms dominates, so the check starts there.
    per = [s["seconds"] / s["ranks"] * 1e6 for s in r["scale"] if s["ranks"] >= 256]
    rows.append(
        (
            "  growth: cost per rank, 256 ranks to the largest world",
            "-",
            f"{min(per):.2f}-{max(per):.2f} µs",
            f"largest world / cheapest: {per[-1] / min(per):.2f}",
            "linear or better (per-rank cost does not rise)",
            met(per[-1] / min(per) < 1.5),
        )
    )
    sig = r["signature"]
    rows.append(
        (
            f"  info: each rank signs its own record before the exchange ({sig['events']} events)",
            "-",
            ms(sig["seconds"]),
            "in parallel on every rank",
            "-",
            met(None),
        )
    )
    d = r["divergent_1024"]
    rows.append(
        (
            "  1024 ranks, one divergent rank",
            "-",
            ms(d["seconds"]),
            ", ".join(d["findings"]),
            "-",
            met(None),
        )
    )
    dec = r["decode"]
    rows.append(
        (
            "  info: decoding one 2,000-event record (rank 0 decodes world-1, others 1 per group)",
            "-",
            f"{ms(dec['seconds'])}, {kib(dec['payload_bytes'])} zlib",
            f"x1023 = {1023 * dec['seconds']:.1f} s for rank 0 at 1024",
            "-",
            met(None),
        )
    )
    return rows


def rows_exchange(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for n, e in r["runs"].items():
        rank0 = f", rank-0 write {ms(e['rank0_write_s'])}" if e["rank0_write_s"] else ""
        rows.append(
            (
                f"gloo, {n} processes: audit() exit, {r['sites']} events/rank "
                f"(median over ranks x rounds)",
                "-",
                f"{ms(e['exit_s'])} (max {ms(e['exit_max_s'])})",
                f"exchange {ms(e['exchange_s'])}, compare {ms(e['compare_s'])}, "
                f"write {ms(e['write_s'])}{rank0}",
                "-",
                met(None),
            )
        )
    return rows


def rows_report(r: dict[str, Any]) -> list[Row]:
    s, d, rep = r["stack"], r["sites"], r["repeat"]
    return [
        (
            f"Report: {s['layers']} nn.Linear layers built in a loop ({s['draws']} draws, "
            f"{s['events']} events): rank file",
            "-",
            kib(s["rank_bytes"]),
            f"report.json {kib(s['merged_bytes'])}",
            "< 1 MB",
            met(s["rank_bytes"] < 1_000_000),
        ),
        (
            f"  stress: {d['lines']} distinct layer lines ({d['events']} events): rank file",
            "-",
            kib(d["rank_bytes"]),
            f"{d['bytes_per_event']:.0f} B/event -> ~{1_000_000 / d['bytes_per_event']:.0f} "
            "distinct events per MB",
            "-",
            met(None),
        ),
        (
            "  encoding that rank file: compact json.dumps (as written now) vs json.dump(indent=1)",
            ms(d["compact_dumps_s"]) + f" ({kib(d['compact_bytes'])})",
            ms(d["indent1_dump_s"]),
            f"{d['indent1_dump_s'] / d['compact_dumps_s']:.1f}x",
            "-",
            met(None),
        ),
        (
            f"  same audit repeated {len(rep)}x into one report dir: rank file / exit time, "
            "first -> last",
            f"{kib(rep[0]['rank_bytes'])} / {ms(rep[0]['exit_s'])}",
            f"{kib(rep[-1]['rank_bytes'])} / {ms(rep[-1]['exit_s'])}",
            f"{rep[-1]['exit_s'] / rep[0]['exit_s']:.1f}x slower exit",
            "-",
            met(None),
        ),
    ]


def rows_scale(r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    for w in r["worlds"]:
        last = w["rounds"][-1]  # round 0 pays first-use costs
        target = {1: 1.0, 8: 2.0}.get(w["groups"]) if w["world"] == 4096 else None
        exit0 = last["rank0"]["exit_s"]
        rows.append(
            (
                f"Scale: TCPStore, {w['world']} ranks ({w['procs']} processes), "
                f"{w['groups']} signature group(s), {r['events']} events/rank: rank-0 exit",
                "-",
                ms(exit0),
                f"exchange {ms(last['rank0']['exchange_s'])}, write "
                f"{ms(last['rank0']['write_s'])}; every rank: median {ms(last['exit_median_s'])}"
                f", max {ms(last['exit_max_s'])}; store {kib(last['bytes'])} in "
                f"{last['keys']} keys",
                f"< {target:g} s" if target else "-",
                met(exit0 < target) if target else met(None),
            )
        )
    e = r["epochs"]
    rows.append(
        (
            f"  {e['epochs']} consecutive exchanges, {e['world']} ranks: store bytes after "
            "each (first / max / last)",
            "-",
            f"{kib(e['bytes'][0])} / {kib(max(e['bytes']))} / {kib(e['bytes'][-1])}",
            f"keys {e['keys'][0]} -> {e['keys'][-1]}",
            "constant",
            met(max(e["bytes"]) <= 1.1 * e["bytes"][0]),
        )
    )
    return rows


def table(rows: list[Row]) -> str:
    head = ("Measurement", "Unaudited", "Audited", "Ratio / added", "Target", "Met")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def machine() -> str:
    def cmd(args: list[str]) -> str:
        try:
            return subprocess.run(args, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return "?"

    versions = run([PYTHON, "-c", "import torch, numpy, accelerate, torchdata; print("
                    "torch.__version__, numpy.__version__, accelerate.__version__, "
                    "torchdata.__version__)"], child_env())[1].split()  # fmt: skip
    mem = cmd(["free", "-h"]).splitlines()
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = cmd(["git", "-C", str(benchlib.ROOT), "rev-parse", "--short", "HEAD"]) or "?"
    dirty = cmd(["git", "-C", str(benchlib.ROOT), "status", "--porcelain", "rngaudit"])
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return "\n".join(
        [
            f"rngaudit at commit {commit}" + (" + uncommitted changes" if dirty else ""),
            f"cpus: {os.cpu_count()}; load average at start: {load}",
            f"cpu: {cpu}; kernel {platform.release()}",
            f"free -h: {mem[1] if len(mem) > 1 else '?'}",
            f"python {platform.python_version()}; torch {versions[0]}; numpy {versions[1]}; "
            f"accelerate {versions[2]}; torchdata {versions[3]}",
        ]
    )


# --------------------------------------------------------------------------- main

SECTIONS = (
    "startup", "draws", "prepare", "after", "epochs", "workers", "compare", "exchange", "report",
    "scale",
)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (~1/2 time)")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args()
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(chosen) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s) {sorted(unknown)}; choose from {SECTIONS}")
    q = args.quick
    began = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="rngaudit-bench-"))
    env = child_env()
    print(machine(), flush=True)
    jobs: dict[str, tuple[Callable[[], Any], Callable[[Any], list[Row]]]] = {
        "startup": (
            lambda: bench_startup(4 if q else 8, 2 if q else 3, tmp),
            rows_startup,
        ),
        "draws": (
            lambda: run_json("bench_draws.py", ["--reps", "5" if q else "9"], env),
            rows_draws,
        ),
        "prepare": (
            lambda: run_json("bench_prepare.py", ["--pairs", "4" if q else "8"], env),
            rows_prepare,
        ),
        "after": (lambda: bench_after_window(3 if q else 6, tmp), rows_after),
        "workers": (
            lambda: run_json("bench_workers.py", ["--pairs", "3" if q else "6"], env),
            rows_workers,
        ),
        "epochs": (lambda: bench_epochs(2 if q else 4, tmp), rows_epochs),
        "compare": (
            lambda: run_json(
                "bench_compare.py",
                ["--ranks", "8,64,256,1024" if q else "8,64,256,1024,2048,4096"],
                env,
            ),
            rows_compare,
        ),
        "exchange": (lambda: bench_exchange([2, 4, 8], 200, 3, tmp), rows_exchange),
        "report": (lambda: run_json("bench_report.py", [], env), rows_report),
        "scale": (
            lambda: run_json(
                "bench_scale.py",
                ["--worlds", "256,4096" if q else "256,1024,4096", "--epochs", "200"],
                child_env(PYTHONPATH=str(benchlib.ROOT)),
                timeout=3600,
            ),
            rows_scale,
        ),
    }
    results: dict[str, Any] = {}
    rows: list[Row] = []
    for name in SECTIONS:
        if name not in chosen:
            continue
        start = time.perf_counter()
        print(f"[{name}] ...", end=" ", flush=True)
        measure, render = jobs[name]
        results[name] = measure()
        rows += render(results[name])
        print(f"{time.perf_counter() - start:.0f} s", flush=True)
    print()
    print(table(rows))
    total = time.perf_counter() - began
    print(f"\nbenchmarks/run.py took {total:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"results": results, "seconds": total}, indent=1))
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
