"""What zeromon can see on this machine, probed: `zeromon doctor`'s checks as plain data.

Each probe returns a Check: what was found, and where something is missing, what zeromon then cannot
measure (``costs``) and how to get it (``fix``). Probes never raise (a failure is a Check saying so)
and never hang the caller: each runs on a daemon thread that is given up after its time limit (an
NVML init on a wedged driver, an import stuck on a network file system, a Prometheus that does not
answer).
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from zeromon.model.classes import frozen

OK, MISSING, WARN, INFO = "ok", "missing", "warn", "info"
PROBE_TIMEOUT_S = 5.0
IMPORT_TIMEOUT_S = 60.0  # `import torch` takes 1-10 s on a cold or busy machine
PROMETHEUS_TIMEOUT_S = 3.0
AGENT_PORTS_CHECKED = 8  # a node's ranks: one per GPU on an 8-GPU node
TUI_MIN_COLUMNS, TUI_MIN_ROWS = 80, 24
TUI_WIDE_COLUMNS = 150  # the TUI puts memory beside the ranks table from here on (zeromon/tui/app.py)


@frozen
class Check:
    name: str
    status: str  # ok, missing, warn, info
    found: str
    essential: bool = False  # zeromon cannot work without it here
    costs: str = ""  # what zeromon cannot measure or do because of it
    fix: str = ""

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "status": self.status, "essential": self.essential, "found": self.found,
                "costs": self.costs, "fix": self.fix}

    @property
    def failed(self) -> bool:
        return self.essential and self.status == MISSING


def bounded(name: str, probe: Callable[[], list[Check]], timeout_s: float) -> list[Check]:
    """``probe()``, or a Check saying it did not answer within ``timeout_s`` or failed unexpectedly."""
    box: list[list[Check] | BaseException] = []

    def target() -> None:
        try:
            box.append(probe())
        except BaseException as exc:  # noqa: BLE001 - a probe's failure is a finding, never a traceback
            box.append(exc)

    thread = threading.Thread(target=target, name=f"zeromon-doctor-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not box:
        return [Check(name, WARN, f"no answer within {timeout_s:g} s", fix="run `zeromon doctor` again; if it "
                      "stays stuck, this part of the machine is not answering (a wedged driver or file system)")]
    result = box[0]
    if isinstance(result, BaseException):
        return [Check(name, WARN, f"the probe failed: {type(result).__name__}: {result}")]
    return result


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


# --- torch, its backends, CUDA ------------------------------------------------------------------------

def probe_torch() -> list[Check]:
    try:
        import torch
        import torch.distributed as dist
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install's OSError
        return [Check("torch", MISSING, f"cannot import torch: {type(exc).__name__}: {exc}", essential=True,
                      costs="nothing can be watched: the agent runs inside torch training",
                      fix='pip install "torch" (the CPU build: pip install torch --index-url '
                          'https://download.pytorch.org/whl/cpu)')]
    checks = [Check("torch", OK, f"torch {torch.__version__}", essential=True)]
    if not dist.is_available():
        checks.append(Check("torch.distributed", MISSING, "this torch build has no torch.distributed", essential=True,
                            costs="no collectives to time, no ranks to watch",
                            fix="install a torch build with distributed support (the pytorch.org wheels have it)"))
        return checks
    gloo, nccl, mpi = dist.is_gloo_available(), dist.is_nccl_available(), dist.is_mpi_available()
    checks.append(Check("backend gloo", OK if gloo else MISSING, "available (CPU collectives)" if gloo else
                        "not in this torch build", essential=not nccl,
                        costs="" if gloo else "no CPU runs (zeromon demo, tests and CPU training use gloo)",
                        fix="" if gloo else "install a pytorch.org torch wheel (they include gloo)"))
    checks.append(Check("backend nccl", OK if nccl else MISSING,
                        "available (GPU collectives)" if nccl else "not in this torch build (a CPU-only build)",
                        costs="" if nccl else "no GPU collectives here: only gloo runs can be watched",
                        fix="" if nccl else "on a machine with NVIDIA GPUs, install a CUDA build of torch "
                                            "(pytorch.org/get-started)"))
    checks.append(Check("backend mpi", OK if mpi else INFO, "available" if mpi else "not in this torch build "
                        "(the pytorch.org wheels never have it)",
                        fix="" if mpi else "only needed for init_process_group('mpi'); torch must be built from "
                                           "source against an MPI"))
    checks.append(_cuda())
    return checks


def _cuda() -> Check:
    import torch as torch_module

    built = torch_module.version.cuda
    costs = ("no allocator stats (allocated, reserved, peak, allocator retries, fragmentation): memory is each "
             "rank's process RSS; collectives are timed on the host (no CUDA events); the OOM forecast is against "
             "host RAM / local ranks unless ZEROMON_CPU_CAPACITY says otherwise")
    if not built:
        return Check("cuda", MISSING, f"torch {torch_module.__version__} is a CPU-only build", costs=costs,
                     fix="on a machine with NVIDIA GPUs, install a CUDA build of torch (pytorch.org/get-started)")
    try:
        count = torch_module.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - a driver that fails to load
        return Check("cuda", MISSING, f"CUDA {built} build, the driver fails: {exc}", costs=costs,
                     fix="check the NVIDIA driver (nvidia-smi) matches CUDA " + built)
    if not count:
        return Check("cuda", MISSING, f"torch built for CUDA {built}, but no GPU is visible"
                     + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})"
                        if "CUDA_VISIBLE_DEVICES" in os.environ else ""), costs=costs,
                     fix="check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES")
    name = torch_module.cuda.get_device_name(0)
    return Check("cuda", OK, f"CUDA {built}, {count} GPU{'s' if count != 1 else ''} ({name})")


def probe_nvml() -> list[Check]:
    costs = ("no device metrics (utilization, power, temperature, clocks, the memory other processes hold on "
             "the GPU); the agent's own allocator stats still work with CUDA")
    try:
        import pynvml
    except ImportError:
        return [Check("nvml", MISSING, "the nvidia-ml-py package is not installed", costs=costs,
                      fix="pip install nvidia-ml-py (a dependency of zeromon: reinstall zeromon)")]
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        return [Check("nvml", MISSING, f"no NVIDIA driver to talk to ({exc})", costs=costs,
                      fix="on a machine with NVIDIA GPUs, install the NVIDIA driver (NVML ships with it)")]
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
    finally:
        pynvml.nvmlShutdown()
    driver = driver.decode() if isinstance(driver, bytes) else str(driver)
    return [Check("nvml", OK, f"driver {driver}, {count} device{'s' if count != 1 else ''}")]


def probe_deepspeed() -> list[Check]:
    # Its version from the package metadata: `import deepspeed` takes seconds and probes the GPU toolchain.
    version = _version("deepspeed")
    if version is None:
        return [Check("deepspeed", INFO, "not installed (optional)",
                      costs="DeepSpeed ZeRO runs cannot be started here (FSDP and DDP runs can)",
                      fix="pip install 'zeromon[deepspeed]'")]
    return [Check("deepspeed", OK, f"deepspeed {version} (ZeRO-1/2/3 runs are watched)")]


# --- the agent's endpoint, the registry, Prometheus -----------------------------------------------------

@frozen
class AgentEndpoint:
    """What the agents' settings (ZEROMON_ENDPOINT, ZEROMON_BIND, ZEROMON_PORT) ask for; the caller reads
    them with the agent's own parser."""

    enabled: bool
    bind: str
    port: int  # base port: a rank listens on port + its local rank, else the next free one
    tries: int  # ... up to this many above


def probe_ports(agent: AgentEndpoint) -> list[Check]:
    """The agents' ports on this machine, for a node's ranks: which are free, which taken."""
    if not agent.enabled:
        return [Check("agent ports", INFO, "the endpoint is off (ZEROMON_ENDPOINT=0): ranks record only",
                      costs="no live view (attach, live, dashboard --run, Prometheus); recordings still work")]
    if agent.port == 0:
        return [Check("agent ports", OK, f"{agent.bind}: any free port (ZEROMON_PORT=0)")]
    ports = range(agent.port, min(65536, agent.port + AGENT_PORTS_CHECKED))
    taken: list[int] = []
    for port in ports:
        reason = _bind_refused(agent.bind, port)
        if reason == "cannot bind":
            return [Check("agent ports", MISSING, f"cannot listen on {agent.bind}",
                          costs="no live view: the agents cannot serve their endpoint",
                          fix="set ZEROMON_BIND to an address of this machine (default 127.0.0.1)")]
        if reason:
            taken.append(port)
    span = f"{agent.bind}:{ports[0]}-{ports[-1]}"
    if not taken:
        return [Check("agent ports", OK, f"{span} free (rank r listens on {agent.port} + its local rank)")]
    return [Check("agent ports", WARN, f"{span}: {', '.join(map(str, taken))} in use",
                  costs=f"a rank whose port is taken listens on the next free one (up to {agent.tries} above); "
                        "`zeromon attach` finds it through the registry, a fixed Prometheus target list would not",
                  fix="give the job another base port: zeromon run --port N (or ZEROMON_PORT=N; 0: any free port)")]


def _bind_refused(address: str, port: int) -> str:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError as exc:
            return "in use" if exc.errno == errno.EADDRINUSE else "cannot bind"
    return ""


def probe_registry() -> list[Check]:
    from zeromon.model.registry import read_entries, registry_dir

    folder = registry_dir()
    costs = "`zeromon attach` and `zeromon dashboard` without arguments cannot find the newest local run " \
            "(give them --run DIR or host:port)"
    if not folder.exists():
        parent = next((p for p in folder.parents if p.exists()), None)
        if parent is not None and os.access(parent, os.W_OK):
            return [Check("registry", OK, f"{folder} (made by the first agent)")]
        return [Check("registry", WARN, f"{folder} does not exist and cannot be made", costs=costs,
                      fix="set ZEROMON_REGISTRY to a writable folder")]
    try:
        tempfile.NamedTemporaryFile(dir=folder, prefix=".zeromon-doctor-").close()  # noqa: SIM115
    except OSError as exc:
        return [Check("registry", WARN, f"{folder} cannot be written ({exc.strerror or exc})", costs=costs,
                      fix="set ZEROMON_REGISTRY to a writable folder")]
    entries = read_entries(folder)
    from zeromon.model.registry import pid_alive

    stale = [e for e in entries if pid_alive(e) is False]
    live = [e for e in entries if pid_alive(e) is not False]
    found = f"{folder}: {len(live)} agent{'s' if len(live) != 1 else ''} running"
    if not stale:
        return [Check("registry", OK, found)]
    return [Check("registry", INFO, f"{found}, {len(stale)} entr{'ies' if len(stale) != 1 else 'y'} of crashed agents "
                  "(skipped by every reader)", fix=f"remove them if you like: they are {folder}/<host>-<pid>.json")]


def probe_prometheus(url: str) -> list[Check]:
    """Prometheus's build info, asked as `zeromon attach --prometheus` asks its queries (one bounded GET)."""
    import urllib.parse

    from zeromon.sources.http import FetchError, describe_os_error, http_get, json_loads

    parts = urllib.parse.urlsplit(url)
    https = parts.scheme == "https"
    host, port = parts.hostname or "", parts.port or (443 if https else 80)
    path = parts.path.rstrip("/") + "/api/v1/status/buildinfo"
    costs = "`zeromon attach --prometheus` and `zeromon dashboard --prometheus` cannot read through it"
    try:
        status, reason, body = http_get(host, port, path, {}, PROMETHEUS_TIMEOUT_S, https=https)
    except (OSError, FetchError) as exc:
        why = describe_os_error(exc, PROMETHEUS_TIMEOUT_S, "the server") if isinstance(exc, OSError) else str(exc)
        return [Check("prometheus", MISSING, f"{url} does not answer: {why}", True, costs,
                      f"is it running, and reachable from here? (curl {url.rstrip('/')}/-/ready)")]
    if status != 200:
        return [Check("prometheus", MISSING, f"{url} answers HTTP {status} {reason} at {path}", True, costs,
                      "give the server's base URL (e.g. http://localhost:9090), with its path prefix if it has one")]
    try:
        data = json_loads(body)
        version = str(data["data"]["version"])
    except (ValueError, KeyError, TypeError):
        return [Check("prometheus", MISSING, f"{url} answers, but not with Prometheus's build info", True, costs,
                      "give the Prometheus server's base URL")]
    return [Check("prometheus", OK, f"{url}: Prometheus {version}", essential=True)]


# --- the terminal -------------------------------------------------------------------------------------

def probe_terminal() -> list[Check]:
    if not sys.stdout.isatty():
        return [Check("terminal", INFO, "stdout is not a terminal (piped or redirected)",
                      costs="`zeromon attach` and `zeromon demo` draw in a terminal; here use `zeromon live`, "
                            "`zeromon demo --no-tui` or the dashboard")]
    columns, rows = shutil.get_terminal_size()
    colours = _colours()
    found = f"{columns}x{rows}, {colours}"
    if columns < TUI_MIN_COLUMNS or rows < TUI_MIN_ROWS:
        return [Check("terminal", WARN, found, costs="the TUI's columns and findings are cut at this size",
                      fix=f"at least {TUI_MIN_COLUMNS}x{TUI_MIN_ROWS}")]
    if colours in ("no colours", "8 colours"):
        return [Check("terminal", WARN, found, costs="the TUI's risk colours are hard to tell apart",
                      fix="a terminal with 256 colours: TERM=xterm-256color (and no NO_COLOR)")]
    if columns < TUI_WIDE_COLUMNS:
        return [Check("terminal", OK, found + f"; from {TUI_WIDE_COLUMNS} columns the TUI shows memory and "
                      "findings beside the ranks table")]
    return [Check("terminal", OK, found)]


def _colours() -> str:
    if os.environ.get("NO_COLOR"):
        return "no colours"
    try:
        from rich.console import Console  # Textual's own renderer: what the TUI will use

        system = Console(file=sys.stdout).color_system
    except Exception:  # noqa: BLE001
        system = None
    return {"truecolor": "true colour", "256": "256 colours", "standard": "16 colours",
            "windows": "16 colours"}.get(system or "", "no colours" if system is None else system)


# --- all of them ----------------------------------------------------------------------------------------

def probe_zeromon() -> list[Check]:
    """zeromon itself, where it is installed, and its front ends' libraries."""
    from zeromon import __version__

    checks = [Check("zeromon", OK, f"zeromon {__version__} in {Path(__file__).resolve().parent.parent}")]
    missing = [p for p in ("textual", "dash", "plotly", "prometheus-client") if _version(p) is None]
    if missing:
        checks.append(Check("front ends", WARN, f"not installed: {', '.join(missing)}",
                            costs="the TUI (textual), the dashboard (dash, plotly) or the Prometheus export "
                                  "(prometheus-client) will not start",
                            fix="reinstall zeromon: pip install zeromon (they are its dependencies)"))
    checks.append(_compiled_modules())
    return checks


def _compiled_modules() -> Check:
    """The agent's C modules (zeromon.model.compiled.MODULES: the recording's coder, a pass's collectives' columns and
    a step's sums, a GPU-less pass's phases and samples, the hooks' queue, the live totals' count), optional parts of
    the install."""
    import importlib.util

    from zeromon.model.compiled import MODULES

    missing = [name for name in MODULES if importlib.util.find_spec(name) is None]
    if not missing:
        return Check("C modules", OK, f"built: {', '.join(MODULES.values())} in C")
    return Check("C modules", WARN, f"not built: {', '.join(missing)} (no C compiler when zeromon was installed)",
                 costs="each rank's agent takes their Python paths: about a fifth more of its recorder's CPU a "
                       "collective, and a queue of tuples that the garbage collector counts (the same records)",
                 fix="install a C compiler and Python's headers (Debian: apt-get install gcc python3-dev), then "
                     "reinstall zeromon")


def run_checks(agent: AgentEndpoint, prometheus: str | None = None) -> list[Check]:
    """Every probe, each within its time limit, in the order `zeromon doctor` prints them."""
    checks = [Check("python", OK if sys.version_info >= (3, 10) else MISSING, sys.version.split()[0],
                    essential=True, fix="" if sys.version_info >= (3, 10) else "Python 3.10 or newer")]
    checks += probe_zeromon()
    checks += bounded("torch", probe_torch, IMPORT_TIMEOUT_S)
    checks += bounded("nvml", probe_nvml, PROBE_TIMEOUT_S)
    checks += bounded("deepspeed", probe_deepspeed, PROBE_TIMEOUT_S)
    checks += bounded("agent ports", lambda: probe_ports(agent), PROBE_TIMEOUT_S)
    checks += bounded("registry", probe_registry, PROBE_TIMEOUT_S)
    if prometheus is not None:
        checks += bounded("prometheus", lambda: probe_prometheus(prometheus), PROMETHEUS_TIMEOUT_S + 2)
    checks += bounded("terminal", probe_terminal, PROBE_TIMEOUT_S)
    if prometheus is not None:  # asked for, so it counts: no answer is as bad as a wrong one
        checks = [replace(c, essential=True, status=c.status if c.status == OK else MISSING)
                  if c.name == "prometheus" else c for c in checks]
    return checks


def essentials_ok(checks: list[Check]) -> bool:
    return not any(c.failed for c in checks)

