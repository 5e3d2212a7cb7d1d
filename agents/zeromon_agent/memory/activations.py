"""Activation bytes: what autograd saves for backward during the root module's forward, and how much
of it is still alive later in the step.

A ``saved_tensors_hooks`` pack hook sees every tensor saved for backward (a cost for each); storages are
counted once; parameters and views of them (``weight.t()``) are left out, they are counted as
parameters, and so are the model's buffers (given to ``start``). Each counted storage gets a weak
reference whose callback subtracts it when the storage is freed (another cost per saved tensor), so
``alive_bytes`` is, at any moment of the backward, what of the forward's saved storages is still
held, read in O(1). Activation checkpointing's own hooks take over inside checkpointed regions, so
only what it keeps is counted, which is what the memory holds. Off with ZEROMON_ACTIVATIONS=0.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any


class _SavedStorage(weakref.ref):  # type: ignore[type-arg]
    __slots__ = ("nbytes", "ptr")
    nbytes: int
    ptr: int


class SavedTensorMeter:
    def __init__(self) -> None:
        self.bytes = 0  # saved in the last metered forward, freed or not
        self.alive_bytes = 0  # of those, still alive now
        self._seen: set[int] = set()
        self._exclude: set[int] = set()
        self._refs: dict[int, _SavedStorage] = {}
        self._ctx: Any = None
        self._parameter: Any = None

    def start(self, exclude: Iterable[int] = ()) -> None:
        """Count what the coming forward saves; ``exclude``: data pointers counted elsewhere (buffers)."""
        import torch

        self.stop()
        self.release()
        self._parameter = torch.nn.Parameter
        self.bytes = 0
        self._seen.clear()
        self._exclude = set(exclude)
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._ctx.__enter__()

    def stop(self) -> int:
        """Stop counting (the forward has ended); ``alive_bytes`` goes on following the frees."""
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(None, None, None)
        return self.alive_bytes

    def release(self) -> None:
        """Forget the storages of the last forward (its backward is over)."""
        self._refs = {}  # first: a callback that fires meanwhile finds nothing to subtract
        self.alive_bytes = 0

    def _pack(self, tensor: Any) -> Any:
        try:
            # Parameters, and views of them (linear saves weight.t()), are counted as parameters.
            parameter = self._parameter
            if not isinstance(tensor, parameter) and not isinstance(tensor._base, parameter):
                storage = tensor.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in self._seen and ptr not in self._exclude:
                    self._seen.add(ptr)
                    size = storage.nbytes()
                    if size:
                        ref = _SavedStorage(storage, self._freed)
                        ref.nbytes, ref.ptr = size, ptr
                        self._refs[id(ref)] = ref
                        self.bytes += size
                        self.alive_bytes += size
        except Exception:  # noqa: BLE001 - sizes of exotic tensors are not worth a failure
            pass
        return tensor

    def _freed(self, ref: Any) -> None:
        # Runs where the storage's last reference goes (the training thread, or autograd's on GPU).
        if self._refs.pop(id(ref), None) is not None:
            self.alive_bytes -= ref.nbytes
            self._seen.discard(ref.ptr)  # the allocator may hand the address to a new tensor


def _unpack(tensor: Any) -> Any:
    return tensor
