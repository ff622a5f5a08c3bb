"""OpenAI-style HTTP messages shaped exactly like vLLM 0.32 serves them.

The JSON layouts follow vllm/entrypoints/openai/{chat_completion,completion}/
protocol.py and serving.py: non-streamed chat puts `prompt_token_ids` at the
top level and `token_ids` on each choice; streamed chat sends, per choice, a
first chunk with the role and the top-level `prompt_token_ids`, then content
deltas with delta `token_ids`, then a chunk with `finish_reason`, an optional
usage-only chunk, and `data: [DONE]`. Completions carry `prompt_token_ids`
and `token_ids` on each choice (streamed: `prompt_token_ids` on a choice's first
chunk). Serialisation is compact JSON, as pydantic's model_dump_json writes it.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

CREATED = 1_767_225_600


def _dump(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


@dataclass
class Generation:
    """What the model produced for one choice."""

    tokens: Sequence[str]
    token_ids: Sequence[int]
    finish_reason: str = "stop"

    @property
    def text(self) -> str:
        return "".join(self.tokens)


@dataclass
class Call:
    """One API call: the request fields and the generations the server returns."""

    path: str  # /v1/chat/completions or /v1/completions
    model: str
    prompt: object  # messages list (chat) or prompt (completions)
    params: dict[str, object] = field(default_factory=dict)
    generations: Sequence[Generation] = ()
    prompt_token_ids: Sequence[int] = (1, 2, 3)
    response_id: str = "chatcmpl-0"

    @property
    def chat(self) -> bool:
        return self.path == "/v1/chat/completions"

    @property
    def stream(self) -> bool:
        return bool(self.params.get("stream"))

    @property
    def token_ids_on(self) -> bool:
        return bool(self.params.get("return_token_ids"))

    def request_json(self) -> bytes:
        key = "messages" if self.chat else "prompt"
        return _dump({"model": self.model, key: self.prompt, **self.params}).encode()

    def request(self, *, headers: str = "") -> bytes:
        body = self.request_json()
        return (
            f"POST {self.path} HTTP/1.1\r\nHost: prover:8000\r\nUser-Agent: test\r\n"
            f"Authorization: Bearer sk-secret\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def usage(self) -> dict[str, int]:
        completion = sum(len(g.token_ids) for g in self.generations)
        prompt = len(self.prompt_token_ids)
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        }

    def response_json(self) -> bytes:
        ids = self.token_ids_on
        if self.chat:
            choices: list[dict[str, object]] = [
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": g.text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "tool_calls": [],
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": g.finish_reason,
                    "stop_reason": None,
                    "token_ids": list(g.token_ids) if ids else None,
                    "routed_experts": None,
                }
                for i, g in enumerate(self.generations)
            ]
            doc: dict[str, object] = {
                "id": self.response_id,
                "object": "chat.completion",
                "created": CREATED,
                "model": self.model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {**self.usage(), "prompt_tokens_details": None},
                "prompt_logprobs": None,
                "prompt_token_ids": list(self.prompt_token_ids) if ids else None,
                "prompt_text": None,
                "kv_transfer_params": None,
            }
        else:
            doc = {
                "id": self.response_id,
                "object": "text_completion",
                "created": CREATED,
                "model": self.model,
                "choices": [
                    {
                        "index": i,
                        "text": g.text,
                        "logprobs": None,
                        "finish_reason": g.finish_reason,
                        "stop_reason": None,
                        "token_ids": list(g.token_ids) if ids else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": list(self.prompt_token_ids) if ids else None,
                        "routed_experts": None,
                    }
                    for i, g in enumerate(self.generations)
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": {**self.usage(), "prompt_tokens_details": None},
                "kv_transfer_params": None,
            }
        return _dump(doc).encode()

    def sse_events(self) -> list[bytes]:
        """Each `data: ...\\n\\n` event in the order vLLM sends them (round-robin over choices)."""
        ids = self.token_ids_on
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        head = {"id": self.response_id, "object": obj, "created": CREATED, "model": self.model}
        events: list[bytes] = []

        def emit(chunk: dict[str, object]) -> None:
            events.append(b"data: " + _dump(chunk).encode() + b"\n\n")

        if self.chat:
            for i in range(len(self.generations)):
                emit(
                    {
                        **head,
                        "choices": [
                            {
                                "index": i,
                                "delta": {"role": "assistant", "content": ""},
                                "logprobs": None,
                                "finish_reason": None,
                            }
                        ],
                        "prompt_token_ids": list(self.prompt_token_ids) if ids else None,
                    }
                )
        longest = max((len(g.tokens) for g in self.generations), default=0)
        for step in range(longest):
            for i, g in enumerate(self.generations):
                if step >= len(g.tokens):
                    continue
                last = step == len(g.tokens) - 1
                choice: dict[str, object]
                if self.chat:
                    choice = {
                        "index": i,
                        "delta": {"content": g.tokens[step]},
                        "logprobs": None,
                        "finish_reason": g.finish_reason if last else None,
                    }
                    if last:
                        choice["stop_reason"] = None
                    choice["token_ids"] = [g.token_ids[step]] if ids else None
                else:
                    choice = {
                        "index": i,
                        "text": g.tokens[step],
                        "logprobs": None,
                        "finish_reason": g.finish_reason if last else None,
                        "stop_reason": None,
                        "prompt_token_ids": (
                            list(self.prompt_token_ids) if ids and step == 0 else None
                        ),
                        "token_ids": [g.token_ids[step]] if ids else None,
                    }
                emit({**head, "choices": [choice]})
        options = self.params.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            emit({**head, "choices": [], "usage": self.usage()})
        events.append(b"data: [DONE]\n\n")
        return events

    def response(self, *, chunked_events: bool = True) -> bytes:
        """The whole HTTP response: JSON with Content-Length, or SSE, one chunk per event."""
        if not self.stream:
            body = self.response_json()
            return (
                b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
                b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(body)
            ) + body
        head = (
            b"HTTP/1.1 200 OK\r\ndate: Thu, 01 Jan 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
            b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        events = self.sse_events()
        if not chunked_events:
            return head + sse_chunk(b"".join(events)) + b"0\r\n\r\n"
        return head + b"".join(sse_chunk(e) for e in events) + b"0\r\n\r\n"


def sse_chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def error_response(status: int, message: str) -> bytes:
    body = _dump(
        {"error": {"message": message, "type": "BadRequestError", "param": None, "code": status}}
    ).encode()
    return (
        b"HTTP/1.1 %d Bad Request\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % (status, len(body))
    ) + body


def words(n: int, seed: int = 0) -> Generation:
    """A deterministic generation of `n` tokens."""
    vocab = [" the", " model", " said", " hello", " world", ".", " and", " then", " é", " 🙂"]
    tokens = [vocab[(seed + i * 7) % len(vocab)] for i in range(n)]
    ids = [100 + (seed + i * 7) % len(vocab) for i in range(n)]
    return Generation(tokens, ids, "length" if n % 2 else "stop")


def typical_call(rng: random.Random, index: int) -> Call:
    """A call of the capture benchmarks' mix: half streamed, prompts of 5..40 words."""
    stream = index % 2 == 0
    # Streamed answers are long-tailed (log-uniform 100..5000 tokens, median ~700, as
    # appliance/CAPTURE.md's 5000-token streams); JSON answers are 50..800 tokens.
    tokens = (
        int(math.exp(rng.uniform(math.log(100), math.log(5000))))
        if stream
        else rng.randint(50, 800)
    )
    params: dict[str, object] = {
        "temperature": 0.7,
        "seed": index,
        "max_tokens": tokens,
        "return_token_ids": True,
    }
    if stream:
        params["stream"] = True
    prompt = [{"role": "user", "content": "benchmark prompt " * rng.randint(5, 40)}]
    return Call(
        "/v1/chat/completions",
        "bench-model",
        prompt,
        params,
        [words(tokens, seed=index)],
        prompt_token_ids=tuple(range(1, rng.randint(20, 200))),
        response_id=f"chatcmpl-{index}",
    )
