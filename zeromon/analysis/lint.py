"""Lint a DeepSpeed config (or accelerate's DeepSpeed block) for the pitfalls users hit.

Pure: a parsed config dict and options in, ``LintReport`` out; no I/O. What DeepSpeed itself accepts
comes from a ``ConfigSchema``: the sources layer builds one from the installed DeepSpeed's own config
classes (``zeromon.sources.configs.deepspeed_schema``); ``STATIC_SCHEMA`` below is the same facts
written down from DeepSpeed 0.19.8, for machines without DeepSpeed.

What a finding's severity means: ``error``, DeepSpeed or accelerate refuses the config or the run
does something other than asked (exit code 1 from ``zeromon lint``); ``warning``, a known pitfall
that costs speed, memory or a usable checkpoint; ``info``, worth knowing, nothing wrong by itself.

Facts the rules rest on (DeepSpeed 0.19.8 unless said otherwise):
- ``zero_optimization``, its ``offload_*`` blocks, ``fp16``, ``bf16`` and the other model sections
  (``lint_types.OTHER_MODEL_SECTIONS``: the monitors, compile, hybrid_engine, comms_logger,
  timers.throughput, tensor_parallel and its tp block) are pydantic models with ``extra="forbid"``: an
  unknown key there stops ``deepspeed.initialize``. Unknown top-level keys, and keys under ``timers`` other
  than ``throughput``, are silently ignored. A value ``"auto"`` inside those models is dropped and the
  default used (``DeepSpeedConfigModel.__init__``); at the top level it reaches the batch arithmetic and fails.
- ``overlap_comm`` defaults to true for stage 3 and false for stages 1 and 2.
- ``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size``
  is asserted at start-up, with world_size the data-parallel size.
- ZeRO-1/2's optimizer (``stage_1_and_2.py``) offloads for any ``offload_optimizer.device`` but none,
  always to CPU memory; only ZeRO-3 swaps to NVMe, and only there is ``nvme_path`` read.
- accelerate (1.x) turns its ``deepspeed_config`` block into a DeepSpeed config from 15 keys only
  (``ACCELERATE_DEEPSPEED_KEYS``) and ignores the rest; with ``deepspeed_config_file`` it refuses to
  start if the block also sets any key the file owns (``ACCELERATE_FILE_OWNED_KEYS``).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import field
from typing import Any

from zeromon.analysis.lint_schema import (
    ACCELERATE_DEEPSPEED_KEYS,
    ACCELERATE_TO_DEEPSPEED,
    INLINE_HINT,
    RULES,
    SEVERITIES,
    STATIC_SCHEMA,
    ConfigSchema,
)
from zeromon.analysis.lint_types import OTHER_MODEL_SECTIONS, cross_field_refusals, non_finite, refusal
from zeromon.model.classes import frozen, mutable
from zeromon.model.units import format_bytes


@frozen
class LintOptions:
    world_size: int | None = None  # data-parallel ranks; None: unknown (the accelerate file may give it)
    world_size_from: str = ""  # where world_size came from, for messages ("--gpus", ...)
    nodes: int | None = None
    params: float | None = None  # model parameters, for the ZeRO-2-fits check
    gpu_memory_bytes: int | None = None
    hf: bool = False  # the config is filled by the Hugging Face Trainer / accelerate ("auto" is resolved)
    schema: ConfigSchema = STATIC_SCHEMA


@frozen
class LintFinding:
    id: str
    severity: str  # error | warning | info
    key: str  # dotted key path in the file that holds it
    message: str
    fix: str
    file: str = "deepspeed"  # which file holds the key: "deepspeed", "accelerate" or "lightning"

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "severity": self.severity, "key": self.key, "message": self.message,
                "fix": self.fix}


@frozen
class LintReport:
    findings: tuple[LintFinding, ...]
    stage: int | None  # the ZeRO stage in effect
    world_size: int | None
    world_size_from: str
    schema_origin: str
    hf: bool
    setup: str = ""  # an FSDP config's setup as the framework resolves it ("FSDP1, FULL_SHARD"); "" for DeepSpeed

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f.severity == severity)

    @property
    def has_errors(self) -> bool:
        return any(f.severity == "error" for f in self.findings)


# ---------------------------------------------------------------------------------------------- helpers


def as_number(value: Any) -> float | None:
    """An int or float as written, finite (bools are not numbers here); None for anything else (NaN,
    Infinity and numbers past a float's range are ZL030's)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int of 400 digits
        return None
    return number if math.isfinite(number) else None


def as_count(value: Any) -> int | None:
    """A count as YAML or JSON may write it: 4, 4.0, "4"; None when it is not one."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    number = as_number(value)
    return int(number) if number is not None and number == int(number) else None


def truthy(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true")


def _enabled(config: Mapping[str, Any], section: str) -> bool:
    block = config.get(section)
    return isinstance(block, Mapping) and truthy(block.get("enabled"))


def _elements(n: float) -> str:
    return f"{n:.3g}"


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    match = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
    return match[0] if match else None


@mutable
class Lint:
    """One lint pass: the effective DeepSpeed config, how its key paths map to the file, the findings."""

    config: Mapping[str, Any]
    options: LintOptions
    key_map: Mapping[str, str] = field(default_factory=dict)  # DeepSpeed path -> accelerate path (inline)
    inline: bool = False  # the DeepSpeed config was built by accelerate from its own keys
    findings: list[LintFinding] = field(default_factory=list)

    def add(self, rule: str, severity: str, key: str, message: str, fix: str, file: str | None = None) -> None:
        assert rule in RULES and severity in SEVERITIES, (rule, severity)
        where = file or "deepspeed"
        if file is None and self.inline:
            where = "accelerate"
            mapped = self.key_map.get(key)
            if mapped is not None:
                key = mapped
            else:  # a DeepSpeed key accelerate writes no value for: only a DeepSpeed file could change it
                message = f"{message} (in the DeepSpeed config accelerate builds from this file)"
                fix = f"{fix}; {INLINE_HINT}"
        self.findings.append(LintFinding(rule, severity, key, message, fix, where))

    @property
    def zero(self) -> Mapping[str, Any]:
        block = self.config.get("zero_optimization")
        return block if isinstance(block, Mapping) else {}

    def zero_get(self, *names: str) -> tuple[str, Any]:
        """The first of the names (a field and its stage3_ alias) that is set: (key path, value)."""
        for name in names:
            if name in self.zero:
                return f"zero_optimization.{name}", self.zero[name]
        return f"zero_optimization.{names[0]}", None

    @property
    def stage(self) -> int | None:
        value = self.zero.get("stage", 0)
        stage = as_count(value)
        return stage if stage is not None and 0 <= stage <= 3 else None

    def is_auto(self, value: Any) -> bool:
        return isinstance(value, str) and value == "auto"

    def offloads(self) -> list[tuple[str, Mapping[str, Any], str]]:
        """(key path, block, device) for each offload block with a device other than none."""
        found = []
        for name in ("offload_optimizer", "offload_param"):
            block = self.zero.get(name)
            if isinstance(block, Mapping):
                device = str(block.get("device", "none")).lower()
                if device in ("cpu", "nvme"):
                    found.append((f"zero_optimization.{name}", block, device))
        return found

    @property
    def element_bytes(self) -> int:
        """Bytes per element of the 16-bit (or fp32) copies ZeRO communicates and gathers."""
        return 2 if _enabled(self.config, "fp16") or _enabled(self.config, "bf16") \
            or _enabled(self.config, "bfloat16") else 4


# ------------------------------------------------------------------------------------------------ rules


def _check_keys(lint: Lint, duplicate_keys: Iterable[str]) -> None:
    schema = lint.options.schema
    for path in duplicate_keys:
        lint.add("ZL023", "error", path, f"{path} appears more than once in the same object; DeepSpeed loads "
                 "configs with a duplicate-key check and refuses the file (json.load would silently keep "
                 "the last one)", "keep one of them")

    def walk(block: Mapping[str, Any], section: str) -> None:
        known = schema.sections.get(section)
        for key, value in block.items():
            path = f"{section}.{key}" if section else str(key)
            if path in schema.removed:
                lint.add("ZL013", "error", path, f"{path}: {schema.removed[path].rstrip(' .')}; DeepSpeed refuses "
                         "configs that still set it", f"remove {path}")
                continue
            if path in schema.deprecated:
                lint.add("ZL014", "info", path, f"{path} is deprecated; DeepSpeed translates it and logs a "
                         "warning", f"use {schema.deprecated[path]}")
            if known is not None and key not in known:
                _unknown_key(lint, section, str(key), path)
                continue
            sub = f"{section}.{key}" if section else str(key)
            if sub == "bfloat16":
                sub = "bf16"
            if isinstance(value, Mapping) and sub in schema.sections:
                walk(value, sub)

    walk(lint.config, "")


def _unknown_key(lint: Lint, section: str, key: str, path: str) -> None:
    schema = lint.options.schema
    known = schema.sections[section]
    elsewhere = sorted(f"{s}.{key}" if s else key for s, keys in schema.sections.items()
                       if s != section and key in keys)
    nearest = nearest_key(key, known)
    if elsewhere:  # "enabled" is in a dozen sections: name three
        more = f" or {len(elsewhere) - 3} other sections" if len(elsewhere) > 3 else ""
        hint = f"{key} belongs in {' or '.join(elsewhere[:3])}{more}"
        fix = f"move it to {elsewhere[0]}"
    elif nearest:
        hint = f"did you mean {section + '.' if section else ''}{nearest}?"
        fix = f"rename it to {nearest}"
    elif key in ACCELERATE_DEEPSPEED_KEYS and key in ACCELERATE_TO_DEEPSPEED:
        hint = f"{key} is an accelerate key; in a DeepSpeed JSON it is {ACCELERATE_TO_DEEPSPEED[key]}"
        fix = f"use {ACCELERATE_TO_DEEPSPEED[key]}"
    else:
        hint = "no known key is close"
        fix = f"remove it, or check the spelling against DeepSpeed's config docs ({schema.origin})"
    if schema.strict(section):
        lint.add("ZL012", "error", path, f"unknown key {path}: {hint}; DeepSpeed validates {section} strictly "
                 "and stops at start-up (\"Extra inputs are not permitted\")", fix)
    else:
        where = f"keys in {section} (it reads {', '.join(sorted(known))})" if section else "top-level keys"
        lint.add("ZL012", "warning", path, f"unknown key {path}: {hint}; DeepSpeed silently ignores unknown "
                 f"{where}, so this setting has no effect", fix)


def _check_values(lint: Lint) -> None:
    """ZL030: NaN and infinities anywhere; ZL031: the values DeepSpeed's config models refuse (their types
    and bounds, read as pydantic reads them), and the blocks DeepSpeed reads as objects; ZL032: the
    combinations their validators refuse."""
    for path, number in non_finite_values(lint.config):
        add_non_finite(lint, path, number)
    for name in ("zero_optimization", "fp16", "bf16", *OTHER_MODEL_SECTIONS):
        accepted = "an object {...}" + (" (or true/false, the legacy form)" if name == "zero_optimization" else "")
        outer, _, key = name.rpartition(".")
        holder = _block(lint.config, outer)
        block = holder.get(key) if holder is not None else None
        if holder is not None and key in holder and not isinstance(block, Mapping) and not (
                name == "zero_optimization" and isinstance(block, bool)) and not (name == "bf16" and block is None):
            lint.add("ZL031", "error", name, f"{name} is {_shown(block)}; DeepSpeed reads it as {accepted} and "
                     "stops at start-up", f"write {name} as {accepted}")
    for path, field_type in lint.options.schema.types.items():
        section, _, key = path.rpartition(".")
        block = _block(lint.config, section)
        if block is None or key not in block:
            continue
        value = block[key]
        if lint.is_auto(value):
            continue  # ZL011's
        reason = refusal(field_type, value)
        if reason is not None:
            fix = f"remove {key}" if field_type.kind == "object" else f"set {key} to {field_type.describe()}"
            lint.add("ZL031", "error", path, f"{path} is {_shown(value)}: {reason}; DeepSpeed's config class "
                     "refuses it and stops at start-up", fix)
    for cross in cross_field_refusals(lint.config):
        if not lint.is_auto(_value_at(lint.config, cross.path)):
            lint.add("ZL032", "error", cross.path, cross.message, cross.fix)


def _value_at(config: Mapping[str, Any], path: str) -> Any:
    section, _, key = path.rpartition(".")
    block = _block(config, section)
    return block.get(key) if block is not None else None


def non_finite_values(value: Any, path: str = "") -> Iterable[tuple[str, float]]:
    """(key path, value) of every NaN and infinity in a parsed config."""
    if isinstance(value, Mapping):
        for key, sub in value.items():
            yield from non_finite_values(sub, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from non_finite_values(sub, f"{path}[{i}]")
    elif non_finite(value):
        yield path, value


def add_non_finite(lint: Lint, path: str, value: float, file: str | None = None) -> None:
    lint.add("ZL030", "error", path, f"{path} is {_shown(value)} (NaN, Infinity, or a number too large for a float, such "
             "as 1e400): no setting means that, and DeepSpeed either refuses it or computes with it",
             "give a finite number", file)


def _block(config: Mapping[str, Any], section: str) -> Mapping[str, Any] | None:
    """The object at a dotted section path ("" is the top level), None when it is not an object."""
    block: Any = config
    for part in section.split(".") if section else ():
        block = block.get(part) if isinstance(block, Mapping) else None
    return block if isinstance(block, Mapping) else None


def _shown(value: Any) -> str:
    """A value as a message quotes it: JSON's spelling, cut short."""
    import json

    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_stage(lint: Lint) -> None:
    if "stage" in lint.zero and lint.stage is None and not lint.is_auto(lint.zero["stage"]):
        lint.add("ZL021", "error", "zero_optimization.stage",
                 f"zero_optimization.stage is {lint.zero['stage']!r}; DeepSpeed accepts 0, 1, 2 or 3",
                 "set stage to 0, 1, 2 or 3")
    op = lint.config.get("gradient_allreduce_op")
    if lint.stage == 3 and isinstance(op, str) and op.lower() == "sum":
        lint.add("ZL022", "error", "gradient_allreduce_op", "gradient_allreduce_op \"sum\" is not supported with "
                 "ZeRO-3; DeepSpeed raises at start-up", "remove gradient_allreduce_op (default \"mean\")")


def _check_zero3_save(lint: Lint) -> None:
    if lint.stage != 3:
        return
    _, value = lint.zero_get("stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                             "stage3_gather_fp16_weights_on_model_save")
    if truthy(value) or (lint.options.hf and lint.is_auto(value)):
        return
    state = "false" if value is not None else "not set (default false)"
    lint.add("ZL001", "warning", "zero_optimization.stage3_gather_16bit_weights_on_model_save",
             f"ZeRO-3 partitions the weights across ranks and stage3_gather_16bit_weights_on_model_save is {state}: "
             "save_16bit_model() and the Hugging Face Trainer's save_model() then write no usable weights "
             "(each rank holds only its shard), and the model must be rebuilt with zero_to_fp32.py from a "
             "full checkpoint",
             "set \"stage3_gather_16bit_weights_on_model_save\": true in zero_optimization "
             "(accelerate: zero3_save_16bit_model: true)")


def _check_batch(lint: Lint) -> None:
    cfg, hf = lint.config, lint.options.hf
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    values: dict[str, int | None] = {}
    invalid = False
    for name in names:  # every bad value at once, not one per run
        raw = cfg.get(name)
        if raw is None or lint.is_auto(raw):
            values[name] = None
            continue
        count = as_count(raw) if not isinstance(raw, str) else None
        if count is None or count < 1:
            lint.add("ZL028", "error", name, f"{name} is {raw!r}; DeepSpeed needs a positive integer",
                     f"set {name} to an integer >= 1")
            invalid = True
        values[name] = count
    if invalid:
        return  # the arithmetic below needs all of them
    tb, mb, gas = (values[n] for n in names)
    if tb is None and mb is None:
        if not hf and not any(lint.is_auto(cfg.get(n)) for n in names):
            lint.add("ZL004", "error", "train_micro_batch_size_per_gpu", "neither train_batch_size nor "
                     "train_micro_batch_size_per_gpu is set; DeepSpeed stops at start-up (\"Either "
                     "train_batch_size or train_micro_batch_size_per_gpu needs to be provided\")",
                     "set train_micro_batch_size_per_gpu (and gradient_accumulation_steps), or run with --hf "
                     "if the Hugging Face Trainer or accelerate fills them")
        return
    world, source = lint.options.world_size, lint.options.world_size_from
    if tb is None or (world is None and mb is None and gas is None):
        return  # DeepSpeed derives what is missing; nothing to check against
    per_rank = (mb or 1) * (gas or 1)  # what DeepSpeed assumes for the one it derives is checked below
    if world is not None:
        if mb is not None and gas is not None:
            if tb != mb * gas * world:
                suggestion = f"set train_batch_size to {mb * gas * world}"
                if tb % (mb * world) == 0:
                    suggestion += f", or gradient_accumulation_steps to {tb // (mb * world)}"
                lint.add("ZL002", "error", "train_batch_size",
                         f"train_batch_size {tb} != train_micro_batch_size_per_gpu {mb} x "
                         f"gradient_accumulation_steps {gas} x world size {world} ({source}) = {mb * gas * world}; "
                         "DeepSpeed asserts this at start-up (world size = data-parallel ranks)", suggestion)
        elif tb % (per_rank * world):
            derived = "gradient_accumulation_steps" if mb is not None else "train_micro_batch_size_per_gpu"
            divisor = _product(_batch_terms(values, names[1:]) + [(f"world size {world} ({source})", world)])
            lint.add("ZL002", "error", "train_batch_size",
                     f"train_batch_size {tb} is not divisible by {divisor}; DeepSpeed derives {derived} by integer "
                     f"division ({tb} // {per_rank * world} = {tb // (per_rank * world)}) and then fails its batch "
                     "assertion", f"make train_batch_size a multiple of {per_rank * world}, or set {derived} "
                     "explicitly")
        return
    terms = _batch_terms(values, names[1:])
    given = _product(terms)
    if tb % per_rank:
        lint.add("ZL003", "error", "train_batch_size",
                 f"train_batch_size {tb} is not a multiple of {given}: no world size satisfies "
                 "train_batch_size = micro batch x accumulation x world size, and DeepSpeed stops at start-up",
                 "set train_batch_size to micro batch x gradient_accumulation_steps x the number of data-parallel "
                 "ranks, or drop it and let DeepSpeed derive it")
    elif mb is not None and gas is not None:
        lint.add("ZL003", "info", "train_batch_size",
                 f"train_batch_size {tb} = {' x '.join(t for t, _ in terms)} x world size {tb // per_rank}: this "
                 f"config runs only on "
                 f"{tb // per_rank} data-parallel ranks (world size not given)",
                 "give --world-size or --gpus to check it against the cluster, or drop train_batch_size so that "
                 "DeepSpeed derives it for any world size")
    else:
        missing = "gradient_accumulation_steps" if mb is not None else "train_micro_batch_size_per_gpu"
        lint.add("ZL003", "info", "train_batch_size",
                 f"train_batch_size {tb} / {given} = {tb // per_rank} = world size x {missing}: DeepSpeed derives "
                 f"{missing} from the world size, which must divide {tb // per_rank}",
                 f"give --world-size or --gpus to check it, or set {missing} explicitly")


def _batch_terms(values: dict[str, int | None], names: tuple[str, ...]) -> list[tuple[str, int]]:
    """('train_micro_batch_size_per_gpu 4', 4), ... for the batch values the config sets."""
    return [(f"{name} {value}", value) for name in names if (value := values[name]) is not None]


def _product(terms: list[tuple[str, int]]) -> str:
    """'a 4 x b 2 = 8', or just 'a 4' for one term: the arithmetic as a user checks it."""
    text = " x ".join(label for label, _ in terms)
    if len(terms) < 2:
        return text
    total = 1
    for _, value in terms:
        total *= value
    return f"{text} = {total}"


def _check_precision(lint: Lint) -> None:
    fp16, bf16 = _enabled(lint.config, "fp16"), _enabled(lint.config, "bf16") or _enabled(lint.config, "bfloat16")
    if fp16 and bf16:
        lint.add("ZL007", "error", "bf16.enabled", "fp16 and bf16 are both enabled; DeepSpeed asserts \"bfloat16 "
                 "and fp16 modes cannot be simultaneously enabled\"", "enable one: bf16 on GPUs that support it "
                 "(NVIDIA Ampere/A100 and newer), else fp16")
        return
    if not fp16:
        return
    if lint.stage == 3:
        lint.add("ZL006", "warning", "fp16.enabled",
                 "fp16 with ZeRO-3: fp16's 5 exponent bits overflow and underflow where bf16's 8 do not; "
                 "dynamic loss scaling skips steps and the partitioned fp16 weights lose precision",
                 "use bf16 (\"bf16\": {\"enabled\": true}, fp16 off) on GPUs that support it (NVIDIA Ampere/A100, "
                 "Hopper/H100 and newer; not V100 or T4); without bf16 keep dynamic loss scaling "
                 "(loss_scale 0, loss_scale_window 1000, initial_scale_power 16) and gradient clipping")
    block = lint.config.get("fp16")
    scale = as_number(block.get("loss_scale")) if isinstance(block, Mapping) else None
    if scale is not None and scale > 0:
        lint.add("ZL019", "info", "fp16.loss_scale",
                 f"fp16 with a static loss scale ({scale:g}): the scale never adapts, so gradients that overflow "
                 "at it are lost on every such step, and small ones underflow to zero",
                 "set loss_scale to 0 (dynamic loss scaling) unless a fixed scale is known to work")
    clip = lint.config.get("gradient_clipping")
    if clip is None or (as_number(clip) == 0):
        lint.add("ZL019", "info", "gradient_clipping",
                 "fp16 without gradient clipping: a spike that survives loss scaling goes straight into the "
                 "weights (clipping bounds the update one step can make)",
                 "set \"gradient_clipping\": 1.0")


def _check_overlap(lint: Lint) -> None:
    stage = lint.stage
    if not stage:
        return
    value = lint.zero.get("overlap_comm")
    default = lint.options.schema.overlap_comm_default[stage]
    if value is False or (isinstance(value, str) and value.lower() == "false"):
        state = "off"
    elif value is None or lint.is_auto(value):
        if default:
            return
        state = f"not set, and DeepSpeed's default for stage {stage} is false (true only for stage 3)"
    else:
        return
    cost = (" (it costs memory: about 4.5 x (reduce_bucket_size + allgather_bucket_size) 16-bit elements of "
            "buffers at stages 1-2)" if stage < 3 else "")
    lint.add("ZL008", "warning", "zero_optimization.overlap_comm",
             f"overlap_comm is {state}: gradient reduction waits for the backward pass instead of running "
             "beside it, so the communication is exposed (DeepSpeed's config reference: overlap_comm "
             "overlaps the reduction of the gradients with the backward computation)",
             f"set \"overlap_comm\": true{cost}")


def _check_offload(lint: Lint) -> None:
    schema = lint.options.schema
    for path, block, device in lint.offloads():
        pin = block.get("pin_memory")
        if pin is False or (pin is None and not schema.pin_memory_default):
            state = "false" if pin is False else f"not set (default false in {schema.origin})"
            lint.add("ZL009", "warning", f"{path}.pin_memory",
                     f"{path} moves state to {device} with pin_memory {state}: transfers from pageable host memory "
                     "are staged, synchronous and slower, and cannot overlap compute",
                     "set \"pin_memory\": true (turn it off only where memlock limits, ulimit -l, forbid it)")
        elif pin is None:
            lint.add("ZL009", "info", f"{path}.pin_memory",
                     f"{path}.pin_memory is not set: {schema.origin} defaults it to true, older DeepSpeed releases "
                     "to false (slow pageable transfers)", "set \"pin_memory\": true explicitly")
        nvme_path = block.get("nvme_path")
        if device != "nvme" or lint.stage in (0, 1, 2):
            continue  # below ZeRO-3 nothing swaps to NVMe (ZL016, ZL029), so nvme_path is not read
        if nvme_path in (None, ""):
            lint.add("ZL010", "error", f"{path}.nvme_path", f"{path} offloads to nvme without nvme_path: DeepSpeed "
                     "has no folder to swap to and fails when it builds the swapper (os.path.join(None, ...))",
                     "set \"nvme_path\" to a folder on a local NVMe drive")
        elif str(nvme_path).lower() == "none":
            lint.add("ZL010", "error", f"{path}.nvme_path", f"{path} offloads to nvme with nvme_path 'none' (what "
                     "accelerate passes when offload_*_nvme_path is not set): DeepSpeed swaps into a folder named "
                     "none/ under the launch directory, on whatever disk that is",
                     "set the nvme path to a folder on a local NVMe drive")


def _check_auto(lint: Lint) -> None:
    if lint.options.hf:
        return
    # DeepSpeedConfigModel drops "auto" (in nested models too); a hand-read value keeps it
    lenient = ("zero_optimization", "fp16", "bf16", "bfloat16", *OTHER_MODEL_SECTIONS)

    def walk(block: Mapping[str, Any], prefix: str) -> None:
        for key, value in block.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, Mapping):
                walk(value, path)
            elif lint.is_auto(value):
                why = ("only the Hugging Face Trainer and accelerate replace \"auto\"; deepspeed.initialize does "
                       "not")
                if any(path.startswith(f"{section}.") for section in lenient):
                    lint.add("ZL011", "warning", path, f"{path} is \"auto\": {why}, and DeepSpeed drops it here and "
                             "silently uses its own default", "give a value, or run zeromon lint --hf if the "
                             "Trainer or accelerate reads this file")
                else:
                    lint.add("ZL011", "error", path, f"{path} is \"auto\": {why}; DeepSpeed passes the string on "
                             "and fails at start-up", "give a value, or run zeromon lint --hf if the Trainer or "
                             "accelerate reads this file")

    walk(lint.config, "")


def _check_stage_relevance(lint: Lint) -> None:
    stage = lint.stage
    if stage is None or stage == 3:
        return
    if "offload_param" in lint.zero and any(p.endswith("offload_param") for p, _, _ in lint.offloads()):
        lint.add("ZL016", "warning", "zero_optimization.offload_param",
                 f"offload_param works only with ZeRO-3; at stage {stage} the parameters stay on the GPU",
                 "use stage 3 to offload parameters, or remove offload_param")
    if stage == 0 and any(p.endswith("offload_optimizer") for p, _, _ in lint.offloads()):
        lint.add("ZL016", "warning", "zero_optimization.offload_optimizer",
                 "offload_optimizer needs ZeRO stage 1, 2 or 3; at stage 0 nothing is offloaded",
                 "set zero_optimization.stage to 1 or 2")
    devices = {path: device for path, _, device in lint.offloads()}
    if stage in (1, 2) and devices.get("zero_optimization.offload_optimizer") == "nvme":
        # deepspeed/runtime/zero/stage_1_and_2.py: cpu_offload = device != none; only ZeRO-3 has an NVMe swapper.
        lint.add("ZL029", "warning", "zero_optimization.offload_optimizer.device",
                 f"offload_optimizer.device is nvme at stage {stage}: DeepSpeed's ZeRO-1/2 optimizer offloads to CPU "
                 "memory instead (NVMe optimizer offload is ZeRO-3's, ZeRO-Infinity), so the optimizer state "
                 "takes host RAM and nvme_path is not used",
                 "set \"device\": \"cpu\" and size host memory for it (zeromon plan), or use stage 3 for NVMe")
    stage3 = sorted(k for k in lint.zero if str(k).startswith("stage3_") and k not in (
        "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"))
    if stage3:
        lint.add("ZL016", "info", f"zero_optimization.{stage3[0]}",
                 f"{', '.join(stage3)} only apply to ZeRO-3; at stage {stage} they do nothing",
                 "remove them, or keep them for a later switch to stage 3")


# Below this many elements a bucket makes collectives latency-bound: NCCL needs messages of tens of MB
# to approach bus bandwidth, and DeepSpeed's default is 5e8 elements.
TINY_BUCKET_ELEMENTS = 1e6
# Share of GPU memory above which communication buffers or ZeRO-3's live parameters are a likely OOM.
BUCKET_MEMORY_SHARE = 0.25
LIVE_PARAMS_MEMORY_SHARE = 0.40
PREFETCH_MEMORY_SHARE = 0.10


def _check_buckets(lint: Lint) -> None:
    stage = lint.stage
    if not stage:
        return
    names = ("reduce_bucket_size", "allgather_bucket_size") if stage < 3 else ("reduce_bucket_size",)
    sizes: dict[str, float] = {}
    for name in names:
        value = as_number(lint.zero.get(name))
        if value is None:
            continue
        sizes[name] = value
        if 0 < value < TINY_BUCKET_ELEMENTS:
            lint.add("ZL017", "warning", f"zero_optimization.{name}",
                     f"{name} is {_elements(value)} elements: many small collectives, each paying NCCL's latency "
                     "instead of moving data at bandwidth", "start from DeepSpeed's default 5e8 and tune")
    memory = lint.options.gpu_memory_bytes
    if memory is None or stage >= 3:
        return
    overlap = truthy(lint.zero.get("overlap_comm")) or (
        lint.zero.get("overlap_comm") is None and lint.options.schema.overlap_comm_default[stage])
    total = sum(sizes.get(n, 5e8) for n in names)  # 5e8: DeepSpeed's default for an unset bucket
    footprint = total * lint.element_bytes * (4.5 if overlap else 1)
    if footprint > BUCKET_MEMORY_SHARE * memory:
        key = max(names, key=lambda n: sizes.get(n, 5e8))
        lint.add("ZL017", "warning", f"zero_optimization.{key}",
                 f"communication buckets take about {format_bytes(footprint)} of {format_bytes(memory)} per GPU "
                 f"((reduce + allgather = {_elements(total)} elements) x {lint.element_bytes} bytes"
                 f"{' x 4.5 with overlap_comm' if overlap else ''}), more than "
                 f"{BUCKET_MEMORY_SHARE:.0%}", "lower reduce_bucket_size and allgather_bucket_size (e.g. 2e8)")


def _check_live_parameters(lint: Lint) -> None:
    memory = lint.options.gpu_memory_bytes
    if lint.stage != 3 or memory is None:
        return
    nbytes = lint.element_bytes
    for names, default, share in ((("stage3_max_live_parameters", "max_live_parameters"), 1e9,
                                   LIVE_PARAMS_MEMORY_SHARE),
                                  (("stage3_prefetch_bucket_size", "prefetch_bucket_size"), 5e7,
                                   PREFETCH_MEMORY_SHARE)):
        key, raw = lint.zero_get(*names)
        value = as_number(raw)
        if value is None:
            value = default
        if value * nbytes > share * memory:
            what = "gathered parameters live at once" if "live" in key else "parameters prefetched ahead of use"
            lint.add("ZL018", "warning", key,
                     f"{key.split('.')[-1]} {_elements(value)}{' (default)' if raw is None else ''}: up to "
                     f"{format_bytes(value * nbytes)} of {nbytes}-byte {what}, more than {share:.0%} of "
                     f"{format_bytes(memory)} per GPU", "lower it (e.g. stage3_max_live_parameters 5e8, "
                     "stage3_prefetch_bucket_size 1e8): fewer parameters held at once, at the cost of more "
                     "communication (DeepSpeed's config reference)")


def _check_optimizer_params(lint: Lint) -> None:
    optimizer = lint.config.get("optimizer")
    params = optimizer.get("params") if isinstance(optimizer, Mapping) else None
    if isinstance(params, Mapping) and (as_number(params.get("max_grad_norm")) or 0) > 0:
        lint.add("ZL020", "warning", "optimizer.params.max_grad_norm",
                 "max_grad_norm in optimizer.params is not applied: DeepSpeed clips with its own "
                 "gradient_clipping and warns that this parameter is unsupported",
                 f"move it to \"gradient_clipping\": {params['max_grad_norm']}")


def _check_zero2_fits(lint: Lint, gpus: int | None, zero_init: bool) -> None:
    opts = lint.options
    if lint.stage != 3 or opts.params is None or gpus is None or opts.gpu_memory_bytes is None:
        return
    from zeromon.analysis.planner import PlanInputError, PlanInputs, plan, smallest_fitting_stage

    dtype = "fp16" if _enabled(lint.config, "fp16") else "bf16" if lint.element_bytes == 2 else "fp32"
    optimizer = lint.config.get("optimizer")
    kind = str(optimizer.get("type", "adam")).lower() if isinstance(optimizer, Mapping) else "adam"
    devices = {p.rsplit(".", 1)[-1]: d for p, _, d in lint.offloads()}
    nodes = opts.nodes if opts.nodes and gpus % opts.nodes == 0 else 1
    try:
        result = plan(PlanInputs(params=opts.params, gpus_per_node=gpus // nodes, nodes=nodes,
                                 gpu_memory_bytes=opts.gpu_memory_bytes, dtype=dtype,
                                 optimizer="sgd" if "sgd" in kind else "adam",
                                 offload_optimizer=devices.get("offload_optimizer", "none"),
                                 offload_params=devices.get("offload_param", "none"), zero_init=zero_init,
                                 largest_layer_params=None, activations=None, convention="zero-paper",
                                 stages=(0, 1, 2, 3)))
    except PlanInputError:
        return
    smallest = smallest_fitting_stage(result)
    if smallest is None or smallest >= 3:
        return
    # Model-state memory falls with the stage, so if a smaller stage fits, ZeRO-2 does.
    zero2 = next(sp for sp in result.stages if sp.stage == 2)
    zero3 = next(sp for sp in result.stages if sp.stage == 3)
    headroom = result.inputs.headroom_fraction
    tight = zero2.gpu_bytes > (1 - headroom) * opts.gpu_memory_bytes
    smaller = {0: " (even DDP fits)", 1: " (even ZeRO-1 fits)"}.get(smallest, "")
    offload = f", optimizer offloaded to {zero2.offload_optimizer}" if zero2.offload_optimizer != "none" else ""
    lint.add("ZL015", "info" if tight else "warning", "zero_optimization.stage",
             f"ZeRO-3 where ZeRO-2 fits{smaller}: the planner puts the model states of {params_text(opts.params)} "
             f"parameters on {gpus} GPUs at {format_bytes(zero2.gpu_bytes)} per GPU with ZeRO-2{offload} "
             f"({format_bytes(zero3.gpu_bytes)} with ZeRO-3) of {format_bytes(opts.gpu_memory_bytes)}"
             + (f", with less than {headroom:.0%} to spare" if tight else "")
             + "; ZeRO-3 adds a parameter all-gather to every forward and backward (~1.5x the communication of "
             "ZeRO-2). Activations are not counted here",
             f"use stage 2; compare with `{_plan_command(opts, gpus, nodes, devices, zero_init)}`, adding "
             "--activations with your sequence length, micro-batch, hidden size, layers and heads")


def _plan_command(opts: LintOptions, gpus: int, nodes: int, devices: Mapping[str, str], zero_init: bool) -> str:
    """The `zeromon plan` command line for this check, runnable as printed."""
    assert opts.params is not None and opts.gpu_memory_bytes is not None
    words = ["zeromon plan --params", params_text(opts.params), "--gpus-per-node", str(gpus // nodes),
             "--nodes", str(nodes), "--gpu-memory", format_bytes(opts.gpu_memory_bytes).replace(" ", "")]
    for what, flag in (("offload_optimizer", "--offload-optimizer"), ("offload_param", "--offload-params")):
        if devices.get(what, "none") != "none":
            words += [flag, devices[what]]
    if not zero_init:
        words.append("--no-zero-init")
    return " ".join(words)


def params_text(params: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if params >= scale:
            return f"{params / scale:g}{suffix}"
    return f"{params:g}"


def run_rules(lint: Lint, duplicate_keys: Iterable[str], gpus: int | None, zero_init: bool) -> None:
    _check_keys(lint, duplicate_keys)
    _check_values(lint)
    _check_stage(lint)
    _check_zero3_save(lint)
    _check_batch(lint)
    _check_precision(lint)
    _check_overlap(lint)
    _check_offload(lint)
    _check_auto(lint)
    _check_stage_relevance(lint)
    _check_buckets(lint)
    _check_live_parameters(lint)
    _check_optimizer_params(lint)
    _check_zero2_fits(lint, gpus, zero_init)


def make_report(lint: Lint) -> LintReport:
    order = {s: i for i, s in enumerate(SEVERITIES)}
    findings = sorted(lint.findings, key=lambda f: (order[f.severity], f.id, f.key))
    opts = lint.options
    return LintReport(tuple(findings), lint.stage, opts.world_size, opts.world_size_from, opts.schema.origin,
                      opts.hf)


def lint_deepspeed_config(config: Mapping[str, Any], options: LintOptions | None = None,
                          duplicate_keys: Iterable[str] = ()) -> LintReport:
    """Lint a DeepSpeed JSON config (as ``deepspeed.initialize`` or, with ``options.hf``, the Trainer reads it)."""
    options = options or LintOptions()
    lint = Lint(config, options)
    run_rules(lint, duplicate_keys, options.world_size, zero_init=True)
    return make_report(lint)
