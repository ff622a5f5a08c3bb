"""Inference records and their log envelopes for verifierd tests (built, not captured)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from veritap.envelope import ZERO_HASH, encode_envelope, entry_hash
from veritap.merkle import root_of
from veritap.note import CheckpointBody, sign_checkpoint
from veritap.signing import Signer, Verifier
from veritap.v1 import log_pb2, record_pb2

from verifierd.store import Store


@dataclass(frozen=True)
class Exchange:
    """One chat exchange as the collector would record it, with token ids."""

    record_id: str
    model: str = "tiny"
    prompt_ids: tuple[int, ...] = (1, 2, 3)
    outputs: tuple[tuple[int, ...], ...] = ((5, 6, 7),)
    temperature: float | None = 1.0
    seed: int | None = 7
    quality: int = record_pb2.CAPTURE_QUALITY_COMPLETE
    status: int = 200
    extra_params: dict[str, object] = field(default_factory=dict)
    #: Whether the response carries the prover's ids (False: only the text, as a real
    #: client's traffic; the verifier must find them).
    claims_ids: bool = True
    text: str = "..."


def make_record(x: Exchange) -> record_pb2.InferenceRecord:
    sampling = record_pb2.SamplingParams()
    params: dict[str, object] = {"model": x.model, **x.extra_params}
    if x.claims_ids:
        params["return_token_ids"] = True
    if x.temperature is not None:
        sampling.temperature = x.temperature
        params["temperature"] = x.temperature
    if x.seed is not None:
        sampling.seed = x.seed
        params["seed"] = x.seed
    if len(x.outputs) > 1:
        sampling.n = len(x.outputs)
        params["n"] = len(x.outputs)
    sampling.params_json = json.dumps(params, sort_keys=True)
    messages = [{"role": "user", "content": "hi"}]
    record = record_pb2.InferenceRecord(
        record_id=x.record_id,
        origin="edge",
        request_first_byte_ns=1_000,
        response_last_byte_ns=2_000,
        quality=x.quality,
        request=record_pb2.HttpRequest(
            method="POST",
            target="/v1/chat/completions",
            body=json.dumps({**params, "messages": messages}).encode(),
        ),
        response=record_pb2.HttpResponse(status=x.status),
        api=record_pb2.ApiView(
            dialect="openai-chat",
            model=x.model,
            sampling=sampling,
            prompt_json=json.dumps(messages),
        ),
    )
    if x.claims_ids:
        record.api.prompt_token_ids.ids.extend(x.prompt_ids)
    for i, out in enumerate(x.outputs):
        record.api.choices.append(
            record_pb2.Choice(
                index=i,
                text=x.text,
                token_ids=record_pb2.TokenIds(ids=list(out)) if x.claims_ids else None,
                finish_reason="length",
            )
        )
    return record


#: The collector key the fixtures sign checkpoints with.
COLLECTOR = Signer.generate("test-collector")


def pinned(*origins: str) -> dict[str, Verifier]:
    """The pinned collector key of each origin, as a Pipeline's collector_keys."""
    return {origin: COLLECTOR.verifier() for origin in origins}


def signed_checkpoint(store: Store, origin: str, signer: Signer = COLLECTOR) -> log_pb2.Checkpoint:
    """A checkpoint of every entry stored from ``origin``, as its collector would sign it."""
    size = store.cursor(origin).seq
    root = root_of([leaf for leaf, _ in store.leaf_hashes(origin, 1, size)])
    note = sign_checkpoint(CheckpointBody(origin, size, root), signer)
    return log_pb2.Checkpoint(origin=origin, tree_size=size, root_hash=root, note=note)


def ingest(
    store: Store,
    origin: str,
    exchanges: Sequence[Exchange | record_pb2.InferenceRecord],
    *,
    checkpointed: bool = True,
) -> None:
    """Append the exchanges' records (or the records given) to ``origin``'s entries in the
    store, as intake would, then (``checkpointed``) the collector's signed checkpoint
    covering them."""
    cursor = store.cursor(origin)
    prev, seq = cursor.hash if cursor.seq else ZERO_HASH, cursor.seq
    batch = []
    for x in exchanges:
        seq += 1
        envelope = encode_envelope(
            seq=seq,
            prev_hash=prev,
            captured_at_ns=1_000 + seq,
            origin=origin,
            key_id=b"kid0",
            record=(
                x if isinstance(x, record_pb2.InferenceRecord) else make_record(x)
            ).SerializeToString(),
        )
        prev = entry_hash(envelope)
        batch.append((seq, envelope, prev))
    store.ingest(origin, batch)
    if checkpointed:
        store.ingest(origin, [], checkpoint=signed_checkpoint(store, origin))
