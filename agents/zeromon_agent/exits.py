"""How the rank's process ends, as the recording's end says it: atexit, the excepthook, sys.exit's status and SIGTERM.

ExitHandlers notes how the script ended (an exception, an exit status) for the end record, and turns a SIGTERM
into the agent's stop before the signal does what it did without zeromon. A signal that lands where stopping would
deadlock or lose the end record (inside a locked write, inside the stop itself) is acted on once that is done.

A rank whose main thread is blocked in C code (a collective that never completes) needs more (SigtermWatch).
Python runs a signal handler only in the main thread, between two bytecodes: a rank blocked inside a gloo or
NCCL wait never runs it. Without zeromon such a rank dies at once by SIGTERM's default action; with a Python
handler installed (the agent's, to write the end of its recording) it would live on until the launcher's
SIGKILL, its recording unfinished. So the agent also listens on the interpreter's wakeup fd, which the C-level
handler writes on whatever thread the signal lands: a thread of its own sees the signal at once, and when
the main thread has not run the handler within GRACE_S, it does the handler's work itself.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from zeromon.model.events import END_EXIT

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


def gloo_workers_alive() -> bool:
    """Whether a gloo worker thread (``pt_gloo_runloop``) of this process is alive, read from /proc (Linux);
    True where that cannot be read (the exit collects then, as it did before it asked)."""
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return True
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                if comm.read().strip() == "pt_gloo_runloop":
                    return True
        except OSError:  # a thread that ended meanwhile
            continue
    return False


# A SIGTERM the main thread cannot handle (SigtermWatch, below): the recording's end is written within this, or
# the rank dies without it (launchers send SIGKILL after a grace period of their own, often 30 s).
STOP_WITHIN_S = 3.0


class ExitHandlers:
    """The agent's hooks on the process's end. ``stop(how, detail)`` ends the recording (Agent.stop);
    ``say_progress(reason)`` writes where the rank is, for a SIGTERM the main thread cannot handle yet."""

    def __init__(self, stop: Callable[[str, str | None], None], say_progress: Callable[[str], None],
                 collect_at_exit: Callable[[], bool] = lambda: True) -> None:
        self._stop = stop
        self._say_progress = say_progress
        self._collect_at_exit = collect_at_exit
        self._pid = os.getpid()  # a forked child inherits the agent: it must not end its parent's recording
        self._previous_sigterm: Any = None
        self._sigterm_watch: SigtermWatch | None = None  # stops the rank when its main thread cannot run the handler
        self._stop_lock = threading.RLock()  # RLock: SIGTERM may arrive while atexit is stopping
        # The thread inside the stop (threading.get_ident), and a SIGTERM that arrived there: acted on once the
        # recording is ended (stopping).
        self._stopping_thread: int | None = None
        self._signal_after_stop: tuple[int, Any] | None = None
        # How deep the main thread is in the recorder's locked writes (writing), and a SIGTERM that arrived there.
        self.writing_depth = 0
        self._signal_after_write: tuple[int, Any] | None = None
        self._ending: tuple[str, str | None] | None = None  # (RunEnd.how, detail) seen by the excepthook
        self._exit_status = 0  # of the last sys.exit() in the main thread

    def install(self) -> None:
        """atexit, SIGTERM (from the main thread only, where Python allows a handler), the excepthook and sys.exit."""
        atexit.register(self._at_exit)
        self._install_sigterm()
        self._install_excepthook()
        self._install_exit_note()

    def uninstall(self) -> None:
        """The signal watch stopped and SIGTERM's handler given back (from the main thread only)."""
        if self._sigterm_watch is not None:
            self._sigterm_watch.stop()
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            except (ValueError, OSError):
                pass
            self._previous_sigterm = None

    def forked(self) -> bool:
        """Whether this is a forked child of the process that started the agent (a DataLoader worker)."""
        return os.getpid() != self._pid

    @contextlib.contextmanager
    def stopping(self) -> Iterator[None]:
        """Around the agent's stop, one thread at a time: a SIGTERM that arrives in this thread meanwhile goes
        as it would have gone once the stop is over and the recording's end written."""
        with self._stop_lock:
            previous_sigterm = self._previous_sigterm  # before the stop gives the handler back (uninstall)
            self._stopping_thread = threading.get_ident()
            try:
                yield
            finally:
                self._stopping_thread = None
        pending, self._signal_after_stop = self._signal_after_stop, None
        if pending is not None:
            self._after_sigterm(previous_sigterm, *pending)

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        """Around a record the main thread writes through the recorder's locks (a notice, the run info): a
        SIGTERM whose handler runs inside is acted on once the locks are let go."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self.writing_depth += 1
        try:
            yield
        finally:
            self.writing_depth -= 1
            pending = self._signal_after_write if not self.writing_depth else None
            if pending is not None:
                self._signal_after_write = None
                self._on_sigterm(*pending)

    def _at_exit(self) -> None:
        """atexit: the interpreter is ending, after an uncaught exception if the hook below saw one."""
        ending = self._ending
        if ending is None and self._exit_status:
            ending = (f"{END_EXIT} {self._exit_status}", None)
        self._stop(*(ending if ending is not None else (END_EXIT, None)))
        # What the stop let go of (a model, its process groups: often in reference cycles) is collected now, while
        # the interpreter is whole; left to the finalization's collection, a group's gloo workers would still
        # run there, where gloo can abort a rank that finished. A pause at exit only, never in training: a full
        # collection, a tenth of a second or two with torch loaded, which the agent spares a script whose own
        # teardown freed its groups once the agent had let go of them (Agent.let_go_of_training).
        try:
            if self._collect_at_exit():
                gc.collect()
        except Exception:  # noqa: BLE001, S110 - nothing at exit may fail because of zeromon
            pass

    def _install_excepthook(self) -> None:
        """Note the exception that ends the script, for the end record; then the hook that was there
        (the user's, or Python's, which prints the traceback) runs as before."""
        previous = sys.excepthook

        def excepthook(exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
            try:
                if self._ending is None:
                    self._ending = (f"exception {exc_type.__name__}", str(exc)[:500] or None)
            except Exception:  # noqa: BLE001 - never in the way of the traceback
                pass
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook

    def _install_exit_note(self) -> None:
        """Note the status of sys.exit() in the main thread ("exit 1"; argparse's errors and `sys.exit(main())`
        end this way), for the end record: atexit cannot see it, and a rank that exits 1 has failed. The
        call goes on as before; the last call noted wins (a SystemExit caught, then sys.exit(0), is clean).
        ``raise SystemExit(n)`` itself is not seen: it reads as a clean exit."""
        previous = sys.exit

        def exit(status: object = None) -> NoReturn:  # noqa: A001 - sys.exit's own name
            try:
                if threading.current_thread() is threading.main_thread():
                    code = status if isinstance(status, int) or status is None else 1  # a message: status 1
                    self._exit_status = int(code or 0)
            except Exception:  # noqa: BLE001 - never in the way of the exit
                pass
            previous(status)  # type: ignore[arg-type]  # sys.exit takes any object (printed unless an int)
            raise SystemExit(status)  # not reached: for a previous sys.exit that returned

        sys.exit = exit

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._previous_sigterm = previous
        except (ValueError, OSError):
            return
        watch = SigtermWatch(self._on_sigterm_blocked)
        if watch.start():
            self._sigterm_watch = watch

    def _on_sigterm_blocked(self) -> None:
        """A SIGTERM whose handler the main thread has not run (it is blocked in C code: a collective that does not
        complete), from the signal watch's thread: what the handler would do, so that the rank stops as promptly
        as it would without zeromon, its recording saying where it was."""
        previous = self._previous_sigterm
        if previous == signal.SIG_IGN:
            return
        if signal.getsignal(signal.SIGTERM) != self._on_sigterm:  # the program set its own handler since: its call
            return
        if callable(previous):  # the program's own handler runs once the main thread is back, as without zeromon
            self._say_progress("signal SIGTERM")
            return
        # The main thread may hold a lock the stop needs (blocked in C code inside a write): the rank dies by the
        # signal after STOP_WITHIN_S all the same.
        stopper = threading.Thread(target=self._stop, args=("signal SIGTERM", None), name="zeromon-sigterm",
                                   daemon=True)
        stopper.start()
        stopper.join(STOP_WITHIN_S)
        die_by(signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.forked():  # a forked child that inherited the handler: what SIGTERM did before zeromon
            self._after_sigterm(self._previous_sigterm, signum, frame)
            return
        if self._sigterm_watch is not None:
            self._sigterm_watch.handled()
        if self.writing_depth:
            # The main thread (where handlers run) holds a lock of the recorder's that the stop takes: stopping
            # here would wait for it forever. Acted on as the write ends (writing), microseconds later.
            self._signal_after_write = (signum, frame)
            return
        if self._stopping_thread == threading.get_ident():
            # This thread is inside the stop (atexit after an exception, say, as the launcher stops the other
            # ranks): dying now would lose the end record it is writing. stopping() acts on the signal once it is.
            self._signal_after_stop = (signum, frame)
            return
        previous = self._previous_sigterm
        self._stop(f"signal {signal.Signals(signum).name}", None)  # flushes the recording and ends it
        self._after_sigterm(previous, signum, frame)

    @staticmethod
    def _after_sigterm(previous: Any, signum: int, frame: Any) -> None:
        """What SIGTERM did before zeromon's handler: the previous handler, nothing, or death by the signal."""
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_IGN:
            return
        else:  # default action: die by the same signal, as the launcher expects
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
