"""`zeromon whatif`: what a change (resharding, overlap, bandwidth, micro-batch) would do to this run's step
time and peak memory, predicted from its own recording, with the replay's error beside it."""

from zeromon.analysis.whatif.answer import Figures, WhatIf, what_if
from zeromon.analysis.whatif.changes import Change, ChangeError, parse_change
from zeromon.analysis.whatif.model import Refused

__all__ = ["Change", "ChangeError", "Figures", "Refused", "WhatIf", "parse_change", "what_if"]
