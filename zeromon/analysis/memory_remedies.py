"""The remedies for too much memory that apply to one rank's framework and config.

Shared by the OOM forecast's findings (``zeromon.analysis.oom``): each finding asks for the remedies of
its subject (gathered parameters, optimizer state, activations, fragmentation) and gets them in the
order that costs the least speed first (fewer gathered parameters, more sharding, offload, then the
run's own activations and precision), with this run's own knob values filled in. A remedy names the config, never
a figure of the rank's own (its activations, the bytes its categories hold): the evidence has those, so that ranks
with one cause offer one remedy text and are one entry where findings are grouped (finding_groups).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zeromon.model.classes import frozen
from zeromon.model.events import MemorySample, RunInfo

RESHARD_MEMORY_REMEDY = ("reshard_after_forward=True on the fully_shard units (now False): each unit's gathered "
                         "parameters are freed after its forward")
FULL_SHARD_REMEDY = "sharding_strategy=FULL_SHARD"
# DeepSpeed's values when the config leaves them out.
DS_DEFAULT_MAX_LIVE_PARAMETERS = 1_000_000_000
DS_DEFAULT_PARAM_PERSISTENCE_THRESHOLD = 100_000


@frozen
class MemoryContext:
    """What every finding needs to know about the rank."""

    rank: int
    info: RunInfo | None
    on_gpu: bool
    capacity: int | None
    outside: int  # GPU memory outside the allocator at the last sample; 0 on CPU
    walk: MemorySample | None  # the last sample with per-category bytes

    @property
    def categories(self) -> Mapping[str, int]:
        return self.walk.categories if self.walk is not None else {}

    @property
    def tracked(self) -> int:
        """The bytes the categories account for; ``other`` (the allocator's remainder on GPU) is not one."""
        return sum(v for k, v in self.categories.items() if k != "other" and v > 0)

    @property
    def walk_level(self) -> int | None:
        """The level when the categories were measured: allocated on GPU, RSS on CPU."""
        if self.walk is None:
            return None
        return self.walk.allocated if self.on_gpu else self.walk.rss

    def share(self, level: float) -> float | None:
        return (level + self.outside) / self.capacity if self.capacity else None

    def knob(self, name: str) -> Any:
        return self.info.knobs.get(name) if self.info is not None else None


def fsdp_offloads(run: MemoryContext) -> bool:
    """FSDP keeps the sharded parameters (and so the optimizer state) on the host: FSDP1's
    CPUOffload(offload_params=True), FSDP2's CPUOffloadPolicy."""
    return bool(run.knob("offload_params")) or "CPUOffloadPolicy" in str(run.knob("offload_policy") or "")


def number_knob(value: Any, default: float) -> tuple[float, bool]:
    """A numeric knob, or the default (and False) when it is missing or not a number ("auto")."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value), True
    return default, False


# The next stage from 0 or 1 is ZeRO-2 (it never needs more memory than ZeRO-1 and moves the same volume:
# the ZeRO paper, §7); ZeRO-3 when that is still too big.
_NEXT_STAGE = {0: "2 (shards optimizer state and gradients)", 1: "2 (shards gradients too)",
               2: "3 (shards the parameters too)"}
_BF16_SETTING = {"deepspeed": '"bf16": {"enabled": true}',
                 "fsdp2": "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
                 "fsdp1": "MixedPrecision(param_dtype=torch.bfloat16)"}


def memory_remedies(run: MemoryContext, focus: set[str]) -> tuple[str, ...]:
    """The remedies that apply to this framework and config, cheapest in speed first: fewer gathered
    parameters (ZeRO-3's stage3_max_live_parameters and prefetch bucket), more sharding, offload,
    activation checkpointing, a smaller micro-batch, bf16; expandable segments first where
    fragmentation is the subject."""
    def wants(*topics: str) -> bool:
        return "all" in focus or any(t in focus for t in topics)

    out: list[str] = []
    if run.on_gpu and "fragmentation" in focus:
        out.append("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set before the first CUDA allocation): "
                   "segments grow in place instead of caching fixed-size blocks, so freed memory serves larger "
                   "allocations")
    if wants("gathers", "params"):
        out += _fewer_gathered(run)
    if wants("params", "optimizer"):
        out += _more_sharding(run)
    out += _offload(run, wants("gathers", "params"), wants("optimizer", "params"))
    if wants("activations"):
        out += _smaller_activations(run)
    if wants("activations", "gathers"):
        out += _lower_precision(run)
    return tuple(out)


def _framework(run: MemoryContext) -> tuple[str, int | None]:
    return (run.info.framework, run.info.zero_stage) if run.info else ("unknown", None)


def _fewer_gathered(run: MemoryContext) -> list[str]:
    """Fewer parameters gathered at once: ZeRO-3's live-parameter knobs, FSDP's resharding and units."""
    framework, stage = _framework(run)
    out = []
    if framework == "deepspeed" and stage == 3:
        threshold, _ = number_knob(run.knob("stage3_param_persistence_threshold"), DS_DEFAULT_PARAM_PERSISTENCE_THRESHOLD)
        max_live, _ = number_knob(run.knob("stage3_max_live_parameters"), DS_DEFAULT_MAX_LIVE_PARAMETERS)
        out.append(f"lower stage3_param_persistence_threshold (now {threshold:.3g}; e.g. 1e4): parameters "
                   "smaller than it stay gathered on every rank")
        out.append(f"lower stage3_max_live_parameters (now {max_live:.3g}; e.g. {max_live / 2:.3g}): it bounds "
                   "the parameters gathered at once")
    if framework in ("fsdp1", "fsdp2"):
        reshard = run.knob("reshard_after_forward")
        strategy = run.info.fsdp_strategy if run.info else None
        if framework == "fsdp2" and reshard is False:  # "mixed" is FSDP2's default: all but the root
            out.append(RESHARD_MEMORY_REMEDY)
        if framework == "fsdp1" and strategy in ("SHARD_GRAD_OP", "NO_SHARD", "_HYBRID_SHARD_ZERO2"):
            out.append(f"{FULL_SHARD_REMEDY} (now {strategy}): parameters are sharded between forward and backward "
                       "too")
        units = run.knob("fsdp_units")
        out.append("smaller wrapping units (one per transformer block or smaller" + (f"; now {units} units" if units
                   else "") + "): the largest unit's gathered parameters bound the transient peak")
    return out


def higher_stage_remedy(stage: int) -> str:
    """The remedy that takes a DeepSpeed run at ``stage`` (0-2) to the next stage that shards more."""
    return f"a higher ZeRO stage: zero_optimization.stage {_NEXT_STAGE[stage]}"


def _more_sharding(run: MemoryContext) -> list[str]:
    """A higher ZeRO stage, or sharding where the model state is replicated."""
    framework, stage = _framework(run)
    if framework == "deepspeed" and stage in _NEXT_STAGE:
        return [higher_stage_remedy(stage)]
    if framework in ("ddp", "none"):
        return ["shard the model state: FSDP2 fully_shard or DeepSpeed ZeRO-2/3 (each rank then keeps 1/N of the "
                "optimizer state)"]
    if framework == "fsdp1" and (run.info.fsdp_strategy if run.info else None) == "NO_SHARD":
        return ["sharding_strategy=FULL_SHARD or SHARD_GRAD_OP (NO_SHARD keeps the whole optimizer state on every "
                "rank)"]
    return []


def _offload(run: MemoryContext, params: bool, optimizer: bool) -> list[str]:
    """Offload of what the config does not offload yet: ZeRO's to CPU (NVMe on a CPU run), FSDP's to CPU."""
    framework, stage = _framework(run)
    offload_to = "cpu" if run.on_gpu else "nvme"
    out = []
    if framework == "deepspeed" and stage == 3 and params and run.knob("offload_param") in (None, "none"):
        out.append(f'parameter offload: "offload_param": {{"device": "{offload_to}", "pin_memory": true}}')
    if framework == "deepspeed" and stage and optimizer and run.knob("offload_optimizer") in (None, "none"):
        out.append(f'optimizer offload: "offload_optimizer": {{"device": "{offload_to}", "pin_memory": true}}')
    if framework in ("fsdp1", "fsdp2") and run.on_gpu and optimizer and not fsdp_offloads(run):
        out.append("CPU offload of parameters, gradients and optimizer state: "
                   + ("fully_shard(..., offload_policy=CPUOffloadPolicy())" if framework == "fsdp2"
                      else "cpu_offload=CPUOffload(offload_params=True)"))
    return out


def _smaller_activations(run: MemoryContext) -> list[str]:
    """Activation checkpointing, and a smaller micro-batch that keeps the global batch."""
    framework, _ = _framework(run)
    out = ["activation checkpointing: " + (
        "apply_activation_checkpointing or torch.utils.checkpoint around each block" if framework in ("fsdp1", "fsdp2")
        else "model.gradient_checkpointing_enable() or torch.utils.checkpoint around each block")
        + "; about half the activation memory for ~20% more compute"]
    micro, accum = run.knob("train_micro_batch_size_per_gpu"), run.knob("gradient_accumulation_steps")
    if framework == "deepspeed" and micro is not None:
        out.append(f"a smaller micro-batch: lower train_micro_batch_size_per_gpu (now {micro}) and raise "
                   f"gradient_accumulation_steps (now {accum}) to keep train_batch_size")
    else:
        out.append("a smaller micro-batch with gradient accumulation to keep the global batch (activations "
                   "scale with it)")
    return out


def _lower_precision(run: MemoryContext) -> list[str]:
    """bf16 where the run keeps fp32 or fp16 values."""
    framework, _ = _framework(run)
    dtype = (run.info.param_dtype or "") if run.info else ""
    setting = _BF16_SETTING.get(framework, f'torch.autocast("{"cuda" if run.on_gpu else "cpu"}", '
                                           'dtype=torch.bfloat16)')
    if dtype == "float16":
        return [f"bf16 instead of fp16 ({setting}): the same 2 bytes per value without loss scaling, "
                "and bf16's 8 exponent bits do not overflow or underflow where fp16's 5 do"]
    if dtype == "float32":
        halves = {"deepspeed": "parameters, gradients and activations (the fp32 master copy moves into the "
                               "optimizer state)",
                  "fsdp1": "gathered parameters and activations",
                  "fsdp2": "gathered parameters and activations"}.get(framework, "activations")
        return [f"bf16 mixed precision ({setting}): halves {halves}"]
    return []


def untracked_remedies(run: MemoryContext, growing: bool) -> tuple[str, ...]:
    """What to do when the categories explain little of the level: find what holds the memory first.
    Sharding, offload, checkpointing and bf16 act only on the tracked part, so they come last, as a note."""
    out: list[str] = []
    if growing:
        out.append("stop the growth first (the memory_growth finding): a leak reaches any capacity")
    if run.on_gpu:
        out.append("find what holds the memory: record the allocator's history (ZEROMON_MEMORY_HISTORY=1, or "
                   "torch.cuda.memory._record_memory_history) and open a snapshot taken near the peak at "
                   "pytorch.org/memory_viz")
    else:
        out.append("find what holds the memory: tracemalloc snapshots, or gc.get_objects() filtered to "
                   "torch.Tensor, compared at two steps")
        out.append("if the level is mostly the runtime (compare it with the level before the first step), each "
                   "rank on the host pays it once: fewer ranks per host, or more memory")
    out.append("sharding, offload, activation checkpointing and bf16 act only on what the categories hold (the "
               "evidence says how much)")
    return tuple(out)
