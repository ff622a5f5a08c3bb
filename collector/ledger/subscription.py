"""One `Subscribe` stream: check the client's Start, then send entries, checkpoints, heartbeats.

The stream never skips: the client names the first seq it wants and the hash of the entry
before it. A hash that differs from the log's is a fork or a rollback (FAILED_PRECONDITION);
a seq past the head or below the retention floor is OUT_OF_RANGE. After that the
subscription sends every entry in order, each signed checkpoint right after the entry whose
seq is its tree size, and a heartbeat with the head seq every `heartbeat_s`. At most
`window` entries are in flight without an acknowledgement; acknowledgements also feed the
retention book. An entry too large for one stream message (`MAX_ENVELOPE_BYTES`; records
are bounded below it, see collector.record_bounds) is sent as its hash, which the chain
still covers, rather than as a message the client must refuse: the stream never stalls
on it, and the verifier alerts on an entry withheld from a subscription without a model
filter.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import grpc
from veritap.envelope import ZERO_HASH, entry_hash
from veritap.tls import MAX_STREAM_MESSAGE_BYTES
from veritap.v1 import ledger_pb2, log_pb2, record_pb2

from collector.ledger.config import LedgerConfig
from collector.ledger.errors import AckError
from collector.ledger.flow import SendWindow, plan_batches
from collector.ledger.retention import AckBook
from collector.ledger.wire import encode_batch_response
from collector.log import Log, LogError, LogRangeError
from collector.metrics import CollectorMetrics

logger = logging.getLogger(__name__)

# Most entries read from the log in one pass (several batches; bounded memory per stream).
_READ_ENTRIES = 256
# Bytes a StreamedEntry adds around its envelope (tags, seq varint, length prefixes).
_ENTRY_OVERHEAD = 24
_FILTERED_SIZE = 48
# Bytes a batch message adds around its one entry (SubscribeResponse and EntryBatch tags
# and lengths).
_BATCH_OVERHEAD = 16
MAX_ENVELOPE_BYTES = MAX_STREAM_MESSAGE_BYTES - _ENTRY_OVERHEAD - _BATCH_OVERHEAD


class SubscribeRefusedError(Exception):
    """The Start message cannot be served; carries the gRPC status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class SubscriberState:
    verifier_id: str
    acked_seq: int
    sent_seq: int


def check_start(log: Log, start: ledger_pb2.SubscribeStart) -> None:
    """Raise SubscribeRefusedError unless the stream can begin exactly at `start.from_seq`."""
    if start.origin != log.origin:
        raise SubscribeRefusedError(
            grpc.StatusCode.NOT_FOUND,
            f"this log's origin is {log.origin!r}, not {start.origin!r}",
        )
    if start.from_seq < 1:
        raise SubscribeRefusedError(grpc.StatusCode.INVALID_ARGUMENT, "from_seq starts at 1")
    if len(start.prev_hash) != 32:
        raise SubscribeRefusedError(grpc.StatusCode.INVALID_ARGUMENT, "prev_hash must be 32 bytes")
    head = log.head()
    if start.from_seq > head.seq + 1:
        raise SubscribeRefusedError(
            grpc.StatusCode.OUT_OF_RANGE,
            f"from_seq {start.from_seq} is past the head {head.seq}",
        )
    floor = log.retention_floor
    if start.from_seq < floor:
        raise SubscribeRefusedError(
            grpc.StatusCode.OUT_OF_RANGE,
            f"from_seq {start.from_seq} is below the retention floor {floor}",
        )
    if start.from_seq == head.seq + 1:
        expected = head.hash if head.seq else ZERO_HASH
    else:
        expected = log_pb2.Entry.FromString(log.entry(start.from_seq)).prev_hash
    if start.prev_hash != expected:
        raise SubscribeRefusedError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"prev_hash does not match entry {start.from_seq - 1} of this log "
            f"(client has {start.prev_hash.hex()}, log has {expected.hex()}): fork or rollback",
        )


def _wanted(envelope: bytes, models: frozenset[str]) -> bool:
    """Whether a subscriber filtering by ``models`` gets the entry's bytes: a record of
    one of them, or an amendment (it has no model, and it changes the verdicts of records
    the subscriber judged)."""
    entry = log_pb2.Entry.FromString(envelope)
    record = record_pb2.InferenceRecord.FromString(entry.record)
    return record.api.model in models or bool(record.amends_record_ids)


class Subscription:
    """One accepted stream: `responses()` yields what to send until the client goes away."""

    def __init__(
        self,
        log: Log,
        config: LedgerConfig,
        book: AckBook,
        start: ledger_pb2.SubscribeStart,
        *,
        requests: AsyncIterator[ledger_pb2.SubscribeRequest],
        metrics: CollectorMetrics,
    ) -> None:
        self._log = log
        self._config = config
        self._book = book
        self._requests = requests
        self.verifier_id = start.verifier_id
        label = start.verifier_id or "anonymous"
        self._streamed = metrics.streamed_entries.labels(subscriber=label)
        self._label = label
        self._lag = metrics.stream_lag
        self._models = frozenset(start.models)
        window = start.window or config.default_window
        self._window = SendWindow(start.from_seq, min(window, config.max_window))
        self._wake = asyncio.Event()
        self._closed = False
        self._checkpoint_sent = 0
        #: Why the stream must end with an error status (set by a bad ack or a pruned range).
        self.failure: SubscribeRefusedError | None = None

    def state(self) -> SubscriberState:
        return SubscriberState(self.verifier_id, self._window.acked, self._window.sent)

    def wake(self) -> None:
        """Something changed (new entries committed): look again. Loop thread only."""
        self._wake.set()

    def close(self) -> None:
        """End the stream after the message in flight (server shutdown)."""
        self._closed = True
        self._wake.set()

    def _fail(self, code: grpc.StatusCode, message: str) -> None:
        self.failure = SubscribeRefusedError(code, message)
        self._closed = True
        self._wake.set()

    async def _read_acks(self) -> None:
        async for request in self._requests:
            try:
                if request.WhichOneof("kind") != "ack":
                    raise AckError("only acknowledgements may follow the Start message")
                if self._window.ack(request.ack.durable_seq) and self.verifier_id:
                    self._book.record(self.verifier_id, request.ack.durable_seq)
                self._set_lag(self._log.head().seq)
            except AckError as exc:
                self._fail(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                return
            self._wake.set()
        self._closed = True
        self._wake.set()

    async def responses(self) -> AsyncIterator[ledger_pb2.SubscribeResponse | bytes]:
        """Messages to send; entry batches come already serialized (see `wire`)."""
        reader = asyncio.create_task(self._read_acks())
        try:
            heartbeat_due = 0.0
            while not self._closed:
                try:
                    head = self._log.head().seq
                    window = self._window
                    self._set_lag(head)
                    sent_any = False
                    if window.next_seq <= head and window.room() > 0:
                        last = min(head, window.next_seq + min(window.room(), _READ_ENTRIES) - 1)
                        for response in self._range(window.next_seq, last):
                            yield response
                        sent_any = True
                    else:
                        checkpoint = self._idle_checkpoint()
                        if checkpoint is not None:
                            yield ledger_pb2.SubscribeResponse(checkpoint=checkpoint)
                except LogError as exc:
                    self._fail(grpc.StatusCode.UNAVAILABLE, f"log error: {exc}")
                    break
                now = time.monotonic()
                if now >= heartbeat_due:
                    heartbeat = ledger_pb2.Heartbeat(head_seq=head, sent_at_ns=time.time_ns())
                    yield ledger_pb2.SubscribeResponse(heartbeat=heartbeat)
                    heartbeat_due = now + self._config.heartbeat_s
                if sent_any:
                    continue
                timeout = min(self._config.poll_s, max(0.0, heartbeat_due - time.monotonic()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                self._wake.clear()
        finally:
            reader.cancel()
            # Its lag is unknown from now on (another stream of the same subscriber sets it
            # again at its next look at the log).
            with contextlib.suppress(KeyError):
                self._lag.remove(self._label)
            if self.verifier_id:
                self._book.flush()

    def _set_lag(self, head: int) -> None:
        """Entries up to `head` that the subscriber has not acknowledged (once per look at the
        log or ack, not per entry)."""
        self._lag.labels(subscriber=self._label).set(max(0, head - self._window.acked))

    def _range(self, first: int, last: int) -> Iterator[ledger_pb2.SubscribeResponse | bytes]:
        try:
            envelopes = [data for _, data in self._log.iter_entries(first, last)]
        except LogRangeError as exc:  # pruned under the stream (not held by retention)
            self._fail(grpc.StatusCode.OUT_OF_RANGE, str(exc))
            return
        checkpoints = {cp.tree_size: cp for cp in self._log.checkpoints_between(first, last)}
        bodies: list[bytes | None] = [self._sendable(first + i, e) for i, e in enumerate(envelopes)]
        if self._models:
            bodies = [b if b is not None and _wanted(b, self._models) else None for b in bodies]
        sizes = [_FILTERED_SIZE if b is None else len(b) + _ENTRY_OVERHEAD for b in bodies]
        for batch in plan_batches(
            first,
            sizes,
            checkpoints,
            max_entries=self._config.batch_entries,
            max_bytes=self._config.batch_bytes,
        ):
            parts: list[tuple[bool, bytes]] = []
            for seq in range(batch.first, batch.last + 1):
                body = bodies[seq - first]
                if body is None:
                    parts.append((True, entry_hash(envelopes[seq - first])))
                else:
                    parts.append((False, body))
            message = encode_batch_response(batch.first, parts)
            self._window.mark_sent(batch.last)
            self._streamed.inc(batch.last - batch.first + 1)
            yield message
            if batch.checkpoint_after:
                self._checkpoint_sent = batch.last
                yield ledger_pb2.SubscribeResponse(checkpoint=checkpoints[batch.last])

    def _sendable(self, seq: int, envelope: bytes) -> bytes | None:
        """The envelope, or None when it cannot travel in one message (sent as its hash)."""
        if len(envelope) <= MAX_ENVELOPE_BYTES:
            return envelope
        logger.error(
            "entry too large to stream: sent as its hash",
            extra={"seq": seq, "bytes": len(envelope), "subscriber": self._label},
        )
        return None

    def _idle_checkpoint(self) -> log_pb2.Checkpoint | None:
        """A checkpoint signed after its entries went out (time-driven), while it still fits."""
        checkpoint = self._log.latest_checkpoint()
        if (
            checkpoint is None
            or checkpoint.tree_size != self._window.sent
            or checkpoint.tree_size <= self._checkpoint_sent
        ):
            return None
        self._checkpoint_sent = checkpoint.tree_size
        return checkpoint
