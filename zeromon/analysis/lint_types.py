"""The value types DeepSpeed's config classes check, written down, and a check that reads them as
pydantic does (lax mode): what ``DeepSpeedZeroConfig(**block)`` and friends would refuse at start-up.

``STATIC_TYPES`` is DeepSpeed 0.19.8's, for machines without DeepSpeed (or with that release, which
then is not imported); ``zeromon.sources.configs.deepspeed_schema`` reads the same from the installed
release's pydantic models, and a test checks the two agree and that this check refuses exactly what
those models refuse. Pure: no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# Sections DeepSpeed builds a pydantic model from, as (key path of the block, key path of its fields).
CHECKED_SECTIONS = ("zero_optimization", "zero_optimization.offload_param", "zero_optimization.offload_optimizer",
                    "fp16", "bf16")


# Fields whose model reads its input with a validator of its own (null is its default): left unchecked.
UNCHECKED = frozenset({"zero_optimization.leaf_module"})


@dataclass(frozen=True, slots=True)
class FieldType:
    """One field: ``kind`` bool | int | float | finite (a float that is not a bool, NaN or infinite, as
    fp16.loss_scale's own validator wants) | enum | path | section; bounds as pydantic's ge/gt/le."""

    kind: str
    optional: bool = False  # null accepted
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()  # enum values
    no_bool: bool = False  # a validator of its own refuses bools, and text int() cannot read (fp16's scale knobs)

    def describe(self) -> str:
        what = {"bool": "true or false", "int": "an integer", "float": "a number", "finite": "a finite number",
                "path": "a path (a string)",
                "section": "an object {...}", "enum": " or ".join(repr(c) for c in self.choices)}[self.kind]
        bounds = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                  f"<= {self.le:g}" if self.le is not None else ""]
        text = " ".join([what, " and ".join(b for b in bounds if b)]).strip()
        return f"{text}, or null" if self.optional else text


_B, _I, _F = FieldType("bool"), FieldType("int"), FieldType("float")
_I_GE0 = FieldType("int", ge=0)
_DEVICE = FieldType("enum", choices=("none", "cpu", "nvme"))
_PATH = FieldType("path", optional=True)
_SHARE = FieldType("float", ge=0.0, le=1.0)
_I_STRICT = FieldType("int", no_bool=True)

# key path -> its type, for the fields whose values zeromon checks (DeepSpeed 0.19.8). `stage` is ZL021's.
STATIC_TYPES: dict[str, FieldType] = {
    **{f"zero_optimization.{k}": _B for k in (
        "contiguous_gradients", "reduce_scatter", "use_multi_rank_bucket_allreduce", "allgather_partitions",
        "compute_grad_norm", "load_from_fp32_weights", "elastic_checkpoint", "gather_16bit_weights_on_model_save",
        "stage3_gather_16bit_weights_on_model_save", "use_all_reduce_for_fetch_params",
        "stage3_use_all_reduce_for_fetch_params", "allgather_sequential", "stage3_allgather_sequential",
        "stage3_gather_fp16_weights_on_model_save", "ignore_unused_parameters", "legacy_stage1",
        "round_robin_gradients", "parameter_alignment", "zero_quantized_weights",
        "zero_quantized_nontrainable_weights", "zero_quantized_gradients", "memory_efficient_linear",
        "pipeline_loading_checkpoint", "override_module_apply", "log_trace_cache_warnings", "enable_sanity_checks",
        "save_muon_momentum_buffer_in_memory")},
    **{f"zero_optimization.{k}": FieldType("bool", optional=True) for k in (
        "overlap_comm", "cpu_offload_param", "cpu_offload_use_pin_memory", "cpu_offload")},
    "zero_optimization.reduce_bucket_size": FieldType("int", gt=0),
    **{f"zero_optimization.{k}": _I_GE0 for k in (
        "allgather_bucket_size", "sub_group_size", "prefetch_bucket_size", "stage3_prefetch_bucket_size",
        "param_persistence_threshold", "stage3_param_persistence_threshold", "model_persistence_threshold",
        "stage3_model_persistence_threshold", "max_live_parameters", "stage3_max_live_parameters",
        "max_reuse_distance", "stage3_max_reuse_distance", "zero_hpz_partition_size")},
    "zero_optimization.module_granularity_threshold": _I,
    "zero_optimization.stage3_module_granularity_threshold": _I,
    "zero_optimization.offload_param": FieldType("section", optional=True),
    "zero_optimization.offload_optimizer": FieldType("section", optional=True),
    "zero_optimization.zenflow": FieldType("section", optional=True),
    **{f"zero_optimization.offload_param.{k}": t for k, t in (
        ("device", _DEVICE), ("nvme_path", _PATH), ("buffer_count", _I_GE0), ("buffer_size", _I_GE0),
        ("max_in_cpu", _I_GE0), ("pin_memory", _B))},
    **{f"zero_optimization.offload_optimizer.{k}": t for k, t in (
        ("device", _DEVICE), ("nvme_path", _PATH), ("buffer_count", _I_GE0), ("pin_memory", _B),
        ("pipeline_read", _B), ("pipeline_write", _B), ("fast_init", _B), ("ratio", _SHARE),
        ("super_offload", _B), ("cpuadam_cores_perc", _SHARE))},
    **{f"fp16.{k}": t for k, t in (
        ("enabled", _B), ("auto_cast", _B), ("loss_scale", FieldType("finite", ge=0.0)), ("initial_scale_power", _I),
        ("loss_scale_window", _I_STRICT), ("hysteresis", _I), ("consecutive_hysteresis", _B),
        ("min_loss_scale", _I_STRICT),
        ("fp16_master_weights_and_grads", _B))},
    **{f"bf16.{k}": _B for k in ("enabled", "immediate_grad_update", "check_grad_overflow",
                                 "bf16_master_weights_and_grads", "bf16_optimizer_states")},
}

_TRUE_WORDS = {"1", "on", "t", "true", "y", "yes"}
_FALSE_WORDS = {"0", "off", "f", "false", "n", "no"}
_INT_TEXT = re.compile(r"^\s*[+-]?\d+(\.0*)?\s*$")


def _as_number(value: object, kind: str) -> float | int | None:
    """The number pydantic's lax mode reads ``value`` as for an int or float field; None if it refuses."""
    if isinstance(value, bool):
        return int(value)
    if kind == "int":
        if isinstance(value, int):
            return value
        if isinstance(value, float):  # pydantic's float-to-int stays within 64 bits
            return int(value) if math.isfinite(value) and value == int(value) and abs(value) < 2**63 else None
        if isinstance(value, str) and _INT_TEXT.match(value):
            return int(float(value)) if "." in value else int(value)
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # pydantic refuses an int too large for a float
            return None
    if isinstance(value, float):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def refusal(field: FieldType, value: object) -> str | None:
    """Why DeepSpeed's config model refuses ``value`` for ``field``; None when it accepts it."""
    if value is None:
        return None if field.optional else "null is not accepted"
    if field.kind == "section":
        return None if isinstance(value, Mapping) else "must be an object {...}"
    if field.kind == "bool":
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float) and value in (0, 1):
            return None
        if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
            return None
        return "must be true or false"
    if field.kind == "enum":
        return None if isinstance(value, str) and value in field.choices else f"must be {field.describe()}"
    if field.kind == "path":
        return None if isinstance(value, str) else "must be a path (a string)"
    if field.kind == "finite":  # float(v) in a validator of its own
        try:
            real = float(value) if not isinstance(value, bool) else math.nan  # type: ignore[arg-type]
        except (TypeError, ValueError, OverflowError):
            return f"must be {field.describe()}"
        if not math.isfinite(real):
            return f"must be {field.describe()}"
        return None if field.ge is None or real >= field.ge else f"must be {field.describe()}"
    if field.no_bool and (isinstance(value, bool) or (isinstance(value, str) and not _INT_TEXT.match(value))):
        return f"must be {field.describe()}"
    if field.no_bool and isinstance(value, str) and "." in value:
        return f"must be {field.describe()}"  # int("1.0") fails in its validator, before pydantic's coercion
    number = _as_number(value, field.kind)
    if number is None:
        return f"must be {field.describe()}"
    if isinstance(number, float) and math.isnan(number):
        return None if all(b is None for b in (field.ge, field.gt, field.le)) else f"must be {field.describe()}"
    if ((field.ge is not None and not number >= field.ge) or (field.gt is not None and not number > field.gt)
            or (field.le is not None and not number <= field.le)):
        return f"must be {field.describe()}"
    return None


def non_finite(value: object) -> bool:
    """NaN or an infinity (JSON's NaN, Infinity, or a number past a float's range such as 1e400)."""
    return isinstance(value, float) and not math.isfinite(value)
