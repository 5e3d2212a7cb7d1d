"""Shared code of the example training scripts: a tiny GPT, synthetic data, torchrun plumbing.

The scripts train for real on CPU (gloo, 2-4 processes under torchrun) and unchanged on GPUs
(NCCL, one process per GPU). They never import zeromon themselves: the tool injects itself from
outside, except when `--zeromon` asks for the explicit `zeromon_agent.attach(...)` path.

`--summary-json` makes every rank write what the run did in exact numbers (parameter counts, the
sharding units, optimizer-state bytes); the tests of zeromon assert against those files.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import hashlib
import importlib
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

# ---------------------------------------------------------------------------------------------
# Model


@dataclasses.dataclass(frozen=True, slots=True)
class GPTConfig:
    vocab_size: int = 512
    seq_len: int = 64
    hidden: int = 64
    layers: int = 3
    heads: int = 4

    def __post_init__(self) -> None:
        for name in ("vocab_size", "seq_len", "hidden", "layers", "heads"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be greater than 0")
        if self.hidden % self.heads != 0:
            raise ValueError(f"hidden ({self.hidden}) must be divisible by heads ({self.heads})")


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, hidden = x.shape
        q, k, v = self.qkv(x).split(hidden, dim=-1)
        # (batch, seq, hidden) -> (batch, heads, seq, head_dim), the layout SDPA expects.
        q, k, v = (t.view(batch, seq, self.heads, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, hidden))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.up = nn.Linear(cfg.hidden, 4 * cfg.hidden)
        self.down = nn.Linear(4 * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block; the unit every sharding framework wraps."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer: token + learned position embeddings, blocks, untied LM head."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.hidden)
        self.head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of shape (batch, seq, vocab), or the mean cross-entropy when targets are given."""
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        # The loss in fp32 even when the model computes in bf16: the mean over 32k log-probs
        # loses digits in bf16.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _init_weights(module: nn.Module) -> None:
    # GPT-2's init: small weights, so the first loss is close to ln(vocab).
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, std=0.02)


def build_model(cfg: GPTConfig, seed: int) -> TinyGPT:
    """The full model on CPU, identical on every rank.

    FSDP1 refuses `sync_module_states` with CPU parameters and FSDP2 never broadcasts, so equal
    initial weights come from seeding every rank the same, not from a broadcast.
    """
    with _forked_rng(seed):
        return TinyGPT(cfg)


@contextlib.contextmanager
def _forked_rng(seed: int) -> Iterator[None]:
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(state)


# ---------------------------------------------------------------------------------------------
# Synthetic data

# Each next token follows a fixed random permutation of the vocabulary, except with this
# probability, where it is uniform: a learnable bigram "language" whose loss visibly falls within
# 20 steps, unlike uniform random tokens (whose loss is stuck at ln(vocab) from the start).
_NOISE_PROBABILITY = 0.2


def synthetic_batch(
    cfg: GPTConfig,
    batch_size: int,
    *,
    seed: int,
    rank: int,
    step: int,
    micro_step: int = 0,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic (inputs, next-token targets), each of shape (batch_size, seq_len).

    The batch depends only on (seed, rank, step, micro_step); the language (the permutation)
    only on seed, so all ranks learn the same thing from different samples.
    """
    language = torch.Generator().manual_seed(seed)
    successor = torch.randperm(cfg.vocab_size, generator=language)

    # A hash, not arithmetic packing: torch's CPU generator (mt19937) keeps only the low 32 bits
    # of its seed, so a seed like rank * 2**34 + step would give every rank the same batches.
    key = f"{seed}/{rank}/{step}/{micro_step}".encode()
    sample_seed = int.from_bytes(hashlib.blake2b(key, digest_size=4).digest(), "little")
    gen = torch.Generator().manual_seed(sample_seed)
    length = cfg.seq_len + 1
    tokens = torch.empty(batch_size, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(cfg.vocab_size, (batch_size,), generator=gen)
    noise = torch.randint(cfg.vocab_size, (batch_size, length), generator=gen)
    is_noise = torch.rand(batch_size, length, generator=gen) < _NOISE_PROBABILITY
    for t in range(1, length):
        tokens[:, t] = torch.where(is_noise[:, t], noise[:, t], successor[tokens[:, t - 1]])
    tokens = tokens.to(device)
    return tokens[:, :-1], tokens[:, 1:]


# ---------------------------------------------------------------------------------------------
# Command line


def build_arg_parser(description: str) -> argparse.ArgumentParser:
    """The flags every example shares; scripts add their framework's own."""
    defaults = GPTConfig()
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps to run")
    parser.add_argument("--batch", type=int, default=8, help="micro-batch size per rank")
    parser.add_argument("--seq", type=int, default=defaults.seq_len, help="sequence length")
    parser.add_argument("--hidden", type=int, default=defaults.hidden, help="model width")
    parser.add_argument("--layers", type=int, default=defaults.layers, help="transformer blocks")
    parser.add_argument("--heads", type=int, default=defaults.heads, help="attention heads")
    parser.add_argument("--vocab", type=int, default=defaults.vocab_size, help="vocabulary size")
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and data")
    parser.add_argument(
        "--clip-grad",
        type=float,
        default=0.0,
        metavar="FLOAT",
        help="clip the global gradient norm to this value every step (0 = off)",
    )
    parser.add_argument(
        "--summary-json",
        metavar="PATH",
        help="every rank writes a JSON summary here; '{rank}' in PATH is replaced by the rank",
    )
    parser.add_argument(
        "--zeromon",
        action="store_true",
        help="import zeromon_agent, attach it explicitly and mark each step with it",
    )
    return parser


def parse_common_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, GPTConfig]:
    """Parses argv and checks the shared flags: a bad one is a usage error (exit 2) naming it."""
    args = parser.parse_args(argv)
    for flag in ("steps", "batch", "seq", "hidden", "layers", "heads", "vocab"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be greater than 0")
    if args.hidden % args.heads != 0:
        parser.error(f"--hidden ({args.hidden}) must be divisible by --heads ({args.heads})")
    if args.clip_grad < 0:
        parser.error("--clip-grad must be 0 (off) or greater")
    # Read before the process group exists: torchrun exports WORLD_SIZE to every rank.
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if args.summary_json is not None and world_size > 1 and "{rank}" not in args.summary_json:
        parser.error("--summary-json needs '{rank}' in its path when more than one rank runs")
    cfg = GPTConfig(
        vocab_size=args.vocab, seq_len=args.seq, hidden=args.hidden, layers=args.layers, heads=args.heads
    )
    return args, cfg


# ---------------------------------------------------------------------------------------------
# Distributed plumbing


@dataclasses.dataclass(frozen=True, slots=True)
class DistEnv:
    """Where this process runs, from torchrun's environment variables."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


def dist_env_from_environ() -> DistEnv:
    """Reads torchrun's variables and picks the device: cuda:LOCAL_RANK with NCCL, else CPU/gloo.

    Without torchrun it describes a single process (rank 0 of 1), so `python script.py` works.
    """
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    rank = int(os.environ.setdefault("RANK", "0"))
    world_size = int(os.environ.setdefault("WORLD_SIZE", "1"))
    local_rank = int(os.environ.setdefault("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
        # Two ranks on two cores: torch's default of one thread per core per process would
        # oversubscribe. torchrun exports OMP_NUM_THREADS=1 itself; respect any explicit value.
        if "OMP_NUM_THREADS" not in os.environ:
            torch.set_num_threads(1)
    return DistEnv(rank, world_size, local_rank, device, backend)


def init_process_group(env: DistEnv) -> None:
    """torch.distributed with the env:// rendezvous torchrun prepared.

    torch.distributed.nn is imported first: its collectives take ``group=group.WORLD`` as a default
    argument, evaluated on import, and torch.optim imports it (through torch._dynamo) when the first
    optimizer is built. Imported after the default group exists, it would hold that group past
    destroy_process_group (see teardown)."""
    import torch.distributed.nn  # noqa: F401
    if env.device.type == "cuda":
        # Binding the device lets NCCL create its communicator eagerly and avoids a warning.
        dist.init_process_group(env.backend, device_id=env.device)
    else:
        dist.init_process_group(env.backend)


# DTensor's caches that hold device meshes, and through them process groups (torch 2.13): FSDP2's
# parameters are DTensors, and its gradient clipping redistributes them.
_DTENSOR_CACHES = (
    ("torch.distributed.tensor.debug", "_clear_sharding_prop_cache"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh.cache_clear"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos.cache_clear"),
    ("torch.distributed.tensor._redistribute", "clear_redistribute_planner_cache"),
)


def teardown() -> None:
    """Destroy the process group, so that gloo's worker threads end here rather than during the exit.

    A group that something still holds outlives destroy_process_group, and its workers run on into the
    interpreter's finalization. One that then drops the last reference to a finished collective's tensor
    takes the GIL, which a finalizing Python answers with pthread_exit: the rank dies by SIGABRT
    ("terminate called without an active exception") after its training ended. init_process_group keeps
    torch.distributed.nn from holding the default group; DTensor's caches (_DTENSOR_CACHES) are emptied
    here; FSDP's state can hold groups in reference cycles, collected here. The group ends when the
    script's own references to the model go (at the latest as main() returns)."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dtensor_used = "torch.distributed.tensor" in sys.modules
    for module_name, path in _DTENSOR_CACHES if dtensor_used else ():
        try:
            target: Any = importlib.import_module(module_name)
            for name in path.split("."):
                target = getattr(target, name)
            target()
        except (ImportError, AttributeError):  # another torch: its caches, if any, stay
            pass
    gc.collect()


# ---------------------------------------------------------------------------------------------
# zeromon hook-up (only with --zeromon)

StepContext = Callable[[], contextlib.AbstractContextManager[Any]]


def attach_zeromon(enabled: bool, **handles: Any) -> StepContext:
    """Attaches zeromon_agent to the training objects; returns the per-step context factory.

    The import is deliberately here, not at module level: without --zeromon the scripts must run
    where zeromon is not installed, and the tool attaches itself from outside.
    """
    if not enabled:
        return contextlib.nullcontext
    import zeromon_agent

    zeromon_agent.attach(**handles)
    step: StepContext = zeromon_agent.step
    return step


# ---------------------------------------------------------------------------------------------
# Training loop


@dataclasses.dataclass(frozen=True, slots=True)
class TrainResult:
    losses: list[float]  # this rank's loss at each step
    step_times_ms: list[float]  # wall time of each step on this rank


def run_training(
    env: DistEnv,
    steps: int,
    train_step: Callable[[int], torch.Tensor],
    step_context: StepContext,
    *,
    header: str,
) -> TrainResult:
    """Runs `train_step(step)` for step in range(steps), timing each and printing on rank 0.

    `train_step` returns the detached loss. Reading it (`.item()`) and, on CUDA, synchronizing
    happen inside the step context, so a step's time includes its device work. The printed loss
    is rank 0's own: averaging over ranks would add a collective that a monitor would then see.
    """
    if env.rank == 0:
        print(header, flush=True)
    losses: list[float] = []
    times_ms: list[float] = []
    for step in range(steps):
        start = time.perf_counter()
        with step_context():
            loss = train_step(step).item()
            if env.device.type == "cuda":
                torch.cuda.synchronize(env.device)
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if not math.isfinite(loss):
            raise RuntimeError(f"rank {env.rank}: loss is {loss} at step {step + 1}")
        losses.append(loss)
        times_ms.append(elapsed_ms)
        if env.rank == 0:
            print(f"step {step + 1:>4}/{steps}  loss {loss:.4f}  {elapsed_ms:7.1f} ms", flush=True)
    if env.rank == 0:
        print(f"done: {steps} steps, median {statistics.median(times_ms):.1f} ms/step", flush=True)
    return TrainResult(losses, times_ms)


# ---------------------------------------------------------------------------------------------
# Exact numbers for --summary-json


def param_count(model: nn.Module) -> int:
    """Elements of the full (unsharded) model; call it before any framework wraps the model."""
    return sum(p.numel() for p in model.parameters())


def params_by_unit(model: nn.Module, unit_names: Iterable[str]) -> dict[str, list[nn.Parameter]]:
    """The parameters each sharding unit owns: those under it that no nested unit owns.

    "" is the root and owns what is left. Call it on the unwrapped model.
    """
    names = list(unit_names)
    innermost_first = sorted(names, key=len, reverse=True)
    owned: dict[str, list[nn.Parameter]] = {name: [] for name in names}
    for param_name, param in model.named_parameters():
        owner = next(n for n in innermost_first if n == "" or param_name.startswith(n + "."))
        owned[owner].append(param)
    return owned


def sharding_units(
    model: nn.Module, unit_names: Iterable[str], padded_numel: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """One summary entry per sharding unit, in module order; the numels add up to the model.

    `padded_numel` is, per unit, the elements one all-gather of the unit moves in total,
    padding included (null where the framework has no such per-unit collective).
    """
    owned = params_by_unit(model, unit_names)
    order = {name: i for i, (name, _) in enumerate(model.named_modules())}
    return [
        {
            "name": name,
            "numel": sum(p.numel() for p in params),
            "padded_numel": None if padded_numel is None else padded_numel[name],
        }
        for name, params in sorted(owned.items(), key=lambda item: order[item[0]])
    ]


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (FSDP2's parameters, grads and optimizer state), else t."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in optimizer.state on this rank, each storage counted once."""
    seen: set[int] = set()
    total = 0
    for per_param in optimizer.state.values():
        for value in per_param.values():
            if not isinstance(value, torch.Tensor):
                continue
            storage = local_tensor(value).untyped_storage()
            if storage.data_ptr() in seen:
                continue
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def build_summary(
    *,
    framework: str,
    strategy: Mapping[str, Any],
    env: DistEnv,
    cfg: GPTConfig,
    micro_batch: int,
    result: TrainResult,
    param_count: int,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    grad_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    units: list[dict[str, Any]],
    optimizer: torch.optim.Optimizer,
) -> dict[str, Any]:
    """The --summary-json object; README.md documents every field."""
    return {
        "framework": framework,
        "strategy": dict(strategy),
        "world_size": env.world_size,
        "rank": env.rank,
        "backend": env.backend,
        "device": str(env.device),
        "model": dataclasses.asdict(cfg),
        "micro_batch": micro_batch,
        "steps": len(result.losses),
        "losses": result.losses,
        "step_times_ms": result.step_times_ms,
        "param_count": param_count,
        "param_dtype": dtype_name(param_dtype),
        "param_bytes": param_count * param_dtype.itemsize,
        "param_bytes_fp32": param_count * 4,
        "compute_dtype": dtype_name(compute_dtype),
        "param_bytes_compute_dtype": param_count * compute_dtype.itemsize,
        "sharding_units": units,
        "optimizer_state_bytes": optimizer_state_bytes(optimizer),
        "grad_dtype": dtype_name(grad_dtype),
        "grad_bytes_full": param_count * grad_dtype.itemsize,
        "reduce_dtype": dtype_name(reduce_dtype),
        "grad_reduce_bytes_full": param_count * reduce_dtype.itemsize,
    }


def write_summary(path_template: str | None, rank: int, summary: Mapping[str, Any]) -> None:
    if path_template is None:
        return
    # str.replace, not str.format: a path may contain other braces.
    path = Path(path_template.replace("{rank}", str(rank)))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n")
