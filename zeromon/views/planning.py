"""`zeromon plan`'s inputs as a person types them (the CLI's flags, the dashboard's planner form), read
into PlanInputs in one place: the same text means the same plan, and fails with the same sentence
naming the flag, wherever it was typed. And the plan's words (its table rows, notes, convention lines
and recommendation), written once for both `zeromon plan` and the dashboard's Planner page."""

from __future__ import annotations

from typing import Any

from zeromon.analysis.planner import (
    PlanInputError,
    PlanInputs,
    PlanResult,
    Recommendation,
    bytes_per_param,
    plan,
)
from zeromon.errors import ZeromonError
from zeromon.model.classes import frozen
from zeromon.model.numbers import GPU_MEMORY, GPUS_PER_NODE, LAYER_SIZE, NODES, PARAMS, parse_flag, where
from zeromon.model.units import format_bytes

# PlanInputs field -> the flag that sets it, for error messages
FLAGS = {
    "params": "--params", "gpus_per_node": "--gpus-per-node", "nodes": "--nodes",
    "gpu_memory_bytes": "--gpu-memory", "dtype": "--dtype", "optimizer": "--optimizer",
    "offload_optimizer": "--offload-optimizer", "offload_params": "--offload-params",
    "largest_layer_params": "--largest-layer-params", "activations": "--activations",
    "convention": "--convention", "stages": "--stage", "zero_init": "--no-zero-init",
}
STAGE_CHOICES = ("0", "1", "2", "3", "all")
OFFLOAD_CHOICES = ("none", "cpu", "nvme")
DTYPE_CHOICES = ("bf16", "fp16", "fp32")
OPTIMIZER_CHOICES = ("adam", "sgd")
CONVENTION_CHOICES = ("zero-paper", "deepspeed")


@frozen
class PlanRequest:
    """A plan as typed: every value the text of its flag (None: not given)."""

    params: str | None = None
    model: str | None = None  # MODULE:FACTORY or FILE.py:FACTORY
    gpus_per_node: str = "1"
    nodes: str = "1"
    stage: str = "all"
    offload_optimizer: str = "none"
    offload_params: str = "none"
    zero_init: bool = True
    dtype: str = "bf16"
    optimizer: str = "adam"
    momentum: bool = False
    largest_layer_params: str | None = None
    activations: str | None = None
    gpu_memory: str | None = None
    convention: str = "zero-paper"


def plan_inputs(request: PlanRequest) -> PlanInputs:
    """PlanInputs, or ZeromonError naming the flag (``--model`` builds the model: it may take seconds)."""
    if not request.params and not request.model:
        raise ZeromonError("zeromon plan: give --params N (e.g. 7e9, 7B) or --model MODULE:FACTORY",
                           hint="see `zeromon plan --help`")
    if request.params and request.model:
        raise ZeromonError("--params and --model: give one of them (the model is counted to give the parameters)")
    for flag, value, choices in (("--stage", request.stage, STAGE_CHOICES),
                                 ("--offload-optimizer", request.offload_optimizer, OFFLOAD_CHOICES),
                                 ("--offload-params", request.offload_params, OFFLOAD_CHOICES),
                                 ("--dtype", request.dtype, DTYPE_CHOICES),
                                 ("--optimizer", request.optimizer, OPTIMIZER_CHOICES),
                                 ("--convention", request.convention, CONVENTION_CHOICES)):
        if value not in choices:
            raise ZeromonError(f"{flag}: {value!r} is not one of {', '.join(choices)}")
    if request.momentum and request.optimizer != "sgd":
        raise ZeromonError(f"--momentum applies to --optimizer sgd only (this plan is for --optimizer "
                           f"{request.optimizer}, whose state is always counted)",
                           hint="add --optimizer sgd, or drop --momentum")
    largest = parse_flag("--largest-layer-params", PARAMS, request.largest_layer_params)
    params: int | None
    if request.model:
        from zeromon.sources.model_spec import count_model_params, load_model

        params, model_largest = count_model_params(load_model(request.model))
        largest = model_largest if largest is None else largest
    else:
        params = parse_flag("--params", PARAMS, request.params)
    gpus_per_node = parse_flag("--gpus-per-node", GPUS_PER_NODE, request.gpus_per_node)
    nodes = parse_flag("--nodes", NODES, request.nodes)
    assert params is not None and gpus_per_node is not None and nodes is not None
    try:
        inputs = PlanInputs(
            params=params, gpus_per_node=gpus_per_node, nodes=nodes,
            gpu_memory_bytes=parse_flag("--gpu-memory", GPU_MEMORY, request.gpu_memory),
            dtype=request.dtype, optimizer=request.optimizer, offload_optimizer=request.offload_optimizer,
            offload_params=request.offload_params, zero_init=request.zero_init, largest_layer_params=largest,
            activations=_activations(request.activations), convention=request.convention,
            stages=(0, 1, 2, 3) if request.stage == "all" else (int(request.stage),),
            sgd_momentum=request.momentum)
    except PlanInputError as exc:
        raise ZeromonError(f"{FLAGS.get(exc.field, exc.field)}: {exc.detail}",
                           hint="see `zeromon plan --help`") from None
    if request.stage != "all":
        _check_offload_applies(int(request.stage), request)
    return inputs


def plan_of(request: PlanRequest) -> PlanResult:
    return plan(plan_inputs(request))


def recommendation_text(rec: Recommendation) -> str:
    """'ZeRO-2 with optimizer offload cpu', 'stage 0 (DDP), no offload'."""
    offload = [f"{what} offload {dev}" for what, dev in (("optimizer", rec.offload_optimizer),
                                                          ("parameter", rec.offload_params)) if dev != "none"]
    name = "stage 0 (DDP)" if rec.stage == 0 else f"ZeRO-{rec.stage}"
    return name + (f" with {', '.join(offload)}" if offload else ", no offload")


def _activations(text: str | None) -> tuple[int, int, int, int, int] | None:
    if text is None:
        return None
    parts = text.split(",")
    hint = (f"five integers, each {LAYER_SIZE.accepts}: seq_len,micro_batch,hidden,layers,heads, "
            "e.g. 4096,1,4096,32,32")
    if len(parts) != 5:
        raise ZeromonError(f"{where('--activations', text)}: is not SEQ,BATCH,HIDDEN,LAYERS,HEADS", hint=hint)
    values = []
    for name, part in zip(("SEQ", "BATCH", "HIDDEN", "LAYERS", "HEADS"), parts, strict=True):
        try:
            values.append(LAYER_SIZE.parse(part))
        except ValueError as exc:
            raise ZeromonError(f"{where('--activations', text)}: {name} {part.strip()!r} {exc}", hint=hint) from None
    seq, batch, hidden, layers, heads = values
    return seq, batch, hidden, layers, heads


def _check_offload_applies(stage: int, request: PlanRequest) -> None:
    """An explicit stage that cannot do the asked-for offload is a usage error, not a silent change."""
    if stage == 0 and request.offload_optimizer != "none":
        raise ZeromonError("--offload-optimizer: stage 0 (DDP) cannot offload; use --stage 1, 2 or 3")
    if stage < 3 and request.offload_params != "none":
        raise ZeromonError("--offload-params: only ZeRO-3 offloads parameters; use --stage 3")
    if stage in (1, 2) and request.offload_optimizer == "nvme":
        raise ZeromonError(f"--offload-optimizer nvme: at stage {stage} DeepSpeed keeps the optimizer state in CPU "
                           "memory (NVMe offload needs ZeRO-3); use --offload-optimizer cpu, or --stage 3")




# ---------------------------------------------------------------------------------------------
# the plan's words: `zeromon plan`'s text and the dashboard's Planner page say the same things

PLAN_COLUMNS = ("stage", "offload", "params", "grads", "optimizer", "activations", "GPU total", "fits", "CPU/node")
NVME_COLUMN = "NVMe/node"  # shown only when some row offloads to NVMe
FITS_TEXT = {True: "yes", False: "NO", None: "?"}


def plan_payload(result: PlanResult, model: str | None = None) -> dict[str, Any]:
    """`zeromon plan --json`'s object."""
    payload = result.to_dict()
    if model is not None:
        payload["inputs"]["model"] = model
    return payload


def heading_lines(result: PlanResult, model: str | None = None) -> list[str]:
    """What was planned: the model, the GPUs, precision and optimizer, the GPU's capacity, the largest layer."""
    inputs = result.inputs
    precision = {"bf16": "bf16 mixed precision", "fp16": "fp16 mixed precision", "fp32": "fp32"}[inputs.dtype]
    optimizer = "Adam" if inputs.optimizer == "adam" else ("SGD with momentum" if inputs.sgd_momentum else "SGD")
    source = f" ({model})" if model else ""
    capacity = format_bytes(inputs.gpu_memory_bytes) if inputs.gpu_memory_bytes else "unknown (--gpu-memory)"
    return [
        f"ZeRO memory plan: {count_text(inputs.params)} parameters{source}, {inputs.total_gpus} "
        f"GPU{'s' if inputs.total_gpus > 1 else ''} "
        f"({inputs.nodes} node{'s' if inputs.nodes > 1 else ''} x {inputs.gpus_per_node}), {precision}, {optimizer}",
        f"GPU memory {capacity}; largest layer "
        + (count_text(inputs.largest_layer_params) if inputs.largest_layer_params else "unknown"),
    ]


def plan_table(result: PlanResult) -> tuple[list[str], list[list[str]]]:
    """The table's header and one row of cells per planned stage, formatted as `zeromon plan` prints them."""
    with_nvme = any(sp.nvme_bytes for sp in result.stages)
    header = list(PLAN_COLUMNS) + ([NVME_COLUMN] if with_nvme else [])
    rows = []
    for sp in result.stages:
        row = ["0 (DDP)" if sp.stage == 0 else str(sp.stage), sp.offload,
               format_bytes(sp.params_bytes), format_bytes(sp.grads_bytes), format_bytes(sp.optimizer_bytes),
               format_bytes(sp.activations_bytes) if result.inputs.activations is not None else "-",
               format_bytes(sp.gpu_bytes), FITS_TEXT[sp.fits], format_bytes(sp.cpu_bytes)]
        rows.append(row + ([format_bytes(sp.nvme_bytes)] if with_nvme else []))
    return header, rows


def convention_lines(result: PlanResult) -> list[str]:
    """How the numbers were counted: the convention's formulas, with this plan's N."""
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


def note_lines(result: PlanResult) -> list[str]:
    return [f"note: {n}" for n in result.notes]


def recommendation_lines(result: PlanResult) -> list[str]:
    rec = result.recommendation
    return [f"recommendation: {recommendation_text(rec)}", f"  why: {rec.reason}"]


def format_plan(result: PlanResult, model: str | None = None) -> str:
    """`zeromon plan`'s text: heading, table (columns aligned, numbers right-aligned), how it was counted,
    notes, recommendation."""
    header, cells = plan_table(result)
    rows = [header, *cells]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    table = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip() for row in rows]
    return "\n".join([*heading_lines(result, model), "", *table, "", *convention_lines(result),
                      *note_lines(result), "", *recommendation_lines(result)])


def count_text(n: float) -> str:
    """A parameter count as the plan writes it: 7.50B, 350.00M."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))
