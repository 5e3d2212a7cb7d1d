"""What accelerate's FSDP launcher and Lightning's FSDPStrategy accept, written down.

``STATIC_ACCELERATE_FSDP`` is accelerate 1.15.0's, for machines without accelerate; with accelerate
installed, ``zeromon.sources.accelerate_schema`` reads the same facts from its launcher's argument
parser, its constants and its ``to-fsdp2`` converter (a test checks the two agree). Lightning is not
installed with zeromon (it is heavy): its FSDPStrategy's arguments are written down from Lightning
2.6's API reference (lightning.ai/docs/pytorch/stable/api/lightning.pytorch.strategies.FSDPStrategy.html
and the Fabric one), and the FSDP keyword arguments it passes on from torch's FullyShardedDataParallel
(a test checks those against the installed torch).
"""

from __future__ import annotations

from collections.abc import Mapping

from zeromon.model.classes import frozen

# The ShardingStrategy names, in the order accelerate numbers them (FSDP_SHARDING_STRATEGY: "1" is FULL_SHARD).
SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")


@frozen
class AccelerateFsdpSchema:
    """What one accelerate release's ``accelerate launch`` reads from a config file with FSDP."""

    top_level: frozenset[str]  # keys of the file itself (ClusterConfig's fields and the legacy keys it converts)
    distributed_types: tuple[str, ...]
    fsdp_keys: frozenset[str]  # fsdp_config keys the launcher reads ("offload_params" is read as fsdp_offload_params)
    defaults: Mapping[str, str | int | None]  # the launcher's value for a key the file does not set
    bool_keys: frozenset[str]  # read through str_to_bool: true/false, yes/no, on/off, 1/0
    fsdp_versions: tuple[str, ...]
    sharding_strategies: tuple[str, ...]
    auto_wrap_policies: tuple[str, ...]
    backward_prefetch: tuple[str, ...]
    state_dict_types: tuple[str, ...]  # FSDP1's
    fsdp2_state_dict_types: tuple[str, ...]
    fsdp2_dropped: Mapping[str, str]  # fsdp_config key -> why FSDP2 does without it (accelerate to-fsdp2)
    fsdp2_reshard_of: Mapping[str, bool]  # an FSDP1 strategy -> FSDP2's reshard_after_forward (to-fsdp2)
    origin: str  # where these facts come from, for the report


# The accelerate release STATIC_ACCELERATE_FSDP was written from: with it installed, importing accelerate
# (and torch, several seconds) would give the same facts.
STATIC_ACCELERATE_VERSION = "1.15.0"
_BOOL_KEYS = frozenset({
    "fsdp_offload_params", "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading",
    "fsdp_sync_module_states", "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload"})
STATIC_ACCELERATE_FSDP = AccelerateFsdpSchema(
    top_level=frozenset({
        "command_file", "commands", "compute_environment", "debug", "deepspeed_config", "distributed_type",
        "downcast_bf16", "dynamo_config", "enable_cpu_affinity", "fp8_config", "fsdp_config", "gpu_ids",
        "machine_rank", "main_process_ip", "main_process_port", "main_training_function", "megatron_lm_config",
        "mixed_precision", "mpirun_config", "num_machines", "num_processes", "parallelism_config", "rdzv_backend",
        "same_network", "tpu_env", "tpu_name", "tpu_use_cluster", "tpu_use_sudo", "tpu_vm", "tpu_zone", "use_cpu",
        "fp16", "dynamo_backend"}),  # the last two: older files' keys, converted by BaseConfig.process_config
    distributed_types=("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA",
                       "MULTI_XPU", "DEEPSPEED", "FSDP", "XLA", "MEGATRON_LM", "MULTI_HPU", "MULTI_NEURON"),
    # The launcher's "FSDP Arguments", and fsdp_ignored_modules, which it reads from the file alone
    # (prepare_multi_gpu_env's getattr) and which has no flag.
    fsdp_keys=frozenset({
        "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
        "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_ignored_modules", *_BOOL_KEYS}),
    defaults={"fsdp_version": "1", "fsdp_offload_params": "false", "fsdp_min_num_params": 100000000,
              "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_reshard_after_forward": "true",
              "fsdp_auto_wrap_policy": None, "fsdp_transformer_layer_cls_to_wrap": None,
              "fsdp_backward_prefetch": None, "fsdp_state_dict_type": None, "fsdp_forward_prefetch": "false",
              "fsdp_use_orig_params": "true", "fsdp_cpu_ram_efficient_loading": "true",
              "fsdp_sync_module_states": "true", "fsdp_activation_checkpointing": "false",
              "fsdp_activation_checkpointing_offload": "false"},
    bool_keys=_BOOL_KEYS,
    fsdp_versions=("1", "2"),
    sharding_strategies=SHARDING_STRATEGIES,
    auto_wrap_policies=("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"),
    backward_prefetch=("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"),
    state_dict_types=("FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"),
    fsdp2_state_dict_types=("SHARDED_STATE_DICT", "FULL_STATE_DICT"),
    fsdp2_dropped={"fsdp_backward_prefetch": "removed", "fsdp_forward_prefetch": "not yet implemented",
                   "fsdp_sync_module_states": "removed", "fsdp_use_orig_params": "removed"},
    fsdp2_reshard_of={"FULL_SHARD": True, "SHARD_GRAD_OP": False, "HYBRID_SHARD": True,
                      "HYBRID_SHARD_ZERO2": False, "NO_SHARD": False},
    origin=f"zeromon's static list (accelerate {STATIC_ACCELERATE_VERSION})",
)


# ---------------------------------------------------------------------------------------------- Lightning

LIGHTNING_VERSION = "2.6"
LIGHTNING_ORIGIN = f"zeromon's static list (Lightning {LIGHTNING_VERSION} documentation; Lightning is not read)"
_COMMON_ARGS = frozenset({
    "accelerator", "parallel_devices", "cluster_environment", "process_group_backend", "timeout", "cpu_offload",
    "mixed_precision", "auto_wrap_policy", "activation_checkpointing", "activation_checkpointing_policy",
    "sharding_strategy", "state_dict_type", "device_mesh"})


@frozen
class LightningFlavor:
    """lightning.pytorch's FSDPStrategy or lightning.fabric's: their arguments differ in a few names and
    in the default checkpoint format."""

    name: str  # "pytorch" | "fabric"
    class_path: str
    args: frozenset[str]
    state_dict_default: str


LIGHTNING_PYTORCH = LightningFlavor("pytorch", "lightning.pytorch.strategies.FSDPStrategy",
                                    _COMMON_ARGS | {"checkpoint_io", "precision_plugin"}, "full")
LIGHTNING_FABRIC = LightningFlavor("fabric", "lightning.fabric.strategies.FSDPStrategy",
                                   _COMMON_ARGS | {"precision"}, "sharded")
# The strategy names Lightning registers for FSDP (the Trainer's strategy="fsdp").
LIGHTNING_ALIASES = {"fsdp": False, "fsdp_cpu_offload": True}  # name -> cpu_offload
# ShardingStrategy members: Lightning reads a name with ShardingStrategy[value.upper()].
LIGHTNING_SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2")
LIGHTNING_STATE_DICT_TYPES = ("full", "sharded")
# FullyShardedDataParallel's keyword arguments (torch 2.13) that FSDPStrategy passes on through **kwargs:
# its own signature less the module and what the strategy sets itself (cpu_offload, mixed_precision,
# sharding_strategy, auto_wrap_policy, device_mesh and device_id; a device_id here reaches FSDP twice).
FSDP_KWARGS = frozenset({"process_group", "backward_prefetch", "ignored_modules", "param_init_fn",
                         "sync_module_states", "forward_prefetch", "limit_all_gathers", "use_orig_params",
                         "ignored_states"})
FSDP_ARGS_SET_BY_LIGHTNING = frozenset({"module", "cpu_offload", "mixed_precision", "sharding_strategy",
                                        "auto_wrap_policy", "device_mesh", "device_id"})
# What an accelerate user may write in a Lightning file: accelerate's name -> Lightning's.
LIGHTNING_NAME_OF = {"offload_params": "cpu_offload", "fsdp_offload_params": "cpu_offload",
                     "reshard_after_forward": "sharding_strategy", "fsdp_sharding_strategy": "sharding_strategy",
                     "fsdp_auto_wrap_policy": "auto_wrap_policy", "fsdp_state_dict_type": "state_dict_type",
                     "transformer_layer_cls_to_wrap": "auto_wrap_policy",
                     "fsdp_activation_checkpointing": "activation_checkpointing_policy"}

