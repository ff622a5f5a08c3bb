"""`verifierd verdicts list|get|watch` against the real service.

The service runs in the test's event loop over a store holding the recorded traffic, with
mutual TLS. One test runs the installed entry point as a separate process
(`python -m verifierd.cli`); the others run the command in a worker thread, since starting
`verifierd` imports every subcommand (torch among them: seconds per start).
"""

from __future__ import annotations

import argparse
import asyncio
import calendar
import datetime
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.v1 import log_pb2, record_pb2, verifier_pb2

from tests.recorded_traffic import (
    EXCHANGES,
    FAIL,
    PASS,
    PENDING,
    CommittedModel,
    by_record_id,
    install_committed_model,
    replay_into_store,
    verdict_for,
    verifier_signer,
)
from tests.service_pki import ADMIN_CN, ServicePki, write_service_pki
from verifierd.api import ServiceSettings, VerifierServer, start_verifier_service
from verifierd.commands import verdicts
from verifierd.commands.verdicts import parse_status, parse_time
from verifierd.commitments import CommitmentRegistry
from verifierd.store import Store, VerdictWrite
from verifierd.verdicts import sign_verdict

pytestmark = pytest.mark.timeout(150)


@dataclass
class Cli:
    store: Store
    server: VerifierServer
    pki: ServicePki
    model: CommittedModel
    capture: pytest.CaptureFixture[str]

    @property
    def commitment_id(self) -> str:
        return self.model.commitment.commitment_id

    def connection(self) -> list[str]:
        pki = self.pki
        return [
            f"--address=localhost:{self.server.port}",
            f"--ca={pki.ca}",
            f"--cert={pki.operator.cert}",
            f"--key={pki.operator.key}",
        ]

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "verifierd.cli",
            "verdicts",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    async def run(self, *args: str) -> tuple[int, list[dict[str, object]], str]:
        """The command in a worker thread, its output read from pytest's capture."""
        parser = argparse.ArgumentParser()
        verdicts.register(parser.add_subparsers())
        parsed = parser.parse_args(["verdicts", *args])
        self.capture.readouterr()
        code = await asyncio.to_thread(parsed.func, parsed)
        out, err = self.capture.readouterr()
        return code, [json.loads(line) for line in out.splitlines()], err


@pytest.fixture
async def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> AsyncIterator[Cli]:
    model = install_committed_model(tmp_path / "model")
    store = Store.open(tmp_path / "store")
    replay_into_store(store, model, verifier_signer())
    pki = write_service_pki(tmp_path / "pki")
    server = await start_verifier_service(
        store,
        CommitmentRegistry.of([model.commitment]),
        ServiceSettings(
            listen="127.0.0.1:0", tls=pki.server_tls(), admin_subjects=frozenset({ADMIN_CN})
        ),
        weights=model.weights,
    )
    yield Cli(store, server, pki, model, capsys)
    await server.stop(0)
    store.close()


async def test_list_prints_one_json_line_per_matching_verdict(cli: Cli) -> None:
    failing = [e for e in EXCHANGES if e.status == FAIL]
    code, lines, err = await cli.run(
        "list", *cli.connection(), "--status", "fail", "--page-size", "1"
    )
    assert (code, err) == (0, "")
    assert [line["record_id"] for line in lines] == [e.record_id for e in failing]
    assert {line["status"] for line in lines} == {"VERDICT_STATUS_FAIL"}

    since = failing[1].at_ns
    code, lines, _ = await cli.run(
        "list", *cli.connection(), f"--from={since}", "--status=PASS", "--limit=2"
    )
    expected = [e.record_id for e in EXCHANGES if e.status == PASS and e.at_ns >= since][:2]
    assert code == 0 and [line["record_id"] for line in lines] == expected

    code, lines, _ = await cli.run("list", *cli.connection(), "--newest=3")
    decided = [e.record_id for e in EXCHANGES if e.status != PENDING]
    assert code == 0 and [line["record_id"] for line in lines] == decided[::-1][:3]


async def test_get_prints_the_signed_verdict_or_the_record(cli: Cli) -> None:
    exchange = next(e for e in EXCHANGES if e.status == FAIL)
    code, [line], _ = await cli.run("get", exchange.record_id, *cli.connection())
    assert code == 0
    assert line["verdict"]["record_id"] == exchange.record_id  # type: ignore[index]
    assert set(line["signed"]) == {"verdict", "signature", "key_id"}  # type: ignore[arg-type]

    code, [line], _ = await cli.run("get", exchange.record_id, "--record", *cli.connection())
    assert code == 0
    texts = line["token_texts"]
    assert isinstance(texts, list) and "".join(texts) == exchange.answer

    code, lines, err = await cli.run("get", "01NOSUCHRECORD", *cli.connection())
    assert (code, lines) == (1, [])
    assert "NOT_FOUND" in err


async def test_the_verifierd_entry_point_runs_the_command(cli: Cli) -> None:
    exchange = next(e for e in EXCHANGES if e.status == FAIL)
    process = await cli.start("get", exchange.record_id, *cli.connection())
    out, err = await asyncio.wait_for(process.communicate(), 100)
    assert process.returncode == 0, err.decode()
    [line] = out.decode().splitlines()
    assert json.loads(line)["verdict"]["status"] == "VERDICT_STATUS_FAIL"


async def test_watch_prints_verdicts_as_they_are_decided(cli: Cli) -> None:
    watching = asyncio.ensure_future(cli.run("watch", *cli.connection(), "--count=2"))
    deadline = time.monotonic() + 60
    while cli.server.watchers == 0:
        assert time.monotonic() < deadline, "the CLI never subscribed"
        await asyncio.sleep(0.05)
    items = cli.store.take_pending(cli.commitment_id, 10, 1 << 63)
    writes = []
    for item in items:
        entry = cli.store.entry(item.origin, item.seq)
        assert entry is not None
        record_id = record_pb2.InferenceRecord.FromString(
            log_pb2.Entry.FromString(entry.envelope).record
        ).record_id
        exchange = by_record_id(record_id)
        verdict = verdict_for(exchange, entry, cli.model.commitment, cli.model.tokenizer)
        verdict.status = PASS
        signed = sign_verdict(verdict, verifier_signer())
        writes.append((item.key, VerdictWrite(item.origin, item.seq, record_id, signed, verdict)))
    await asyncio.to_thread(cli.store.finish, writes)
    code, lines, _ = await asyncio.wait_for(watching, 60)
    assert code == 0
    pending = [e.record_id for e in EXCHANGES if e.status == PENDING]
    assert [line["record_id"] for line in lines] == pending[:2]


async def test_plaintext_to_a_remote_address_is_refused_before_connecting(cli: Cli) -> None:
    code, lines, err = await cli.run("list", "--address=192.0.2.1:50061")
    assert (code, lines) == (2, [])
    assert "plaintext" in err


def test_statuses_and_times_parse_in_the_forms_people_type() -> None:
    assert parse_status("fail") == verifier_pb2.VERDICT_STATUS_FAIL
    assert parse_status("VERDICT_STATUS_PASS") == verifier_pb2.VERDICT_STATUS_PASS
    with pytest.raises(argparse.ArgumentTypeError):
        parse_status("maybe")
    assert parse_time("2025-03-01T09:00:00Z") == 1_740_819_600_000_000_000
    assert parse_time("2025-03-01T09:00:00.5") == 1_740_819_600_500_000_000
    assert parse_time("1740819600000000000") == 1_740_819_600_000_000_000
    with pytest.raises(argparse.ArgumentTypeError):
        parse_time("yesterday")


@given(
    when=st.datetimes(
        min_value=datetime.datetime(1971, 1, 1),
        max_value=datetime.datetime(2200, 1, 1),
        timezones=st.just(datetime.UTC),
    )
)
def test_an_iso_time_and_its_nanoseconds_parse_to_the_same_instant(
    when: datetime.datetime,
) -> None:
    ns = (calendar.timegm(when.utctimetuple()) * 10**6 + when.microsecond) * 1000
    assert parse_time(when.isoformat()) == ns
    assert parse_time(when.replace(tzinfo=None).isoformat()) == ns
    assert parse_time(str(ns)) == ns


def test_a_verdict_line_is_json_whose_prover_text_never_drives_a_terminal() -> None:
    hostile = "[/x]\x1b]0;owned\x07\x9b2J \u202eexe.txt 漢字"
    verdict = verifier_pb2.Verdict(model=hostile, detail=hostile)
    line = verdicts.json_line(verdict)
    assert json.loads(line)["model"] == hostile and json.loads(line)["detail"] == hostile
    assert not any(c in line for c in "\x1b\x07\x9b\u202e\n")
    assert "漢字" in line


def test_a_verdict_line_gives_the_checkpoint_root_in_hex_at_any_depth() -> None:
    root = bytes(range(32))
    verdict = verifier_pb2.Verdict(
        record_id="r1", checkpoint_tree_size=40, checkpoint_root_hash=root
    )
    line = json.loads(verdicts.json_line(verdict))
    assert (line["checkpoint_tree_size"], line["checkpoint_root_hash"]) == ("40", root.hex())
    nested = json.loads(verdicts.json_line(verifier_pb2.GetVerdictResponse(verdict=verdict)))
    assert nested["verdict"]["checkpoint_root_hash"] == root.hex()
    assert "checkpoint_root_hash" not in json.loads(verdicts.json_line(verifier_pb2.Verdict()))
