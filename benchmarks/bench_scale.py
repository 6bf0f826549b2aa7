"""Scale: the exchange through a real TCPStore, client processes speaking for thousands of ranks."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib
from bench_compare import rank_events

from rngaudit.ranks import exchange, rules
from rngaudit.reports import files

TIMEOUT = 300.0


def store_client(port: int, master: bool = False) -> Any:
    from torch.distributed import TCPStore

    return TCPStore(
        "127.0.0.1",
        port,
        None,
        master,
        datetime.timedelta(seconds=TIMEOUT),
        wait_for_workers=False,
    )


def store_bytes(store: Any) -> tuple[int, int]:
    """(keys, bytes of keys and values) held by the store now."""
    keys = [k for k in store.list_keys() if not k.startswith("bench/")]
    values = store.multi_get(keys) if keys else []
    return len(keys), sum(len(k) + len(v) for k, v in zip(keys, values, strict=True))


def records(world: int, groups: int, events: int) -> tuple[dict[int, Any], dict[int, bytes]]:
    """One record (and its encoding) per signature group; rank r is in group r % groups."""
    base = rank_events(events)
    out: dict[int, Any] = {}
    encoded: dict[int, bytes] = {}
    for g in range(min(groups, world)):
        evs = [dict(e) for e in base]
        evs[3]["fingerprint"] = f"{g:08x}"  # one differing event per group
        rec: dict[str, Any] = {
            "rank": g,
            "events": evs,
            "states": {"entry": {}, "exit": {"torch.default_generator": "0"}},
            "initial_seeds": {},
            "from_start": False,
        }
        rec["signature"] = rules.signature(rec)
        out[g] = rec
        encoded[g] = exchange.encode(rec)
    return out, encoded


def client(args: argparse.Namespace) -> None:
    """One process: ranks [index*per, (index+1)*per), every exchange of every round."""
    store = store_client(args.port)
    recs, payloads = records(args.world, args.groups, args.events)
    per = args.world // args.procs
    mine = list(range(args.index * per, (args.index + 1) * per))
    tmp = Path(tempfile.mkdtemp(prefix=f"rngaudit-bench-scale-{os.getpid()}-"))
    rounds = []
    for i in range(args.rounds):
        store.wait([f"bench/go/{i}"])
        key = f"{args.tag}/{i}"
        exits: dict[int, float] = {}
        rank0: dict[str, float] = {}
        published: dict[int, tuple[float, list[str]]] = {}
        others = [r for r in mine if r != 0]
        for r in others:  # simulated ranks publish one after the other
            t = time.perf_counter()
            rec = dict(recs[r % args.groups], rank=r)
            written = exchange.publish(
                store, r, args.world, key, rec, {"label": "bench", "mode": "raise"},
                payloads[r % args.groups],
            )  # fmt: skip
            published[r] = (time.perf_counter() - t, written)
        if 0 in mine:
            t = time.perf_counter()
            result = exchange.exchange_on(
                exchange.Seat(store, 0, args.world), recs[0], key, TIMEOUT,
                info={"label": "bench", "mode": "raise"}, report_all=True, payload=payloads[0],
            )  # fmt: skip
            t_exchange = time.perf_counter()
            found = rules.compare(result.records, args.world, result.missing, 0)
            t_compare = time.perf_counter()
            merged = {
                "schema_version": 1,
                "run_id": "bench",
                "world_size": args.world,
                "findings": [f.to_dict() for f in found],
                "ranks": result.records,
            }
            files.write_json(files.merged_path(tmp), merged)
            files.write_json(files.rank_path(tmp, 0), {"record": recs[0]})
            end = time.perf_counter()
            rank0 = {
                "exit_s": end - t,
                "exchange_s": t_exchange - t,
                "compare_s": t_compare - t_exchange,
                "write_s": end - t_compare,
                "findings": len(found),
            }
            exits[0] = end - t
        for r in others:
            t = time.perf_counter()
            rec = dict(recs[r % args.groups], rank=r)
            exchange.collect(
                exchange.Seat(store, r, args.world), rec, key, TIMEOUT, written=published[r][1]
            )  # the verdict needs the decision and one record per group
            exits[r] = published[r][0] + time.perf_counter() - t
        rounds.append({"exits": sorted(exits.values()), "rank0": rank0})
        store.add(f"bench/done/{i}", 1)
    benchlib.emit({"index": args.index, "rounds": rounds})


def measure(port: int, store: Any, world: int, procs: int, groups: int, events: int,
            rounds: int, tag: str) -> dict[str, Any]:  # fmt: skip
    cmd = [
        benchlib.PYTHON, str(Path(__file__).resolve()), "--client", "--port", str(port),
        "--world", str(world), "--procs", str(procs), "--groups", str(groups),
        "--events", str(events), "--rounds", str(rounds), "--tag", tag,
    ]  # fmt: skip
    env = benchlib.child_env(PYTHONPATH=str(benchlib.ROOT))
    children = [
        subprocess.Popen(
            [*cmd, "--index", str(p)],
            cwd=benchlib.BENCH,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for p in range(procs)
    ]
    held: list[tuple[int, int]] = []
    for i in range(rounds):
        store.set(f"bench/go/{i}", "1")
        while int(store.add(f"bench/done/{i}", 0)) < procs:
            time.sleep(0.005)
        held.append(store_bytes(store))
    results = [benchlib.last_json(c.communicate(timeout=3600)[0]) for c in children]
    per_round = []
    for i in range(rounds):
        exits = sorted(x for r in results for x in r["rounds"][i]["exits"])
        rank0 = next(r["rounds"][i]["rank0"] for r in results if r["rounds"][i]["rank0"])
        per_round.append({
            "rank0": rank0,
            "exit_median_s": benchlib.median(exits),
            "exit_max_s": exits[-1],
            "keys": held[i][0],
            "bytes": held[i][1],
        })  # fmt: skip
    return {"world": world, "procs": procs, "groups": groups, "rounds": per_round}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--client", action="store_true")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--world", type=int, default=256)
    parser.add_argument("--procs", type=int, default=16)
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--tag", default="scale")
    parser.add_argument("--worlds", default="256,1024,4096")
    parser.add_argument("--group-counts", default="1,8", help="signature groups to measure")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--epoch-events", type=int, default=20, help="per-epoch records: small")
    parser.add_argument("--scale-rounds", type=int, default=2, help="round 0 warms up")
    args = parser.parse_args()
    if args.client:
        client(args)
        return
    server = store_client(0, master=True)
    port = int(server.port)
    out: dict[str, Any] = {"procs": args.procs, "events": args.events, "worlds": []}
    for world in [int(w) for w in args.worlds.split(",")]:
        for groups in [int(g) for g in args.group_counts.split(",")]:
            tag = f"w{world}g{groups}"
            out["worlds"].append(
                measure(
                    port, server, world, args.procs, groups, args.events, args.scale_rounds, tag
                )
            )
            print(json.dumps(out["worlds"][-1]), file=sys.stderr, flush=True)  # partial results
    epochs = measure(port, server, 256, args.procs, 1, args.epoch_events, args.epochs, "epochs")
    out["epochs"] = {
        "world": 256,
        "epochs": args.epochs,
        "events": args.epoch_events,
        "bytes": [r["bytes"] for r in epochs["rounds"]],
        "keys": [r["keys"] for r in epochs["rounds"]],
        "rank0_exit_s": [r["rank0"]["exit_s"] for r in epochs["rounds"]],
    }
    benchlib.emit(out)


if __name__ == "__main__":
    sys.exit(main())
