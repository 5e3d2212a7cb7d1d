"""The addresses a command's endpoints bind: checked before anything starts, naming the flag."""

from __future__ import annotations

from zeromon.errors import ZeromonError
from zeromon.model.numbers import where


def check_bind(address: str, flag: str) -> None:
    """ZeromonError naming ``flag`` unless the ranks can listen on ``address``: the agent's own bind
    (zeromon_agent.serve.httpserver.bind), tried here on a free port."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    given = f"{flag} {address}" if flag.startswith("--") else f"{flag}={address}"
    hint = "e.g. 127.0.0.1 (the default), 0.0.0.0 (every interface) or an address of this machine"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except socket.gaierror as exc:
            raise ZeromonError(f"{given}: neither an IP address nor a host name that resolves ({exc.strerror})",
                               hint=hint) from None
        except (TypeError, UnicodeError, ValueError):  # "encoding of hostname failed": no host name has it
            raise ZeromonError(f"{where(flag, address)}: neither an IP address nor a host name", hint=hint) from None
        except OSError as exc:
            what = "not an address of this machine" if exc.errno == errno.EADDRNOTAVAIL else "cannot listen there"
            raise ZeromonError(f"{given}: {what} ({exc.strerror})", hint=hint) from None
