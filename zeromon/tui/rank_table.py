"""The ranks table: a line-API widget that draws only the rows on screen and re-renders only the rows
that changed.

Textual's DataTable re-renders every visible cell through Rich whenever any cell changes (its
render cache is keyed on a table-wide update count): with live data every row changes every poll,
and a screenful of rows is a visible pause a refresh (tests/bench/bench_tui.py). Here a row is one
Strip built from plain strings, cached by its content, so a refresh costs only the rows that changed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.cells import set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from zeromon.views.fleet import Column

GAP = 1  # blank cells after a column: one, so that nine columns fit 80 (a rank cell starts with its marks' slot)


class RankTable(ScrollView, can_focus=True):
    """Rows of (key, cells, style); the header stays on top, the first ``fixed`` columns on the left."""

    COMPONENT_CLASSES = {"rank-table--header", "rank-table--cursor", "rank-table--odd"}
    DEFAULT_CSS = """
    RankTable {
        background: $surface;
    }
    RankTable > .rank-table--header {
        text-style: bold;
        background: $panel;
        color: $foreground;
    }
    RankTable > .rank-table--cursor {
        background: $block-cursor-background;
    }
    RankTable:blur > .rank-table--cursor {
        background: $block-cursor-blurred-background;
    }
    RankTable > .rank-table--odd {
        background: $surface-lighten-1 40%;
    }
    """
    BINDINGS = [
        Binding("up", "cursor(-1)", "up", show=False),
        Binding("down", "cursor(1)", "down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home,ctrl+home", "ends(-1)", "first", show=False),
        Binding("end,ctrl+end", "ends(1)", "last", show=False),
        Binding("left", "sideways(-8)", "left", show=False),
        Binding("right", "sideways(8)", "right", show=False),
        Binding("enter", "select", "select", show=False),
    ]

    cursor_row: reactive[int] = reactive(0)

    class RowSelected(Message):
        """Enter, or a click on the highlighted row."""

        def __init__(self, table: RankTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

    class HeaderSelected(Message):
        def __init__(self, table: RankTable, column_key: str) -> None:
            super().__init__()
            self.table = table
            self.column_key = column_key

    def __init__(self, columns: Sequence[Column], fixed: int = 1, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.columns = tuple(columns)
        self.fixed = fixed
        self.row_keys: list[str] = []
        self._content: Callable[[int], tuple[tuple[str, ...], str]] = lambda index: ((), "")
        self._made: dict[int, tuple[tuple[str, ...], str]] = {}  # rows drawn since set_rows
        self._strips: dict[tuple[object, ...], Strip] = {}  # rendered rows, by content
        self._style_cache: dict[tuple[str, bool, bool], Style] = {}
        self._fixed_width = sum(c.width + GAP for c in self.columns[:fixed])
        self._total_width = sum(c.width + GAP for c in self.columns)
        self.empty_text = ""  # drawn, dimmed, where the rows would be when there are none (a filter matching none)
        self.virtual_size = Size(self._total_width, 1)

    # -- data

    @property
    def row_count(self) -> int:
        return len(self.row_keys)

    @property
    def selected_key(self) -> str | None:
        return self.row_keys[self.cursor_row] if 0 <= self.cursor_row < len(self.row_keys) else None

    def row(self, index: int) -> tuple[tuple[str, ...], str]:
        """(cells, style) of the row at ``index``, made when first needed: only rows on screen are."""
        made = self._made.get(index)
        if made is None:
            made = self._made[index] = self._content(index)
        return made

    def column_values(self, key: str) -> list[str]:
        column = next(i for i, c in enumerate(self.columns) if c.key == key)
        return [self.row(i)[0][column] for i in range(len(self.row_keys))]

    def row_style(self, key: str) -> str:
        return self.row(self.row_keys.index(key))[1]

    def set_rows(self, keys: Sequence[str], content: Callable[[int], tuple[tuple[str, ...], str]]) -> None:
        """New rows: their keys, and ``content(index) -> (cells, style)``, asked only for the rows
        drawn (formatting every cell of 256 ranks would cost more than drawing the 60 on screen).
        The cursor stays on the rank it was on, without scrolling."""
        selected = self.selected_key
        self.row_keys = list(keys)
        self._content, self._made = content, {}
        if len(self._strips) > 8 * max(64, len(keys)):
            self._strips.clear()  # old contents: bounded, whatever the churn
        self.virtual_size = Size(self._total_width, len(keys) + 1)
        if selected is not None and selected in self.row_keys:
            self.set_reactive(RankTable.cursor_row, self.row_keys.index(selected))
        elif self.cursor_row >= len(keys):
            self.set_reactive(RankTable.cursor_row, max(0, len(keys) - 1))
        self.refresh()

    # -- drawing

    def _style(self, spec: str, odd: bool, cursor: bool) -> Style:
        """A row's style: the table's, zebra, cursor, then the row's own (colour by level). Cached:
        Rich style arithmetic per line is most of what drawing a line would otherwise cost."""
        key = (spec, odd, cursor)
        style = self._style_cache.get(key)
        if style is None:
            style = self.rich_style
            if odd:
                style += self.get_component_rich_style("rank-table--odd")
            if cursor:
                style += self.get_component_rich_style("rank-table--cursor")
            style = self._style_cache[key] = style + (Style.parse(spec) if spec else Style())
        return style

    def notify_style_update(self) -> None:
        self._style_cache.clear()
        self._strips.clear()
        super().notify_style_update()

    def _on_focus(self, event: events.Focus) -> None:
        self.notify_style_update()  # the cursor's colour depends on focus
        super()._on_focus(event)

    def _on_blur(self, event: events.Blur) -> None:
        self.notify_style_update()
        super()._on_blur(event)

    def _line(self, cells: Sequence[str], style: Style, scroll_x: int, width: int) -> Strip:
        """One row as one segment: the fixed columns, then the others from scroll_x, to the width.
        (A Strip is the costly part; joining and cropping per line would make five.)"""
        gap = " " * GAP
        text = "".join(f"{set_cell_size(t, c.width)}{gap}" for c, t in zip(self.columns, cells, strict=True))
        fixed = self._fixed_width
        visible = text[:fixed] + text[fixed + scroll_x:fixed + scroll_x + max(0, width - fixed)]
        return Strip([Segment(set_cell_size(visible, width), style)], width)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        scroll_x, scroll_y = self.scroll_offset
        if y == 0:
            key: tuple[object, ...] = ("header", scroll_x, width)
            line = self._strips.get(key)
            if line is None:
                header = self.get_component_rich_style("rank-table--header")
                line = self._strips[key] = self._line([c.label for c in self.columns], header, scroll_x, width)
            return line
        index = scroll_y + y - 1
        if index >= len(self.row_keys):
            if y == 1 and not self.row_keys and self.empty_text:
                text = set_cell_size(f" {self.empty_text}", width)
                return Strip([Segment(text, self.rich_style + Style(dim=True, italic=True))], width)
            return Strip.blank(width, self.rich_style)
        odd, cursor = index % 2 == 1, index == self.cursor_row
        cells, spec = self.row(index)
        key = (cells, spec, odd, cursor, scroll_x, width)
        line = self._strips.get(key)
        if line is None:
            line = self._strips[key] = self._line(cells, self._style(spec, odd, cursor), scroll_x, width)
        return line

    def watch_cursor_row(self, old: int, new: int) -> None:
        self.refresh()

    # -- keys and mouse

    def _move_to(self, row: int) -> None:
        if not self.row_keys:
            return
        row = max(0, min(len(self.row_keys) - 1, row))
        self.cursor_row = row
        visible = max(1, self.size.height - 1)  # below the header
        top = self.scroll_offset.y
        if row < top:
            self.scroll_to(y=row, animate=False)
        elif row >= top + visible:
            self.scroll_to(y=row - visible + 1, animate=False)

    def action_cursor(self, delta: int) -> None:
        self._move_to(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self._move_to(self.cursor_row + direction * max(1, self.size.height - 2))

    def action_ends(self, direction: int) -> None:
        self._move_to(0 if direction < 0 else len(self.row_keys) - 1)

    def action_sideways(self, cells: int) -> None:
        self.scroll_to(x=max(0, self.scroll_offset.x + cells), animate=False)

    def action_select(self) -> None:
        key = self.selected_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        if offset.y == 0:
            x = offset.x if offset.x < self._fixed_width else offset.x + self.scroll_offset.x
            for column in self.columns:
                x -= column.width + GAP
                if x < 0:
                    self.post_message(self.HeaderSelected(self, column.key))
                    return
            return
        row = self.scroll_offset.y + offset.y - 1
        if row >= len(self.row_keys):
            return
        if row == self.cursor_row:
            self.action_select()
        else:
            self.cursor_row = row
