"""The in-rank agent: wires the hooks, the memory sampler, the recorder and the exit handlers."""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import math
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from zeromon.model.events import END_DETACH, END_EXIT
from zeromon.model.jsonl import RecordingWriter
from zeromon.model.kinds import rank_file_name
from zeromon.model.segments import CompactWriter
from zeromon_agent import collectives, ddp
from zeromon_agent.activations import SavedTensorMeter
from zeromon_agent.config import AgentConfig
from zeromon_agent.memory import (
    Categorizer,
    CudaMemory,
    LocalRankCount,
    cpu_capacity,
    launched_local_ranks,
    local_ranks,
    process_rss,
)
from zeromon_agent.peaks import MemoryPoints, PeakSearch
from zeromon_agent.phases import PhaseTracker
from zeromon_agent.recorder import Recorder
from zeromon_agent.signals import SigtermWatch, die_by
from zeromon_agent.state import RAW_MEMORY, RAW_OOM, STATE, HotState, perf_ns

if TYPE_CHECKING:
    from zeromon_agent.figures import StepFigures

log = logging.getLogger("zeromon.agent")

# A SIGTERM the main thread cannot handle (signals.SigtermWatch): the recording's end is written within this, or
# the rank dies without it (launchers send SIGKILL after a grace period of their own, often 30 s).
STOP_WITHIN_S = 3.0
# Keep the category walk (and activation counting) under this share of step time when
# ZEROMON_MEMORY_EVERY=auto.
_WALK_BUDGET = 0.0025


def _dist_identity() -> tuple[int, int, int, str | None]:
    """(rank, local_rank, world_size, backend) from the process group, else the launcher's env."""
    rank = int(os.environ.get("RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    backend = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
            backend = str(dist.get_backend())
    except Exception:  # noqa: BLE001
        pass
    local_rank = int(os.environ.get("LOCAL_RANK", str(rank)) or rank)
    return rank, local_rank, world, backend


def _process_start_unix(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start_ticks = int(fields[19])
        with open("/proc/stat") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
        return btime + start_ticks / os.sysconf("SC_CLK_TCK")
    except Exception:  # noqa: BLE001
        return None


def default_run_dir() -> Path:
    """zeromon-runs/<launch time>-<launcher pid>: the same for every rank a launcher started."""
    ppid = os.getppid()
    started = _process_start_unix(ppid) or time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(started))
    return Path("zeromon-runs") / f"{stamp}-{ppid}"


def default_job() -> str:
    return Path(sys.argv[0]).stem if sys.argv and sys.argv[0] else "python"


# The key in the job's rendezvous store under which its ranks agree on one run id.
RUN_ID_KEY = "zeromon/run_id"


def shared_run_id() -> str | None:
    """One id for every rank of this job, however many launchers (nodes) started them and wherever
    each wrote its recording: the first rank to ask puts a random id in the process group's store
    (the rendezvous store every rank already reached to join), the others read that one. compare_set
    neither waits for another rank nor blocks on one: a single round trip to the store, once, at the
    agent's start. None without a process group, or with a store
    that does not answer: the recording then has no run id and readers compare job and world size."""
    try:
        import uuid

        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        if not (dist.is_available() and dist.is_initialized()):
            return None
        value = distributed_c10d._get_default_store().compare_set(RUN_ID_KEY, "", uuid.uuid4().hex)
        return value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    except Exception:  # noqa: BLE001 - a private API or a store without compare_set: no run id, no harm
        return None


# The step at whose memory sample the ranks on this host are read from the store (memory.LocalRankCount):
# every rank has joined by then, since the first steps' collectives needed them all.
LOCAL_COUNT_STEP = 2

class Agent:
    def __init__(self, config: AgentConfig, state: HotState = STATE) -> None:
        self.config = config
        self.state = state
        self.model: Any = None
        self.optimizer: Any = None
        self.engine: Any = None
        self.rank, self.local_rank, self.world_size, self.backend = _dist_identity()
        self.job = config.job or default_job()
        self.run_dir = Path(config.out_dir) if config.out_dir else default_run_dir()
        self.tracker = PhaseTracker(state, on_boundary=self._on_boundary)
        self.meter = SavedTensorMeter() if config.activations else None
        self.categorizer = Categorizer()
        self._walk_this_forward = False
        # The moments of a walk step (peaks.MemoryPoints), reported through the tracker's guarded,
        # timed boundary so that the time spent there is the agent's, not the forward's or backward's.
        self.points = MemoryPoints(self._memory_point)
        self.search = PeakSearch()
        self._walk_spent_s = 0.0
        self.recorder: Recorder | None = None
        self.cuda_memory: CudaMemory | None = None
        self.device_name = "cpu"
        self.capacity: int | None = None
        # The ranks on this host where no launcher said (memory.LocalRankCount): joined at the first step's
        # memory sample, read at LOCAL_COUNT_STEP's; None once done or not needed.
        self._local_count: LocalRankCount | None = None
        self.started = False
        self._framework_known = False
        self._ddp_checked: weakref.ref[Any] | None = None  # the root last looked at for DDP (inside wrappers)
        self._optimizer_announced = False
        self._first_step_described = False  # the run info written again once the first step has ended
        self._walk_cost_s = 0.0
        self._last_walk_step = -(10**9)
        self._step_started: tuple[int, float] | None = None  # (step, perf_counter at its first forward)
        self._step_s: float | None = None
        self._previous_sigterm: Any = None
        self._pid = os.getpid()  # a forked child inherits the agent: it must not end its parent's recording
        self._sigterm_watch: SigtermWatch | None = None  # stops the rank when its main thread cannot run the handler
        self._stop_lock = threading.RLock()  # RLock: SIGTERM may arrive while atexit is stopping
        # The thread inside stop() (threading.get_ident), and a SIGTERM that arrived there: acted on once the
        # recording is ended (_on_sigterm).
        self._stopping_thread: int | None = None
        self._signal_after_stop: tuple[int, Any] | None = None
        # The main thread inside one of the recorder's locked writes (_writing), and a SIGTERM that arrived there.
        self._writing_depth = 0
        self._signal_after_write: tuple[int, Any] | None = None
        self._ending: tuple[str, str | None] | None = None  # (RunEnd.how, detail) seen by the excepthook
        self._exit_status = 0  # of the last sys.exit() in the main thread
        self.endpoint: Any = None  # zeromon_agent.endpoint.AgentEndpoint while it serves
        self._figures_live: Any = None  # snapshot.LiveData of latest_step_figures() where no endpoint serves

    # --- lifecycle --------------------------------------------------------------------------------
    def start(self, model: Any = None, optimizer: Any = None, engine: Any = None) -> Agent:
        """Start recording. Never raises: whatever fails here (a bug, an unexpected environment) is one
        log line, and the training goes on unobserved (``started`` stays False)."""
        try:
            return self._start(model, optimizer, engine)
        except Exception as exc:  # noqa: BLE001 - zeromon must never be the reason a run dies
            log.warning("zeromon: rank %d: the agent did not start (training goes on unobserved): %s: %s",
                        self.rank, type(exc).__name__, exc)
            self.state.enabled = False
            self.started = True  # so that stop() undoes what did start
            self.stop(END_DETACH, f"the agent did not start: {type(exc).__name__}: {exc}")
            return self

    def _start(self, model: Any, optimizer: Any, engine: Any) -> Agent:
        import torch

        self.state.resize(self.config.buffer_events)
        self.state.async_sample_every = self.config.async_sample_every
        collectives.install(self.state)
        collectives.install_functional(self.state)
        collectives.repatch_deepspeed()

        cuda_index = None
        capacity_note = ""
        if torch.cuda.is_available():
            cuda_index = torch.cuda.current_device()
            self.device_name = f"cuda:{cuda_index}"
            self.cuda_memory = CudaMemory(cuda_index)
            from zeromon_agent.cuda import CudaTimer

            self.state.device_timer = CudaTimer.create(torch)
            self.state.device_timing_every = self.config.device_timing_every
            self.state.time_step()
        else:
            # Where no launcher says how many ranks this host runs and there are several in all, they are counted on
            # the store once training runs (_count_local_ranks); until then the note claims no count.
            counted_later = launched_local_ranks() is None and self.world_size > 1
            self.capacity, capacity_note = cpu_capacity(None if counted_later else local_ranks())
            if self.config.cpu_capacity:
                self.capacity, capacity_note = self.config.cpu_capacity, "capacity set by ZEROMON_CPU_CAPACITY"
            elif counted_later:
                self._local_count = LocalRankCount()

        writer = None
        if self.config.record:
            # Never raises: a folder that cannot be written (read-only, full, a path under a file) gives
            # a writer that counts what it could not write; the recorder says so once (a Notice, the
            # log) and the live endpoint serves all the same.
            compact = self.config.record_format == "compact"
            writer_type = CompactWriter if compact else RecordingWriter
            from zeromon_agent.attempts import start_attempt  # torchelastic: keeps an earlier attempt's file

            writer = writer_type.open_or_lost(
                self.run_dir / rank_file_name(self.rank, ".zmr" if compact else ".jsonl"), self.rank, job=self.job,
                world_size=self.world_size,
                run_id=shared_run_id(), host=os.uname().nodename, pid=os.getpid(), created_unix_ns=time.time_ns(),
                flush_interval_s=self.config.flush_interval_s, end_record=True,
                **start_attempt(self.run_dir, self.rank, self.world_size))
        device = None
        if cuda_index is not None and self.config.device_interval_s > 0:
            from zeromon_agent.device import NvmlDevice

            device = NvmlDevice(cuda_index)
        self.recorder = Recorder(self.state, self.rank, writer, self.config.flush_interval_s,
                                 recent_events=self.config.recent_events, device=device,
                                 device_interval_s=self.config.device_interval_s,
                                 cuda_timer=self.state.device_timer, max_disk=self.config.max_disk,
                                 hang_after_s=self.config.hang_after_s)
        if cuda_index is None:
            self.notice("info", "device", "no CUDA device: NVML device metrics and allocator stats "
                        f"are unavailable; memory is process RSS and per-category bytes; {capacity_note}")
        elif device is not None and not device.available:
            self.notice("warning", "nvml", device.reason)
        if cuda_index is not None:
            self._setup_oom_observer(torch)
        self.recorder.progress.model_of = self._walked_model
        self.recorder.start()
        self._start_endpoint()

        self.tracker.watch_optimizers(optimizer)
        self.tracker.watch_backward()
        self.attach_objects(model=model, optimizer=optimizer, engine=engine)
        if self.tracker.root is None:
            self.tracker.watch_for_root()
        self._write_run_info()
        atexit.register(self._at_exit)
        self._install_sigterm()
        self._install_excepthook()
        self.started = True
        self.state.enabled = True
        return self

    def attach_objects(self, model: Any = None, optimizer: Any = None, engine: Any = None) -> None:
        if optimizer is not None:
            self.optimizer = optimizer
            self.tracker.optimizer = optimizer
        if engine is not None:
            self.engine = engine
            self.tracker.stop_watching_for_root()
            self.tracker.watch_engine(engine)
            self._framework_known = False
        elif model is not None:
            self.model = model
            self.tracker.stop_watching_for_root()
            self.tracker.set_root(model)
            self._framework_known = False
            # Before the first backward: a DDP model's buckets are recorded through a comm hook, and
            # the forward-time check below never runs once the framework is known from this model.
            self._maybe_adopt_engine()
        if self.started:
            self._write_run_info()

    def stop(self, how: str = END_DETACH, detail: str | None = None) -> None:
        """Flush and close, ending the recording with how the rank ended (RunEnd.how; by default the
        agent was stopped on purpose). Safe to call more than once, from atexit or a signal handler."""
        if os.getpid() != self._pid:
            return  # a forked child (a DataLoader worker): the recording and the endpoint are its parent's
        with self._stop_lock:
            if not self.started:
                return
            self.started = False
            self.state.enabled = False
            self._stopping_thread = threading.get_ident()
            previous_sigterm = self._previous_sigterm
            try:
                self._stop_parts(how, detail)
            finally:
                self._stopping_thread = None
        pending, self._signal_after_stop = self._signal_after_stop, None
        if pending is not None:  # a SIGTERM that came during the stop: as it would have gone, now that the end is written
            self._after_sigterm(previous_sigterm, *pending)

    def _stop_parts(self, how: str, detail: str | None) -> None:
        """stop()'s work, under its lock: the hooks off, the recording ended, the endpoint closed."""
        # Where the rank is, while the model is still known (the submodule a blocked collective serves).
        progress = self.recorder.final_progress(how) if self.recorder is not None else None
        try:
            if self.meter is not None:
                self.meter.stop()
                self.meter.release()
            self.points.close()
            self.tracker.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("zeromon: error while stopping the agent: %r", exc)
        # The training's objects are let go, whatever the hooks' removal met: held on, a DDP or FSDP model kept
        # its process group past the script's destroy_process_group, and with it gloo's worker threads, which
        # then ran on into the interpreter's exit (where gloo can abort a finished rank).
        self.categorizer.release()
        self.model = self.optimizer = self.engine = None
        try:
            if self.recorder is not None:
                self.recorder.stop(how=how, detail=detail, progress=progress)
        except Exception as exc:  # noqa: BLE001
            log.warning("zeromon: error while stopping the agent's recorder: %r", exc)
        # torch.distributed's own functions and Work.wait back, after the recorder's last drain: a training that
        # goes on runs torch's code, not a wrapper's flag check (a name another module copied keeps the wrapper,
        # which passes straight through once the state is off).
        collectives.uninstall()
        self.state.pending.clear()
        self.state.works.clear()
        # After the recorder's last drain: a final scrape still sees the end of the run.
        endpoint, self.endpoint = self.endpoint, None
        if endpoint is not None:
            try:
                endpoint.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("zeromon: error while stopping the endpoint: %r", exc)
        if self._sigterm_watch is not None:
            self._sigterm_watch.stop()
        if self._previous_sigterm is not None and threading.current_thread() is threading.main_thread():
            try:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
            except (ValueError, OSError):
                pass
            self._previous_sigterm = None

    def _at_exit(self) -> None:
        """atexit: the interpreter is ending, after an uncaught exception if the hook below saw one."""
        ending = self._ending
        if ending is None and self._exit_status:
            ending = (f"{END_EXIT} {self._exit_status}", None)
        self.stop(*(ending if ending is not None else (END_EXIT, None)))
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
        self._install_exit_note()

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
            if self.recorder is not None:
                self.recorder.say_progress("signal SIGTERM")
            return
        # The main thread may hold a lock the stop needs (blocked in C code inside a write): the rank dies by the
        # signal after STOP_WITHIN_S all the same.
        stopper = threading.Thread(target=self.stop, args=("signal SIGTERM",), name="zeromon-sigterm", daemon=True)
        stopper.start()
        stopper.join(STOP_WITHIN_S)
        die_by(signal.SIGTERM)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked child that inherited the handler: what SIGTERM did before zeromon
            self._after_sigterm(self._previous_sigterm, signum, frame)
            return
        if self._sigterm_watch is not None:
            self._sigterm_watch.handled()
        if self._writing_depth:
            # The main thread (where handlers run) holds a lock of the recorder's that stop() takes: stopping
            # here would wait for it forever. Acted on as the write ends (_writing), microseconds later.
            self._signal_after_write = (signum, frame)
            return
        if self._stopping_thread == threading.get_ident():
            # This thread is inside stop() (atexit after an exception, say, as the launcher stops the other ranks):
            # dying now would lose the end record it is writing. stop() acts on the signal once it is written.
            self._signal_after_stop = (signum, frame)
            return
        previous = self._previous_sigterm
        self.stop(f"signal {signal.Signals(signum).name}")  # flushes the recording and ends it
        self._after_sigterm(previous, signum, frame)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a record the main thread writes through the recorder's locks (a notice, the run info): a
        SIGTERM whose handler runs inside is acted on once the locks are let go."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        self._writing_depth += 1
        try:
            yield
        finally:
            self._writing_depth -= 1
            pending = self._signal_after_write if not self._writing_depth else None
            if pending is not None:
                self._signal_after_write = None
                self._on_sigterm(*pending)

    def notice(self, level: str, source: str, message: str) -> None:
        """A Notice in the recording and the live views (none without a recorder)."""
        if self.recorder is not None:
            with self._writing():
                self.recorder.notice(level, source, message)

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

    def _start_endpoint(self) -> None:
        """Serve /metrics and the snapshot. Binding is immediate; any failure is a Notice, never an error."""
        if not self.config.endpoint or self.recorder is None:
            return
        recorder = self.recorder
        try:
            from zeromon.model.registry import REGISTRY_ENV, registry_dir
            from zeromon_agent.endpoint import AgentEndpoint

            folder = registry_dir({REGISTRY_ENV: self.config.registry or ""})
            self.endpoint = AgentEndpoint.start(
                recorder, rank=self.rank, local_rank=self.local_rank, world_size=self.world_size, job=self.job,
                run_dir=self.run_dir, address=self.config.bind, base_port=self.config.port, token=self.config.token,
                registry_folder=folder, notice=recorder.notice)
        except Exception as exc:  # noqa: BLE001 - no endpoint is no reason to stop training
            message = f"the HTTP endpoint did not start ({self.config.bind}, base port {self.config.port}): {exc}"
            log.warning("zeromon: rank %d: %s", self.rank, message)
            self.notice("warning", "endpoint", message)

    # --- in-process readers -----------------------------------------------------------------------
    def latest_step_figures(self) -> StepFigures | None:
        """The newest step the agent has summarized and the memory outlook (figures.StepFigures), for
        in-process readers such as the trainers' logging callbacks (zeromon_agent.integrations).

        From any thread; never raises (an error is counted as a hook error) and never waits for another
        reader: the views are shared with the endpoint and taken at most every snapshot.VIEW_TTL_S, and a
        view being taken by a scrape answers the previous one. The recorder summarizes steps on its own
        thread, so the newest step here trails the training by up to a pass (StepFigures.step names it).
        None before the first summarized step, or when the agent is not recording."""
        try:
            live = self._live_data()
            if live is None:
                return None
            self.recorder.watched()  # type: ignore[union-attr]  # a reader: passes come every LIVE_PASS_S
            view = live.view_if_free()
            if view is None:
                return None
            from zeromon_agent.figures import figures_of  # with the snapshot's analysis: only once asked

            return figures_of(view, self.rank)
        except Exception as exc:  # noqa: BLE001 - a reader's question must never stop the training
            self.state.hook_error("step_figures", exc)
            return None

    def _live_data(self) -> Any:
        """The endpoint's LiveData, else one of the agent's own (no endpoint); None without a recorder."""
        if self.recorder is None or not self.started:
            return None
        live = getattr(self.endpoint, "live", None)
        if live is not None:
            return live
        if self._figures_live is None:
            from zeromon_agent.snapshot import Identity, LiveData

            identity = Identity(rank=self.rank, local_rank=self.local_rank, world_size=self.world_size,
                                host=os.uname().nodename, pid=os.getpid(), job=self.job, start_ns=time.time_ns())
            self._figures_live = LiveData(self.recorder, identity)
        return self._figures_live

    # --- run info ---------------------------------------------------------------------------------
    def _write_run_info(self) -> None:
        from zeromon_agent import runinfo

        try:
            model = self.model if self.model is not None else self.tracker.root
            engine = self.engine if self.engine is not None else self.tracker.engine
            optimizer = self.optimizer if self.optimizer is not None else self.tracker.optimizer
            framework = runinfo.detect(model=model, optimizer=optimizer, engine=engine)
            self._framework_known = framework["framework"] != "unknown"
            info = runinfo.build(self.rank, self.local_rank, self.world_size, self.job, self.backend,
                                 self.device_name, framework)
            if self.recorder is not None:
                with self._writing():
                    self.recorder.set_run_info(info)
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("run_info", exc)

    def _maybe_adopt_engine(self) -> None:
        root = self.tracker.root
        if root is not None and (self._ddp_checked is None or self._ddp_checked() is not root):
            # Looked at once per root (the walk below is not for every forward), held weakly: a detached agent
            # must not keep the model, nor through it the process group (tests/test_gloo_exit.py).
            self._ddp_checked = weakref.ref(root)
            wrapped = ddp.find_ddp(root)
            if wrapped is not None:
                reason = ddp.register_recorded_allreduce(wrapped, self.state)
                if reason is not None:
                    self.notice("warning", "ddp", reason)
        if root is None or self.engine is not None:
            return
        engine_mod = sys.modules.get("deepspeed.runtime.engine")
        if engine_mod is not None and isinstance(root, engine_mod.DeepSpeedEngine):
            self.engine = root
            self.tracker.watch_engine(root)

    # --- memory -----------------------------------------------------------------------------------
    # Every step: a sample (allocator totals or RSS) at the forward's, the backward's and the step's
    # end. In a walk step (_walk_due: within _WALK_BUDGET of step time) also the categories: at the
    # forward's end, and at the moments inside the forward and the backward that peaks.MemoryPoints
    # names, keeping the highest of each: "forward_peak" and "backward_peak" samples. The highest is
    # by the allocator's allocated bytes on GPU (one read per moment, a walk only at a new high) and
    # by the categories' sum on CPU, which has no allocator count (a walk of what moves per moment).
    def _on_boundary(self, what: str) -> None:
        if what == "forward_start":
            step = self.state.step
            if self._step_started is None or self._step_started[0] != step:
                self._step_started = (step, time.perf_counter())
            if not self._framework_known:
                self._maybe_adopt_engine()
                self._write_run_info()
            self._finish_search()  # a forward with no backward after it (evaluation)
            self._walk_this_forward = self._walk_due()
            if self._walk_this_forward:
                self._begin_search()
            return
        if what == "forward_point" or what == "backward_point":
            self._at_point()
            return
        if what == "forward_end":
            if self._walk_this_forward:
                self._end_forward_search()
            else:
                self.sample_memory("forward", categories=False)
            self._walk_this_forward = False
        elif what == "backward_end":
            if self.search.best is not None:
                self._end_backward_search()
            else:
                self.sample_memory("backward", categories=False)
        elif what == "optimizer_start":
            if self.started and self.optimizer is None and not self._optimizer_announced:
                self._optimizer_announced = True
                self._write_run_info()  # the optimizer is known before it allocates its state
        elif what == "step_end":
            started = self._step_started
            if started is not None and started[0] == self.state.step:
                self._step_s = time.perf_counter() - started[1]  # first forward to optimizer step
            self.sample_memory("optimizer", categories=False)
            if self.started and not self._first_step_described:
                # What the first forward settles is read after it: FSDP2 keeps its root gathered after forward
                # from its lazy init on. Under optimizer.step(closure) (Lightning's Trainer) the optimizer's
                # start, the run info's last look, comes before that forward.
                self._first_step_described = True
                self._write_run_info()

    def _memory_point(self, what: str) -> None:
        self.tracker._boundary(what)

    def _walk_due(self) -> bool:
        """Whether this forward starts a walk step (at most one a step): the categories at its end and
        the peaks of its forward and backward. ``_walk_cost_s`` is what the last walk step cost."""
        step = self.state.step
        if step >= 1 > self._last_walk_step:
            return True  # the first step after the first optimizer step: its state exists from now on
        if self.config.memory_every:
            every = self.config.memory_every
        elif self._step_s and self._walk_cost_s:
            every = max(1, math.ceil(self._walk_cost_s / (_WALK_BUDGET * self._step_s)))
        else:
            every = 1
        return step - self._last_walk_step >= every

    def _walked_model(self) -> Any:
        """The module whose FSDP2 units or blocks hold the moments (a DeepSpeed engine's module)."""
        model = getattr(self.engine, "module", None) if self.engine is not None else None
        if model is None:
            model = self.model if self.model is not None else self.tracker.root
        return model

    def _begin_search(self) -> None:
        w0 = time.perf_counter()
        self._walk_spent_s = 0.0
        self.search.begin_step()
        self.search.begin_phase("forward")
        # What holds still (parameter shards, buffers, optimizer state) once; each moment of this
        # forward and its backward then walks only what moves.
        self.categorizer.walk_still(model=self.model if self.model is not None else self.tracker.root,
                                    optimizer=self._walked_optimizer(), engine=self.engine)
        if self.meter is not None:
            # Activations are counted in the walk steps only: the pack hook is a cost per saved
            # tensor, so it follows the same budget.
            self.meter.start(self.categorizer.buffer_pointers())
        self.points.arm(self._walked_model())
        self._walk_spent_s += time.perf_counter() - w0

    def _at_point(self) -> None:
        """A moment inside this walk step's forward or backward: kept if memory is the highest yet."""
        search = self.search
        if search.best is None or not search.wants():
            return
        w0 = time.perf_counter()
        t = perf_ns()
        try:
            if self.cuda_memory is not None:
                level = self.cuda_memory.allocated()
                if level is None or level <= search.best.level:
                    return
                cats = self._categories(moving=True)
            else:
                cats = self._categories(moving=True)
                level = sum(cats.values())
                if level <= search.best.level:
                    return
            search.offer(level, t, self._memory_fields(cats))
        finally:
            self._walk_spent_s += time.perf_counter() - w0

    def _end_forward_search(self) -> None:
        """The forward's end (the ``forward`` sample, always walked) is its last moment; then the
        forward's peak."""
        w0 = time.perf_counter()
        search = self.search
        if self.meter is not None:
            self.meter.stop()  # its alive bytes follow the frees through the backward
        t = perf_ns()
        fields = self._memory_fields(self._categories(moving=True))
        self._last_walk_step = self.state.step
        if search.best is not None:
            search.wants()  # counted: the end is always looked at
            level = self._level(fields)
            if level is not None:
                search.offer(level, t, fields)
            peak = search.end_phase()
            if peak is not None and peak.fields is not None:  # fields: for mypy; end_phase checks
                self._push_memory("forward_peak", peak.t, peak.fields)
            search.begin_phase("backward")
        self._push_memory("forward", t, fields)
        self._walk_spent_s += time.perf_counter() - w0

    def _end_backward_search(self) -> None:
        """The backward's end is its last moment (all gradients there), then the backward's peak."""
        w0 = time.perf_counter()
        self._at_point()
        t = perf_ns()
        fields = self._memory_fields({})
        peak = self.search.end_phase()
        if peak is not None and peak.fields is not None:
            self._push_memory("backward_peak", peak.t, peak.fields)
        self._push_memory("backward", t, fields)
        self._walk_spent_s += time.perf_counter() - w0
        self._finish_search()

    def _finish_search(self) -> None:
        if self.search.best is None and not self.points.armed:
            return
        self.search.end_step()
        self.points.disarm()
        if self.meter is not None:
            self.meter.stop()
            self.meter.release()
        self._walk_cost_s = self._walk_spent_s

    def _walked_optimizer(self) -> Any:
        return self.optimizer if self.optimizer is not None else self.tracker.optimizer

    def _categories(self, moving: bool) -> dict[str, int]:
        if moving:
            cats = self.categorizer.categorize_moving()
        else:
            cats = self.categorizer.categorize(model=self.model if self.model is not None else self.tracker.root,
                                               optimizer=self._walked_optimizer(), engine=self.engine)
        if self.meter is not None and self.points.armed:
            cats["activations"] = self.meter.alive_bytes
        return cats

    def _level(self, fields: dict[str, Any]) -> int | None:
        """What "highest" compares: allocated bytes on GPU, the categories' sum on CPU."""
        if self.cuda_memory is not None:
            return fields.get("allocated")
        cats = fields.get("categories")
        return sum(cats.values()) if cats else None

    def sample_memory(self, phase: str, categories: bool, activations: int | None = None) -> None:
        """Take a memory sample at the end of ``phase`` (with the category walk if asked)."""
        t = perf_ns()
        cats: dict[str, int] = {}
        if categories:
            w0 = time.perf_counter()
            cats = self._categories(moving=False)
            self._walk_cost_s = time.perf_counter() - w0
            self._last_walk_step = self.state.step
        if activations is not None:
            cats["activations"] = activations
        if self._local_count is not None:
            self._count_local_ranks(self._local_count)
        self._push_memory(phase, t, self._memory_fields(cats))

    def _count_local_ranks(self, count: LocalRankCount) -> None:
        """The host's share of its memory per rank where no launcher said how many ranks it runs: each rank
        joins the count at its first sample, and reads it at LOCAL_COUNT_STEP (two store round trips, once)."""
        try:
            if not count.joined:
                if not count.join():
                    return
            if self.state.step < LOCAL_COUNT_STEP:
                return
            self._local_count = None
            ranks = count.read()
            if ranks is None or ranks == 1:
                return
            self.capacity, note = cpu_capacity(ranks)
            self.notice("info", "device", f"{note} (ranks on this host counted on the process group's store: "
                        "the launcher set no LOCAL_WORLD_SIZE)")
        except Exception as exc:  # noqa: BLE001 - the launcher's word (or 1) stands
            self._local_count = None
            self.state.hook_error("local_ranks", exc)

    def _memory_fields(self, cats: dict[str, int]) -> dict[str, Any]:
        """A MemorySample's fields now, with the categories ``cats`` (bytes; {}: none walked)."""
        fields: dict[str, Any] = {"device": self.device_name, "allocated": None, "reserved": None,
                                  "active": None, "peak_allocated": None, "peak_reserved": None,
                                  "inactive_split": None, "num_alloc_retries": None, "num_ooms": None,
                                  "capacity": self.capacity, "free": None, "rss": process_rss()}
        if self.cuda_memory is not None:
            fields.update(self.cuda_memory.totals())
            fields["capacity"], fields["free"] = self.cuda_memory.capacity()
        if cats:
            allocated = fields["allocated"]
            if allocated is not None and len(cats) > ("activations" in cats):
                # On GPU the allocator's remainder: temporaries, caches, tensors outside the model.
                cats["other"] = max(0, allocated - sum(v for k, v in cats.items() if k != "other"))
            fields["categories"] = cats
        return fields

    def _push_memory(self, phase: str, t: int, fields: dict[str, Any]) -> None:
        self.state.push_control((RAW_MEMORY, phase, self.state.step, t, fields))

    def _setup_oom_observer(self, torch: Any) -> None:
        from zeromon_agent import cuda

        if self.config.memory_history:
            try:
                # A program that records the allocator's history already chose its own max_entries,
                # context and stacks; calling _record_memory_history again would replace them. Its
                # history serves the OOM snapshot as it is.
                already = getattr(torch._C, "_cuda_isHistoryEnabled", None)
                if already is not None and already():
                    self.notice("info", "cuda", "allocator history already on: the program's settings are kept "
                                "for the OOM snapshot")
                else:
                    torch.cuda.memory._record_memory_history(max_entries=100000)
            except Exception as exc:  # noqa: BLE001
                self.notice("warning", "cuda", f"allocator history unavailable: {exc}")

        def on_oom(device: int, alloc: int, device_alloc: int, device_free: int) -> None:
            try:
                snapshot = None
                if self.config.memory_history:
                    path = str(self.run_dir / f"oom-snapshot-rank-{self.rank}-{int(time.time())}.pickle")
                    snapshot = path if cuda.dump_snapshot(torch, path) else None
                info = {"allocated": int(device_alloc), "requested": int(alloc), "free": int(device_free)}
                self.state.push_control((RAW_OOM, perf_ns(), f"cuda:{device}", info, snapshot, self.state.phase,
                                 self.state.step))
            except Exception as exc:  # noqa: BLE001
                self.state.hook_error("oom_observer", exc)

        try:
            cuda.attach_oom_observer(torch, on_oom)
        except Exception as exc:  # noqa: BLE001
            self.state.hook_error("oom_observer", exc)
