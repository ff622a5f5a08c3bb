"""The collector's `[ledger]` section: where the LedgerService listens and how it streams.

`collector.config` reads the file; `LedgerSection` is this table as written (checked by
`veritap.config_schema`), `LedgerConfig` what the LedgerService takes (the three TLS paths
become one `ServerTls`; its defaults are the section's).

```toml
[ledger]
listen = "127.0.0.1:7700"        # plaintext is allowed only on loopback
tls_cert = "collector.pem"       # server certificate chain (PEM)
tls_key = "collector.key"
tls_client_ca = "ca.pem"         # set: mutual TLS, clients need a certificate from this CA,
                                 # and a subscriber's verifier_id must be a name in it (CN or
                                 # SAN), so no client can acknowledge for another verifier
verifiers = ["verifier-a"]       # retention: never prune what these have not acknowledged
acks_file = "verifier-acks.json" # default: next to the log, in its directory
heartbeat_s = 1.0
poll_s = 0.01                    # how often to look for entries appended by another process
default_window = 4096            # unacknowledged entries in flight when the client asks 0
max_window = 65536
```
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Self

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass
from veritap.config_schema import (
    SECTION,
    ConfigPath,
    Integer,
    NonEmptyText,
    Number,
    Text,
    reject,
    validate_document,
)
from veritap.tls import ServerTls, TlsConfigError, require_tls_off_loopback, split_host_port

DEFAULT_LISTEN = "127.0.0.1:7700"
ACKS_FILE_NAME = "verifier-acks.json"
MAX_BATCH_ENTRIES = 64
MAX_BATCH_BYTES = 1 << 20


@dataclass(frozen=True, config=SECTION)
class LedgerSection:
    """`[ledger]` as written in the file."""

    listen: Annotated[Text, Field(description="host:port; plaintext only on loopback")] = (
        DEFAULT_LISTEN
    )
    tls_cert: Annotated[ConfigPath | None, Field(description="server certificate chain (PEM)")] = (
        None
    )
    tls_key: ConfigPath | None = None
    tls_client_ca: Annotated[
        ConfigPath | None,
        Field(description="set: mutual TLS; a subscriber's verifier_id must be named in its cert"),
    ] = None
    verifiers: Annotated[
        tuple[NonEmptyText, ...],
        Field(description="retention: never prune what these have not acknowledged"),
    ] = ()
    acks_file: Annotated[
        ConfigPath | None, Field(description=f"default: {ACKS_FILE_NAME} in the log's folder")
    ] = None
    heartbeat_s: Annotated[Number, Field(ge=0.01)] = 1.0
    poll_s: Annotated[
        Number, Field(ge=0.001, description="how often to look for entries another process added")
    ] = 0.01
    default_window: Annotated[
        Integer, Field(ge=1, description="unacknowledged entries in flight when a client asks 0")
    ] = 4096
    max_window: Annotated[Integer, Field(ge=1)] = 65536
    batch_entries: Annotated[Integer, Field(ge=1, le=MAX_BATCH_ENTRIES)] = MAX_BATCH_ENTRIES
    batch_bytes: Annotated[Integer, Field(ge=4096, le=MAX_BATCH_BYTES)] = MAX_BATCH_BYTES

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        findings: list[tuple[str, str]] = []
        if (self.tls_cert is None) != (self.tls_key is None):
            missing = "tls_cert" if self.tls_cert is None else "tls_key"
            findings.append((missing, "set tls_cert and tls_key both or neither"))
        if self.tls_client_ca is not None and self.tls_cert is None:
            findings.append(("tls_client_ca", "mutual TLS needs tls_cert and tls_key too"))
        try:
            split_host_port(self.listen)
            require_tls_off_loopback(self.listen, self.tls)
        except TlsConfigError as exc:
            findings.append(("listen", str(exc)))
        if len(set(self.verifiers)) != len(self.verifiers):
            findings.append(("verifiers", "a verifier id appears twice"))
        reject(self, findings)
        return self

    @property
    def tls(self) -> ServerTls | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        return ServerTls(self.tls_cert, self.tls_key, self.tls_client_ca)

    def to_config(self) -> LedgerConfig:
        return LedgerConfig(
            listen=self.listen,
            tls=self.tls,
            verifiers=self.verifiers,
            acks_file=self.acks_file,
            heartbeat_s=self.heartbeat_s,
            poll_s=self.poll_s,
            default_window=self.default_window,
            max_window=self.max_window,
            batch_entries=self.batch_entries,
            batch_bytes=self.batch_bytes,
        )


_DEFAULTS = LedgerSection()


@dataclasses.dataclass(frozen=True)
class LedgerConfig:
    listen: str = _DEFAULTS.listen
    tls: ServerTls | None = None
    verifiers: tuple[str, ...] = _DEFAULTS.verifiers
    acks_file: Path | None = _DEFAULTS.acks_file
    heartbeat_s: float = _DEFAULTS.heartbeat_s
    poll_s: float = _DEFAULTS.poll_s
    default_window: int = _DEFAULTS.default_window
    max_window: int = _DEFAULTS.max_window
    batch_entries: int = _DEFAULTS.batch_entries
    batch_bytes: int = _DEFAULTS.batch_bytes

    def acks_path(self, log_dir: Path) -> Path:
        """Where acknowledged seqs are kept: `acks_file`, or a file in the log's directory."""
        return self.acks_file if self.acks_file is not None else log_dir / ACKS_FILE_NAME


def ledger_config_from_table(table: Mapping[str, object], *, base_dir: Path) -> LedgerConfig:
    """Validate a parsed `[ledger]` table; relative paths are relative to `base_dir`."""
    document = validate_document(_LedgerDocument, {"ledger": table}, base_dir=base_dir)
    return document.ledger.to_config()


@dataclass(frozen=True, config=SECTION)
class _LedgerDocument:
    """A file holding only `[ledger]`: the table checked alone, its errors under `ledger.`."""

    ledger: LedgerSection = LedgerSection()
