"""The collector's `[ledger]` section: where the LedgerService listens and how it streams.

`collector.config` reads the file and hands this section to `ledger_config_from_table`.

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

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from veritap.tls import ServerTls, TlsConfigError, require_tls_off_loopback, split_host_port
from veritap.toml_section import Section

DEFAULT_LISTEN = "127.0.0.1:7700"
ACKS_FILE_NAME = "verifier-acks.json"
MAX_BATCH_ENTRIES = 64
MAX_BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class LedgerConfig:
    listen: str = DEFAULT_LISTEN
    tls: ServerTls | None = None
    verifiers: tuple[str, ...] = ()
    acks_file: Path | None = None
    heartbeat_s: float = 1.0
    poll_s: float = 0.01
    default_window: int = 4096
    max_window: int = 65536
    batch_entries: int = MAX_BATCH_ENTRIES
    batch_bytes: int = MAX_BATCH_BYTES

    def acks_path(self, log_dir: Path) -> Path:
        """Where acknowledged seqs are kept: `acks_file`, or a file in the log's directory."""
        return self.acks_file if self.acks_file is not None else log_dir / ACKS_FILE_NAME


def ledger_config_from_table(table: Mapping[str, object], *, base_dir: Path) -> LedgerConfig:
    """Validate a parsed `[ledger]` table; relative paths are relative to `base_dir`."""
    section = Section(table, "ledger", base_dir=base_dir)
    listen = section.string("listen", DEFAULT_LISTEN)
    cert = section.optional_path("tls_cert")
    key = section.optional_path("tls_key")
    client_ca = section.optional_path("tls_client_ca")
    if (cert is None) != (key is None):
        raise section.error("tls_cert" if cert is None else "tls_key", "set both or neither")
    if client_ca is not None and cert is None:
        raise section.error("tls_client_ca", "mutual TLS needs tls_cert and tls_key too")
    tls = None if cert is None or key is None else ServerTls(cert, key, client_ca)
    try:
        split_host_port(listen)
        require_tls_off_loopback(listen, tls)
    except TlsConfigError as exc:
        raise section.error("listen", str(exc)) from exc
    config = LedgerConfig(
        listen=listen,
        tls=tls,
        verifiers=section.strings("verifiers"),
        acks_file=section.optional_path("acks_file"),
        heartbeat_s=section.number("heartbeat_s", 1.0, minimum=0.01),
        poll_s=section.number("poll_s", 0.01, minimum=0.001),
        default_window=section.integer("default_window", 4096, minimum=1),
        max_window=section.integer("max_window", 65536, minimum=1),
        batch_entries=section.integer(
            "batch_entries", MAX_BATCH_ENTRIES, minimum=1, maximum=MAX_BATCH_ENTRIES
        ),
        batch_bytes=section.integer(
            "batch_bytes", MAX_BATCH_BYTES, minimum=4096, maximum=MAX_BATCH_BYTES
        ),
    )
    if len(set(config.verifiers)) != len(config.verifiers):
        raise section.error("verifiers", "a verifier id appears twice")
    section.finish()
    return config
