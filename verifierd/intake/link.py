"""One collector link: subscribe, verify, store exactly once, acknowledge; reconnect on failure.

Each session starts from the store's cursor (the last entry stored and its hash), so after
a crash or a network cut the collector resends exactly what was not yet stored. Entries
are checked as they arrive (`IntakeChain`) and handed to a single ingest task that writes
everything verified so far in one store transaction (entries, queue and cursor together),
then acknowledges that seq to the collector. Network errors reconnect with exponential
backoff; a violation (fork, gap, bad hash, bad signature, rollback) stops this link for
good and records an alert with its evidence in the store.

An entry that cannot be received is never retried forever: when the stream fails with
RESOURCE_EXHAUSTED (an entry larger than the message limit), its hash is fetched with
GetInclusionProof and stored in its place, and intake moves on; when the collector sends an
entry as its hash although this link asked for every model (it withholds entries too large
to stream), the hash is stored likewise. Either way an alert that does not stop intake is
raised: counted in `intake_alerts` (reason "withheld_entry"), logged, and written to the
store's audit log with the seq and entry hash. The chain still covers such an entry: the
next entry's prev_hash and the next checkpoint's root must agree with its hash.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf.message import DecodeError
from veritap.signing import KeyFormatError, Verifier
from veritap.tls import ClientTls, channel_credentials, channel_options, require_tls_off_loopback
from veritap.v1 import ledger_pb2, ledger_pb2_grpc, log_pb2

from appliance.journal import MessageId
from verifierd.config import CollectorConfig
from verifierd.errors import VerifierdError
from verifierd.intake.alert_reasons import AlertReason
from verifierd.intake.backoff import Backoff
from verifierd.intake.chain import IntakeChain, IntakeError, ViolationError
from verifierd.intake.frontier_file import FrontierFile, recover_chain
from verifierd.intake.resume_check import ResumeCheck, check_resume
from verifierd.intake.resume_probe import probe_collector
from verifierd.intake.wire import read_batch
from verifierd.metrics import METRICS, VerifierMetrics
from verifierd.store import Store

logger = logging.getLogger(__name__)

# Seconds between saves of the frontier file: a crash loses at most this much of it, which
# only means replaying that many stored entry hashes on the next start (never correctness).
FRONTIER_SAVE_S = 1.0

_SUBSCRIBE_METHOD = (
    f"/{ledger_pb2.DESCRIPTOR.services_by_name['LedgerService'].full_name}/Subscribe"
)

# Status codes after which retrying cannot help: the collector's log contradicts ours.
_VIOLATION_CODES = {
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.NOT_FOUND,
}
WITHHELD = "withheld_entry"


@dataclass(frozen=True)
class LinkStatus:
    origin: str
    address: str
    #: Last seq stored from this collector.
    stored_seq: int
    #: The collector's head as its last heartbeat said (0 before the first).
    remote_head_seq: int
    #: "connecting", "streaming", "retrying: <why>", "alert: <reason>" or "stopped".
    state: str
    last_contact_ns: int
    alert_reason: str


def load_collector_key(text: str) -> Verifier:
    """A C2SP verifier-key string, or the path of a file holding one."""
    try:
        return Verifier.parse(text)
    except KeyFormatError:
        return Verifier.load(Path(text).expanduser())


def client_tls(collector: CollectorConfig) -> ClientTls | None:
    if not collector.ca_file:
        return None
    return ClientTls(
        ca=Path(collector.ca_file),
        cert=Path(collector.cert_file) if collector.cert_file else None,
        key=Path(collector.key_file) if collector.key_file else None,
    )


class _Requests:
    """The request stream: Start, then the acknowledgements the ingester queues."""

    def __init__(self, start: ledger_pb2.SubscribeStart) -> None:
        self._queue: asyncio.Queue[ledger_pb2.SubscribeRequest | None] = asyncio.Queue()
        self._queue.put_nowait(ledger_pb2.SubscribeRequest(start=start))

    def ack(self, durable_seq: int) -> None:
        ack = ledger_pb2.SubscribeAck(durable_seq=durable_seq)
        self._queue.put_nowait(ledger_pb2.SubscribeRequest(ack=ack))

    def close(self) -> None:
        """End the request stream, so gRPC's task that reads it finishes too."""
        self._queue.put_nowait(None)

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> ledger_pb2.SubscribeRequest:
        request = await self._queue.get()
        if request is None:
            raise StopAsyncIteration
        return request


class _Ingester:
    """Writes verified entries in as few transactions as the disk allows, then acks them."""

    def __init__(
        self,
        store: Store,
        origin: str,
        *,
        chain: IntakeChain,
        frontier_file: FrontierFile,
        requests: _Requests,
        on_stored: Callable[[int], None],
    ) -> None:
        self._store = store
        self._origin = origin
        self._chain = chain
        self._frontier_file = frontier_file
        self._requests = requests
        self._on_stored = on_stored
        # (seq, envelope, entry hash) checked and waiting for the next transaction.
        self._pending: list[tuple[int, bytes, bytes]] = []
        self._checkpoint: log_pb2.Checkpoint | None = None
        self._wake = asyncio.Event()
        self._closing = False
        self._in_flight: asyncio.Future[None] | None = None
        # The first ingest of a session saves the frontier; later ones every FRONTIER_SAVE_S.
        self._frontier_due = 0.0

    def add(self, entries: list[tuple[int, bytes, bytes]]) -> None:
        self._pending.extend(entries)
        self._wake.set()

    def add_checkpoint(self, checkpoint: log_pb2.Checkpoint) -> None:
        self._checkpoint = checkpoint
        self._wake.set()

    def close(self) -> None:
        """Finish the transaction in flight and stop; what was not started is dropped."""
        self._closing = True
        self._wake.set()

    async def settle(self) -> None:
        """Wait for a store transaction still running in its thread (after a cancel)."""
        if self._in_flight is not None:
            await asyncio.wait([self._in_flight])
            if not self._in_flight.cancelled() and self._in_flight.exception() is not None:
                logger.warning(
                    "the last ingest failed",
                    extra={"origin": self._origin, "error": str(self._in_flight.exception())},
                )

    def _commit(
        self,
        entries: list[tuple[int, bytes, bytes]],
        checkpoint: log_pb2.Checkpoint | None,
        frontier: bytes | None,
    ) -> None:
        self._store.ingest(self._origin, entries, checkpoint=checkpoint)
        if entries and frontier is not None:
            self._frontier_file.save(entries[-1][2], frontier)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            if not self._pending and self._checkpoint is None:
                continue
            entries, self._pending = self._pending, []
            checkpoint, self._checkpoint = self._checkpoint, None
            # Taken between two stream messages, so the chain stands exactly at entries[-1]
            # (a checkpoint arrives after its last entry, and may come alone).
            frontier = None
            now = time.monotonic()
            if entries and now >= self._frontier_due:
                frontier = self._chain.frontier_bytes()
                self._frontier_due = now + FRONTIER_SAVE_S
            self._in_flight = loop.run_in_executor(
                None, self._commit, entries, checkpoint, frontier
            )
            await asyncio.shield(self._in_flight)
            if entries:
                self._on_stored(entries[-1][0])
                self._requests.ack(entries[-1][0])


class CollectorLink:
    """Intake from one collector; `run()` returns only when the link is stopped or alerted."""

    def __init__(
        self,
        store: Store,
        collector: CollectorConfig,
        *,
        key: Verifier,
        verifier_id: str,
        state_dir: Path,
        backoff: Backoff | None = None,
        metrics: VerifierMetrics = METRICS,
    ) -> None:
        self._store = store
        self._metrics = metrics
        self.collector = collector
        self.origin = collector.origin
        self._key = key
        self._verifier_id = verifier_id
        self._tls = client_tls(collector)
        require_tls_off_loopback(collector.address, self._tls)
        self._frontier_file = FrontierFile(state_dir / "intake", collector.origin)
        self._backoff = backoff or Backoff()
        self.stored_seq = 0
        self.remote_head_seq = 0
        self.state = "connecting"
        self.last_contact_ns = 0
        self.alert_reason = ""

    def status(self) -> LinkStatus:
        return LinkStatus(
            origin=self.origin,
            address=self.collector.address,
            stored_seq=self.stored_seq,
            remote_head_seq=self.remote_head_seq,
            state=self.state,
            last_contact_ns=self.last_contact_ns,
            alert_reason=self.alert_reason,
        )

    def _note_stored(self, seq: int) -> None:
        self._metrics.intake_entries.labels(self.origin).inc(seq - self.stored_seq)
        self.stored_seq = seq

    def _channel(self) -> grpc.aio.Channel:
        options = channel_options(self._tls)
        if self._tls is None:
            return grpc.aio.insecure_channel(self.collector.address, options=options)
        return grpc.aio.secure_channel(
            self.collector.address, channel_credentials(self._tls), options=options
        )

    async def run(self) -> None:
        """Stream until stopped (cancelled) or until a violation raises an alert."""
        while True:
            progressed = False
            try:
                progressed = await self._session()
                why = "stream ended"
            except ViolationError as violation:
                await self._raise_alert(violation)
                return
            except grpc.aio.AioRpcError as exc:
                why = f"{exc.code().name}: {exc.details()}"
            except (OSError, VerifierdError) as exc:
                why = str(exc)
            if progressed:
                self._backoff.reset()
            delay = self._backoff.next_delay()
            self.state = f"retrying: {why}"
            logger.info(
                "collector link down, reconnecting",
                extra={"origin": self.origin, "why": why, "delay_s": round(delay, 3)},
            )
            await asyncio.sleep(delay)

    async def _session(self) -> bool:
        """One Subscribe stream; returns whether anything was stored before it ended."""
        self.state = "connecting"
        cursor = await asyncio.to_thread(self._store.cursor, self.origin)
        verifier = await asyncio.to_thread(
            recover_chain, self._store, self.origin, self._key, cursor, self._frontier_file
        )
        chain = IntakeChain(verifier, cursor.checkpoint)
        self.stored_seq = cursor.seq
        started_at = cursor.seq
        async with self._channel() as channel:
            stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(
                channel
            )
            start = ledger_pb2.SubscribeStart(
                origin=self.origin,
                from_seq=chain.size + 1,
                prev_hash=chain.last_hash,
                window=self.collector.window,
                models=self.collector.models,
                verifier_id=self._verifier_id,
            )
            requests = _Requests(start)
            # Raw responses: entry batches are read without protobuf (see intake.wire).
            subscribe = channel.stream_stream(
                _SUBSCRIBE_METHOD,
                request_serializer=ledger_pb2.SubscribeRequest.SerializeToString,
                response_deserializer=None,
            )
            call = subscribe(requests)
            ingester = _Ingester(
                self._store,
                self.origin,
                chain=chain,
                frontier_file=self._frontier_file,
                requests=requests,
                on_stored=self._note_stored,
            )
            ingest_task = asyncio.create_task(ingester.run())
            read_task = asyncio.create_task(self._read(call, chain, ingester, ingest_task))
            try:
                done, _ = await asyncio.wait(
                    {read_task, ingest_task}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    task.result()
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _VIOLATION_CODES:
                    raise await self._start_refused(stub, chain, exc) from exc
                if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                await self._pass_unreceivable(stub, chain, ingester, ingest_task, exc)
            finally:
                for task in (read_task, ingest_task):
                    task.cancel()
                requests.close()
                call.cancel()
                await ingester.settle()
        return self.stored_seq > started_at

    async def _read(
        self,
        call: AsyncIterable[bytes],
        chain: IntakeChain,
        ingester: _Ingester,
        ingest_task: asyncio.Task[None],
    ) -> None:
        try:
            async for data in call:
                self.last_contact_ns = time.time_ns()
                parts = read_batch(data)
                if parts is not None:
                    if self.state != "streaming":
                        self.state = "streaming"
                    accepted = chain.accept_parts(parts)
                    await self._note_hash_only(accepted)
                    ingester.add(accepted)
                    continue
                try:
                    response = ledger_pb2.SubscribeResponse.FromString(data)
                except DecodeError as exc:
                    raise IntakeError(f"a Subscribe response does not parse: {exc}") from exc
                kind = response.WhichOneof("kind")
                if kind == "batch":
                    if self.state != "streaming":
                        self.state = "streaming"
                    accepted = chain.accept_entries(response.batch.entries)
                    await self._note_hash_only(accepted)
                    ingester.add(accepted)
                elif kind == "checkpoint":
                    chain.accept_checkpoint(response.checkpoint)
                    ingester.add_checkpoint(response.checkpoint)
                elif kind == "heartbeat":
                    self.state = "streaming"
                    self.remote_head_seq = response.heartbeat.head_seq
                    lag = max(0, self.remote_head_seq - self.stored_seq)
                    self._metrics.intake_lag.labels(self.origin).set(lag)
        except ViolationError:
            ingester.close()
            await ingest_task
            raise

    async def _note_hash_only(self, accepted: list[tuple[int, bytes, bytes]]) -> None:
        """Entries that came as their hash although every model was asked for were withheld."""
        if self.collector.models:
            return
        for seq, envelope, digest in accepted:
            if not envelope:
                await self._alert_withheld(seq, digest, "the collector sent only its hash")

    async def _pass_unreceivable(
        self,
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub,
        chain: IntakeChain,
        ingester: _Ingester,
        ingest_task: asyncio.Task[None],
        error: grpc.aio.AioRpcError,
    ) -> None:
        """The next entry cannot be received: store its hash in its place and move on.

        Batches arrive in order, at most the collector's batch_bytes (1 MiB at most, far
        below the receive limit) unless one entry is larger and travels alone, so the
        message that failed holds exactly the entry after the chain's last. Its hash comes
        from an inclusion proof (so once a checkpoint covers it; until then this raises and
        the link retries with backoff), and waits until the ingester has stored it.
        """
        seq = chain.size + 1
        request = ledger_pb2.GetInclusionProofRequest(seq=seq)
        proof = await stub.GetInclusionProof(request, timeout=5)
        accepted = chain.accept_parts([(seq, True, proof.leaf_hash)])
        ingester.add(accepted)
        await self._alert_withheld(seq, accepted[0][2], f"it cannot be received: {error.details()}")
        while self.stored_seq < seq and not ingest_task.done():
            await asyncio.sleep(0.01)
        if self.stored_seq < seq:
            ingest_task.result()

    async def _alert_withheld(self, seq: int, digest: bytes, why: str) -> None:
        """An alert that does not stop intake (see the module docstring)."""
        self._metrics.intake_alerts.labels(self.origin, WITHHELD).inc()
        detail = {"origin": self.origin, "seq": seq, "entry_hash": digest.hex(), "why": why}
        logger.error(
            "entry withheld from the intake: stored as its hash only",
            extra={"message_id": MessageId.INTAKE_ALERT, **detail},
        )
        await asyncio.to_thread(self._store.audit, "intake", WITHHELD, detail)

    async def _start_refused(
        self,
        stub: ledger_pb2_grpc.LedgerServiceAsyncStub,
        chain: IntakeChain,
        error: grpc.aio.AioRpcError,
    ) -> ViolationError:
        """The collector refused our position: gather what it says about it as evidence."""
        code, detail = error.code(), error.details() or ""
        checkpoints: list[log_pb2.Checkpoint] = []
        if chain.last_checkpoint is not None:
            checkpoints.append(chain.last_checkpoint)
        if code == grpc.StatusCode.NOT_FOUND:
            return ViolationError(
                AlertReason.ORIGIN_MISMATCH, detail, checkpoints=tuple(checkpoints)
            )
        remote_head = 0
        try:
            remote_head = (await stub.GetHead(ledger_pb2.GetHeadRequest(), timeout=5)).head_seq
        except grpc.aio.AioRpcError as exc:
            detail += f" (no head from the collector: {exc.code().name})"
        sizes = [0] if chain.last_checkpoint is None else [chain.last_checkpoint.tree_size, 0]
        for size in sizes:  # theirs at our checkpoint's size, and their latest
            request = ledger_pb2.GetCheckpointRequest(tree_size=size)
            try:
                checkpoints.append((await stub.GetCheckpoint(request, timeout=5)).checkpoint)
            except grpc.aio.AioRpcError as exc:
                detail += f" (no checkpoint of size {size or 'latest'}: {exc.code().name})"
        if code == grpc.StatusCode.OUT_OF_RANGE:
            reason = AlertReason.ROLLBACK if remote_head < chain.size else AlertReason.GAP
            return ViolationError(reason, detail, checkpoints=tuple(checkpoints))
        entries: tuple[ledger_pb2.StreamedEntry, ...] = ()
        remote_hash = b""
        if chain.size:
            ours = await asyncio.to_thread(self._store.entry, self.origin, chain.size)
            if ours is not None:
                entries = (ledger_pb2.StreamedEntry(seq=ours.seq, envelope=ours.envelope),)
            try:
                proof = await stub.GetInclusionProof(
                    ledger_pb2.GetInclusionProofRequest(seq=chain.size), timeout=5
                )
                remote_hash = proof.leaf_hash
            except grpc.aio.AioRpcError as exc:
                detail += f" (no leaf hash from the collector: {exc.code().name})"
        return ViolationError(
            AlertReason.FORK,
            detail,
            entries=entries,
            checkpoints=tuple(checkpoints),
            remote_hash=remote_hash,
        )

    def set_alert_state(self, reason: str) -> None:
        """Show an alert (e.g. one recorded before a restart); `run()` must not be started."""
        self.alert_reason = reason
        self.state = f"alert: {reason}"
        self._metrics.intake_stopped.labels(self.origin, reason).set(1)

    async def check_resume(self) -> ResumeCheck:
        """Whether the collector's log now agrees with what was stored, so that intake
        stopped by an alert may resume from the cursor (verifierd.intake.resume_check)."""
        cursor = await asyncio.to_thread(self._store.cursor, self.origin)
        async with self._channel() as channel:
            stub: ledger_pb2_grpc.LedgerServiceAsyncStub = ledger_pb2_grpc.LedgerServiceStub(
                channel
            )
            view = await probe_collector(stub, cursor)
        return check_resume(self.origin, cursor, self._key, view)

    def clear_alert_state(self) -> None:
        """The alert was cleared: `run()` may start again, with a fresh backoff."""
        if self.alert_reason:
            self._metrics.intake_stopped.remove(self.origin, self.alert_reason)
        self.alert_reason = ""
        self.state = "connecting"
        self._backoff.reset()

    async def _raise_alert(self, violation: ViolationError) -> None:
        cursor = await asyncio.to_thread(self._store.cursor, self.origin)
        evidence = ledger_pb2.IntakeEvidence(
            origin=self.origin,
            reason=violation.reason,
            detail=violation.detail,
            checkpoints=violation.checkpoints,
            entries=violation.entries,
            remote_hash=violation.remote_hash,
            cursor_seq=cursor.seq,
            cursor_hash=cursor.hash,
            detected_at_ns=time.time_ns(),
        )
        await asyncio.to_thread(
            self._store.set_alert, self.origin, violation.reason, evidence.SerializeToString()
        )
        self.stored_seq = cursor.seq
        self.set_alert_state(violation.reason)
        self._metrics.intake_alerts.labels(self.origin, violation.reason).inc()
        logger.error(
            "intake stopped: the collector's log contradicts what was verified",
            extra={
                "message_id": MessageId.INTAKE_ALERT,
                "origin": self.origin,
                "reason": violation.reason,
                "detail": violation.detail,
            },
        )
