"""Torch interception: the static op list, the dispatch-key kernels, the dispatch-mode fallback."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch

import rngaudit
from rngaudit.capture.instrument import seeded_ops
from rngaudit.capture.instrument import torch_ops as instrument_torch
from rngaudit.capture.instrument.torch_ops import intercepting
from rngaudit.capture.recorder import RECORDER


def _installed_leaf_ops() -> set[str]:
    """Seeded aten ops of the installed torch with a backend kernel (no composite kernel)."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    found = set()
    for qualified in torch._C._dispatch_get_all_op_names():
        namespace, _, rest = qualified.partition("::")
        if namespace != "aten":
            continue
        name, _, overload = rest.partition(".")
        op = getattr(getattr(torch.ops.aten, name, None), overload or "default", None)
        if op is None or torch.Tag.nondeterministic_seeded not in op.tags:
            continue
        if has(op.name(), "CompositeImplicitAutograd"):
            continue
        if has(op.name(), "CompositeExplicitAutograd"):
            continue
        found.add(f"{name}.{overload or 'default'}")
    return found


def test_the_static_op_list_matches_the_installed_torchs_seeded_tags() -> None:
    installed = _installed_leaf_ops()
    listed = set(seeded_ops.LEAF_OPS)
    assert not listed & set(seeded_ops.NOT_DRAWS)
    assert installed - set(seeded_ops.NOT_DRAWS) == listed, (
        f"new in torch: {sorted(installed - listed - set(seeded_ops.NOT_DRAWS))}; "
        f"gone from torch: {sorted(listed - installed)}"
    )


@pytest.fixture(params=["key", "mode"])
def mechanism(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test runs with the dispatch-key kernels and with the forced dispatch-mode fallback."""
    if request.param == "mode":
        monkeypatch.setattr(instrument_torch, "FORCE_DISPATCH_MODE", True)
    else:
        assert instrument_torch.keyed_kernels() is not None, "torch 2.13's Fake key is free"
    yield str(request.param)


def _draws(a: rngaudit.Audit) -> list[dict[str, Any]]:
    assert a.report is not None
    events = cast(list[dict[str, Any]], a.report.ranks[0]["events"])  # indexed as plain dicts
    return [e for e in events if e["kind"] == "draw" and e["op"].startswith("aten.")]


def test_the_mechanism_in_use_is_the_forced_one(mechanism: str, report_dir: Path) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with rngaudit.audit(mode="report", report_dir=report_dir):
        assert intercepting()
        assert (_get_current_dispatch_mode() is not None) == (mechanism == "mode")
    assert not intercepting()


def test_a_positional_generator_is_charged_to_that_generator(
    mechanism: str, report_dir: Path
) -> None:
    gen = torch.Generator().manual_seed(3)
    rates = torch.full((4,), 2.0)
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:
        torch.poisson(rates, gen)
        torch._standard_gamma(rates, gen)
    draws = _draws(a)
    assert {e["op"] for e in draws} == {"aten.poisson", "aten._standard_gamma"}
    assert {e["generator"] for e in draws} == {"torch.Generator#1"}


def test_rrelu_outside_training_draws_nothing(mechanism: str, report_dir: Path) -> None:
    x = torch.randn(8)
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:
        torch.nn.functional.rrelu(x, training=False)
    assert _draws(a) == []
    with rngaudit.audit(mode="report", report_dir=report_dir) as b:
        torch.nn.functional.rrelu(x, training=True)
    assert [e["op"] for e in _draws(b)] == ["aten.rrelu_with_noise"]


def test_initialising_a_meta_model_draws_nothing(mechanism: str, report_dir: Path) -> None:
    before = torch.get_rng_state()
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:
        layer = torch.nn.Linear(64, 64, device="meta")
        torch.nn.init.normal_(torch.empty(3, device="meta"))
    assert layer.weight.is_meta
    assert torch.equal(torch.get_rng_state(), before)  # indeed nothing was drawn
    assert _draws(a) == []


def test_draws_are_seen_and_values_bit_identical(mechanism: str, report_dir: Path) -> None:
    def work() -> list[torch.Tensor]:
        torch.manual_seed(7)
        gen = torch.Generator().manual_seed(9)
        return [
            torch.rand(3),
            torch.randperm(9, generator=gen),
            torch.nn.functional.dropout(torch.ones(6), 0.5, training=True),
            torch.empty(4).exponential_(),
            torch.poisson(torch.full((3,), 4.0), gen),
            torch.get_rng_state(),
            gen.get_state(),
        ]

    plain = work()
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:
        audited = work()
    assert all(torch.equal(p, q) for p, q in zip(plain, audited, strict=True))
    ops = {(e["op"], e["generator"]) for e in _draws(a)}
    rand_op = "aten.uniform_" if mechanism == "key" else "aten.rand"  # leaf vs composite name
    assert (rand_op, "torch.default_generator") in ops
    assert ("aten.randperm", "torch.Generator#1") in ops
    assert ("aten.bernoulli_", "torch.default_generator") in ops
    assert ("aten.exponential_", "torch.default_generator") in ops
    assert ("aten.poisson", "torch.Generator#1") in ops


def test_nested_windows_keep_interception_until_the_outer_end(
    mechanism: str, report_dir: Path
) -> None:
    outer = RECORDER.begin(0)
    try:
        inner = RECORDER.begin(0)
        torch.rand(2)
        RECORDER.end(inner)
        assert intercepting()
        torch.rand(2)
        events = RECORDER.events_since(inner)
        assert sum(e["count"] for e in events if e["kind"] == "draw") == 2
        assert RECORDER.events_since(outer)
    finally:
        RECORDER.end(outer)
    assert not intercepting()


def test_other_threads_are_not_intercepted(mechanism: str, report_dir: Path) -> None:
    seen: list[bool] = []
    with rngaudit.audit(mode="report", report_dir=report_dir) as a:

        def other() -> None:
            seen.append(intercepting())
            torch.rand(2)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=30)
    assert seen == [False]
    assert _draws(a) == []


def test_a_key_with_registrations_is_refused() -> None:
    assert instrument_torch.key_is_free(torch, "CPU") is None  # every op has a CPU kernel
    assert instrument_torch.key_is_free(torch, "NoSuchKey") is None
    assert instrument_torch.keyed_kernels() is not None  # torch 2.13: the Fake key was free
    assert instrument_torch.key_is_free(torch) is None  # now it holds rngaudit's own kernels


def _repeat_workload(gen: torch.Generator) -> None:
    """Draws the repeat path must count exactly as the stack walk does: one line in a loop,
    a helper reached from two lines, library frames (nn.init), an explicit generator, the
    same line on the meta device, a nested window with its own index, a new segment."""

    def helper() -> None:
        torch.rand(2)

    for _ in range(5):
        torch.rand(3)
        helper()
    helper()
    for _ in range(3):
        torch.nn.init.uniform_(torch.empty(4))
        torch.randn(2, generator=gen)
    for device in ("cpu", "meta", "cpu"):
        torch.nn.init.normal_(torch.empty(3, device=device), generator=gen)
    inner = RECORDER.begin(7)
    for _ in range(2):
        torch.rand(3)
    RECORDER.end(inner)
    for _ in range(2):
        torch.rand(3)


def _window_events(monkeypatch: pytest.MonkeyPatch, repeat_path: bool) -> list[Any]:
    from rngaudit.capture import callsite

    if not repeat_path:  # every draw walks the stack, as before the repeat path
        monkeypatch.setattr(callsite, "lines_to_user", lambda frame, op, gen: None)
    torch.manual_seed(5)
    gen = torch.Generator().manual_seed(6)
    window = RECORDER.begin(3)
    try:
        _repeat_workload(gen)
        segment = RECORDER.new_segment(window, 4)
        _repeat_workload(gen)
        events = RECORDER.events_since(window) + RECORDER.events_since(segment)
    finally:
        RECORDER.end(segment)
    monkeypatch.undo()
    return [e for e in events if e["op"].startswith("aten.")]  # not a first window's imports


def test_the_repeat_path_counts_every_draw_as_the_stack_walk_does(
    mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _window_events(monkeypatch, repeat_path=True)  # first-use work (imports) out of the way
    walked = _window_events(monkeypatch, repeat_path=False)
    repeated = _window_events(monkeypatch, repeat_path=True)
    for events in (walked, repeated):
        for event in events:
            event.pop("pid")
    assert repeated == walked  # every field: counts, call sites, chains, fingerprints, audits
    counts = {(e["audit"], e["call_site"]["line"], e["count"]) for e in repeated}
    assert any(count == 5 for _, _, count in counts)  # the loop's line, one event


def test_a_first_draws_fingerprint_is_the_state_before_it(
    mechanism: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rngaudit.capture import event_log as rngaudit_events
    from rngaudit.capture import fingerprint

    gen = torch.Generator().manual_seed(2)
    for deferred in (rngaudit_events.DEFERRED_STATES, 1):  # read now and hashed later, or now
        monkeypatch.setattr(rngaudit_events, "DEFERRED_STATES", deferred)
        torch.manual_seed(1)
        expected = []
        window = RECORDER.begin(0)
        try:
            for _ in range(2):  # the second round repeats the first's events: not fingerprinted
                expected.append(fingerprint.torch_generator(torch.default_generator))
                torch.rand(2)
                expected.append(fingerprint.torch_generator(gen))
                torch.randn(3, generator=gen)
                expected.append(fingerprint.torch_generator(torch.default_generator))
                torch.nn.init.uniform_(torch.empty(2))
            events = RECORDER.events_since(window)
        finally:
            RECORDER.end(window)
        got = [e["fingerprint"] for e in events if e["kind"] == "draw"]
        assert got == expected[:3]
        assert [e["count"] for e in events if e["kind"] == "draw"] == [2, 2, 2]


def test_a_draw_on_a_thread_with_no_python_frame_runs_unrecorded(
    report_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel names its caller by the frame below it; on a thread whose first frame is
    the kernel itself (a C++ thread running a seeded op) there is none: the op runs, the
    user sees no error."""
    import _thread
    import time

    keyed = instrument_torch.keyed_kernels()
    assert keyed is not None
    spec = keyed.specs["uniform_.default"]
    kernel = keyed._kernel(spec)
    raised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: raised.append(u.exc_value))
    with rngaudit.audit(report_dir=report_dir, mode="report"):
        assert keyed.handler is not None
        x = torch.zeros(3)
        _thread.start_new_thread(kernel, (x,))  # no Python frame below the kernel
        deadline = time.monotonic() + 30
        while not raised and not bool((x != 0).all()) and time.monotonic() < deadline:
            time.sleep(0.001)  # polling for the draw (or the error), not a fixed wait
    assert raised == []
    assert bool((x != 0).all())  # it drew
