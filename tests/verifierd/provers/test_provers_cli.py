"""`verifierd provers list|show` and `verifierd alarms clear` against a real service."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace

import pytest

from tests.service_pki import ADMIN_SUBJECT, CertFiles
from tests.verifierd.provers.conftest import Served
from tests.verifierd.provers.prover_fixtures import (
    CHEAT,
    CID,
    FLOAT32_TAILS,
    HONEST,
    dishonest,
    honest,
    unverifiable,
)
from verifierd.cli import build_parser


@dataclass
class Cli:
    served: Served
    capture: pytest.CaptureFixture[str]

    async def run(self, *args: str, who: CertFiles | None = None) -> tuple[int, str, str]:
        """The command in a worker thread, its output read from pytest's capture."""
        pki = self.served.pki
        who = who or pki.operator
        connection = [
            f"--address=localhost:{self.served.server.port}",
            f"--ca={pki.ca}",
            f"--cert={who.cert}",
            f"--key={who.key}",
        ]
        parsed = build_parser().parse_args([*args, *connection])
        self.capture.readouterr()
        code = await asyncio.to_thread(parsed.func, parsed)
        out, err = self.capture.readouterr()
        return code, out, err


@pytest.fixture
def cli(served: Served, capsys: pytest.CaptureFixture[str]) -> Cli:
    now = served.clock.now  # the service reports the windows at its own clock
    # Two greedy responses (they need no seed), one seeded sample, one sample without a seed.
    served.traffic.send(
        HONEST,
        [honest(100, now)] * 2 + [honest(100, now, sampled=True), unverifiable("no_seed", now)],
    )
    served.traffic.send(CHEAT, [dishonest(50, now)] * 10)
    return Cli(served, capsys)


async def test_list_names_each_prover_with_its_state(cli: Cli) -> None:
    code, out, err = await cli.run("provers", "list")
    assert (code, err) == (0, "")
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert set(lines) == {HONEST.label, CHEAT.label}
    assert "ALARM DISHONEST" in lines[CHEAT.label] and "ln E" in lines[CHEAT.label]
    assert "  ok  " in lines[HONEST.label] and "25.0% unverifiable" in lines[HONEST.label]
    code, out, _ = await cli.run("provers", "list", "--alarmed", "--json")
    [line] = out.splitlines()
    assert code == 0 and json.loads(line)["id"]["server_address"] == "fd00::2"


async def test_show_prints_windows_and_alarms(cli: Cli) -> None:
    code, out, _ = await cli.run("provers", "show", CHEAT.label)
    assert code == 0
    assert "FAIL score_over_threshold: 10" in out and "IN FORCE" in out
    [state] = cli.served.tables.alarms()
    assert state.alarm.alarm_id in out and state.alarm.record_ids[0] in out
    code, out, _ = await cli.run("provers", "show", HONEST.label, "--json")
    assert code == 0 and json.loads(out)["prover"]["id"]["server_port"] == 8000
    code, _, err = await cli.run("provers", "show", "edge/10.9.9.9:1")
    assert code == 1 and "NOT_FOUND" in err
    code, _, err = await cli.run("provers", "show", "no-port")
    assert code == 2 and "ORIGIN/ADDRESS:PORT" in err


async def test_show_gives_each_commitments_share_of_the_false_alarm_probability(
    cli: Cli,
) -> None:
    """The prover's second commitment is its second test, at a quarter of the first's share."""
    served = cli.served
    second = "cd" * 32
    served.tables.set_honest_tails(second, FLOAT32_TAILS, actor="calibration")
    served.traffic.send(HONEST, [replace(honest(100, served.clock.now), commitment_id=second)])
    code, out, _ = await cli.run("provers", "show", HONEST.label)
    assert code == 0
    [first_line, second_line] = [line for line in out.splitlines() if "    test " in line]
    assert first_line.startswith(f"    test 1 ({CID}): share 0.608 of")
    assert second_line.startswith(f"    test 2 ({second}): share 0.152 of")
    assert "1.52e-07 per day; ln E" in second_line and "over 100 tokens" in second_line
    [state] = served.tables.alarms()
    assert "the prover's test 1, share 0.608 of its 1e-06 per day" in state.alarm.detail


async def test_show_gives_the_share_of_sampled_verdicts_without_a_seed(cli: Cli) -> None:
    _, honest_out, _ = await cli.run("provers", "show", HONEST.label)
    _, cheat_out, _ = await cli.run("provers", "show", CHEAT.label)
    # Greedy verdicts are not in the denominator: 1 of the 2 sampled, not 1 of 4.
    assert "sampled without a seed: 50.0% of 2 sampled verdicts" in honest_out
    assert "sampled without a seed: 0.0% of 0 sampled verdicts" in cheat_out


async def test_clear_needs_the_admin_certificate(cli: Cli) -> None:
    [state] = cli.served.tables.alarms()
    clear = ("alarms", "clear", state.alarm.alarm_id, "--reason", "new weights deployed")
    code, _, err = await cli.run(*clear)
    assert code == 1 and "PERMISSION_DENIED" in err
    assert cli.served.tables.alarms() == [state]
    code, out, _ = await cli.run(*clear, who=cli.served.pki.admin)
    assert code == 0 and "CLEARED" in out and f"by {ADMIN_SUBJECT}: new weights" in out
    assert cli.served.tables.alarms() == []
    code, _, err = await cli.run(*clear, who=cli.served.pki.admin)
    assert code == 1 and "NOT_FOUND" in err
