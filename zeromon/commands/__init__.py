"""The `zeromon` subcommands: one module each, with NAME, HELP, add_arguments(parser) and run(args).

Modules are imported when the parser is built; keep their top-level imports light (import heavy
libraries inside ``run``).
"""

from __future__ import annotations

# The order is the order of `zeromon --help`.
COMMAND_MODULES: tuple[str, ...] = (
    "zeromon.commands.demo",
    "zeromon.commands.run",
    "zeromon.commands.summary",
    "zeromon.commands.lint",
    "zeromon.commands.plan",
    "zeromon.commands.whatif",
    "zeromon.commands.report",
    "zeromon.commands.export",
    "zeromon.commands.targets",
    "zeromon.commands.live",
    "zeromon.commands.hang",
    "zeromon.commands.attach",
    "zeromon.commands.dashboard",
    "zeromon.commands.doctor",
)
