"""Recorded traffic for the VerifierService and operator-console tests.

A morning of chat exchanges between API clients and a prover serving the committed
model ``tiny-chat`` (and one unknown model), each with the verdict verifierd reached
for it: honest float32 responses (every margin 0), honest bf16-like ones (a few small
margins), dishonest ones (large margins, tokens outside the mask), unseeded ones
(UNVERIFIABLE no_seed), a capture gap, a record the sampling policy skipped, and
records still waiting for their engine. Everything is fixed (ids, timestamps, keys,
margins), so screens rendered from it are the same on every run.

The tokenizer is a byte-level BPE trained here on a fixed paragraph (deterministic),
saved in a model directory whose commitment and weights-cache copy the tests build.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from ulid import ULID
from veritap.signing import KeyFormatError, Signer, Verifier
from veritap.v1 import log_pb2, record_pb2, verifier_pb2

from verifierd.commitments import Commitment, DifrSettings, commit_model_dir
from verifierd.store import Enqueue, Store, StoredEntry, VerdictWrite
from verifierd.verdicts import sign_verdict
from verifierd.weights_cache import WeightsCache

ORIGIN = "edge-1.lab"
MODEL = "tiny-chat"
UNKNOWN_MODEL = "mystery-7b"
#: 2025-03-01T09:00:00Z.
BASE_NS = 1_740_819_600_000_000_000
SECOND = 1_000_000_000
DIFR = DifrSettings(threshold=0.05, delta_max=10.0, sample_rate=1.0)
VERIFIER_KEY_SEED = bytes(range(32))

PASS = verifier_pb2.VERDICT_STATUS_PASS
FAIL = verifier_pb2.VERDICT_STATUS_FAIL
UNVERIFIABLE = verifier_pb2.VERDICT_STATUS_UNVERIFIABLE
SKIPPED = verifier_pb2.VERDICT_STATUS_SKIPPED
PENDING = verifier_pb2.VERDICT_STATUS_PENDING

_CORPUS = (
    "The TCP three-way handshake opens a connection: SYN, SYN-ACK, ACK. "
    "A hash chain makes a log tamper-evident because every entry names the hash of the "
    "one before it. A passive network tap copies packets without ever delaying them. "
    "An Ed25519 signature proves who wrote a checkpoint, and LMDB commits a transaction "
    "by switching one meta page. Sampling seeds matter for reproducibility: the same seed "
    "gives the same tokens. "
)


@dataclass(frozen=True)
class Exchange:
    """One captured request/response and what the verifier made of it."""

    index: int
    question: str
    answer: str
    #: PASS, FAIL, UNVERIFIABLE, SKIPPED or PENDING (still queued).
    status: int
    model: str = MODEL
    seed: int | None = 1234
    temperature: float = 0.7
    #: The prover returned token ids (return_token_ids); otherwise re-tokenized.
    token_ids: bool = True
    #: "exact" (all 0), "bf16" (a few small margins) or "dishonest".
    margins: str = "exact"
    reason: str = ""
    detail: str = ""
    quality: int = record_pb2.CAPTURE_QUALITY_COMPLETE

    @property
    def record_id(self) -> str:
        """A ULID for the request time, its random part fixed by the index."""
        millis = (self.at_ns // 1_000_000).to_bytes(6, "big")
        return str(ULID.from_bytes(millis + hashlib.sha256(b"%d" % self.index).digest()[:10]))

    @property
    def at_ns(self) -> int:
        return BASE_NS + self.index * 7 * SECOND


_Q = (
    "What does the TCP three-way handshake do?",
    "Why does a hash chain make a log tamper-evident?",
    "How does a passive network tap work?",
    "What does an Ed25519 signature prove?",
    "How does LMDB commit a transaction?",
    "Why do sampling seeds matter?",
)
_A = (
    "The TCP three-way handshake opens a connection: SYN, SYN-ACK, ACK.",
    "A hash chain makes a log tamper-evident because every entry names the hash of the "
    "one before it.",
    "A passive network tap copies packets without ever delaying them.",
    "An Ed25519 signature proves who wrote a checkpoint.",
    "LMDB commits a transaction by switching one meta page.",
    "Sampling seeds matter for reproducibility: the same seed gives the same tokens.",
)


def _exchanges() -> tuple[Exchange, ...]:
    plan: list[dict[str, object]] = [
        {"status": PASS},
        {"status": PASS, "margins": "bf16"},
        {"status": FAIL, "margins": "dishonest"},
        {"status": PASS, "token_ids": False},
        {
            "status": UNVERIFIABLE,
            "seed": None,
            "reason": "no_seed",
            "detail": "temperature 0.7 without a seed",
        },
        {"status": PASS},
        {"status": PASS, "margins": "bf16"},
        {
            "status": SKIPPED,
            "reason": "not_sampled",
            "detail": "not selected by the sampling policy",
        },
        {"status": FAIL, "margins": "dishonest", "token_ids": False},
        {"status": PASS},
        {
            "status": UNVERIFIABLE,
            "reason": "capture_gap",
            "detail": "response bytes 812..1400 missing",
            "quality": record_pb2.CAPTURE_QUALITY_RESPONSE_GAP,
        },
        {"status": PASS, "temperature": 0.0, "seed": None},
        {
            "status": UNVERIFIABLE,
            "model": UNKNOWN_MODEL,
            "reason": "unknown_commitment",
            "detail": f"no commitment serves {UNKNOWN_MODEL!r}",
        },
        {"status": PASS, "margins": "bf16"},
        {"status": FAIL, "margins": "dishonest"},
        {"status": PASS},
        {"status": PASS},
        {"status": PENDING},
        {"status": PENDING},
        {"status": PENDING, "token_ids": False},
    ]
    out = []
    for i, fields in enumerate(plan):
        out.append(
            Exchange(
                index=i + 1,
                question=_Q[i % len(_Q)] + ("" if i < len(_Q) else f" (take {i // len(_Q) + 1})"),
                answer=_A[i % len(_A)],
                **fields,
            )
        )
    return tuple(out)


EXCHANGES = _exchanges()


def by_record_id(record_id: str) -> Exchange:
    return next(e for e in EXCHANGES if e.record_id == record_id)


def verifier_signer() -> Signer:
    return Signer("verifier-a", VERIFIER_KEY_SEED)


def collector_signer() -> Signer:
    """A fresh checkpoint key for ORIGIN whose verifier-key string parses back."""
    while True:
        signer = Signer.generate(ORIGIN)
        try:
            Verifier.parse(signer.verifier().key_string())
        except KeyFormatError:
            continue
        return signer


# -- the committed model ----------------------------------------------------------------


def build_tokenizer() -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"],
        show_progress=False,
    )
    tokenizer.train_from_iterator([_CORPUS] * 8, trainer)
    return tokenizer


def make_model_dir(root: Path) -> Path:
    """A small model directory: deterministic weights, config and the tokenizer."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(7)
    save_file(
        {"lm_head.weight": rng.standard_normal((8, 8)).astype(np.float32)},
        str(root / "model.safetensors"),
    )
    (root / "config.json").write_text(
        json.dumps({"model_type": "llama", "torch_dtype": "float32", "vocab_size": 320}),
        encoding="utf-8",
    )
    build_tokenizer().save(str(root / "tokenizer.json"))
    return root


def make_commitment(model_dir: Path) -> Commitment:
    return commit_model_dir(
        model_dir,
        served_model_names=(MODEL,),
        sampler_profile="vllm-cpu-splitmix",
        engine="vllm",
        engine_version="0.32.0",
        dtype="float32",
        max_model_len=512,
        difr=DIFR,
        generation_config="vllm",
    )


@dataclass(frozen=True)
class CommittedModel:
    commitment: Commitment
    weights: WeightsCache
    tokenizer: Tokenizer


def install_committed_model(root: Path) -> CommittedModel:
    """Build the model directory, commit it and install it in a weights cache under root."""
    model_dir = make_model_dir(root / "model")
    commitment = make_commitment(model_dir)
    weights = WeightsCache(root / "weights")
    weights.install(commitment, model_dir)
    return CommittedModel(commitment, weights, build_tokenizer())


# -- records ----------------------------------------------------------------------------


def make_record(
    exchange: Exchange, tokenizer: Tokenizer, origin: str = ORIGIN
) -> record_pb2.InferenceRecord:
    messages = [
        {"role": "system", "content": "You are a concise network engineer."},
        {"role": "user", "content": exchange.question},
    ]
    at = exchange.at_ns
    record = record_pb2.InferenceRecord(
        record_id=exchange.record_id,
        origin=origin,
        request_first_byte_ns=at,
        response_first_byte_ns=at + 40_000_000,
        response_last_byte_ns=at + 900_000_000,
        quality=exchange.quality,
    )
    record.flow.ip_version = 4
    record.flow.client_address = f"10.20.0.{10 + exchange.index}"
    record.flow.client_port = 40000 + exchange.index
    record.flow.server_address = "10.20.1.5"
    record.flow.server_port = 8000
    api = record.api
    api.dialect = "openai-chat"
    api.model = exchange.model
    api.prompt_json = json.dumps(messages, sort_keys=True, separators=(",", ":"))
    api.sampling.temperature = exchange.temperature
    api.sampling.max_tokens = 64
    if exchange.seed is not None:
        api.sampling.seed = exchange.seed
    api.response_id = f"chatcmpl-{exchange.index:04d}"
    ids = tokenizer.encode(exchange.answer, add_special_tokens=False).ids
    choice = api.choices.add(index=0, text=exchange.answer, finish_reason="stop")
    if exchange.token_ids:
        choice.token_ids.ids.extend(ids)
    api.usage.prompt_tokens = 31
    api.usage.completion_tokens = len(ids)
    api.usage.total_tokens = 31 + len(ids)
    body = {"model": exchange.model, "messages": messages, "temperature": exchange.temperature}
    record.request.method = "POST"
    record.request.target = "/v1/chat/completions"
    record.request.host = "10.20.1.5:8000"
    record.request.body = json.dumps(body).encode()
    record.response.status = 200
    record.response.reason = "OK"
    return record


def margins_for(exchange: Exchange, count: int) -> np.ndarray:
    """The verdict's per-token margins, fixed by the exchange."""
    i = np.arange(count)
    if exchange.margins == "bf16":
        return np.where(i % 9 == 4, 0.25, 0.0)
    if exchange.margins == "dishonest":
        wave = ((i * 37 + exchange.index * 11) % 23) / 23.0 * 6.0
        return np.where(i % 11 == 5, DIFR.delta_max, wave)
    return np.zeros(count)


def verdict_for(
    exchange: Exchange,
    entry: StoredEntry,
    commitment: Commitment,
    tokenizer: Tokenizer,
) -> verifier_pb2.Verdict:
    verdict = verifier_pb2.Verdict(
        record_id=exchange.record_id,
        origin=entry.origin,
        seq=entry.seq,
        entry_hash=entry.entry_hash,
        model=exchange.model,
        status=exchange.status,
        reason=exchange.reason,
        detail=exchange.detail,
        decided_at_ns=exchange.at_ns + 3 * SECOND,
    )
    if exchange.status in (UNVERIFIABLE, SKIPPED) and exchange.model != MODEL:
        return verdict
    verdict.commitment_id = commitment.commitment_id
    verdict.settings.CopyFrom(DIFR.to_proto())
    verdict.sampler_profile = commitment.sampler_profile
    verdict.engine = commitment.engine
    verdict.engine_version = commitment.engine_version
    if exchange.status in (UNVERIFIABLE, SKIPPED):
        return verdict
    count = len(tokenizer.encode(exchange.answer, add_special_tokens=False).ids)
    margins = margins_for(exchange, count)
    clipped = np.minimum(margins, DIFR.delta_max)
    verdict.score = float(clipped.mean())
    verdict.token_count = count
    verdict.margins_f16 = margins.astype("<f2").tobytes()
    verdict.exact_matches = int((margins == 0).sum())
    verdict.out_of_mask = int((margins >= DIFR.delta_max).sum())
    verdict.retokenized = not exchange.token_ids
    verdict.timings.queued_ns = 1_200_000_000
    verdict.timings.prefill_ns = 180_000_000 + exchange.index * 1_000_000
    verdict.timings.scoring_ns = 4_000_000
    verdict.timings.batch_size = 8
    verdict.attempts = 1
    return verdict


# -- replaying into a store -------------------------------------------------------------


def chained_envelopes(
    records: Sequence[record_pb2.InferenceRecord], origin: str = ORIGIN
) -> list[tuple[int, bytes, bytes]]:
    """(seq, envelope, entry hash) of a log holding ``records``, for Store.ingest."""
    out = []
    prev = bytes(32)
    for seq, record in enumerate(records, start=1):
        envelope = log_pb2.Entry(
            seq=seq,
            prev_hash=prev,
            captured_at_ns=record.response_last_byte_ns,
            origin=origin,
            key_id=b"\x00\x01\x02\x03",
            record=record.SerializeToString(deterministic=True),
        ).SerializeToString(deterministic=True)
        prev = hashlib.sha256(b"\x00" + envelope).digest()
        out.append((seq, envelope, prev))
    return out


def store_as_log(store: Store, records: Sequence[record_pb2.InferenceRecord]) -> None:
    """Ingest ``records`` as ORIGIN's log, covered by a stored checkpoint (the store does
    not check it: these tests classify without the pipeline's authentication)."""
    entries = chained_envelopes(records)
    checkpoint = log_pb2.Checkpoint(origin=ORIGIN, tree_size=len(entries))
    store.ingest(ORIGIN, entries, checkpoint=checkpoint)


def classify_inbox(
    store: Store,
    model: CommittedModel,
    signer: Signer,
    *,
    exchanges: Sequence[Exchange] = EXCHANGES,
) -> int:
    """Give every inbox entry of the listed exchanges its recorded outcome (a signed
    verdict, or a place in the commitment's queue); returns how many were classified."""
    wanted = {e.record_id: e for e in exchanges}
    items: list[Enqueue | VerdictWrite] = []
    for entry in store.inbox(10_000):
        record = record_pb2.InferenceRecord.FromString(
            log_pb2.Entry.FromString(entry.envelope).record
        )
        exchange = wanted.get(record.record_id)
        if exchange is None:
            continue
        if exchange.status == PENDING:
            items.append(
                Enqueue(entry.origin, entry.seq, record.record_id, model.commitment.commitment_id)
            )
            continue
        verdict = verdict_for(exchange, entry, model.commitment, model.tokenizer)
        items.append(
            VerdictWrite(
                entry.origin, entry.seq, record.record_id, sign_verdict(verdict, signer), verdict
            )
        )
    store.classify(items)
    return len(items)


def replay_into_store(store: Store, model: CommittedModel, signer: Signer) -> None:
    """Ingest every exchange as ORIGIN's log and classify them all."""
    store_as_log(store, [make_record(e, model.tokenizer) for e in EXCHANGES])
    classify_inbox(store, model, signer)
