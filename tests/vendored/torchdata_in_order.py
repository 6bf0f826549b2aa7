# ruff: noqa
"""torchdata 0.11.0's own ``in_order=False`` tests, run audited and unaudited by test_never_break."""

# Vendored from https://github.com/pytorch/data at tag v0.11.0 (commit
# 377e64c1be69a9be6649d14c9e3664070323e464), unchanged but for the imports, type annotations
# (this project's mypy --strict) and the base class, and the rngaudit switch in TestCase.run:
#   test/stateful_dataloader/test_dataloader.py: _TestSlowIndexDataset,
#     _TestSlowIterableDataset, TestOutOfOrderDataLoader
#   test/stateful_dataloader/test_state_dict.py: _TestSlowIndexDataset,
#     _TestSlowIterableDataset (renamed _SD*), TestOutOfOrderWithCheckpointing
#
# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.
#
# torchdata's LICENSE (BSD 3-Clause License):
#
# Copyright (c) 2021-present, Facebook, Inc.
# All rights reserved.
#
# Redistribution and use in source and binary forms, with or without
# modification, are permitted provided that the following conditions are met:
#
# * Redistributions of source code must retain the above copyright notice, this
#   list of conditions and the following disclaimer.
#
# * Redistributions in binary form must reproduce the above copyright notice,
#   this list of conditions and the following disclaimer in the documentation
#   and/or other materials provided with the distribution.
#
# * Neither the name of the copyright holder nor the names of its
#   contributors may be used to endorse or promote products derived from
#   this software without specific prior written permission.
#
# THIS SOFTWARE IS PROVIDED BY THE COPYRIGHT HOLDERS AND CONTRIBUTORS "AS IS"
# AND ANY EXPRESS OR IMPLIED WARRANTIES, INCLUDING, BUT NOT LIMITED TO, THE
# IMPLIED WARRANTIES OF MERCHANTABILITY AND FITNESS FOR A PARTICULAR PURPOSE ARE
# DISCLAIMED. IN NO EVENT SHALL THE COPYRIGHT HOLDER OR CONTRIBUTORS BE LIABLE
# FOR ANY DIRECT, INDIRECT, INCIDENTAL, SPECIAL, EXEMPLARY, OR CONSEQUENTIAL
# DAMAGES (INCLUDING, BUT NOT LIMITED TO, PROCUREMENT OF SUBSTITUTE GOODS OR
# SERVICES; LOSS OF USE, DATA, OR PROFITS; OR BUSINESS INTERRUPTION) HOWEVER
# CAUSED AND ON ANY THEORY OF LIABILITY, WHETHER IN CONTRACT, STRICT LIABILITY,
# OR TORT (INCLUDING NEGLIGENCE OR OTHERWISE) ARISING IN ANY WAY OUT OF THE USE
# OF THIS SOFTWARE, EVEN IF ADVISED OF THE POSSIBILITY OF SUCH DAMAGE.

from __future__ import annotations

import math
import os
import sys
import time
import unittest
from collections.abc import Iterator
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import Dataset, IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader import StatefulDataLoader as DataLoader

WITH_BLOCK = "RNGAUDIT_VENDORED_WITH"  # "1": each test runs inside `with rngaudit.audit()`


class TestCase(unittest.TestCase):
    """unittest's (torch.testing's needs expecttest, not installed); under ``WITH_BLOCK`` each
    test runs inside ``with rngaudit.audit(mode="report")``."""

    def run(self, result: Any = None) -> Any:
        if os.environ.get(WITH_BLOCK) != "1":
            return super().run(result)
        import rngaudit

        with rngaudit.audit(mode="report"):
            return super().run(result)


# --- test/stateful_dataloader/test_dataloader.py ------------------------------------------


class _TestSlowIndexDataset(Dataset[Any]):
    def __init__(self, end: int, slow_index: int):
        self.end = end
        self.slow_index = slow_index
        self._worker_id: int | None = None

    def __getitem__(self, idx: int) -> Any:
        if not self._worker_id:
            worker_info: Any = torch.utils.data.get_worker_info()
            self._worker_id = worker_info.id
        if idx == self.slow_index:
            time.sleep(1.0)
        return (self._worker_id, idx)

    def __len__(self) -> int:
        return self.end


class _TestSlowIterableDataset(IterableDataset[Any]):
    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end
        self.mid = math.ceil((self.end - self.start) / 2)

    def give_data(self, worker_id: int, iter_start: int, iter_end: int) -> Iterator[Any]:
        for i in range(iter_start, iter_end):
            if i == self.mid:
                time.sleep(1.0)
            yield (worker_id, i)

    def __iter__(self) -> Iterator[Any]:
        worker_info: Any = torch.utils.data.get_worker_info()
        per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
        worker_id = worker_info.id
        iter_start = self.start + worker_id * per_worker
        iter_end = min(iter_start + per_worker, self.end)
        return self.give_data(worker_id, iter_start, iter_end)
class TestOutOfOrderDataLoader(TestCase):
    def test_in_order_index_ds(self) -> None:
        dataset = _TestSlowIndexDataset(end=10, slow_index=0)

        dataloader = DataLoader(
            dataset,
            num_workers=2,
            in_order=True,
        )

        expected_worker_ids = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
        expected_data = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        outputs = list(dataloader)
        worker_ids = [o[0] for o in outputs]
        data = [o[1] for o in outputs]
        self.assertEqual(expected_worker_ids, worker_ids)
        self.assertEqual(expected_data, data)

    def test_out_of_order_index_ds(self) -> None:
        dataset = _TestSlowIndexDataset(end=10, slow_index=0)

        dataloader = DataLoader(
            dataset,
            num_workers=2,
            prefetch_factor=2,
            in_order=False,
        )

        # worker_id = 0 gets 'stuck' on 0 and also has 2 in it's queue
        # due to prefetch_factor being 2
        # this makes the test more deterministic as [0, 2] will be the last elements
        expected_worker_ids = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0]
        expected_data = [1, 3, 4, 5, 6, 7, 8, 9, 0, 2]
        outputs = list(dataloader)
        worker_ids = [o[0].item() for o in outputs]
        data = [o[1].item() for o in outputs]
        self.assertEqual(expected_worker_ids, worker_ids)
        self.assertNotEqual(data, list(range(10)))
        self.assertEqual(expected_data, data)

    def test_in_order_iterable_ds(self) -> None:
        dataset = _TestSlowIterableDataset(start=0, end=10)

        dataloader = DataLoader(
            dataset,
            num_workers=2,
            in_order=True,
        )

        expected_worker_ids = [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
        expected_data = [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]
        outputs = list(dataloader)
        worker_ids = [o[0] for o in outputs]
        data = [o[1] for o in outputs]
        self.assertEqual(expected_worker_ids, worker_ids)
        self.assertEqual(expected_data, data)

    def test_out_of_order_iterable_ds(self) -> None:
        dataset = _TestSlowIterableDataset(start=0, end=10)

        dataloader = DataLoader(
            dataset,
            num_workers=2,
            in_order=False,
        )

        # worker 0 has [0, 1, 2, 3, 4], worker 1 has [5, 6, 7, 8, 9]
        # index 5 is slow, so expect all of worker 0 before worker 1
        expected_worker_ids = [0, 0, 0, 0, 0, 1, 1, 1, 1, 1]
        expected_data = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
        outputs = list(dataloader)
        worker_ids = [o[0] for o in outputs]
        data = [o[1] for o in outputs]
        self.assertEqual(expected_worker_ids, worker_ids)
        self.assertEqual(sum(worker_ids), 5)
        self.assertNotEqual(data, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9])
        self.assertEqual(expected_data, data)


# --- test/stateful_dataloader/test_state_dict.py ------------------------------------------


class _SDTestSlowIndexDataset(torch.utils.data.Dataset[Any]):
    def __init__(self, end: int, slow_index: int):
        self.end = end
        self.slow_index = slow_index
        self._worker_id = None

    def __getitem__(self, idx: int) -> Any:
        if idx == self.slow_index:
            time.sleep(1.0)
        return idx

    def __len__(self) -> int:
        return self.end


class _SDTestSlowIterableDataset(torch.utils.data.IterableDataset[Any]):
    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end
        self.mid = math.ceil((self.end - self.start) / 2)

    def give_data(self, iter_start: int, iter_end: int) -> Iterator[Any]:
        for i in range(iter_start, iter_end):
            if i == self.mid:
                time.sleep(1.0)
            yield i

    def __iter__(self) -> Iterator[Any]:
        worker_info: Any = torch.utils.data.get_worker_info()
        per_worker = int(math.ceil((self.end - self.start) / float(worker_info.num_workers)))
        worker_id = worker_info.id
        iter_start = self.start + worker_id * per_worker
        iter_end = min(iter_start + per_worker, self.end)
        return self.give_data(iter_start, iter_end)


class TestOutOfOrderWithCheckpointing(TestCase):
    def test_out_of_order_index_ds(self) -> None:
        dataset = _SDTestSlowIndexDataset(end=10, slow_index=0)
        dataloader = StatefulDataLoader(
            dataset,
            num_workers=2,
            in_order=False,
        )

        # worker_id = 0 gets 'stuck' on 0 and also has 2 in it's queue
        # due to prefetch_factor being 2
        output = []
        for i, data in enumerate(dataloader):
            output.append(data)
            if i == 3:
                state_dict = dataloader.state_dict()
                break

        # 0 is the slow index, assert it isn't in the output before the pause
        self.assertNotIn(0, output)

        new_dataloader = StatefulDataLoader(dataset, num_workers=2, in_order=False)
        new_dataloader.load_state_dict(state_dict)
        for i, data in enumerate(new_dataloader):
            output.append(data)

        self.assertEqual(len(output), 10)
        self.assertNotEqual(output, list(range(10)))
        self.assertEqual(sorted(output), list(range(10)))

    def test_out_of_order_iterable_ds_one_completed_worker(self) -> None:
        dataset = _SDTestSlowIterableDataset(start=0, end=10)
        dataloader = StatefulDataLoader(
            dataset,
            num_workers=2,
            prefetch_factor=2,
            in_order=False,
        )

        # break later on, as one of the workers will be finished
        output = []
        for i, data in enumerate(dataloader):
            output.append(data)
            if i == 7:
                state_dict = dataloader.state_dict()
                break

        worker_0_ended = state_dict["_snapshot"]["_worker_snapshots"]["worker_0"]["fetcher_state"]["fetcher_ended"]
        worker_1_ended = state_dict["_snapshot"]["_worker_snapshots"]["worker_1"]["fetcher_state"]["fetcher_ended"]
        self.assertTrue(worker_0_ended)
        self.assertFalse(worker_1_ended)

        new_dataloader = StatefulDataLoader(dataset, batch_size=1, num_workers=2, in_order=False)
        new_dataloader.load_state_dict(state_dict)
        for i, data in enumerate(new_dataloader):
            output.append(data)

        self.assertEqual(len(output), 10)
        self.assertEqual(output, list(range(10)))
        self.assertNotEqual(output, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9])

    def test_out_of_order_iterable_ds_no_completed_workers(self) -> None:
        dataset = _SDTestSlowIterableDataset(start=0, end=10)
        dataloader = StatefulDataLoader(
            dataset,
            num_workers=2,
            prefetch_factor=2,
            in_order=False,
        )

        # break early - both workers will resume
        output = []
        for i, data in enumerate(dataloader):
            output.append(data)
            if i == 3:
                state_dict = dataloader.state_dict()
                break

        worker_0_ended = state_dict["_snapshot"]["_worker_snapshots"]["worker_0"]["fetcher_state"]["fetcher_ended"]
        worker_1_ended = state_dict["_snapshot"]["_worker_snapshots"]["worker_1"]["fetcher_state"]["fetcher_ended"]
        self.assertFalse(worker_0_ended)
        self.assertFalse(worker_1_ended)

        new_dataloader = StatefulDataLoader(dataset, batch_size=1, num_workers=2, in_order=False)
        new_dataloader.load_state_dict(state_dict)
        for i, data in enumerate(new_dataloader):
            output.append(data)

        self.assertEqual(len(output), 10)
        self.assertEqual(output, list(range(10)))
        self.assertNotEqual(output, [0, 5, 1, 6, 2, 7, 3, 8, 4, 9])


if __name__ == "__main__":
    unittest.main()


if __name__ == "__main__":
    unittest.main()
