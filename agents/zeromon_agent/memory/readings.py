"""Memory: allocator totals, capacity, process RSS, and bytes per category from the model and optimizer.

Categories use torch's FSDPMemTracker names. Each storage is counted once, by data pointer,
in the first category that claims it, walking the framework's own structures: FSDP2's FSDPParam
(sharded data, unsharded parameter and gradient, sharded gradient) and parameter groups (all-gather
outputs not yet copied out, reduce-scatter inputs kept for a later unit), FSDP1's FlatParameter
(local shard, padded full parameter), DeepSpeed's partitions (``ds_tensor``, the ZeRO-1/2 flat
groups and fp32 partitions) and gradient buckets, then gradients, optimizer state and buffers.
Only categories that were measured are reported; activations come from
activations.SavedTensorMeter; on CUDA the allocator's remainder is reported as ``other``.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterable
from typing import Any

from zeromon.model.units import format_bytes

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_statm_fd: int | None = None


def process_rss() -> int | None:
    """Resident set size of this process: a pread of a kept-open /proc/self/statm (opening
    it each time costs many times more)."""
    global _statm_fd
    try:
        if _statm_fd is None:
            _statm_fd = os.open("/proc/self/statm", os.O_RDONLY)
        return int(os.pread(_statm_fd, 128, 0).split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return None


# The ranks on this host, as each launcher says it: torchrun, DeepSpeed's launcher, Open MPI.
_LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_ranks() -> int:
    """The number of ranks on this host from the launcher's environment; 1 when no launcher says
    (launched_local_ranks; LocalRankCount counts them where it does not)."""
    return launched_local_ranks() or 1


def launched_local_ranks() -> int | None:
    """The number of ranks on this host as the launcher's environment says it; None where it says nothing
    (a trainer that starts its ranks itself: Lightning's and Fabric's launchers, mp.spawn)."""
    for name in _LOCAL_SIZE_VARS:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


class LocalRankCount:
    """The ranks on this host, counted on the default process group's store (no collective): each rank adds
    itself under its host's key once training runs (``join``), and reads the count a few steps later
    (``read``), by when every rank of the job has joined."""

    def __init__(self) -> None:
        self.key = f"zeromon/local_ranks/{socket.gethostname()}"
        self.joined = False

    def join(self) -> bool:
        store = _default_store()
        if store is None:
            return False
        store.add(self.key, 1)
        self.joined = True
        return True

    def read(self) -> int | None:
        store = _default_store()
        count = store.add(self.key, 0) if store is not None and self.joined else 0
        return int(count) if count > 0 else None


def _default_store() -> Any:
    try:
        import torch.distributed as dist

        if not dist.is_initialized():
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store to be had: the launcher's word stands
        return None


def host_memory() -> tuple[int | None, str]:
    """The memory the processes here share, and what it is: the cgroup limit if set and lower, else
    physical memory."""
    found: list[tuple[int, str]] = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 reports "no limit" as a huge number
            found.append((int(text), "the cgroup limit"))
    try:
        found.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "host RAM"))
    except (ValueError, OSError, AttributeError):
        pass
    return min(found) if found else (None, "host RAM")


def cpu_capacity(ranks: int | None = 1) -> tuple[int | None, str]:
    """One rank's share of the host's memory on CPU, and how it was found (for the device notice).

    The ranks on a host fill the same memory: forecast against all of it, each of N ranks would be
    promised N times the steps it has. ``ranks`` None: not known yet (LocalRankCount will count them):
    the whole host until then, and the note says so rather than a count nobody gave."""
    total, source = host_memory()
    if total is None:
        return None, "capacity unknown (set ZEROMON_CPU_CAPACITY)"
    if ranks is None:
        return total, (f"capacity is {source} = {format_bytes(total)} until the ranks on this host are counted "
                       "(the launcher set no LOCAL_WORLD_SIZE)")
    ranks = max(1, ranks)
    share = total // ranks
    return share, f"capacity is {source} / {ranks} local rank{'s' if ranks != 1 else ''} = {format_bytes(share)}"


class _Counter:
    """Bytes per category, each storage counted once."""

    def __init__(self) -> None:
        self.seen: set[int] = set()
        self.bytes: dict[str, int] = {}

    def add(self, category: str, tensor: Any) -> None:
        if tensor is None:
            return
        local = getattr(tensor, "_local_tensor", None)  # DTensor: the shard this rank holds
        if local is not None:
            tensor = local
        try:
            storage = tensor.untyped_storage()
            size = storage.nbytes()
            if size == 0:  # freed by FSDP's resize_(0) or DeepSpeed's release
                self.bytes.setdefault(category, 0)
                return
            # Host and device allocations never share addresses (CUDA's unified addressing).
            key = storage.data_ptr()
        except Exception:  # noqa: BLE001 - meta tensors, exotic subclasses
            return
        seen = self.seen
        if key not in seen:
            seen.add(key)
            by_category = self.bytes
            by_category[category] = by_category.get(category, 0) + size

    def add_all(self, category: str, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self.add(category, t)


class Categorizer:
    """Bytes per memory category on this rank, walking the model and optimizer.

    The structure (which parameters, FSDP units, flat parameters) is found once and refreshed every
    ``refresh_every`` walks; each walk then only reads the storages, which FSDP and DeepSpeed swap
    as they gather and release.

    A walk has two parts: what holds still within a forward or a backward (parameter shards,
    buffers, optimizer state, DeepSpeed's partitions) and what moves (gathered parameters,
    gradients, FSDP2's all-gather and reduce-scatter buffers). ``categorize`` walks both and keeps
    the first (so does ``walk_still`` alone); ``categorize_moving`` walks only the second on top of
    it: what the agent does at several moments of one step (a third of a whole walk on the FSDP2
    example at rest, whose optimizer state is half of the tensors).
    """

    def __init__(self, refresh_every: int = 100) -> None:
        self.refresh_every = refresh_every
        self.release()

    def release(self) -> None:
        """Hold nothing of the model or the optimizer (as new; the agent stopped): a later walk finds them again."""
        self._walks = 0
        self._discovered_at = 0
        self._model: Any = None
        self._optimizer: Any = None
        self._fsdp2_params: list[Any] = []
        self._fsdp2_groups: list[Any] = []
        self._fsdp1_flat: list[tuple[Any, bool]] = []
        self._ds_params: list[Any] = []
        self._params: list[Any] = []
        self._buffers: list[Any] = []
        self._still: tuple[dict[str, int], set[int]] | None = None

    def _discover(self, model: Any) -> None:
        self._model = model
        self._fsdp2_params, self._fsdp2_groups, self._fsdp1_flat = [], [], []
        fsdp1_mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
        fsdp1_cls = fsdp1_mod.FullyShardedDataParallel if fsdp1_mod is not None else None
        for group in fsdp2_groups(model):
            self._fsdp2_groups.append(group)
            self._fsdp2_params.extend(getattr(group, "fsdp_params", ()) or ())
        if fsdp1_cls is not None:
            for module in model.modules():
                if isinstance(module, fsdp1_cls):
                    handle = getattr(module, "_handle", None)
                    flat = getattr(handle, "flat_param", None)
                    if flat is not None:
                        self._fsdp1_flat.append((flat, bool(getattr(handle, "uses_sharded_strategy", False))))
        # Parameters FSDP2 manages are counted through their FSDPParam (data and gradient); the
        # generic walk only needs the others. Within a unit's forward or backward the module holds
        # the unsharded parameter in the sharded one's place.
        managed = {id(getattr(fp, attr, None))
                   for fp in self._fsdp2_params for attr in ("sharded_param", "_unsharded_param")}
        self._params = [p for p in model.parameters() if id(p) not in managed]
        self._ds_params = [p for p in self._params if hasattr(p, "ds_tensor")]
        self._buffers = list(model.buffers())

    def _prepare(self, model: Any, optimizer: Any, engine: Any) -> tuple[Any, Any]:
        if engine is not None:
            model = getattr(engine, "module", model)
            optimizer = getattr(engine, "optimizer", optimizer)
        stale = self._walks >= self._discovered_at + self.refresh_every
        if model is not None and (model is not self._model or stale):
            self._discover(model)
            self._discovered_at = self._walks
        self._optimizer = optimizer
        return model, optimizer

    def categorize(self, model: Any = None, optimizer: Any = None, engine: Any = None) -> dict[str, int]:
        counter = _Counter()
        model, optimizer = self._prepare(model, optimizer, engine)
        if model is not None:
            self._walks += 1
        self._walk_still(counter, model is not None, optimizer)
        self._still = (dict(counter.bytes), set(counter.seen))
        if model is not None:
            self._walk_moving(counter, optimizer)
        return counter.bytes

    def categorize_moving(self) -> dict[str, int]:
        """The categories now, walking only what moves within a forward or a backward; what holds
        still is taken from the last ``categorize`` (a whole walk when there was none)."""
        if self._still is None:
            return self.categorize(self._model, self._optimizer)
        counter = _Counter()
        counter.bytes, counter.seen = dict(self._still[0]), set(self._still[1])
        if self._model is not None:
            self._walk_moving(counter, self._optimizer)
        return counter.bytes

    def walk_still(self, model: Any = None, optimizer: Any = None, engine: Any = None) -> None:
        """Walk only what holds still, for the ``categorize_moving`` calls of a forward and its
        backward (the optimizer may have stepped since the last whole walk)."""
        counter = _Counter()
        model, optimizer = self._prepare(model, optimizer, engine)
        if model is not None:
            self._walks += 1
        self._walk_still(counter, model is not None, optimizer)
        self._still = (counter.bytes, counter.seen)

    def buffer_pointers(self) -> set[int]:
        """Where the buffers of the model last walked live: a buffer saved for backward
        (``x * self.scale``) is a buffer, not an activation."""
        pointers = set()
        for buffer in self._buffers:
            try:
                pointers.add(buffer.untyped_storage().data_ptr())
            except Exception:  # noqa: BLE001 - meta tensors, exotic subclasses
                pass
        return pointers

    def _walk_still(self, counter: _Counter, has_model: bool, optimizer: Any) -> None:
        if has_model:
            for fp in self._fsdp2_params:
                counter.add("sharded_params", getattr(fp, "_sharded_param_data", None))
            for flat, sharded in self._fsdp1_flat:
                counter.add("sharded_params" if sharded else "unsharded_params", getattr(flat, "_local_shard", None))
            self._walk_deepspeed_still(counter, optimizer)
            for p in self._params:
                counter.add("sharded_params" if hasattr(p, "_local_tensor") else "unsharded_params", p)
            counter.add_all("buffers", self._buffers)
        _optimizer_state(counter, optimizer)

    def _walk_moving(self, counter: _Counter, optimizer: Any) -> None:
        self._walk_fsdp2(counter)
        self._walk_fsdp1(counter)
        self._walk_deepspeed_moving(counter, optimizer)
        for p in self._params:
            grad = p.grad
            if grad is not None:
                counter.add("sharded_grads" if hasattr(grad, "_local_tensor") else "unsharded_grads", grad)

    def _walk_fsdp2(self, counter: _Counter) -> None:
        # The walk at every moment of a walk step: attributes read from FSDPParam's __dict__ and
        # None tested here, not in add(): a call saved for each of a model's many FSDPParams.
        add = counter.add
        for fp in self._fsdp2_params:
            attrs = fp.__dict__
            post_forward = attrs.get("_sharded_post_forward_param_data")  # reshard_after_forward=int
            if post_forward is not None:
                add("sharded_params", post_forward)
            unsharded = attrs.get("_unsharded_param")
            if unsharded is not None:
                add("unsharded_params", unsharded)
                grad = unsharded.grad  # between its computation and the reduce-scatter
                if grad is not None:
                    add("unsharded_grads", grad)
            for buf in attrs.get("all_gather_outputs") or ():
                add("unsharded_params", buf)
            accumulated = attrs.get("unsharded_accumulated_grad")  # no reduce-scatter this micro-batch
            if accumulated is not None:
                add("unsharded_grads", accumulated)
            sharded = attrs.get("sharded_param")
            if sharded is not None:
                grad = sharded.grad
                if grad is not None:
                    add("sharded_grads", grad)
        # All-gather outputs before their copy-out (a prefetch in flight; in forward the previous
        # unit's, kept to overlap the next copy-in), and the reduce-scatter inputs kept until a later
        # unit's reduce-scatter is waited on: FSDPMemTracker's all-gather and reduce-scatter buffers.
        comms: list[Any] = []  # one per root; set at FSDP2's lazy init, on the first forward
        for group in self._fsdp2_groups:
            result = getattr(group, "_all_gather_result", None)
            if result is not None:
                add("all_gather_buffers", getattr(result, "all_gather_output", None))
            comm = getattr(group, "comm_ctx", None)
            if comm is not None and all(comm is not c for c in comms):
                comms.append(comm)
        for comm in comms:
            state = getattr(comm, "all_gather_state", None)
            if state is not None:
                add("all_gather_buffers", getattr(getattr(state, "all_gather_result", None), "all_gather_output", None))
            for rs_state in getattr(comm, "reduce_scatter_states", ()) or ():
                add("reduce_scatter_buffers", getattr(rs_state, "reduce_scatter_input", None))

    def _walk_fsdp1(self, counter: _Counter) -> None:
        for flat, sharded in self._fsdp1_flat:
            params = "sharded_params" if sharded else "unsharded_params"
            grads = "sharded_grads" if sharded else "unsharded_grads"
            counter.add("unsharded_params", getattr(flat, "_full_param_padded", None))
            counter.add(params, getattr(flat, "_mp_shard", None))
            counter.add(params, flat)
            counter.add(grads, getattr(flat, "_saved_grad_shard", None))
            counter.add(grads, flat.grad)

    def _walk_deepspeed_still(self, counter: _Counter, optimizer: Any) -> None:
        for p in self._ds_params:  # ZeRO-3: the partition this rank owns
            counter.add("sharded_params", p.ds_tensor)
        if optimizer is None:
            return
        # ZeRO-1/2 (DeepSpeedZeroOptimizer): the 16-bit (or fp32) flat groups hold the full
        # parameters; the fp32 partition is the optimizer's master copy.
        for flat in getattr(optimizer, "bit16_groups_flat", ()) or ():
            counter.add("unsharded_params", flat)
        for part in getattr(optimizer, "single_partition_of_fp32_groups", ()) or ():
            counter.add("optimizer_state", part)
        # ZeRO-3 (DeepSpeedZeroOptimizer_Stage3).
        for flat in getattr(optimizer, "fp16_partitioned_groups_flat", ()) or ():
            counter.add("sharded_params", flat)
        for flat in getattr(optimizer, "fp32_partitioned_groups_flat", ()) or ():
            counter.add("optimizer_state", flat)
        # The gradient buckets (contiguous_gradients: reduce_bucket_size elements per dtype, allocated
        # once), into which backward's gradients are copied to be reduced; the parameters' .grad are
        # views of them meanwhile, counted here once.
        buckets = getattr(optimizer, "ipg_buckets", None)
        for bucket in buckets.values() if isinstance(buckets, dict) else ():
            buffer = getattr(bucket, "buffer", None)
            counter.add_all("reduce_scatter_buffers", buffer if isinstance(buffer, (list, tuple)) else (buffer,))

    def _walk_deepspeed_moving(self, counter: _Counter, optimizer: Any) -> None:
        for p in self._ds_params:  # ZeRO-3: p.data is the gathered parameter while it is gathered
            counter.add("unsharded_params", p.data)
        if optimizer is None:
            return
        for part in getattr(optimizer, "single_partition_of_fp32_groups", ()) or ():
            counter.add("sharded_grads", getattr(part, "grad", None))  # the gradient partition
        for grads in (getattr(optimizer, "averaged_gradients", {}) or {}).values():
            counter.add_all("sharded_grads", grads or ())
        for flat in getattr(optimizer, "fp32_partitioned_groups_flat", ()) or ():
            counter.add("sharded_grads", getattr(flat, "grad", None))
        counter.add("sharded_grads", getattr(optimizer, "grad_partitions_flat_buffer", None))


def fsdp2_groups(model: Any) -> list[Any]:
    """FSDP2's parameter groups (FSDPParamGroup) under ``model``, each once, in module order."""
    groups: list[Any] = []
    seen: set[int] = set()
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        try:
            state = get_state()
        except Exception:  # noqa: BLE001 - not an FSDP2 module after all
            continue
        found = getattr(state, "_fsdp_param_groups", None)
        if found is None:
            one = getattr(state, "_fsdp_param_group", None)
            found = [one] if one is not None else []
        for group in found:
            if id(group) not in seen:  # fully_shard([a, b]) shares one state between modules
                seen.add(id(group))
                groups.append(group)
    return groups


def _optimizer_state(counter: _Counter, optimizer: Any) -> None:
    seen: set[int] = set()
    inner = False
    while optimizer is not None and id(optimizer) not in seen:  # DeepSpeed wraps a torch optimizer
        seen.add(id(optimizer))
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            for entry in state.values():
                if isinstance(entry, dict):
                    counter.add_all("optimizer_state", (v for v in entry.values() if hasattr(v, "untyped_storage")))
        if inner:
            # A wrapped optimizer's parameters are the wrapper's own copies (DeepSpeed's fp32 master
            # partitions), not the model's: they are optimizer state.
            for group in getattr(optimizer, "param_groups", ()) or ():
                counter.add_all("optimizer_state", group.get("params", ()))
        optimizer = getattr(optimizer, "optimizer", None)
        inner = True


def categorize(model: Any = None, optimizer: Any = None, engine: Any = None) -> dict[str, int]:
    """Bytes per memory category on this rank now (a one-off walk; the agent keeps a Categorizer)."""
    return Categorizer().categorize(model=model, optimizer=optimizer, engine=engine)


_NONE: dict[str, Any] = {}  # a statistic the allocator's nested dict lacks (read, never written)


class CudaMemory:
    """Allocator totals of one CUDA device. Every call degrades to None rather than raising."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device

    def totals(self) -> tuple[int | None, ...]:
        """The allocator's totals in MemorySample's order (memory.watch.MEMORY_VALUES[1:9]: allocated, reserved,
        active, peak_allocated, peak_reserved, inactive_split, num_alloc_retries, num_ooms), read from
        ``memory_stats_as_nested_dict``: ``memory_stats`` flattens its ~120 statistics into sorted dotted keys in
        Python (its cost: tests/bench/RESULTS.md), and a memory sample is taken at three boundaries of every step.
        None for a statistic the allocator does not give (none before CUDA's initialization)."""
        stats = self.torch.cuda.memory_stats_as_nested_dict(self.device)
        get = stats.get
        allocated, reserved = get("allocated_bytes", _NONE).get("all", _NONE), get("reserved_bytes", _NONE).get("all", _NONE)
        return (allocated.get("current"), reserved.get("current"),
                get("active_bytes", _NONE).get("all", _NONE).get("current"), allocated.get("peak"), reserved.get("peak"),
                get("inactive_split_bytes", _NONE).get("all", _NONE).get("current"), get("num_alloc_retries"),
                get("num_ooms"))

    def allocated(self) -> int | None:
        """The allocator's allocated bytes now, without ``memory_stats``' flattening of ~100
        statistics into one dict: what the agent reads at several moments of a step."""
        stats = self.torch.cuda.memory_stats_as_nested_dict(self.device)
        value = stats.get("allocated_bytes", {}).get("all", {}).get("current")
        return int(value) if value is not None else None

    def capacity(self) -> tuple[int | None, int | None]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total), int(free)
