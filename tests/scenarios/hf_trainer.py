"""Hugging Face's Trainer on a tiny GPT-2, 2 gloo ranks on CPU, under torchrun: DeepSpeed ZeRO-2 or ZeRO-3 (a dict
config, "auto" values for the HF integration to fill, the optimizer HF's own torch AdamW), or fsdp="full_shard"
(which accelerate trains as DDP on CPU: tests/test_trainers_hf.py). Writes the stopwatch of
tests/scenarios/trainer_stopwatch.py per rank, and the Trainer's own step count.

accelerate has no DeepSpeed-on-CPU path of its own: DeepSpeed makes the process group on gloo, and an accelerate
state told it is DeepSpeed's is handed to the Trainer (accelerator_config use_configured_state)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trainer_stopwatch import Stopwatch, teardown, tiny_gpt2, token_batches, write  # noqa: E402

MICRO_BATCH = 4


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, tokens: torch.Tensor) -> None:
        self.tokens = tokens.reshape(-1, tokens.shape[-1])

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


class OuterForwards(TrainerCallback):
    """Times the module the Trainer calls (DeepSpeed's engine, DDP), known once the training loop prepared it."""

    def __init__(self, watch: Stopwatch) -> None:
        self.watch = watch
        self.trainer: Any = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.watch.time_forwards(self.trainer.model_wrapped)


def deepspeed_config(stage: int) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": stage}
    if stage == 3:  # every parameter released after use and gathered again in backward
        zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0)
    return {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_optimization": zero}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=["zero2", "zero3", "fsdp"], required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", required=True, help="where each rank writes its stopwatch: a {rank} template")
    args = parser.parse_args()

    from transformers import Trainer, TrainingArguments

    watch = Stopwatch()
    watch.time_updates()
    extra: dict[str, Any] = {}
    if args.strategy.startswith("zero"):
        import deepspeed
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType

        deepspeed.init_distributed(dist_backend="gloo")
        PartialState(cpu=True).distributed_type = DistributedType.DEEPSPEED
        extra = {"deepspeed": deepspeed_config(int(args.strategy[-1])),
                 "accelerator_config": {"use_configured_state": True}}
        # DeepSpeed's engine runs the backward (and its gradient reduction) and the step (and its parameter gather).
        from deepspeed.runtime.engine import DeepSpeedEngine

        DeepSpeedEngine.backward = watch.wrap(DeepSpeedEngine.backward, "backward")  # type: ignore[method-assign]
        DeepSpeedEngine.step = watch.wrap(DeepSpeedEngine.step, "engine_step")  # type: ignore[method-assign]
    else:
        extra = {"fsdp": "full_shard", "fsdp_config": {"transformer_layer_cls_to_wrap": ["GPT2Block"]}}
        watch.time_backwards()
    world = int(os.environ["WORLD_SIZE"])
    data = Tokens(token_batches(args.steps * world, MICRO_BATCH))

    def train() -> Any:
        model = tiny_gpt2()
        watch.record_losses(model)
        training = TrainingArguments(
            output_dir=os.path.join(os.path.dirname(args.out), "hf-output"), max_steps=args.steps,
            per_device_train_batch_size=MICRO_BATCH, learning_rate=1e-3, use_cpu=True, report_to="none",
            save_strategy="no", logging_steps=1, disable_tqdm=True, dataloader_num_workers=0, seed=0,
            data_seed=0, **extra)
        outer = OuterForwards(watch)
        trainer = Trainer(model=model, args=training, train_dataset=data, callbacks=[outer])
        outer.trainer = trainer
        trainer.train()
        return trainer

    trainer = train()
    taken = watch.taken(int(os.environ["RANK"]), global_step=trainer.state.global_step,
                        distributed_type=str(trainer.accelerator.distributed_type))
    del trainer
    if args.strategy.startswith("zero"):
        # The first TrainingArguments' DeepSpeed config, held globally by the HF integration, would make the
        # second model's build a ZeRO-3 one (zero.Init): the second TrainingArguments sets its own. accelerate
        # refuses a DeepSpeed plugin to a second Accelerator of the same state: the state (not the process
        # group's PartialState) is made anew, as for the first.
        from accelerate.state import AcceleratorState, GradientState
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()
        AcceleratorState._reset_state(reset_partial_state=False)
        GradientState._reset_state()
    gc.collect()
    write(args.out, watch.again_without_agent(taken, train))
    teardown()


if __name__ == "__main__":
    main()
