"""From stored log entries to signed verdicts: the scheduler's I/O shell.

Two steps, each ending in one store transaction:

1. **Classify** new entries (the store's inbox) once a verified signed
   checkpoint covers them and the bytes read back are shown to be what the
   collector signed (:mod:`verifierd.intake.stored_entries`; a forged checkpoint
   or an altered entry is an intake alert, never a verdict): a record that cannot
   be verified (capture gap, no output, unknown model, no seed, unreplayable
   parameters) or is not selected by the sampling policy gets its terminal
   verdict at once; the others join their commitment's pending queue. Every
   verdict names the checkpoint that authenticated its entry.
2. **Score** one batch: pick a commitment (:func:`scheduler.next_commitment`),
   check its weights, load its engine, rebuild the records' tokens, send one
   batch (:func:`scheduler.plan_batch`) to the engine, sign the verdicts and
   store them while deleting their queue items. An engine failure reschedules
   the batch's records with backoff; after ``max_attempts`` they become
   UNVERIFIABLE(engine_error).

The collector's amendments: an amendment record (a late copy of bytes it had already
recorded differed) gets its own verdict, UNVERIFIABLE(amendment), and every record it
names is judged UNVERIFIABLE(record_amended): one already judged gets a new signed verdict
that supersedes its verdict (kept in the store's history), one classified or scored later
(the amendment is kept in the store, so after a restart too) is judged that way when its
verdict is written, and a queued one never goes to the engine.

A crash at any point loses nothing and duplicates nothing: work whose
transaction did not commit is redone, and a queue item whose verdict committed
is gone. :meth:`Pipeline.run` loops in its own thread; every blocking call
(LMDB, engine loads, engine batches) happens there, never on the event loop.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from veritap.envelope import EnvelopeError, decode_envelope, decode_record, entry_hash
from veritap.signing import Signer, Verifier
from veritap.v1 import record_pb2, verifier_pb2

from appliance.journal import MessageId
from verifierd import scheduler
from verifierd.commitments import Commitment, CommitmentRegistry, DifrSettings
from verifierd.config import Config
from verifierd.engine.backend import ScoreRequest, ScoreResult
from verifierd.engine.pool import EngineError, EnginePool, EngineRef
from verifierd.evidence.client_view import EvidenceUnavailable, choice_evidence
from verifierd.intake.alert_reasons import AlertReason
from verifierd.intake.link import load_collector_key
from verifierd.intake.stored_entries import (
    AuthenticEntry,
    StoredEntryAuthenticator,
    evidence,
    pending_tag,
)
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.request_sampling import (
    SamplingNotReproducibleError,
    request_replay,
    request_sampling,
)
from verifierd.samplers import get_profile
from verifierd.store import (
    AmendmentNote,
    AmendmentWrite,
    Enqueue,
    PendingItem,
    Retry,
    Store,
    StoredEntry,
    Supersede,
    Tampered,
    VerdictWrite,
)
from verifierd.verdicts import (
    FAIL,
    PASS,
    Reason,
    amended,
    base_verdict,
    sign_verdict,
    superseding,
    unverifiable,
)
from verifierd.weights_cache import WeightsCache, WeightsError

log = logging.getLogger(__name__)

_COMPLETE = record_pb2.CAPTURE_QUALITY_COMPLETE
#: Pending items read per scoring step (a batch is planned from these).
_WINDOW = 4


@dataclass(frozen=True)
class EngineBatch:
    """One engine call, as the compute meter sees it."""

    batch_id: str
    commitment_id: str
    engine: EngineRef
    start_ns: int
    end_ns: int
    records: int
    prompt_tokens: int
    completion_tokens: int
    sample_rate: float
    #: Earliest request_first_byte_ns and latest response_last_byte_ns of its records.
    traffic_start_ns: int
    traffic_end_ns: int


class BatchMeter(Protocol):
    """Measures what an engine batch cost (verifierd's GPU / CPU meter)."""

    def measure(self, batch: EngineBatch) -> verifier_pb2.ComputeCost | None: ...


@dataclass(frozen=True)
class _Work:
    """A pending record ready for the engine (never an amended one: :meth:`Pipeline._prepare`
    closes those)."""

    item: PendingItem
    entry: StoredEntry
    record: record_pb2.InferenceRecord
    requests: tuple[ScoreRequest, ...]
    #: API choice index of each request.
    choice_indices: tuple[int, ...]

    @property
    def needs_seed(self) -> bool:
        """Whether the request samples (its choices share the temperature)."""
        return not self.requests[0].sampling.effective().is_greedy


class Pipeline:
    def __init__(
        self,
        *,
        config: Config,
        store: Store,
        registry: CommitmentRegistry,
        weights: WeightsCache,
        pool: EnginePool,
        signer: Signer,
        secret: bytes,
        clock: Callable[[], int] = time.time_ns,
        reverify: bool = False,
        metrics: VerifierMetrics = METRICS,
        collector_keys: Mapping[str, Verifier] | None = None,
    ) -> None:
        """``reverify``: hash every committed file at each commitment's first engine load
        instead of trusting the weights cache's stamps. ``collector_keys``: each origin's
        pinned key (default: the `[[collectors]]` of ``config``); entries of an origin
        without one are never judged."""
        self._config = config
        self._store = store
        self._registry = registry
        self._weights = weights
        self._pool = pool
        self._signer = signer
        self._secret = secret
        self._clock = clock
        self._meter: BatchMeter | None = None
        self._blocked_until: dict[str, int] = {}
        self._model_dirs: dict[str, Path] = {}
        self._reverify = reverify
        self._metrics = metrics
        if collector_keys is None:
            collector_keys = {c.origin: load_collector_key(c.public_key) for c in config.collectors}
        self._pinned_origins = frozenset(collector_keys)
        self._authenticator = StoredEntryAuthenticator(store, collector_keys)
        self._alert_listeners: list[Callable[[str, str], None]] = []

    def set_batch_meter(self, meter: BatchMeter) -> None:
        self._meter = meter

    def add_alert_listener(self, listener: Callable[[str, str], None]) -> None:
        """Call ``listener(origin, reason)`` (in the pipeline's thread) after an alert
        about an origin's stored entries was stored, so that its intake stops too."""
        self._alert_listeners.append(listener)

    def _alerted(self, origin: str, reason: str) -> None:
        self._metrics.intake_alerts.labels(origin, reason).inc()
        for listener in self._alert_listeners:
            listener(origin, reason)

    @property
    def registry(self) -> CommitmentRegistry:
        return self._registry

    def settings_for(self, commitment: Commitment) -> DifrSettings:
        """The DiFR settings in force: an operator's override, else the committed ones."""
        override = self._store.difr_override(commitment.commitment_id)
        return commitment.difr if override is None else DifrSettings.from_proto(override)

    # -- the loop -----------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Classify and score until ``stop`` is set; idle engines are unloaded on the way."""
        while not stop.is_set():
            worked = self.classify_some() > 0
            worked = self.score_some(stop) > 0 or worked
            self._pool.unload_idle()
            if not worked:
                stop.wait(self._config.scheduler.poll_interval_s)

    # -- classification -----------------------------------------------------------------

    def classify_some(self) -> int:
        """Classify up to ``classify_batch`` authenticated inbox entries in one
        transaction; returns how many left the inbox."""
        entries = self._store.inbox(
            self._config.scheduler.classify_batch, origins=self._pinned_origins
        )
        if not entries:
            return 0
        checked = self._authenticator.authenticate(entries)
        for alert in checked.alerts:
            log.error(
                "stored log does not verify: judging from this origin stops",
                extra={"origin": alert.origin, "reason": alert.reason, "detail": alert.detail},
            )
            self._store.set_alert(alert.origin, alert.reason, alert.evidence)
            self._alerted(alert.origin, alert.reason)
        decoded = [(authentic, _decoded(authentic.entry)) for authentic in checked.authentic]
        amendments = self._amendments_of_batch(decoded)
        items: list[Enqueue | VerdictWrite | AmendmentWrite | Tampered] = [
            self._classify_or_close(authentic, record, amendments) for authentic, record in decoded
        ]
        items.extend(checked.tampered)
        if items:
            self._store.classify(items)
        for tampered in checked.tampered:
            self._alerted(tampered.origin, tampered.reason)
        return len(items)

    def _amendments_of_batch(
        self,
        decoded: Sequence[tuple[AuthenticEntry, record_pb2.InferenceRecord | EnvelopeError]],
    ) -> dict[tuple[str, str], AmendmentNote]:
        """The amendment of each record classified together, looked up once for the batch:
        the first among the batch's entries, else the store's (one read)."""
        records = [
            (authentic.entry.origin, record.record_id)
            for authentic, record in decoded
            if not isinstance(record, EnvelopeError)
        ]
        return {**self._store.amendments_of(records), **_amendments_in(decoded)}

    def _classify_or_close(
        self,
        authentic: AuthenticEntry,
        record: record_pb2.InferenceRecord | EnvelopeError,
        amendments: Mapping[tuple[str, str], AmendmentNote],
    ) -> Enqueue | VerdictWrite | AmendmentWrite:
        entry = authentic.entry
        try:
            return self._classify(authentic, record, amendments)
        except Exception as exc:
            log.exception("classification failed", extra={"origin": entry.origin, "seq": entry.seq})
            v = _authenticated_verdict(authentic, record_id="", model="")
            detail = f"{type(exc).__name__}: {exc}"
            return self._write(entry, "", unverifiable(v, Reason.INTERNAL_ERROR, detail))

    def _classify(
        self,
        authentic: AuthenticEntry,
        record: record_pb2.InferenceRecord | EnvelopeError,
        amendments: Mapping[tuple[str, str], AmendmentNote],
    ) -> Enqueue | VerdictWrite | AmendmentWrite:
        """``record``: the entry's record, or why it does not decode; ``amendments``: the
        batch's, by (origin, amended record id) (:meth:`_amendments_of_batch`): a record
        without one here has none, so the verdicts written below need no other lookup."""
        entry = authentic.entry
        if isinstance(record, EnvelopeError):
            v = _authenticated_verdict(authentic, record_id="", model="")
            return self._write(entry, "", unverifiable(v, Reason.BAD_RECORD, str(record)))
        api = record.api
        v = _authenticated_verdict(authentic, record_id=record.record_id, model=api.model)
        if record.amends_record_ids:
            return self._amendment(entry, record, v)
        note = amendments.get((entry.origin, record.record_id))
        if note is not None:
            return self._write(entry, record.record_id, _amended(v, note))
        if record.quality != _COMPLETE:
            quality = record_pb2.CaptureQuality.Name(record.quality)
            detail = f"{quality}: {record.quality_reason}".rstrip(": ")
            return self._write(entry, record.record_id, unverifiable(v, Reason.CAPTURE_GAP, detail))
        if record.response.status != 200 or api.error or not api.choices:
            detail = api.error or f"HTTP {record.response.status}, {len(api.choices)} choices"
            return self._write(entry, record.record_id, unverifiable(v, Reason.NO_OUTPUT, detail))
        commitment = self._registry.by_model.get(api.model)
        if commitment is None:
            detail = f"no commitment serves model {api.model!r}"
            return self._write(
                entry, record.record_id, unverifiable(v, Reason.UNKNOWN_COMMITMENT, detail)
            )
        settings = self.settings_for(commitment)
        _describe(v, commitment, settings)
        try:
            sampling = request_sampling(
                api.sampling,
                commitment.generation_defaults,
                get_profile(commitment.sampler_profile),
                structured_outputs=commitment.structured_outputs,
                request_json=_request_json(record),
                serving=commitment.serving,
            )
        except SamplingNotReproducibleError as exc:
            v.needs_seed = exc.reason is Reason.NO_SEED
            return self._write(entry, record.record_id, unverifiable(v, exc.reason, exc.detail))
        v.needs_seed = not sampling.effective().is_greedy
        if not scheduler.selected(self._secret, record.record_id, settings.sample_rate):
            detail = f"sample rate {settings.sample_rate}"
            return self._write(entry, record.record_id, unverifiable(v, Reason.NOT_SAMPLED, detail))
        return Enqueue(
            entry.origin,
            entry.seq,
            record.record_id,
            commitment.commitment_id,
            checkpoint_tree_size=authentic.checkpoint_tree_size,
            checkpoint_root_hash=authentic.checkpoint_root_hash,
            tag=self._tag(entry.origin, entry.seq, entry.entry_hash, authentic),
        )

    def _tag(
        self, origin: str, seq: int, digest: bytes, checkpoint: AuthenticEntry | PendingItem
    ) -> bytes:
        """The queue item's MAC over the entry hash and the checkpoint that authenticated it."""
        return pending_tag(
            self._secret,
            origin=origin,
            seq=seq,
            entry_hash=digest,
            checkpoint_tree_size=checkpoint.checkpoint_tree_size,
            checkpoint_root_hash=checkpoint.checkpoint_root_hash,
        )

    def _amendment(
        self, entry: StoredEntry, record: record_pb2.InferenceRecord, v: verifier_pb2.Verdict
    ) -> AmendmentWrite:
        """The amendment record's own verdict, and a superseding verdict for each record it
        names that has one from its origin (one already amended keeps its verdict)."""
        own = self._write(
            entry, record.record_id, unverifiable(v, Reason.AMENDMENT, record.quality_reason)
        )
        supersedes = []
        for amended_id in dict.fromkeys(record.amends_record_ids):
            for stored in self._store.verdicts_for_record(amended_id):
                if stored.origin != entry.origin or stored.verdict.amended_by_record_id:
                    continue
                new = superseding(
                    stored.signed,
                    stored.verdict,
                    amendment_record_id=record.record_id,
                    amendment_reason=record.quality_reason,
                )
                write = self._sign(stored.origin, stored.seq, amended_id, new)
                supersedes.append(Supersede(stored, write))
        log.warning(
            "collector amended records: their verdicts are superseded",
            extra={
                "origin": entry.origin,
                "record_id": record.record_id,
                "amends_record_ids": list(record.amends_record_ids),
                "superseded": len(supersedes),
            },
        )
        return AmendmentWrite(
            own, tuple(record.amends_record_ids), record.quality_reason, tuple(supersedes)
        )

    def _write(self, entry: StoredEntry, record_id: str, v: verifier_pb2.Verdict) -> VerdictWrite:
        """Sign ``v`` about ``entry``'s record. Its amendment was looked up once, with its
        batch, by the caller: an amended record's ``v`` is already UNVERIFIABLE(record_amended)
        (classification, :meth:`_prepare`, :meth:`_give_up`)."""
        return self._sign(entry.origin, entry.seq, record_id, v)

    def _sign(self, origin: str, seq: int, record_id: str, v: verifier_pb2.Verdict) -> VerdictWrite:
        v.decided_at_ns = self._clock()
        if v.status == FAIL:
            log.warning(
                "FAIL verdict: %s",
                v.reason,
                extra={
                    "message_id": MessageId.FAIL_VERDICT,
                    "origin": origin,
                    "seq": seq,
                    "record_id": record_id,
                    "commitment_id": v.commitment_id,
                    "reason": v.reason,
                    "score": v.score,
                },
            )
        return VerdictWrite(origin, seq, record_id, sign_verdict(v, self._signer), v)

    # -- scoring ------------------------------------------------------------------------

    def score_some(self, stop: threading.Event | None = None) -> int:
        """Run at most one engine batch; returns how many records got a verdict."""
        now = self._clock()
        commitment_id = scheduler.next_commitment(
            self._store.backlog(),
            loaded=self._pool.loaded,
            now_ns=now,
            switch_after_s=self._config.scheduler.switch_after_s,
            runnable=lambda cid: self._blocked_until.get(cid, 0) <= now,
        )
        if commitment_id is None:
            return 0
        commitment = self._registry.by_id.get(commitment_id)
        limit = self._config.engines.max_batch_requests * _WINDOW
        items = self._store.take_pending(commitment_id, limit, now)
        if not items:
            # Everything waits for a retry: look again after the shortest backoff.
            self._blocked_until[commitment_id] = now + int(
                self._config.scheduler.backoff_initial_s * 1e9
            )
            return 0
        if commitment is None:
            return self._give_up(items, Reason.UNKNOWN_COMMITMENT, "commitment no longer loaded")
        try:
            model_dir = self._model_dir(commitment)
        except WeightsError as exc:
            return self._give_up(items, Reason(exc.reason), str(exc), commitment)
        settings = self.settings_for(commitment)
        work, done = self._prepare(items, commitment, settings, model_dir)
        jobs = [
            scheduler.Job(
                w,
                prompt=w.requests[0].prompt_token_ids or _prompt_key(w.record),
                tokens=sum(planned_tokens(r) for r in w.requests),
                requests=len(w.requests),
            )
            for w in work
        ]
        batch = [
            j.item
            for j in scheduler.plan_batch(
                jobs,
                max_requests=self._config.engines.max_batch_requests,
                max_tokens=self._config.engines.max_batch_tokens,
            )
        ]
        retries: list[Retry] = []
        if batch:
            try:
                done += self._run_batch(batch, commitment, settings, model_dir)
            except EngineError as exc:
                if stop is not None and stop.is_set():
                    log.info("batch abandoned at shutdown", extra={"commitment_id": commitment_id})
                else:
                    log.warning(
                        "engine failure", extra={"commitment_id": commitment_id, "error": str(exc)}
                    )
                    d, retries = self._failed(batch, commitment, settings, str(exc))
                    done += d
        return self._store.finish(done, retries)

    def _model_dir(self, commitment: Commitment) -> Path:
        """The verified weights directory (checked whenever the engine is not loaded)."""
        cid = commitment.commitment_id
        if cid not in self._model_dirs or not self._pool.loaded(cid):
            first = cid not in self._model_dirs
            checked = self._weights.verify(commitment, reverify=self._reverify and first)
            self._model_dirs[cid] = checked.path
        return self._model_dirs[cid]

    def _prepare(
        self,
        items: Sequence[PendingItem],
        commitment: Commitment,
        settings: DifrSettings,
        model_dir: Path,
    ) -> tuple[list[_Work], list[tuple[bytes, VerdictWrite]]]:
        """Rebuild each item's score requests; items that cannot be scored get verdicts,
        amended ones UNVERIFIABLE(record_amended) (their amendments read once for the
        batch), so no item in the work is amended."""
        work: list[_Work] = []
        done: list[tuple[bytes, VerdictWrite]] = []
        checked = []
        for item in items:
            entry = self._store.entry(item.origin, item.seq)
            assert entry is not None, "a pending item's entry is stored"
            tag = self._tag(item.origin, item.seq, entry.entry_hash, item)
            if entry_hash(entry.envelope) != entry.entry_hash or not hmac.compare_digest(
                tag, item.tag
            ):
                self._set_aside(item, entry)
                continue
            checked.append((item, entry, decode_record(decode_envelope(entry.envelope))))
        amendments = self._store.amendments_of((e.origin, r.record_id) for _, e, r in checked)
        for item, entry, record in checked:
            v = self._verdict(entry, record, commitment, settings, item)
            note = amendments.get((entry.origin, record.record_id))
            if note is not None:
                done.append((item.key, self._write(entry, record.record_id, _amended(v, note))))
                continue
            try:
                requests, indices = score_requests(record, commitment, f"{item.origin}/{item.seq}")
            except SamplingNotReproducibleError as exc:
                v.needs_seed = exc.reason is Reason.NO_SEED
                v = unverifiable(v, exc.reason, exc.detail)
                done.append((item.key, self._write(entry, record.record_id, v)))
                continue
            except EvidenceUnavailable as exc:
                v = unverifiable(v, Reason.TOKENS_UNAVAILABLE, str(exc))
                done.append((item.key, self._write(entry, record.record_id, v)))
                continue
            except Exception as exc:
                log.exception("request building failed", extra={"record_id": record.record_id})
                v = unverifiable(v, Reason.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
                done.append((item.key, self._write(entry, record.record_id, v)))
                continue
            work.append(_Work(item, entry, record, requests, indices))
        return work, done

    def _run_batch(
        self,
        batch: Sequence[_Work],
        commitment: Commitment,
        settings: DifrSettings,
        model_dir: Path,
    ) -> list[tuple[bytes, VerdictWrite]]:
        engine = self._pool.acquire(commitment, model_dir)
        requests = [r for w in batch for r in w.requests]
        scored = self._pool.score(
            commitment.commitment_id, requests, commitment.sampler_profile, settings.delta_max
        )
        results = {r.request_id: r for r in scored.results}
        rejected = {r.request_id: r.reason for r in scored.rejected}
        self._metrics.batch_records.labels(commitment=commitment.commitment_id).observe(len(batch))
        cost = self._measure(
            batch=batch,
            results=scored.results,
            commitment=commitment,
            settings=settings,
            engine=engine,
            start_ns=scored.start_ns,
            end_ns=scored.end_ns,
        )
        batch_tokens = max(1, sum(_scored_tokens(r) for r in results.values()))
        out = []
        for w in batch:
            v = self._verdict(w.entry, w.record, commitment, settings, w.item)
            v.engine_version = engine.version
            v.needs_seed = w.needs_seed
            v.attempts = w.item.attempts + 1
            problems = [rejected[r.request_id] for r in w.requests if r.request_id in rejected]
            mine = [results[r.request_id] for r in w.requests if r.request_id in results]
            if problems:
                v = unverifiable(v, Reason.TOKENS_UNAVAILABLE, f"engine refused: {problems[0]}")
            else:
                _decide(v, mine, w.choice_indices, settings, w.record.api)
                v.timings.batch_size = len(batch)
                v.timings.queued_ns = max(0, scored.start_ns - w.item.enqueued_ns)
            if cost is not None:
                share = sum(_scored_tokens(r) for r in mine)
                v.cost.CopyFrom(cost)
                v.cost.activity_seconds = cost.activity_seconds * share / batch_tokens
            out.append((w.item.key, self._write(w.entry, w.record.record_id, v)))
        return out

    def _measure(
        self,
        *,
        batch: Sequence[_Work],
        results: Sequence[ScoreResult],
        commitment: Commitment,
        settings: DifrSettings,
        engine: EngineRef,
        start_ns: int,
        end_ns: int,
    ) -> verifier_pb2.ComputeCost | None:
        if self._meter is None:
            return None
        measured = EngineBatch(
            batch_id=uuid.uuid4().hex,
            commitment_id=commitment.commitment_id,
            engine=engine,
            start_ns=start_ns,
            end_ns=end_ns,
            records=len(batch),
            prompt_tokens=sum(r.prompt_tokens for r in results),
            completion_tokens=sum(r.output_tokens for r in results),
            sample_rate=settings.sample_rate,
            traffic_start_ns=min(w.record.request_first_byte_ns for w in batch),
            traffic_end_ns=max(w.record.response_last_byte_ns for w in batch),
        )
        try:
            return self._meter.measure(measured)
        except Exception:
            log.exception("batch meter failed", extra={"batch_id": measured.batch_id})
            return None

    def _failed(
        self, batch: Sequence[_Work], commitment: Commitment, settings: DifrSettings, error: str
    ) -> tuple[list[tuple[bytes, VerdictWrite]], list[Retry]]:
        """Reschedule the batch after an engine failure, or give up on records that
        reached max_attempts."""
        cfg = self._config.scheduler
        now = self._clock()
        done, retries = [], []
        for w in batch:
            failures = w.item.attempts + 1
            if failures >= cfg.max_attempts:
                v = self._verdict(w.entry, w.record, commitment, settings, w.item)
                v.attempts = failures
                v.needs_seed = w.needs_seed
                v = unverifiable(v, Reason.ENGINE_ERROR, f"{failures} attempts; last: {error}")
                done.append((w.item.key, self._write(w.entry, w.record.record_id, v)))
            else:
                delay = scheduler.retry_delay_ns(
                    failures, initial_s=cfg.backoff_initial_s, maximum_s=cfg.backoff_max_s
                )
                retries.append(Retry(w.item.key, now + delay, error))
        return done, retries

    def _set_aside(self, item: PendingItem, entry: StoredEntry) -> None:
        """The stored entry (or its queue item) is no longer what was classified: no
        verdict, an alert with the evidence."""
        reason = AlertReason.STORED_ENVELOPE_ALTERED
        detail = (
            f"stored entry {entry.seq} (entry hash {entry.entry_hash.hex()}) is no longer the "
            f"one checkpoint {item.checkpoint_tree_size} authenticated when it was classified"
        )
        found = evidence(
            item.origin,
            reason,
            detail,
            checkpoint=None,
            entries=(entry,),
            expected_hash=entry.entry_hash,
        )
        if self._store.set_aside_pending(item.key, Tampered(item.origin, item.seq, reason, found)):
            self._alerted(item.origin, reason)

    def _give_up(
        self,
        items: Sequence[PendingItem],
        reason: Reason,
        detail: str,
        commitment: Commitment | None = None,
    ) -> int:
        """Close ``items`` UNVERIFIABLE(``reason``), the amended ones (read once for them all)
        UNVERIFIABLE(record_amended)."""
        done = []
        found = []
        for item in items:
            entry = self._store.entry(item.origin, item.seq)
            assert entry is not None, "a pending item's entry is stored"
            found.append((item, entry, decode_record(decode_envelope(entry.envelope))))
        amendments = self._store.amendments_of((e.origin, r.record_id) for _, e, r in found)
        for item, entry, record in found:
            v = base_verdict(
                origin=entry.origin,
                seq=entry.seq,
                entry_hash=entry.entry_hash,
                record_id=record.record_id,
                model=record.api.model,
                commitment_id=item.commitment_id,
            )
            v.checkpoint_tree_size = item.checkpoint_tree_size
            v.checkpoint_root_hash = item.checkpoint_root_hash
            if commitment is not None:
                _describe(v, commitment, self.settings_for(commitment))
            note = amendments.get((entry.origin, record.record_id))
            v = unverifiable(v, reason, detail) if note is None else _amended(v, note)
            done.append((item.key, self._write(entry, record.record_id, v)))
        return self._store.finish(done)

    def _verdict(
        self,
        entry: StoredEntry,
        record: record_pb2.InferenceRecord,
        commitment: Commitment,
        settings: DifrSettings,
        item: PendingItem,
    ) -> verifier_pb2.Verdict:
        v = base_verdict(
            origin=entry.origin,
            seq=entry.seq,
            entry_hash=entry.entry_hash,
            record_id=record.record_id,
            model=record.api.model,
        )
        _describe(v, commitment, settings)
        v.attempts = item.attempts
        v.checkpoint_tree_size = item.checkpoint_tree_size
        v.checkpoint_root_hash = item.checkpoint_root_hash
        return v


def _decoded(entry: StoredEntry) -> record_pb2.InferenceRecord | EnvelopeError:
    try:
        return decode_record(decode_envelope(entry.envelope))
    except EnvelopeError as exc:
        return exc


def _amendments_in(
    decoded: Sequence[tuple[AuthenticEntry, record_pb2.InferenceRecord | EnvelopeError]],
) -> dict[tuple[str, str], AmendmentNote]:
    """The amendments among ``decoded``: (origin, amended record id) -> the first one."""
    out: dict[tuple[str, str], AmendmentNote] = {}
    for authentic, record in decoded:
        if isinstance(record, EnvelopeError):
            continue
        note = AmendmentNote(record.record_id, authentic.entry.seq, record.quality_reason)
        for amended_id in record.amends_record_ids:
            out.setdefault((authentic.entry.origin, amended_id), note)
    return out


def _amended(v: verifier_pb2.Verdict, note: AmendmentNote) -> verifier_pb2.Verdict:
    return amended(v, amendment_record_id=note.record_id, amendment_reason=note.reason)


def _authenticated_verdict(
    authentic: AuthenticEntry, *, record_id: str, model: str
) -> verifier_pb2.Verdict:
    """The fields of a verdict about an authenticated entry, naming its checkpoint."""
    entry = authentic.entry
    v = base_verdict(
        origin=entry.origin,
        seq=entry.seq,
        entry_hash=entry.entry_hash,
        record_id=record_id,
        model=model,
    )
    v.checkpoint_tree_size = authentic.checkpoint_tree_size
    v.checkpoint_root_hash = authentic.checkpoint_root_hash
    return v


def score_requests(
    record: record_pb2.InferenceRecord, commitment: Commitment, prefix: str
) -> tuple[tuple[ScoreRequest, ...], tuple[int, ...]]:
    """One ScoreRequest per choice of ``record`` (ids ``prefix/choice index``) carrying
    the choice's evidence, and the choices' API indices. The engine renders the
    prompt and checks or finds the ids (verifierd.engine.evidence_scoring); the id
    fields hold what the prover claims, or nothing.

    Raises SamplingNotReproducibleError or EvidenceUnavailable."""
    api = record.api
    replay = request_replay(
        api.sampling,
        commitment.generation_defaults,
        get_profile(commitment.sampler_profile),
        structured_outputs=commitment.structured_outputs,
        request_json=_request_json(record),
        serving=commitment.serving,
    )
    evidence = choice_evidence(record, commitment.serving)
    indices = tuple(c.index for c in sorted(api.choices, key=lambda c: c.index))
    # Each prompt of a request fans out into n children seeded seed + j.
    n = api.sampling.n if api.sampling.HasField("n") and api.sampling.n > 0 else 1
    requests = tuple(
        ScoreRequest(
            request_id=f"{prefix}/{index}",
            prompt_token_ids=ev.claimed_prompt_ids or (),
            output_token_ids=ev.claimed_output_ids or (),
            sampling=replay.settings.for_choice(index % n, n),
            adjustments=replay.adjustments,
            evidence=ev,
            logprobs_mode=commitment.logprobs_mode,
        )
        for index, ev in zip(indices, evidence, strict=True)
    )
    return requests, indices


def _request_json(record: record_pb2.InferenceRecord) -> str | None:
    """The raw request body, None when the record did not keep it."""
    return record.request.body.decode("utf-8", "replace") if record.request.body else None


#: Bytes per token assumed when planning a batch before the engine knows the ids.
_BYTES_PER_TOKEN = 3


def planned_tokens(request: ScoreRequest) -> int:
    """Tokens a request is planned at: its ids, else an estimate from its text."""
    ev = request.evidence
    prompt = len(request.prompt_token_ids)
    output = len(request.output_token_ids)
    if ev is not None:
        prompt = prompt or len(ev.request_json.encode()) // _BYTES_PER_TOKEN
        output = output or len(ev.text.encode()) // _BYTES_PER_TOKEN + 1
    return prompt + output


def _prompt_key(record: record_pb2.InferenceRecord) -> tuple[int, ...]:
    """A batch-order key for a record whose prompt ids are not known yet: its prompt
    as captured, so the turns of a conversation (a growing messages list) sort
    next to each other."""
    return tuple(record.api.prompt_json.encode())


def _scored_tokens(result: ScoreResult) -> int:
    return result.prompt_tokens + result.output_tokens


def _describe(v: verifier_pb2.Verdict, commitment: Commitment, settings: DifrSettings) -> None:
    """The commitment fields every verdict about a committed model carries."""
    v.commitment_id = commitment.commitment_id
    v.sampler_profile = commitment.sampler_profile
    v.engine = commitment.engine
    v.settings.CopyFrom(settings.to_proto())


def _decide(
    v: verifier_pb2.Verdict,
    results: Sequence[ScoreResult],
    choice_indices: Sequence[int],
    settings: DifrSettings,
    api: record_pb2.ApiView,
) -> None:
    """FAIL on a contradicted claim, UNVERIFIABLE when a choice could not be scored,
    else PASS or FAIL on the worst choice's score."""
    findings = [(i, r.finding) for i, r in enumerate(results) if r.finding is not None]
    fails = [(i, f) for i, f in findings if f.fails]
    usage = None if findings else _usage_problem(api, results)
    if fails:
        worst = fails[0][0]
    elif findings:
        worst = findings[0][0]
    else:
        worst = max(range(len(results)), key=lambda i: results[i].difr.score)
    result = results[worst]
    difr = result.difr
    v.score = difr.score
    v.token_count = difr.n_tokens
    v.exact_matches = difr.exact_matches
    v.out_of_mask = difr.out_of_mask
    v.margins_f16 = difr.margins_f16()
    v.choice_index = choice_indices[worst]
    v.retokenized = result.searched
    v.tokenization_restarts = result.restarts
    v.found_token_ids[:] = result.found_ids
    v.timings.prefill_ns = sum(r.prefill_ns for r in results)
    v.timings.scoring_ns = sum(r.scoring_ns for r in results)
    logprobs = _logprobs_problem(v, results, choice_indices, settings)
    finding = fails[0][1] if fails else (findings[0][1] if findings else None)
    if finding is not None and not finding.fails:
        unverifiable(v, finding.reason, finding.detail)
    elif finding is not None:
        v.status, v.reason, v.detail = FAIL, finding.reason.value, finding.detail
    elif usage is not None:
        v.status, v.reason, v.detail = FAIL, Reason.USAGE_MISMATCH.value, usage
    elif logprobs is not None:
        v.status, v.reason, v.detail = FAIL, Reason.LOGPROBS_MISMATCH.value, logprobs
    elif difr.passes(settings.threshold):
        v.status, v.detail = PASS, _pass_detail(results, choice_indices, settings)
    else:
        v.status, v.reason = FAIL, Reason.SCORE_OVER_THRESHOLD.value


def _pass_detail(
    results: Sequence[ScoreResult], choice_indices: Sequence[int], settings: DifrSettings
) -> str:
    """What a PASS rests on when a choice scored no output token ("" when every choice
    scored some): the sampler was not checked there, only the echoed prompt's stated
    logprobs (a completions ``echo`` with ``max_tokens: 0`` shows no sampled token)."""
    unscored = [(i, r) for i, r in zip(choice_indices, results, strict=True) if not r.difr.n_tokens]
    if not unscored:
        return ""
    if len(unscored) == len(results):
        head = "no output token was scored"
    else:
        named = ", ".join(str(i) for i, _ in unscored)
        head = f"choice{'s' if len(unscored) > 1 else ''} {named} scored no output token"
    compared = [r.logprobs for _, r in unscored if r.logprobs is not None]
    echoed = sum(c.prompt_positions for c in compared)
    if not echoed:
        return f"{head}: the sampler was not verified, and no logprobs were compared"
    largest = max(c.largest for c in compared)
    return (
        f"{head}: the sampler was not verified, only the stated logprobs of {echoed} echoed "
        f"prompt tokens (largest deviation {largest:.6g}, tolerance "
        f"{settings.logprobs_tolerance:.6g})"
    )


def _logprobs_problem(
    v: verifier_pb2.Verdict,
    results: Sequence[ScoreResult],
    choice_indices: Sequence[int],
    settings: DifrSettings,
) -> str | None:
    """The evidence of the first choice whose stated logprobs deviate from the verifier's
    beyond the tolerance, or None; the verdict carries the scored choice's deviation."""
    if v.choice_index in choice_indices:
        compared = results[list(choice_indices).index(v.choice_index)].logprobs
        if compared is not None:
            v.logprobs_deviation = compared.largest
    for index, result in zip(choice_indices, results, strict=True):
        over = (
            None if result.logprobs is None else result.logprobs.over(settings.logprobs_tolerance)
        )
        if over is not None:
            return f"choice {index}: {over}"
    return None


def _usage_problem(api: record_pb2.ApiView, results: Sequence[ScoreResult]) -> str | None:
    """How the response's usage counts disagree with what was scored, or None.

    vLLM counts each distinct prompt once (choices of one prompt share it) and
    every output token of every choice, the end token included."""
    if not api.HasField("usage"):
        return None
    usage = api.usage
    completion = sum(r.output_tokens for r in results)
    n = api.sampling.n if api.sampling.HasField("n") and api.sampling.n > 0 else 1
    prompt = sum(r.prompt_tokens for r in results[::n])
    if usage.completion_tokens != completion or usage.prompt_tokens != prompt:
        return (
            f"usage says {usage.prompt_tokens} prompt + {usage.completion_tokens} completion "
            f"tokens; scored {prompt} + {completion}"
        )
    return None
