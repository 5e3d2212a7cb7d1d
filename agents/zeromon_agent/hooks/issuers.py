"""Who issued a collective: FSDP, DeepSpeed, DDP, torch itself, DTensor, or the user, read from the files of
the code that called ``torch.distributed``. A collective's ZeRO/FSDP meaning comes from it (step_acc.meaning_of):
a trainer's own gathers and object broadcasts, and the user's, have none whatever their op and size.

The wrapper takes the direct caller's file (``issuer_path``); where that is no framework's (a shim around
``torch.distributed``: a test's, a logger's), it looks a few frames further out for one, and stops at a module's
call (code inside a model's forward that issues a collective is the user's, whichever framework wraps the model).
"""

from __future__ import annotations

import types

FSDP, DEEPSPEED, DDP, TORCH, DTENSOR, USER = "fsdp", "deepspeed", "ddp", "torch", "dtensor", "user"
_ISSUER_PATHS = (
    ("/torch/distributed/fsdp/", FSDP),
    ("/deepspeed/", DEEPSPEED),
    ("/torch/nn/parallel/", DDP),
    ("/zeromon_agent/hooks/ddp.py", DDP),  # the agent's recording comm hook, which issues DDP's bucket all-reduces
    ("/torch/distributed/utils.py", TORCH),  # the module-state broadcasts of DDP's and FSDP's setup
    ("/torch/distributed/tensor/", DTENSOR),  # DTensor's redistributions (tensor parallelism): activations
    ("/torch/distributed/_functional_collectives", DTENSOR),
    ("/torch/distributed/", TORCH),  # c10d's own helpers
)
# Where the walk for a framework's frame stops: a module's call (torch.nn.Module._call_impl). Classified as its
# own kind, which issued nothing (a collective called from it is the user's).
_MODULE_CALL = "/torch/nn/modules/module.py"
_MODULE = "module"
# How many frames beyond the direct caller are looked at for a framework's: a shim is a function or two (a
# wrapper and its decorator); each frame is a cost on the training thread, for collectives users issue.
SHIM_DEPTH = 2
_issuers: dict[str, str] = {}
# The calling functions whose issuer is settled, with the file that stands for it: a framework's functions, and
# the user's own where the walk at their first call found no framework (the wrapper's one look-up). Shims and
# torch's object-collective helpers are not here: their issuer is their caller's, looked for at every call.
# By the code object's id, the code object kept beside its file (so that its id is not another's while here):
# hashing a code object hashes its bytecode, at every look-up.
FINAL: dict[int, tuple[types.CodeType, str]] = {}
_shims: dict[int, types.CodeType] = {}
# The files of torch.distributed's own helpers around the collectives (broadcast_object_list, the logging
# decorators): a collective called from them was issued by their caller. Set by collectives.install().
C10D_FILES: frozenset[str] = frozenset()


def issuer_of(path: str | None) -> str | None:
    """FSDP, DEEPSPEED, DDP, TORCH, DTENSOR or USER for the file of the code that called a collective (cached);
    None where no caller was kept (synthesized records)."""
    if path is None:
        return None
    kind = _kind(path)
    return USER if kind == _MODULE else kind


def _kind(path: str) -> str:
    kind = _issuers.get(path)
    if kind is None:
        unix = path.replace("\\", "/")
        kind = _MODULE if _MODULE_CALL in unix else next((who for part, who in _ISSUER_PATHS if part in unix), USER)
        if len(_issuers) < 4096:
            _issuers[path] = kind
    return kind


def issuer_path(frame: types.FrameType | None) -> str | None:
    """The file that stands for the issuer of a collective called from ``frame`` (the wrapper looks in FINAL
    first): out of torch's own helpers first; then the frame's own where it is a framework's, else the first
    framework's within SHIM_DEPTH frames out, not past a module's call, else its own (the user's)."""
    while frame is not None and frame.f_code.co_filename in C10D_FILES:
        frame = frame.f_back
    if frame is None:
        return None
    code = frame.f_code
    path = code.co_filename
    kind = _issuers.get(path) or _kind(path)
    if kind != USER and kind != _MODULE:
        _settle(code, path)
        return path
    found = _walk(frame.f_back)
    if found is not None:
        if len(_shims) < 65536:
            _shims[id(code)] = code
    elif id(code) not in _shims:
        _settle(code, path)
    return found if found is not None else path


def _settle(code: types.CodeType, path: str) -> None:
    if len(FINAL) < 65536 and code.co_filename not in C10D_FILES:
        FINAL[id(code)] = (code, path)


def _walk(outer: types.FrameType | None) -> str | None:
    """The file of the first framework's frame within SHIM_DEPTH frames from ``outer``, not past a module's call."""
    for _ in range(SHIM_DEPTH):
        if outer is None:
            return None
        outer_path = outer.f_code.co_filename
        kind = _issuers.get(outer_path) or _kind(outer_path)
        if kind == _MODULE:
            return None
        if kind != USER:
            return outer_path
        outer = outer.f_back
    return None
