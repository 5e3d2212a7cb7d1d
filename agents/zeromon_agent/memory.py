"""Memory: allocator totals, capacity, process RSS, and bytes per category from the model and optimizer.

Categories use FSDPMemTracker's names (DESIGN.md). Each storage is counted once, by data pointer,
in the first category that claims it, walking the framework's own structures first: FSDP2's
FSDPParam (sharded data, unsharded parameter), FSDP1's FlatParameter (local shard, padded full
parameter), DeepSpeed's partitions (``ds_tensor``, the ZeRO-1/2 flat groups and fp32 partitions),
then gradients, optimizer state and buffers. Only categories that were measured are reported; on
CUDA the allocator's remainder is reported as ``other``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int | None:
    """Resident set size of this process (one small /proc read: ~10 us)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001
        return None


def cpu_capacity() -> int | None:
    """The memory this process may use on CPU: the cgroup limit if set, else physical memory."""
    limits: list[int] = []
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):  # v1 reports "no limit" as a huge number
            limits.append(int(text))
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    return min(limits) if limits else None


class _Counter:
    """Bytes per category, each storage counted once."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
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
            key = (str(tensor.device), storage.data_ptr())
        except Exception:  # noqa: BLE001 - meta tensors, exotic subclasses
            return
        if key in self.seen:
            return
        self.seen.add(key)
        self.bytes[category] = self.bytes.get(category, 0) + size

    def add_all(self, category: str, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self.add(category, t)


def _fsdp2(counter: _Counter, model: Any) -> None:
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = getattr(get_state(), "_fsdp_param_group", None)
        for fp in getattr(group, "fsdp_params", ()) or ():
            counter.add("sharded_params", getattr(fp, "_sharded_param_data", None))
            counter.add("sharded_params", getattr(fp, "_sharded_post_forward_param_data", None))
            counter.add("unsharded_params", getattr(fp, "_unsharded_param", None))
            for buf in getattr(fp, "all_gather_outputs", ()) or ():
                counter.add("unsharded_params", buf)
            sharded = getattr(fp, "sharded_param", None)
            if sharded is not None:
                counter.add("sharded_grads", sharded.grad)


def _fsdp1(counter: _Counter, model: Any) -> None:
    fsdp_cls = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    if fsdp_cls is None:
        return
    cls = fsdp_cls.FullyShardedDataParallel
    for module in model.modules():
        if not isinstance(module, cls):
            continue
        handle = getattr(module, "_handle", None)
        flat = getattr(handle, "flat_param", None)
        if flat is None:
            continue
        sharded = bool(getattr(handle, "uses_sharded_strategy", False))
        counter.add("unsharded_params", getattr(flat, "_full_param_padded", None))
        counter.add("sharded_params" if sharded else "unsharded_params", getattr(flat, "_local_shard", None))
        counter.add("sharded_params" if sharded else "unsharded_params", getattr(flat, "_mp_shard", None))
        counter.add("sharded_params" if sharded else "unsharded_params", flat)
        counter.add("sharded_grads" if sharded else "unsharded_grads", getattr(flat, "_saved_grad_shard", None))
        counter.add("sharded_grads" if sharded else "unsharded_grads", flat.grad)


def _deepspeed(counter: _Counter, model: Any, optimizer: Any) -> None:
    for p in model.parameters():
        ds_tensor = getattr(p, "ds_tensor", None)
        if ds_tensor is not None:  # ZeRO-3: the partition this rank owns; p.data when gathered
            counter.add("sharded_params", ds_tensor)
            counter.add("unsharded_params", p.data)
    if optimizer is None:
        return
    # ZeRO-1/2 (DeepSpeedZeroOptimizer): the 16-bit (or fp32) flat groups hold the full parameters;
    # the fp32 partition is the optimizer's master copy; its .grad the gradient partition.
    for flat in getattr(optimizer, "bit16_groups_flat", ()) or ():
        counter.add("unsharded_params", flat)
    for part in getattr(optimizer, "single_partition_of_fp32_groups", ()) or ():
        counter.add("sharded_grads", getattr(part, "grad", None))
        counter.add("optimizer_state", part)
    for grads in (getattr(optimizer, "averaged_gradients", {}) or {}).values():
        counter.add_all("sharded_grads", grads or ())
    # ZeRO-3 (DeepSpeedZeroOptimizer_Stage3).
    for flat in getattr(optimizer, "fp16_partitioned_groups_flat", ()) or ():
        counter.add("sharded_params", flat)
    for flat in getattr(optimizer, "fp32_partitioned_groups_flat", ()) or ():
        counter.add("sharded_grads", getattr(flat, "grad", None))
        counter.add("optimizer_state", flat)
    counter.add("sharded_grads", getattr(optimizer, "grad_partitions_flat_buffer", None))


def _optimizer_state(counter: _Counter, optimizer: Any) -> None:
    seen: set[int] = set()
    while optimizer is not None and id(optimizer) not in seen:  # DeepSpeed wraps a torch optimizer
        seen.add(id(optimizer))
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            for entry in state.values():
                if isinstance(entry, dict):
                    counter.add_all("optimizer_state", (v for v in entry.values() if hasattr(v, "untyped_storage")))
        # Parameters the optimizer owns that the model does not (fp32 master copies) are its state.
        for group in getattr(optimizer, "param_groups", ()) or ():
            counter.add_all("optimizer_state", group.get("params", ()))
        optimizer = getattr(optimizer, "optimizer", None)


def categorize(model: Any = None, optimizer: Any = None, engine: Any = None) -> dict[str, int]:
    """Bytes per memory category on this rank now. Walks the model and optimizer (O(parameters))."""
    counter = _Counter()
    if engine is not None:
        model = getattr(engine, "module", model)
        optimizer = getattr(engine, "optimizer", optimizer)
    if model is not None:
        _fsdp2(counter, model)
        _fsdp1(counter, model)
        _deepspeed(counter, model, optimizer)
        for p in model.parameters():
            counter.add("sharded_params" if hasattr(p, "_local_tensor") else "unsharded_params", p)
        for p in model.parameters():
            grad = p.grad
            if grad is not None:
                counter.add("sharded_grads" if hasattr(grad, "_local_tensor") else "unsharded_grads", grad)
        counter.add_all("buffers", model.buffers())
    _optimizer_state(counter, optimizer)
    return counter.bytes


class CudaMemory:
    """Allocator totals of one CUDA device. Every call degrades to None rather than raising."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch = torch
        self.device = device

    def totals(self) -> dict[str, int | None]:
        stats = self.torch.cuda.memory_stats(self.device)
        get = stats.get
        return {
            "allocated": get("allocated_bytes.all.current"),
            "reserved": get("reserved_bytes.all.current"),
            "active": get("active_bytes.all.current"),
            "peak_allocated": get("allocated_bytes.all.peak"),
            "peak_reserved": get("reserved_bytes.all.peak"),
            "inactive_split": get("inactive_split_bytes.all.current"),
            "num_alloc_retries": get("num_alloc_retries"),
            "num_ooms": get("num_ooms"),
        }

    def capacity(self) -> tuple[int | None, int | None]:
        free, total = self.torch.cuda.mem_get_info(self.device)
        return int(total), int(free)
