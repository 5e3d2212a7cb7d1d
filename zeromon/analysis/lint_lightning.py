"""Lint Lightning's FSDPStrategy as a LightningCLI YAML configures it (``trainer.strategy``), or a Fabric one.

LightningCLI (jsonargparse) builds the strategy from ``class_path`` and ``init_args`` (``dict_kwargs`` for
its ``**kwargs``), and FSDPStrategy passes the keyword arguments it does not take itself on to torch's
FullyShardedDataParallel. Lightning is not installed with zeromon: what it accepts is written down in
``lint_fsdp_schema`` from Lightning 2.6's API reference and source. Facts the rules rest on:
- sharding_strategy is read with ``ShardingStrategy[value.upper()]``; a hybrid strategy without
  auto_wrap_policy, process_group or device_mesh raises RuntimeError; device_mesh is ``(replicas, shards)``,
  whose product "must equal the world size", "only valid in combination with the HYBRID_SHARD" strategy.
- state_dict_type is "full" (lightning.pytorch's default) or "sharded" (Fabric's default).
- use_orig_params defaults to true; activation_checkpointing is deprecated for
  activation_checkpointing_policy, and setting both raises ValueError.
- FSDPStrategy passes device_id itself: one among the keyword arguments reaches FSDP twice (TypeError).
Rules on FSDP itself are ``zeromon.analysis.lint_fsdp``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zeromon.analysis.lint import LintOptions, LintReport
from zeromon.analysis.lint_fsdp import INVALID, FsdpFindings, FsdpSetup, Setting, nearest, run_rules
from zeromon.analysis.lint_fsdp_schema import (
    FSDP_ARGS_SET_BY_LIGHTNING,
    FSDP_KWARGS,
    LIGHTNING_ALIASES,
    LIGHTNING_FABRIC,
    LIGHTNING_NAME_OF,
    LIGHTNING_ORIGIN,
    LIGHTNING_PYTORCH,
    LIGHTNING_SHARDING_STRATEGIES,
    LIGHTNING_STATE_DICT_TYPES,
    LightningFlavor,
)
from zeromon.model.classes import frozen

STRATEGY_PARENTS = ("trainer", "fabric", "")  # where LightningCLI and Fabric configs keep the strategy
_BLOCK_KEYS = ("class_path", "init_args", "dict_kwargs", "__path__")
FSDP_BOOL_KWARGS = ("sync_module_states", "forward_prefetch", "limit_all_gathers", "use_orig_params")


def strategy_location(data: Mapping[str, Any]) -> tuple[str, Any] | None:
    """(key path, value) of the strategy a Lightning config sets: trainer.strategy, fabric.strategy or strategy."""
    for parent in STRATEGY_PARENTS:
        holder = data.get(parent) if parent else data
        if isinstance(holder, Mapping) and "strategy" in holder:
            return (f"{parent}.strategy" if parent else "strategy"), holder["strategy"]
    return None


def flavor_of(path: str, value: Any) -> LightningFlavor | None:
    """Which FSDPStrategy a strategy value names; None when it is not an FSDPStrategy."""
    fabric = path.startswith("fabric.")
    if isinstance(value, str):
        return (LIGHTNING_FABRIC if fabric else LIGHTNING_PYTORCH) if value in LIGHTNING_ALIASES else None
    class_path = value.get("class_path") if isinstance(value, Mapping) else None
    if not isinstance(class_path, str) or class_path.rsplit(".", 1)[-1] != "FSDPStrategy":
        return None
    return LIGHTNING_FABRIC if "fabric" in class_path or (fabric and "." not in class_path) else LIGHTNING_PYTORCH


@frozen
class _Strategy:
    path: str  # "trainer.strategy"
    flavor: LightningFlavor
    args: Mapping[str, Any]  # init_args (and init args written beside class_path)
    kwargs: Mapping[str, Any]  # dict_kwargs: passed on as **kwargs
    alias_offload: bool | None  # strategy: fsdp / fsdp_cpu_offload; None for a class_path block

    def key(self, name: str) -> str:
        if name in self.kwargs and name not in self.args:
            return f"{self.path}.dict_kwargs.{name}"
        return f"{self.path}.init_args.{name}"

    def get(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, self.kwargs.get(name, default))

    def has(self, name: str) -> bool:
        return name in self.args or name in self.kwargs


def _strategy(data: Mapping[str, Any]) -> _Strategy | None:
    found = strategy_location(data)
    flavor = flavor_of(*found) if found else None
    if found is None or flavor is None:
        return None
    path, value = found
    if isinstance(value, str):
        return _Strategy(path, flavor, {}, {}, LIGHTNING_ALIASES[value])
    init_args = value.get("init_args")
    args = dict(init_args) if isinstance(init_args, Mapping) else {}
    args.update({k: v for k, v in value.items() if k not in _BLOCK_KEYS})
    kwargs = value.get("dict_kwargs")
    return _Strategy(path, flavor, args, dict(kwargs) if isinstance(kwargs, Mapping) else {}, None)


# ------------------------------------------------------------------------------------------------ rules


def _check_keys(strategy: _Strategy, found: FsdpFindings) -> None:
    flavor = strategy.flavor
    known = flavor.args | FSDP_KWARGS
    other = LIGHTNING_FABRIC if flavor is LIGHTNING_PYTORCH else LIGHTNING_PYTORCH
    for name in [*strategy.args, *strategy.kwargs]:
        if name in known:
            continue
        key = strategy.key(name)
        if name in FSDP_ARGS_SET_BY_LIGHTNING:
            hint = f"FSDPStrategy passes {name} to FullyShardedDataParallel itself, so it would arrive twice (TypeError)"
            fix = f"remove {name}"
        elif name in other.args:
            hint = f"{name} is {other.class_path}'s argument, not {flavor.class_path}'s"
            fix = f"move it to {strategy.path.rsplit('.', 1)[0]}.precision" if name == "precision" and \
                "." in strategy.path else f"remove {name}"
        elif name in LIGHTNING_NAME_OF:
            hint = f"{name} is accelerate's name; Lightning's is {LIGHTNING_NAME_OF[name]}"
            fix = f"rename it to {LIGHTNING_NAME_OF[name]}"
        else:
            close = nearest(name, known)
            hint = f"did you mean {close}?" if close else "neither FSDPStrategy nor FullyShardedDataParallel takes it"
            fix = f"rename it to {close}" if close else "remove it"
        found.add("ZL033", "error", key, f"unknown FSDPStrategy argument {key}: {hint}; LightningCLI refuses a key the "
                  "class does not take, and FSDPStrategy hands unknown keyword arguments to FullyShardedDataParallel, "
                  "which raises TypeError", fix)


def _check_values(strategy: _Strategy, found: FsdpFindings) -> None:
    checks = (("sharding_strategy", _strategy_name(strategy.get("sharding_strategy", "FULL_SHARD")) is not None,
               f"one of {', '.join(LIGHTNING_SHARDING_STRATEGIES)} (Lightning reads ShardingStrategy[value.upper()])"),
              ("state_dict_type", strategy.get("state_dict_type", "full") in LIGHTNING_STATE_DICT_TYPES,
               "\"full\" or \"sharded\" (lower case)"),
              ("cpu_offload", _offload_of(strategy.get("cpu_offload")) is not None,
               "true, false or a torch.distributed.fsdp.CPUOffload class_path block"),
              ("device_mesh", strategy.get("device_mesh") is None or _mesh(strategy.get("device_mesh")) is not None,
               "a list of two positive integers, [replicas, shards]"),
              *((name, strategy.get(name) is None or isinstance(strategy.get(name), bool), "true or false")
                for name in FSDP_BOOL_KWARGS))
    for name, ok, wanted in checks:
        if ok or not strategy.has(name):
            continue
        value = strategy.get(name)
        close = nearest(str(value).upper(), LIGHTNING_SHARDING_STRATEGIES) if name == "sharding_strategy" else \
            nearest(str(value).lower(), LIGHTNING_STATE_DICT_TYPES) if name == "state_dict_type" else None
        found.add("ZL034", "error", strategy.key(name), f"{strategy.key(name)} is {value!r}: FSDPStrategy takes {wanted}; "
                  "LightningCLI or the strategy refuses it", f"set {name} to {close}" if close else f"set {name} to "
                  f"{wanted}")


def _strategy_name(value: Any) -> str | None:
    text = str(value).strip().upper() if isinstance(value, str) else ""
    return text if text in LIGHTNING_SHARDING_STRATEGIES else None


def _offload_of(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, Mapping) and str(value.get("class_path", "")).rsplit(".", 1)[-1] == "CPUOffload":
        init_args = value.get("init_args")
        return bool(init_args.get("offload_params")) if isinstance(init_args, Mapping) else False
    return None


def _mesh(value: Any) -> tuple[int, int] | None:
    if isinstance(value, list | tuple) and len(value) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        return value[0], value[1]
    return None


def _holder(data: Mapping[str, Any], path: str) -> tuple[str, Mapping[str, Any]]:
    """The mapping that holds the strategy (the trainer's settings), and its key path."""
    parent = path.rsplit(".", 1)[0] if "." in path else ""
    holder = data.get(parent) if parent else data
    return parent, holder if isinstance(holder, Mapping) else {}


def _world(data: Mapping[str, Any], path: str) -> tuple[int | None, int, str]:
    """(world size, nodes, where from) from the trainer's (or Fabric's) devices and num_nodes."""
    parent, holder = _holder(data, path)
    nodes_raw = holder.get("num_nodes", 1)
    nodes = nodes_raw if isinstance(nodes_raw, int) and not isinstance(nodes_raw, bool) and nodes_raw > 0 else 1
    devices = holder.get("devices")
    count: int | None = None
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        count = devices
    elif isinstance(devices, list) and devices:
        count = len(devices)
    elif isinstance(devices, str) and devices.strip().isdigit() and int(devices) > 0:
        count = int(devices)
    elif isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    prefix = f"{parent}." if parent else ""
    return (count * nodes if count else None), nodes, f"{prefix}devices x {prefix}num_nodes"


def _check_hybrid(strategy: _Strategy, setup: FsdpSetup, found: FsdpFindings) -> None:
    hybrid = str(setup.strategy.value).startswith("HYBRID")
    mesh = _mesh(strategy.get("device_mesh"))
    world, nodes = setup.world_size, setup.nodes
    shape = f"[{nodes}, {world // nodes}]" if world and world % nodes == 0 else "[machines, GPUs per machine]"
    if hybrid and all(strategy.get(n) is None for n in ("auto_wrap_policy", "process_group", "device_mesh")):
        found.add("ZL037", "error", setup.strategy.key,
                  f"{setup.strategy.value} without auto_wrap_policy, process_group or device_mesh: FSDPStrategy "
                  "raises RuntimeError (\"The hybrid sharding strategy requires you to pass at least one of the "
                  "parameters\")", f"set device_mesh: {shape} (replicas across machines, shards within one), and "
                  "an auto_wrap_policy")
    if mesh is None:
        return
    if not hybrid:
        found.add("ZL037", "warning", strategy.key("device_mesh"),
                  f"device_mesh with {setup.strategy.value}: Lightning's documentation gives device_mesh \"only in "
                  "combination with the HYBRID_SHARD sharding strategy\"",
                  "set sharding_strategy: HYBRID_SHARD, or remove device_mesh")
    if setup.world_size is not None and mesh[0] * mesh[1] != setup.world_size:
        found.add("ZL037", "error", strategy.key("device_mesh"),
                  f"device_mesh [{mesh[0]}, {mesh[1]}] holds {mesh[0] * mesh[1]} ranks, and the world size is "
                  f"{setup.world_size} ({setup.world_size_from}): the product \"must equal the world size\" and "
                  "init_device_mesh fails", f"set device_mesh to {shape} (replicas across machines, shards within one)")


def _check_checkpointing(strategy: _Strategy, found: FsdpFindings) -> None:
    if not strategy.has("activation_checkpointing") or strategy.get("activation_checkpointing") is None:
        return
    if strategy.get("activation_checkpointing_policy") is not None:
        found.add("ZL042", "error", strategy.key("activation_checkpointing"),
                  "activation_checkpointing and activation_checkpointing_policy are both set: FSDPStrategy raises "
                  "ValueError (\"You cannot set both\")", "remove activation_checkpointing")
    else:
        found.add("ZL014", "info", strategy.key("activation_checkpointing"),
                  "activation_checkpointing is deprecated (Lightning's API reference: \"Deprecated. Use "
                  "activation_checkpointing_policy\"); Lightning translates it and warns",
                  "rename it to activation_checkpointing_policy (the same list of layer classes)")


def resolve_lightning_fsdp(data: Mapping[str, Any], options: LintOptions | None = None) -> FsdpSetup | None:
    """The FSDP setup FSDPStrategy builds from this config; None when it sets no FSDPStrategy."""
    options = options or LintOptions()
    strategy = _strategy(data)
    if strategy is None:
        return None
    name = _strategy_name(strategy.get("sharding_strategy", "FULL_SHARD")) or INVALID
    offload = strategy.alias_offload if strategy.alias_offload is not None else bool(
        _offload_of(strategy.get("cpu_offload")))
    state_dict = strategy.get("state_dict_type", strategy.flavor.state_dict_default)
    checkpointing = any(strategy.get(n) is not None for n in ("activation_checkpointing_policy",
                                                                "activation_checkpointing"))
    world, nodes, source = _world(data, strategy.path)
    world_source = source if world else ""
    if options.world_size is not None:
        world, world_source = options.world_size, options.world_size_from

    def setting(arg: str, value: Any) -> Setting:
        return Setting(strategy.key(arg), value, strategy.has(arg))

    precision = str(_holder(data, strategy.path)[1].get("precision", "32-true"))  # Lightning's default
    return FsdpSetup(
        "lightning", 1, setting("sharding_strategy", name.lstrip("_")),
        setting("cpu_offload", offload),
        setting("auto_wrap_policy", "POLICY" if strategy.get("auto_wrap_policy") is not None else "NO_WRAP"),
        setting("state_dict_type", {"sharded": "SHARDED_STATE_DICT", "full": "FULL_STATE_DICT"}.get(state_dict, INVALID)),
        setting("activation_checkpointing_policy", checkpointing),
        setting("use_orig_params", strategy.get("use_orig_params", True) is not False),
        world, world_source, options.nodes or nodes,
        "bf16" if "bf16" in precision else "fp16" if "16" in precision else "fp32")


def lint_lightning_config(data: Mapping[str, Any], options: LintOptions | None = None) -> LintReport:
    """Lint the FSDPStrategy a LightningCLI (or Fabric) YAML sets, as Lightning builds it."""
    options = options or LintOptions()
    found = FsdpFindings("lightning")
    strategy = _strategy(data)
    setup = resolve_lightning_fsdp(data, options)
    if strategy is None or setup is None:
        return found.report(None, LIGHTNING_ORIGIN)
    _check_keys(strategy, found)
    _check_values(strategy, found)
    _check_hybrid(strategy, setup, found)
    _check_checkpointing(strategy, found)
    run_rules(setup, options, found)
    return found.report(setup, LIGHTNING_ORIGIN)
