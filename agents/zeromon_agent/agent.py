"""The in-rank agent: wires the hooks, the memory watch (memory/watch.py), the recorder (recorder/) and the exit handlers
(exits.py), and says what the run is (its run info)."""

from __future__ import annotations

import logging
import os
import sys
import time
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.model.events import END_DETACH
from zeromon.model.jsonl import RecordingWriter
from zeromon.model.kinds import rank_file_name
from zeromon.model.segments import CompactWriter
from zeromon_agent.context.config import AgentConfig
from zeromon_agent.exits import ExitHandlers, gloo_workers_alive
from zeromon_agent.hooks import collectives, ddp
from zeromon_agent.hooks.phases import PhaseTracker
from zeromon_agent.hooks.state import STATE, HotState
from zeromon_agent.memory.watch import MemoryWatch
from zeromon_agent.recorder.loop import Recorder

if TYPE_CHECKING:
    from zeromon_agent.live.figures import StepFigures

log = logging.getLogger("zeromon.agent")


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
        # The moments of a walk step go through the tracker's guarded, timed boundary (_memory_point).
        self.memory = MemoryWatch(config, state, self._training_objects, self._memory_point, self.notice)
        self.recorder: Recorder | None = None
        self.exits = ExitHandlers(self.stop, self._say_progress, self._collect_at_exit)
        self._let_go = False  # let_go_of_training ran: the script's teardown could free the training's objects
        self.started = False
        self._framework_known = False
        self._ddp_checked: weakref.ref[Any] | None = None  # the root last looked at for DDP (inside wrappers)
        self._optimizer_announced = False
        self._first_step_described = False  # the run info written again once the first step has ended
        self.endpoint: Any = None  # zeromon_agent.serve.endpoint.AgentEndpoint while it serves
        self._figures_live: Any = None  # live.view.LiveData of latest_step_figures() where no endpoint serves

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
            self.memory.use_cuda(cuda_index)
            from zeromon_agent.hooks.cuda import CudaTimer

            self.state.device_timer = CudaTimer.create(torch)
            self.state.device_timing_every = self.config.device_timing_every
            self.state.time_step()
        else:
            capacity_note = self.memory.use_cpu(self.world_size)

        writer = None
        if self.config.record:
            # Never raises: a folder that cannot be written (read-only, full, a path under a file) gives
            # a writer that counts what it could not write; the recorder says so once (a Notice, the
            # log) and the live endpoint serves all the same.
            compact = self.config.record_format == "compact"
            writer_type = CompactWriter if compact else RecordingWriter
            from zeromon_agent.context.attempts import (
                start_attempt,  # torchelastic: keeps an earlier attempt's file
            )

            writer = writer_type.open_or_lost(
                self.run_dir / rank_file_name(self.rank, ".zmr" if compact else ".jsonl"), self.rank, job=self.job,
                world_size=self.world_size,
                run_id=shared_run_id(), host=os.uname().nodename, pid=os.getpid(), created_unix_ns=time.time_ns(),
                flush_interval_s=self.config.flush_interval_s, end_record=True,
                **start_attempt(self.run_dir, self.rank, self.world_size))
        device = None
        if cuda_index is not None and self.config.device_interval_s > 0:
            from zeromon_agent.context.device import NvmlDevice

            device = NvmlDevice(cuda_index)
        self.recorder = Recorder(self.state, self.rank, writer, self.config.flush_interval_s,
                                 recent_events=self.config.recent_events, device=device,
                                 device_interval_s=self.config.device_interval_s,
                                 cuda_timer=self.state.device_timer, max_disk=self.config.max_disk,
                                 hang_after_s=self.config.hang_after_s,
                                 hang_after_setup_s=self.config.hang_after_setup_s)
        if cuda_index is None:
            self.notice("info", "device", "no CUDA device: NVML device metrics and allocator stats "
                        f"are unavailable; memory is process RSS and per-category bytes; {capacity_note}")
        elif device is not None and not device.available:
            self.notice("warning", "nvml", device.reason)
        if cuda_index is not None:
            self.memory.observe_oom(torch, self.run_dir, self.rank)
        self.recorder.progress.model_of = self.memory.walked_model
        self.recorder.start()
        self._start_endpoint()

        self.tracker.watch_optimizers(optimizer)
        self.tracker.watch_backward()
        self.attach_objects(model=model, optimizer=optimizer, engine=engine)
        if self.tracker.root is None:
            self.tracker.watch_for_root()
        self._write_run_info()
        self.exits.install()
        self.started = True
        self.state.enabled = True
        self.state.on_world_destroyed = self.let_go_of_training
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
        if self.exits.forked():
            return  # a forked child (a DataLoader worker): the recording and the endpoint are its parent's
        with self.exits.stopping():  # a SIGTERM meanwhile goes as it would have gone, once the end is written
            if not self.started:
                return
            self.started = False
            self.state.enabled = False
            self.state.on_world_destroyed = None
            self._stop_parts(how, detail)

    def _stop_parts(self, how: str, detail: str | None) -> None:
        """stop()'s work, under its lock: the hooks off, the recording ended, the endpoint closed."""
        # Where the rank is, while the model is still known (the submodule a blocked collective serves).
        progress = self.recorder.final_progress(how) if self.recorder is not None else None
        self._drop_training("stopping the agent")
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
        self.exits.uninstall()

    def _drop_training(self, doing: str) -> None:
        """The hooks off and the training's objects let go (stop() and let_go_of_training()), the objects whatever
        the hooks' removal met: held on, a DDP or FSDP model kept its process group past the script's
        destroy_process_group, and with it gloo's worker threads, which then ran on into the interpreter's exit
        (where gloo can abort a finished rank)."""
        try:
            self.memory.close()
            self.tracker.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("zeromon: error while %s: %r", doing, exc)
        self.memory.release()
        self.model = self.optimizer = self.engine = None

    def let_go_of_training(self) -> None:
        """The default process group was destroyed (on the thread that destroyed it): the distributed training is
        over. Let go of what the agent holds of it, as stop() does (the hooks, the model, the optimizer, the groups
        the recorder keeps, after a last drain), and keep the recording open until the rank ends: the script's
        own teardown then frees the model and its groups (a gc.collect() after destroy_process_group, as
        examples/tinygpt.py's teardown makes), and the exit has no collection of its own to make
        (_collect_at_exit). Phases and memory after this point are not recorded."""
        if self.exits.forked() or self._let_go:
            return
        with self.exits.stopping():
            if not self.started:
                return
            self._let_go = True
            self.state.on_world_destroyed = None
            self._drop_training("letting go of the training")
            if self.recorder is not None:
                self.recorder.let_go_of_groups()
            self.state.pending.clear()
            self.state.works.clear()

    def _collect_at_exit(self) -> bool:
        """Whether the exit collects the garbage (ExitHandlers): unless the agent let go of the training when its
        default group was destroyed and no gloo worker thread is left, which only a collection could end."""
        return not self._let_go or gloo_workers_alive()

    def notice(self, level: str, source: str, message: str) -> None:
        """A Notice in the recording and the live views (none without a recorder)."""
        if self.recorder is not None:
            with self.exits.writing():
                self.recorder.notice(level, source, message)

    def _say_progress(self, reason: str) -> None:
        if self.recorder is not None:
            self.recorder.say_progress(reason)

    def _start_endpoint(self) -> None:
        """Serve /metrics and the snapshot. Binding is immediate; any failure is a Notice, never an error."""
        if not self.config.endpoint or self.recorder is None:
            return
        recorder = self.recorder
        try:
            from zeromon.model.registry import REGISTRY_ENV, registry_dir
            from zeromon_agent.serve.endpoint import AgentEndpoint

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
        reader: the views are shared with the endpoint and taken at most every live.view.VIEW_TTL_S, and a
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
            from zeromon_agent.live.figures import figures_of  # with the snapshot's analysis: only once asked

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
            from zeromon_agent.live.view import Identity, LiveData

            identity = Identity(rank=self.rank, local_rank=self.local_rank, world_size=self.world_size,
                                host=os.uname().nodename, pid=os.getpid(), job=self.job, start_ns=time.time_ns())
            self._figures_live = LiveData(self.recorder, identity)
        return self._figures_live

    # --- run info ---------------------------------------------------------------------------------
    def _write_run_info(self) -> None:
        from zeromon_agent.context import runinfo

        try:
            model = self.model if self.model is not None else self.tracker.root
            engine = self.engine if self.engine is not None else self.tracker.engine
            optimizer = self.optimizer if self.optimizer is not None else self.tracker.optimizer
            framework = runinfo.detect(model=model, optimizer=optimizer, engine=engine)
            self._framework_known = framework["framework"] != "unknown"
            info = runinfo.build(self.rank, self.local_rank, self.world_size, self.job, self.backend,
                                 self.memory.device_name, framework)
            if self.recorder is not None:
                with self.exits.writing():
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

    # --- the phases' boundaries ------------------------------------------------------------------
    def _on_boundary(self, what: str) -> None:
        memory = self.memory
        if what == "forward_point" or what == "backward_point":
            memory.at_point()
        elif what == "forward_start":
            memory.time_step()
            if not self._framework_known:
                self._maybe_adopt_engine()  # before the walks, which look at the engine it finds
                self._write_run_info()
            memory.forward_start()
        elif what == "forward_end":
            memory.forward_end()
        elif what == "backward_end":
            memory.backward_end()
        elif what == "optimizer_start":
            if self.started and self.optimizer is None and not self._optimizer_announced:
                self._optimizer_announced = True
                self._write_run_info()  # the optimizer is known before it allocates its state
        elif what == "step_end":
            memory.step_end()
            if self.started and not self._first_step_described:
                # What the first forward settles is read after it: FSDP2 keeps its root gathered after forward
                # from its lazy init on. Under optimizer.step(closure) (Lightning's Trainer) the optimizer's
                # start, the run info's last look, comes before that forward.
                self._first_step_described = True
                self._write_run_info()

    def _memory_point(self, what: str) -> None:
        self.tracker._boundary(what)

    def _training_objects(self) -> tuple[Any, Any, Any]:
        """(model, optimizer, engine) that the memory walks look at: what attach gave, else what the hooks found."""
        model = self.model if self.model is not None else self.tracker.root
        optimizer = self.optimizer if self.optimizer is not None else self.tracker.optimizer
        return model, optimizer, self.engine
