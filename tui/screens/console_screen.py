"""The frame every console screen shares: navigation line, connection banner, body, footer.

A screen fetches its data in :meth:`ConsoleScreen.load` (through the app's client), on
mount, when shown again, every refresh interval while it is the current screen, and on
``r``. Loads run as exclusive workers, so a slow daemon never blocks keys; while a daemon
is away the screen keeps its last data and the banner says so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.notifications import SeverityLevel
from textual.screen import Screen
from textual.widgets import Footer
from veritap.control_chars import escape_controls

from tui.client import CallRefusedError, ConsoleClient, DaemonUnavailableError
from tui.widgets.connection_banner import ConnectionBanner
from tui.widgets.nav_bar import NavBar

if TYPE_CHECKING:
    from tui.app import VeritapConsole


class ConsoleScreen(Screen[None]):
    #: The navigation entry lit while this screen shows.
    NAV: ClassVar[str] = ""
    #: Reload every refresh interval (screens fed by the live verdict stream do not).
    POLL: ClassVar[bool] = True
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("r", "reload", "Refresh"),
    ]

    def __init__(self) -> None:
        super().__init__()
        #: Successful loads so far (tests wait for the first).
        self.loads = 0

    @property
    def console(self) -> VeritapConsole:
        from tui.app import VeritapConsole

        return cast(VeritapConsole, self.app)

    @property
    def client(self) -> ConsoleClient:
        return self.console.client

    def nav(self) -> str:
        return self.NAV

    def compose(self) -> ComposeResult:
        yield NavBar(self.nav())
        yield ConnectionBanner(id="banner")
        yield from self.compose_body()
        yield Footer()

    def compose_body(self) -> ComposeResult:
        raise NotImplementedError

    async def load(self) -> None:
        """Fetch this screen's data and show it (raises the client's errors)."""
        raise NotImplementedError

    def tell(
        self,
        message: str,
        *,
        title: str,
        severity: SeverityLevel = "information",
        timeout: float | None = None,
    ) -> None:
        """A notification that may quote the daemons: shown literally, escaped."""
        self.notify(
            escape_controls(message),
            title=escape_controls(title),
            severity=severity,
            timeout=timeout,
            markup=False,
        )

    def on_mount(self) -> None:
        self.set_interval(self.console.refresh_s, self._tick)
        self.action_reload()

    def on_screen_resume(self) -> None:
        self.action_reload()

    def _tick(self) -> None:
        if self.POLL and self.is_current:
            self.action_reload()

    def action_reload(self) -> None:
        self._load()

    @work(exclusive=True, group="load")
    async def _load(self) -> None:
        try:
            await self.load()
        except DaemonUnavailableError:
            return  # the banner says so; the last data stays
        except CallRefusedError as exc:
            self.tell(str(exc), title="verifierd refused", severity="error")
            return
        self.loads += 1
