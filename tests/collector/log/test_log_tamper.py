"""`collector log verify` on a log altered behind the collector's back names what was done.

Each test writes a good log, closes it, changes its LMDB files directly with
py-lmdb the way an attacker or a bad disk would, and runs the real CLI.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import lmdb
import pytest
from veritap import merkle
from veritap.envelope import EnvelopeEncoder, decode_envelope, entry_hash
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer
from veritap.v1 import log_pb2

from collector.cli import main
from collector.log import layout
from tests.collector.log.log_fixtures import ORIGIN, make_record, open_log

ENTRIES = 60
SIGNER = Signer.generate(ORIGIN)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pristine")
    with open_log(root / "log", SIGNER, checkpoint_every=10, checkpoint_interval_s=3600) as log:
        for start in range(1, ENTRIES + 1, 5):
            log.append_many([make_record(i) for i in range(start, start + 5)])
    (root / "key.pub").write_text(SIGNER.verifier().key_string() + "\n")
    return root


@pytest.fixture
def copy(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine / "log", tmp_path / "log")
    shutil.copy(pristine / "key.pub", tmp_path / "key.pub")
    return tmp_path


@contextmanager
def raw(path: Path) -> Iterator[tuple[lmdb.Transaction[bytes], dict[layout.Db, lmdb._Database]]]:
    env = lmdb.open(str(path / "log"), max_dbs=layout.MAX_DBS, map_size=1 << 28)
    try:
        with env.begin(write=True) as txn:
            dbs = {db: env.open_db(db.value, txn=txn, create=False) for db in layout.Db}
            yield txn, dbs
    finally:
        env.close()


def verify(path: Path, capsys: pytest.CaptureFixture[str], pubkey: str = "key.pub") -> str:
    code = main(["log", "verify", str(path / "log"), "--pubkey", str(path / pubkey)])
    out = capsys.readouterr()
    if code == 0:
        assert out.err == ""
        return ""
    assert code == 1
    return out.err


def rewrite(path: Path, seq: int, change: Callable[[bytes], bytes]) -> None:
    with raw(path) as (txn, dbs):
        key = layout.u64(seq)
        data = txn.get(key, db=dbs[layout.Db.RECORDS])
        assert data is not None
        txn.put(key, change(data), db=dbs[layout.Db.RECORDS])


def flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def test_the_untouched_log_verifies(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "verify", str(copy / "log"), "--pubkey", str(copy / "key.pub")]) == 0
    assert f"entries 1..{ENTRIES}" in capsys.readouterr().out


def test_a_flipped_byte_anywhere_in_an_entry_names_that_entry(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with raw(copy) as (txn, dbs):
        original = txn.get(layout.u64(17), db=dbs[layout.Db.RECORDS])
    assert original is not None
    positions = [*range(60), *random.Random(7).sample(range(60, len(original)), 12)]
    for at in positions:
        rewrite(copy, 17, lambda data, at=at: flip(data, at))
        err = verify(copy, capsys)
        assert "FAIL seq 17:" in err, f"byte {at}: {err}"
        rewrite(copy, 17, lambda _: original)
    assert verify(copy, capsys) == ""


@pytest.mark.parametrize("seq", [1, 33, 40, ENTRIES])
def test_a_flipped_byte_in_the_record_says_the_entry_was_altered(
    copy: Path, capsys: pytest.CaptureFixture[str], seq: int
) -> None:
    # 40 and ENTRIES are also the tree sizes of checkpoints.
    rewrite(copy, seq, lambda data: flip(data, len(data) - 3))
    assert f"FAIL seq {seq}: entry was altered" in verify(copy, capsys)


def test_an_altered_prev_hash_says_the_entry_was_replaced(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rewrite(copy, 33, lambda data: flip(data, 10))
    assert "FAIL seq 33: entry was replaced or its prev_hash altered" in verify(copy, capsys)


@pytest.mark.parametrize("seq", [1, 23, ENTRIES])
def test_a_deleted_entry_is_named(copy: Path, capsys: pytest.CaptureFixture[str], seq: int) -> None:
    with raw(copy) as (txn, dbs):
        assert txn.delete(layout.u64(seq), db=dbs[layout.Db.RECORDS])
    assert f"FAIL seq {seq}: entry is missing" in verify(copy, capsys)


def test_two_swapped_entries_are_named(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with raw(copy) as (txn, dbs):
        records = dbs[layout.Db.RECORDS]
        a, b = txn.get(layout.u64(30), db=records), txn.get(layout.u64(31), db=records)
        assert a is not None and b is not None
        txn.put(layout.u64(30), b, db=records)
        txn.put(layout.u64(31), a, db=records)
    assert "FAIL seq 30: envelope stored at seq 30 says seq 31" in verify(copy, capsys)


def test_a_rewritten_and_rechained_history_fails_at_the_next_checkpoint(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An attacker without the key edits entry 25 and recomputes every later link, the
    # head and the frontier in meta: only the signed checkpoints can tell.
    with raw(copy) as (txn, dbs):
        records, meta = dbs[layout.Db.RECORDS], dbs[layout.Db.META]
        encoder = EnvelopeEncoder(ORIGIN, SIGNER.key_id)
        prev = entry_hash(txn.get(layout.u64(24), db=records) or b"")
        frontier = merkle.Frontier()
        for seq in range(1, 25):
            frontier.append(entry_hash(txn.get(layout.u64(seq), db=records) or b""))
        for seq in range(25, ENTRIES + 1):
            entry = decode_envelope(txn.get(layout.u64(seq), db=records) or b"")
            record = entry.record.replace(b"request 25 ", b"request 99 ")
            data = encoder.encode(seq, prev, entry.captured_at_ns, record)
            txn.put(layout.u64(seq), data, db=records)
            prev = entry_hash(data)
            frontier.append(prev)
        txn.put(layout.MetaKey.HEAD.value, layout.pack_head(ENTRIES, prev), db=meta)
        txn.put(layout.MetaKey.FRONTIER.value, frontier.to_bytes(), db=meta)
    assert "FAIL seq 30: checkpoint stored for tree size 30: signed root" in verify(copy, capsys)


def put_checkpoint(path: Path, size: int, checkpoint: log_pb2.Checkpoint) -> None:
    with raw(path) as (txn, dbs):
        txn.put(layout.u64(size), checkpoint.SerializeToString(), db=dbs[layout.Db.CHECKPOINTS])


def get_checkpoint(path: Path, size: int) -> log_pb2.Checkpoint:
    with raw(path) as (txn, dbs):
        data = txn.get(layout.u64(size), db=dbs[layout.Db.CHECKPOINTS])
    assert data is not None
    return log_pb2.Checkpoint.FromString(data)


def test_a_replaced_checkpoint_is_named(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    put_checkpoint(copy, 20, get_checkpoint(copy, 30))
    err = verify(copy, capsys)
    assert "FAIL seq 20: checkpoint stored for tree size 20: checkpoint is for tree size 30" in err


def test_a_checkpoint_forged_with_another_key(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = get_checkpoint(copy, 20)
    body = CheckpointBody(ORIGIN, 20, good.root_hash)
    forged = log_pb2.Checkpoint(
        origin=ORIGIN,
        tree_size=20,
        root_hash=good.root_hash,
        note=sign_checkpoint(body, Signer.generate(ORIGIN)),
    )
    put_checkpoint(copy, 20, forged)
    err = verify(copy, capsys)
    assert "FAIL seq 20: checkpoint stored for tree size 20: checkpoint note:" in err
    assert "none of them trusted" in err


def test_a_checkpoint_with_an_edited_note(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = get_checkpoint(copy, 40)
    checkpoint.note = checkpoint.note.replace(b"\n40\n", b"\n41\n")
    put_checkpoint(copy, 40, checkpoint)
    assert "does not verify" in verify(copy, capsys)


def test_a_checkpoint_whose_fields_disagree_with_its_note(
    copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = get_checkpoint(copy, 40)
    checkpoint.root_hash = bytes(32)
    put_checkpoint(copy, 40, checkpoint)
    assert "FAIL seq 40: checkpoint stored for tree size 40: checkpoint fields differ" in verify(
        copy, capsys
    )


def test_a_checkpoint_past_the_head(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = CheckpointBody(ORIGIN, 70, bytes(32))
    note = sign_checkpoint(body, SIGNER)
    put_checkpoint(
        copy, 70, log_pb2.Checkpoint(origin=ORIGIN, tree_size=70, root_hash=bytes(32), note=note)
    )
    assert "FAIL seq 70: checkpoint is stored past the head" in verify(copy, capsys)


def test_a_damaged_index_is_named(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with raw(copy) as (txn, dbs):
        assert txn.delete(make_record(12).record_id.encode(), db=dbs[layout.Db.BY_RECORD_ID])
    assert "FAIL seq 12: index by_record_id maps" in verify(copy, capsys)


def test_the_wrong_public_key(copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (copy / "other.pub").write_text(Signer.generate(ORIGIN).verifier().key_string())
    assert "key id" in verify(copy, capsys, pubkey="other.pub")


def test_a_missing_log_and_a_bad_key_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "key.pub").write_text(SIGNER.verifier().key_string())
    assert "no log" in verify(tmp_path, capsys)
    (tmp_path / "bad.pub").write_text("not a key")
    code = main(["log", "verify", str(tmp_path / "log"), "--pubkey", str(tmp_path / "bad.pub")])
    assert code == 2
