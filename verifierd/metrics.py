"""verifierd's Prometheus metrics: one registry, one object per metric, served at /metrics.

`METRICS` is the daemon's instance: intake and the engine pool increment its attributes
directly (`METRICS.engine_loads.labels(commitment=cid, outcome="ok").inc()`); the compute-meter
service feeds it the meter's readings and batch costs and, with `[metrics] prover_url`, sets the
vca gauge from the recent window (`set_vca`); the metrics service (verifierd.services.metrics)
counts verdicts and backlog from the store and serves it at `[metrics] listen`. Tests make their
own `VerifierMetrics()` (each has its own registry).

Labels: `origin` (a collector), `commitment` (a commitment id), `status` (a verdict status in
lower case: "pass", "fail", ...), `target` ("gpu0", "pid1234": what the meter measured),
`method` (nvml-gpm, nvml-utilization, cpu-seconds). `veritap_commitment_info` names each
commitment's model; `veritap_build_info`, `process_*` and `python_info` describe the process
(veritap.runtime_metrics).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from veritap.metrics_http import MetricsServer, serve_metrics
from veritap.runtime_metrics import register_runtime_metrics
from veritap.v1 import verifier_pb2

from verifierd.meter.readings import Method, Reading
from verifierd.meter.sampling import Meter, ReadingCallback
from verifierd.provers.identity import ProverKey

if TYPE_CHECKING:  # verifierd.vca brings aiohttp and LMDB, which the metrics do not need
    from verifierd.commitments import Commitment
    from verifierd.vca import VcaRow

_PREFIX = "veritap_verifier_"

# From a small CPU batch to a large prefill on a slow engine.
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_LOAD_BUCKETS = (1, 5, 10, 30, 60, 120, 300, 600, 900, 1800)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


#: `kind` label of veritap_prover_alarm for each AlarmKind value.
_ALARM_KINDS = {
    verifier_pb2.ALARM_KIND_DISHONEST: "dishonest",
    verifier_pb2.ALARM_KIND_HIDING: "hiding",
}


def status_label(status: int) -> str:
    """`VERDICT_STATUS_PASS` (1) -> "pass"."""
    name = verifier_pb2.VerdictStatus.Name(status)  # type: ignore[arg-type]
    return name.removeprefix("VERDICT_STATUS_").lower()


class VerifierMetrics:
    """Every metric verifierd exports. Attributes are prometheus-client metric objects."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = CollectorRegistry() if registry is None else registry
        r = self.registry
        register_runtime_metrics(r, "verifierd")
        self.commitment_info = Gauge(
            "veritap_commitment_info",
            "Always 1 for each commitment this verifier verifies; the labels name its model "
            "(first served model name), dtype and sampler profile, to join onto the 64-hex "
            "commitment label of the other series.",
            ["commitment", "model", "dtype", "sampler"],
            registry=r,
        )
        # Intake.
        self.intake_entries = Counter(
            _PREFIX + "intake_entries",
            "Log entries received from a collector, verified and stored.",
            ["origin"],
            registry=r,
        )
        self.intake_lag = Gauge(
            _PREFIX + "intake_lag_entries",
            "Entries a collector has that this verifier has not stored yet "
            "(collector head seq - stored seq).",
            ["origin"],
            registry=r,
        )
        self.intake_alerts = Counter(
            _PREFIX + "intake_alerts",
            "Intake alerts: stops on evidence (fork, gap, bad signature), and entries"
            " withheld (reason withheld_entry: kept as their hash only, intake goes on).",
            ["origin", "reason"],
            registry=r,
        )
        self.intake_stopped = Gauge(
            _PREFIX + "intake_stopped",
            "1 while intake from a collector is stopped by an alert (until an operator clears "
            "it: `verifierd intake clear`), with the alert's reason.",
            ["origin", "reason"],
            registry=r,
        )
        self.awaiting_checkpoint = Gauge(
            _PREFIX + "awaiting_checkpoint_entries",
            "Stored entries not judged yet because no verified signed checkpoint covers them "
            "(or an alert stops judging their collector).",
            registry=r,
        )
        # Work queue.
        self.backlog = Gauge(
            _PREFIX + "backlog_records",
            "Records waiting for their commitment's engine.",
            ["commitment"],
            registry=r,
        )
        self.backlog_oldest_age = Gauge(
            _PREFIX + "backlog_oldest_age_seconds",
            "How long the oldest waiting record of a commitment has waited.",
            ["commitment"],
            registry=r,
        )
        self.verdicts = Counter(
            _PREFIX + "verdicts",
            'Verdicts signed, by commitment, status and reason ("" for PASS), those that '
            "supersede an earlier verdict of their record included (the collector amended "
            "it): the records' current verdicts are this minus "
            f"{_PREFIX}verdicts_superseded_total of the same labels.",
            ["commitment", "status", "reason"],
            registry=r,
        )
        self.verdicts_superseded = Counter(
            _PREFIX + "verdicts_superseded",
            "Verdicts a later verdict of their record superseded (the collector amended it), "
            "by the superseded verdict's commitment, status and reason: no longer any "
            "record's current verdict.",
            ["commitment", "status", "reason"],
            registry=r,
        )
        # Provers (verifierd.provers): `prover` is ORIGIN/ADDRESS:PORT.
        self.prover_alarm = Gauge(
            "veritap_prover_alarm",
            "1 while an alarm of that kind is in force for the prover (dishonest: its "
            "sequential test crossed the bound; hiding: an unverifiable share over its rate), "
            "else 0.",
            ["prover", "kind"],
            registry=r,
        )
        self.prover_unverifiable_ratio = Gauge(
            "veritap_prover_unverifiable_ratio",
            "Share of the prover's verdicts over [provers.hiding] window_s that are "
            "UNVERIFIABLE, by reason.",
            ["prover", "reason"],
            registry=r,
        )
        self.prover_unseeded_share = Gauge(
            "veritap_prover_unseeded_share",
            "Share of the prover's sampled verdicts (temperature above 0) over [provers.hiding] "
            "window_s that came without a seed (UNVERIFIABLE no_seed).",
            ["prover"],
            registry=r,
        )
        self.prover_evidence = Gauge(
            "veritap_prover_evidence",
            "The prover's sequential test statistic: ln of its e-value (an alarm is raised at "
            "ln(1/(alpha*day))); 0 while no test runs.",
            ["prover"],
            registry=r,
        )
        self._prover_series: set[tuple[str, ...]] = set()
        # Engines.
        self.engine_loads = Counter(
            _PREFIX + "engine_loads",
            "Engine loads, by outcome (ok, failed, timeout).",
            ["commitment", "outcome"],
            registry=r,
        )
        self.engine_unloads = Counter(
            _PREFIX + "engine_unloads",
            "Engine unloads, by reason (idle, evicted, failed, requested, shutdown).",
            ["commitment", "reason"],
            registry=r,
        )
        self.engines_loaded = Gauge(
            _PREFIX + "engines_loaded",
            "Engines loaded and ready or busy now.",
            registry=r,
        )
        self.engine_load_seconds = Histogram(
            _PREFIX + "engine_load_seconds",
            "Time from starting an engine to its being ready.",
            ["commitment"],
            buckets=_LOAD_BUCKETS,
            registry=r,
        )
        self.batch_records = Histogram(
            _PREFIX + "batch_records",
            "Records per engine batch.",
            ["commitment"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.prefill_seconds = Histogram(
            _PREFIX + "prefill_seconds",
            "Engine prefill time of one verdict (its share of its batch's prefill, by tokens).",
            ["commitment"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.scoring_seconds = Histogram(
            _PREFIX + "scoring_seconds",
            "Time to rebuild the sampler noise and score one verdict's tokens with Token-DiFR.",
            ["commitment"],
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        # Compute: what the meter sees, and what batches cost.
        self.meter_method = Gauge(
            _PREFIX + "meter_method",
            "1 for the method the compute meter uses (nvml-gpm, nvml-utilization, cpu-seconds).",
            ["method"],
            registry=r,
        )
        self.activity = Gauge(
            _PREFIX + "activity_ratio",
            "Latest mean activity of a metered target: tensor-pipe active fraction (nvml-gpm), "
            "GPU busy fraction (nvml-utilization) or cores busy (cpu-seconds).",
            ["target", "method"],
            registry=r,
        )
        self.sm_activity = Gauge(
            _PREFIX + "sm_active_ratio",
            "Latest fraction of SMs busy on a GPU (nvml-gpm).",
            ["target"],
            registry=r,
        )
        self.dram_activity = Gauge(
            _PREFIX + "dram_active_ratio",
            "Latest fraction of DRAM bandwidth used on a GPU (nvml-gpm; nvml-utilization: "
            "fraction of time memory was read or written).",
            ["target"],
            registry=r,
        )
        self.activity_seconds = Counter(
            _PREFIX + "activity_seconds",
            "Activity integrated over time on a metered target (GPU-seconds at full activity, or "
            "CPU-seconds), whatever ran there.",
            ["target", "method"],
            registry=r,
        )
        self.batch_activity_seconds = Counter(
            _PREFIX + "batch_activity_seconds",
            "Activity-seconds attributed to engine batches of a commitment.",
            ["commitment", "method"],
            registry=r,
        )
        self.vca = Gauge(
            _PREFIX + "vca",
            "Verifier compute advantage: prover activity per generated token over verifier "
            "activity per verified token, for the batches whose traffic ended in the last "
            "[metrics] vca_window_s (absent while unknown).",
            ["commitment", "method"],
            registry=r,
        )
        self._vca_series: set[tuple[str, str]] = set()

    def commitments_known(self, commitments: Iterable[Commitment]) -> None:
        """Export one `veritap_commitment_info` series per commitment (the daemon's are fixed
        at start)."""
        for c in commitments:
            self.commitment_info.labels(
                commitment=c.commitment_id,
                model=c.served_model_names[0],
                dtype=c.dtype,
                sampler=c.sampler_profile,
            ).set(1)

    def verdict_decided(self, commitment_id: str, status: int, reason: str = "") -> None:
        self.verdicts.labels(
            commitment=commitment_id, status=status_label(status), reason=reason
        ).inc()

    def verdict_stored(
        self, verdict: verifier_pb2.Verdict, superseded: verifier_pb2.Verdict | None = None
    ) -> None:
        """Count one stored verdict and, for a recomputed one (scored in an engine batch), its
        prefill and scoring time; ``superseded``: the record's verdict it replaced, counted
        out of the current ones."""
        self.verdict_decided(verdict.commitment_id, verdict.status, verdict.reason)
        if superseded is not None:
            self.verdicts_superseded.labels(
                commitment=superseded.commitment_id,
                status=status_label(superseded.status),
                reason=superseded.reason,
            ).inc()
        timings = verdict.timings
        if timings.batch_size:
            cid = verdict.commitment_id
            self.prefill_seconds.labels(commitment=cid).observe(timings.prefill_ns / 1e9)
            self.scoring_seconds.labels(commitment=cid).observe(timings.scoring_ns / 1e9)

    def set_provers(self, provers: Iterable[verifier_pb2.Prover], window_s: int) -> None:
        """Export each prover's alarm state, its unverifiable share by reason over the
        ``window_s`` window, and its test statistic; drop the series no longer reported."""
        fresh: set[tuple[str, ...]] = set()
        for prover in provers:
            name = ProverKey.of_proto(prover.id).label
            in_force = {state.alarm.kind for state in prover.alarms}
            for kind, label in _ALARM_KINDS.items():
                self.prover_alarm.labels(prover=name, kind=label).set(int(kind in in_force))
                fresh.add(("alarm", name, label))
            window = next((w for w in prover.windows if w.window_s == window_s), None)
            shares = {} if window is None else dict(window.unverifiable_share)
            for reason, share in shares.items():
                self.prover_unverifiable_ratio.labels(prover=name, reason=reason).set(share)
                fresh.add(("ratio", name, reason))
            if window is not None:
                self.prover_unseeded_share.labels(prover=name).set(window.unseeded_share)
                fresh.add(("unseeded", name))
            self.prover_evidence.labels(prover=name).set(prover.evidence)
            fresh.add(("evidence", name))
        for gone in self._prover_series - fresh:
            gauge = {
                "alarm": self.prover_alarm,
                "ratio": self.prover_unverifiable_ratio,
                "unseeded": self.prover_unseeded_share,
            }.get(gone[0], self.prover_evidence)
            gauge.remove(*gone[1:])
        self._prover_series = fresh

    def record_reading(self, reading: Reading, method: Method) -> None:
        """Export one meter reading: latest ratios and the running activity integral."""
        if reading.activity is not None:
            self.activity.labels(target=reading.target, method=str(method)).set(reading.activity)
            self.activity_seconds.labels(target=reading.target, method=str(method)).inc(
                reading.activity * reading.seconds
            )
        if reading.sm is not None:
            self.sm_activity.labels(target=reading.target).set(reading.sm)
        if reading.dram is not None:
            self.dram_activity.labels(target=reading.target).set(reading.dram)

    def reading_callback(self, meter: Meter) -> ReadingCallback:
        """A callback for `meter.subscribe()` that exports its readings; marks its method."""
        method = meter.method
        self.meter_method.labels(method=str(method)).set(1)

        def export(reading: Reading) -> None:
            self.record_reading(reading, method)

        return export

    def set_vca(self, rows: Iterable[VcaRow]) -> None:
        """Export the VCA of each (commitment, method) row that has one; drop the series of
        those that no longer do (no batch in the window, or no prover reading)."""
        fresh = {(row.commitment_id, str(row.method)): row.vca for row in rows}
        known = {labels: vca for labels, vca in fresh.items() if vca is not None}
        for labels in self._vca_series - known.keys():
            self.vca.remove(*labels)
        for (commitment, method), vca in known.items():
            self.vca.labels(commitment=commitment, method=method).set(vca)
        self._vca_series = set(known)

    def serve(self, address: str) -> MetricsServer:
        """Serve this registry at http://ADDRESS/metrics (port 0: any free port)."""
        return serve_metrics(self.registry, address)


#: The daemon's metrics (one registry per process).
METRICS = VerifierMetrics()
