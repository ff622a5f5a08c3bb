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
fragment_timeout_s = 30.0           # IP fragments: a datagram not whole after this is dropped
fragment_max_bytes = 67108864       # ... all held fragments together (oldest evicted past it)
fragment_max_count = 64             # ... fragments of one datagram (past it: dropped)
fragment_max_datagram_bytes = 65535 # ... bytes of one reassembled datagram

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
max_sse_line_bytes = 4194304        # an SSE line longer than this drops its event (counted,
max_sse_events = 1048576            # the record truncated), and so does every event past this
dialects = ["openai-chat", "openai-completions", "openai-responses", "anthropic-messages"]
dialect_path_prefixes = [""]        # each dialect's paths are also matched under these
                                    # (a gateway's "/openai" serves /openai/v1/chat/...;
                                    # "": the server's own paths)

[log]
path = "/var/lib/veritap/log"
key = "/etc/veritap/collector.key"  # from `collector keygen`
batch_records = 256                 # group commit: at most this many records ...
batch_delay_s = 0.05                # ... or this long, per durable transaction
level = "info"                      # logging: debug, info, warning or error

[metrics]
listen = "127.0.0.1:9400"           # Prometheus /metrics (host:port, [v6]:port; "": off)
```

Relative paths are relative to the config file. Each table is a section class below
(`[ledger]` is `collector.ledger.config`'s), checked by `veritap.config_schema`: a new key is a
field with its type, default, range and description, and a new table a field of
`CollectorDocument`; `make config-schema` then regenerates appliance/config/collector.schema.json.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field
from pydantic.dataclasses import dataclass
from veritap.config_schema import (
    SECTION,
    ConfigPath,
    Flag,
    Integer,
    LogLevel,
    MetricsListen,
    Number,
    Text,
    problem,
    read_toml,
    validate_document,
)

from collector.capture.decode import ChecksumPolicy
from collector.capture.fragments import FragmentLimits
from collector.dialects import DIALECTS
from collector.http.reader import HttpLimits
from collector.http.sse import MAX_EVENTS as MAX_SSE_EVENTS
from collector.http.sse import MAX_LINE_BYTES as MAX_SSE_LINE_BYTES
from collector.ledger.config import LedgerConfig, LedgerSection
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


Port = Annotated[Integer, Field(ge=1, le=65535)]
Seconds = Annotated[Number, Field(ge=0.001)]


def _origin(origin: str) -> str:
    if not origin or any(ch.isspace() for ch in origin) or "+" in origin:
        raise problem("must be non-empty, without spaces or '+'")
    return origin


def _dialects(names: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [name for name in names if name not in DIALECTS]
    if unknown:
        raise problem(f"unknown dialect {unknown[0]!r} (known: {', '.join(DIALECTS)})")
    return names


def _path_prefixes(prefixes: tuple[str, ...]) -> tuple[str, ...]:
    bad = [p for p in prefixes if p and (not p.startswith("/") or p.endswith("/"))]
    if bad:
        raise problem(f"prefix {bad[0]!r} must be '' or start with '/' and not end with one")
    return prefixes


def default_origin() -> str:
    return f"{socket.gethostname()}/veritap"


@dataclass(frozen=True, config=SECTION)
class CollectorSection:
    """`[collector]`."""

    origin: Annotated[
        Text,
        AfterValidator(_origin),
        Field(description="the log's origin, in its signed checkpoints (<hostname>/veritap)"),
    ] = Field(default_factory=default_origin)


@dataclass(frozen=True, config=SECTION)
class CaptureConfig:
    """`[capture]`: where and how packets are read."""

    interface: Annotated[
        Text, Field(description="AF_PACKET interface ('any': every interface, cooked)")
    ] = "lo"
    filter: Annotated[
        Text,
        Field(
            description="BPF filter, compiled with tcpdump ('': none); keep the fragment "
            "clauses: later fragments carry no TCP ports"
        ),
    ] = DEFAULT_FILTER
    server_ports: Annotated[
        tuple[Port, ...],
        Field(min_length=1, description="the API port(s): who is the server midstream"),
    ] = (DEFAULT_PORT,)
    promiscuous: Flag = True
    snaplen: Annotated[Integer, Field(ge=96, le=1 << 20)] = 262_144
    fanout_group: Annotated[
        Integer, Field(ge=0, le=0xFFFF, description=">0: join this PACKET_FANOUT group")
    ] = 0
    ring_block_bytes: Annotated[
        Integer, Field(ge=1 << 16, le=1 << 30, description="TPACKET_V3 ring: block size")
    ] = 4 * 1024 * 1024
    ring_blocks: Annotated[
        Integer, Field(ge=2, le=1 << 16, description="TPACKET_V3 ring: block count")
    ] = 64
    stats_interval_s: Annotated[
        Number, Field(ge=0.1, description="how often kernel drop counters are read")
    ] = 10.0
    checksums: Annotated[
        ChecksumPolicy,
        Field(
            description="'verify': a bad IPv4/TCP checksum drops the frame; 'ignore' only "
            "where offload leaves them unfilled (the sending host, tc mirror egress)"
        ),
    ] = ChecksumPolicy.VERIFY
    fragment_timeout_s: Annotated[
        Seconds,
        Field(description="IP fragments: a datagram not whole after this is dropped (Linux: 30)"),
    ] = 30.0
    fragment_max_bytes: Annotated[
        Integer,
        Field(ge=1 << 16, description="all held fragments together; the oldest evicted past it"),
    ] = 64 * 1024 * 1024
    fragment_max_count: Annotated[
        Integer, Field(ge=2, le=8192, description="fragments of one datagram; past it: dropped")
    ] = 64
    fragment_max_datagram_bytes: Annotated[
        Integer,
        Field(ge=576, le=65_535, description="bytes of one reassembled datagram (IP's 65535)"),
    ] = 65_535

    def fragment_limits(self) -> FragmentLimits:
        return FragmentLimits(
            timeout_ns=int(self.fragment_timeout_s * 1e9),
            max_bytes=self.fragment_max_bytes,
            max_fragments=self.fragment_max_count,
            max_datagram_bytes=self.fragment_max_datagram_bytes,
        )


@dataclass(frozen=True, config=SECTION)
class ReassemblyConfig:
    """`[reassembly]`: TCP stream limits."""

    gap_timeout_s: Annotated[
        Seconds,
        Field(
            description="a hole not filled after this becomes a gap (longer than TCP's "
            "retransmission backoff)"
        ),
    ] = 60.0
    window_bytes: Annotated[
        Integer, Field(ge=1024, description="... or when this much is buffered beyond it")
    ] = 8 * 1024 * 1024
    max_buffered_bytes: Annotated[Integer, Field(ge=1024, description="all flows together")] = (
        512 * 1024 * 1024
    )
    idle_timeout_s: Seconds = 300.0
    max_flows: Annotated[Integer, Field(ge=1)] = 100_000

    def limits(self, server_ports: tuple[int, ...]) -> ReassemblyLimits:
        return ReassemblyLimits(
            gap_timeout_ns=int(self.gap_timeout_s * 1e9),
            window_bytes=self.window_bytes,
            max_buffered_bytes=self.max_buffered_bytes,
            idle_timeout_ns=int(self.idle_timeout_s * 1e9),
            max_flows=self.max_flows,
            server_ports=frozenset(server_ports),
        )


@dataclass(frozen=True, config=SECTION)
class HttpConfig:
    """`[http]`: message limits, pairing and the API dialects."""

    max_head_bytes: Annotated[Integer, Field(ge=256)] = 64 * 1024
    max_body_bytes: Annotated[Integer, Field(ge=1024)] = 64 * 1024 * 1024
    response_skew_s: Annotated[
        Number,
        Field(ge=0.0, description="a response captured this much before its request pairs"),
    ] = 0.1
    max_sse_line_bytes: Annotated[
        Integer,
        Field(
            ge=1024,
            description="an SSE line longer than this drops its event (counted, the record "
            "truncated)",
        ),
    ] = MAX_SSE_LINE_BYTES
    max_sse_events: Annotated[
        Integer,
        Field(ge=1, description="SSE events kept per response; later ones dropped and counted"),
    ] = MAX_SSE_EVENTS
    dialects: Annotated[
        tuple[Text, ...],
        AfterValidator(_dialects),
        Field(description=f"API dialects to extract ({', '.join(DIALECTS)})"),
    ] = tuple(DIALECTS)
    dialect_path_prefixes: Annotated[
        tuple[Text, ...],
        Field(
            min_length=1,
            description="the dialects' paths are matched under each of these, as the server "
            "routes them (a gateway's '/openai': /openai/v1/chat/completions; '': the server's "
            "own paths)",
        ),
        AfterValidator(_path_prefixes),
    ] = ("",)

    def limits(self) -> HttpLimits:
        return HttpLimits(
            max_head_bytes=self.max_head_bytes,
            max_body_bytes=self.max_body_bytes,
            response_skew_ns=int(self.response_skew_s * 1e9),
            max_sse_line_bytes=self.max_sse_line_bytes,
            max_sse_events=self.max_sse_events,
        )


@dataclass(frozen=True, config=SECTION)
class LogConfig:
    """`[log]`: the signed log, and the daemon's logging."""

    path: ConfigPath = Path("/var/lib/veritap/log")
    key: Annotated[ConfigPath, Field(description="from `collector keygen`")] = Path(
        "/etc/veritap/collector.key"
    )
    batch_records: Annotated[
        Integer, Field(ge=1, description="group commit: at most this many records ...")
    ] = 256
    batch_delay_s: Annotated[
        Number, Field(ge=0.0, description="... or this long, per durable transaction")
    ] = 0.05
    level: Annotated[
        LogLevel, Field(description="least severe messages logged (-v on the command line: debug)")
    ] = LogLevel.INFO


@dataclass(frozen=True, config=SECTION)
class MetricsConfig:
    """`[metrics]`."""

    listen: Annotated[
        MetricsListen,
        Field(description="Prometheus /metrics (host:port, [v6]:port; '': off, still counted)"),
    ] = "127.0.0.1:9400"


@dataclass(frozen=True, config=SECTION)
class CollectorDocument:
    """A collector TOML file, table by table."""

    collector: CollectorSection = CollectorSection()
    capture: CaptureConfig = CaptureConfig()
    reassembly: ReassemblyConfig = ReassemblyConfig()
    http: HttpConfig = HttpConfig()
    log: LogConfig = LogConfig()
    ledger: LedgerSection = LedgerSection()
    metrics: MetricsConfig = MetricsConfig()


@dataclasses.dataclass(frozen=True)
class CollectorConfig:
    """The collector's settings as the daemon uses them (`[collector] origin` on top)."""

    origin: str = dataclasses.field(default_factory=default_origin)
    capture: CaptureConfig = dataclasses.field(default_factory=CaptureConfig)
    reassembly: ReassemblyConfig = dataclasses.field(default_factory=ReassemblyConfig)
    http: HttpConfig = dataclasses.field(default_factory=HttpConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    ledger: LedgerConfig = dataclasses.field(default_factory=LedgerConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)


def config_from_document(document: Mapping[str, object], *, base_dir: Path) -> CollectorConfig:
    """Validate a parsed TOML document (relative paths are relative to `base_dir`)."""
    return effective_config(validate_document(CollectorDocument, document, base_dir=base_dir))


def effective_config(document: CollectorDocument) -> CollectorConfig:
    """The daemon's settings from a validated file."""
    return CollectorConfig(
        origin=document.collector.origin,
        capture=document.capture,
        reassembly=document.reassembly,
        http=document.http,
        log=document.log,
        ledger=document.ledger.to_config(),
        metrics=document.metrics,
    )


def load_document(path: Path | None) -> CollectorDocument:
    """Read and validate a collector TOML file; None gives the defaults."""
    if path is None:
        return CollectorDocument()
    return validate_document(CollectorDocument, read_toml(path), base_dir=path.parent)


def load_config(path: Path | None) -> CollectorConfig:
    """Read and validate a collector TOML file; None gives the defaults."""
    return effective_config(load_document(path))
