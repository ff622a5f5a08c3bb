"""Authenticated before judged: the pipeline judges only stored entries its collector signed.

The store is edited behind verifierd's back the way an attacker with the disk would: a
second process writes the LMDB values directly.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from veritap.envelope import encode_envelope, entry_hash
from veritap.signing import Signer
from veritap.v1 import ledger_pb2, verifier_pb2

from tests.verifierd.pipeline_rig import Rig, make_rig
from tests.verifierd.record_fixtures import (
    COLLECTOR,
    Exchange,
    ingest,
    pinned,
    signed_checkpoint,
)
from verifierd.config import parse_config
from verifierd.intake.stored_entries import StoredEntryAuthenticator
from verifierd.store import Store, ekey

PASS = verifier_pb2.VERDICT_STATUS_PASS
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE

_PUT_ENTRY = """
import sys, lmdb
env = lmdb.open(sys.argv[1], map_size=1 << 30, max_dbs=64)
entries = env.open_db(b"entries")
with env.begin(write=True) as txn:
    txn.put(bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3]), db=entries)
env.close()
"""


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    yield from make_rig(tmp_path)


def put_entry(tmp_path: Path, origin: str, seq: int, entry_hash_: bytes, envelope: bytes) -> None:
    """Overwrite a stored entry from another process, as someone with the disk would."""
    store_dir = parse_config({}, tmp_path).store_dir
    key, value = ekey(origin, seq).hex(), (entry_hash_ + envelope).hex()
    subprocess.run([sys.executable, "-c", _PUT_ENTRY, str(store_dir), key, value], check=True)


def forged_envelope(store: Store, origin: str, seq: int) -> bytes:
    """The stored envelope with a record claiming something else, chained like the original."""
    stored = store.entry(origin, seq)
    assert stored is not None
    return stored.envelope.replace(b"honest", b"edited")


def settle(rig: Rig, rounds: int = 10) -> None:
    for _ in range(rounds):
        rig.pipeline.classify_some()
        rig.pipeline.score_some()


def test_entries_wait_for_a_checkpoint_then_their_verdicts_name_it(rig: Rig) -> None:
    rig.store.ingest("edge", [(1, b"", b"h" * 32)])  # an entry received as its hash only
    ingest(
        rig.store, "edge", [Exchange("honest"), Exchange("no-seed", seed=None)], checkpointed=False
    )
    assert rig.pipeline.classify_some() == 0
    assert rig.store.counts().awaiting_checkpoint == 2
    settle(rig)
    assert rig.store.counts().verdicts == 0
    checkpoint = signed_checkpoint(rig.store, "edge")
    rig.store.ingest("edge", [], checkpoint=checkpoint)
    assert rig.store.counts().awaiting_checkpoint == 0
    ingest(rig.store, "edge", [Exchange("later")], checkpointed=False)
    settle(rig)
    scored, unseeded = (rig.store.verdict("edge", seq) for seq in (2, 3))
    assert scored is not None and unseeded is not None
    assert (scored.verdict.status, unseeded.verdict.status) == (PASS, UNVERIFIABLE), (
        scored.verdict.detail
    )
    for stored in (scored, unseeded):
        v = stored.verdict
        assert (v.checkpoint_tree_size, v.checkpoint_root_hash) == (3, checkpoint.root_hash)
    assert rig.store.verdict("edge", 4) is None
    assert rig.store.counts().awaiting_checkpoint == 1
    later = signed_checkpoint(rig.store, "edge")
    rig.store.ingest("edge", [], checkpoint=later)
    settle(rig)
    judged = rig.store.verdict("edge", 4)
    assert judged is not None and judged.verdict.checkpoint_tree_size == 4
    assert judged.verdict.checkpoint_root_hash == later.root_hash


def test_an_edited_stored_envelope_is_an_alert_with_evidence_never_a_verdict(
    rig: Rig, tmp_path: Path
) -> None:
    alerts: list[tuple[str, str]] = []
    rig.pipeline.add_alert_listener(lambda origin, reason: alerts.append((origin, reason)))
    ingest(rig.store, "edge", [Exchange("honest-1"), Exchange("honest-2")])
    original = rig.store.entry("edge", 2)
    assert original is not None
    edited = forged_envelope(rig.store, "edge", 2)
    put_entry(tmp_path, "edge", 2, original.entry_hash, edited)
    settle(rig)
    assert rig.store.verdict("edge", 1) is not None
    assert rig.store.verdict("edge", 2) is None
    assert rig.store.counts().inbox == 0
    assert alerts == [("edge", "stored_envelope_altered")]
    [alert] = rig.store.alerts()
    assert alert.reason == "stored_envelope_altered"
    evidence = ledger_pb2.IntakeEvidence.FromString(alert.evidence)
    assert [(e.seq, e.envelope) for e in evidence.entries] == [(2, edited)]
    assert evidence.remote_hash == original.entry_hash
    assert evidence.checkpoints[0].tree_size == 2
    counted = rig.metrics.registry.get_sample_value(
        "veritap_verifier_intake_alerts_total",
        {"origin": "edge", "reason": "stored_envelope_altered"},
    )
    assert counted == 1


def test_edited_hashes_that_miss_the_signed_root_stop_judging_that_origin(
    rig: Rig, tmp_path: Path
) -> None:
    ingest(rig.store, "edge", [Exchange("honest-1"), Exchange("honest-2")])
    ingest(rig.store, "edge-reject", [Exchange("elsewhere", model="unknown")])
    edited = forged_envelope(rig.store, "edge", 1)
    put_entry(tmp_path, "edge", 1, entry_hash(edited), edited)  # consistent, but not signed
    settle(rig)
    assert [rig.store.verdict("edge", seq) for seq in (1, 2)] == [None, None]
    assert rig.store.verdict("edge-reject", 1) is not None
    [alert] = rig.store.alerts()
    assert (alert.origin, alert.reason) == ("edge", "stored_entries_altered")
    assert rig.store.counts().awaiting_checkpoint == 2  # kept, waiting for an operator


def test_a_forged_stored_checkpoint_is_an_alert_and_nothing_is_judged(rig: Rig) -> None:
    ingest(rig.store, "edge", [Exchange("honest")], checkpointed=False)
    impostor = Signer.generate(COLLECTOR.name)  # the same name, another key
    rig.store.ingest("edge", [], checkpoint=signed_checkpoint(rig.store, "edge", impostor))
    settle(rig)
    assert rig.store.counts().verdicts == 0
    [alert] = rig.store.alerts()
    assert alert.reason == "stored_checkpoint_forged"


def test_an_entry_edited_while_it_waits_for_the_engine_is_set_aside(
    rig: Rig, tmp_path: Path
) -> None:
    ingest(rig.store, "edge", [Exchange("honest")])
    assert rig.pipeline.classify_some() == 1
    assert rig.store.counts().pending == 1
    original = rig.store.entry("edge", 1)
    assert original is not None
    put_entry(tmp_path, "edge", 1, original.entry_hash, forged_envelope(rig.store, "edge", 1))
    settle(rig)
    assert rig.store.verdict("edge", 1) is None
    assert rig.store.counts().pending == 0
    assert [a.reason for a in rig.store.alerts()] == ["stored_envelope_altered"]


def test_an_entry_and_its_hash_edited_while_it_waits_are_set_aside(
    rig: Rig, tmp_path: Path
) -> None:
    ingest(rig.store, "edge", [Exchange("honest")])
    assert rig.pipeline.classify_some() == 1
    edited = forged_envelope(rig.store, "edge", 1)
    put_entry(tmp_path, "edge", 1, entry_hash(edited), edited)  # consistent, but not classified
    settle(rig)
    assert rig.store.verdict("edge", 1) is None
    assert rig.store.counts().pending == 0
    assert [a.reason for a in rig.store.alerts()] == ["stored_envelope_altered"]


def test_an_origin_without_a_pinned_key_is_never_judged(rig: Rig) -> None:
    ingest(rig.store, "stranger", [Exchange("honest")])
    ingest(rig.store, "edge", [Exchange("honest")])
    settle(rig)
    assert rig.store.verdict("stranger", 1) is None
    assert rig.store.verdict("edge", 1) is not None


def test_a_fresh_authenticator_starts_from_seq_1_and_keeps_what_waits(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    ingest(store, "edge", [Exchange(f"r{i}") for i in range(8)])
    first = StoredEntryAuthenticator(store, pinned("edge"))
    done = first.authenticate(store.inbox(3))
    assert [a.entry.seq for a in done.authentic] == [1, 2, 3]
    assert not done.tampered and not done.alerts
    # The next entries were authenticated by the same pass; a restart starts over.
    waiting = store.inbox(8)[3:]
    assert [a.entry.seq for a in first.authenticate(waiting).authentic] == [4, 5, 6, 7, 8]
    restarted = StoredEntryAuthenticator(store, pinned("edge"))
    again = restarted.authenticate(waiting)
    assert [a.entry.seq for a in again.authentic] == [4, 5, 6, 7, 8]
    assert {a.checkpoint_tree_size for a in again.authentic} == {8}
    store.close()


def test_an_envelope_that_is_not_the_checkpointed_one_is_tampered(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "store")
    ingest(store, "edge", [Exchange("honest")])
    [entry] = store.inbox(1)
    other = encode_envelope(
        seq=1, prev_hash=bytes(32), captured_at_ns=1, origin="edge", key_id=b"kid0", record=b""
    )
    forged = type(entry)(entry.origin, entry.seq, entry.entry_hash, other)
    result = StoredEntryAuthenticator(store, pinned("edge")).authenticate([forged])
    assert not result.authentic
    [tampered] = result.tampered
    assert (tampered.seq, tampered.reason) == (1, "stored_envelope_altered")
    store.close()
