"""Progress of a command's long work on stderr: a bar on a terminal, a plain line every few seconds
elsewhere (a log, a CI job), nothing for work done within a second. stdout stays the report's.

The bar is rich's (installed with textual), imported only when a bar is drawn.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import Any, TextIO

SHOW_AFTER_S = 1.0  # work done sooner shows nothing
LINE_EVERY_S = 5.0  # without a terminal, a line this often


class Progress:
    """``progress(done, total)`` as each unit of work ends; a context manager that clears the bar."""

    def __init__(self, what: str, stream: TextIO | None = None, show_after_s: float = SHOW_AFTER_S,
                 line_every_s: float = LINE_EVERY_S) -> None:
        self.what = what  # "ranks read and analysed"
        self.stream = stream if stream is not None else sys.stderr
        self.show_after_s = show_after_s
        self.line_every_s = line_every_s
        self.started = time.monotonic()
        self._last_line: float | None = None
        self._bar: Any = None  # a rich Progress, once drawn
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.started < self.show_after_s:
            return
        if self._is_terminal():
            self._draw(done, total)
        elif self._last_line is None or now - self._last_line >= self.line_every_s or done == total:
            self._last_line = now
            print(f"zeromon: {done:,} of {total:,} {self.what} ({now - self.started:.0f} s)", file=self.stream,
                  flush=True)

    def _is_terminal(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):  # no isatty, or a closed stream
            return False

    def _draw(self, done: int, total: int) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(TextColumn(f"zeromon: {self.what}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=Console(file=self.stream), transient=True)
            self._bar.start()
            self._task = self._bar.add_task(self.what, total=total)
        self._bar.update(self._task, completed=done, total=total)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.stop()
