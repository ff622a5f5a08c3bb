"""The collector's TOML configuration, validated at start; every setting has a default.

```toml
[collector]
origin = "edge-1.example/veritap"   # the log's origin (default: "<hostname>/veritap")

[capture]
interface = "lo"                    # AF_PACKET interface ("any": every interface, cooked)
filter = "tcp port 8000 and ..."    # BPF filter, compiled with tcpdump (empty: none);
                                    # default DEFAULT_FILTER: the API port without pure
                                    # ACKs, IPv4 and IPv6, and the fragment clauses (later
                                    # fragments have no TCP ports)
server_ports = [8000]               # the API port(s): decides who is the server midstream
promiscuous = true
snaplen = 262144
fanout_group = 0                    # >0: join this PACKET_FANOUT group (hash by flow)
ring_block_bytes = 4194304          # PACKET_MMAP TPACKET_V3 ring: block size ...
ring_blocks = 64                    # ... and count (256 MiB)
stats_interval_s = 10.0             # how often kernel drop counters are read and logged
checksums = "verify"                # "verify": a bad IPv4/TCP checksum drops the frame;
                                    # "ignore": only where offload leaves them unfilled
                                    # (capturing on the sending host, e.g. `lo`; tc mirror
                                    # egress copies)

[reassembly]
gap_timeout_s = 60.0                # a hole that has not filled after this becomes a gap
                                    # (longer than TCP's retransmission backoff)
window_bytes = 8388608              # ... or when this much is buffered beyond it
max_buffered_bytes = 536870912      # all flows together
idle_timeout_s = 300.0
max_flows = 100000

[http]
max_head_bytes = 65536
max_body_bytes = 67108864
response_skew_s = 0.1               # a response captured this much before its request still pairs
dialects = ["openai-chat", "openai-completions"]

[log]
path = "/var/lib/veritap/log"
key = "/etc/veritap/collector.key"  # from `collector keygen`
batch_records = 256                 # group commit: at most this many records ...
batch_delay_s = 0.05                # ... or this long, per durable transaction

[metrics]
listen = "127.0.0.1:9400"           # Prometheus /metrics (host:port, [v6]:port; "": off)
```

Relative paths are relative to the config file. The `[ledger]` section belongs to
`collector.ledger.config`; another section is added with a field in
`CollectorConfig`, its name in `_SECTIONS` and its reader in `config_from_document`.
"""

from __future__ import annotations

import socket
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from veritap.metrics_http import MetricsAddressError, parse_listen
from veritap.toml_section import ConfigError, Section

from collector.capture.decode import ChecksumPolicy
from collector.dialects import DIALECTS
from collector.http.reader import HttpLimits
from collector.ledger.config import LedgerConfig, ledger_config_from_table
from collector.tcp_reassembly import ReassemblyLimits

DEFAULT_PORT = 8000
#: IPv4 and IPv6 fragments: every fragment but the first lacks the TCP header a port filter
#: needs, so a filter must let them through for the decoder to reassemble them.
FRAGMENTS_FILTER = "(ip[6:2] & 0x3fff != 0) or (ip6 and ip6[6] == 44)"
#: TCP segments that carry a SYN, FIN or RST, or payload: everything but pure ACKs (about a
#: third of an API port's packets), which the reassembler does without. libpcap's `tcp[]`
#: reads IPv4 only; on IPv6 a `tcp` match means the next header is TCP, so the TCP header
#: sits right after the fixed 40-byte header: flags at ip6[53], data offset at ip6[52].
NOT_PURE_ACK_FILTER = (
    "((ip and (tcp[tcpflags] & (tcp-syn|tcp-fin|tcp-rst) != 0"
    " or ip[2:2] - ((ip[0] & 0xf) << 2) - ((tcp[12] & 0xf0) >> 2) != 0))"
    " or (ip6 and (ip6[53] & 0x07 != 0 or ip6[4:2] - ((ip6[52] & 0xf0) >> 2) != 0)))"
)
#: The API port without pure ACKs, IPv4 and IPv6, and the fragments ("and" and "or" bind
#: alike, left to right: the fragment clauses are alternatives to the whole port clause).
DEFAULT_FILTER = f"tcp port {DEFAULT_PORT} and {NOT_PURE_ACK_FILTER} or {FRAGMENTS_FILTER}"


class _Section(Section):
    """`Section` plus the booleans and integer lists the collector needs."""

    def boolean(self, key: str, default: bool) -> bool:
        value = self._raw(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {type(value).__name__}")
        return value

    def ports(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self._raw(key)
        if value is None:
            return default
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
            or not all(0 < v < 65536 for v in value)
        ):
            raise self.error(key, "expected a non-empty list of TCP ports (1..65535)")
        return tuple(value)

    def path(self, key: str, default: Path) -> Path:
        return self.optional_path(key) or default


@dataclass(frozen=True)
class CaptureConfig:
    interface: str = "lo"
    filter: str = DEFAULT_FILTER
    server_ports: tuple[int, ...] = (DEFAULT_PORT,)
    promiscuous: bool = True
    snaplen: int = 262_144
    fanout_group: int = 0
    ring_block_bytes: int = 4 * 1024 * 1024
    ring_blocks: int = 64
    stats_interval_s: float = 10.0
    checksums: ChecksumPolicy = ChecksumPolicy.VERIFY


@dataclass(frozen=True)
class ReassemblyConfig:
    gap_timeout_s: float = 60.0
    window_bytes: int = 8 * 1024 * 1024
    max_buffered_bytes: int = 512 * 1024 * 1024
    idle_timeout_s: float = 300.0
    max_flows: int = 100_000

    def limits(self, server_ports: tuple[int, ...]) -> ReassemblyLimits:
        return ReassemblyLimits(
            gap_timeout_ns=int(self.gap_timeout_s * 1e9),
            window_bytes=self.window_bytes,
            max_buffered_bytes=self.max_buffered_bytes,
            idle_timeout_ns=int(self.idle_timeout_s * 1e9),
            max_flows=self.max_flows,
            server_ports=frozenset(server_ports),
        )


@dataclass(frozen=True)
class HttpConfig:
    max_head_bytes: int = 64 * 1024
    max_body_bytes: int = 64 * 1024 * 1024
    response_skew_s: float = 0.1
    dialects: tuple[str, ...] = tuple(DIALECTS)

    def limits(self) -> HttpLimits:
        return HttpLimits(
            max_head_bytes=self.max_head_bytes,
            max_body_bytes=self.max_body_bytes,
            response_skew_ns=int(self.response_skew_s * 1e9),
        )


@dataclass(frozen=True)
class LogConfig:
    path: Path = Path("/var/lib/veritap/log")
    key: Path = Path("/etc/veritap/collector.key")
    batch_records: int = 256
    batch_delay_s: float = 0.05


@dataclass(frozen=True)
class MetricsConfig:
    #: Where /metrics is served; "" serves none (the counters are still kept).
    listen: str = "127.0.0.1:9400"


def default_origin() -> str:
    return f"{socket.gethostname()}/veritap"


@dataclass(frozen=True)
class CollectorConfig:
    origin: str = field(default_factory=default_origin)
    capture: CaptureConfig = CaptureConfig()
    reassembly: ReassemblyConfig = ReassemblyConfig()
    http: HttpConfig = HttpConfig()
    log: LogConfig = LogConfig()
    ledger: LedgerConfig = field(default_factory=LedgerConfig)
    metrics: MetricsConfig = MetricsConfig()


def _collector(section: _Section) -> str:
    origin = section.string("origin", default_origin())
    if not origin or any(ch.isspace() for ch in origin) or "+" in origin:
        raise section.error("origin", "must be non-empty, without spaces or '+'")
    return origin


def _capture(section: _Section) -> CaptureConfig:
    d = CaptureConfig()
    return CaptureConfig(
        interface=section.string("interface", d.interface),
        filter=section.string("filter", d.filter),
        server_ports=section.ports("server_ports", d.server_ports),
        promiscuous=section.boolean("promiscuous", d.promiscuous),
        snaplen=section.integer("snaplen", d.snaplen, minimum=96, maximum=1 << 20),
        fanout_group=section.integer("fanout_group", d.fanout_group, maximum=0xFFFF),
        ring_block_bytes=section.integer(
            "ring_block_bytes", d.ring_block_bytes, minimum=1 << 16, maximum=1 << 30
        ),
        ring_blocks=section.integer("ring_blocks", d.ring_blocks, minimum=2, maximum=1 << 16),
        stats_interval_s=section.number("stats_interval_s", d.stats_interval_s, minimum=0.1),
        checksums=_checksums(section, d.checksums),
    )


def _checksums(section: _Section, default: ChecksumPolicy) -> ChecksumPolicy:
    value = section.string("checksums", default.value)
    try:
        return ChecksumPolicy(value)
    except ValueError:
        known = ", ".join(repr(policy.value) for policy in ChecksumPolicy)
        raise section.error("checksums", f"expected one of {known}, got {value!r}") from None


def _reassembly(section: _Section) -> ReassemblyConfig:
    d = ReassemblyConfig()
    return ReassemblyConfig(
        gap_timeout_s=section.number("gap_timeout_s", d.gap_timeout_s, minimum=0.001),
        window_bytes=section.integer("window_bytes", d.window_bytes, minimum=1024),
        max_buffered_bytes=section.integer(
            "max_buffered_bytes", d.max_buffered_bytes, minimum=1024
        ),
        idle_timeout_s=section.number("idle_timeout_s", d.idle_timeout_s, minimum=0.001),
        max_flows=section.integer("max_flows", d.max_flows, minimum=1),
    )


def _http(section: _Section) -> HttpConfig:
    d = HttpConfig()
    dialects = section.strings("dialects") if section.has("dialects") else d.dialects
    for name in dialects:
        if name not in DIALECTS:
            raise section.error(
                "dialects", f"unknown dialect {name!r} (known: {', '.join(DIALECTS)})"
            )
    return HttpConfig(
        max_head_bytes=section.integer("max_head_bytes", d.max_head_bytes, minimum=256),
        max_body_bytes=section.integer("max_body_bytes", d.max_body_bytes, minimum=1024),
        response_skew_s=section.number("response_skew_s", d.response_skew_s),
        dialects=dialects,
    )


def _log(section: _Section) -> LogConfig:
    d = LogConfig()
    return LogConfig(
        path=section.path("path", d.path),
        key=section.path("key", d.key),
        batch_records=section.integer("batch_records", d.batch_records, minimum=1),
        batch_delay_s=section.number("batch_delay_s", d.batch_delay_s, minimum=0.0),
    )


def _metrics(section: _Section) -> MetricsConfig:
    listen = section.string("listen", MetricsConfig().listen)
    if listen:
        try:
            parse_listen(listen)
        except MetricsAddressError as exc:
            raise section.error("listen", f"{exc} (empty: no endpoint)") from exc
    return MetricsConfig(listen=listen)


_SECTIONS = ("collector", "capture", "reassembly", "http", "log", "ledger", "metrics")


def _table(document: Mapping[str, object], name: str) -> Mapping[str, object]:
    table = document.get(name, {})
    if not isinstance(table, dict):
        raise ConfigError(f"{name}: expected a table")
    return table


def config_from_document(document: Mapping[str, object], *, base_dir: Path) -> CollectorConfig:
    """Validate a parsed TOML document (relative paths are relative to `base_dir`)."""
    unknown = sorted(set(document) - set(_SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(_SECTIONS)})")
    sections = {
        name: _Section(_table(document, name), name, base_dir=base_dir)
        for name in _SECTIONS
        if name != "ledger"
    }
    config = CollectorConfig(
        origin=_collector(sections["collector"]),
        capture=_capture(sections["capture"]),
        reassembly=_reassembly(sections["reassembly"]),
        http=_http(sections["http"]),
        log=_log(sections["log"]),
        ledger=ledger_config_from_table(_table(document, "ledger"), base_dir=base_dir),
        metrics=_metrics(sections["metrics"]),
    )
    for section in sections.values():
        section.finish()
    return config


def load_config(path: Path | None) -> CollectorConfig:
    """Read and validate a collector TOML file; None gives the defaults."""
    if path is None:
        return CollectorConfig()
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read {str(path)!r}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{str(path)!r} is not valid TOML: {exc}") from exc
    return config_from_document(document, base_dir=path.parent)
