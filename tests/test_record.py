"""This rank's record of a window: deferred records merged, the loaders built in it summarised."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from conftest import run_python
from event_factory import make_event

import rngaudit
from rngaudit import schema
from rngaudit.capture.rank_record import merge_deferred


def _event(seq: int, audit: int) -> schema.Event:
    return make_event(seq, audit=audit)


def test_deferred_records_merge_into_one_record_of_the_audit() -> None:
    first: schema.RankRecord = {
        "events": [_event(1, 0)],
        "loaders": [],
        "states": {"entry": {"g": "00000001"}, "exit": {"g": "00000002"}},
        "from_start": True,
        "exception": None,
    }
    second: schema.RankRecord = {
        "events": [_event(2, 1)],
        "loaders": [],
        "states": {"entry": {"g": "00000002"}, "exit": {"g": "00000003"}},
        "from_start": False,
        "exception": "ValueError: late",
    }
    current: schema.RankRecord = {
        "label": "audit at train.py:9",
        "events": [_event(3, 2)],
        "states": {"entry": {"g": "00000003"}, "exit": {"g": "00000004"}},
        "from_start": False,
        "exception": None,
    }
    merged = merge_deferred([first, second], current, 2)
    assert [(e["seq"], e["audit"]) for e in merged["events"]] == [(1, 2), (2, 2), (3, 2)]
    assert merged["states"] == {"entry": {"g": "00000001"}, "exit": {"g": "00000004"}}
    assert merged["exception"] == "ValueError: late"
    assert merged["from_start"] is True
    assert merged["label"] == "audit at train.py:9"


class Wrap(torch.utils.data.Sampler[int]):
    """A user's sampler around another (``.sampler``), as sampler wrappers are written."""

    def __init__(self, inner: Any) -> None:
        self.sampler = inner

    def __iter__(self) -> Iterator[int]:
        return iter(self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def test_a_loaders_summary_names_the_first_eight_samplers_of_its_chain(report_dir: Path) -> None:
    data = torch.utils.data.TensorDataset(torch.arange(8))
    sampler: Any = torch.utils.data.RandomSampler(data)
    for _ in range(9):
        sampler = Wrap(sampler)
    with rngaudit.audit(report_dir=report_dir, mode="report") as a:
        loader = torch.utils.data.DataLoader(data, sampler=sampler, batch_size=2)
    assert a.report is not None
    (summary,) = a.report.ranks[0]["loaders"]
    assert summary["sampler"] == " > ".join(["BatchSampler", *["Wrap"] * 7])
    del loader


# A fresh process that knows only the public API: the rank record is given its samples reader
# by the epochs layer (which every entry imports), not by an import of its own.
SPLIT_LOADER = """
import json, sys, torch, rngaudit
data = torch.utils.data.Subset(torch.utils.data.TensorDataset(torch.arange(8)), [1, 2, 5])
with rngaudit.audit(report_dir=sys.argv[1], mode="report") as a:
    loader = torch.utils.data.DataLoader(data, batch_size=2)
with rngaudit.audit(report_dir=sys.argv[1], mode="report") as b:
    whole = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8)))
print(json.dumps([a.report.ranks[0]["loaders"], b.report.ranks[0]["loaders"]]))
"""


def test_a_loader_over_a_split_carries_its_samples_and_others_none(report_dir: Path) -> None:
    result = run_python(["-c", SPLIT_LOADER, str(report_dir)])
    assert result.returncode == 0, result.stderr
    split, whole = json.loads(result.stdout.splitlines()[-1])
    samples = split[0]["samples"]
    assert (samples["root_size"], samples["taken"], samples["distinct"]) == (8, 3, 3)
    assert "samples" not in whole[0]


def test_an_order_check_record_not_fetched_is_its_groups_under_its_own_rank() -> None:
    from rngaudit.epochs.sharded_check import expand_groups

    holder = {"rank": 0, "signature": "s", "order": ["a1"], "epoch": 3}
    other = {"rank": 2, "signature": "t", "order": ["b7"], "epoch": 3}
    stubs = [
        {"rank": 1, "signature": "s", "same_as": 0, "events": []},
        {"rank": 3, "signature": "t", "same_as": 2, "events": []},
        {"rank": 4, "signature": "u", "same_as": None, "events": []},  # its group unreadable
    ]
    expanded = expand_groups([holder, other, *stubs])
    assert [r["rank"] for r in expanded] == [0, 2, 1, 3]
    assert expanded[2] == dict(holder, rank=1) and expanded[3] == dict(other, rank=3)
    assert holder["rank"] == 0  # the fetched record itself is not changed
