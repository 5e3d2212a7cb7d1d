"""How a scenario's rank ends once its work is done: the atexit handlers, then os._exit, without the
interpreter's finalization, where gloo can abort a rank that has finished.

A rank that ended its training could die by SIGABRT as its interpreter exited ("terminate called without
an active exception", exit -6; in CI now and then, with and without zeromon in the run). A core dump of it
(a 2-rank gloo loop run ~80 times on a loaded 2-core machine, 2026-11-26, torch 2.13) shows the way:

- the process group outlives ``destroy_process_group`` when anything still holds it, and then its gloo
  worker threads are not joined. Most training scripts hold it without knowing:
  ``torch.distributed.nn.functional`` declares its collectives with ``group=group.WORLD`` as a default
  argument, evaluated when the module is imported, and torch.optim imports it (through torch._dynamo) when
  the first optimizer is built; FSDP2's ``fully_shard`` and DeepSpeed (``deepspeed.utils.groups``, each ZeRO-3
  parameter's ``ds_process_group``) hold their groups too. So did zeromon's agent, until it stopped at exit
  (its recorder's per-group caches); it lets go of them, and of the model, when it stops;
- a worker drops its reference to a finished collective just after the waiting thread wakes. When that is the
  last reference to a tensor that has a Python object, the drop takes the GIL; once the interpreter is
  finalizing, Python answers with ``pthread_exit``, and its unwinding through the work's ``noexcept``
  destructor calls ``std::terminate``.

The scenarios' subject is the training and what zeromon records of it, so they leave the way a
multiprocessing child does: zeromon's atexit handler writes the recording's end as at any exit, and nothing
runs after it. The examples (``examples/``, the README's job under ``zeromon run``) keep the interpreter's
own exit; ``examples/tinygpt.py`` lets go of the default argument's group before that exit, which ends
the DDP and FSDP1 examples' gloo threads at ``destroy_process_group`` (tests/test_gloo_exit.py).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn


def leave() -> NoReturn:
    """End this rank after its main() returned: the atexit handlers, the standard streams flushed, exit 0."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
