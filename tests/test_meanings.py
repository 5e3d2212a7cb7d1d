"""A collective's ZeRO/FSDP meaning comes from what issued it (the file of the code that called
torch.distributed), then its op, phase and size: a trainer's own gathers and object broadcasts have none.
The real runs are in tests/test_frameworks.py (DDP with a trainer's traffic, FSDP1/2, DeepSpeed)."""

from __future__ import annotations

import pytest

from zeromon_agent.hooks.issuers import DDP, DEEPSPEED, DTENSOR, FSDP, TORCH, USER, issuer_of, issuer_path
from zeromon_agent.recorder.step_acc import meaning_of


@pytest.mark.parametrize(("path", "issuer"), [
    ("/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", FSDP),
    ("/venv/lib/python3.11/site-packages/torch/distributed/fsdp/_flat_param.py", FSDP),
    ("/venv/lib/python3.11/site-packages/deepspeed/comm/torch.py", DEEPSPEED),
    ("/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", DDP),
    ("/venv/lib/python3.11/site-packages/zeromon_agent/hooks/ddp.py", DDP),
    ("/venv/lib/python3.11/site-packages/torch/distributed/utils.py", TORCH),
    ("/venv/lib/python3.11/site-packages/torch/distributed/tensor/_collective_utils.py", DTENSOR),
    ("/venv/lib/python3.11/site-packages/accelerate/utils/operations.py", USER),
    ("/venv/lib/python3.11/site-packages/lightning/fabric/utilities/distributed.py", USER),
    ("/home/me/train.py", USER),
    ("C:\\venv\\Lib\\site-packages\\deepspeed\\comm\\torch.py", DEEPSPEED),
])
def test_the_issuer_is_read_from_the_callers_file(path: str, issuer: str) -> None:
    assert issuer_of(path) == issuer
    assert issuer_of(None) is None


def test_only_the_frameworks_collectives_have_zero_meanings() -> None:
    for issuer in (FSDP, DEEPSPEED, TORCH, None):  # None: a record without its caller, judged as before
        assert meaning_of("all_gather", "forward", 4096, issuer) == "param_all_gather"
        assert meaning_of("broadcast", "setup", 4096, issuer) == "param_broadcast"
    assert meaning_of("reduce_scatter", "backward", 4096, FSDP) == "grad_reduce_scatter"
    assert meaning_of("all_reduce", "backward", 4096, DDP) == "grad_all_reduce"
    assert meaning_of("all_gather", "forward", 4096, DDP) == "unknown"  # DDP gathers no parameters
    for op, phase in (("all_gather", "forward"), ("broadcast", "setup"), ("all_reduce", "backward"),
                      ("reduce_scatter", "backward")):
        assert meaning_of(op, phase, 1 << 20, USER) == meaning_of(op, phase, 1 << 20, DTENSOR) == "unknown"
    assert meaning_of("all_reduce", "backward", 8, FSDP) == "unknown"  # a flag or a norm, not gradients


def _call_through(*paths: str) -> str | None:
    """issuer_path as a collective's wrapper sees it, called from functions defined in ``paths`` (outermost
    first; the last is the direct caller)."""
    import sys

    namespace: dict[str, object] = {"probe": lambda: issuer_path(sys._getframe(1))}
    callee = "probe"
    for i, path in enumerate(reversed(paths)):
        exec(compile(f"def f{i}():\n    return {callee}()\n", path, "exec"), namespace)  # noqa: S102
        callee = f"f{i}"
    return namespace[callee]()  # type: ignore[operator]


def test_a_shim_around_torch_distributed_keeps_the_frameworks_issuer() -> None:
    fsdp = "/venv/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py"
    shim, user, module = "/home/me/shim.py", "/home/me/model.py", "/venv/site-packages/torch/nn/modules/module.py"
    assert _call_through(fsdp) == fsdp
    assert _call_through(fsdp, shim) == fsdp  # a logger's or a test's wrapper around the collective
    assert _call_through(fsdp, module, user) == user  # the user's code inside a wrapped model's forward
    assert _call_through(fsdp, user, user, user, user, user, shim) == shim  # too far out: the caller's own
