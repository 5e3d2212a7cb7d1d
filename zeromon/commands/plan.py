"""`zeromon plan`: ZeRO model-state and activation memory per GPU and per node, per stage, and which stage to use."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from zeromon.errors import ZeromonError

NAME = "plan"
HELP = "plan ZeRO memory per GPU and per node for each stage, and recommend one"

DESCRIPTION = """\
Estimate parameters, gradients, optimizer state and activations per GPU, host memory per node, and
whether each ZeRO stage (0 = DDP) fits the GPU; recommend the first of DDP, ZeRO-2, ZeRO-3 that fits
with 10% headroom, then the same with offload (the seeds' stage-selection guide: ZeRO-2 is the
default over ZeRO-1, which never needs less memory). NVMe optimizer offload is ZeRO-3's: at stages
1 and 2 DeepSpeed keeps the optimizer state in CPU memory, and so does the plan.

conventions:
  zero-paper  the ZeRO paper (Rajbhandari et al. 2020): Ψ params, N GPUs, mixed-precision Adam with
              2 + 2 + 12 bytes per parameter: DDP 16Ψ, stage 1 4Ψ + 12Ψ/N, stage 2 2Ψ + 14Ψ/N,
              stage 3 16Ψ/N (fp32: 4 + 4 + 8; SGD: master copy 4, +4 with --momentum).
  deepspeed   DeepSpeed's estimate_zero2/3_model_states_mem_needs, reproduced exactly: stage 2
              2Ψ + 18Ψ/N (it also counts a 4-byte fp32 gradient partition), stage 3
              4·L + 18Ψ/N (L = largest layer, gathered), host memory × 1.5
              (additional_buffer_factor) including the fp32 model each rank loads; stages 0 and 1
              extrapolated in the same accounting; bf16/fp16 Adam and cpu offload only.
activations (--activations seq,batch,hidden,layers,heads): Korthikanti et al. 2022 without
recomputation, s·b·h·(34 + 5·a·s/h) bytes per layer, times layers.
"""

_FLAGS = {  # PlanInputs field -> the flag that sets it, for error messages
    "params": "--params", "gpus_per_node": "--gpus-per-node", "nodes": "--nodes",
    "gpu_memory_bytes": "--gpu-memory", "dtype": "--dtype", "optimizer": "--optimizer",
    "offload_optimizer": "--offload-optimizer", "offload_params": "--offload-params",
    "largest_layer_params": "--largest-layer-params", "activations": "--activations",
    "convention": "--convention", "stages": "--stage", "zero_init": "--no-zero-init",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--params", metavar="N", help="parameter count: 7e9, 7B, 1.3b, 350M")
    size.add_argument("--model", metavar="MODULE:FACTORY",
                      help="count a real model: import MODULE (or a .py path) and call FACTORY() for an nn.Module; "
                           "also gives the largest layer (the module with the most direct parameters, as DeepSpeed)")
    parser.add_argument("--gpus-per-node", default="1", metavar="G", help="GPUs per node (default 1)")
    parser.add_argument("--nodes", default="1", metavar="N", help="nodes (default 1)")
    parser.add_argument("--stage", default="all", choices=("0", "1", "2", "3", "all"), help="stage (default all)")
    parser.add_argument("--offload-optimizer", default="none", choices=("none", "cpu", "nvme"))
    parser.add_argument("--offload-params", default="none", choices=("none", "cpu", "nvme"),
                        help="ZeRO-3 only")
    parser.add_argument("--no-zero-init", dest="zero_init", action="store_false",
                        help="the model is built whole on every rank (no deepspeed.zero.Init)")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    parser.add_argument("--optimizer", default="adam", choices=("adam", "sgd"))
    parser.add_argument("--momentum", action="store_true", help="SGD keeps a momentum buffer (default: none)")
    parser.add_argument("--largest-layer-params", metavar="N", help="parameters of the largest layer (ZeRO-3)")
    parser.add_argument("--activations", metavar="SEQ,BATCH,HIDDEN,LAYERS,HEADS",
                        help="add transformer activations per GPU, e.g. 4096,1,4096,32,32")
    parser.add_argument("--gpu-memory", metavar="SIZE", help="GPU capacity, e.g. 80GiB, 40GB")
    parser.add_argument("--convention", default="zero-paper", choices=("zero-paper", "deepspeed"))
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    from zeromon.analysis.planner import PlanInputError, PlanInputs, plan

    if args.params is None and args.model is None:
        raise ZeromonError("zeromon plan: give --params N (e.g. 7e9, 7B) or --model MODULE:FACTORY",
                           hint="see `zeromon plan --help`")
    if args.momentum and args.optimizer != "sgd":
        raise ZeromonError(f"--momentum applies to --optimizer sgd only (this plan is for --optimizer "
                           f"{args.optimizer}, whose state is always counted)",
                           hint="add --optimizer sgd, or drop --momentum")
    largest = _count_flag("--largest-layer-params", args.largest_layer_params)
    params: int | None
    if args.model is not None:
        params, model_largest = count_model_params(load_model(args.model))
        largest = model_largest if largest is None else largest
    else:
        params = _count_flag("--params", args.params)
    assert params is not None
    try:
        inputs = PlanInputs(
            params=params, gpus_per_node=_int_flag("--gpus-per-node", args.gpus_per_node),
            nodes=_int_flag("--nodes", args.nodes), gpu_memory_bytes=_gpu_memory(args.gpu_memory),
            dtype=args.dtype, optimizer=args.optimizer, offload_optimizer=args.offload_optimizer,
            offload_params=args.offload_params, zero_init=args.zero_init, largest_layer_params=largest,
            activations=_activations(args.activations), convention=args.convention,
            stages=(0, 1, 2, 3) if args.stage == "all" else (int(args.stage),), sgd_momentum=args.momentum)
    except PlanInputError as exc:
        raise ZeromonError(f"{_FLAGS.get(exc.field, exc.field)}: {exc.detail}",
                           hint="see `zeromon plan --help`") from None
    if args.stage != "all":
        _check_offload_applies(int(args.stage), args)
    result = plan(inputs)
    if args.json:
        payload = result.to_dict()
        if args.model is not None:
            payload["inputs"]["model"] = args.model
        print(json.dumps(payload, indent=2))
    else:
        print(format_plan(result, model=args.model))
    return 0


def _count_flag(flag: str, text: str | None) -> int | None:
    from zeromon.analysis.planner import parse_param_count

    if text is None:
        return None
    try:
        return parse_param_count(text)
    except ValueError as exc:
        raise ZeromonError(f"{flag}: {exc}", hint="a count > 0: 7e9, 7B, 1.3b, 350M, 7000000000") from None


def _int_flag(flag: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ZeromonError(f"{flag}: {text!r} is not a whole number", hint=f"{flag} takes an integer >= 1") from None
    if value < 1:
        raise ZeromonError(f"{flag}: must be at least 1, got {value}", hint=f"{flag} takes an integer >= 1")
    return value


def _gpu_memory(text: str | None) -> int | None:
    from zeromon.model.units import parse_memory_size

    if text is None:
        return None
    try:
        return parse_memory_size(text, "--gpu-memory")
    except ValueError as exc:
        message = str(exc) if str(exc).startswith("--gpu-memory") else f"--gpu-memory: {exc}"
        raise ZeromonError(message, hint="a size with a unit: 80GiB, 40GB, 24GiB") from None


def _activations(text: str | None) -> tuple[int, int, int, int, int] | None:
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    hint = "five integers >= 1: seq_len,micro_batch,hidden,layers,heads, e.g. 4096,1,4096,32,32"
    if len(parts) != 5 or not all(p.isdigit() and int(p) >= 1 for p in parts):
        raise ZeromonError(f"--activations: {text!r} is not SEQ,BATCH,HIDDEN,LAYERS,HEADS", hint=hint)
    seq, batch, hidden, layers, heads = (int(p) for p in parts)
    return seq, batch, hidden, layers, heads


def _check_offload_applies(stage: int, args: argparse.Namespace) -> None:
    """An explicit stage that cannot do the asked-for offload is a usage error, not a silent change."""
    if stage == 0 and args.offload_optimizer != "none":
        raise ZeromonError("--offload-optimizer: stage 0 (DDP) cannot offload; use --stage 1, 2 or 3")
    if stage < 3 and args.offload_params != "none":
        raise ZeromonError("--offload-params: only ZeRO-3 offloads parameters; use --stage 3")
    if stage in (1, 2) and args.offload_optimizer == "nvme":
        raise ZeromonError(f"--offload-optimizer nvme: at stage {stage} DeepSpeed keeps the optimizer state in CPU "
                           "memory (NVMe offload needs ZeRO-3); use --offload-optimizer cpu, or --stage 3")


# ---------------------------------------------------------------------------------------------
# --model


def load_model(spec: str) -> Any:
    """'pkg.module:factory' or 'path/to/file.py:factory' -> factory(), which must be a torch nn.Module."""
    module_name, sep, factory_name = spec.rpartition(":")
    hint = "--model takes MODULE:FACTORY (e.g. examples.mymodel:build) or FILE.py:FACTORY, FACTORY() -> nn.Module"
    if not sep or not module_name or not factory_name.isidentifier():
        raise ZeromonError(f"--model: {spec!r} is not MODULE:FACTORY", hint=hint)
    try:
        module = _import(module_name)
    except Exception as exc:  # anything the user's module raises on import is the user's problem to see
        raise ZeromonError(f"--model: cannot import {module_name!r}: {type(exc).__name__}: {exc}", hint=hint) from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ZeromonError(f"--model: {module_name!r} has no callable {factory_name!r}", hint=hint)
    try:
        model = factory()
    except Exception as exc:
        raise ZeromonError(f"--model: {spec}() failed: {type(exc).__name__}: {exc}", hint=hint) from None
    from torch import nn

    if not isinstance(model, nn.Module):
        raise ZeromonError(f"--model: {spec}() returned {type(model).__name__}, not a torch nn.Module", hint=hint)
    return model


def _import(module_name: str) -> Any:
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses and pickling look the module up by name
        spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path and "" not in sys.path:  # the `zeromon` script, unlike `python -m`
        sys.path.insert(0, os.getcwd())
    return importlib.import_module(module_name)


def count_model_params(model: Any) -> tuple[int, int]:
    """(total, largest layer) as DeepSpeed's stage3.model_to_params counts them.

    Total: each storage once (tied weights share a data_ptr); meta tensors, which all report data_ptr 0,
    count once per Parameter object. Largest layer: the module with the most parameters of its own
    (``parameters(recurse=False)``), DeepSpeed's definition of a layer.
    """
    unique = {}
    for p in model.parameters():
        key = ("ptr", p.data_ptr()) if not p.is_meta and p.numel() > 0 else ("id", id(p))
        unique[key] = p.numel()
    total = sum(unique.values())
    largest = max((sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules()), default=0)
    if total < 1:
        raise ZeromonError("--model: the model has no parameters", hint="pass --params N instead")
    return total, largest


# ---------------------------------------------------------------------------------------------
# text


def format_plan(result: Any, model: str | None = None) -> str:
    from zeromon.model.units import format_bytes

    inputs = result.inputs
    precision = {"bf16": "bf16 mixed precision", "fp16": "fp16 mixed precision", "fp32": "fp32"}[inputs.dtype]
    optimizer = "Adam" if inputs.optimizer == "adam" else ("SGD with momentum" if inputs.sgd_momentum else "SGD")
    source = f" ({model})" if model else ""
    capacity = format_bytes(inputs.gpu_memory_bytes) if inputs.gpu_memory_bytes else "unknown (--gpu-memory)"
    lines = [
        f"ZeRO memory plan: {_count(inputs.params)} parameters{source}, {inputs.total_gpus} "
        f"GPU{'s' if inputs.total_gpus > 1 else ''} "
        f"({inputs.nodes} node{'s' if inputs.nodes > 1 else ''} x {inputs.gpus_per_node}), {precision}, {optimizer}",
        f"GPU memory {capacity}; largest layer "
        + (_count(inputs.largest_layer_params) if inputs.largest_layer_params else "unknown"),
        "",
    ]
    with_nvme = any(sp.nvme_bytes for sp in result.stages)
    header = ["stage", "offload", "params", "grads", "optimizer", "activations", "GPU total", "fits", "CPU/node"]
    header += ["NVMe/node"] if with_nvme else []
    rows = [header]
    for sp in result.stages:
        row = ["0 (DDP)" if sp.stage == 0 else str(sp.stage), sp.offload,
               format_bytes(sp.params_bytes), format_bytes(sp.grads_bytes), format_bytes(sp.optimizer_bytes),
               format_bytes(sp.activations_bytes) if inputs.activations is not None else "-",
               format_bytes(sp.gpu_bytes), {True: "yes", False: "NO", None: "?"}[sp.fits],
               format_bytes(sp.cpu_bytes)]
        rows.append(row + ([format_bytes(sp.nvme_bytes)] if with_nvme else []))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for row in rows:
        cells = [c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    lines.append("")
    lines.extend(_convention_lines(result))
    lines.extend(f"note: {n}" for n in result.notes)
    rec = result.recommendation
    offload = [f"{what} offload {dev}" for what, dev in (("optimizer", rec.offload_optimizer),
                                                          ("parameter", rec.offload_params)) if dev != "none"]
    name = "stage 0 (DDP)" if rec.stage == 0 else f"ZeRO-{rec.stage}"
    lines.append("")
    lines.append(f"recommendation: {name}" + (f" with {', '.join(offload)}" if offload else ", no offload"))
    lines.append(f"  why: {rec.reason}")
    return "\n".join(lines)


def _convention_lines(result: Any) -> list[str]:
    from zeromon.analysis.planner import bytes_per_param

    inputs = result.inputs
    n = inputs.total_gpus
    if inputs.convention == "deepspeed":
        return [f"convention deepspeed: DeepSpeed's estimate_zero2/3_model_states_mem_needs, exactly: stage 2 "
                f"2P + 18P/N, stage 3 4L + 18P/N (N = {n}, L = largest layer); CPU/node includes the 1.5 "
                "additional_buffer_factor and the fp32 model each rank loads; stages 0, 1 extrapolated.",
                "  (zero-paper counts 2P + 14P/N for stage 2: no fp32 gradient partition, no buffer factor.)",
                "  DeepSpeed gives totals; the columns split them: params the 16-bit parameters, optimizer 12 B per "
                "parameter (fp32 master + Adam m, v), grads the rest: 6P/N at stage 2 but 4P/N at stage 3, whose "
                "total counts 2 B per parameter less."]
    p, g, k = bytes_per_param(inputs)
    return [f"convention zero-paper: {p} B params + {g} B grads + {k} B optimizer state per parameter "
            f"(K = {k}), sharded over N = {n} GPUs as the stage says; per GPU, GiB = 2^30 bytes.",
            "  CPU/node: offloaded state, or the fp32 copy each rank builds before partitioning "
            "(none for ZeRO-3 with zero.Init); activations per Korthikanti et al. without recomputation."]


def _count(n: float) -> str:
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))
