"""`zeromon lint CONFIG`: the pitfalls in a DeepSpeed JSON or an accelerate YAML config, with fixes.

Exit codes: 0 no error-severity finding (warnings and info may be printed), 1 at least one error,
2 usage or unreadable input (missing file, malformed JSON/YAML with line:column, no DeepSpeed block).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zeromon.errors import ZeromonError
from zeromon.model.numbers import GPU_MEMORY, GPUS, PARAMS, flag

if TYPE_CHECKING:
    from zeromon.analysis.lint import LintReport
    from zeromon.sources.configs import LoadedConfig

NAME = "lint"
HELP = "check a DeepSpeed JSON or accelerate YAML config for known ZeRO pitfalls"

EXIT_CLEAN = 0
EXIT_ERRORS = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a DeepSpeed config (ds_config.json) or an accelerate config for DeepSpeed (its deepspeed_config "
        "block, or the JSON its deepspeed_config_file names) for known pitfalls: ZeRO-3 saves without "
        "stage3_gather_16bit_weights_on_model_save, batch arithmetic, fp16 with ZeRO-3, overlap_comm off, "
        "offload without pin_memory, \"auto\" outside the Hugging Face integration, unknown keys, ZeRO-3 where "
        "ZeRO-2 fits, and more. Exit code: 0 without errors, 1 with errors, 2 for bad input.")
    parser.add_argument("config", metavar="CONFIG", help="DeepSpeed JSON or accelerate YAML config file")
    parser.add_argument("--world-size", type=flag("--world-size", GPUS), metavar="N",
                        help="data-parallel ranks, for train_batch_size = micro x accumulation x world size "
                             "(default: --gpus, or num_processes from an accelerate file)")
    parser.add_argument("--gpus", type=flag("--gpus", GPUS), metavar="N",
                        help="GPUs in the job (all nodes); with --params and --gpu-memory: does ZeRO-2 fit?")
    parser.add_argument("--params", type=flag("--params", PARAMS), metavar="N",
                        help="model parameters, e.g. 7e9 or 7B (with --gpus and --gpu-memory: does ZeRO-2 fit?)")
    parser.add_argument("--gpu-memory", type=flag("--gpu-memory", GPU_MEMORY), metavar="SIZE",
                        help="memory per GPU, e.g. 80GiB")
    parser.add_argument("--hf", action="store_true",
                        help="the Hugging Face Trainer or accelerate reads this DeepSpeed JSON and fills \"auto\" "
                             "values (implied for accelerate files)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.lint import LintOptions, lint_deepspeed_config
    from zeromon.analysis.lint_accelerate import accelerate_world, lint_accelerate_config
    from zeromon.sources.configs import installed_schema, load_config

    loaded = load_config(Path(args.config))
    # --world-size wins over --gpus: with tensor or pipeline parallelism there are fewer data-parallel
    # ranks than GPUs, and both the batch arithmetic and ZeRO's partitioning count data-parallel ranks.
    world, source = args.world_size, "--world-size"
    if world is None and args.gpus is not None:
        world, source = args.gpus, "--gpus"
    if args.params is not None:
        processes = accelerate_world(loaded.accelerate)[0] if loaded.accelerate is not None else None
        _check_params_can_be_used(args.gpu_memory, world or processes)
    options = LintOptions(world_size=world, world_size_from=source if world is not None else "",
                          params=args.params, gpu_memory_bytes=args.gpu_memory, hf=args.hf,
                          schema=installed_schema())
    try:
        if loaded.kind == "deepspeed":
            assert loaded.deepspeed is not None
            report = lint_deepspeed_config(loaded.deepspeed, options, loaded.duplicate_keys)
        else:
            assert loaded.accelerate is not None
            report = lint_accelerate_config(loaded.accelerate, loaded.deepspeed, options, loaded.duplicate_keys,
                                            relative_file=loaded.relative_deepspeed_file)
    except RecursionError:  # values nested hundreds deep: the parser read them, the rules' walks cannot
        raise ZeromonError(f"{loaded.deepspeed_path or loaded.path}: nested too deeply to be a DeepSpeed "
                           "config") from None
    files = {"accelerate": str(loaded.path), "deepspeed": str(loaded.deepspeed_path or loaded.path)}
    if args.json:
        print(json.dumps(_to_json(report, loaded, files), indent=2))
    else:
        print(_format_text(report, loaded, files))
    return EXIT_ERRORS if report.has_errors else EXIT_CLEAN


def _check_params_can_be_used(gpu_memory: int | None, gpus: int | None) -> None:
    """--params serves only the ZeRO-2-fits check (ZL015), which needs the GPUs and their memory too: asked
    for without them it would be silently skipped, and a clean exit code would answer a question not asked."""
    missing = [flag for flag, value in (("--gpus", gpus), ("--gpu-memory", gpu_memory)) if value is None]
    if missing:
        raise ZeromonError(f"--params needs {' and '.join(missing)} too: with the model size alone zeromon lint "
                           "cannot check whether ZeRO-2 fits",
                           hint="e.g. zeromon lint ds.json --params 7B --gpus 8 --gpu-memory 80GiB "
                                "(--world-size, or num_processes in an accelerate file, also gives the GPUs)")


def _summary(report: LintReport) -> dict[str, Any]:
    return {"errors": report.count("error"), "warnings": report.count("warning"), "info": report.count("info"),
            "zero_stage": report.stage, "world_size": report.world_size,
            "world_size_from": report.world_size_from or None, "hf": report.hf, "keys_checked_against":
            report.schema_origin}


def _to_json(report: LintReport, loaded: LoadedConfig, files: dict[str, str]) -> dict[str, Any]:
    return {
        "file": str(loaded.path),
        "kind": loaded.kind,
        "deepspeed_file": str(loaded.deepspeed_path) if loaded.deepspeed_path else None,
        "findings": [dict(f.to_dict(), file=files[f.file]) for f in report.findings],
        "summary": _summary(report),
    }


def _format_text(report: LintReport, loaded: LoadedConfig, files: dict[str, str]) -> str:
    kind = "DeepSpeed JSON" if loaded.kind == "deepspeed" else "accelerate config"
    if loaded.kind == "accelerate" and loaded.deepspeed_path is not None:
        kind += f" with DeepSpeed file {loaded.deepspeed_path}"
    world = (f"world size {report.world_size} from {report.world_size_from}" if report.world_size
             else "world size unknown")
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

