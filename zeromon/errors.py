"""The one error type zeromon raises for bad input, caught once by the CLI (exit code 2)."""

from __future__ import annotations

EXIT_USAGE = 2


class ZeromonError(Exception):
    """A problem the user can fix: what is wrong (naming the file, line, key or flag) and a hint."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"
