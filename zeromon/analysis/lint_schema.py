"""What DeepSpeed and accelerate accept, written down: rule ids, accelerate's key tables, the schema.

``STATIC_SCHEMA`` is DeepSpeed 0.19.8's facts for machines without DeepSpeed; with DeepSpeed
installed, ``zeromon.sources.configs.deepspeed_schema`` builds the same from its config classes (a
test checks the two agree). The rules that use these live in ``zeromon.analysis.lint``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field

from zeromon.analysis.lint_types import STATIC_TYPES, FieldType
from zeromon.model.classes import frozen

SEVERITIES = ("error", "warning", "info")

# id -> what the rule looks for; the ids are stable (scripts may filter on them).
RULES: dict[str, str] = {
    "ZL001": "ZeRO-3 without stage3_gather_16bit_weights_on_model_save",
    "ZL002": "train_batch_size != micro batch x gradient accumulation x world size",
    "ZL003": "batch sizes that no world size satisfies, or the world size they imply",
    "ZL004": "no batch size given (DeepSpeed needs train_batch_size or train_micro_batch_size_per_gpu)",
    "ZL005": "gradient_accumulation_steps differ between the accelerate file and the DeepSpeed file",
    "ZL006": "fp16 with ZeRO-3",
    "ZL007": "fp16 and bf16 both enabled",
    "ZL008": "overlap_comm off or left at a default of off",
    "ZL009": "offload without pin_memory",
    "ZL010": "nvme offload without nvme_path",
    "ZL011": "\"auto\" outside the Hugging Face / accelerate integration",
    "ZL012": "unknown key (refused in the sections DeepSpeed reads through a pydantic model, ignored at the top "
             "level and under timers)",
    "ZL013": "key removed from DeepSpeed",
    "ZL014": "deprecated key",
    "ZL015": "ZeRO-3 where ZeRO-2 fits",
    "ZL016": "option that has no effect at this ZeRO stage",
    "ZL017": "bucket size too small or too large",
    "ZL018": "ZeRO-3 live parameters or prefetch bucket too large for the GPU",
    "ZL019": "fp16 with a static loss scale, or without gradient clipping",
    "ZL020": "max_grad_norm in optimizer params (DeepSpeed ignores it)",
    "ZL021": "invalid ZeRO stage",
    "ZL022": "gradient_allreduce_op sum with ZeRO-3",
    "ZL023": "key repeated in one JSON object",
    "ZL024": "DeepSpeed key in accelerate's deepspeed_config block (accelerate ignores it)",
    "ZL025": "accelerate keys next to deepspeed_config_file (accelerate refuses to start)",
    "ZL026": "accelerate distributed_type is not DEEPSPEED",
    "ZL027": "relative deepspeed_config_file (accelerate opens it from the launch directory)",
    "ZL028": "batch size value that is not a positive integer",
    "ZL029": "NVMe optimizer offload at ZeRO stage 1 or 2 (DeepSpeed offloads to CPU memory)",
    "ZL030": "number that is not finite (NaN, Infinity, or past a float's range such as 1e400)",
    "ZL031": "value of a type, range or choice DeepSpeed's config classes refuse",
    "ZL032": "combination of values DeepSpeed's config classes refuse (partial offload, grad norm, loss scale)",
    # FSDP: accelerate's fsdp_config and Lightning's FSDPStrategy (zeromon.analysis.lint_fsdp)
    "ZL033": "unknown key in an accelerate FSDP config or a Lightning FSDPStrategy (refused, or ignored in "
             "accelerate's fsdp_config)",
    "ZL034": "FSDP value accelerate or Lightning refuses (a choice, a boolean, an integer, the FSDP version)",
    "ZL035": "NO_SHARD: FSDP without sharding, with DDP's memory",
    "ZL036": "SHARD_GRAD_OP (reshard_after_forward false): parameters stay gathered from forward to backward",
    "ZL037": "HYBRID_SHARD on one machine; Lightning's hybrid sharding without a wrap policy or device_mesh, or a "
             "device_mesh of the wrong size or strategy",
    "ZL038": "FSDP CPU offload of parameters: gradients and the optimizer step move to the CPU",
    "ZL039": "no FSDP auto wrap policy: the whole model is one unit, gathered at once, without overlap",
    "ZL040": "full state dict: checkpoints gathered on rank 0 (sharded state dicts for large models)",
    "ZL041": "fsdp_cpu_ram_efficient_loading without fsdp_sync_module_states (accelerate refuses to launch)",
    "ZL042": "FSDP activation checkpointing: what it checkpoints, and settings that fail with it",
    "ZL043": "use_orig_params false: no optimizer parameter groups, frozen parameters or torch.compile",
    "ZL044": "FSDP setting that has no effect with this FSDP version or wrap policy",
    "ZL045": "sharding strategy set by a key accelerate does not read for this FSDP version",
    "ZL046": "accelerate distributed_type is not FSDP next to an fsdp_config block, or a deepspeed_config under FSDP",
    "ZL047": "FSDP sharding strategy against GPU memory (with --params, --gpus and --gpu-memory)",
}

# The keys accelerate reads from its `deepspeed_config` block (accelerate/commands/launch.py, deepspeed_args).
ACCELERATE_DEEPSPEED_KEYS = frozenset({
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names",
})
# With deepspeed_config_file, accelerate raises if its config also sets one of these
# (DeepSpeedPlugin._deepspeed_config_checks); mixed_precision is the file's top-level key.
ACCELERATE_FILE_OWNED_KEYS = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage",
                              "offload_optimizer_device", "offload_param_device", "offload_param_nvme_path",
                              "offload_optimizer_nvme_path", "zero3_save_16bit_model")
# accelerate key -> the DeepSpeed key it sets (accelerate's DeepSpeedPlugin.plugin_to_config_mapping).
ACCELERATE_TO_DEEPSPEED = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
    "offload_optimizer_nvme_path": "zero_optimization.offload_optimizer.nvme_path",
    "offload_param_nvme_path": "zero_optimization.offload_param.nvme_path",
    "zero3_save_16bit_model": "zero_optimization.stage3_gather_16bit_weights_on_model_save",
}
DEEPSPEED_TO_ACCELERATE = {ds: "deepspeed_config." + acc for acc, ds in ACCELERATE_TO_DEEPSPEED.items()}
DEEPSPEED_TO_ACCELERATE.update({
    "fp16": "mixed_precision", "fp16.enabled": "mixed_precision", "bf16": "mixed_precision",
    "bf16.enabled": "mixed_precision",
    "zero_optimization.offload_optimizer": "deepspeed_config.offload_optimizer_device",
    "zero_optimization.offload_param": "deepspeed_config.offload_param_device",
})

INLINE_HINT = ("accelerate's inline deepspeed_config cannot set this: write a DeepSpeed JSON and point "
                "deepspeed_config_file at it")


@frozen
class ConfigSchema:
    """What a DeepSpeed version accepts: known keys per section ("" is the top level), removed and
    deprecated keys, and the defaults the rules mention."""

    sections: Mapping[str, frozenset[str]]
    removed: Mapping[str, str]  # key path -> DeepSpeed's reason
    deprecated: Mapping[str, str]  # key path -> the key to use instead
    overlap_comm_default: tuple[bool, bool, bool, bool]  # by stage
    pin_memory_default: bool
    origin: str  # where these facts come from, for the report
    types: Mapping[str, FieldType] = field(default_factory=lambda: STATIC_TYPES)  # key path -> its value type

    def strict(self, section: str) -> bool:
        """Sections that are pydantic models with extra="forbid": an unknown key there is fatal. DeepSpeed
        reads the top level and ``timers`` key by key, and ignores the keys it does not look up."""
        return section not in ("", "timers")


_OFFLOAD_COMMON = {"device", "nvme_path", "buffer_count", "pin_memory"}
_MONITOR_FILES = frozenset({"enabled", "output_path", "job_name"})
_TP_BLOCK = frozenset({"mpu", "tp_grain_size", "tp_group", "tp_size"})
_SEE_8489 = "See https://github.com/deepspeedai/DeepSpeed/issues/8489."
# The DeepSpeed release STATIC_SCHEMA was written from: with this version installed, reading its
# config classes (which costs importing DeepSpeed and torch) gives the same facts.
STATIC_SCHEMA_VERSION = "0.19.8"
STATIC_SCHEMA = ConfigSchema(
    sections={
        "": frozenset({
            "activation_checkpointing", "aio", "autotuning", "bf16", "bfloat16", "checkpoint", "comet",
            "comms_logger", "communication_data_type", "compile", "csv_monitor", "data_efficiency", "data_types",
            "dataloader_drop_last", "datastates_ckpt", "disable_allgather", "disable_python_gc", "dump_state",
            "expert_parallel", "flops_profiler", "fp16", "gradient_accumulation_steps", "gradient_allreduce_op",
            "gradient_clipping", "gradient_predivide_factor", "hybrid_engine", "log_level",
            "managed_gradient_accumulation", "memory_breakdown", "optimizer", "pipeline", "prescale_gradients",
            "scheduler", "seq_parallel_communication_data_type", "sequence_parallel_size", "steps_per_print",
            "tensor_parallel", "tensorboard", "timers", "torch_autocast", "train_batch_size",
            "train_micro_batch_size_per_gpu", "use_data_before_expert_parallelism", "wall_clock_breakdown", "wandb",
            "weight_quantization", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
            "zero_optimization"}),
        "zero_optimization": frozenset({
            "allgather_bucket_size", "allgather_partitions", "allgather_sequential", "compute_grad_norm",
            "contiguous_gradients", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory",
            "elastic_checkpoint", "enable_sanity_checks", "gather_16bit_weights_on_model_save",
            "ignore_unused_parameters", "leaf_module", "legacy_stage1", "load_from_fp32_weights",
            "log_trace_cache_warnings", "max_live_parameters", "max_reuse_distance", "memory_efficient_linear",
            "model_persistence_threshold", "module_granularity_threshold", "offload_optimizer", "offload_param",
            "overlap_comm", "override_module_apply", "param_persistence_threshold", "parameter_alignment",
            "pipeline_loading_checkpoint", "prefetch_bucket_size", "reduce_bucket_size", "reduce_scatter",
            "round_robin_gradients", "save_muon_momentum_buffer_in_memory", "stage", "stage3_allgather_sequential",
            "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
            "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_model_persistence_threshold",
            "stage3_module_granularity_threshold", "stage3_param_persistence_threshold",
            "stage3_prefetch_bucket_size", "stage3_use_all_reduce_for_fetch_params", "sub_group_size",
            "use_all_reduce_for_fetch_params", "use_multi_rank_bucket_allreduce", "zenflow",
            "zero_hpz_partition_size", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
            "zero_quantized_weights"}),
        "zero_optimization.offload_param": frozenset(_OFFLOAD_COMMON | {"buffer_size", "max_in_cpu"}),
        "zero_optimization.offload_optimizer": frozenset(_OFFLOAD_COMMON | {
            "cpuadam_cores_perc", "fast_init", "pipeline_read", "pipeline_write", "ratio", "super_offload"}),
        "zero_optimization.zenflow": frozenset({
            "auto_ratio", "full_warm_up_rounds", "offload", "overlap_step", "pt_reserved_cores_perc",
            "select_interval", "select_strategy", "steps_per_epoch", "topk_ratio", "update_interval"}),
        "zero_optimization.leaf_module": frozenset({"classes", "name_suffixes", "names"}),
        "fp16": frozenset({"auto_cast", "consecutive_hysteresis", "enabled", "fp16_master_weights_and_grads",
                           "hysteresis", "initial_scale_power", "loss_scale", "loss_scale_window", "min_loss_scale"}),
        "bf16": frozenset({"bf16_master_weights_and_grads", "bf16_optimizer_states", "check_grad_overflow",
                           "enabled", "immediate_grad_update"}),
        "tensorboard": _MONITOR_FILES,
        "csv_monitor": _MONITOR_FILES,
        "wandb": frozenset({"enabled", "group", "project", "team"}),
        "comet": frozenset({"api_key", "enabled", "experiment_key", "experiment_name", "mode", "online", "project",
                            "samples_log_interval", "workspace"}),
        "compile": frozenset({
            "autoep_non_moe", "debug_log", "deepcompile", "double_buffer", "free_activation",
            "free_activation_threshold", "keep_all_input_tensors", "keep_int_input_tensors", "offload_activation",
            "offload_activation_pin_memory", "offload_opt_states", "offload_parameters", "passes",
            "symmetric_memory", "sync_after_allgather", "sync_after_reduce", "sync_before_allgather",
            "sync_before_reduce"}),
        "hybrid_engine": frozenset({"enable_cuda_graph", "enabled", "inference_tp_size", "max_out_tokens",
                                    "pin_parameters", "release_inference_cache", "tp_gather_partition_size"}),
        "comms_logger": frozenset({"debug", "enabled", "prof_all", "prof_ops", "verbose"}),
        "timers": frozenset({"throughput"}),
        "timers.throughput": frozenset({"enabled", "synchronized"}),
        "tensor_parallel": frozenset({
            "autotp_size", "dtype", "injection_policy_tuple", "keep_module_on_host", "kernel_inject",
            "partition_config", "preset_model", "replace_with_kernel_inject", "tensor_parallel", "tp",
            "tp_overlap_comm", "vocab_parallel_ce_backend", "vocab_parallel_lm_head"}),
        "tensor_parallel.tp": _TP_BLOCK,
        "tensor_parallel.tensor_parallel": _TP_BLOCK,
    },
    # DeepSpeed's own words (deepspeed/runtime/config.py, _REMOVED_TOP_LEVEL_CONFIG_KEYS and
    # _REMOVED_ZERO_CONFIG_KEYS), so that a lint without importing DeepSpeed says what it would.
    removed={
        "nebula": "Nebula checkpointing has been removed. A leftover 'nebula' block would be ignored and "
                  f"checkpoints would silently fall back to local torch.save. {_SEE_8489}",
        "compression_training": "The DeepSpeed compression library has been removed. A leftover "
                                "'compression_training' block would be ignored and the model would train "
                                f"unquantized. {_SEE_8489}",
        "amp": "NVIDIA Apex AMP integration has been removed. Use DeepSpeed 'fp16', 'bf16', or 'torch_autocast' "
               f"instead. {_SEE_8489}",
        "quantize_training": f"Mixture-of-Quantization (MoQ) / 'quantize_training' has been removed. {_SEE_8489}",
        "sparse_gradients": "Sparse compression of dense torch.nn.Embedding gradients has been removed. A leftover "
                            "'sparse_gradients' flag would be ignored and those gradients would be reduced dense. "
                            "Gradients from an embedding constructed with sparse=True are still reduced sparsely "
                            f"and need no config flag. {_SEE_8489}",
        "eigenvalue": "Eigenvalue-based Mixture-of-Quantization (MoQ) has been removed; the standalone 'eigenvalue' "
                      f"configuration block is no longer supported. {_SEE_8489}",
        "sparse_attention": "DeepSpeed Sparse Attention has been removed; the 'sparse_attention' configuration "
                            f"block is no longer supported. {_SEE_8489}",
        "elasticity": "Elastic training has been removed; the 'elasticity' configuration block is no longer "
                      "supported. Set train_batch_size / train_micro_batch_size_per_gpu / "
                      "gradient_accumulation_steps directly. ",
        "graph_harvesting": "Graph harvesting has been removed; the 'graph_harvesting' configuration option is no "
                            f"longer supported. {_SEE_8489}",
        "curriculum_learning": "Legacy top-level 'curriculum_learning' has been removed. Use "
                               f"'data_efficiency.data_sampling.curriculum_learning' instead. {_SEE_8489}",
        "progressive_layer_drop": "Progressive Layer Dropping has been removed; the 'progressive_layer_drop' "
                                  f"configuration block is no longer supported. {_SEE_8489}",
        "zero_optimization.mics_shard_size": "MiCS ZeRO-3 sharding has been removed; "
                                             f"'zero_optimization.mics_shard_size' is no longer supported. {_SEE_8489}",
        "zero_optimization.mics_hierarchical_params_gather": "MiCS ZeRO-3 sharding has been removed; "
            f"'zero_optimization.mics_hierarchical_params_gather' is no longer supported. {_SEE_8489}",
        "zero_optimization.zeropp_loco_param": "LoCo-Zero++ has been removed; 'zero_optimization.zeropp_loco_param' "
            "is no longer supported. Remove this key to use standard ZeRO++ quantized gradients without LoCo error "
            f"feedback. {_SEE_8489}",
    },
    deprecated={
        "zero_optimization.cpu_offload": "zero_optimization.offload_optimizer",
        "zero_optimization.cpu_offload_param": "zero_optimization.offload_param",
        "zero_optimization.cpu_offload_use_pin_memory": "offload_param or offload_optimizer",
        "zero_optimization.stage3_gather_fp16_weights_on_model_save":
            "zero_optimization.stage3_gather_16bit_weights_on_model_save",
    },
    overlap_comm_default=(False, False, False, True),
    pin_memory_default=True,
    origin=f"zeromon's static list (DeepSpeed {STATIC_SCHEMA_VERSION})",
)
