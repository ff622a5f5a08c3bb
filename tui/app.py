"""veritap-tui: the operator console for a verifierd and its collectors.

    veritap-tui --verifier 10.0.0.5:50061 --collector edge-1=10.0.0.7:50051 \
                --ca ca.pem --cert operator.pem --key operator.key

Keys: 1-7 switch screens (Overview, Pending, Verdicts, Failures, Models, Settings,
Provers), Enter opens a record, Escape goes back, r refreshes, q quits. Built for an
80x24 terminal over SSH; everything comes from the daemons over gRPC (tui.client).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.screen import Screen
from veritap.control_chars import escape_controls
from veritap.tls import ClientTls, TlsConfigError
from veritap.version import package_version

from tui.client import ConsoleClient, Endpoint, Health
from tui.live_stream import LiveStream
from tui.screens.failures import FailuresScreen
from tui.screens.models import ModelsScreen
from tui.screens.overview import OverviewScreen
from tui.screens.pending import PendingScreen
from tui.screens.provers import ProversScreen
from tui.screens.record import RecordScreen
from tui.screens.settings import SettingsScreen
from tui.screens.verdicts import VerdictsScreen
from tui.widgets.nav_bar import NAVIGATION

DEFAULT_VERIFIER = "127.0.0.1:50061"


class VeritapConsole(App[None]):
    CSS_PATH = "console.tcss"
    TITLE = "veritap"
    ENABLE_COMMAND_PALETTE = False
    MODES: ClassVar[dict[str, type[Screen[None]]]] = {  # type: ignore[assignment]
        "overview": OverviewScreen,
        "pending": PendingScreen,
        "verdicts": VerdictsScreen,
        "failures": FailuresScreen,
        "models": ModelsScreen,
        "settings": SettingsScreen,
        "provers": ProversScreen,
    }
    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(key, f"switch_mode('{mode}')", label, show=False)
            for key, mode, label in NAVIGATION
        ),
        Binding("q", "quit", "Quit"),
    ]

    #: The banner text while a daemon does not answer ("" when all do).
    outage: reactive[str] = reactive("")

    def __init__(self, client: ConsoleClient, *, refresh_s: float = 2.0) -> None:
        super().__init__()
        self.client = client
        self.refresh_s = refresh_s
        self.live = LiveStream(client.watch)
        #: Prover alarms as they are raised and cleared (WatchAlarms).
        self.alarms = LiveStream(client.watch_alarms)
        self._down: dict[str, str] = {}

    def on_mount(self) -> None:
        self.client.add_health_listener(self._health)
        self.switch_mode("overview")
        self.run_worker(self.live.run(), name="watch-verdicts", group="watch")
        self.run_worker(self.alarms.run(), name="watch-alarms", group="watch")

    async def on_unmount(self) -> None:
        await self.client.aclose()

    def _health(self, health: Health) -> None:
        if health.reachable:
            if self._down.pop(health.name, None) is not None:
                self.notify(
                    escape_controls(f"{health.name} answers again"),
                    title="reconnected",
                    markup=False,
                )
        else:
            self._down[health.name] = health.code
        self.outage = banner_text(self._down)

    def open_record(self, record_id: str, origin: str) -> None:
        self.push_screen(RecordScreen(record_id, origin, self.current_mode))


def banner_text(down: dict[str, str]) -> str:
    if not down:
        return ""
    who = ", ".join(f"{name} ({code})" for name, code in sorted(down.items()))
    return f"⚠ not answering: {who}. Retrying; what is shown is from before it went away."


def _collector(text: str) -> Endpoint:
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise argparse.ArgumentTypeError(f"expected NAME=HOST:PORT, got {text!r}")
    return Endpoint(name, address)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="veritap-tui", description="veritap operator console (Textual)"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.add_argument("--verifier", default=DEFAULT_VERIFIER, help="verifierd's host:port")
    parser.add_argument("--verifier-name", default="verifierd", help="how to name it")
    parser.add_argument(
        "--collector",
        action="append",
        type=_collector,
        default=[],
        metavar="NAME=HOST:PORT",
        help="a collector's LedgerService (repeat for each)",
    )
    parser.add_argument("--ca", type=Path, help="CA certificate of the daemons")
    parser.add_argument("--cert", type=Path, help="this operator's client certificate")
    parser.add_argument("--key", type=Path, help="this operator's client key")
    parser.add_argument("--server-name", help="name to check in the daemons' certificates")
    parser.add_argument("--refresh", type=float, default=2.0, help="seconds between refreshes")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds per call")
    return parser


def client_from_args(args: argparse.Namespace) -> ConsoleClient:
    tls = None
    if args.ca is not None:
        tls = ClientTls(ca=args.ca, cert=args.cert, key=args.key, server_name=args.server_name)
    elif args.cert is not None or args.key is not None:
        raise TlsConfigError("--cert and --key need --ca")
    return ConsoleClient(
        Endpoint(args.verifier_name, args.verifier),
        args.collector,
        tls=tls,
        timeout_s=args.timeout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        client = client_from_args(args)
    except TlsConfigError as exc:
        print(f"veritap-tui: {exc}", file=sys.stderr)
        return 2
    VeritapConsole(client, refresh_s=args.refresh).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
