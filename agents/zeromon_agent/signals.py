"""SIGTERM for a rank whose main thread is blocked in C code (a collective that never completes).

Python runs a signal handler only in the main thread, between two bytecodes: a rank blocked inside a gloo or
NCCL wait never runs it. Without zeromon such a rank dies at once by SIGTERM's default action; with a Python
handler installed (the agent's, to write the end of its recording) it would live on until the launcher's
SIGKILL, its recording unfinished. So the agent also listens on the interpreter's wakeup fd, which the C-level
handler writes on whatever thread the signal lands: a thread of its own sees the signal at once, and when
the main thread has not run the handler within GRACE_S, it does the handler's work itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable

GRACE_S = 0.5  # the main thread's handler runs within microseconds, unless the thread is blocked in C code


class SigtermWatch:
    """A thread woken by every signal that has a Python handler; ``on_blocked`` runs there for a SIGTERM the
    main thread has not begun to handle within GRACE_S."""

    def __init__(self, on_blocked: Callable[[], None], grace_s: float = GRACE_S) -> None:
        self.on_blocked = on_blocked
        self.grace_s = grace_s
        self._handled = threading.Event()
        self._read_fd = self._write_fd = -1
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """From the main thread. False, and nothing done, where the program has a wakeup fd of its own (asyncio's
        loop sets one): the handler alone then stands, as before."""
        if threading.current_thread() is not threading.main_thread():
            return False
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block on it
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except (ValueError, OSError):
            os.close(read_fd)
            os.close(write_fd)
            return False
        if previous != -1:  # someone else's: give it back
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._read_fd, self._write_fd = read_fd, write_fd
        # A forked child (a DataLoader worker) inherits the wakeup fd, not the thread: its own signals would wake
        # the parent's watch, which would stop the parent.
        os.register_at_fork(after_in_child=self._disarm_in_child)
        self._thread = threading.Thread(target=self._run, name="zeromon-signals", daemon=True)
        self._thread.start()
        return True

    def _disarm_in_child(self) -> None:
        """In a forked child: its signals no longer go to the parent's pipe."""
        if self._stopped or self._read_fd < 0:
            return
        self._stopped = True
        with contextlib.suppress(ValueError, OSError):
            current = signal.set_wakeup_fd(-1)
            if current != self._write_fd:
                signal.set_wakeup_fd(current)  # the program's own since: left as it is
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)

    def handled(self) -> None:
        """The main thread's handler has begun: the watch leaves the signal to it."""
        self._handled.set()

    def stop(self) -> None:
        """Give the wakeup fd back (from the main thread; elsewhere the thread just ends) and end the thread."""
        if self._stopped or self._thread is None:
            return
        self._stopped = True
        if threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                current = signal.set_wakeup_fd(-1)
                if current != self._write_fd:
                    signal.set_wakeup_fd(current)  # the program's own since: left as it is
        with contextlib.suppress(OSError):
            os.write(self._write_fd, b"\0")  # wakes the thread, which closes the pipe

    def _run(self) -> None:
        while not self._stopped:
            try:
                data = os.read(self._read_fd, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGTERM in data and not self._stopped:
                if not self._handled.wait(self.grace_s):
                    self.on_blocked()
                self._handled.clear()
        for fd in (self._read_fd, self._write_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def die_by(signum: int) -> None:
    """End the process by ``signum``'s default action from any thread (signal.signal works in the main thread
    only): the C library's signal(), then the signal to this process; an exit with 128 + signum if that fails."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.restype = ctypes.c_void_p
        libc.signal.argtypes = (ctypes.c_int, ctypes.c_void_p)
        libc.signal(signum, None)  # SIG_DFL is the null pointer
        os.kill(os.getpid(), signum)
        time.sleep(2.0)  # the signal ends the process meanwhile
    finally:
        os._exit(128 + signum)
