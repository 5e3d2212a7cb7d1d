"""Lint an FSDP setup for the pitfalls of FSDP itself, whichever trainer configures it.

Pure: an ``FsdpSetup`` (what runs, as accelerate or Lightning resolves the file, and the key path that
sets each part) in, findings out. The fronts that read a file into a setup, and check what only their
framework refuses, are ``lint_accelerate_fsdp`` and ``lint_lightning``.

Facts the rules rest on, from torch's FSDP documentation (pytorch.org/docs/stable/fsdp.html):
- ShardingStrategy: NO_SHARD replicates parameters, gradients and optimizer state "similar to PyTorch's
  DistributedDataParallel"; SHARD_GRAD_OP "does not reshard them after the forward" (they stay gathered
  until the end of the backward); HYBRID_SHARD applies FULL_SHARD within a node and replicates across nodes.
- CPUOffload(offload_params=True) "offloads gradients to CPU as well, meaning that the optimizer step runs
  on CPU".
- auto_wrap_policy "is needed for communication and computation overlap"; without one FSDP applies to the
  root module alone.
- use_orig_params=True "is required to use torch.compile()" and enables per-parameter hyperparameters.
Memory per GPU follows the ZeRO paper's arithmetic (``zeromon.analysis.planner``): FULL_SHARD is ZeRO-3,
SHARD_GRAD_OP ZeRO-2, NO_SHARD DDP, the hybrid strategies the same over one machine's GPUs.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import field
from typing import Any

from zeromon.analysis.lint import LintFinding, LintOptions, LintReport, params_text
from zeromon.analysis.lint_schema import RULES, SEVERITIES
from zeromon.analysis.planner import DEFAULT_HEADROOM_FRACTION, PlanInputError, PlanInputs, plan_stage
from zeromon.model.classes import frozen, mutable
from zeromon.model.units import format_bytes

TORCH_FSDP_DOCS = "pytorch.org/docs/stable/fsdp.html"
INVALID = "INVALID"  # a setting whose value the framework refuses (ZL034): rules that need it stay silent
# The sharding strategies as ZeRO stages (the planner's), and whether they shard within one machine only.
_STAGE_OF = {"NO_SHARD": (0, False), "SHARD_GRAD_OP": (2, False), "FULL_SHARD": (3, False),
             "HYBRID_SHARD": (3, True), "HYBRID_SHARD_ZERO2": (2, True)}


@frozen
class Setting:
    key: str  # the key path that sets it, or where it would be set
    value: Any  # as the framework resolves it
    written: bool = False  # the file sets it; else it is the framework's default


@frozen
class FsdpSetup:
    """An FSDP configuration as its trainer resolves it."""

    framework: str  # "accelerate" | "lightning"
    version: int  # FSDP1 (FullyShardedDataParallel) or FSDP2 (fully_shard)
    strategy: Setting  # a SHARDING_STRATEGIES name; FSDP2's reshard_after_forward true/false as FULL_SHARD/SHARD_GRAD_OP
    offload: Setting  # bool: parameters (and with them gradients and the optimizer step) on the CPU
    wrap: Setting  # "TRANSFORMER_BASED_WRAP" | "SIZE_BASED_WRAP" | "NO_WRAP" | "POLICY" (Lightning's, any)
    state_dict: Setting  # "FULL_STATE_DICT" | "SHARDED_STATE_DICT" | "LOCAL_STATE_DICT"
    activation_checkpointing: Setting  # bool
    use_orig_params: Setting  # bool; None in FSDP2, which always keeps the original parameters
    world_size: int | None = None
    world_size_from: str = ""
    nodes: int = 1
    dtype: str = "fp32"  # of the 16-bit copies FSDP gathers: bf16 | fp16 | fp32, for the memory arithmetic

    def describe(self) -> str:
        if self.strategy.value == INVALID:
            strategy = "sharding strategy invalid"
        elif self.version == 2:
            strategy = f"reshard_after_forward {str(self.strategy.value == 'FULL_SHARD').lower()}"
        else:
            strategy = str(self.strategy.value)
        return f"FSDP{self.version}, {strategy}" + (", CPU offload" if self.offload.value else "")


@mutable
class FsdpFindings:
    """The findings of one FSDP lint, all in one file."""

    file: str  # "accelerate" | "lightning"
    items: list[LintFinding] = field(default_factory=list)

    def add(self, rule: str, severity: str, key: str, message: str, fix: str) -> None:
        assert rule in RULES and severity in SEVERITIES, (rule, severity)
        self.items.append(LintFinding(rule, severity, key, message, fix, self.file))

    def report(self, setup: FsdpSetup | None, origin: str) -> LintReport:
        order = {s: i for i, s in enumerate(SEVERITIES)}
        findings = sorted(self.items, key=lambda f: (order[f.severity], f.id, f.key))
        world, source = (setup.world_size, setup.world_size_from) if setup is not None else (None, "")
        return LintReport(tuple(findings), stage=None, world_size=world, world_size_from=source,
                          schema_origin=origin, hf=False,
                          setup=setup.describe() if setup is not None else "FSDP setup invalid")


def nearest(name: str, known: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
    return match[0] if match else None


def truth(value: Any) -> bool | None:
    """A boolean as accelerate's str_to_bool reads str(value); None when it is not one."""
    text = str(value).strip().lower()
    if text in ("y", "yes", "t", "true", "on", "1"):
        return True
    if text in ("n", "no", "f", "false", "off", "0"):
        return False
    return None


def state_of(setting: Setting, default_of: str) -> str:
    """'FULL_STATE_DICT' or 'not set (accelerate's default: FULL_STATE_DICT)', for messages."""
    return f"{setting.value}" if setting.written else f"not set ({default_of}'s default: {setting.value})"


# ------------------------------------------------------------------------------------------------ spelling


def _write(setup: FsdpSetup, what: str, value: Any) -> str:
    """How the setup's framework writes one setting, for a fix: 'fsdp_sharding_strategy: FULL_SHARD'."""
    accelerate = setup.framework == "accelerate"
    if what == "strategy":
        if accelerate and setup.version == 2:
            return f"fsdp_reshard_after_forward: {str(value == 'FULL_SHARD').lower()}"
        return f"{'fsdp_sharding_strategy' if accelerate else 'sharding_strategy'}: {value}"
    names = {"offload": ("fsdp_offload_params", "cpu_offload"), "state_dict": ("fsdp_state_dict_type", "state_dict_type"),
             "use_orig_params": ("fsdp_use_orig_params", "use_orig_params")}
    name = names[what][0 if accelerate else 1]
    if what == "state_dict" and not accelerate:
        value = "sharded" if value == "SHARDED_STATE_DICT" else "full"
    return f"{name}: {str(value).lower() if isinstance(value, bool) else value}"


def wrap_fix(setup: FsdpSetup) -> str:
    if setup.framework == "accelerate":
        return ("set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP and fsdp_transformer_layer_cls_to_wrap: the "
                "class of your model's repeated block (GPT2Block, LlamaDecoderLayer, ...; a Transformers model's "
                "_no_split_modules are used when it is not set)")
    return ("set auto_wrap_policy to the class of your model's repeated block, e.g. auto_wrap_policy: "
            "[torch.nn.TransformerEncoderLayer] (Lightning takes a set of layer classes)")


# ------------------------------------------------------------------------------------------------ rules


def check_strategy(setup: FsdpSetup, found: FsdpFindings) -> None:
    strategy, key = setup.strategy.value, setup.strategy.key
    if strategy == "NO_SHARD":
        found.add("ZL035", "warning", key,
                  "NO_SHARD shards nothing: every rank holds all parameters, gradients and optimizer state, as DDP "
                  "does (torch's ShardingStrategy docs), about 16 bytes per parameter with mixed-precision Adam, "
                  "and pays FSDP's overhead for DDP's memory",
                  f"shard: {_write(setup, 'strategy', 'FULL_SHARD')} (or SHARD_GRAD_OP); if the model fits "
                  "replicated, use DDP itself"
                  + (" (accelerate: distributed_type: MULTI_GPU)" if setup.framework == "accelerate" else
                     " (strategy: ddp)"))
    elif strategy in ("SHARD_GRAD_OP", "HYBRID_SHARD_ZERO2"):
        what = ("reshard_after_forward is false" if setup.framework == "accelerate" and setup.version == 2
                else f"{strategy} keeps parameters gathered after the forward")
        found.add("ZL036", "info", key,
                  f"{what}: every unit's unsharded parameters stay in memory from its forward to its backward, so "
                  "the peak holds the whole model's 16-bit parameters (ZeRO-2's memory) in exchange for one "
                  "all-gather less per unit in the backward",
                  f"keep it if the memory is there (zeromon plan --params N ... compares ZeRO-2 and ZeRO-3); "
                  f"{_write(setup, 'strategy', 'FULL_SHARD')} frees them after each forward")
    elif strategy.startswith("HYBRID") and setup.nodes <= 1:
        within = "FULL_SHARD" if strategy == "HYBRID_SHARD" else "SHARD_GRAD_OP"
        where = ("num_machines is 1" if setup.framework == "accelerate" else "trainer.num_nodes is 1")
        found.add("ZL037", "info", key,
                  f"{strategy} shards within a machine and replicates across machines (torch's ShardingStrategy "
                  f"docs); {where}, so there is nothing to replicate across and it runs as {within}",
                  f"use {within}, or set the number of machines if this config is for a multi-node job")


def check_offload(setup: FsdpSetup, found: FsdpFindings) -> None:
    if not setup.offload.value:
        return
    found.add("ZL038", "info", setup.offload.key,
              "parameters are offloaded to the CPU, and with them the gradients, so the optimizer step runs on the "
              f"CPU over fp32 state (torch's CPUOffload docs, {TORCH_FSDP_DOCS}): every step copies each unit's "
              "parameters to the GPU and its gradients back over PCIe, and the update runs at CPU speed; steps "
              "are often several times slower. The optimizer must be one that runs on CPU tensors (a CUDA-only "
              "fused or 8-bit optimizer fails)",
              f"offload only when FULL_SHARD alone does not fit (check with zeromon lint --params N --gpus N "
              f"--gpu-memory SIZE); otherwise {_write(setup, 'offload', False)}")


def check_wrap(setup: FsdpSetup, found: FsdpFindings) -> None:
    if setup.wrap.value != "NO_WRAP":
        return
    default = "" if setup.wrap.written else " (not set: no policy is the default)"
    found.add("ZL039", "warning", setup.wrap.key,
              f"no auto wrap policy{default}: the whole model is one FSDP unit, so its forward gathers every "
              "parameter at once (the peak holds the unsharded model, as without FSDP) and no all-gather "
              f"overlaps compute (torch's docs: the policy \"is needed for communication and computation "
              f"overlap\", {TORCH_FSDP_DOCS})", wrap_fix(setup))


def check_state_dict(setup: FsdpSetup, options: LintOptions, found: FsdpFindings) -> None:
    if setup.state_dict.value != "FULL_STATE_DICT":
        return
    size = ""
    if options.params:
        # fp32 weights (4 bytes) and Adam's two moments (8 bytes) per parameter, all on rank 0's host
        size = (f"; for {params_text(options.params)} parameters about {format_bytes(4 * options.params)} of weights and "
                f"{format_bytes(8 * options.params)} of Adam state")
    accelerate = setup.framework == "accelerate"
    shown = Setting(setup.state_dict.key, setup.state_dict.value if accelerate else "full", setup.state_dict.written)
    found.add("ZL040", "info", setup.state_dict.key,
              f"state dict type {state_of(shown, 'accelerate' if accelerate else 'FSDPStrategy')}: every checkpoint gathers the whole model and "
              f"optimizer state into rank 0's CPU memory and writes it from rank 0 alone{size}, which is slow and "
              "can run the host out of memory for large models; a sharded state dict has each rank write its "
              "own shard in parallel",
              f"{_write(setup, 'state_dict', 'SHARDED_STATE_DICT')} for large models"
              + (" (accelerate merge-weights turns it into one file when you need one)"
                 if setup.framework == "accelerate" else ""))


def check_activation_checkpointing(setup: FsdpSetup, found: FsdpFindings) -> None:
    if not setup.activation_checkpointing.value:
        return
    trainer = ("; do not also set the Hugging Face Trainer's gradient_checkpointing: it refuses the two together"
               if setup.framework == "accelerate" else "")
    found.add("ZL042", "info", setup.activation_checkpointing.key,
              "activation checkpointing keeps only each checkpointed layer's inputs and recomputes its forward in "
              "the backward: activation memory falls to about one layer's, at the cost of about one more forward "
              f"per step (~30% more compute){trainer}",
              "keep it where activations are what does not fit; leave it off when memory allows")


def check_orig_params(setup: FsdpSetup, found: FsdpFindings) -> None:
    if setup.version != 1 or setup.use_orig_params.value is not False:
        return
    if setup.framework == "accelerate":
        who = ("accelerate's FSDP guide: it must be true for parameter-efficient fine-tuning, for several "
               "optimizer parameter groups (the Hugging Face Trainer always builds two: with and without weight "
               "decay) and for an optimizer made before prepare()")
    else:
        who = ("Lightning sets it true by default so that configure_optimizers can use self.parameters() and "
               "several parameter groups; with false the optimizer must be built from self.trainer.model."
               "parameters() and Fabric refuses to set up model and optimizer together")
    found.add("ZL043", "warning", setup.use_orig_params.key,
              "use_orig_params is false: FSDP hands the optimizer its flattened parameters, so parameter groups "
              f"with their own hyperparameters, frozen parameters mixed with trained ones and torch.compile do not "
              f"work (torch's docs: true \"is required to use torch.compile()\"); {who}",
              _write(setup, "use_orig_params", True))


def check_fits(setup: FsdpSetup, options: LintOptions, found: FsdpFindings) -> None:
    """ZL047: the chosen strategy's model states against GPU memory, as the planner counts them."""
    world = options.world_size or setup.world_size
    if options.params is None or options.gpu_memory_bytes is None or world is None:
        return
    memory = options.gpu_memory_bytes
    nodes = setup.nodes if setup.nodes and world % setup.nodes == 0 else 1

    def gpu_bytes(strategy: str, offload: bool) -> int | None:
        stage, per_node = _STAGE_OF[strategy]
        shards = world // nodes if per_node else world
        try:
            inputs = PlanInputs(params=options.params or 0, gpus_per_node=shards, gpu_memory_bytes=memory,
                                dtype=setup.dtype, stages=(stage,))
        except PlanInputError:
            return None
        device = "cpu" if offload else "none"
        return plan_stage(inputs, stage, device, device)[0].gpu_bytes

    strategy, offload = str(setup.strategy.value), bool(setup.offload.value)
    if strategy not in _STAGE_OF or (offload and _STAGE_OF[strategy][0] != 3):
        return  # offload below FULL_SHARD: the planner models offload with ZeRO-3 only
    chosen = gpu_bytes(strategy, offload)
    if chosen is None:
        return
    usable = (1 - DEFAULT_HEADROOM_FRACTION) * memory  # the planner's headroom for activations and the allocator
    ladder: tuple[tuple[str, bool], ...] = (("NO_SHARD", False), ("SHARD_GRAD_OP", False), ("FULL_SHARD", False),
                                            ("FULL_SHARD", True))
    ladder = ladder[1:] if setup.version == 2 else ladder  # FSDP2 always shards
    sizes = {step: gpu_bytes(*step) for step in ladder}
    fitting = [step for step in ladder if sizes[step] is not None and (sizes[step] or 0) <= usable]
    basis = (f"the ZeRO paper's arithmetic for {params_text(options.params)} parameters ({setup.dtype}, Adam) over "
             f"{world} GPUs, activations not counted")
    what = (f"reshard_after_forward {str(strategy == 'FULL_SHARD').lower()}" if setup.version == 2 else strategy) \
        + (" with CPU offload" if offload else "")
    if fitting:
        first = fitting[0]
        better = (f"{_write(setup, 'strategy', first[0])}" + (f" and {_write(setup, 'offload', True)}" if first[1]
                  else "") + f" ({format_bytes(sizes[first] or 0)} per GPU"
                  + (", the parameters, gradients and optimizer state on the CPU)" if first[1] else ")"))
    else:
        better = "more GPUs: not even FULL_SHARD with CPU offload fits"
    if chosen > memory:
        found.add("ZL047", "error", setup.strategy.key,
                  f"{what} needs {format_bytes(chosen)} of model states per GPU, more than its "
                  f"{format_bytes(memory)} ({basis}): the run cannot start its first step", f"use {better}")
    elif chosen > usable:
        found.add("ZL047", "warning", setup.strategy.key,
                  f"{what} needs {format_bytes(chosen)} of model states per GPU of {format_bytes(memory)}, leaving "
                  f"less than {DEFAULT_HEADROOM_FRACTION:.0%} for activations and the allocator ({basis})",
                  f"use {better}")
    elif offload and ("FULL_SHARD", False) in fitting:
        found.add("ZL047", "warning", setup.offload.key,
                  f"CPU offload where FULL_SHARD fits on the GPU: {format_bytes(sizes[('FULL_SHARD', False)] or 0)} "
                  f"per GPU of {format_bytes(memory)} without offload ({basis}), and offload slows every step",
                  _write(setup, "offload", False))
    elif strategy == "FULL_SHARD" and ("SHARD_GRAD_OP", False) in fitting:
        found.add("ZL047", "info", setup.strategy.key,
                  f"FULL_SHARD where SHARD_GRAD_OP fits: {format_bytes(sizes[('SHARD_GRAD_OP', False)] or 0)} per "
                  f"GPU of {format_bytes(memory)} ({basis}); SHARD_GRAD_OP saves each unit's all-gather in the "
                  "backward, a third of FULL_SHARD's communication volume",
                  f"{_write(setup, 'strategy', 'SHARD_GRAD_OP')} if activations leave the room")


def run_rules(setup: FsdpSetup, options: LintOptions, found: FsdpFindings) -> None:
    check_strategy(setup, found)
    check_offload(setup, found)
    check_wrap(setup, found)
    check_state_dict(setup, options, found)
    check_activation_checkpointing(setup, found)
    check_orig_params(setup, found)
    check_fits(setup, options, found)
