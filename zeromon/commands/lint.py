"""`zeromon lint CONFIG`: the pitfalls in a DeepSpeed JSON, an accelerate YAML (for DeepSpeed or FSDP) or a
Lightning YAML with an FSDPStrategy, with fixes.

Exit codes: 0 no error-severity finding (warnings and info may be printed), 1 at least one error,
2 usage or unreadable input (missing file, malformed JSON/YAML with line:column, no DeepSpeed or FSDP setup).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.errors import ZeromonError
from zeromon.model.numbers import GPU_MEMORY, GPUS, PARAMS, flag

if TYPE_CHECKING:
    from zeromon.analysis.lint import LintOptions, LintReport
    from zeromon.sources.configs import LoadedConfig

NAME = "lint"
HELP = "check a DeepSpeed, accelerate or Lightning config for known ZeRO and FSDP pitfalls"

EXIT_CLEAN = 0
EXIT_ERRORS = 1
FSDP_KINDS = ("accelerate-fsdp", "lightning")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a DeepSpeed config (ds_config.json) or an accelerate config for DeepSpeed (its deepspeed_config "
        "block, or the JSON its deepspeed_config_file names) for known pitfalls: ZeRO-3 saves without "
        "stage3_gather_16bit_weights_on_model_save, batch arithmetic, fp16 with ZeRO-3, overlap_comm off, "
        "offload without pin_memory, \"auto\" outside the Hugging Face integration, unknown keys, ZeRO-3 where "
        "ZeRO-2 fits, and more. Also an accelerate config for FSDP (distributed_type: FSDP, its fsdp_config) and "
        "a LightningCLI or Fabric YAML whose strategy is FSDPStrategy: NO_SHARD, SHARD_GRAD_OP and HYBRID_SHARD "
        "against memory and machines, CPU offload, no auto wrap policy, full state dicts, "
        "sync_module_states with RAM-efficient loading, activation checkpointing, use_orig_params, keys and "
        "values accelerate or Lightning refuse or ignore, and whether the strategy fits (--params, --gpus, "
        "--gpu-memory). Exit code: 0 without errors, 1 with errors, 2 for bad input.")
    parser.add_argument("config", metavar="CONFIG",
                        help="DeepSpeed JSON, accelerate YAML (DeepSpeed or FSDP) or Lightning YAML config file")
    parser.add_argument("--world-size", type=flag("--world-size", GPUS), metavar="N",
                        help="data-parallel ranks, for train_batch_size = micro x accumulation x world size "
                             "(default: --gpus, or num_processes from an accelerate file, or devices x num_nodes "
                             "from a Lightning file)")
    parser.add_argument("--gpus", type=flag("--gpus", GPUS), metavar="N",
                        help="GPUs in the job (all nodes); with --params and --gpu-memory: does ZeRO-2, or the FSDP "
                             "sharding strategy, fit?")
    parser.add_argument("--params", type=flag("--params", PARAMS), metavar="N",
                        help="model parameters, e.g. 7e9 or 7B (with --gpus and --gpu-memory: does ZeRO-2, or the FSDP "
                             "sharding strategy, fit?)")
    parser.add_argument("--gpu-memory", type=flag("--gpu-memory", GPU_MEMORY), metavar="SIZE",
                        help="memory per GPU, e.g. 80GiB")
    parser.add_argument("--hf", action="store_true",
                        help="the Hugging Face Trainer or accelerate reads this DeepSpeed JSON and fills \"auto\" "
                             "values (implied for accelerate files)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.lint import LintOptions
    from zeromon.sources.configs import load_config

    loaded = load_config(Path(args.config))
    # --world-size wins over --gpus: with tensor or pipeline parallelism there are fewer data-parallel
    # ranks than GPUs, and both the batch arithmetic and ZeRO's partitioning count data-parallel ranks.
    world, source = args.world_size, "--world-size"
    if world is None and args.gpus is not None:
        world, source = args.gpus, "--gpus"
    if args.params is not None:
        _check_params_can_be_used(args.gpu_memory, world or _file_world(loaded))
    options = LintOptions(world_size=world, world_size_from=source if world is not None else "",
                          params=args.params, gpu_memory_bytes=args.gpu_memory, hf=args.hf)
    try:
        report = _lint(loaded, options)
    except RecursionError:  # values nested hundreds deep: the parser read them, the rules' walks cannot
        what = "an FSDP" if loaded.kind in FSDP_KINDS else "a DeepSpeed"
        raise ZeromonError(f"{loaded.deepspeed_path or loaded.path}: nested too deeply to be {what} config") from None
    files = {"accelerate": str(loaded.path), "deepspeed": str(loaded.deepspeed_path or loaded.path),
             "lightning": str(loaded.path)}
    if args.json:
        print(json.dumps(_to_json(report, loaded, files), indent=2))
    else:
        print(_format_text(report, loaded, files))
    return EXIT_ERRORS if report.has_errors else EXIT_CLEAN


def _lint(loaded: LoadedConfig, options: LintOptions) -> LintReport:
    """The report of the linter for this kind of file: DeepSpeed's schema or accelerate's read where installed."""
    from zeromon.analysis.lint import lint_deepspeed_config
    from zeromon.analysis.lint_accelerate import lint_accelerate_config
    from zeromon.analysis.lint_accelerate_fsdp import lint_accelerate_fsdp_config
    from zeromon.analysis.lint_lightning import lint_lightning_config
    from zeromon.sources.accelerate_schema import installed_accelerate_schema
    from zeromon.sources.configs import installed_schema

    if loaded.kind == "accelerate-fsdp":
        assert loaded.accelerate is not None
        return lint_accelerate_fsdp_config(loaded.accelerate, options, installed_accelerate_schema())
    if loaded.kind == "lightning":
        assert loaded.lightning is not None
        return lint_lightning_config(loaded.lightning, options)
    options = dataclasses.replace(options, schema=installed_schema())
    if loaded.kind == "deepspeed":
        assert loaded.deepspeed is not None
        return lint_deepspeed_config(loaded.deepspeed, options, loaded.duplicate_keys)
    assert loaded.accelerate is not None
    return lint_accelerate_config(loaded.accelerate, loaded.deepspeed, options, loaded.duplicate_keys,
                                  relative_file=loaded.relative_deepspeed_file)


def _file_world(loaded: LoadedConfig) -> int | None:
    """The GPUs the file itself gives: num_processes of an accelerate file, devices x num_nodes of a Lightning one."""
    from zeromon.analysis.lint_accelerate import accelerate_world
    from zeromon.analysis.lint_lightning import resolve_lightning_fsdp

    if loaded.accelerate is not None:
        return accelerate_world(loaded.accelerate)[0]
    if loaded.lightning is not None:
        setup = resolve_lightning_fsdp(loaded.lightning)
        return setup.world_size if setup is not None else None
    return None


def _check_params_can_be_used(gpu_memory: int | None, gpus: int | None) -> None:
    """--params serves the fits checks (ZL015 for ZeRO, ZL047 for FSDP), which need the GPUs and their memory
    too: asked for without them they would be silently skipped, and a clean exit code would answer a question
    not asked."""
    missing = [flag for flag, value in (("--gpus", gpus), ("--gpu-memory", gpu_memory)) if value is None]
    if missing:
        raise ZeromonError(f"--params needs {' and '.join(missing)} too: with the model size alone zeromon lint "
                           "cannot check whether ZeRO-2 (or the FSDP sharding strategy) fits",
                           hint="e.g. zeromon lint ds.json --params 7B --gpus 8 --gpu-memory 80GiB "
                                "(--world-size, num_processes in an accelerate file or devices x num_nodes in a "
                                "Lightning one also gives the GPUs)")


def _summary(report: LintReport, loaded: LoadedConfig) -> dict[str, Any]:
    counts = {"errors": report.count("error"), "warnings": report.count("warning"), "info": report.count("info")}
    where = {"world_size": report.world_size, "world_size_from": report.world_size_from or None}
    if loaded.kind in FSDP_KINDS:
        return {**counts, "fsdp": report.setup, **where, "keys_checked_against": report.schema_origin}
    return {**counts, "zero_stage": report.stage, **where, "hf": report.hf,
            "keys_checked_against": report.schema_origin}


def _to_json(report: LintReport, loaded: LoadedConfig, files: dict[str, str]) -> dict[str, Any]:
    return {
        "file": str(loaded.path),
        "kind": loaded.kind,
        "deepspeed_file": str(loaded.deepspeed_path) if loaded.deepspeed_path else None,
        "findings": [dict(f.to_dict(), file=files[f.file]) for f in report.findings],
        "summary": _summary(report, loaded),
    }


def _format_text(report: LintReport, loaded: LoadedConfig, files: dict[str, str]) -> str:
    kind = {"deepspeed": "DeepSpeed JSON", "accelerate-fsdp": "accelerate config for FSDP",
            "lightning": "Lightning config with FSDPStrategy"}.get(loaded.kind, "accelerate config")
    if loaded.kind == "accelerate" and loaded.deepspeed_path is not None:
        kind += f" with DeepSpeed file {loaded.deepspeed_path}"
    world = (f"world size {report.world_size} from {report.world_size_from}" if report.world_size
             else "world size unknown")
    if loaded.kind in FSDP_KINDS:
        stage = report.setup
    else:
        stage = f"ZeRO stage {report.stage}" if report.stage is not None else "ZeRO stage invalid"
    auto = "; \"auto\" filled by accelerate / the HF Trainer" if report.hf else ""
    lines = [f"zeromon lint: {loaded.path} ({kind}; {stage}; {world}{auto}; keys checked against "
             f"{report.schema_origin})"]
    several_files = len(set(files.values())) > 1
    for severity in ("error", "warning", "info"):
        group = [f for f in report.findings if f.severity == severity]
        if not group:
            continue
        lines.append("")
        lines.append(f"{severity}s:" if severity != "info" else "info:")
        for f in group:
            where = f"{files[f.file]}: " if several_files else ""
            lines.append(f"  {f.id} {where}{f.key}")
            lines.append(f"      {f.message}")
            lines.append(f"      fix: {f.fix}")
    counts = [f"{report.count('error')} error{'s' * (report.count('error') != 1)}",
              f"{report.count('warning')} warning{'s' * (report.count('warning') != 1)}",
              f"{report.count('info')} info"]
    lines.append("")
    lines.append(f"{len(report.findings)} finding{'s' * (len(report.findings) != 1)}: {', '.join(counts)}"
                 + ("" if report.findings else " (clean)"))
    return "\n".join(lines)

