"""Train TinyGPT with plain DistributedDataParallel on synthetic data (the unsharded baseline).

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 5

Every rank holds the whole model, gradients and optimizer state; DDP all-reduces the gradients
in buckets during backward.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import tinygpt
import torch
from torch.nn.parallel import DistributedDataParallel as DDP


class TrainerWrapper(torch.nn.Module):
    """A trainer's wrapper around the DDP module (the shape of Lightning Fabric's _FabricModule)."""

    def __init__(self, module: torch.nn.Module) -> None:
        super().__init__()
        self._forward_module = module

    def forward(self, *args: object, **kwargs: object) -> torch.Tensor:
        return self._forward_module(*args, **kwargs)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, tinygpt.GPTConfig]:
    parser = tinygpt.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--bucket-cap-mb",
        type=float,
        default=25.0,
        help="DDP gradient bucket size in MiB (default: DDP's 25)",
    )
    parser.add_argument(
        "--wrap",
        action="store_true",
        help="call the DDP module through a wrapper, as trainers do (Lightning Fabric's _FabricModule holds it "
        "as _forward_module)",
    )
    parser.add_argument(
        "--trainer-traffic",
        action="store_true",
        help="the collectives a trainer issues itself: an object broadcast before the model is wrapped "
        "(Lightning's broadcast_object_list) and a gather of a counter every step (accelerate's gather)",
    )
    parser.add_argument(
        "--closure",
        action="store_true",
        help="forward and backward inside optimizer.step(closure), as Lightning's Trainer runs them",
    )
    args, cfg = tinygpt.parse_common_args(parser, argv)
    if args.bucket_cap_mb <= 0:
        parser.error("--bucket-cap-mb must be greater than 0")
    return args, cfg


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_args(argv)
    env = tinygpt.dist_env_from_environ()
    tinygpt.init_process_group(env)
    try:
        train(args, env, cfg)
    finally:
        tinygpt.teardown()


def train(args: argparse.Namespace, env: tinygpt.DistEnv, cfg: tinygpt.GPTConfig) -> None:
    if args.trainer_traffic:
        import torch.distributed as dist

        dist.broadcast_object_list([{"seed": args.seed, "run": "ddp_train"}], src=0)
    model = tinygpt.build_model(cfg, args.seed)
    count = tinygpt.param_count(model)
    units = [{"name": "", "numel": count, "padded_numel": None}]
    model.to(env.device)
    device_ids = [env.device.index] if env.device.type == "cuda" else None
    # DDP broadcasts rank 0's weights at construction, though they are equal already.
    ddp_model: torch.nn.Module = DDP(model, device_ids=device_ids, bucket_cap_mb=args.bucket_cap_mb)
    if args.wrap:
        ddp_model = TrainerWrapper(ddp_model)

    optimizer = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr)
    step_context = tinygpt.attach_zeromon(args.zeromon, model=ddp_model, optimizer=optimizer)

    def trainer_gather(inputs: torch.Tensor) -> None:
        """--trainer-traffic: a counter gathered from every rank, as accelerate's gather does."""
        if args.trainer_traffic:
            import torch.distributed as dist

            seen = [torch.zeros(1, dtype=torch.int64) for _ in range(env.world_size)]
            dist.all_gather(seen, torch.tensor([inputs.shape[0]]))

    update_s: list[float] = []  # --closure: the update's own stopwatch, around torch.optim.adam.adam (AdamW's)
    besides_closure_s: list[float] = []  # --closure: optimizer.step(closure)'s time outside the closure
    if args.closure:
        from torch.optim import adam as adam_module

        adam = adam_module.adam

        def timed_adam(*a: Any, **k: Any) -> None:
            t0 = time.perf_counter_ns()
            try:
                adam(*a, **k)
            finally:
                update_s.append((time.perf_counter_ns() - t0) / 1e9)

        adam_module.adam = timed_adam  # Adam.step calls the module's function by name

    def train_step(step: int) -> torch.Tensor:
        inputs, targets = tinygpt.synthetic_batch(
            cfg, args.batch, seed=args.seed, rank=env.rank, step=step, device=env.device
        )
        if args.closure:
            closure_ns = 0

            def closure() -> torch.Tensor:
                nonlocal closure_ns
                c0 = time.perf_counter_ns()
                loss = ddp_model(inputs, targets)
                trainer_gather(inputs)
                loss.backward()
                closure_ns = time.perf_counter_ns() - c0
                return loss

            s0 = time.perf_counter_ns()
            loss = optimizer.step(closure)
            besides_closure_s.append((time.perf_counter_ns() - s0 - closure_ns) / 1e9)
            optimizer.zero_grad()
            return loss.detach()
        loss = ddp_model(inputs, targets)
        trainer_gather(inputs)
        loss.backward()
        if args.clip_grad > 0:
            # The gradients are already all-reduced, hence equal: no collective needed.
            torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), args.clip_grad)
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    strategy = {"bf16": False, "bucket_cap_mb": args.bucket_cap_mb, "clip_grad": args.clip_grad}
    header = f"ddp world={env.world_size} device={env.device} params={count:,} " + " ".join(
        f"{k}={v}" for k, v in strategy.items()
    )
    result = tinygpt.run_training(env, args.steps, train_step, step_context, header=header)

    summary = tinygpt.build_summary(
        framework="ddp",
        strategy=strategy,
        env=env,
        cfg=cfg,
        micro_batch=args.batch,
        result=result,
        param_count=count,
        param_dtype=torch.float32,
        compute_dtype=torch.float32,
        grad_dtype=torch.float32,
        reduce_dtype=torch.float32,
        units=units,
        optimizer=optimizer,
    )
    if args.closure:
        summary["update_s"] = update_s
        summary["besides_closure_s"] = besides_closure_s
    tinygpt.write_summary(args.summary_json, env.rank, summary)


if __name__ == "__main__":
    main()
