"""Lint accelerate's config: its ``deepspeed_config`` block, or the DeepSpeed JSON it points to.

accelerate (1.x) builds a DeepSpeed config from 15 keys of its block and ignores the rest; with
``deepspeed_config_file`` it refuses to start if the block also sets a key the file owns. The
DeepSpeed rules themselves are ``zeromon.analysis.lint``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zeromon.analysis.lint import (
    Lint,
    LintOptions,
    LintReport,
    add_non_finite,
    as_count,
    as_number,
    make_report,
    nearest_key,
    non_finite_values,
    run_rules,
    truthy,
)
from zeromon.analysis.lint_schema import (
    ACCELERATE_DEEPSPEED_KEYS,
    ACCELERATE_FILE_OWNED_KEYS,
    DEEPSPEED_TO_ACCELERATE,
    ConfigSchema,
)


def _check_accumulation_agreement(lint: Lint, accelerate_block: Mapping[str, Any]) -> None:
    acc_raw, ds_raw = accelerate_block.get("gradient_accumulation_steps"), lint.config.get(
        "gradient_accumulation_steps")
    acc, ds = as_count(acc_raw), as_count(ds_raw)
    if acc is None or ds_raw is None or lint.is_auto(ds_raw) or acc == ds:
        return
    lint.add("ZL005", "error", "deepspeed_config.gradient_accumulation_steps",
             f"gradient_accumulation_steps is {acc} in the accelerate file and {ds_raw} in the DeepSpeed file; "
             "accelerate refuses to start when its config sets a value the deepspeed_config_file owns, and "
             "the two disagree on the effective batch size", "remove gradient_accumulation_steps from the accelerate "
             "file and keep the one in the DeepSpeed JSON (or set it there to \"auto\")", file="accelerate")



def _check_accelerate_block(lint: Lint, accelerate: Mapping[str, Any], block: Mapping[str, Any],
                            has_file: bool, relative_file: bool) -> None:
    distributed = str(accelerate.get("distributed_type", "")).upper()
    if distributed != "DEEPSPEED":
        lint.add("ZL026", "warning", "distributed_type",
                 f"distributed_type is {accelerate.get('distributed_type')!r}: accelerate launch uses DeepSpeed only "
                 "with DEEPSPEED, so the deepspeed_config block is ignored", "set distributed_type: DEEPSPEED",
                 file="accelerate")
    for key in block:
        if key in ACCELERATE_DEEPSPEED_KEYS:
            continue
        path = f"deepspeed_config.{key}"
        ds_path = _deepspeed_path_of(lint.options.schema, str(key))
        if key == "stage3_gather_16bit_weights_on_model_save":
            hint, fix = "accelerate's name for it is zero3_save_16bit_model", "use zero3_save_16bit_model: true"
        elif ds_path is not None:
            hint = f"it is the DeepSpeed key {ds_path}, which accelerate does not pass on"
            fix = "put it in a DeepSpeed JSON and point deepspeed_config_file at it"
        else:
            nearest = nearest_key(str(key), ACCELERATE_DEEPSPEED_KEYS)
            hint = f"did you mean {nearest}?" if nearest else "accelerate does not know it"
            fix = f"rename it to {nearest}" if nearest else "remove it"
        lint.add("ZL024", "warning", path, f"{path} is ignored by accelerate: {hint}", fix, file="accelerate")
    if has_file:
        owned = [k for k in ACCELERATE_FILE_OWNED_KEYS if k in block]
        gas_differs = any(f.id == "ZL005" for f in lint.findings)
        owned = [k for k in owned if not (k == "gradient_accumulation_steps" and gas_differs)]
        owned_paths = [f"deepspeed_config.{k}" for k in owned]
        if "mixed_precision" in accelerate:
            owned_paths.append("mixed_precision")
        if owned_paths:
            lint.add("ZL025", "error", owned_paths[0],
                     f"{', '.join(owned_paths)} set next to deepspeed_config_file: accelerate refuses to start "
                     "(\"When using `deepspeed_config_file`, the following accelerate config variables will be "
                     "ignored\")", "remove them from the accelerate file and set them in the DeepSpeed JSON "
                     "(mixed precision: its fp16 / bf16 blocks)", file="accelerate")
        if relative_file:
            lint.add("ZL027", "info", "deepspeed_config.deepspeed_config_file",
                     f"deepspeed_config_file {block.get('deepspeed_config_file')!r} is relative: accelerate opens "
                     "it from the directory you launch in, not from this file's folder (zeromon read it from "
                     "this file's folder)", "use an absolute path, or always launch from this file's folder",
                     file="accelerate")


def _deepspeed_path_of(schema: ConfigSchema, key: str) -> str | None:
    for section in ("", "zero_optimization", "zero_optimization.offload_optimizer", "fp16", "bf16"):
        if key in schema.sections.get(section, ()):
            return f"{section}.{key}" if section else key
    return None


# ------------------------------------------------------------------------------------------- entry points


def accelerate_world(accelerate: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(num_processes, num_machines) from an accelerate config; num_processes counts every machine's."""
    processes, machines = as_count(accelerate.get("num_processes")), as_count(accelerate.get("num_machines"))
    return (processes if processes and processes > 0 else None), (machines if machines and machines > 0 else None)


def inline_deepspeed_config(block: Mapping[str, Any], mixed_precision: Any) -> dict[str, Any]:
    """The DeepSpeed config accelerate builds from its own keys when there is no deepspeed_config_file
    (DeepSpeedPlugin.__post_init__ and set_mixed_precision, accelerate 1.x)."""
    offload_opt = str(block.get("offload_optimizer_device", "none")).lower()
    offload_param = str(block.get("offload_param_device", "none")).lower()
    gas = as_count(block.get("gradient_accumulation_steps"))
    stage = block.get("zero_stage", 2)  # accelerate's default
    zero: dict[str, Any] = {
        "stage": as_count(stage) if as_count(stage) is not None else stage,
        "offload_optimizer": {"device": offload_opt},
        "offload_param": {"device": offload_param},
        "stage3_gather_16bit_weights_on_model_save": truthy(block.get("zero3_save_16bit_model", False)),
    }
    if offload_opt == "nvme":
        zero["offload_optimizer"]["nvme_path"] = block.get("offload_optimizer_nvme_path", "none")
    if offload_param == "nvme":
        zero["offload_param"]["nvme_path"] = block.get("offload_param_nvme_path", "none")
    config: dict[str, Any] = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                              "gradient_accumulation_steps": gas if gas is not None else "auto",
                              "zero_optimization": zero}
    clip = block.get("gradient_clipping")
    if clip is not None and as_number(clip) is not None:
        config["gradient_clipping"] = clip
    precision = str(mixed_precision or "no").lower()
    config["fp16"] = {"enabled": precision == "fp16"}
    config["bf16"] = {"enabled": precision in ("bf16", "fp8")}
    return config


def lint_accelerate_config(accelerate: Mapping[str, Any], deepspeed_file: Mapping[str, Any] | None,
                           options: LintOptions | None = None, duplicate_keys: Iterable[str] = (),
                           relative_file: bool = False) -> LintReport:
    """Lint an accelerate config's DeepSpeed setup: its ``deepspeed_config`` block and, when the block
    names one, the DeepSpeed JSON in ``deepspeed_file`` (already read). "auto" is resolved by accelerate."""
    options = options or LintOptions()
    block = accelerate.get("deepspeed_config")
    block = block if isinstance(block, Mapping) else {}
    processes, machines = accelerate_world(accelerate)
    world, source = options.world_size, options.world_size_from
    if world is None and processes is not None:
        world, source = processes, "num_processes in the accelerate file"
    nodes = options.nodes or machines
    opts = LintOptions(world_size=world, world_size_from=source, nodes=nodes, params=options.params,
                       gpu_memory_bytes=options.gpu_memory_bytes, hf=True, schema=options.schema)
    zero_init = truthy(block.get("zero3_init_flag", True))
    if deepspeed_file is not None:
        lint = Lint(deepspeed_file, opts)
        _check_accumulation_agreement(lint, block)
    else:
        lint = Lint(inline_deepspeed_config(block, accelerate.get("mixed_precision")), opts,
                     key_map=DEEPSPEED_TO_ACCELERATE, inline=True)
    run_rules(lint, duplicate_keys, world, zero_init)
    seen = {f.key for f in lint.findings if f.id == "ZL030" and f.file == "accelerate"}
    for path, value in non_finite_values(accelerate):  # num_processes: .nan, and what the inline config drops
        if path not in seen:
            add_non_finite(lint, path, value, file="accelerate")
    _check_accelerate_block(lint, accelerate, block, deepspeed_file is not None, relative_file)
    return make_report(lint)
