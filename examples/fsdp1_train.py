"""Train TinyGPT with FSDP1 (`FullyShardedDataParallel`) on synthetic data.

    torchrun --nproc-per-node 2 examples/fsdp1_train.py --steps 5 --strategy SHARD_GRAD_OP

Each Block becomes one FSDP unit (one FlatParameter); the root unit owns the embeddings, the
final LayerNorm and the LM head.
"""

from __future__ import annotations

import argparse

import tinygpt
import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD")
# What FSDP1 inserts into the names of the modules it wraps.
_WRAPPED_PREFIX = "_fsdp_wrapped_module"


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, tinygpt.GPTConfig]:
    parser = tinygpt.build_arg_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--strategy",
        choices=_STRATEGIES,
        default="FULL_SHARD",
        help="FSDP1 sharding strategy (default: FULL_SHARD)",
    )
    parser.add_argument(
        "--bf16",
        action="store_true",
        help="MixedPrecision with bf16 parameters, gradient reduction and buffers",
    )
    return tinygpt.parse_common_args(parser, argv)


def main(argv: list[str] | None = None) -> None:
    args, cfg = parse_args(argv)
    env = tinygpt.dist_env_from_environ()
    tinygpt.init_process_group(env)
    try:
        train(args, env, cfg)
    finally:
        tinygpt.teardown()


def train(args: argparse.Namespace, env: tinygpt.DistEnv, cfg: tinygpt.GPTConfig) -> None:
    model = tinygpt.build_model(cfg, args.seed)
    count = tinygpt.param_count(model)
    # Counted before wrapping: afterwards the parameters are views into this rank's shard.
    unit_names = [n for n, m in model.named_modules() if isinstance(m, tinygpt.Block)] + [""]
    units = tinygpt.sharding_units(model, unit_names)
    compute_dtype = torch.bfloat16 if args.bf16 else torch.float32
    mixed_precision = (
        MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        if args.bf16
        else None
    )
    fsdp_model = FSDP(
        model,
        auto_wrap_policy=ModuleWrapPolicy({tinygpt.Block}),
        sharding_strategy=ShardingStrategy[args.strategy],
        mixed_precision=mixed_precision,
        use_orig_params=True,
        # Required on CPU: without it FSDP1 insists on "a non-CPU accelerator device". On CUDA it
        # also moves the model to this rank's GPU.
        device_id=env.device,
    )
    padded = _flat_param_numels(fsdp_model)
    if set(padded) != set(unit_names):
        raise RuntimeError(f"FSDP wrapped {sorted(padded)}, expected {sorted(unit_names)}")
    units = [{**unit, "padded_numel": padded[unit["name"]]} for unit in units]

    optimizer = torch.optim.AdamW(fsdp_model.parameters(), lr=args.lr)
    step_context = tinygpt.attach_zeromon(args.zeromon, model=fsdp_model, optimizer=optimizer)

    def train_step(step: int) -> torch.Tensor:
        inputs, targets = tinygpt.synthetic_batch(
            cfg, args.batch, seed=args.seed, rank=env.rank, step=step, device=env.device
        )
        loss = fsdp_model(inputs, targets)
        loss.backward()
        if args.clip_grad > 0:
            # FSDP1's own clip: local norms of the shards plus one all-reduce of the total.
            fsdp_model.clip_grad_norm_(args.clip_grad)
        optimizer.step()
        optimizer.zero_grad()
        return loss.detach()

    strategy = {
        "sharding_strategy": args.strategy,
        "bf16": args.bf16,
        "use_orig_params": True,
        "clip_grad": args.clip_grad,
    }
    header = f"fsdp1 world={env.world_size} device={env.device} params={count:,} " + " ".join(
        f"{k}={v}" for k, v in strategy.items()
    )
    result = tinygpt.run_training(env, args.steps, train_step, step_context, header=header)

    summary = tinygpt.build_summary(
        framework="fsdp1",
        strategy=strategy,
        env=env,
        cfg=cfg,
        micro_batch=args.batch,
        result=result,
        param_count=count,
        # The FlatParameters stay fp32; with MixedPrecision FSDP1 casts the local shard to bf16
        # before the all-gather.
        param_dtype=torch.float32,
        compute_dtype=compute_dtype,
        # Gradients are reduced in bf16 under MixedPrecision but land in .grad as fp32.
        grad_dtype=torch.float32,
        reduce_dtype=compute_dtype,
        units=units,
        optimizer=optimizer,
    )
    tinygpt.write_summary(args.summary_json, env.rank, summary)


def _flat_param_numels(fsdp_model: FSDP) -> dict[str, int]:
    """Each FSDP unit's name in the unwrapped model -> its unsharded FlatParameter numel.

    With use_orig_params=True FSDP1 pads every FlatParameter to a multiple of the world size,
    NO_SHARD included: this is the size one all-gather produces (sharded strategies) or one
    gradient all-reduce covers (NO_SHARD).
    """
    numels: dict[str, int] = {}
    for name, module in fsdp_model.named_modules():
        if not isinstance(module, FSDP) or module._handle is None:
            continue
        flat_param = module._handle.flat_param
        # Private attributes of torch 2.x's FlatParameter; NO_SHARD only has the "unpadded" one,
        # which despite its name includes the world-size padding.
        size = getattr(flat_param, "_padded_unsharded_size", None)
        if size is None:
            size = flat_param._unpadded_unsharded_size
        clean = ".".join(part for part in name.split(".") if part != _WRAPPED_PREFIX)
        numels[clean] = size.numel()
    return numels


if __name__ == "__main__":
    main()
