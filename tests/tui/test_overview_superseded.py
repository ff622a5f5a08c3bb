"""The Overview's verdict counts when an amendment supersedes a verdict, against real
daemons: each record counts once, by its current verdict, and the superseded verdicts are
counted beside them."""

from __future__ import annotations

import asyncio
import re

import pytest
from textual.widgets import Static

from tests.recorded_traffic import BASE_NS, SECOND
from tests.tui.daemons import Daemons
from tests.tui.pilot_waits import loaded, shown_text, until
from tests.verifierd.provers.prover_fixtures import amend, dishonest
from tui.app import VeritapConsole
from verifierd.provers.identity import ProverKey

pytestmark = pytest.mark.timeout(120)

SIZE = (80, 24)
PROVER = ProverKey("edge-2.lab", "10.20.2.50", 8000)


def summary_counts(app: VeritapConsole) -> dict[str, int]:
    """Each number the verifier summary names: PASS, FAIL, ..., and amendments (superseded)."""
    text = shown_text(app.screen.query_one("#verifier-summary", Static))
    found = re.findall(r"(PASS|FAIL|UNVERIFIABLE|SKIPPED|ERROR|amendments) (\d+)", text)
    return {name: int(number) for name, number in found}


async def test_a_withdrawn_fail_leaves_the_fail_count_and_is_counted_as_superseded(
    prover_daemons: Daemons,
) -> None:
    (record_id,) = prover_daemons.judge(PROVER, [dishonest(50, BASE_NS)])
    app = VeritapConsole(prover_daemons.client(), refresh_s=3600)
    async with app.run_test(size=SIZE) as pilot:
        screen = await loaded(pilot)
        before = summary_counts(app)
        assert before["amendments"] == 0 and before["FAIL"] > 0

        await asyncio.to_thread(
            amend,
            prover_daemons.store,
            prover_daemons.signer,
            PROVER,
            record_id,
            BASE_NS + 60 * SECOND,
        )
        loads = screen.loads
        await pilot.press("r")
        await until(pilot, lambda: screen.loads > loads, "the overview to reload")

        after = summary_counts(app)
        assert after["amendments"] == 1
        assert after["FAIL"] == before["FAIL"] - 1
        # The amended record (record_amended) and the amendment itself (amendment).
        assert after["UNVERIFIABLE"] == before["UNVERIFIABLE"] + 2
        assert after["PASS"] == before["PASS"]
