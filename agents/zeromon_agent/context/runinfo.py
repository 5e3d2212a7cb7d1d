"""What is being trained and how: DeepSpeed (engine config), FSDP2, FSDP1, DDP, or none."""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

from zeromon.model.events import RunInfo

# DeepSpeed zero_optimization keys that change memory or overlap (DeepSpeed's config reference,
# https://www.deepspeed.ai/docs/config-json/).
_DS_ZERO_KNOBS = (
    "stage", "overlap_comm", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
    "allgather_partitions", "allgather_bucket_size", "stage3_prefetch_bucket_size",
    "stage3_max_live_parameters", "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
    "stage3_gather_16bit_weights_on_model_save", "sub_group_size", "round_robin_gradients",
)


def _dtype_name(dtype: Any) -> str | None:
    return None if dtype is None else str(dtype).replace("torch.", "")


def _find(model: Any, predicate: Any) -> Any:
    if model is None:
        return None
    try:
        for module in model.modules():
            if predicate(module):
                return module
    except Exception:  # noqa: BLE001
        return None
    return None


def _resolved_zero(engine: Any) -> dict[str, Any]:
    """zero_optimization as DeepSpeed resolved it for this engine (its defaults filled in: overlap_comm is
    true for stage 3 unless the config says otherwise), by the config keys; {} where the engine has no parsed
    config (another DeepSpeed), and the keys the user wrote stand alone."""
    try:
        resolved = engine._config.zero_config.model_dump(by_alias=True)
    except Exception:  # noqa: BLE001 - another DeepSpeed's layout
        return {}
    return resolved if isinstance(resolved, dict) else {}


def _deepspeed(engine: Any) -> dict[str, Any]:
    import deepspeed

    config = dict(getattr(engine, "config", None) or {})
    # The values the engine runs with (DeepSpeed's parse of what the user wrote, over its own defaults), else
    # the keys as written. Advice is judged against these; zeromon lint resolves a file by the same defaults.
    zero = {**dict(config.get("zero_optimization") or {}), **_resolved_zero(engine)}
    knobs: dict[str, Any] = {k: zero[k] for k in _DS_ZERO_KNOBS if k in zero and zero[k] is not None}
    for key in ("offload_optimizer", "offload_param"):
        value = zero.get(key)
        if isinstance(value, dict):
            knobs[key] = value.get("device", "none")
            if "pin_memory" in value:
                knobs[f"{key}_pin_memory"] = value["pin_memory"]
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping"):
        if key in config:
            knobs[key] = config[key]
    bf16 = bool((config.get("bf16") or {}).get("enabled")) or bool((config.get("bfloat16") or {}).get("enabled"))
    fp16 = bool((config.get("fp16") or {}).get("enabled"))
    stage = None
    try:
        stage = int(engine.zero_optimization_stage())
    except Exception:  # noqa: BLE001
        stage = zero.get("stage")
    optimizer = getattr(engine, "optimizer", None)
    inner = getattr(optimizer, "optimizer", optimizer)
    return {
        "framework": "deepspeed",
        "framework_version": getattr(deepspeed, "__version__", None),
        "zero_stage": stage,
        "param_dtype": "bfloat16" if bf16 else "float16" if fp16 else "float32",
        "reduce_dtype": None,
        "optimizer": type(inner).__name__ if inner is not None else None,
        "knobs": knobs,
    }


def _fsdp2(root: Any) -> dict[str, Any]:
    state = root._get_fsdp_state()
    knobs: dict[str, Any] = {}
    mp = getattr(getattr(state, "_mp_policy", None), "param_dtype", None)
    reduce = getattr(getattr(state, "_mp_policy", None), "reduce_dtype", None)
    groups = []
    forward_prefetch = backward_prefetch = 0
    for module in root.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        unit_state = get_state() if get_state else None
        group = getattr(unit_state, "_fsdp_param_group", None)
        forward_prefetch += bool(getattr(unit_state, "_states_to_forward_prefetch", None))
        backward_prefetch += bool(getattr(unit_state, "_states_to_backward_prefetch", None))
        if group is not None:
            groups.append(group)
            if mp is None:
                mp = getattr(getattr(group, "mp_policy", None), "param_dtype", None)
                reduce = getattr(getattr(group, "mp_policy", None), "reduce_dtype", None)
    knobs["fsdp_units"] = len(groups)
    # Units with an explicit prefetch list (set_modules_to_forward/backward_prefetch); FSDP2 always
    # prefetches the next unit in backward by default.
    knobs["forward_prefetch_units"] = forward_prefetch
    knobs["backward_prefetch_units"] = backward_prefetch
    knobs["unshard_async_op"] = any(getattr(g, "unshard_async_op", False) for g in groups)
    policies = {type(getattr(g, "offload_policy", None)).__name__ for g in groups} - {"NoneType"}
    if policies:
        # "OffloadPolicy" is FSDP2's no-offload default; "CPUOffloadPolicy" keeps shards on the host.
        knobs["offload_policy"] = ",".join(sorted(policies))
    reshard = [getattr(g, "post_forward_mesh_info", None) is not None for g in groups]
    if reshard:
        knobs["reshard_after_forward"] = all(reshard) if all(reshard) or not any(reshard) else "mixed"
    # A 2-D mesh (replicate x shard) is hybrid sharding: sharded in a group, replicated across groups, the
    # gradients reduce-scattered in the shard group and all-reduced across the replicas. Named as FSDP1 and
    # the trainers name it (HYBRID_SHARD; _HYBRID_SHARD_ZERO2 where parameters stay gathered after forward).
    mesh_info = getattr(groups[0], "mesh_info", None) if groups else None
    hybrid = type(mesh_info).__name__ == "HSDPMeshInfo"
    if hybrid:
        knobs["replicate_size"] = getattr(mesh_info, "replicate_mesh_size", None)
        knobs["shard_size"] = getattr(mesh_info, "shard_mesh_size", None)
    resharded = knobs.get("reshard_after_forward") is not False
    return {
        "framework": "fsdp2",
        "fsdp_strategy": ("HYBRID_SHARD" if resharded else "_HYBRID_SHARD_ZERO2") if hybrid else
                         ("FULL_SHARD" if resharded else "SHARD_GRAD_OP"),
        "param_dtype": _dtype_name(mp),
        "reduce_dtype": _dtype_name(reduce),
        "knobs": knobs,
    }


def _fsdp1(root: Any) -> dict[str, Any]:
    strategy = getattr(root, "sharding_strategy", None)
    mp = getattr(root, "mixed_precision", None)
    knobs: dict[str, Any] = {}
    for attr in ("forward_prefetch", "limit_all_gathers", "_use_orig_params"):
        if hasattr(root, attr):
            knobs[attr.lstrip("_")] = getattr(root, attr)
    backward_prefetch = getattr(root, "backward_prefetch", None)
    if backward_prefetch is not None:
        knobs["backward_prefetch"] = getattr(backward_prefetch, "name", str(backward_prefetch))
    offload = getattr(root, "cpu_offload", None)
    if offload is not None:
        knobs["offload_params"] = bool(getattr(offload, "offload_params", False))
    return {
        "framework": "fsdp1",
        "fsdp_strategy": getattr(strategy, "name", None),
        "param_dtype": _dtype_name(getattr(mp, "param_dtype", None)),
        "reduce_dtype": _dtype_name(getattr(mp, "reduce_dtype", None)),
        "knobs": knobs,
    }


def detect(model: Any = None, optimizer: Any = None, engine: Any = None) -> dict[str, Any]:
    """The framework fields of RunInfo for what is attached (empty framework 'unknown' if nothing)."""
    import torch

    info: dict[str, Any] = {"framework": "unknown", "framework_version": None, "zero_stage": None,
                            "fsdp_strategy": None, "param_dtype": None, "reduce_dtype": None,
                            "optimizer": None, "knobs": {}}
    if engine is not None and "deepspeed" in sys.modules:
        info.update(_deepspeed(engine))
        return info
    if model is None:
        return info
    info["framework_version"] = torch.__version__.split("+")[0]
    fsdp2_cls = getattr(sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard"), "FSDPModule", None)
    fsdp1_mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    ddp_mod = sys.modules.get("torch.nn.parallel.distributed")
    fsdp2_root = _find(model, lambda m: fsdp2_cls is not None and isinstance(m, fsdp2_cls))
    fsdp1_root = _find(model, lambda m: fsdp1_mod is not None and isinstance(m, fsdp1_mod.FullyShardedDataParallel))
    if fsdp2_root is not None:
        info.update(_fsdp2(fsdp2_root))
    elif fsdp1_root is not None:
        info.update(_fsdp1(fsdp1_root))
    elif (ddp := _find(model, lambda m: ddp_mod is not None and isinstance(m, ddp_mod.DistributedDataParallel))) \
            is not None:  # at the root, or inside a trainer's wrapper (Fabric's, torch.compile's, PEFT's)
        info.update({"framework": "ddp", "knobs": {"bucket_cap_mb": getattr(ddp, "bucket_bytes_cap", 0) / 2**20}})
    else:
        info["framework"] = "none"
        info["framework_version"] = None
        first = next(iter(model.parameters()), None)
        info["param_dtype"] = _dtype_name(getattr(first, "dtype", None))
    if info["param_dtype"] is None:
        first = next(iter(model.parameters()), None)
        info["param_dtype"] = _dtype_name(getattr(first, "dtype", None))
    if optimizer is not None:
        info["optimizer"] = type(optimizer).__name__
    return info


def build(rank: int, local_rank: int, world_size: int, job: str, backend: str | None, device: str,
          framework: dict[str, Any]) -> RunInfo:
    import torch

    return RunInfo(
        rank=rank, local_rank=local_rank, world_size=world_size, host=socket.gethostname(), pid=os.getpid(),
        job=job, framework=framework["framework"], framework_version=framework["framework_version"],
        torch_version=torch.__version__, backend=backend, device=device, zero_stage=framework["zero_stage"],
        fsdp_strategy=framework["fsdp_strategy"], param_dtype=framework["param_dtype"],
        reduce_dtype=framework["reduce_dtype"], optimizer=framework["optimizer"], knobs=framework["knobs"],
    )
