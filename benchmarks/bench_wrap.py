"""Text rendering of a huge word: rngaudit's wrapping against ``textwrap`` alone (issue 23)."""

from __future__ import annotations

import textwrap
import time

from rngaudit.reports.report_text import wrap


def seconds(fn: object, text: str) -> float:
    start = time.perf_counter()
    fn(text, 100, initial_indent="    ", subsequent_indent="    ")  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    print("| word | textwrap.wrap | rngaudit.reports.report_text.wrap | ratio |")
    print("|---|---|---|---|")
    for mib in (1, 4, 16):
        text = f"before {'x' * (mib << 20)} after"
        ours = seconds(wrap, text)
        theirs = seconds(textwrap.wrap, text) if mib <= 4 else float("nan")
        shown = f"{theirs:.2f} s" if theirs == theirs else "(not run: ~60 s)"
        ratio = f"{theirs / ours:.0f}x" if theirs == theirs else "-"
        print(f"| {mib} MiB | {shown} | {ours:.2f} s | {ratio} |")


if __name__ == "__main__":
    main()
