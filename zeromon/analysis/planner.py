"""The ZeRO memory planner: model-state and activation memory per GPU and per node, for each ZeRO
stage and offload choice, and which stage to use.

Pure: ``plan(PlanInputs(...)) -> PlanResult``; no printing, no I/O, no torch. Ψ (``P`` below) is the
parameter count, N = gpus_per_node × nodes the data-parallel ranks, L the largest layer's parameters.

**zero-paper** (default; the ZeRO paper, Rajbhandari et al. 2020, arXiv:1910.02054, §3 and Figure 1).
Bytes per parameter: p for the parameters the model computes with, g for their gradients, K for the
optimizer state:

    dtype, optimizer      p  g  K
    bf16/fp16 + Adam      2  2  12  fp32 master copy 4 + Adam m 4 + v 4 (the paper's K = 12)
    fp32 + Adam           4  4   8  m + v; the fp32 parameters are their own master copy
    bf16/fp16 + SGD       2  2   4  fp32 master copy (+4 for the momentum buffer)
    fp32 + SGD            4  4   0  no state (+4 for the momentum buffer)

SGD follows torch.optim.SGD's default momentum=0 (no state); ``sgd_momentum=True`` adds the buffer.
Per GPU: DDP (p+g+K)Ψ; stage 1 (p+g)Ψ + KΨ/N; stage 2 pΨ + (g+K)Ψ/N; stage 3 (p+g+K)Ψ/N, where Ψ/N
is the padded partition ⌈Ψ/N⌉. For 7.5B parameters on 64 GPUs that is 120, 31.4, 16.6 and 1.9 GB,
the paper's Figure 1. Extensions, each stated in the output:
- stage 3 with L known also holds one gathered layer and its full gradient: (p+g)·L (DeepSpeed's
  4·L for 16-bit); without L the paper's formula stands.
- offload_optimizer (ZeRO-Offload, Ren et al. 2021; stages 1-3) moves the optimizer state and the
  gradient partition, (g+K)⌈Ψ/N⌉ per rank, to host memory (cpu) or disk (nvme); stages 2 and 3 keep
  no gradients on the GPU (bucketed out during backward), stage 1 still holds its unsharded gradients.
  nvme is ZeRO-Infinity's, stage 3 only: DeepSpeed's stage 1/2 optimizer takes any device other than
  none for cpu (``cpu_offload`` in stage_1_and_2.py), so stages 1 and 2 are modeled with cpu, and say so.
  offload_params (ZeRO-Infinity; stage 3 only) moves the parameter partition p⌈Ψ/N⌉ as well.
- host memory per node: the larger of the offloaded state × gpus_per_node and the fp32 copy every
  rank builds before the model is moved or partitioned, 4Ψ × gpus_per_node (none for ZeRO-3 with
  zero.Init, which builds each rank's partition only). NVMe staging buffers are not counted.

**deepspeed**: DeepSpeed's ``estimate_zero2_model_states_mem_needs`` and
``estimate_zero3_model_states_mem_needs`` (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py),
reproduced expression by expression, float rounding included:
- stage 2: GPU 2P + int(18P/N), host 4P·gpus_per_node·1.5; optimizer offload: GPU 2P, host
  P·max(4N, 16)·1.5. DeepSpeed's 18 = 2 fp16 grads + 4 fp32 grads + 4 fp32 params + 8 Adam m, v,
  all partitioned; the paper's 2Ψ + 14Ψ/N has no fp32 gradient partition (4Ψ/N less).
- stage 3: GPU 4L + int(18P/N); optimizer offload 4L + int(2P/N); both offloaded 4L. Host, with
  zero.Init: 4L·gpus_per_node·1.5, or P·16 (P·18 with parameters offloaded)/nodes·1.5; without it,
  every rank first loads the fp32 model: 4P·gpus_per_node·1.5 (or the max with the offload term).
  DeepSpeed models parameter offload only together with optimizer offload; alone it is ignored.
- the 1.5 is DeepSpeed's ``additional_buffer_factor`` on host memory; no GPU headroom is added.
- DeepSpeed gives totals; the params / grads / optimizer columns are our split (``_deepspeed_stage``).
- stages 0 and 1 have no DeepSpeed estimator: extrapolated in its accounting (DDP 20P; stage 1
  4P + int(16P/N); stage 1 offload 4P), host as for stage 2. Mixed-precision Adam and cpu offload
  only: other dtypes, optimizers and nvme are refused, since DeepSpeed's numbers do not cover them.

**Activations** (Korthikanti et al. 2022, §4.1, no recomputation): s·b·h·(34 + 5·a·s/h) bytes per
transformer layer for 16-bit activations, times layers, per GPU (every data-parallel rank runs its
own micro-batch, whatever the stage). Of the 34 sbh, 2 sbh are 1-byte dropout masks, and of the
5 as²b, 1 is; with fp32 activations the 2-byte tensors double: s·b·h·(66 + 9·a·s/h).

The recommendation takes the fastest plan that fits (each further stage and offload reduces peak
memory at the cost of more communication, as Hugging Face's DeepSpeed guide puts it): the first of
DDP, ZeRO-2, ZeRO-3 that fits the GPU with ``headroom_fraction`` to spare (CUDA context, NCCL and bucket buffers, temporaries
and allocator fragmentation are not in the model); then ZeRO-2 + CPU optimizer offload, ZeRO-3 + CPU
optimizer offload, ZeRO-3 + CPU optimizer and parameter offload, ZeRO-3 + NVMe. ZeRO-1 is not a rung:
ZeRO-2 never needs more memory and, per step, moves the same volume (the paper, §7), which is why it
is the default over ZeRO-1; the reason says when ZeRO-1 fits too, and when it is worth choosing
(gradient accumulation: DeepSpeed's ZeRO-1 reduces gradients once per optimizer step, ZeRO-2 after
every micro-batch). Without the GPU's capacity, a rule of thumb: ZeRO-2 up to 30B, ZeRO-3 above.
The ladder covers every stage, without offload first, whatever stages and offload the table shows;
the reason names each plan it quotes that the table has no row for.
"""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

from zeromon.model.classes import frozen
from zeromon.model.numbers import PARAMS
from zeromon.model.units import format_bytes

DTYPES = ("bf16", "fp16", "fp32")
OPTIMIZERS = ("adam", "sgd")
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
CONVENTIONS = ("zero-paper", "deepspeed")
STAGES = (0, 1, 2, 3)
# GPU memory the model does not see: CUDA context (~0.5-1 GiB), NCCL and bucket buffers,
# temporaries, allocator fragmentation. A plan that uses more than 90% of the GPU is not a plan.
DEFAULT_HEADROOM_FRACTION = 0.10
# DeepSpeed's default additional_buffer_factor on host memory.
DEEPSPEED_BUFFER_FACTOR = 1.5
# Every rank builds the model in torch's default dtype before it is moved or partitioned.
CONSTRUCTION_BYTES_PER_PARAM = 4
# Beyond any model or GPU memory in sight; keeps the float arithmetic of DeepSpeed's formulas exact-ish.
MAX_PARAMS = PARAMS.maximum
# The rule of thumb when the GPU's capacity is unknown: ZeRO-2 up to 30B parameters, ZeRO-3 above.
LARGE_MODEL_PARAMS = 30e9


class PlanInputError(ValueError):
    """An input the planner cannot use; ``field`` names the PlanInputs field (the CLI maps it to a flag)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.detail = message


@frozen
class ActivationShape:
    seq_len: int
    micro_batch: int
    hidden: int
    layers: int
    heads: int


@frozen
class PlanInputs:
    params: float  # Ψ; 7e9 is accepted and stored as the int 7000000000
    gpus_per_node: int
    nodes: int = 1
    gpu_memory_bytes: int | None = None
    dtype: str = "bf16"
    optimizer: str = "adam"
    offload_optimizer: str = "none"
    offload_params: str = "none"
    zero_init: bool = True
    largest_layer_params: float | None = None
    activations: ActivationShape | tuple[int, int, int, int, int] | None = None
    convention: str = "zero-paper"
    stages: tuple[int, ...] = STAGES
    sgd_momentum: bool = False
    headroom_fraction: float = DEFAULT_HEADROOM_FRACTION

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalize once, here
        set_(self, "params", _whole_count("params", self.params))
        for name in ("gpus_per_node", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PlanInputError(name, f"must be an integer >= 1, got {value!r}")
        if self.gpu_memory_bytes is not None:
            set_(self, "gpu_memory_bytes", _whole_count("gpu_memory_bytes", self.gpu_memory_bytes))
        for name, allowed in (("dtype", DTYPES), ("optimizer", OPTIMIZERS), ("offload_optimizer", OFFLOAD_DEVICES),
                              ("offload_params", OFFLOAD_DEVICES), ("convention", CONVENTIONS)):
            if getattr(self, name) not in allowed:
                raise PlanInputError(name, f"must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.largest_layer_params is not None:
            largest = _whole_count("largest_layer_params", self.largest_layer_params)
            if largest > self.params:
                raise PlanInputError("largest_layer_params",
                                     f"{largest} is more than the model's {int(self.params)} parameters")
            set_(self, "largest_layer_params", largest)
        if self.activations is not None and not isinstance(self.activations, ActivationShape):
            try:
                set_(self, "activations", ActivationShape(*self.activations))
            except TypeError:
                raise PlanInputError("activations", "must be (seq_len, micro_batch, hidden, layers, heads)") from None
        if self.activations is not None:
            for name in ("seq_len", "micro_batch", "hidden", "layers", "heads"):
                value = getattr(self.activations, name)
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise PlanInputError("activations", f"{name} must be an integer >= 1, got {value!r}")
        stages = tuple(self.stages)
        if not stages or any(s not in STAGES for s in stages):
            raise PlanInputError("stages", f"must be a non-empty choice of 0, 1, 2, 3, got {self.stages!r}")
        set_(self, "stages", tuple(sorted(set(stages))))
        if not 0 <= self.headroom_fraction < 1:
            raise PlanInputError("headroom_fraction", f"must be in [0, 1), got {self.headroom_fraction!r}")
        if self.convention == "deepspeed":
            if self.dtype == "fp32" or self.optimizer != "adam":
                field_name = "dtype" if self.dtype == "fp32" else "optimizer"
                raise PlanInputError(field_name, "the deepspeed convention (DeepSpeed's estimators) covers "
                                     "mixed-precision (bf16/fp16) Adam only; use the zero-paper convention")
            for name in ("offload_optimizer", "offload_params"):
                if getattr(self, name) == "nvme":
                    raise PlanInputError(name, "the deepspeed convention (DeepSpeed's estimators) models cpu "
                                         "offload only; use the zero-paper convention for nvme")

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@frozen
class StagePlan:
    stage: int
    offload_optimizer: str  # what was modeled: a stage that cannot offload shows "none"
    offload_params: str
    params_bytes: int  # per GPU
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    gpu_bytes: int  # per GPU: the sum of the four above
    cpu_bytes: int  # host memory per node
    fits: bool | None  # gpu_bytes <= gpu_memory_bytes; None when the capacity is unknown
    nvme_bytes: int = 0  # per node, with nvme offload

    @property
    def offload(self) -> str:
        """'none', or which state goes where: 'optimizer=cpu', 'optimizer=cpu,params=cpu'."""
        parts = [f"{what}={device}" for what, device in (("optimizer", self.offload_optimizer),
                                                          ("params", self.offload_params)) if device != "none"]
        return ",".join(parts) or "none"

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "offload": self.offload, "offload_optimizer": self.offload_optimizer,
                "offload_params": self.offload_params, "gpu_bytes": self.gpu_bytes, "cpu_bytes": self.cpu_bytes,
                "nvme_bytes": self.nvme_bytes, "fits": self.fits, "params_bytes": self.params_bytes,
                "grads_bytes": self.grads_bytes, "optimizer_bytes": self.optimizer_bytes,
                "activations_bytes": self.activations_bytes}


@frozen
class Recommendation:
    stage: int
    offload_optimizer: str
    offload_params: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "offload_optimizer": self.offload_optimizer,
                "offload_params": self.offload_params, "reason": self.reason}


@frozen
class PlanResult:
    inputs: PlanInputs
    stages: tuple[StagePlan, ...]
    recommendation: Recommendation
    notes: tuple[str, ...] = field(default=())  # what was assumed or adjusted, one sentence each

    def to_dict(self) -> dict[str, Any]:
        inputs = asdict(self.inputs)
        inputs["stages"] = list(self.inputs.stages)
        inputs["total_gpus"] = self.inputs.total_gpus
        return {"stages": [s.to_dict() for s in self.stages], "recommendation": self.recommendation.to_dict(),
                "inputs": inputs, "convention": self.inputs.convention, "notes": list(self.notes)}


def _whole_count(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PlanInputError(name, f"must be a number > 0, got {value!r}")
    if not 0 < value <= MAX_PARAMS:  # also refuses nan; inf and huge ints fail the upper bound
        raise PlanInputError(name, f"must be > 0 and at most {MAX_PARAMS:.0e}, got {value!r}")
    count = round(value)
    if count < 1:
        raise PlanInputError(name, f"must be > 0, got {value!r}")
    return int(count)


def parse_param_count(text: str) -> int:
    """'7e9', '7B', '1.3b', '350M', '7_000_000_000' -> a whole parameter count >= 1 (B = billion, not bytes):
    the parser every flag, form and config reading a parameter count uses (zeromon.model.numbers.PARAMS)."""
    return PARAMS.parse(text)


def activation_bytes(shape: ActivationShape, dtype: str = "bf16") -> int:
    """Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer (16-bit), times layers; fp32: 66 and 9."""
    s, b, h, a = shape.seq_len, shape.micro_batch, shape.hidden, shape.heads
    per_sbh, per_as2b = (66, 9) if dtype == "fp32" else (34, 5)
    return (per_sbh * s * b * h + per_as2b * a * s * s * b) * shape.layers


def bytes_per_param(inputs: PlanInputs) -> tuple[int, int, int]:
    """(p, g, K) of the zero-paper convention: see the module docstring's table."""
    p = g = 4 if inputs.dtype == "fp32" else 2
    master = 0 if inputs.dtype == "fp32" else 4
    if inputs.optimizer == "adam":
        return p, g, master + 8
    return p, g, master + (4 if inputs.sgd_momentum else 0)


def _modeled_offload(stage: int, offload_optimizer: str, offload_params: str,
                     convention: str) -> tuple[str, str, list[str]]:
    notes = []
    if stage == 0 and offload_optimizer != "none":
        notes.append("stage 0 (DDP) cannot offload: modeled without offload")
        offload_optimizer = "none"
    if stage in (1, 2) and offload_optimizer == "nvme":
        notes.append("ZeRO-1/2 cannot offload the optimizer to NVMe: DeepSpeed keeps it in CPU memory instead "
                     "(NVMe needs ZeRO-3), so stages 1 and 2 are modeled with optimizer=cpu")
        offload_optimizer = "cpu"
    if stage < 3 and offload_params != "none":
        notes.append("only ZeRO-3 offloads parameters: lower stages keep them on the GPU")
        offload_params = "none"
    if stage == 3 and convention == "deepspeed" and offload_params != "none" and offload_optimizer == "none":
        notes.append("DeepSpeed's estimator ignores parameter offload without optimizer offload: so does "
                     "this plan")
        offload_params = "none"
    return offload_optimizer, offload_params, notes


def _paper_stage(inputs: PlanInputs, stage: int, opt_dev: str, param_dev: str, acts: int) -> StagePlan:
    psi, n, gpn = int(inputs.params), inputs.total_gpus, inputs.gpus_per_node
    p, g, k = bytes_per_param(inputs)
    shard = -(-psi // n)  # the padded partition each rank owns
    params = p * psi if stage < 3 else p * shard
    grads = g * psi if stage < 2 else g * shard
    optimizer = k * psi if stage < 1 else k * shard
    offloaded = {"cpu": 0, "nvme": 0}
    if opt_dev != "none":  # the optimizer state and the gradient partition it updates from
        offloaded[opt_dev] += optimizer + g * shard
        optimizer = 0
        if stage >= 2:
            grads = 0
    if param_dev != "none":
        offloaded[param_dev] += params
        params = 0
    if stage == 3 and inputs.largest_layer_params is not None:
        params += p * int(inputs.largest_layer_params)  # the gathered layer...
        grads += g * int(inputs.largest_layer_params)  # ...and its full gradient before the reduce-scatter
    builds_full_model = stage < 3 or not inputs.zero_init
    construction = CONSTRUCTION_BYTES_PER_PARAM * psi if builds_full_model else 0
    gpu = params + grads + optimizer + acts
    return StagePlan(stage, opt_dev, param_dev, params, grads, optimizer, acts, gpu,
                     cpu_bytes=max(construction, offloaded["cpu"]) * gpn, fits=_fits(gpu, inputs),
                     nvme_bytes=offloaded["nvme"] * gpn)


def _deepspeed_stage(inputs: PlanInputs, stage: int, opt_dev: str, param_dev: str, acts: int) -> StagePlan:
    """DeepSpeed's totals, and our split of the GPU total into the table's columns.

    DeepSpeed's estimators give totals only. The split follows one rule at every stage:
    - params: the 16-bit parameters on the GPU: 2P below stage 3; at stage 3 the partition
      int(2P/N) (none with parameters offloaded) plus the gathered largest layer, 2L;
    - optimizer: the fp32 master copy and Adam's m and v, 12 bytes per parameter of the rank's
      optimizer partition: 12P for DDP, int(12P/N) from stage 1, none with optimizer offload;
    - grads: the rest of DeepSpeed's total. That is 6P/N at stage 2 (DeepSpeed's 18 = 2 + 4 bytes of
      16-bit and fp32 gradient partition + 12) but 4P/N at stage 3, plus the layer's gradient 2L:
      DeepSpeed's stage-3 total, 18P/N with the parameters inside it, counts 2 bytes per parameter
      less than its stage-2 total, 2P + 18P/N, and only the gradient column can take the difference
      without contradicting what the other two columns hold.
    """
    # Mirrors DeepSpeed's expressions (and their evaluation order) so that the floats round the same way.
    total_params, num_gpus_per_node, num_nodes = int(inputs.params), inputs.gpus_per_node, inputs.nodes
    total_gpus = num_nodes * num_gpus_per_node
    additional_buffer_factor = DEEPSPEED_BUFFER_FACTOR
    cpu_offload = opt_dev == "cpu"
    largest_layer_params = int(inputs.largest_layer_params or 0) if stage == 3 else 0
    if stage < 3:
        if cpu_offload:
            cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
        else:
            cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
        if stage == 2:
            gpu_mem = 2 * total_params if cpu_offload else 2 * total_params + int(18 * total_params / total_gpus)
        elif stage == 1:  # extrapolated: fp16 gradients unsharded, the 16 bytes of fp32 state sharded
            gpu_mem = 4 * total_params if cpu_offload else 4 * total_params + int(16 * total_params / total_gpus)
        else:  # extrapolated: DDP keeps all 2 + 18 bytes
            gpu_mem = 20 * total_params
        params = 2 * total_params
    else:
        gpus_factor = 1 / num_nodes
        largest_layer_memory = (4 * largest_layer_params)
        zero_init = inputs.zero_init
        if cpu_offload:
            if param_dev == "cpu":
                gpu_mem = largest_layer_memory
                if zero_init:
                    cpu_mem = total_params * 18 * gpus_factor * additional_buffer_factor
                else:
                    cpu_mem = total_params * max(4 * num_gpus_per_node, 18 * gpus_factor) * additional_buffer_factor
            else:
                gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
                if zero_init:
                    cpu_mem = total_params * 16 * gpus_factor * additional_buffer_factor
                else:
                    cpu_mem = total_params * max(4 * num_gpus_per_node, 16 * gpus_factor) * additional_buffer_factor
        else:
            gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
            if zero_init:
                cpu_mem = largest_layer_params * 4 * num_gpus_per_node * additional_buffer_factor
            else:
                cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
        params = 2 * largest_layer_params + (0 if param_dev == "cpu" else int(2 * total_params / total_gpus))
    gpu_mem = int(gpu_mem)
    if cpu_offload:
        optimizer = 0
    else:
        optimizer = 12 * total_params if stage == 0 else int(12 * total_params / total_gpus)
    grads = gpu_mem - params - optimizer
    gpu = gpu_mem + acts
    return StagePlan(stage, opt_dev, param_dev, params, grads, optimizer, acts, gpu, cpu_bytes=int(cpu_mem),
                     fits=_fits(gpu, inputs))


def _fits(gpu_bytes: int, inputs: PlanInputs) -> bool | None:
    return None if inputs.gpu_memory_bytes is None else gpu_bytes <= inputs.gpu_memory_bytes


def plan_stage(inputs: PlanInputs, stage: int, offload_optimizer: str | None = None,
               offload_params: str | None = None) -> tuple[StagePlan, tuple[str, ...]]:
    """One stage with the given offload (default: the inputs'), and the notes on what was adjusted."""
    opt_dev, param_dev, notes = _modeled_offload(
        stage, inputs.offload_optimizer if offload_optimizer is None else offload_optimizer,
        inputs.offload_params if offload_params is None else offload_params, inputs.convention)
    shape = inputs.activations  # an ActivationShape once __post_init__ has run
    acts = activation_bytes(shape, inputs.dtype) if isinstance(shape, ActivationShape) else 0
    build = _deepspeed_stage if inputs.convention == "deepspeed" else _paper_stage
    return build(inputs, stage, opt_dev, param_dev, acts), tuple(notes)


# The ladder, fastest first: no offload first, smallest stage first; then offload, fastest first. No
# ZeRO-1: ZeRO-2 fits wherever it does and moves the same volume (see the module docstring).
_LADDER = ((0, "none", "none"), (2, "none", "none"), (3, "none", "none"),
           (2, "cpu", "none"), (3, "cpu", "none"), (3, "cpu", "cpu"), (3, "nvme", "nvme"))


def _describe(stage: int, opt_dev: str = "none", param_dev: str = "none") -> str:
    name = "DDP (stage 0)" if stage == 0 else f"ZeRO-{stage}"
    where = {"cpu": "CPU", "nvme": "NVMe"}
    if opt_dev != "none" and opt_dev == param_dev:
        return f"{name} with optimizer and parameters offloaded to {where[opt_dev]}"
    moved = [f"{what} offloaded to {where[dev]}"
             for what, dev in (("optimizer", opt_dev), ("parameters", param_dev)) if dev != "none"]
    return name + (" with " + " and ".join(moved) if moved else "")


def _short(sp: StagePlan, say_no_offload: bool = False) -> str:
    name = "DDP" if sp.stage == 0 else f"ZeRO-{sp.stage}"
    if sp.offload != "none":
        return f"{name} ({sp.offload})"
    return f"{name} without offload" if say_no_offload and sp.stage else name


def _offload_asked(inputs: PlanInputs) -> bool:
    return inputs.offload_optimizer != "none" or inputs.offload_params != "none"


def _not_in_table(quoted: list[StagePlan], table: tuple[StagePlan, ...], inputs: PlanInputs) -> str:
    """A sentence naming the plans a reason quotes that the table (what was asked for) has no row for.

    The ladder weighs every stage without offload before any offload, and every stage whatever
    ``--stage`` asked for, so a reason can quote numbers the table does not show; it says which.
    """
    shown = {(sp.stage, sp.offload) for sp in table}
    missing: list[StagePlan] = []
    for sp in quoted:
        if (sp.stage, sp.offload) not in shown and all((m.stage, m.offload) != (sp.stage, sp.offload)
                                                       for m in missing):
            missing.append(sp)
    if not missing:
        return ""
    groups: dict[str, list[str]] = {}  # offload -> stage names: no offload first, then by stage
    for sp in sorted(missing, key=lambda sp: (sp.offload != "none", sp.stage)):
        groups.setdefault(sp.offload, []).append("DDP" if sp.stage == 0 else f"ZeRO-{sp.stage}")
    parts = []
    for offload, names in groups.items():
        listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        if offload == "none":
            parts.append(listed + (" without offload" if _offload_asked(inputs) and names != ["DDP"] else ""))
        else:
            parts.append(f"{listed} ({offload})")
    asked_stages = [sp.stage for sp in table]
    if all(sp.stage not in asked_stages for sp in missing):
        shows = ("only stage " if len(asked_stages) == 1 else "only stages ") + \
            " and ".join(", ".join(map(str, asked_stages)).rsplit(", ", 1))
    elif all(sp.stage in asked_stages for sp in missing):
        asked = ",".join(f"{what}={dev}" for what, dev in (("optimizer", inputs.offload_optimizer),
                                                             ("params", inputs.offload_params)) if dev != "none")
        shows = f"the offload asked for ({asked or 'none'})"
    else:
        shows = "only the stages and offload asked for"
    verb = "are" if len(missing) > 1 else "is"
    sentence = f"{', and '.join(parts)} {verb} not in the table above, which shows {shows}"
    if _offload_asked(inputs) and "none" in groups:
        sentence += ": the recommendation weighs every stage without offload before any offload"
    return sentence[0].upper() + sentence[1:] + "."


def _cost_note(stage: int, opt_dev: str, param_dev: str) -> str:
    if opt_dev == "nvme":
        return ("expect slower steps than without offload: the optimizer state moves between NVMe, CPU and "
                "GPU every step; needs a fast NVMe drive")
    if opt_dev == "cpu":
        return ("expect slower steps than without offload: the optimizer step runs on the CPU and its state "
                "crosses PCIe every step; enable pin_memory")
    if stage == 0:
        return "no ZeRO needed: the least communication"
    if stage == 2:
        return ("no offload needed; ZeRO-2 moves the same volume per step as DDP's all-reduce (the ZeRO "
                "paper, Rajbhandari et al. 2020, §7)")
    return "no offload needed; ZeRO-3 adds a parameter all-gather per forward and backward (~1.5x DDP's volume)"


def _recommend(inputs: PlanInputs, table: tuple[StagePlan, ...]) -> Recommendation:
    ladder = [rung for rung in _LADDER if inputs.convention != "deepspeed" or rung[1] != "nvme"]
    scope = "" if inputs.activations is not None else " (model states only: no activations given)"
    if inputs.gpu_memory_bytes is None:
        stage = 3 if inputs.params > LARGE_MODEL_PARAMS else 2
        return Recommendation(stage, "none", "none",
                              "no GPU memory given, so a rule of thumb: ZeRO-2 up to 30B parameters, "
                              "ZeRO-3 above; give the GPU memory to check the estimate against it")
    capacity = inputs.gpu_memory_bytes
    budget = int(capacity * (1 - inputs.headroom_fraction))
    plans = [plan_stage(inputs, *rung)[0] for rung in ladder]
    by_stage = {sp.stage: sp for sp in plans if sp.offload == "none"}
    zero1 = plan_stage(inputs, 1, "none", "none")[0]  # not a rung, but users weigh it against ZeRO-2
    pct = round(inputs.headroom_fraction * 100)
    explicit = _offload_asked(inputs)  # then "ZeRO-2" alone would read as the table's offloaded row

    for sp in plans:
        if sp.gpu_bytes <= budget:
            what = _short(sp, explicit) if sp.offload == "none" else _describe(
                sp.stage, sp.offload_optimizer, sp.offload_params)
            reason = (f"{what} is the first choice that fits (fastest first): {format_bytes(sp.gpu_bytes)} "
                      f"of {format_bytes(capacity)} per GPU{scope}, leaving at least {pct}% headroom")
            if sp.cpu_bytes and sp.offload != "none":
                reason += f", and {format_bytes(sp.cpu_bytes)} of host memory per node"
            if sp.nvme_bytes:
                reason += f" and {format_bytes(sp.nvme_bytes)} of NVMe per node"
            zero1_fits_too = sp.stage == 2 and sp.offload == "none" and zero1.gpu_bytes <= budget
            before = plans[: plans.index(sp)]
            if before and not zero1_fits_too:
                before.insert(1, zero1)  # after DDP, in the order of the stages
            if before:
                reason += " (" + "; ".join(f"{_short(b, explicit)} needs {format_bytes(b.gpu_bytes)}"
                                           for b in before) + ")"
            reason += f"; {_cost_note(sp.stage, sp.offload_optimizer, sp.offload_params)}"
            if zero1_fits_too:
                reason += (f"; ZeRO-1 fits too ({format_bytes(zero1.gpu_bytes)}) and can be faster with gradient "
                           "accumulation: DeepSpeed's ZeRO-1 reduces gradients once per optimizer step, ZeRO-2 "
                           "after every micro-batch")
            quoted = [*before, sp] + ([zero1] if zero1_fits_too else [])
            unshown = _not_in_table(quoted, table, inputs)
            return Recommendation(sp.stage, sp.offload_optimizer, sp.offload_params,
                                  reason + (f". {unshown}" if unshown else ""))
    tight = next((sp for sp in plans if sp.fits), None)
    if tight is not None:
        what = _describe(tight.stage, tight.offload_optimizer, tight.offload_params)
        unshown = _not_in_table([tight], table, inputs)
        return Recommendation(tight.stage, tight.offload_optimizer, tight.offload_params,
                              f"{what} fits, but tightly: {format_bytes(tight.gpu_bytes)} of "
                              f"{format_bytes(capacity)} per GPU{scope} leaves less than {pct}% for the CUDA context, "
                              f"communication buffers and fragmentation; reduce activations (activation "
                              f"checkpointing, smaller micro-batch) or add GPUs" + (f". {unshown}" if unshown else ""))
    least = min(plans, key=lambda sp: sp.gpu_bytes)
    what = _describe(least.stage, least.offload_optimizer, least.offload_params)
    reason = (f"nothing fits: even {what} needs {format_bytes(least.gpu_bytes)} per GPU of "
              f"{format_bytes(capacity)}")
    if least.activations_bytes >= budget:
        reason += f"; activations alone need {format_bytes(least.activations_bytes)}: use activation " \
                  "checkpointing or a smaller micro-batch or sequence"
    else:
        reason += "; add GPUs, or reduce activations (activation checkpointing, smaller micro-batch)"
    if 3 in by_stage:
        reason += f" (ZeRO-3 without offload needs {format_bytes(by_stage[3].gpu_bytes)})"
    unshown = _not_in_table([least] + ([by_stage[3]] if 3 in by_stage else []), table, inputs)
    return Recommendation(least.stage, least.offload_optimizer, least.offload_params,
                          reason + (f". {unshown}" if unshown else ""))


def plan(inputs: PlanInputs) -> PlanResult:
    """Every requested stage with the requested offload (where the stage supports it), and a recommendation."""
    stages: list[StagePlan] = []
    notes: list[str] = []
    for stage in inputs.stages:
        stage_plan, stage_notes = plan_stage(inputs, stage)
        stages.append(stage_plan)
        notes.extend(n for n in stage_notes if n not in notes)
    if inputs.largest_layer_params is None and 3 in inputs.stages:
        notes.append("largest layer unknown: ZeRO-3's gathered-layer term (4 bytes x largest layer) is left out"
                     if inputs.convention == "deepspeed" else
                     "largest layer unknown: ZeRO-3 shows the paper's formula without the gathered layer")
    return PlanResult(inputs, tuple(stages), _recommend(inputs, tuple(stages)), tuple(notes))


def smallest_fitting_stage(result: PlanResult) -> int | None:
    """The smallest planned stage whose GPU total fits the capacity (no headroom); None if none or unknown."""
    return next((sp.stage for sp in sorted(result.stages, key=lambda sp: sp.stage) if sp.fits), None)

