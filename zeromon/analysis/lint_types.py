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

from zeromon.model.classes import frozen

# DeepSpeed 0.19.8's other pydantic config models, by the key path of the block each is built from: the
# monitors, compile, hybrid engine, comms logger, throughput timer and tensor parallelism. Like
# zero_optimization they forbid extra keys. activation_checkpointing, flops_profiler, aio, data_efficiency, ...
# are read by hand-written parsers, not pydantic models: nothing to mirror.
OTHER_MODEL_SECTIONS = ("tensorboard", "wandb", "csv_monitor", "comet", "compile", "hybrid_engine", "comms_logger",
                        "timers.throughput", "tensor_parallel")
# Sections DeepSpeed builds a pydantic model from, as (key path of the block, key path of its fields).
CHECKED_SECTIONS = ("zero_optimization", "zero_optimization.offload_param", "zero_optimization.offload_optimizer",
                    "fp16", "bf16", *OTHER_MODEL_SECTIONS, "tensor_parallel.tp", "tensor_parallel.tensor_parallel")


# Fields whose model reads its input with a validator of its own (null is its default): left unchecked.
UNCHECKED = frozenset({"zero_optimization.leaf_module"})


@frozen
class FieldType:
    """One field: ``kind`` bool | int | float | finite (a float that is not a bool, NaN or infinite, as
    fp16.loss_scale's own validator wants) | choice (one of ``choices``: a str Enum or a Literal) | str | list
    (any items, or with ``choices`` a list of them) | path | section | object (a Python object of
    ``python_type``, such as a torch.dtype, which no JSON value is); bounds as pydantic's ge/gt/le."""

    kind: str
    optional: bool = False  # null accepted
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] = ()  # the values of a choice, or of a list's items
    no_bool: bool = False  # a validator of its own refuses bools, and text int() cannot read (fp16's scale knobs)
    python_type: str = ""  # an object's class, as DeepSpeed's model names it

    def describe(self) -> str:
        one_of = " or ".join(repr(c) for c in self.choices)
        what = {"bool": "true or false", "int": "an integer", "float": "a number", "finite": "a finite number",
                "path": "a path (a string)", "str": "a string", "section": "an object {...}", "choice": one_of,
                "list": f"a list of {one_of}" if self.choices else "a list [...]",
                "object": f"a Python {self.python_type} object, which a JSON value cannot be"}[self.kind]
        bounds = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                  f"<= {self.le:g}" if self.le is not None else ""]
        text = " ".join([what, " and ".join(b for b in bounds if b)]).strip()
        return f"{text}, or null" if self.optional else text


_B, _I, _F = FieldType("bool"), FieldType("int"), FieldType("float")
_I_GE0 = FieldType("int", ge=0)
_DEVICE = FieldType("choice", choices=("none", "cpu", "nvme"))
_PATH = FieldType("path", optional=True)
_SHARE = FieldType("float", ge=0.0, le=1.0)
_I_STRICT = FieldType("int", no_bool=True)
_S, _S_OR_NULL = FieldType("str"), FieldType("str", optional=True)

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
    **{f"{m}.enabled": _B for m in ("tensorboard", "wandb", "csv_monitor", "comet")},
    **{f"{m}.{k}": _S for m in ("tensorboard", "csv_monitor") for k in ("output_path", "job_name")},
    "wandb.project": _S,
    **{f"wandb.{k}": _S_OR_NULL for k in ("group", "team")},
    "comet.samples_log_interval": _I,
    "comet.online": FieldType("bool", optional=True),
    # comet.mode is any string to DeepSpeed's model ("get", "create", "get_or_create" are Comet's).
    **{f"comet.{k}": _S_OR_NULL for k in ("project", "workspace", "api_key", "experiment_name", "experiment_key",
                                          "mode")},
    **{f"compile.{k}": _B for k in (
        "deepcompile", "autoep_non_moe", "free_activation", "offload_activation", "offload_activation_pin_memory",
        "offload_opt_states", "double_buffer", "symmetric_memory", "debug_log", "offload_parameters",
        "sync_before_reduce", "sync_after_reduce", "sync_before_allgather", "sync_after_allgather",
        "keep_int_input_tensors", "keep_all_input_tensors")},
    "compile.free_activation_threshold": _I,
    "compile.passes": FieldType("list", optional=True, choices=("z1", "z3", "autosp", "autotp")),
    **{f"hybrid_engine.{k}": _B for k in ("enabled", "release_inference_cache", "pin_parameters",
                                          "enable_cuda_graph")},
    "hybrid_engine.max_out_tokens": FieldType("int", gt=0),
    "hybrid_engine.inference_tp_size": _I,
    "hybrid_engine.tp_gather_partition_size": _I,
    **{f"comms_logger.{k}": _B for k in ("enabled", "prof_all", "verbose", "debug")},
    "comms_logger.prof_ops": FieldType("list"),  # a bare list: its items are not checked
    **{f"timers.throughput.{k}": _B for k in ("enabled", "synchronized")},
    # dtype is a torch.dtype (set from Python, by tp_model_init); tp.mpu and tp.tp_group, any object, unchecked.
    "tensor_parallel.dtype": FieldType("object", python_type="torch.dtype"),
    **{f"tensor_parallel.{k}": _B for k in ("tp_overlap_comm", "keep_module_on_host", "replace_with_kernel_inject",
                                            "kernel_inject")},
    "tensor_parallel.autotp_size": _I,
    "tensor_parallel.vocab_parallel_lm_head": FieldType("bool", optional=True),
    "tensor_parallel.vocab_parallel_ce_backend": FieldType("choice", choices=("torch", "liger")),
    "tensor_parallel.injection_policy_tuple": FieldType("list", optional=True),  # a tuple, which a list becomes
    "tensor_parallel.partition_config": FieldType("section", optional=True),  # Dict[str, Any]
    "tensor_parallel.preset_model": _S_OR_NULL,
    # The tp block under its alias and its field name (populate_by_name: DeepSpeed reads both).
    **{f"tensor_parallel.{tp}": FieldType("section") for tp in ("tp", "tensor_parallel")},
    **{f"tensor_parallel.{tp}.{k}": _I for tp in ("tp", "tensor_parallel") for k in ("tp_size", "tp_grain_size")},
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
    if field.kind == "choice":  # exact: "Torch" is not "torch"
        return None if isinstance(value, str) and value in field.choices else f"must be {field.describe()}"
    if field.kind in ("path", "str"):
        return None if isinstance(value, str) else f"must be {field.describe()}"  # 5 is no string to pydantic
    if field.kind == "list":
        if not isinstance(value, list | tuple):
            return f"must be {field.describe()}"
        wrong = next((i for i, item in enumerate(value) if field.choices and not (
            isinstance(item, str) and item in field.choices)), None)
        return None if wrong is None else f"item {wrong} must be {' or '.join(map(repr, field.choices))}"
    if field.kind == "object":
        return f"must be {field.describe()}"
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


@frozen
class CrossFieldRefusal:
    """A combination of values one of DeepSpeed's config classes refuses in a validator of its own."""

    path: str  # the key the finding names
    message: str
    fix: str


def _number(value: object, kind: str, default: float) -> float | None:
    """The value as DeepSpeed's model reads it for the cross-field rules (None: refused, ZL031 says so)."""
    if value is None:
        return default
    number = _as_number(value, kind)
    return None if number is None else float(number)


def _flag(value: object, default: bool) -> bool | None:
    if value is None:
        return default
    if refusal(FieldType("bool"), value) is not None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in _TRUE_WORDS
    return bool(value)


def cross_field_refusals(config: Mapping[str, object]) -> list[CrossFieldRefusal]:
    """The combinations DeepSpeed's config classes refuse at start-up (DeepSpeed 0.19.8's validators):
    DeepSpeedZeroConfig's offload_ratio_check (a partial optimizer offload, ``ratio`` < 1, needs ZeRO-3) and
    compute_grad_norm_valid (``compute_grad_norm: false`` only at stages 1 and 2), and DeepSpeedFP16Config's
    _validate_dynamic_loss_scale_params (with dynamic loss scaling, ``loss_scale_window`` and
    ``min_loss_scale`` must be > 0: the window is a modulus, the floor a divisor's bound). Values of a wrong
    type are left to ZL031; "auto" is left to ZL011."""
    out: list[CrossFieldRefusal] = []
    zero = config.get("zero_optimization")
    if isinstance(zero, Mapping):
        stage = _number(zero.get("stage"), "int", 0)
        offload = zero.get("offload_optimizer")
        ratio = _number(offload.get("ratio"), "float", 1.0) if isinstance(offload, Mapping) else 1.0
        if stage is not None and stage != 3 and ratio is not None and ratio < 1.0:
            out.append(CrossFieldRefusal(
                "zero_optimization.offload_optimizer.ratio",
                f"zero_optimization.offload_optimizer.ratio is {ratio:g} at ZeRO stage {stage:g}: a partial "
                "optimizer offload is ZeRO-3's, and DeepSpeed's config class stops at start-up (\"Partial "
                "offloading only supported for ZeRO Stage 3\")",
                "set ratio to 1 (the whole optimizer state offloaded), or use stage 3"))
        norm = _flag(zero.get("compute_grad_norm"), True)
        if norm is False and stage is not None and stage not in (1, 2):
            out.append(CrossFieldRefusal(
                "zero_optimization.compute_grad_norm",
                f"zero_optimization.compute_grad_norm is false at ZeRO stage {stage:g}: DeepSpeed supports "
                "skipping the gradient norm only with ZeRO stage 1 or 2, and stops at start-up",
                "remove compute_grad_norm (true is the default), or use stage 1 or 2"))
    fp16 = config.get("fp16")
    if isinstance(fp16, Mapping) and _flag(fp16.get("enabled"), False) and _number(
            fp16.get("loss_scale"), "float", 0.0) == 0.0:
        for key, what in (("loss_scale_window", "the window is a modulus: 0 divides by zero"),
                          ("min_loss_scale", "the scale's floor collapses")):
            value = _number(fp16.get(key), "int", 1.0)
            if value is not None and value <= 0 and not isinstance(fp16.get(key), bool):
                out.append(CrossFieldRefusal(
                    f"fp16.{key}",
                    f"fp16.{key} is {value:g} with dynamic loss scaling (loss_scale 0): it must be > 0 "
                    f"({what}), and DeepSpeed's config class stops at start-up",
                    f"set {key} to a positive integer (DeepSpeed's default is "
                    f"{1000 if key == 'loss_scale_window' else 1}), or drop it"))
    return out
