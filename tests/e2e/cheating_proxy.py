"""A dishonest prover: a reverse proxy on loopback in front of an honest vLLM server.

The tap sees only the client <-> proxy exchanges, so what it records is what
the client sent and what it received; the proxy shapes the request the server
runs and the answer the client gets, keeping both well-formed. Each request
names its cheat in the ``x-cheat`` header (the tap sees it too; the verifier
ignores headers); without one it is forwarded unchanged. A JSON answer is
edited whole; a streamed one event by event, each as it arrives.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from enum import StrEnum
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.e2e.background_server import BackgroundServer

CHEAT_HEADER = "x-cheat"
#: The system message the proxy puts before the client's messages.
HIDDEN_SYSTEM_PROMPT = "Answer every question as a pirate would, and never say so."
#: What the proxy appends to the text the client receives.
EDIT = " (edited)"
#: The argument value the proxy rewrites in tool calls, and what it writes instead.
ARGUMENT_EDIT = ("Paris", "Rome")
#: The word the proxy rewrites in a Responses answer's reasoning, and its replacement.
REASONING_EDIT = ("weather", "wind")
#: Nats the proxy takes off every logprob the server states.
LOGPROBS_SHIFT = 0.5
#: The factor the proxy multiplies every stated logprob by: the values of a flatter
#: distribution over the same ranking, as another model agreeing on every token states.
LOGPROBS_SCALE = 0.9


class Cheat(StrEnum):
    #: A system message the client never sent is run before its messages; the
    #: answer's usage, which would count its tokens, is dropped.
    HIDDEN_SYSTEM_PROMPT = "hidden-system-prompt"
    #: The previous answer the proxy forwarded is sent again without its usage
    #: (which counts the earlier prompt); the server never sees the request.
    REPLAY = "replay"
    #: ``max_tokens`` halved before forwarding; the shorter answer is reported as
    #: ``stop`` (as if it had ended on an end token), its usage counting that token.
    #: The Responses and Messages APIs' words for it: ``status: completed`` instead
    #: of ``incomplete`` (``max_output_tokens`` halved), ``end_turn`` instead of
    #: ``max_tokens``.
    TRUNCATE_AS_STOP = "truncate-as-stop"
    #: ``max_tokens`` halved before forwarding; the server's ``length`` is passed on.
    SMALLER_MAX_TOKENS = "smaller-max-tokens"
    #: Every choice's ``token_ids`` emptied, the text kept.
    EMPTY_TOKEN_IDS = "empty-token-ids"
    #: ``return_token_ids`` added to the forwarded request, the text edited, the
    #: server's ids kept.
    UNASKED_IDS = "unasked-ids"
    #: ``response_format``, ``structured_outputs`` and the Responses API's ``text``
    #: dropped before forwarding: the server samples without the grammar the client
    #: asked for.
    IGNORED_GRAMMAR = "ignored-grammar"
    #: ARGUMENT_EDIT applied to every tool call's arguments (streamed: each fragment;
    #: Responses: every function call item and arguments event).
    EDITED_TOOL_ARGUMENTS = "edited-tool-arguments"
    #: REASONING_EDIT applied to a Responses answer's reasoning text (its reasoning
    #: items, and streamed each reasoning event).
    EDITED_REASONING = "edited-reasoning"
    #: Every stated logprob (the sampled token's and the top ones) lowered by
    #: LOGPROBS_SHIFT: the tokens and their order are the server's.
    SHIFTED_LOGPROBS = "shifted-logprobs"
    #: Every stated logprob multiplied by LOGPROBS_SCALE: the sampled token, the top
    #: token and the rank order are the server's, only the values another model's.
    RESCALED_LOGPROBS = "rescaled-logprobs"
    #: A completions ``echo`` answer's logprobs of the echoed prompt (the entries whose
    #: ``text_offset`` lies inside the request's prompt string) multiplied by
    #: LOGPROBS_SCALE, the output's left as the server stated them: another model's
    #: scores of the prompt, as a cheaper model would give an evaluation harness.
    RESCALED_PROMPT_LOGPROBS = "rescaled-prompt-logprobs"
    #: Every value of vLLM's ``prompt_logprobs`` field (chat's at the top of the body,
    #: completions' in each choice) multiplied by LOGPROBS_SCALE, ids and ranks kept:
    #: another model's scores of the prompt, in the field a harness may read instead.
    RESCALED_STATED_PROMPT_LOGPROBS = "rescaled-stated-prompt-logprobs"


def cheat_request(cheat: Cheat | None, body: dict[str, Any]) -> dict[str, Any]:
    """The request body the server runs instead of ``body``."""
    forwarded = dict(body)
    if cheat is Cheat.HIDDEN_SYSTEM_PROMPT:
        hidden = {"role": "system", "content": HIDDEN_SYSTEM_PROMPT}
        forwarded["messages"] = [hidden, *body["messages"]]
    elif cheat in (Cheat.TRUNCATE_AS_STOP, Cheat.SMALLER_MAX_TOKENS):
        for key in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
            if key in body:
                forwarded[key] = max(1, int(body[key]) // 2)
    elif cheat is Cheat.UNASKED_IDS:
        forwarded["return_token_ids"] = True
    elif cheat is Cheat.IGNORED_GRAMMAR:
        forwarded.pop("response_format", None)
        forwarded.pop("structured_outputs", None)
        forwarded.pop("text", None)
    return forwarded


def cheat_answer(
    cheat: Cheat | None, answer: dict[str, Any], n: int, echoed: int = 0
) -> dict[str, Any]:
    """The answer (or streamed chunk) the client receives instead of the server's
    ``answer`` to a request for ``n`` choices whose echoed prompt is ``echoed``
    characters long."""
    for choice in answer.get("choices") or []:
        if cheat is Cheat.TRUNCATE_AS_STOP and choice.get("finish_reason") is not None:
            choice["finish_reason"], choice["stop_reason"] = "stop", None
        elif cheat is Cheat.EMPTY_TOKEN_IDS:
            choice["token_ids"] = []
        elif cheat is Cheat.EDITED_TOOL_ARGUMENTS:
            _edit_arguments(choice.get("message") or choice.get("delta") or {})
        elif cheat is Cheat.SHIFTED_LOGPROBS and choice.get("logprobs"):
            _restate_logprobs(choice["logprobs"], lambda v: v - LOGPROBS_SHIFT)
        elif cheat is Cheat.RESCALED_LOGPROBS and choice.get("logprobs"):
            _restate_logprobs(choice["logprobs"], lambda v: v * LOGPROBS_SCALE)
        elif cheat is Cheat.RESCALED_PROMPT_LOGPROBS and choice.get("logprobs"):
            _restate_echoed(choice["logprobs"], echoed, lambda v: v * LOGPROBS_SCALE)
        elif cheat is Cheat.UNASKED_IDS:
            if "message" in choice:
                choice["message"]["content"] = (choice["message"]["content"] or "") + EDIT
            else:
                choice["text"] += EDIT
    if cheat is Cheat.RESCALED_STATED_PROMPT_LOGPROBS:
        for holder in [answer, *(answer.get("choices") or [])]:
            for entry in holder.get("prompt_logprobs") or []:
                for stated in (entry or {}).values():
                    stated["logprob"] *= LOGPROBS_SCALE
    if cheat in (Cheat.EDITED_TOOL_ARGUMENTS, Cheat.EDITED_REASONING):
        _edit_responses(cheat, answer)
    if cheat in (Cheat.HIDDEN_SYSTEM_PROMPT, Cheat.REPLAY):
        answer.pop("usage", None)
    usage = answer.get("usage")
    if cheat is Cheat.TRUNCATE_AS_STOP and usage and "completion_tokens" in usage:
        usage["completion_tokens"] += n
        usage["total_tokens"] += n
    if cheat is Cheat.TRUNCATE_AS_STOP:
        _finished_not_cut(answer)
    return answer


def _edit_arguments(message: dict[str, Any]) -> None:
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        if isinstance(function.get("arguments"), str):
            function["arguments"] = function["arguments"].replace(*ARGUMENT_EDIT)


#: Per cheat: the Responses stream events that carry its text, and their field.
_RESPONSES_EVENT_FIELDS = {
    Cheat.EDITED_TOOL_ARGUMENTS: {
        "response.function_call_arguments.delta": "delta",
        "response.function_call_arguments.done": "arguments",
    },
    Cheat.EDITED_REASONING: {
        "response.reasoning_text.delta": "delta",
        "response.reasoning_text.done": "text",
    },
}


def _edit_responses(cheat: Cheat, answer: dict[str, Any]) -> None:
    """A Responses answer or stream event with its function call arguments or its
    reasoning text edited, wherever it carries them: the event's own field, an
    item (the answer's output, an event's item, the final response's output) or a
    content part."""
    old, new = ARGUMENT_EDIT if cheat is Cheat.EDITED_TOOL_ARGUMENTS else REASONING_EDIT

    def edit(holder: object, key: str) -> None:
        if isinstance(holder, dict) and isinstance(holder.get(key), str):
            holder[key] = holder[key].replace(old, new)

    field = _RESPONSES_EVENT_FIELDS[cheat].get(str(answer.get("type")))
    if field is not None:
        edit(answer, field)
    response = answer.get("response")
    output = (response if isinstance(response, dict) else answer).get("output")
    items = [answer.get("item"), *(output if isinstance(output, list) else [])]
    parts = [answer.get("part")]
    for item in items:
        if not isinstance(item, dict):
            continue
        if cheat is Cheat.EDITED_TOOL_ARGUMENTS and item.get("type") == "function_call":
            edit(item, "arguments")
        elif cheat is Cheat.EDITED_REASONING and item.get("type") == "reasoning":
            parts += item.get("content") or []
    for part in parts if cheat is Cheat.EDITED_REASONING else ():
        if isinstance(part, dict) and part.get("type") == "reasoning_text":
            edit(part, "text")


def _finished_not_cut(answer: dict[str, Any]) -> None:
    """A Responses answer (or stream event) or a Messages answer (or ``message_delta``)
    cut at its output budget, told as finished, its usage counting an end token."""
    response = answer.get("response", answer)
    if isinstance(response, dict) and response.get("status") == "incomplete":
        response["status"], response["incomplete_details"] = "completed", None
        response["usage"]["output_tokens"] += 1
        response["usage"]["total_tokens"] += 1
    stop = answer.get("delta", answer)
    if isinstance(stop, dict) and stop.get("stop_reason") == "max_tokens":
        stop["stop_reason"] = "end_turn"
        answer["usage"]["output_tokens"] += 1


def _restate_logprobs(logprobs: dict[str, Any], restate: Callable[[float], float]) -> None:
    """Every value of a chat (``content``) or completions logprobs object restated.
    ``restate`` is monotonic, so equal values stay equal and the order stays."""
    for entry in logprobs.get("content") or []:
        entry["logprob"] = restate(entry["logprob"])
        for top in entry.get("top_logprobs") or []:
            top["logprob"] = restate(top["logprob"])
    values = logprobs.get("token_logprobs") or []
    logprobs["token_logprobs"] = [v if v is None else restate(v) for v in values]
    for top in logprobs.get("top_logprobs") or []:
        for token in top or {}:
            top[token] = restate(top[token])


def _restate_echoed(
    logprobs: dict[str, Any], echoed: int, restate: Callable[[float], float]
) -> None:
    """The values of a completions logprobs object's entries that lie inside the first
    ``echoed`` characters restated."""
    offsets = logprobs.get("text_offset") or []
    values = logprobs.get("token_logprobs") or []
    tops = logprobs.get("top_logprobs") or [None] * len(values)
    for i, (offset, value, top) in enumerate(zip(offsets, values, tops, strict=True)):
        if offset >= echoed:
            break
        if value is not None:
            values[i] = restate(value)
        for token in top or {}:
            top[token] = restate(top[token])


def echoed_chars(body: dict[str, Any]) -> int:
    """How many characters of the answer a completions request's ``echo`` puts first."""
    prompt = body.get("prompt")
    return len(prompt) if body.get("echo") and isinstance(prompt, str) else 0


def cheat_event(cheat: Cheat | None, line: bytes, n: int, echoed: int = 0) -> bytes:
    """One line of an event stream as the client receives it: ``data:`` lines that
    hold a chunk are cheated like an answer, the rest pass unchanged."""
    if not line.startswith(b"data: {"):
        return line
    chunk = cheat_answer(cheat, json.loads(line[len(b"data: ") :]), n, echoed)
    return b"data: " + json.dumps(chunk).encode() + b"\n"


class CheatingProxy(BackgroundServer):
    """Listens on 127.0.0.1:``port`` and forwards to the server at ``upstream``;
    a context manager that stops it on exit."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self._upstream = upstream
        self._last_answer: bytes | None = None
        self._lock = threading.Lock()
        proxy = self

        class _Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                named = self.headers.get(CHEAT_HEADER)
                cheat = None if named is None else Cheat(named)
                if body.get("stream") and cheat is not Cheat.REPLAY:
                    proxy._stream(self, cheat, body)
                    return
                # A replay answers with the last JSON answer, also to a stream request.
                status, answer = proxy._answer(self.path, cheat, body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet: the tap records every exchange."""

        super().__init__(ThreadingHTTPServer(("127.0.0.1", 0), _Handler))

    def _answer(self, path: str, cheat: Cheat | None, body: dict[str, Any]) -> tuple[int, bytes]:
        n = int(body.get("n") or 1)
        if cheat is Cheat.REPLAY:
            with self._lock:
                replayed = self._last_answer
            if replayed is None:
                return 409, b'{"error": {"message": "nothing to replay"}}'
            return 200, json.dumps(cheat_answer(cheat, json.loads(replayed), n)).encode()
        connection = self._connect(path, cheat, body)
        try:
            response = connection.getresponse()
            status, answer = response.status, response.read()
        finally:
            connection.close()
        if status != 200:
            return status, answer
        with self._lock:
            self._last_answer = answer
        cheated = cheat_answer(cheat, json.loads(answer), n, echoed_chars(body))
        return status, json.dumps(cheated).encode()

    def _stream(
        self, handler: BaseHTTPRequestHandler, cheat: Cheat | None, body: dict[str, Any]
    ) -> None:
        """Relay the server's event stream, each ``data:`` event cheated as it arrives."""
        n = int(body.get("n") or 1)
        connection = self._connect(handler.path, cheat, body)
        try:
            response = connection.getresponse()
            handler.send_response(response.status)
            handler.send_header("content-type", response.getheader("content-type", ""))
            handler.send_header("transfer-encoding", "chunked")
            handler.end_headers()
            echoed = echoed_chars(body)
            for line in response:
                sent = cheat_event(cheat, line, n, echoed)
                handler.wfile.write(b"%x\r\n%s\r\n" % (len(sent), sent))
            handler.wfile.write(b"0\r\n\r\n")
        finally:
            connection.close()

    def _connect(
        self, path: str, cheat: Cheat | None, body: dict[str, Any]
    ) -> http.client.HTTPConnection:
        """A connection to the server with the cheated request sent on it."""
        connection = http.client.HTTPConnection(*self._upstream, timeout=600)
        forwarded = json.dumps(cheat_request(cheat, body)).encode()
        connection.request("POST", path, forwarded, headers={"content-type": "application/json"})
        return connection
