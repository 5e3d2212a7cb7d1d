"""How the rank's process ends, as the recording's end says it: atexit, the excepthook, sys.exit's status and SIGTERM.

ExitHandlers notes how the script ended (an exception, an exit status) for the end record, and turns a SIGTERM
into the agent's stop before the signal does what it did without zeromon. A signal that lands where stopping would
deadlock or lose the end record (inside a locked write, inside the stop itself) is acted on once that is done.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from zeromon.model.events import END_EXIT
from zeromon_agent.signals import SigtermWatch, die_by

# A SIGTERM the main thread cannot handle (signals.SigtermWatch): the recording's end is written within this, or
# the rank dies without it (launchers send SIGKILL after a grace period of their own, often 30 s).
STOP_WITHIN_S = 3.0


class ExitHandlers:
    """The agent's hooks on the process's end. ``stop(how, detail)`` ends the recording (Agent.stop);
    ``say_progress(reason)`` writes where the rank is, for a SIGTERM the main thread cannot handle yet."""

    def __init__(self, stop: Callable[[str, str | None], None], say_progress: Callable[[str], None]) -> None:
        self._stop = stop
        self._say_progress = say_progress
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
        # run there, where gloo can abort a rank that finished. A pause at exit only, never in training.
        try:
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
