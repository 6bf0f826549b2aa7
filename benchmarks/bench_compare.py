"""Comparison scale: rngaudit.ranks.rules.compare over synthetic rank records, 2,000 events each."""

from __future__ import annotations

import argparse
import copy
import gc
import time
from typing import Any

import benchlib

from rngaudit.ranks import exchange, rules

GENERATORS = (
    ("torch.default_generator", "aten.uniform_"),
    ("random (global)", "random.random"),
    ("numpy.random (global)", "numpy.random.rand"),
    ("torch.Generator#1 (RandomSampler.generator)", "aten.randperm"),
)
LIB = "/venv/lib/python3.11/site-packages/torch/nn/init.py"


def site(file: str, line: int, function: str) -> dict[str, Any]:
    return {"file": file, "line": line, "function": function}


def rank_events(n: int) -> list[dict[str, Any]]:
    """Events shaped as ``Event.to_dict()`` makes them: library call site, user site, chain."""
    out = []
    for i in range(n):
        generator, op = GENERATORS[i % len(GENERATORS)]
        user = site(f"/work/project/train_{i % 7}.py", 10 + i, "setup")
        lib = site(LIB, 400 + i % 50, "kaiming_uniform_")
        sampler = (
            {"chain": "RandomSampler", "loader": "DataLoader#1", "output_digest": "5eed0123"}
            if i % 8 == 3
            else None
        )
        out.append(
            {
                "seq": i,
                "audit": 0,
                "generator": generator,
                "op": op,
                "kind": "draw" if i % 50 else "seed",
                "call_site": lib,
                "chain": [lib, site(LIB, 120, "reset_parameters"), user],
                "user_call_site": user,
                "count": 1 + i % 3,
                "fingerprint": f"{(i * 2654435761) & 0xFFFFFFFF:08x}",
                "thread": "MainThread",
                "pid": 4242,
                "phase": "pre-iteration" if i % 10 else "iteration",
                "sampler": sampler,
            }
        )
    return out


def with_signatures(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each rank signs its own record before the exchange (in parallel, on its own core);
    here the signature of each distinct record is computed once and shared."""
    cache: dict[int, str] = {}
    for r in recs:
        key = id(r["events"])
        if key not in cache:
            cache[key] = rules.signature(r)
        r["signature"] = cache[key]
    return recs


def records(world: int, pool: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One record per rank; the event lists cycle through ``pool`` (distinct copies), as
    decoded records would be distinct objects, without 4,096 x 2,000 dicts in memory."""
    states = {
        "entry": {"torch.default_generator": "0badc0de", "random (global)": "1234abcd"},
        "exit": {"torch.default_generator": "feedbeef", "random (global)": "87654321"},
    }
    return [
        {
            "rank": r,
            "pid": 4242 + r,
            "host": "node0",
            "label": "audit at train.py:10 in main",
            "events": pool[r % len(pool)],
            "states": states,
            "initial_seeds": {"torch.default_generator": 1234},
            "from_start": False,
            "exception": None,
        }
        for r in range(world)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--ranks", default="8,64,256,1024,2048,4096")
    parser.add_argument("--pool", type=int, default=8, help="distinct copies of the events")
    args = parser.parse_args()
    base = rank_events(args.events)
    pool = [copy.deepcopy(base) for _ in range(args.pool)]
    out: dict[str, Any] = {"events": args.events, "scale": []}
    for world in [int(w) for w in args.ranks.split(",")]:
        recs = with_signatures(records(world, pool))
        gc.collect()
        start = time.perf_counter()
        findings = rules.compare(recs, world, [], 0)
        elapsed = time.perf_counter() - start
        out["scale"].append(
            {
                "ranks": world,
                "seconds": elapsed,
                "us_per_rank_event": elapsed / (world * args.events) * 1e6,
                "findings": len(findings),
            }
        )
    # One divergent rank (an extra draw and a different sampler state) at 1,024 ranks.
    world = 1024
    recs = records(world, pool)
    odd = copy.deepcopy(base)
    odd[3]["fingerprint"] = "deadbeef"
    odd[5]["count"] += 1
    recs[world - 1] = dict(recs[world - 1], events=odd)
    recs = with_signatures(recs)
    start = time.perf_counter()
    findings = rules.compare(recs, world, [], 0)
    out["divergent_1024"] = {
        "seconds": time.perf_counter() - start,
        "findings": sorted(f.kind for f in findings),
    }
    # What each rank does before comparing: decode the other ranks' records.
    payload = exchange.encode(records(1, pool)[0])
    times = []
    for _ in range(5):
        start = time.perf_counter()
        exchange.decode(payload)
        times.append(time.perf_counter() - start)
    out["decode"] = {"payload_bytes": len(payload), "seconds": min(times)}
    one = records(1, pool)[0]
    start = time.perf_counter()
    rules.signature(one)
    out["signature"] = {"events": args.events, "seconds": time.perf_counter() - start}
    benchlib.emit(out)


if __name__ == "__main__":
    main()
