"""The demo's API client: chat traffic of the kind veritap must verify.

It sends OpenAI chat completions to a prover with the official `openai` SDK,
streaming and not, seeded, half of them with `return_token_ids` (the prover's
ids are then a claim the verifier checks) and half as real clients do, without
(the verifier finds the ids from the text), and multi-turn (the second turn
carries the first reply), so the captured records exercise every path of the
collector and verifier. The calibration traffic is of the same kind with other
questions and seeds, and some of it asks for logprobs (``top_logprobs`` 0 and 3,
streamed and not) so that calibration measures the logprobs tolerance on honest
values too. One request per prover is deliberately unseeded at T > 0:
the verifier must mark it UNVERIFIABLE(no_seed) rather than guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from openai import APIStatusError, AsyncOpenAI

TOPICS = (
    "the TCP three-way handshake",
    "why hash chains make logs tamper-evident",
    "how a passive network tap works",
    "what an Ed25519 signature proves",
    "how LMDB commits a transaction",
    "why sampling seeds matter for reproducibility",
)


@dataclass(frozen=True)
class ChatRequest:
    """One request as the demo sends it."""

    messages: tuple[tuple[str, str], ...]
    temperature: float
    seed: int | None
    stream: bool
    max_tokens: int
    top_p: float = 1.0
    top_k: int | None = None
    #: Ask for vLLM's `return_token_ids` extension (real clients do not).
    token_ids: bool = True
    #: Ask for ``logprobs`` with this many ``top_logprobs`` (None: no logprobs).
    top_logprobs: int | None = None

    def body(self, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": role, "content": text} for role, text in self.messages],
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "stream": self.stream,
        }
        if self.token_ids:
            body["return_token_ids"] = True
        if self.seed is not None:
            body["seed"] = self.seed
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.top_logprobs is not None:
            body["logprobs"], body["top_logprobs"] = True, self.top_logprobs
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body


@dataclass
class Exchange:
    """What the client saw: the reply text, to build the next turn."""

    request: ChatRequest
    status: int
    text: str = ""
    errors: list[str] = field(default_factory=list)


def first_turns(
    count: int,
    *,
    max_tokens: int,
    seed_base: int,
    question: str = "Explain {topic} in two sentences.",
) -> list[ChatRequest]:
    """`count` first-turn requests cycling through sampling settings and topics."""
    settings = (
        (0.0, True, 1.0, None),
        (0.7, False, 0.9, None),
        (1.0, True, 1.0, 20),
        (0.8, False, 0.95, 40),
    )
    requests = []
    for i in range(count):
        temperature, stream, top_p, top_k = settings[i % len(settings)]
        topic = TOPICS[i % len(TOPICS)]
        requests.append(
            ChatRequest(
                messages=(
                    ("system", "You are a terse technical assistant."),
                    ("user", question.format(topic=topic)),
                ),
                temperature=temperature,
                seed=seed_base + i,
                stream=stream,
                max_tokens=max_tokens,
                top_p=top_p,
                top_k=top_k,
                token_ids=(i // 2) % 2 == 0,
            )
        )
    return requests


#: What calibration request i asks for (``top_logprobs``) by i modulo 3: its cycle
#: is out of step with the sampling settings', so both streamed and plain, greedy and
#: sampled requests state logprobs.
_CALIBRATION_LOGPROBS = (None, 3, 0)


def calibration_turns(count: int, *, max_tokens: int, seed_base: int) -> list[ChatRequest]:
    """Seeded requests for calibration: the judged traffic's sampling settings, other
    questions and seeds, so the threshold is not fitted to the very responses it judges;
    two in three ask for logprobs, so the logprobs tolerance is measured on them."""
    turns = first_turns(
        count,
        max_tokens=max_tokens,
        seed_base=seed_base,
        question="Describe {topic} to a new colleague.",
    )
    return [
        replace(turn, top_logprobs=_CALIBRATION_LOGPROBS[i % len(_CALIBRATION_LOGPROBS)])
        for i, turn in enumerate(turns)
    ]


def second_turn(first: Exchange) -> ChatRequest:
    """The follow-up of a conversation: same settings, the reply appended."""
    previous = first.request
    return ChatRequest(
        messages=(
            *previous.messages,
            ("assistant", first.text),
            ("user", "Now give one concrete example."),
        ),
        temperature=previous.temperature,
        seed=None if previous.seed is None else previous.seed + 1000,
        stream=not previous.stream,
        max_tokens=previous.max_tokens,
        top_p=previous.top_p,
        top_k=previous.top_k,
    )


def unseeded(max_tokens: int) -> ChatRequest:
    """A sampled request without a seed: not verifiable, and said so."""
    return ChatRequest(
        messages=(("user", "Name three network protocols."),),
        temperature=0.9,
        seed=None,
        stream=False,
        max_tokens=max_tokens,
    )


async def send(client: AsyncOpenAI, model: str, request: ChatRequest) -> Exchange:
    """One chat completion through the official OpenAI SDK, as an application sends it:
    the text is what the SDK shows (streamed deltas joined). vLLM's extensions
    (``top_k``, ``return_token_ids``) travel in ``extra_body``."""
    body = request.body(model)
    standard = {k: body.pop(k) for k in _SDK_PARAMS if k in body}
    exchange = Exchange(request=request, status=200)
    try:
        if not request.stream:
            completion = await client.chat.completions.create(**standard, extra_body=body)
            exchange.text = completion.choices[0].message.content or ""
            return exchange
        pieces: list[str] = []
        stream = await client.chat.completions.create(**standard, extra_body=body)
        async for chunk in stream:
            for choice in chunk.choices:
                pieces.append(choice.delta.content or "")
        exchange.text = "".join(pieces)
    except APIStatusError as exc:
        exchange.status = exc.status_code
        exchange.errors.append(str(exc))
    return exchange


#: Request fields the SDK's ``create`` takes as its own parameters.
_SDK_PARAMS = (
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "stream",
    "seed",
    "stream_options",
    "logprobs",
    "top_logprobs",
)
