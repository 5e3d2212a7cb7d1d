"""The ports the tests' and benchmarks' servers listen on (a rank's rendezvous store, a Prometheus, a dashboard)
where the server cannot be asked for port 0 and tell its port back."""

from __future__ import annotations

import os
import random
import socket

from zeromon.demo.train import ephemeral_low

# The ports free_port() gives: below the kernel's ephemeral range, a block for each xdist worker, in turn.
PORT_FLOOR = 20000
_PORT_BLOCK = 1500
_next_port = [random.randrange(_PORT_BLOCK)]  # from a random place in the block: two sessions at once seldom meet


def free_port(count: int = 1) -> int:
    """A port no process on this machine listens on (the first of ``count`` in a row), for a server a test starts
    (a rank's rendezvous store, a Prometheus, a dashboard) and cannot ask for port 0.

    Not one that bind(("127.0.0.1", 0)) returns: the kernel hands that port out again to the next outgoing
    connection or endpoint that binds port 0, and a rank listens on it only seconds later, once torch is imported
    (EADDRINUSE at the rendezvous in CI, the other worker's runs connecting meanwhile). Ports below the ephemeral
    range (ip_local_port_range) are never handed out so; each xdist worker takes its own block of them, one after
    another, and skips any it cannot bind (another program's)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    blocks = max(1, (ephemeral_low() - PORT_FLOOR) // _PORT_BLOCK)
    first = PORT_FLOOR + (int(worker) % blocks if worker.isdigit() else 0) * _PORT_BLOCK
    for _ in range(_PORT_BLOCK):
        port = first + _next_port[0] % (_PORT_BLOCK - count + 1)
        _next_port[0] += count
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, sock in enumerate(sockets):
                sock.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
        return port
    raise RuntimeError(f"no {count} free ports in a row in {first}-{first + _PORT_BLOCK - 1}")
