"""A DataTable whose rows have stable keys, refreshed without losing the cursor.

DataTable reads a ``str`` cell as markup; every ``str`` cell here is shown literally
instead (:func:`tui.formats.shown`), so a table can take the daemons' strings as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual.binding import Binding, BindingType
from textual.widgets import DataTable

from tui import formats

Cell = str | Text
Row = tuple[str, Sequence[Cell]]


class KeyedTable(DataTable[Cell]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Select", show=False),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=True)
        self._shown: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def show_rows(self, rows: Sequence[Row]) -> None:
        """Replace the rows (a no-op when nothing changed); the cursor stays on the row
        with the same key when it is still there."""
        shown = tuple((key, tuple(str(c) for c in cells)) for key, cells in rows)
        if shown == self._shown:
            return
        self._shown = shown
        keep = self.current_key()
        self.clear()
        for key, cells in rows:
            self.add_row(*(formats.shown(c) if isinstance(c, str) else c for c in cells), key=key)
        if keep is not None and keep in {key for key, _ in rows}:
            self.move_cursor(row=self.get_row_index(keep), animate=False)

    def current_key(self) -> str | None:
        if not self.row_count:
            return None
        key = self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        return key


class OpenableTable(KeyedTable):
    """A table whose rows open a record (Enter)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select_cursor", "Open record"),
    ]
