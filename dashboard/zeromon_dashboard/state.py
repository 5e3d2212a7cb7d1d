"""The page state that lives in the URL (page, ranks, step), so that a link pasted to a colleague opens
the same view: ``/memory?ranks=0,3&step=12``. Pure: text in, values out, and back."""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import parse_qs, urlencode

from zeromon.model.classes import frozen

PAGES = ("overview", "memory", "communication", "ranks", "hang", "planner", "trace")
RANKS_MAX = 64  # ranks a page draws side by side (the grid shows them all)


@frozen
class PageState:
    page: str = "overview"
    ranks: tuple[int, ...] = ()  # () = the page's default (the worst ranks)
    step: int | None = None  # the step index as recorded (shown from 1); None = the page's default
    extra: tuple[tuple[str, str], ...] = ()  # other query keys, kept as given (the planner's form)

    def with_(self, **changes: object) -> PageState:
        return replace(self, **changes)  # type: ignore[arg-type]

    def get(self, key: str, default: str | None = None) -> str | None:
        return next((v for k, v in self.extra if k == key), default)


def page_of(pathname: str | None, prefix: str = "/") -> str:
    """'/memory' or '/prefix/memory/' -> 'memory'; anything unknown -> 'overview'."""
    path = pathname or "/"
    if prefix != "/" and path.startswith(prefix.rstrip("/")):
        path = path[len(prefix.rstrip("/")):]
    name = path.strip("/").split("/")[0] if path.strip("/") else "overview"
    return name if name in PAGES else "overview"


def _ints(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        low, dash, high = part.partition("-")
        if low.isdigit() and dash and high.isdigit() and int(high) >= int(low):
            out.extend(range(int(low), min(int(high), int(low) + RANKS_MAX - 1) + 1))
        elif part.isdigit():
            out.append(int(part))
    return tuple(dict.fromkeys(out))[:RANKS_MAX]


def parse_state(pathname: str | None, search: str | None, prefix: str = "/") -> PageState:
    """Never raises: a hand-edited URL with nonsense in it gives the defaults for what it spoils."""
    query = parse_qs((search or "").lstrip("?"), keep_blank_values=False)
    ranks = _ints(query["ranks"][-1]) if "ranks" in query else ()
    step_text = query.get("step", [""])[-1]
    step = int(step_text) - 1 if step_text.isdigit() and int(step_text) >= 1 else None  # shown from 1
    extra = tuple((k, v[-1]) for k, v in sorted(query.items()) if k not in ("ranks", "step"))
    return PageState(page=page_of(pathname, prefix), ranks=ranks, step=step, extra=extra)


def state_search(state: PageState) -> str:
    """The query string for a state ('' for the defaults), steps written from 1 as the pages show them."""
    pairs: list[tuple[str, str]] = []
    if state.ranks:
        pairs.append(("ranks", ",".join(str(r) for r in state.ranks)))
    if state.step is not None:
        pairs.append(("step", str(state.step + 1)))
    pairs.extend(state.extra)
    return "?" + urlencode(pairs, safe=",") if pairs else ""
