"""The first-step rendezvous, in process: which epochs a rank publishes, compares and warns on."""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

import pytest
import torch
from ranks_in_process import Ranks, world_of_one

from rngaudit.capture import batch_digest
from rngaudit.config import Settings
from rngaudit.epochs import handed, partition, rendezvous, unsharded
from rngaudit.epochs.order_check import Watch
from rngaudit.ranks import data_parallel, exchange

pytestmark = pytest.mark.timeout(60)


class Guard:
    """What the first step hands its verdicts to (the order check's EpochGuard does the rest)."""

    def __init__(self) -> None:
        self.judged: list[tuple[str, int, dict[int, dict[str, Any]]]] = []
        self.warned: list[tuple[str, list[int], list[int], float]] = []
        self.so_far: list[tuple[str, int, dict[int, dict[str, Any]]]] = []

    def judge_first(self, epoch: unsharded.Epoch, published: dict[int, dict[str, Any]]) -> bool:
        self.judged.append((epoch.key, epoch.epoch, published))
        return False

    def warn_first(
        self, epoch: unsharded.Epoch, missing: list[int], arrived: list[int], timeout: float
    ) -> None:
        self.warned.append((epoch.key, missing, arrived, timeout))

    def judge_so_far(
        self,
        epoch: unsharded.Epoch,
        published: dict[int, dict[str, Any]],
        forwards: int,
        sharded_by: str | None = None,
    ) -> bool:
        self.so_far.append((epoch.key, forwards, published))
        self.sharded_by = sharded_by
        return False


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's rendezvous state, empty for each test (the real one put back after)."""
    state: dict[str, object] = {
        "_pending": [],
        "_by_tape": weakref.WeakKeyDictionary(),
        "_hooks": weakref.WeakKeyDictionary(),
        "_fired": weakref.WeakSet(),
        "_agreed": set(),
        "_counts": {},
        "_given_up": weakref.WeakSet(),
        "DECIDED": set(),
        "_following": {},
        "_spent": [],
    }
    for name, value in state.items():
        monkeypatch.setattr(rendezvous, name, value)
    monkeypatch.setattr(data_parallel, "_FOUND", weakref.WeakValueDictionary())
    monkeypatch.setattr(data_parallel, "_GROUPS", {})


def _module(ranks: list[int]) -> torch.nn.Linear:
    """A module of the data-parallel group ``ranks`` (as ``data_parallel.note_module`` notes it)."""
    module = torch.nn.Linear(2, 2)
    data_parallel._FOUND[id(module)] = module
    data_parallel._GROUPS[id(module)] = ranks
    return module


def _started(
    guard: Guard, key: str, epoch: int = 0, timeout: float = 30.0
) -> tuple[rendezvous.Started, partition.Tape]:
    tape = partition.Tape([], 8)
    watch = Watch(Settings("raise", Path("r"), timeout, False), None, True)
    item = rendezvous.Started(
        unsharded.Epoch(key, epoch, f"DataLoader({key})", "RandomSampler", watch),
        weakref.ref(tape),
        {"key": key, "epoch": epoch, "first": [epoch, 1], "root_size": 8},
        guard,
    )
    rendezvous.started(item)
    return item, tape


def _base(ranks: list[int], n: int = 0) -> str:
    return f"{unsharded.PREFIX}/step/{rendezvous._group_key(ranks)}/{n}"


def _train_step(module: torch.nn.Module) -> torch.Tensor:
    module.train()
    out: torch.Tensor = module(torch.ones(1, 2))
    return out


def test_a_module_is_armed_until_its_first_training_forward_and_keeps_no_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    module = _module([0, 1])
    expected = torch.nn.functional.linear(torch.ones(1, 2), module.weight, module.bias)
    rendezvous.noted(module)
    assert len(module._forward_pre_hooks) == 1
    module.eval()
    module(torch.ones(1, 2))  # an evaluation forward: still armed
    module.train()
    with torch.no_grad():
        module(torch.ones(1, 2))  # no gradients: still armed
    assert len(module._forward_pre_hooks) == 1 and not ranks.has(f"{_base([0, 1])}/0")
    assert torch.equal(_train_step(module), expected)  # the forward itself is unchanged
    assert len(module._forward_pre_hooks) == 1  # fired: inert, never removed in a forward
    _train_step(module)
    assert not ranks.has(f"{_base([0, 1], 1)}/0")  # one rendezvous only
    rendezvous.sweep()  # outside a forward (an epoch's end, or a new one's first batch)
    assert len(module._forward_pre_hooks) == 0
    assert ranks.get(f"{_base([0, 1])}/0") == {"epochs": []}  # nothing of its own: no wait
    rendezvous.noted(module)  # noted again (found on the heap): its rendezvous was had
    assert len(module._forward_pre_hooks) == 0


def test_the_epochs_every_rank_published_are_judged_and_one_ranks_own_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    rendezvous.noted(module)
    train, train_tape = _started(guard, "train")
    evaluation, eval_tape = _started(guard, "eval")  # a loader rank 1 does not iterate
    batch = torch.arange(4.0)
    rendezvous.content(train_tape, batch)
    rendezvous.content(train_tape, torch.zeros(4))  # digested once: the first batch's
    assert rendezvous.fields(train_tape) == {"first": [0, 1], "content": batch_digest.digest(batch)}
    assert rendezvous.fields(partition.Tape([], 8)) == {}  # a tape it never saw
    theirs = {"key": "train", "epoch": 0, "first": [2, 3], "root_size": 8, "content": "c1"}
    with ranks.playing(1):  # rank 1 reached the forward first, with its epoch of "train"
        ranks.store.set(f"{_base([0, 1])}/1", exchange.encode({"epochs": [theirs]}))
    _train_step(module)
    assert guard.judged == [("train", 0, {0: train.record, 1: theirs})]
    assert guard.warned == []
    assert ranks.get(f"{_base([0, 1])}/0") == {"epochs": [train.record, evaluation.record]}
    assert rendezvous._pending == [] and rendezvous._agreed == {"train"}
    # A new epoch of a loader the group trained on together arms the modules again; an
    # epoch of one rank's own loader does not (the others would never come).
    _started(guard, "eval", epoch=1)
    assert len(module._forward_pre_hooks) == 0
    _started(guard, "train", epoch=1)
    assert len(module._forward_pre_hooks) == 1
    assert eval_tape is not None  # kept alive to here: a collected tape is not drawing


def test_a_rank_that_does_not_arrive_is_a_warning_naming_it_and_ends_its_groups_rendezvous(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Ranks(monkeypatch, 3)
    guard = Guard()
    module = _module([0, 1])
    rendezvous.noted(module)
    _, tape = _started(guard, "train", timeout=0.2)
    _train_step(module)  # rank 1 never publishes: waited for 0.2 s, then a warning
    assert guard.warned == [("train", [1], [0], 0.2)] and guard.judged == []
    assert set(rendezvous._given_up) == {module}
    rendezvous.sweep()  # (outside a forward: the spent hook removed)
    rendezvous.noted(module)  # its group's ranks did not all arrive once: no more rendezvous
    _started(guard, "train", epoch=1)  # nor at a new epoch of a loader
    assert len(module._forward_pre_hooks) == 0
    other = _module([0, 1])
    rendezvous.noted(other)  # a module built later (a new model, a new stage): its own chance
    assert len(other._forward_pre_hooks) == 1
    alone = _module([0, 2])
    rendezvous.noted(alone)  # another group still meets
    assert len(alone._forward_pre_hooks) == 1
    assert not tape.closed  # (alive to here: a tape collected is no epoch being drawn)


def test_an_epoch_already_drawn_to_its_end_is_not_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    rendezvous.noted(module)
    _, tape = _started(guard, "train", timeout=0.2)
    tape.abandon()  # its last index batch was drawn: compared at its end instead
    _train_step(module)
    assert ranks.get(f"{_base([0, 1])}/0") == {"epochs": []}
    assert guard.warned == [] and guard.judged == []  # nothing of its own: it did not wait


def test_started_epochs_are_kept_up_to_a_bound() -> None:
    guard = Guard()
    tapes = [_started(guard, f"l{i}")[1] for i in range(rendezvous.MAX_PENDING + 3)]
    assert len(rendezvous._pending) == rendezvous.MAX_PENDING
    assert rendezvous._pending[0].epoch.key == "l3"  # the oldest dropped
    assert len(tapes) == rendezvous.MAX_PENDING + 3


def test_a_group_of_one_rank_is_never_armed_nor_waits(tmp_path: Path) -> None:
    guard = Guard()
    with world_of_one(tmp_path):
        module = torch.nn.Linear(2, 2)
        data_parallel.note_module(module)
        assert data_parallel._GROUPS[id(module)] == [0]  # the default group's ranks
        rendezvous.noted(module)
        assert len(module._forward_pre_hooks) == 0  # no cross-rank signal to wait for
        _started(guard, "train", timeout=0.2)
        rendezvous._rendezvous(module)  # even when called: one rank compares nothing
    assert guard.judged == [] and guard.warned == []
    assert rendezvous._pending == []


def test_a_data_parallel_group_of_one_rank_in_a_larger_world_compares_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0])  # rank 0 trains this module alone
    rendezvous.noted(module)
    _, tape = _started(guard, "train", timeout=0.2)
    _train_step(module)
    rendezvous.sweep()
    assert len(module._forward_pre_hooks) == 0  # fired, and removed outside the forward
    assert guard.judged == [] and guard.warned == [] and not tape.closed
    assert not ranks.has(f"{_base([0])}/0")  # nothing published for a group of one


def _followed(guard: Guard, module: torch.nn.Module) -> tuple[rendezvous.Started, partition.Tape]:
    """An epoch read lazily whose first batches did not overlap: followed from its first
    training forward on (one batch handed so far, in the tape's pending list)."""
    item, tape = _started(guard, "lazy", epoch=1)
    tape.left = handed.Left(ahead=0, length=8)
    tape.add([0])
    rendezvous.follow(item, module)
    return item, tape


def _so_far(ranks: list[int], forwards: int) -> str:
    group = rendezvous._group_key(ranks)
    return f"{unsharded.PREFIX}/sofar/{group}/lazy/1/{forwards}"


def test_a_followed_epoch_is_published_when_due_and_compared_at_the_next_training_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At the epoch's 2nd, 4th, 8th ... training forward each rank publishes what it has been
    handed so far (never waiting); at the next one it compares them when every rank has;
    evaluation forwards are not counted, and the counting hook goes with the epoch."""
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    _, tape = _followed(guard, module)
    assert len(module._forward_pre_hooks) == 1
    tape.add([1])
    module.eval()
    module(torch.ones(1, 2))  # not counted
    _train_step(module)  # its 2nd training forward: published, not yet compared
    assert ranks.has(f"{_so_far([0, 1], 2)}/0") and guard.so_far == []
    mine = ranks.get(f"{_so_far([0, 1], 2)}/0")
    assert mine["partial"] and mine["batches"] == 2 and mine["taken"] == 2
    with ranks.playing(1):
        ranks.store.set(f"{_so_far([0, 1], 2)}/1", exchange.encode(dict(mine, batches=2)))
    tape.add([2])
    _train_step(module)  # the 3rd: compared, every rank having published
    assert [(key, n) for key, n, _ in guard.so_far] == [("lazy", 2)]
    assert set(guard.so_far[0][2]) == {0, 1}
    assert tape.pending == [[0], [1], [2]]  # the tape itself never folded by the reads
    rendezvous.unfollow(tape)  # its epoch ended: compared there, no hook left
    assert len(module._forward_pre_hooks) == 0 and rendezvous.following() == []


def test_a_rank_that_did_not_publish_so_far_is_waited_for_briefly_then_left_to_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not every rank published by its due forward (uneven, or not in step): waited for at
    most ``FOLLOW_WAIT``, then the epoch is compared at its end only (no warning, no error)."""
    Ranks(monkeypatch, 2)
    monkeypatch.setattr(rendezvous, "FOLLOW_WAIT", 0.1)
    guard = Guard()
    module = _module([0, 1])
    _, tape = _followed(guard, module)
    _train_step(module)
    _train_step(module)  # rank 1's record never came
    assert guard.so_far == [] and guard.warned == []
    assert rendezvous.following() == []
    rendezvous.sweep()
    assert len(module._forward_pre_hooks) == 0
    assert not tape.closed  # (alive to here)


def test_a_followed_epoch_that_cannot_be_read_so_far_is_dropped_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    _, tape = _followed(guard, module)
    tape.left = handed.Left(ahead=None, length=8)  # what it handed cannot be told
    _train_step(module)
    assert rendezvous.following() == []
    rendezvous.sweep()
    assert len(module._forward_pre_hooks) == 0
    assert not tape.closed


def test_an_epoch_followed_from_its_first_batch_counts_at_the_armed_hook_one_hook_a_module(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A DistributedSampler subclass's lazy epoch is followed from its first batch (outside a
    forward) on a module still armed for its first rendezvous: the one hook does both, the
    first training forward counts as the epoch's first, and the verdict names the sampler."""
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    rendezvous.noted(module)  # armed until its first training forward
    tape = partition.Tape([], 8)
    watch = Watch(Settings("raise", Path("r"), 30.0, False), None, True)
    item = rendezvous.Started(  # not an observed epoch: nothing of it at the rendezvous
        unsharded.Epoch("lazy", 1, "DataLoader(lazy)", "MySampler", watch),
        weakref.ref(tape),
        {"sharded_by": "MySampler (a DistributedSampler subclass)"},
        guard,
    )
    tape.left = handed.Left(ahead=0, length=8)
    tape.add([0])
    rendezvous.follow(item, module, forwards=0)
    assert len(module._forward_pre_hooks) == 1  # one hook a module
    _train_step(module)  # the rendezvous, and the epoch's 1st training forward
    assert ranks.has(f"{_base([0, 1])}/0")
    tape.add([1])
    _train_step(module)  # its 2nd: published
    assert ranks.get(f"{_so_far([0, 1], 2)}/0")["batches"] == 2
    with ranks.playing(1):
        mine = ranks.get(f"{_so_far([0, 1], 2)}/0")
        ranks.store.set(f"{_so_far([0, 1], 2)}/1", exchange.encode(mine))
    _train_step(module)  # its 3rd: compared
    assert [(key, n) for key, n, _ in guard.so_far] == [("lazy", 2)]
    assert guard.sharded_by == "MySampler (a DistributedSampler subclass)"
    rendezvous.unfollow(tape)
    assert len(module._forward_pre_hooks) == 0


def test_a_module_armed_again_keeps_its_hook_when_the_epoch_it_followed_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new epoch of a loader the group trained on together arms the module whose hook
    counts a followed epoch (one hook); that epoch's end must not take the hook away before
    the rendezvous it is armed for."""
    ranks = Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    rendezvous.noted(module)
    _train_step(module)  # its first rendezvous
    _, tape = _followed(guard, module)
    rendezvous._agreed.add("next")
    _started(guard, "next", epoch=0)  # armed again, at the counting hook
    rendezvous.unfollow(tape)  # the followed epoch ended (a sweep)
    assert len(module._forward_pre_hooks) == 1
    with ranks.playing(1):  # rank 1 trains no loader of its own: nothing to wait for
        ranks.store.set(f"{_base([0, 1], 1)}/1", exchange.encode({"epochs": []}))
    _train_step(module)
    assert ranks.has(f"{_base([0, 1], 1)}/0")  # the rendezvous it was armed for took place
    rendezvous.sweep()
    assert len(module._forward_pre_hooks) == 0


def test_a_followed_module_can_be_saved_and_copied_mid_epoch_and_its_copy_follows_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``torch.save(model)`` or ``copy.deepcopy(model)`` (an EMA copy) while an epoch is
    followed: the hook pickles by name and carries no state; the copy's forwards are not
    counted, the original's are."""
    import copy
    import io

    Ranks(monkeypatch, 2)
    guard = Guard()
    module = _module([0, 1])
    _, tape = _followed(guard, module)
    buffer = io.BytesIO()
    torch.save(module, buffer)
    twin = copy.deepcopy(module)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    for other in (twin, loaded):
        _train_step(other)
    [f] = rendezvous.following()
    assert f.forwards == 1  # neither copy's forward was counted
    _train_step(module)
    assert f.forwards == 2
    rendezvous.unfollow(tape)
    assert len(module._forward_pre_hooks) == 0


def test_a_compiled_module_armed_or_followed_still_compiles_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under ``torch.compile`` rngaudit's hook is not traced (a traced count would be guarded
    on: a recompile at every step until dynamo gives up) and never removed inside a forward
    (a hook removed there kept dynamo from ever compiling the module: no graph at all, measured):
    the module compiles as often as it does without rngaudit, its forwards are counted."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    def frames(module: torch.nn.Module) -> int:
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(module, backend="eager")
        for _ in range(10):
            compiled(torch.ones(1, 2)).sum().backward()
        return int(counters["stats"]["unique_graphs"])

    Ranks(monkeypatch, 2)
    plain = frames(torch.nn.Linear(2, 2))
    armed = _module([0, 1])
    rendezvous.noted(armed)  # armed before its first compiled call, as a DDP module is
    assert plain <= frames(armed) <= plain + 1  # fired at the first; nothing removed there
    rendezvous.sweep()
    assert len(armed._forward_pre_hooks) == 0
    guard = Guard()
    module = _module([0, 1])
    _, tape = _followed(guard, module)
    [f] = rendezvous.following()
    f.due = 1 << 40  # never due here: only the count
    try:
        assert plain <= frames(module) <= plain + 1  # compiled, and one graph break at most
        assert f.forwards == 11
    finally:
        rendezvous.unfollow(tape)
        torch._dynamo.reset()
