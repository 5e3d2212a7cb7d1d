"""Train TinyGPT with DeepSpeed (ZeRO stage 0-3) on synthetic data.

    torchrun --nproc-per-node 2 examples/deepspeed_train.py --steps 5 --stage 3 --bf16

The DeepSpeed config comes from the flags, or from `--config FILE` as it is. On CPU the
optimizer is a torch AdamW passed to `deepspeed.initialize(optimizer=...)`: DeepSpeed's own
Adam JIT-compiles an op (about a minute), and fp16 is refused on CPU (bf16 works).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import tinygpt
import torch

# The flags a --config file overrides (--lr still sets the torch AdamW the file does not name).
_CONFIG_FLAGS = (
    "stage",
    "bf16",
    "micro_batch",
    "grad_accum",
    "overlap_comm",
    "offload_optimizer",
    "reduce_bucket_size",
    "allgather_bucket_size",
    "prefetch_bucket_size",
    "param_persistence_threshold",
    "clip_grad",
)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, tinygpt.GPTConfig]:
    parser = tinygpt.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2, help="ZeRO stage")
    parser.add_argument("--bf16", action="store_true", help="bf16 parameters, fp32 master weights")
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="train_micro_batch_size_per_gpu (default: --batch)",
    )
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument(
        "--overlap-comm",
        action="store_true",
        help="zero_optimization.overlap_comm (no effect on CPU, which has no streams)",
    )
    parser.add_argument(
        "--offload-optimizer",
        choices=("none", "cpu"),
        default="none",
        help="zero_optimization.offload_optimizer; 'cpu' uses DeepSpeedCPUAdam, whose op is "
        "JIT-compiled on first use (about a minute, needs a C++ compiler)",
    )
    parser.add_argument("--reduce-bucket-size", type=int, help="zero_optimization.reduce_bucket_size")
    parser.add_argument("--allgather-bucket-size", type=int, help="zero_optimization.allgather_bucket_size")
    parser.add_argument(
        "--prefetch-bucket-size", type=int, help="zero_optimization.stage3_prefetch_bucket_size"
    )
    parser.add_argument(
        "--param-persistence-threshold",
        type=int,
        help="zero_optimization.stage3_param_persistence_threshold: stage 3 keeps parameters "
        "of at most this many elements gathered between uses (DeepSpeed's default, 100000, "
        "covers every parameter of the default TinyGPT)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="a DeepSpeed JSON config to use as it is, instead of the flags above",
    )
    args, cfg = tinygpt.parse_common_args(parser, argv)
    if args.micro_batch is not None and args.micro_batch <= 0:
        parser.error("--micro-batch must be greater than 0")
    if args.grad_accum <= 0:
        parser.error("--grad-accum must be greater than 0")
    if args.offload_optimizer == "cpu" and args.stage == 0:
        parser.error("--offload-optimizer cpu needs --stage 1, 2 or 3")
    if args.config is not None:
        if not args.config.is_file():
            parser.error(f"--config {args.config}: no such file")
        # The config decides these; silently ignoring a flag would mislead.
        for dest in _CONFIG_FLAGS:
            if getattr(args, dest) != parser.get_default(dest):
                parser.error(f"--{dest.replace('_', '-')} has no effect with --config; set it in the file")
    return args, cfg


def build_config(args: argparse.Namespace, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config the flags describe."""
    micro_batch = args.micro_batch or args.batch
    zero: dict[str, Any] = {"stage": args.stage, "overlap_comm": args.overlap_comm}
    optional = {
        "reduce_bucket_size": args.reduce_bucket_size,
        "allgather_bucket_size": args.allgather_bucket_size,
        "stage3_prefetch_bucket_size": args.prefetch_bucket_size,
        "stage3_param_persistence_threshold": args.param_persistence_threshold,
    }
    zero.update({key: value for key, value in optional.items() if value is not None})
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": args.grad_accum,
        "train_batch_size": micro_batch * args.grad_accum * world_size,
        "zero_optimization": zero,
        "bf16": {"enabled": args.bf16},
        "gradient_clipping": args.clip_grad,
        # DeepSpeed's own progress lines would interleave with ours.
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if args.offload_optimizer == "cpu":
        zero["offload_optimizer"] = {"device": "cpu"}
        # ZeRO-Offload refuses a client torch optimizer; DeepSpeed builds DeepSpeedCPUAdam.
        config["optimizer"] = {"type": "AdamW", "params": {"lr": args.lr}}
    return config


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_args(argv)
    env = tinygpt.dist_env_from_environ()
    if env.device.type == "cpu":
        # What DeepSpeed would pick anyway, minus its "unable to detect" warning on every rank.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # after DS_ACCELERATOR is set: the import picks the accelerator

    # DeepSpeed logs its whole config and every phase at INFO, on every rank.
    deepspeed.utils.logger.setLevel(logging.WARNING)
    # torch 2.13 deprecates the collectives DeepSpeed 0.19 calls, once per rank and name.
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
        category=FutureWarning,
    )
    # gloo on CPU, NCCL on CUDA: DeepSpeed asks its accelerator.
    deepspeed.init_distributed()
    try:
        train(args, env, cfg)
    finally:
        tinygpt.teardown()


def train(args: argparse.Namespace, env: tinygpt.DistEnv, cfg: tinygpt.GPTConfig) -> None:
    import deepspeed

    model = tinygpt.build_model(cfg, args.seed)
    count = tinygpt.param_count(model)  # before stage 3 partitions the parameters

    if args.config is not None:
        config = json.loads(args.config.read_text())
    else:
        config = build_config(args, env.world_size)
    client_optimizer = None
    if "optimizer" not in config:
        client_optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    elif env.rank == 0 and not config["optimizer"].get("params", {}).get("torch_adam", False):
        # On a 2-core machine: DeepSpeedCPUAdam (offload) ~80 s, FusedAdam ~57 s, once per machine
        # (cached under ~/.cache/torch_extensions). "torch_adam": true uses torch's AdamW instead.
        print(
            f"warning: DeepSpeed builds {config['optimizer'].get('type')}'s C++ op on first use "
            "(about a minute, needs a compiler)",
            flush=True,
        )

    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=client_optimizer, model_parameters=model.parameters(), config=config
    )
    accum = engine.gradient_accumulation_steps()
    micro_batch = engine.train_micro_batch_size_per_gpu()
    step_context = tinygpt.attach_zeromon(args.zeromon, engine=engine)

    def train_step(step: int) -> torch.Tensor:
        losses = []
        for micro_step in range(accum):
            inputs, targets = tinygpt.synthetic_batch(
                cfg,
                micro_batch,
                seed=args.seed,
                rank=env.rank,
                step=step,
                micro_step=micro_step,
                device=engine.device,
            )
            loss = engine(inputs, targets)
            engine.backward(loss)
            # Steps the optimizer only at the last micro-batch of the accumulation.
            engine.step()
            losses.append(loss.detach())
        return torch.stack(losses).mean()

    bf16 = engine.bfloat16_enabled()
    strategy = {
        "zero_stage": engine.zero_optimization_stage(),
        "bf16": bf16,
        "micro_batch": micro_batch,
        "grad_accum": accum,
        "overlap_comm": engine.zero_overlap_comm(),
        "offload_optimizer": engine.zero_offload_optimizer() is not None,
        "reduce_bucket_size": engine.zero_reduce_bucket_size(),
        "allgather_bucket_size": engine.zero_allgather_bucket_size(),
        "prefetch_bucket_size": engine.zero_prefetch_bucket_size(),
        "param_persistence_threshold": engine.zero_param_persistence_threshold(),
        "clip_grad": engine.gradient_clipping(),
        "optimizer": type(engine.basic_optimizer).__name__,
        "config_file": None if args.config is None else str(args.config),
    }
    header = f"deepspeed world={env.world_size} device={engine.device} params={count:,} " + " ".join(
        f"{k}={v}" for k, v in strategy.items() if k != "config_file"
    )
    result = tinygpt.run_training(env, args.steps, train_step, step_context, header=header)

    model_dtype = torch.bfloat16 if bf16 else torch.float32
    summary = tinygpt.build_summary(
        framework="deepspeed",
        strategy=strategy,
        env=env,
        cfg=cfg,
        micro_batch=micro_batch,
        result=result,
        param_count=count,
        # With bf16 the module itself is cast to bf16 (stage 3 partitions and gathers bf16); the
        # fp32 master weights belong to the optimizer.
        param_dtype=model_dtype,
        compute_dtype=model_dtype,
        # The optimizer that steps sees fp32 gradients: of the fp32 master partitions (ZeRO 1-3),
        # of the fp32 master copy (stage 0 with bf16) or of the parameters themselves.
        grad_dtype=torch.float32,
        # Gradients are all-reduced / reduce-scattered in the model's dtype unless the config
        # names a communication_data_type.
        reduce_dtype=engine.communication_data_type,
        units=[{"name": "", "numel": count, "padded_numel": None}],
        optimizer=engine.basic_optimizer,
    )
    tinygpt.write_summary(args.summary_json, env.rank, summary)


if __name__ == "__main__":
    main()
