"""The backlog per commitment: model, commitment, records waiting and the oldest one's age."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from veritap.v1 import verifier_pb2

from tui import formats
from tui.widgets.keyed_table import KeyedTable


class BacklogTable(KeyedTable):
    def on_mount(self) -> None:
        self.add_column("Model", width=14)
        self.add_column("Commitment", width=12)
        self.add_column("Pending", width=8)
        self.add_column("Oldest", width=8)

    def show_backlog(
        self, backlog: Iterable[verifier_pb2.CommitmentBacklog], names: Mapping[str, str]
    ) -> None:
        """One row per commitment; `names` maps a commitment id to its served model names."""
        self.show_rows(
            [
                (
                    b.commitment_id,
                    (
                        names.get(b.commitment_id, "?"),
                        formats.short_id(b.commitment_id),
                        formats.count(b.pending),
                        formats.age(b.oldest_pending_age_ns),
                    ),
                )
                for b in backlog
            ]
        )
