"""What the test scenarios print for their tests to read."""

from __future__ import annotations

import sys


def say(text: str) -> None:
    """``text`` as one line, in one write: under PYTHONUNBUFFERED, print() writes the text and its newline apart,
    and two ranks sharing the launcher's output could run their lines together ("STEP 3HUNG"), hiding a cue."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
