"""What comparing a lazily yielded epoch as it is drawn costs, in one process.

An epoch of a loader that partitioned before, whose sampler yields lazily and whose first
batches did not overlap, is followed (``rendezvous.follow``): a forward pre-hook counts the
module's training forwards, and at the 2nd, 4th, 8th, ... each rank publishes what it has been
handed so far (``handed.snapshot``: the bitmap copied, the batches since the last fold added)
and at the next one the group compares them. Measured here: a ``Linear(2, 2)`` training
forward with and without the counting hook (least of ``--rounds``), and one publication and
one comparison over a 64,000-sample root with 100 batches of 32 handed (two ranks played in
turn on one real ``HashStore``: a TCP store adds its round trips). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import time
import timeit
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rngaudit.config import Settings
from rngaudit.epochs import handed, partition, rendezvous, unsharded
from rngaudit.epochs.order_check import Watch
from rngaudit.ranks import data_parallel, exchange


class _Guard:
    def judge_so_far(self, *args: Any) -> bool:
        return False  # never decided: compared again at every due forward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    store = dist.HashStore()  # type: ignore[attr-defined]
    playing = [0]
    exchange.distributed = lambda: (playing[0], 2)  # type: ignore[assignment]
    exchange._store = lambda: store  # type: ignore[assignment]
    module = torch.nn.Linear(2, 2)
    data_parallel._FOUND[id(module)] = module
    data_parallel._GROUPS[id(module)] = [0, 1]
    x = torch.ones(1, 2)

    def forward_us() -> float:
        return min(timeit.repeat(lambda: module(x), number=20_000, repeat=args.rounds)) / 2e4 * 1e6

    forward_us()  # warm
    plain = forward_us()
    watch = Watch(Settings("raise", Path("unused"), 30.0, False), None, True)
    tape = partition.Tape([], 64_000)
    tape.left = handed.Left(ahead=0, length=10**9)
    for i in range(0, 3_200, 32):
        tape.add(list(range(i, i + 32)))
    epoch = unsharded.Epoch("bench", 1, "DataLoader", "BatchSampler", watch)
    item = rendezvous.Started(epoch, weakref.ref(tape), {}, _Guard())
    rendezvous.follow(item, module)
    [f] = rendezvous.following()
    f.due = 1 << 62  # never due: the count alone
    hooked = forward_us()
    publish, compare = [], []
    for n in range(2, 200):
        f.forwards = n
        t0 = time.perf_counter()
        rendezvous._publish_so_far(module, f)
        t1 = time.perf_counter()
        playing[0] = 1
        rendezvous._publish_so_far(module, f)
        playing[0] = 0
        t2 = time.perf_counter()
        rendezvous._compare_so_far(module, f, n)
        compare.append(time.perf_counter() - t2)
        publish.append(t1 - t0)
    rendezvous.unfollow(tape)
    plain = min(plain, forward_us())  # before and after: a process's first forwards warm up
    print(json.dumps({
        "forward_us": plain,
        "forward_followed_us": hooked,
        "hook_added_us": hooked - plain,
        "publish_ms": min(publish) * 1e3,
        "compare_ms": min(compare) * 1e3,
        "hooks_left": len(module._forward_pre_hooks),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
