"""Lint an accelerate config for FSDP: its ``fsdp_config`` block as ``accelerate launch`` reads it.

The launcher copies each fsdp_config key onto its own arguments (a key without the ``fsdp`` prefix gets
one), refuses a file with unknown top-level keys, hands the FSDP settings to the training processes as
``FSDP_*`` environment variables, and ``FullyShardedDataParallelPlugin`` reads them back. Which keys,
choices and defaults it has is an ``AccelerateFsdpSchema``. Facts the rules rest on (accelerate 1.15,
read from its launcher and plugin; a test runs both on every fixture):
- an fsdp_config key the launcher does not know is copied and never read: no effect and no error.
- the launcher refuses fsdp_cpu_ram_efficient_loading (true unless set) without fsdp_sync_module_states.
- for FSDP1 the launcher always passes fsdp_sharding_strategy (FULL_SHARD unless set) and the plugin reads
  it before fsdp_reshard_after_forward, the key ``accelerate config`` writes: under ``accelerate launch``
  FSDP1's fsdp_reshard_after_forward is never read.
- FSDP2 reads fsdp_reshard_after_forward as a boolean (a strategy name is refused) and ignores
  fsdp_sharding_strategy, both prefetch settings, use_orig_params and sync_module_states.
- activation checkpointing wraps the modules the auto wrap policy selects: without a policy FSDP1
  checkpoints every submodule, nested, and FSDP2's prepare() fails calling the missing policy.
Rules on FSDP itself are ``zeromon.analysis.lint_fsdp``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zeromon.analysis.lint import LintOptions, LintReport
from zeromon.analysis.lint_fsdp import (
    INVALID,
    FsdpFindings,
    FsdpSetup,
    Setting,
    nearest,
    run_rules,
    state_of,
    truth,
    wrap_fix,
)
from zeromon.analysis.lint_fsdp_schema import STATIC_ACCELERATE_FSDP, AccelerateFsdpSchema
from zeromon.model.classes import mutable

_STATE_DICT_BY_NUMBER = ("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT")  # torch's StateDictType


def launcher_name(key: str) -> str:
    """The launcher's name for an fsdp_config key: 'offload_params' is read as fsdp_offload_params."""
    return key if key.startswith("fsdp") else f"fsdp_{key}"


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return int(str(value).strip())
    except ValueError:
        return None


@mutable
class _Block:
    """The fsdp_config keys the launcher reads, by its name: where each is written and its value."""

    paths: dict[str, str]
    raw: dict[str, Any]
    schema: AccelerateFsdpSchema

    def path(self, name: str) -> str:
        return self.paths.get(name, f"fsdp_config.{name}")

    def setting(self, name: str, value: Any) -> Setting:
        return Setting(self.path(name), value, name in self.raw)

    def flag(self, name: str) -> bool:
        """A boolean as the plugin reads it, the launcher's default when unset or unreadable (ZL034's)."""
        value = truth(self.raw[name]) if name in self.raw else None
        return value if value is not None else truth(self.schema.defaults.get(name)) is True


def _strategy_name(value: Any, schema: AccelerateFsdpSchema) -> str | None:
    """A ShardingStrategy as FullyShardedDataParallelPlugin reads it: a name (any case) or its number 1-5."""
    text = str(value).strip().upper()
    if text in schema.sharding_strategies:
        return text
    number = _count(text) if text.isdigit() else None
    return schema.sharding_strategies[number - 1] if number and 1 <= number <= len(schema.sharding_strategies) \
        else None


def _state_dict_name(value: Any) -> str | None:
    text = str(value).strip().upper()
    if text.isdigit():
        number = int(text)
        return _STATE_DICT_BY_NUMBER[number - 1] if 1 <= number <= 3 else None
    return text if text in _STATE_DICT_BY_NUMBER else None


# ------------------------------------------------------------------------------------------ reading the file


def _check_top_level(accelerate: Mapping[str, Any], schema: AccelerateFsdpSchema, found: FsdpFindings) -> None:
    for key in accelerate:
        name = str(key)
        if name in schema.top_level:
            continue
        if launcher_name(name) in schema.fsdp_keys:
            hint, fix = "it is an FSDP setting, read inside fsdp_config", f"move it into fsdp_config as {name}"
        else:
            close = nearest(name, schema.top_level)
            hint = f"did you mean {close}?" if close else "accelerate does not know it"
            fix = f"rename it to {close}" if close else "remove it"
        found.add("ZL033", "error", name, f"unknown top-level key {name}: {hint}; accelerate launch refuses a config "
                  "file with unknown keys (\"had unknown keys ... please try upgrading your accelerate version or fix "
                  "(and potentially remove) these keys\")", fix)
    distributed = accelerate.get("distributed_type")
    if distributed is None:
        found.add("ZL034", "error", "distributed_type", "distributed_type is not set; accelerate launch refuses the "
                  "file (\"A `distributed_type` must be specified in the config file\")", "set distributed_type: FSDP")
    elif str(distributed) not in schema.distributed_types:
        close = next((t for t in schema.distributed_types if t == str(distributed).upper()), None) or nearest(
            str(distributed).upper(), schema.distributed_types)
        found.add("ZL034", "error", "distributed_type",
                  f"distributed_type {distributed!r} is not one of accelerate's ({', '.join(schema.distributed_types)}; "
                  "upper case); accelerate launch refuses the file", f"set distributed_type: {close or 'FSDP'}")
    if distributed is not None and str(distributed).upper() != "FSDP":
        found.add("ZL046", "warning", "distributed_type",
                  f"distributed_type is {distributed!r}: accelerate launch uses FSDP only with distributed_type: FSDP, so "
                  "the fsdp_config block is ignored", "set distributed_type: FSDP")
    elif isinstance(accelerate.get("deepspeed_config"), Mapping) and accelerate["deepspeed_config"]:
        found.add("ZL046", "info", "deepspeed_config", "deepspeed_config is set next to distributed_type: FSDP; "
                  "accelerate launch ignores it", "remove deepspeed_config, or set distributed_type: DEEPSPEED to use it")


def _read_block(block: Mapping[str, Any], schema: AccelerateFsdpSchema, found: FsdpFindings) -> _Block:
    paths: dict[str, str] = {}
    raw: dict[str, Any] = {}
    for key, value in block.items():
        path, name = f"fsdp_config.{key}", launcher_name(str(key))
        if name in schema.fsdp_keys:
            paths[name], raw[name] = path, value
            continue
        close = nearest(name, schema.fsdp_keys)
        if str(key) in schema.top_level:
            hint, fix = f"{key} is a top-level key of the accelerate file", f"move {key} to the top level"
        elif close:
            hint, fix = f"did you mean {close}?", f"rename it to {close}"
        else:
            hint, fix = "accelerate does not know it", "remove it"
        found.add("ZL033", "warning", path, f"{path} is ignored: {hint}; accelerate launch copies fsdp_config keys "
                  "it does not know and never reads them, so this setting has no effect", fix)
    return _Block(paths, raw, schema)


def _refuse(found: FsdpFindings, block: _Block, name: str, why: str, fix: str) -> None:
    value = block.raw[name]
    found.add("ZL034", "error", block.path(name), f"{block.path(name)} is {value!r}: {why}; accelerate refuses it "
              "when the training script creates its Accelerator", fix)


def _check_values(block: _Block, version: int, found: FsdpFindings) -> None:
    schema = block.schema
    for name in sorted(block.raw):
        value = block.raw[name]
        if name in schema.bool_keys and truth(value) is None:
            _refuse(found, block, name, "not a boolean (accelerate's str_to_bool reads true/false, yes/no, on/off, "
                    "1/0)", f"set {name} to true or false")
    choices = (("fsdp_auto_wrap_policy", schema.auto_wrap_policies), ("fsdp_backward_prefetch", schema.backward_prefetch))
    for name, allowed in choices:
        value = block.raw.get(name)
        if value is None or str(value).strip().upper() in allowed or (
                name == "fsdp_backward_prefetch" and str(value).strip() in ("1", "2")):
            continue
        close = nearest(str(value).strip().upper(), allowed)
        _refuse(found, block, name, f"not one of {', '.join(allowed)}",
                f"set {name} to {close or allowed[0]}" + ("" if close else f" (or one of {', '.join(allowed[1:])})"))
    if "fsdp_sharding_strategy" in block.raw and version == 1 and \
            _strategy_name(block.raw["fsdp_sharding_strategy"], schema) is None:
        close = nearest(str(block.raw["fsdp_sharding_strategy"]).strip().upper(), schema.sharding_strategies)
        _refuse(found, block, "fsdp_sharding_strategy", f"not one of {', '.join(schema.sharding_strategies)} (or "
                f"their numbers 1-{len(schema.sharding_strategies)})", f"set fsdp_sharding_strategy to "
                f"{close or 'FULL_SHARD'}")
    _check_reshard_value(block, version, found)
    _check_state_dict_value(block, version, found)
    _check_wrap_values(block, found)


def _check_reshard_value(block: _Block, version: int, found: FsdpFindings) -> None:
    value = block.raw.get("fsdp_reshard_after_forward")
    if version != 2 or "fsdp_reshard_after_forward" not in block.raw or truth(value) is not None:
        return
    strategy = _strategy_name(value, block.schema)
    mapped = block.schema.fsdp2_reshard_of.get(strategy or "")
    if mapped is not None:
        fix = (f"set fsdp_reshard_after_forward: {str(mapped).lower()} (what accelerate to-fsdp2 makes of {strategy})"
               + ("; FSDP2's hybrid sharding is parallelism_config's dp_replicate_size" if "HYBRID" in str(strategy)
                  else "; FSDP2 always shards: NO_SHARD is DDP (distributed_type: MULTI_GPU)"
                  if strategy == "NO_SHARD" else ""))
    else:
        fix = "set fsdp_reshard_after_forward to true (FULL_SHARD's behaviour) or false (SHARD_GRAD_OP's)"
    _refuse(found, block, "fsdp_reshard_after_forward", "FSDP2 reads fsdp_reshard_after_forward as a boolean, and a "
            "sharding strategy name is not one (FullyShardedDataParallelPlugin: \"invalid truth value\")", fix)


def _check_state_dict_value(block: _Block, version: int, found: FsdpFindings) -> None:
    if block.raw.get("fsdp_state_dict_type") is None:
        return
    name = _state_dict_name(block.raw["fsdp_state_dict_type"])
    allowed = block.schema.state_dict_types if version == 1 else block.schema.fsdp2_state_dict_types
    if name in allowed:
        return
    why = ("FSDP2 does not support LOCAL_STATE_DICT" if name == "LOCAL_STATE_DICT" else
           f"not one of {', '.join(allowed)}")
    close = nearest(str(block.raw["fsdp_state_dict_type"]).strip().upper(), allowed)
    _refuse(found, block, "fsdp_state_dict_type", why, f"set fsdp_state_dict_type to "
            f"{close if close and close != name else 'SHARDED_STATE_DICT'}")


def _check_wrap_values(block: _Block, found: FsdpFindings) -> None:
    policy = str(block.raw.get("fsdp_auto_wrap_policy") or "NO_WRAP").strip().upper()
    if policy == "SIZE_BASED_WRAP" and "fsdp_min_num_params" in block.raw and \
            _count(block.raw["fsdp_min_num_params"]) is None:
        _refuse(found, block, "fsdp_min_num_params", "the size-based policy reads it with int(), which takes an "
                "integer written out (1e8 and 1.0e+8 are refused)", "write it as an integer, e.g. 100000000")
    classes = block.raw.get("fsdp_transformer_layer_cls_to_wrap")
    if policy == "TRANSFORMER_BASED_WRAP" and classes is not None and not isinstance(classes, str):
        path = block.path("fsdp_transformer_layer_cls_to_wrap")
        found.add("ZL034", "error", path, f"{path} is a {type(classes).__name__}: accelerate passes it on as text and "
                  f"splits it at commas, so it looks for a class named {str(classes).split(',')[0]!r} and prepare() "
                  "fails (\"Could not find the transformer layer class\")",
                  "write one comma-separated string: fsdp_transformer_layer_cls_to_wrap: GPT2Block,GPT2MLP")


# ---------------------------------------------------------------------------------------------- the setup


def _version(block: _Block, found: FsdpFindings) -> int:
    if "fsdp_version" not in block.raw:
        return 1
    text = str(block.raw["fsdp_version"]).strip()
    if text in block.schema.fsdp_versions:
        return int(text)
    _refuse(found, block, "fsdp_version", f"accelerate has FSDP versions {' and '.join(block.schema.fsdp_versions)}",
            "set fsdp_version to 1 (FullyShardedDataParallel) or 2 (fully_shard)")
    return 1


def resolve_accelerate_fsdp(accelerate: Mapping[str, Any], options: LintOptions | None = None,
                            schema: AccelerateFsdpSchema = STATIC_ACCELERATE_FSDP) -> FsdpSetup:
    """The FSDP setup ``accelerate launch`` gives the training processes for this config file."""
    unused = FsdpFindings("accelerate")
    block_value = accelerate.get("fsdp_config")
    block = _read_block(block_value if isinstance(block_value, Mapping) else {}, schema, unused)
    return _setup_of(accelerate, block, _version(block, unused), options or LintOptions())


def _setup_of(accelerate: Mapping[str, Any], block: _Block, version: int, options: LintOptions) -> FsdpSetup:
    schema = block.schema
    if version == 1:
        strategy = _strategy_name(block.raw.get("fsdp_sharding_strategy", "FULL_SHARD"), schema) or INVALID
        strategy_setting = block.setting("fsdp_sharding_strategy", strategy)
    else:
        readable = truth(block.raw.get("fsdp_reshard_after_forward", True)) is not None
        strategy = ("FULL_SHARD" if block.flag("fsdp_reshard_after_forward") else "SHARD_GRAD_OP") if readable \
            else INVALID
        strategy_setting = block.setting("fsdp_reshard_after_forward", strategy)
    wrap = str(block.raw.get("fsdp_auto_wrap_policy") or "NO_WRAP").strip().upper()
    state_dict = (_state_dict_name(block.raw["fsdp_state_dict_type"]) or INVALID) if block.raw.get(
        "fsdp_state_dict_type") is not None else None
    processes, machines = _count(accelerate.get("num_processes")), _count(accelerate.get("num_machines"))
    world, source = options.world_size, options.world_size_from
    if world is None and processes is not None and processes > 0:
        world, source = processes, "num_processes in the accelerate file"
    precision = str(accelerate.get("mixed_precision") or "no").lower()
    return FsdpSetup(
        "accelerate", version, strategy_setting,
        block.setting("fsdp_offload_params", block.flag("fsdp_offload_params")),
        block.setting("fsdp_auto_wrap_policy", wrap if wrap in schema.auto_wrap_policies else INVALID),
        block.setting("fsdp_state_dict_type", state_dict or ("FULL_STATE_DICT" if version == 1 else "SHARDED_STATE_DICT")),
        block.setting("fsdp_activation_checkpointing", block.flag("fsdp_activation_checkpointing")),
        block.setting("fsdp_use_orig_params", block.flag("fsdp_use_orig_params") if version == 1 else None),
        world, source, options.nodes or (machines if machines and machines > 0 else 1),
        {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(precision, "fp32"))


# ------------------------------------------------------------------------------------------- accelerate's rules


def _check_loading(block: _Block, found: FsdpFindings) -> None:
    if block.flag("fsdp_cpu_ram_efficient_loading") and not block.flag("fsdp_sync_module_states"):
        loading = "true" if "fsdp_cpu_ram_efficient_loading" in block.raw else "not set (the launcher's default: true)"
        found.add("ZL041", "error", block.path("fsdp_sync_module_states"),
                  f"fsdp_sync_module_states is false with fsdp_cpu_ram_efficient_loading {loading}: only rank 0 loads "
                  "the pretrained weights and the others start empty, so the weights must be broadcast from rank 0; "
                  "accelerate launch refuses it (\"When using `--fsdp_cpu_ram_efficient_loading` set "
                  "`--fsdp_sync_module_states` to `True`\")",
                  "set fsdp_sync_module_states: true, or fsdp_cpu_ram_efficient_loading: false to load the weights "
                  "on every rank")


def _check_checkpointing(setup: FsdpSetup, block: _Block, found: FsdpFindings) -> None:
    if block.flag("fsdp_activation_checkpointing_offload"):
        path = block.path("fsdp_activation_checkpointing_offload")
        if not setup.activation_checkpointing.value:
            found.add("ZL042", "error", path, "fsdp_activation_checkpointing_offload without "
                      "fsdp_activation_checkpointing: it offloads the inputs the checkpoints keep, and accelerate "
                      "refuses it alone (\"requires `activation_checkpointing=True`\")",
                      "set fsdp_activation_checkpointing: true, or remove the offload")
        if setup.version != 2:
            found.add("ZL042", "error", path, "fsdp_activation_checkpointing_offload is FSDP2's; accelerate refuses it "
                      "with FSDP1 (\"requires `fsdp_version=2`\")", "set fsdp_version: 2, or remove the offload")
    if not setup.activation_checkpointing.value or setup.wrap.value != "NO_WRAP":
        return
    key = setup.activation_checkpointing.key
    if setup.version == 2:
        found.add("ZL042", "error", key, "activation checkpointing without an auto wrap policy under FSDP2: "
                  "accelerate asks the policy which layers to checkpoint, and with NO_WRAP there is none, so "
                  "prepare() fails (it calls the policy, which is None: TypeError)", wrap_fix(setup))
    else:
        found.add("ZL042", "warning", key, "activation checkpointing without an auto wrap policy: accelerate lets the "
                  "policy choose what to checkpoint, and with none torch's apply_activation_checkpointing wraps every "
                  "submodule, each inside its parent's checkpoint, so the backward recomputes each forward once per "
                  "level of nesting", wrap_fix(setup))


def _check_unread(setup: FsdpSetup, block: _Block, found: FsdpFindings) -> None:
    """ZL044 and ZL045: settings accelerate does not read with this FSDP version or wrap policy."""
    schema = block.schema
    if setup.version == 2:
        for name, why in schema.fsdp2_dropped.items():
            if name in block.raw:
                found.add("ZL044", "info", block.path(name), f"{name} has no effect with FSDP2: {why} in FSDP2 "
                          "(accelerate to-fsdp2 drops it)", f"remove {name}")
    for name, policy in (("fsdp_transformer_layer_cls_to_wrap", "TRANSFORMER_BASED_WRAP"),
                         ("fsdp_min_num_params", "SIZE_BASED_WRAP")):
        if block.raw.get(name) is not None and setup.wrap.value not in (policy, INVALID):
            found.add("ZL044", "warning", block.path(name), f"{name} is read only by the {policy} policy, and the "
                      f"policy is {state_of(setup.wrap, 'accelerate')}: it has no effect",
                      f"set fsdp_auto_wrap_policy: {policy}, or remove {name}")
    if setup.wrap.value == "TRANSFORMER_BASED_WRAP" and block.raw.get("fsdp_transformer_layer_cls_to_wrap") is None:
        found.add("ZL039", "info", block.path("fsdp_transformer_layer_cls_to_wrap"),
                  "TRANSFORMER_BASED_WRAP without fsdp_transformer_layer_cls_to_wrap wraps the classes the model "
                  "lists in _no_split_modules: a Transformers model has them, any other model wraps nothing and "
                  "is one FSDP unit", "name the block class if the model is not a Transformers model")
    if setup.version == 1 and "fsdp_reshard_after_forward" in block.raw:
        asked = _strategy_name(block.raw["fsdp_reshard_after_forward"], schema)
        if asked != setup.strategy.value:
            how = f"asks for {asked}" if asked else "is not a strategy name either"
            runs = f"{setup.strategy.value}{'' if setup.strategy.written else ' unless set'}"
            found.add("ZL045", "error", block.path("fsdp_reshard_after_forward"),
                      f"fsdp_reshard_after_forward {how}, but FSDP1 under accelerate launch never reads it: the "
                      f"launcher always passes fsdp_sharding_strategy ({runs}) and FullyShardedDataParallelPlugin "
                      f"reads that first, so this run shards {setup.strategy.value}",
                      f"write fsdp_sharding_strategy: {asked or 'FULL_SHARD'} and remove fsdp_reshard_after_forward")
    if setup.version == 2 and "fsdp_sharding_strategy" in block.raw:
        raw = block.raw["fsdp_sharding_strategy"]
        asked = _strategy_name(raw, schema)
        reshard = schema.fsdp2_reshard_of.get(asked or "")
        runs = setup.strategy.value == "FULL_SHARD"
        if reshard is not None and reshard == runs:
            found.add("ZL044", "info", block.path("fsdp_sharding_strategy"), "fsdp_sharding_strategy has no effect "
                      "with FSDP2 (fsdp_reshard_after_forward decides, and agrees with it here)",
                      f"write fsdp_reshard_after_forward: {str(reshard).lower()} and remove fsdp_sharding_strategy")
        else:
            unless = "" if setup.strategy.written else " unless set"
            found.add("ZL045", "error", block.path("fsdp_sharding_strategy"),
                      f"fsdp_sharding_strategy asks for {asked or repr(raw)}, but FSDP2 does not read it: "
                      f"fsdp_reshard_after_forward decides, {str(runs).lower()}{unless}, so this run "
                      f"{'reshards' if runs else 'keeps'} parameters after the forward (FSDP2 always shards)",
                      f"write fsdp_reshard_after_forward: {str(reshard).lower() if reshard is not None else 'true'} "
                      "(what accelerate to-fsdp2 makes of it) and remove fsdp_sharding_strategy")


def lint_accelerate_fsdp_config(accelerate: Mapping[str, Any], options: LintOptions | None = None,
                                schema: AccelerateFsdpSchema = STATIC_ACCELERATE_FSDP) -> LintReport:
    """Lint an accelerate config with an fsdp_config block (or distributed_type: FSDP), as accelerate launch
    and FullyShardedDataParallelPlugin read it."""
    options = options or LintOptions()
    found = FsdpFindings("accelerate")
    _check_top_level(accelerate, schema, found)
    block_value = accelerate.get("fsdp_config")
    block = _read_block(block_value if isinstance(block_value, Mapping) else {}, schema, found)
    version = _version(block, found)
    _check_values(block, version, found)
    setup = _setup_of(accelerate, block, version, options)
    run_rules(setup, options, found)
    _check_loading(block, found)
    _check_checkpointing(setup, block, found)
    _check_unread(setup, block, found)
    return found.report(setup, schema.origin)
