"""Ask a collector what :func:`verifierd.intake.resume_check.check_resume` judges.

GetHead, its latest checkpoint, its checkpoint of the size this verifier last verified,
and an inclusion proof of the cursor's seq against that latest checkpoint (only when the
collector still keeps that entry and the checkpoint reaches it). A call that fails is
recorded as the code and detail it failed with, never raised: the judgement says what is
missing.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar

import grpc
from veritap.v1 import ledger_pb2, ledger_pb2_grpc

from verifierd.intake.resume_check import CollectorView
from verifierd.store import Cursor

T = TypeVar("T")

#: Seconds each question may take.
PROBE_TIMEOUT_S = 5.0


async def _ask(call: Awaitable[T]) -> tuple[T | None, str]:
    try:
        return await call, ""
    except grpc.aio.AioRpcError as exc:
        return None, f"{exc.code().name}: {exc.details()}"


async def probe_collector(
    stub: ledger_pb2_grpc.LedgerServiceAsyncStub, cursor: Cursor
) -> CollectorView:
    timeout = PROBE_TIMEOUT_S
    head, head_error = await _ask(stub.GetHead(ledger_pb2.GetHeadRequest(), timeout=timeout))
    if head is None:
        return CollectorView(head=None, head_error=head_error)
    latest_answer, latest_error = await _ask(
        stub.GetCheckpoint(ledger_pb2.GetCheckpointRequest(), timeout=timeout)
    )
    latest = latest_answer.checkpoint if latest_answer is not None else None
    at_ours, at_ours_error = None, ""
    if cursor.checkpoint is not None:
        request = ledger_pb2.GetCheckpointRequest(tree_size=cursor.checkpoint.tree_size)
        answer, at_ours_error = await _ask(stub.GetCheckpoint(request, timeout=timeout))
        at_ours = answer.checkpoint if answer is not None else None
    proof, proof_error = None, ""
    if not cursor.seq:
        proof_error = "nothing stored"
    elif cursor.seq < head.retention_floor:
        proof_error = f"the collector pruned seq {cursor.seq}"
    elif latest is None or latest.tree_size < cursor.seq:
        size = latest.tree_size if latest is not None else 0
        proof_error = f"its latest checkpoint (size {size}) does not reach seq {cursor.seq}"
    else:
        request_proof = ledger_pb2.GetInclusionProofRequest(
            seq=cursor.seq, tree_size=latest.tree_size
        )
        proof, proof_error = await _ask(stub.GetInclusionProof(request_proof, timeout=timeout))
    return CollectorView(
        head=head,
        latest=latest,
        latest_error=latest_error,
        at_ours=at_ours,
        at_ours_error=at_ours_error,
        proof=proof,
        proof_error=proof_error,
    )
