"""Activation bytes: what autograd saves for backward during the root module's forward.

A ``saved_tensors_hooks`` pack hook sees every tensor saved for backward (~1 us each); storages are
counted once; parameters and views of them (``weight.t()``) are left out, they are counted as
parameters. Activation
checkpointing's own hooks take over inside checkpointed regions, so only what it keeps is counted,
which is what the memory holds. Off with ZEROMON_ACTIVATIONS=0.
"""

from __future__ import annotations

from typing import Any


class SavedTensorMeter:
    def __init__(self) -> None:
        self.bytes = 0
        self._seen: set[int] = set()
        self._ctx: Any = None
        self._parameter: Any = None

    def start(self) -> None:
        import torch

        self.stop()
        self._parameter = torch.nn.Parameter
        self.bytes = 0
        self._seen.clear()
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._ctx.__enter__()

    def stop(self) -> int:
        if self._ctx is not None:
            ctx, self._ctx = self._ctx, None
            ctx.__exit__(None, None, None)
        return self.bytes

    def _pack(self, tensor: Any) -> Any:
        try:
            # Parameters, and views of them (linear saves weight.t()), are counted as parameters.
            parameter = self._parameter
            if not isinstance(tensor, parameter) and not isinstance(tensor._base, parameter):
                storage = tensor.untyped_storage()
                ptr = storage.data_ptr()
                if ptr not in self._seen:
                    self._seen.add(ptr)
                    self.bytes += storage.nbytes()
        except Exception:  # noqa: BLE001 - sizes of exotic tensors are not worth a failure
            pass
        return tensor


def _unpack(tensor: Any) -> Any:
    return tensor
