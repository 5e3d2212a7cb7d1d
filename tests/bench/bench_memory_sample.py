"""What one memory sample's reads cost the training thread, read by read (issue 44).

    python tests/bench/bench_memory_sample.py [--reads 2000]

The agent takes a memory sample at three boundaries of every step (zeromon_agent.memory.watch): the process's
resident memory (a pread of /proc/self/statm) and, on a GPU, the allocator's totals and the device's free memory.
Each read is timed alone, warm (the median of ``--reads`` in a row) and cold (after a 32 MiB tensor made, filled
and freed, as a boundary comes after the model's compute and its allocations: the median of a tenth as many; a
tensor's mapping and unmapping, more than a matrix product's use of the caches, gives the RSS read the cost it has
at training's boundaries, tests/bench/RESULTS.md). On a GPU also ``torch.cuda.memory_stats()``, which the agent read
before and which flattens the allocator's ~120 statistics into sorted dotted keys in Python, against
``CudaMemory.totals()``, which reads the same eight from the nested dict. Without a GPU the CUDA rows say so.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import benchlib
import torch

from zeromon_agent.memory.readings import CudaMemory, process_rss


def timed(read: Callable[[], Any], reads: int, cold: Callable[[], None] | None = None) -> float:
    """The median µs of ``reads`` calls of ``read``, each after ``cold()`` where given."""
    times = []
    for _ in range(reads):
        if cold is not None:
            cold()
        t0 = time.perf_counter_ns()
        read()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reads", type=int, default=2000)
    args = parser.parse_args(argv)
    def sweep() -> None:  # the compute between two boundaries: memory mapped, written and unmapped (glibc's mmap)
        torch.empty(1 << 23).fill_(1.0)

    reads: dict[str, Callable[[], Any]] = {"process_rss() (pread of /proc/self/statm)": process_rss}
    if torch.cuda.is_available():
        torch.cuda.init()
        held = [torch.empty(1 << 20, device="cuda") for _ in range(8)]  # an allocator with something in it
        memory = CudaMemory(torch.cuda.current_device())
        reads.update({
            "torch.cuda.memory_stats() (what a sample read before)": lambda: torch.cuda.memory_stats(memory.device),
            "CudaMemory.totals() (memory_stats_as_nested_dict)": memory.totals,
            "CudaMemory.capacity() (torch.cuda.mem_get_info)": memory.capacity,
        })
        gpu = torch.cuda.get_device_name()
    else:
        held, gpu = [], "no GPU: the CUDA reads not measured"
    print(f"{benchlib.load_note()}; {gpu}")
    for name, read in reads.items():
        warm = timed(read, args.reads)
        cold = timed(read, max(args.reads // 10, 20), sweep)
        print(f"  {name}: {warm:.2f} µs warm, {cold:.2f} µs after a 32 MiB tensor made and freed")
    del held
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
