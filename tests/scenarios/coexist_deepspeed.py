"""A 2-rank DeepSpeed ZeRO run on gloo with DeepSpeed's comms logger on, under zeromon or not.

The comms logger (``"comms_logger": {"enabled": true, "prof_all": true}``) counts every
``deepspeed.comm`` call by log name and message size. Each rank writes OUT/comms-<rank>.json:
- ``after_init`` / ``after_train`` / ``after_summary``: the logger's ``{log name: {message bytes:
  count}}`` after ``deepspeed.initialize``, after the training steps, and after
  ``deepspeed.comm.log_summary()`` (itself collective: its barriers are logged too);
- ``summary``: what ``log_summary(return_dict=True)`` returned (counts and sizes; no latencies).

Run it under ``zeromon run`` to attach zeromon (its patches then precede DeepSpeed's cached
collectives), or under plain torchrun for the reference.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from gloo_exit import leave

WIDTH = 64


def logged_counts(comms_dict: dict[str, dict[int, list[Any]]]) -> dict[str, dict[str, int]]:
    """The comms logger's record without its latencies: {log name: {message bytes: count}}."""
    return {name: {str(size): entry[0] for size, entry in sizes.items()} for name, sizes in comms_dict.items()}


def summary_counts(summary: dict[str, Any] | None) -> dict[str, dict[str, list[int]]]:
    if not summary:
        return {}
    return {name: {str(size): [row["count"], row["msg_size_bytes"]] for size, row in sizes.items()}
            for name, sizes in summary["summary"].items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.comm as ds_comm
    from deepspeed.comm.comm import comms_logger

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = ds_comm.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH),
                                torch.nn.ReLU(), torch.nn.Linear(WIDTH, 1))
    # A torch optimizer: DeepSpeed's own Adam JIT-compiles an op (about a minute on CPU).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = {
        "train_batch_size": 16, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "comms_logger": {"enabled": True, "verbose": False, "prof_all": True, "debug": False},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    after_init = logged_counts(comms_logger.comms_dict)
    for step in range(args.steps):
        x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(step * 2 + rank))
        loss = engine(x).sum()
        engine.backward(loss)
        engine.step()
    after_train = logged_counts(comms_logger.comms_dict)
    summary = ds_comm.log_summary(return_dict=True)  # collective: every rank calls it
    after_summary = logged_counts(comms_logger.comms_dict)
    Path(args.out, f"comms-{rank}.json").write_text(json.dumps({
        "after_init": after_init, "after_train": after_train, "after_summary": after_summary,
        "summary": summary_counts(summary),
    }))
    ds_comm.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    leave()  # without the interpreter's finalization: gloo_exit.py
