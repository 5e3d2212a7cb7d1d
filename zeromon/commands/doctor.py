"""`zeromon doctor [--prometheus URL] [--json]`: what zeromon can see on this machine and what it will not
be able to measure, each with the reason and the fix. Exit 0 when the essentials are there, 1 when not."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from typing import TYPE_CHECKING

from zeromon.errors import ZeromonError

if TYPE_CHECKING:
    from zeromon.sources.doctor import AgentEndpoint, Check

NAME = "doctor"
HELP = "what zeromon can see here (torch, CUDA, NVML, DeepSpeed, ports, terminal) and what it cannot measure"
EXIT_ESSENTIAL_MISSING = 1
_MARKS = {"ok": "ok", "missing": "MISSING", "warn": "warn", "info": "info"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check what zeromon can see on this machine: Python, torch and its distributed backends (gloo, nccl, "
        "mpi), CUDA and the NVIDIA driver (NVML), DeepSpeed, the agents' port range, the registry of running "
        "agents, a Prometheus server (--prometheus) and the terminal the TUI draws in. Each line says what "
        "was found; what is missing says what zeromon then cannot measure and how to fix it. Essential: "
        "Python 3.10+, torch with torch.distributed and a backend (gloo or nccl), and the Prometheus server when "
        "one is given. Exit 0 when they are there, 1 when not; every probe gives up after a few seconds.")
    parser.add_argument("--prometheus", metavar="URL", type=_http_url,
                        help="also check that this Prometheus server answers (e.g. http://localhost:9090)")
    parser.add_argument("--json", action="store_true", help="one JSON object instead of text")


def _http_url(text: str) -> str:
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ZeromonError(f"--prometheus {text!r}: not an http(s) URL",
                           hint="the Prometheus server's base URL, e.g. http://localhost:9090")
    try:
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise ZeromonError(f"--prometheus {text!r}: {exc}", hint="e.g. http://localhost:9090") from None
    return text.strip()


def _agent_endpoint() -> AgentEndpoint:
    """The agents' endpoint settings, read by the agent's own parser (a bad value: its default, as in a rank)."""
    from zeromon.sources.doctor import AgentEndpoint
    from zeromon_agent import load_config

    config = load_config(notices=[])
    return AgentEndpoint(enabled=config.enabled and config.endpoint, bind=config.bind, port=config.port,
                         tries=config.port_tries)


def run(args: argparse.Namespace) -> int:
    from zeromon.sources.doctor import essentials_ok, run_checks

    checks = run_checks(_agent_endpoint(), prometheus=args.prometheus)
    ok = essentials_ok(checks)
    if args.json:
        print(json.dumps({"essentials_ok": ok, "checks": [c.to_dict() for c in checks]}, indent=1))
    else:
        _print_text(checks, ok)
    return 0 if ok else EXIT_ESSENTIAL_MISSING


def _print_text(checks: list[Check], ok: bool) -> None:
    width = max(len(c.name) for c in checks)
    print("zeromon doctor: what zeromon can see on this machine, and what it cannot measure here")
    for c in checks:
        essential = "  (essential)" if c.essential else ""
        print(f"  {_MARKS.get(c.status, c.status):<7}  {c.name:<{width}}  {c.found}{essential}")
        if c.costs:
            print(f"  {'':<7}  {'':<{width}}  without it: {c.costs}")
        if c.fix:
            print(f"  {'':<7}  {'':<{width}}  fix: {c.fix}")
    failed = [c.name for c in checks if c.failed]
    if ok:
        print("essentials: all there (Python, torch with torch.distributed and a backend"
              + (", the Prometheus server" if any(c.name == "prometheus" for c in checks) else "") + ")")
    else:
        print(f"essentials missing: {', '.join(failed)}", file=sys.stderr)
    sys.stdout.flush()
