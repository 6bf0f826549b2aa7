"""Inside the window: added cost per intercepted draw and per unrelated op, repeated and first."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import benchlib
import numpy as np  # noqa: F401  (the generated module draws through it)
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rngaudit
from rngaudit.capture.instrument import torch_ops as instrument_torch
from rngaudit.capture.recorder import RECORDER

TMP_PREFIX = "rngaudit-bench-draws-"  # removed at exit, with the generated files and reports

# label -> (statement, calls per repeated-draw batch, a torch op: it has dispatch floors)
OPS: dict[str, tuple[str, int, bool]] = {
    "torch.rand(8)": ("torch.rand(8)", 2000, True),
    "torch.randperm(1000)": ("torch.randperm(1000)", 1000, True),
    "x.uniform_()": ("X.uniform_()", 2000, True),
    "nn.init.uniform_(w)": ("torch.nn.init.uniform_(W)", 2000, True),
    "torch.randn(8, generator=G)": ("torch.randn(8, generator=G)", 2000, True),
    "F.dropout(x, 0.5, training=True)": ("F.dropout(X, 0.5, training=True)", 2000, True),
    "random.random()": ("random.random()", 4000, False),
    "np.random.rand()": ("np.random.rand()", 4000, False),
    "x.add(1)": ("X.add(1)", 3000, True),
    "Linear(16, 16) forward": ("LIN(INP)", 2000, True),
}
UNRELATED = ("x.add(1)", "Linear(16, 16) forward")  # not recorded: only the interception's cost
FIRST_DRAWS = 400  # first occurrences timed per op and window


def _ident(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_")


def generate(path: Path, clock: str = "wall") -> Any:
    """A user module (outside site-packages, so rngaudit sees user call sites) with, per op,
    ``loop_<op>(n)``: n calls from one line (the aggregated path), and ``first_<op>(n, keyed)``:
    the same loop, but before each call ``keyed.audit_index`` changes, which gives every draw a
    new aggregation key (the first-occurrence path: stack walk, fingerprint, new event) from
    warm code. Both return elapsed seconds: wall time, or with ``clock="thread"`` the
    thread's CPU time (on a loaded shared machine wall time is mostly time spent descheduled).

    Why not one draw at each of n distinct lines: straight-line code that runs once costs
    ~5 µs more per op under any Python dispatch mode (a do-nothing mode shows it too), an
    artefact that would be charged to rngaudit.
    """
    timer = "thread_time as perf_counter" if clock == "thread" else "perf_counter"
    lines = [
        f"from time import {timer}",
        "import random",
        "import numpy as np",
        "import torch",
        "import torch.nn.functional as F",
        "X = torch.zeros(8)",
        "W = torch.empty(16, 16)",
        "G = torch.Generator().manual_seed(0)",
        "LIN = torch.nn.Linear(16, 16)",
        "INP = torch.zeros(4, 16)",
    ]
    for label, (stmt, _, _) in OPS.items():
        name = _ident(label)
        lines += [
            "",
            f"def loop_{name}(n):",
            "    t = perf_counter()",
            "    for _ in range(n):",
            f"        {stmt}",
            "    return perf_counter() - t",
            "",
            f"def first_{name}(n, keyed):",
            "    base = keyed.audit_index",
            "    t = perf_counter()",
            "    for i in range(1, n + 1):",
            "        keyed.audit_index = base + i",
            f"        {stmt}",
            "    t = perf_counter() - t",
            "    keyed.audit_index = base",
            "    return t",
        ]
    path.write_text("\n".join(lines) + "\n")
    spec = importlib.util.spec_from_file_location("rngaudit_bench_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def null_key_on() -> Any:
    """The floor of the key-based kernels: rngaudit's kernels with a handler that only calls
    the op; returns the function that switches it off again."""
    keyed = instrument_torch.keyed_kernels()
    assert keyed is not None, "the dispatch key is taken: rngaudit uses its dispatch mode"
    keyed.handler = lambda spec, args, kwargs, frame: spec.call(*args, **kwargs)
    keyed.on()

    def off() -> None:
        keyed.off()
        keyed.handler = None

    return off


class NullMode(TorchDispatchMode):  # type: ignore[misc]
    """The floor: a Python dispatch mode that does nothing but call the op."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # like rngaudit's mode: no dynamo wrapper

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def measure(mod: Any, label: str, n: int, keyed: Any) -> tuple[float, float]:
    """(µs per call on the repeated path, µs per call on the first-occurrence path)."""
    name = _ident(label)
    gc.collect()
    gc.disable()  # as timeit does: a collection would land on whichever op runs at the time
    try:
        loop = getattr(mod, f"loop_{name}")(n) / n * 1e6
        first = getattr(mod, f"first_{name}")(FIRST_DRAWS, keyed) / FIRST_DRAWS * 1e6
    finally:
        gc.enable()
    return loop, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies batch sizes")
    parser.add_argument(
        "--clock",
        choices=("wall", "thread"),
        default="wall",
        help="time the batches by wall clock (default) or by this thread's CPU time",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
    mod = generate(tmp / "rngaudit_bench_ops.py", args.clock)
    sizes = {label: max(50, int(n * args.scale)) for label, (_, n, _) in OPS.items()}
    samples: dict[str, dict[str, list[float]]] = {
        label: {k: [] for k in ("off", "on", "null", "nullkey", "off_first", "on_first")}
        for label in OPS
    }
    window: dict[str, list[float]] = {"open": [], "close": []}
    unkeyed = SimpleNamespace(audit_index=0)  # the same attribute stores, outside the window

    def off() -> None:
        for label in OPS:
            loop, first = measure(mod, label, sizes[label], unkeyed)
            samples[label]["off"].append(loop)
            samples[label]["off_first"].append(first)

    def on() -> None:
        # A fresh report directory per window: one window's close cost, not the session's
        # growing file (measured separately in bench_report.py).
        report_dir = Path(tempfile.mkdtemp(prefix="report-", dir=tmp))
        audit = rngaudit.audit(mode="report", report_dir=report_dir)
        t0 = time.perf_counter()
        audit.__enter__()
        window["open"].append(time.perf_counter() - t0)
        try:
            for label in OPS:
                loop, first = measure(mod, label, sizes[label], RECORDER)
                samples[label]["on"].append(loop)
                samples[label]["on_first"].append(first)
        finally:
            t0 = time.perf_counter()
            audit.__exit__(None, None, None)
            window["close"].append(time.perf_counter() - t0)

    def null() -> None:
        with NullMode():
            for label, (_, _, dispatched) in OPS.items():
                if dispatched:
                    samples[label]["null"].append(measure(mod, label, sizes[label], unkeyed)[0])

    def nullkey() -> None:
        switch_off = null_key_on()
        try:
            for label, (_, _, dispatched) in OPS.items():
                if dispatched:
                    samples[label]["nullkey"].append(measure(mod, label, sizes[label], unkeyed)[0])
        finally:
            switch_off()

    off(), on(), null(), nullkey()  # warm-up: imports, caches, first window
    for s in samples.values():
        for values in s.values():
            values.clear()
    window["open"].clear(), window["close"].clear()
    for rep in range(args.reps):
        order = (off, on, null, nullkey) if rep % 2 == 0 else (nullkey, null, on, off)
        for step in order:
            step()

    out: dict[str, Any] = {
        "reps": args.reps,
        "clock": args.clock,
        "first_draws": FIRST_DRAWS,
        "ops": {},
    }
    for label, s in samples.items():
        reps = range(len(s["off"]))
        entry = {
            "off_us": benchlib.median(s["off"]),
            "on_us": benchlib.median(s["on"]),
            "added_us": benchlib.median([s["on"][i] - s["off"][i] for i in reps]),
            "off_first_us": benchlib.median(s["off_first"]),
            "on_first_us": benchlib.median(s["on_first"]),
            "added_first_us": benchlib.median([s["on_first"][i] - s["off_first"][i] for i in reps]),
            "calls": sizes[label],
        }
        if s["null"]:
            entry["null_added_us"] = benchlib.median([s["null"][i] - s["off"][i] for i in reps])
            entry["nullkey_added_us"] = benchlib.median(
                [s["nullkey"][i] - s["off"][i] for i in reps]
            )
        out["ops"][label] = entry
    out["window_open_ms"] = benchlib.median(window["open"]) * 1e3
    out["window_close_ms"] = benchlib.median(window["close"]) * 1e3
    out["events_per_window"] = (len(OPS) - len(UNRELATED)) * (FIRST_DRAWS + 1)
    benchlib.emit(out)


if __name__ == "__main__":
    benchlib.main_cleaning_up(main, TMP_PREFIX)
