"""The traffic `verifierd calibrate` learns from: a commitment's complete, replayable
records in verifierd's store, recomputed on its engine without clipping.

Kept apart from the command so that `verifierd` starts without importing torch and vLLM's
client side for every other subcommand.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from veritap.envelope import EnvelopeError, decode_envelope, decode_record
from veritap.v1 import record_pb2

from verifierd.calibration import UNCLIPPED
from verifierd.commitments import Commitment
from verifierd.config import Config
from verifierd.engine.backend import ScoreRequest
from verifierd.engine.pool import EnginePool
from verifierd.evidence.client_view import EvidenceUnavailable
from verifierd.pipeline import score_requests
from verifierd.request_sampling import SamplingNotReproducibleError
from verifierd.store import Store


def honest_requests(
    store: Store,
    commitment: Commitment,
    *,
    origins: Sequence[str] = (),
    from_seq: int = 1,
    to_seq: int = 0,
    limit: int,
) -> Iterator[ScoreRequest]:
    """Score requests for the commitment's complete, replayable records in the range
    (every origin when `origins` is empty; `to_seq` 0: up to each origin's newest)."""
    models = set(commitment.served_model_names)
    count = 0
    for origin in origins or store.origins():
        last = to_seq or store.cursor(origin).seq
        for seq in range(from_seq, last + 1):
            entry = store.entry(origin, seq)
            if entry is None or not entry.envelope:
                continue
            try:
                record = decode_record(decode_envelope(entry.envelope))
            except EnvelopeError:
                continue
            if (
                record.quality != record_pb2.CAPTURE_QUALITY_COMPLETE
                or record.api.model not in models
                or record.response.status != 200
            ):
                continue
            try:
                requests, _ = score_requests(record, commitment, f"{origin}/{seq}")
            except (SamplingNotReproducibleError, EvidenceUnavailable):
                continue
            for request in requests:
                if count >= limit:
                    return
                count += 1
                yield request


@dataclass(frozen=True)
class Recomputed:
    #: Unclipped margins of every request that scored.
    margins: list[npt.NDArray[np.float64]]
    #: The largest logprobs deviation of each of those whose response stated logprobs.
    logprobs_deviations: list[float]


def recompute(
    config: Config, commitment: Commitment, model_dir: Path, requests: list[ScoreRequest]
) -> Recomputed:
    """The honest statistics of every request that scores, on the commitment's engine."""
    pool = EnginePool(config.engines)
    margins = []
    deviations = []
    try:
        pool.acquire(commitment, model_dir)
        step = config.engines.max_batch_requests
        for i in range(0, len(requests), step):
            scored = pool.score(
                commitment.commitment_id,
                requests[i : i + step],
                commitment.sampler_profile,
                UNCLIPPED,
            )
            # A choice whose evidence contradicts a claim or cannot be scored is no
            # honest sample.
            honest = [r for r in scored.results if r.finding is None]
            margins += [r.difr.margins for r in honest]
            deviations += [r.logprobs.largest for r in honest if r.logprobs is not None]
    finally:
        pool.close()
    return Recomputed(margins, deviations)
