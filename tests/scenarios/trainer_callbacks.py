"""A few steps of a real trainer with zeromon's logging callback, on the ranks torchrun starts.

    python trainer_callbacks.py hf OUT [--steps N]
    python trainer_callbacks.py lightning OUT [--steps N]

hf: Hugging Face's Trainer on a tiny GPT-2 built from its config (no download), synthetic tokens,
DDP on gloo, ``report_to="tensorboard"`` (tensorboardX) and ``logging_steps=1``; after zeromon's
callback, a callback that keeps every log it receives, written to OUT/logs-rank-<r>.json.
lightning: Lightning's Trainer on a small MLP, DDP on gloo, a CSVLogger and a TensorBoardLogger
under OUT, ``log_every_n_steps=1``.

A step sleeps a little in the forward so that the agent's background thread (a pass every
ZEROMON_FLUSH_INTERVAL) summarizes steps while the trainer still logs.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

# At least one pass of the agent's thread a step (ZEROMON_FLUSH_INTERVAL=0.1, tests/trainer_logs.py), so that the
# tests' "figures at the trainer's cadence" does not hang on how fast the trainer's own step is: with 0.03 s a
# Lightning step took ~43 ms here, and the figures changed every other step.
STEP_SLEEP_S = 0.1


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def run_hf(out: Path, steps: int) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

    from zeromon_agent.integrations.hf import ZeromonCallback

    class KeepLogs(TrainerCallback):  # type: ignore[misc]
        """What a callback after zeromon's receives."""

        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append({"global_step": state.global_step, **logs})

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2, bos_token_id=0,
                        eos_token_id=0)
    model = GPT2LMHeadModel(config)
    model.transformer.register_forward_pre_hook(lambda module, args: time.sleep(STEP_SLEEP_S))
    args = TrainingArguments(output_dir=str(out / "hf"), max_steps=steps, per_device_train_batch_size=4,
                             logging_steps=1, report_to=["tensorboard"],
                             save_strategy="no", use_cpu=True, ddp_backend="gloo", disable_tqdm=True,
                             dataloader_num_workers=0, seed=0)
    os.environ["TENSORBOARD_LOGGING_DIR"] = str(out / "tb-hf")  # where HF's TensorBoardCallback writes
    keep = KeepLogs()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4 * 2 * steps, 16, 64),
                      callbacks=[ZeromonCallback(), keep])
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    (out / f"logs-rank-{rank}.json").write_text(json.dumps(keep.logs))


def run_lightning(out: Path, steps: int) -> None:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

    from zeromon_agent.integrations.lightning import ZeromonCallback

    class Regression(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            time.sleep(STEP_SLEEP_S)
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    x = torch.randn(8 * 2 * steps, 32)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, log_every_n_steps=1,
                        logger=[CSVLogger(out, name="csv", version=0), TensorBoardLogger(out, name="tb", version=0)],
                        callbacks=[ZeromonCallback()], enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Regression(), data)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("trainer", choices=("hf", "lightning"))
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    (run_hf if args.trainer == "hf" else run_lightning)(args.out, args.steps)


if __name__ == "__main__":
    main()
