"""`zeromon plan`'s inputs as a person types them (the CLI's flags, the dashboard's planner form), read
into PlanInputs in one place: the same text means the same plan, and fails with the same sentence
naming the flag, wherever it was typed."""

from __future__ import annotations

from dataclasses import dataclass

from zeromon.analysis.planner import PlanInputError, PlanInputs, PlanResult, Recommendation, plan
from zeromon.errors import ZeromonError

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


@dataclass(frozen=True, slots=True)
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
    largest = _count_flag("--largest-layer-params", request.largest_layer_params)
    params: int | None
    if request.model:
        from zeromon.sources.model_spec import count_model_params, load_model

        params, model_largest = count_model_params(load_model(request.model))
        largest = model_largest if largest is None else largest
    else:
        params = _count_flag("--params", request.params)
    assert params is not None
    try:
        inputs = PlanInputs(
            params=params, gpus_per_node=_int_flag("--gpus-per-node", request.gpus_per_node),
            nodes=_int_flag("--nodes", request.nodes), gpu_memory_bytes=_gpu_memory(request.gpu_memory),
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


def _check_offload_applies(stage: int, request: PlanRequest) -> None:
    """An explicit stage that cannot do the asked-for offload is a usage error, not a silent change."""
    if stage == 0 and request.offload_optimizer != "none":
        raise ZeromonError("--offload-optimizer: stage 0 (DDP) cannot offload; use --stage 1, 2 or 3")
    if stage < 3 and request.offload_params != "none":
        raise ZeromonError("--offload-params: only ZeRO-3 offloads parameters; use --stage 3")
    if stage in (1, 2) and request.offload_optimizer == "nvme":
        raise ZeromonError(f"--offload-optimizer nvme: at stage {stage} DeepSpeed keeps the optimizer state in CPU "
                           "memory (NVMe offload needs ZeRO-3); use --offload-optimizer cpu, or --stage 3")


