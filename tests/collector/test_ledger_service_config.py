"""The [ledger] section loader and the retention acknowledgement book."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from veritap.config_schema import ConfigError
from veritap.tls import ServerTls

from collector.ledger.config import ACKS_FILE_NAME, LedgerConfig, ledger_config_from_table
from collector.ledger.errors import LedgerError, RetentionError
from collector.ledger.retention import AckBook, VerifierAck, check_prune, prune_limit


def _load(tmp_path: Path, text: str) -> LedgerConfig:
    table = tomllib.loads(text).get("ledger", {})
    return ledger_config_from_table(table, base_dir=tmp_path)


def test_defaults_listen_on_loopback_without_tls(tmp_path: Path) -> None:
    config = _load(tmp_path, "")
    assert config.listen == "127.0.0.1:7700"
    assert config.tls is None
    assert config.acks_path(tmp_path / "log") == tmp_path / "log" / ACKS_FILE_NAME


def test_tls_paths_resolve_against_the_config_folder(tmp_path: Path) -> None:
    config = _load(
        tmp_path,
        '[ledger]\nlisten = "0.0.0.0:7700"\ntls_cert = "c.pem"\ntls_key = "/k.pem"\n'
        'tls_client_ca = "ca.pem"\nverifiers = ["a", "b"]\n',
    )
    assert config.tls == ServerTls(tmp_path / "c.pem", Path("/k.pem"), tmp_path / "ca.pem")
    assert config.verifiers == ("a", "b")


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ('listen = "0.0.0.0:7700"', "ledger.listen"),
        ('listen = "[::]:7700"', "ledger.listen"),
        ('listen = "::1:7700"', "ledger.listen"),
        ('tls_cert = "c.pem"', "ledger.tls_key"),
        ('tls_client_ca = "ca.pem"', "ledger.tls_client_ca"),
        ("heartbeat_s = 0", "ledger.heartbeat_s"),
        ("batch_entries = 65", "ledger.batch_entries"),
        ('verifiers = ["a", "a"]', "ledger.verifiers"),
        ("verifiers = 3", "ledger.verifiers"),
        ("lisen = 1", "ledger.lisen"),
    ],
)
def test_bad_settings_name_their_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key}:"):
        _load(tmp_path, f"[ledger]\n{text}\n")


def test_plaintext_is_allowed_on_any_loopback_form(tmp_path: Path) -> None:
    for listen in ("127.0.0.2:1", "[::1]:1", "localhost:1"):
        assert _load(tmp_path, f'[ledger]\nlisten = "{listen}"\n').tls is None


def test_ack_book_moves_forward_only_and_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "acks.json"
    book = AckBook.load(path, flush_interval_s=3600)
    book.record("a", 10)  # the first is written at once
    book.record("a", 7)
    book.record("b", 3)
    assert AckBook.load(path).entries() == (VerifierAck("a", 10),)  # then throttled
    book.flush()
    again = AckBook.load(path)
    assert (again.acked("a"), again.acked("b"), again.acked("c")) == (10, 3, 0)


def test_ack_book_rejects_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "acks.json"
    path.write_text('{"acked": {"a": "x"}}')
    with pytest.raises(LedgerError):
        AckBook.load(path)


def test_prune_is_held_back_by_the_slowest_configured_verifier(tmp_path: Path) -> None:
    book = AckBook.load(tmp_path / "acks.json")
    book.record("a", 50)
    book.record("b", 20)
    book.record("stranger", 1)
    assert prune_limit(book, ("a", "b")) == 21
    assert prune_limit(book, ()) is None
    check_prune(book, ("a", "b"), 21)
    with pytest.raises(RetentionError, match="'b'"):
        check_prune(book, ("a", "b"), 22)
    with pytest.raises(RetentionError, match="'c'"):
        check_prune(book, ("a", "c"), 2)
