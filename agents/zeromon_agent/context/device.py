"""GPU device readings through NVML (nvidia-ml-py's ``pynvml``).

Every NVML call degrades to None (nvitop's ``nvmlQuery(..., default=NA)``): a missing library, no
driver or a field this GPU lacks is reported once as a notice, never raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class NvmlDevice:
    """One GPU's NVML handle; ``read()`` returns the DeviceSample fields, or None if unavailable."""

    def __init__(self, cuda_index: int | None) -> None:
        self.available = False
        self.reason = ""
        self.index = -1
        self.name = ""
        self._nvml: Any = None
        self._handle: Any = None
        self._nvlink_last: tuple[float, int, int] | None = None  # (seconds, tx KiB, rx KiB), cumulative
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = self._find_handle(pynvml, cuda_index)
            name = pynvml.nvmlDeviceGetName(self._handle)
            self.name = name.decode() if isinstance(name, bytes) else str(name)
            self.index = int(pynvml.nvmlDeviceGetIndex(self._handle))
            self.available = True
        except Exception as exc:  # noqa: BLE001 - no library, no driver, no GPU
            self.reason = f"NVML unavailable ({type(exc).__name__}: {exc}); device metrics are off"

    @staticmethod
    def _find_handle(pynvml: Any, cuda_index: int | None) -> Any:
        if cuda_index is None:
            raise RuntimeError("no CUDA device in use")
        # CUDA's index is relative to CUDA_VISIBLE_DEVICES; NVML's is not: match by UUID, then PCI.
        try:
            import torch

            props: Any = torch.cuda.get_device_properties(cuda_index)
        except Exception:  # noqa: BLE001
            props = None
        uuid = getattr(props, "uuid", None)
        if uuid is not None:
            try:
                text = str(uuid)
                return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
            except Exception:  # noqa: BLE001
                pass
        bus = getattr(props, "pci_bus_id", None)
        if isinstance(bus, int):
            domain = int(getattr(props, "pci_domain_id", 0) or 0)
            device = int(getattr(props, "pci_device_id", 0) or 0)
            try:
                return pynvml.nvmlDeviceGetHandleByPciBusId(f"{domain:08x}:{bus:02x}:{device:02x}.0".upper())
            except Exception:  # noqa: BLE001
                pass
        return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)

    def _query(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception:  # noqa: BLE001 - a field this GPU or driver does not support
            return None

    def read(self) -> dict[str, Any] | None:
        if not self.available:
            return None
        nv, h = self._nvml, self._handle
        q = self._query
        util = q(lambda: nv.nvmlDeviceGetUtilizationRates(h))
        mem = q(lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power_mw = q(lambda: nv.nvmlDeviceGetPowerUsage(h))
        temp = q(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        # PCIe throughput counters are KB/s over the last ~20 ms.
        tx_kb = q(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        rx_kb = q(lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        return {
            "index": self.index,
            "name": self.name,
            "util_gpu_pct": float(util.gpu) if util is not None else None,
            "util_mem_pct": float(util.memory) if util is not None else None,
            "mem_used": int(mem.used) if mem is not None else None,
            "mem_total": int(mem.total) if mem is not None else None,
            "power_w": power_mw / 1000.0 if power_mw is not None else None,
            "temperature_c": float(temp) if temp is not None else None,
            "pcie_tx_bytes_s": tx_kb * 1024.0 if tx_kb is not None else None,
            "pcie_rx_bytes_s": rx_kb * 1024.0 if rx_kb is not None else None,
            **self._nvlink_rates(),
        }

    def _nvlink_rates(self) -> dict[str, float | None]:
        """NVLink TX/RX bytes/s over all links, from NVML's cumulative KiB counters; None without NVLink."""
        rates: dict[str, float | None] = {"nvlink_tx_bytes_s": None, "nvlink_rx_bytes_s": None}
        nv = self._nvml
        tx_id = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", None)
        rx_id = getattr(nv, "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", None)
        if tx_id is None or rx_id is None:
            return rates
        all_links = 0xFFFFFFFF  # scopeId UINT_MAX: the sum over every link
        values = self._query(lambda: nv.nvmlDeviceGetFieldValues(self._handle, [(tx_id, all_links),
                                                                                (rx_id, all_links)]))
        if values is None or any(v.nvmlReturn != 0 for v in values):
            return rates
        now = values[0].timestamp / 1e6
        tx, rx = int(values[0].value.ullVal), int(values[1].value.ullVal)
        last, self._nvlink_last = self._nvlink_last, (now, tx, rx)
        if last is not None and now > last[0]:
            dt = now - last[0]
            rates["nvlink_tx_bytes_s"] = (tx - last[1]) * 1024 / dt
            rates["nvlink_rx_bytes_s"] = (rx - last[2]) * 1024 / dt
        return rates

    def close(self) -> None:
        if self.available and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.available = False
