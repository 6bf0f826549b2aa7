"""bench_fixed_cost.py's timing harness: on PYTHONPATH, active with FIXED_COST_TIMING set."""

# Site runs this after processing the .pth files, so under RNGAUDIT=1 the audit is armed by
# now: the CPU time this process used so far includes the arming (compared with the unaudited
# arm's). Then rngaudit's phases are wrapped with timers; each process rewrites its own JSON
# file (FIXED_COST_TIMING/<pid>.json) after every timed call, so no exit hook order matters.

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

OUT = os.environ.get("FIXED_COST_TIMING")


def _install() -> None:
    assert OUT is not None
    data: dict[str, Any] = {
        "pid": os.getpid(),
        "argv": sys.argv[:3],
        "cpu_at_site": time.process_time(),
        "armed": "rngaudit.startup" in sys.modules,
        "phases": {},
    }
    lock = threading.Lock()

    def save(at_exit: bool = False) -> None:
        ex = sys.modules.get("rngaudit.ranks.exchange")
        try:
            data["rank"] = (
                ex.current_rank()
                if ex is not None
                else int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))
            )
        except Exception:
            data["rank"] = None
        if at_exit:
            data["modules"] = sorted(sys.modules)
            data["cpu_at_exit"] = time.process_time()
        path = os.path.join(OUT, f"{os.getpid()}.json")
        with lock:
            text = json.dumps(data)
            with open(path + ".tmp", "w") as fh:
                fh.write(text)
            os.replace(path + ".tmp", path)

    def add(name: str, seconds: float) -> None:
        with lock:
            slot = data["phases"].setdefault(name, [0.0, 0])
            slot[0] += seconds
            slot[1] += 1

    profiler: Any = None
    if os.environ.get("FIXED_COST_PROFILE"):  # cProfile inside the timed calls only
        import cProfile

        profiler = cProfile.Profile()
    inside = threading.local()

    def timed(name: str, fn: Any, nested_ok: bool = True) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            outer = not getattr(inside, "on", False)  # saved after the outermost call only
            main = threading.current_thread() is threading.main_thread()
            if outer:
                inside.on = True
                if profiler is not None and main:
                    profiler.enable()
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                seconds = time.perf_counter() - start
                if outer and profiler is not None and main:
                    profiler.disable()
                add(name, seconds)
                if outer:
                    inside.on = False
                    save()
                    if profiler is not None and main:
                        profiler.dump_stats(os.path.join(OUT, f"{os.getpid()}.prof"))

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    # the last word at exit (os._exit included: the HF script leaves through it)
    import atexit

    atexit.register(save, True)
    leave = os._exit

    def exiting(code: int) -> None:
        save(True)
        leave(code)

    os._exit = exiting
    if not data["armed"]:
        save()
        return
    from rngaudit import whole_run
    from rngaudit.capture import patching
    from rngaudit.epochs import order_check
    from rngaudit.ranks import exchange, rules, session
    from rngaudit.reports import files

    # import hooks: what fires when torch, accelerate, the DataLoader module... are imported
    routes = patching.routes

    def timed_routes(module: str) -> Any:
        return [timed(f"import hook: {module}", cb) for cb in routes(module)]

    patching.routes = timed_routes

    def checkpoint(original: Any) -> Any:
        def wrapper(self: Any, label: str, *args: Any, **kwargs: Any) -> Any:
            short = label.split("(")[0].split(" at ")[0]
            return timed(f"checkpoint: {short}", original)(self, label, *args, **kwargs)

        return wrapper

    whole_run.WholeRun._checkpoint = checkpoint(whole_run.WholeRun._checkpoint)
    session.rank_record = timed("  rank record", session.rank_record)
    rules.signature = timed("  signature", rules.signature)
    rules.compare = timed("  compare", rules.compare)
    exchange.exchange = timed("exchange (all, incl. wait)", exchange.exchange)
    exchange._wait_for = timed("  wait for other ranks", exchange._wait_for)
    exchange.agree = timed("  agree run id", exchange.agree)
    session.Session.write = timed("  write (encode, queue)", session.Session.write)
    files.write_text = timed("write_text (any thread)", files.write_text)
    files.set_aside = timed("set_aside (any thread)", files.set_aside)
    files.flush = timed("flush", files.flush)
    guard = order_check.EpochGuard
    guard._first_batch = timed("order check (first batch)", guard._first_batch)
    guard._epoch_end = timed("partition check (epoch end)", guard._epoch_end)
    whole_run.WholeRun.at_exit = timed("at_exit", whole_run.WholeRun.at_exit)
    exchange._Waiter.settle_all = classmethod(
        timed("settle waiters", exchange._Waiter.settle_all.__func__)
    )
    save()


if OUT:
    try:
        _install()
    except Exception as exc:  # the benchmark says so; the run goes on
        sys.stderr.write(f"fixed_cost_site: {exc!r}\n")
