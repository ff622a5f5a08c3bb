"""What every dialect extractor provides, and the OpenAI-style pieces they share.

Sampling parameters are copied exactly as sent: a `SamplingParams` field is set
only when the request carried it with a usable type, and every request field
except the prompt/messages also goes into `params_json` (canonical JSON:
sorted keys, no spaces, UTF-8), so nothing the client sent is lost and no
default is invented.

What the record holds is what the client's OpenAI SDK shows
(openai/_streaming.py): a stream's events are those its decoder reads from the
body (`sdk_sse`; `thread.` events carry no text), and the stream ends at the
first event whose data starts with `[DONE]`, at a chunk whose `error` is
truthy, or at data that is not JSON (empty data too: the SDK raises at both);
later events are counted and hashed (`ApiView.events_after_end`), never read
into the text. `"error": null` (or any falsy value) is no error, and a
document is an error only by its 4xx/5xx status (a 4xx/5xx event stream is an
error too: the SDK raises before reading it). Whether a response is a stream is
the request's `stream`, as for the SDK, not the response's content type. The
model comes from the request alone, never from the response, so the prover
cannot choose the commitment.
Whatever the bodies hold, `extract` returns an `Extraction`: bodies that
Python's json cannot hold and strings protobuf refuses become problems (see
`json_values`), never exceptions. What a dialect's choices carry beyond their
text (chat's tool calls and reasoning) is read by its `ChoiceExtras`, within
caps (`tool_call_budget`, one per response) whose cuts are the extraction's
truncations.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from veritap.v1 import record_pb2

from collector.dialects.json_values import (
    ESCAPED_SURROGATE,
    SHORT_TEXT,
    JsonError,
    canonical_json,
    has_lone_surrogate,
    keys_sorted_everywhere,
    load,
    load_short_text,
    proto_text,
)
from collector.dialects.sdk_sse import ClientEvent, SdkStream, sdk_events, simple_stream
from collector.dialects.tool_call_budget import ToolCallBudget
from collector.http.messages import ResponseMessage

_INT64 = (-(2**63), 2**63 - 1)
_FLOAT_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_INT_FIELDS = ("top_k", "seed", "n", "top_logprobs")
_BOOL_FIELDS = ("stream", "return_token_ids")
# Request fields whose key order reaches the model: a chat template's `tojson` of
# the tools, a JSON schema's property order in a grammar. Canonical JSON sorts
# keys, so a request whose copy there is not sorted already keeps its body.
_KEY_ORDER_READ = ("tools", "functions", "response_format", "structured_outputs", "text")
_DONE = "[DONE]"
# Assistants events, which the SDK's legacy stream mode hands on wrapped, not as chunks.
_THREAD_EVENT = "thread."
_LONE_SURROGATE = "response text holds lone surrogates (each kept as U+FFFD)"


@dataclass(frozen=True, slots=True)
class Extraction:
    """The API view of an exchange and what could not be read (each a reason).

    `request_in_view`: the request body is a JSON object that `prompt_json` and
    `params_json` hold whole (canonical JSON that loads back to the same object),
    so the record need not store the body a second time. A request holding lone
    surrogates (which a server's tokenizer may refuse), or whose tools or output
    schema list keys out of sorted order (the server reads that order), keeps its
    raw bytes.
    """

    view: record_pb2.ApiView
    problems: tuple[str, ...]
    request_in_view: bool = False
    #: What the view left out at the collector's caps (each a reason; the record is truncated).
    truncations: tuple[str, ...] = ()


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        return float(value)
    except OverflowError:  # an integer past the float range (a 400-digit one)
        return None


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        return value
    return None


def _as_token_ids(value: object) -> list[int] | None:
    if not isinstance(value, list):
        return None
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in value):
        return None
    return value


def sampling_from_request(
    request: Mapping[str, object],
    prompt_key: str,
    sampling: record_pb2.SamplingParams,
    max_tokens_keys: tuple[str, ...] = ("max_tokens", "max_completion_tokens"),
) -> None:
    """Fill `sampling` from the request object as sent (see the module docstring).

    `max_tokens` is the first of `max_tokens_keys` the request carried as an integer.
    """
    for name in _FLOAT_FIELDS:
        number = _as_float(request.get(name))
        if number is not None:
            setattr(sampling, name, number)
    for name in _INT_FIELDS:
        integer = as_int(request.get(name))
        if integer is not None:
            setattr(sampling, name, integer)
    for name in _BOOL_FIELDS:
        flag = request.get(name)
        if isinstance(flag, bool):
            setattr(sampling, name, flag)
    for key in max_tokens_keys:
        max_tokens = as_int(request.get(key))
        if max_tokens is not None:
            sampling.max_tokens = max_tokens
            break
    stop = request.get("stop")
    stops = [stop] if isinstance(stop, str) else stop
    if isinstance(stops, list) and all(
        isinstance(s, str) and not has_lone_surrogate(s) for s in stops
    ):
        sampling.stop.extend(stops)
    logprobs = request.get("logprobs")
    top = as_int(logprobs)
    if isinstance(logprobs, bool):
        sampling.logprobs = logprobs
    elif top is not None:
        # Completions: `logprobs: N` asks for the N most likely tokens at each position.
        sampling.logprobs = True
        if not sampling.HasField("top_logprobs"):
            sampling.top_logprobs = top
    sampling.params_json = canonical_json({k: v for k, v in request.items() if k != prompt_key})


def set_token_ids(target: record_pb2.TokenIds, ids: list[int]) -> None:
    target.SetInParent()
    target.ids.extend(ids)


def error_message(document: object) -> str:
    """The error text of an error document (`{"error": {"message": ...}}` and kin)."""
    if isinstance(document, dict):
        error = document.get("error", document)
        if isinstance(error, dict):
            message = error.get("message")
            if isinstance(message, str):
                return message
        elif isinstance(error, str):
            return error
    return canonical_json(document)


def fill_usage(usage: object, view: record_pb2.ApiView) -> None:
    if not isinstance(usage, dict):
        return
    for name in ("prompt_tokens", "completion_tokens", "total_tokens"):
        value = as_int(usage.get(name))
        if value is not None and value >= 0:
            setattr(view.usage, name, value)


def fit_text(text: str, problems: list[str]) -> str:
    """`text` as protobuf takes it; a changed text is reported once."""
    fitted = proto_text(text)
    if fitted is not text and _LONE_SURROGATE not in problems:
        problems.append(_LONE_SURROGATE)
    return fitted


def client_events(response: ResponseMessage) -> SdkStream:
    """The events the client's SDK read: decoded from the body as it decodes them, or,
    when the body has holes (a response_gap record), the HTTP layer's resynchronised ones."""
    if not response.gaps:
        simple = simple_stream(response)
        return simple if simple is not None else sdk_events(response.body)
    return SdkStream(response.sse_events, None)


def stream_data(
    response: ResponseMessage, view: record_pb2.ApiView, problems: list[str]
) -> Iterator[object]:
    """The JSON data of each event of an event stream that the client's SDK reads, in
    order, up to where it stops (see the module docstring): an error chunk's message goes
    in the view's `error`, data that is not JSON and a body that stops decoding are
    problems; `thread.` events are left out. Once the iterator is exhausted, the events
    after the end are counted in the view."""
    stream = client_events(response)
    events = iter(stream.events)
    for position, event in enumerate(events, 1):
        text = event.data
        if text.startswith(_DONE):
            break
        try:
            data = load_short_text(text) if len(text) <= SHORT_TEXT else load(text)
        except JsonError:
            problems.append(f"SSE event {position} is not JSON (the SDK raises there)")
            break
        name = event.event
        if name and name.startswith(_THREAD_EVENT):
            continue  # the SDK wraps it as {"data": ..., "event": ...}: no text, no error
        # The SDK raises on a chunk that is a mapping with a truthy `error` (json makes
        # plain dicts). A document is an error only by its HTTP status: the SDK parses a
        # 2xx body into its choices whatever `error` it holds.
        if type(data) is dict and data.get("error"):
            view.error = fit_text(error_message(data), problems)
            break
        yield data
    else:  # every event read without an end: the stream stops where decoding does
        if stream.undecodable_at is not None:
            at = stream.undecodable_at
            problems.append(f"SSE body is not UTF-8 at byte {at} (the SDK raises there)")
    count_after_end(events, view)


def count_after_end(events: Iterable[ClientEvent], view: record_pb2.ApiView) -> None:
    """Count and hash the events the SDK never reads (see the module docstring)."""
    digest = hashlib.sha256()
    count = 0
    for event in events:
        digest.update(event.data.encode("utf-8", "surrogatepass"))
        digest.update(b"\n\n")
        count += 1
    if count:
        view.events_after_end = count
        view.events_after_end_sha256 = digest.digest()


class ChoiceExtras(ABC):
    """What one response's choices carry beyond their text, read within bounded memory."""

    @abstractmethod
    def document_choice(self, item: dict[str, object], choice: record_pb2.Choice) -> None:
        """Fill `choice` from its non-streamed JSON object."""

    @abstractmethod
    def delta(self, index: int, item: dict[str, object]) -> None:
        """Take one streamed chunk's choice object (`index` is its choice index)."""

    @abstractmethod
    def finish(self, index: int, choice: record_pb2.Choice) -> None:
        """Fill `choice` from what the stream's chunks for `index` carried."""


class _ChoiceAccumulator:
    """A streamed choice assembled from its deltas."""

    __slots__ = ("finish_reason", "prompt_token_ids", "stop_reason", "text", "token_ids")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.token_ids: list[int] | None = None
        self.prompt_token_ids: list[int] | None = None
        self.finish_reason = ""
        self.stop_reason = ""


class Dialect(ABC):
    """An OpenAI-style API: a request object with a prompt field, JSON or SSE responses."""

    name: str
    paths: frozenset[str]
    response_objects: frozenset[str]
    prompt_key: str
    max_tokens_keys: tuple[str, ...] = ("max_tokens", "max_completion_tokens")

    def extract(self, request_body: bytes, response: ResponseMessage | None) -> Extraction:
        view = record_pb2.ApiView(dialect=self.name)
        problems: list[str] = []
        request_in_view = False
        budget = ToolCallBudget()
        if request_body:
            try:
                request = load(request_body)
            except JsonError as exc:
                problems.append(f"request body is not JSON: {exc}")
            else:
                if isinstance(request, dict):
                    request_in_view = self._request(request, view, problems)
                else:
                    problems.append("request body is not a JSON object")
        if response is not None:
            # The SDK streams when the request asked to, whatever the response's type says.
            sampling = view.sampling
            streamed = sampling.stream if sampling.HasField("stream") else response.is_sse
            try:
                if streamed and response.status < 400:
                    self._stream(response, view, problems, budget)
                elif response.body:
                    document = read_document(response, view, problems)
                    if document is not None:
                        self._document(document, view, problems, budget)
            except JsonError as exc:
                problems.append(f"response cannot be written as JSON: {exc}")
        truncations = budget.report(problems)
        return Extraction(view, tuple(problems), request_in_view, truncations)

    def _request(
        self, request: dict[str, object], view: record_pb2.ApiView, problems: list[str]
    ) -> bool:
        """Fill the request's part of the view; whether the view holds the request whole."""
        model = request.get("model")
        if isinstance(model, str):
            if has_lone_surrogate(model):
                problems.append("request model holds lone surrogates (not recorded)")
            else:
                view.model = model
        try:
            if self.prompt_key in request:
                view.prompt_json = canonical_json(request[self.prompt_key])
            sampling_from_request(request, self.prompt_key, view.sampling, self.max_tokens_keys)
        except JsonError as exc:
            problems.append(f"request cannot be written as JSON: {exc}")
            return False
        if any(ESCAPED_SURROGATE in text for text in (view.prompt_json, view.sampling.params_json)):
            return False
        ordered = (request[key] for key in _KEY_ORDER_READ if key in request)
        return all(keys_sorted_everywhere(value) for value in ordered)

    @abstractmethod
    def _document(
        self,
        document: dict[str, object],
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        """Fill the response's part of the view from a 2xx response's JSON object."""

    @abstractmethod
    def _stream(
        self,
        response: ResponseMessage,
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        """Fill the response's part of the view from an event stream, as the SDK reads it."""


def read_document(
    response: ResponseMessage, view: record_pb2.ApiView, problems: list[str]
) -> dict[str, object] | None:
    """A 2xx response's JSON object; None when there is none (an error is put in the view)."""
    try:
        document = load(response.body)
    except JsonError as exc:
        if response.status >= 400:
            view.error = response.body.decode("utf-8", "replace")
        else:
            problems.append(f"response body is not JSON: {exc}")
        return None
    if response.status >= 400:
        view.error = fit_text(error_message(document), problems)
        return None
    if not isinstance(document, dict):
        problems.append("response body is not a JSON object")
        return None
    return document


class ChoicesDialect(Dialect):
    """A dialect whose responses carry `choices`: chat and completions.

    A streamed choice chunk adds the string at `delta_text_key` of its object at
    `delta_key` (None: of the choice itself); anything else there adds no text.
    """

    delta_key: str | None
    delta_text_key: str

    def _extras(self, budget: ToolCallBudget, problems: list[str]) -> ChoiceExtras | None:
        """A reader of what this dialect's choices carry beyond their text (none by default)."""
        return None

    def _document(
        self,
        document: dict[str, object],
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        extras = self._extras(budget, problems)
        self._header_fields(document, view, problems)
        fill_usage(document.get("usage"), view)
        choices = document.get("choices")
        if not isinstance(choices, list):
            problems.append("response has no choices list")
            return
        for position, item in enumerate(choices):
            if not isinstance(item, dict):
                problems.append(f"choice {position} is not an object")
                continue
            choice = view.choices.add()
            index = as_int(item.get("index"))
            choice.index = index if index is not None and index >= 0 else position
            choice.text = fit_text(self._choice_text(item), problems)
            finish = item.get("finish_reason")
            if isinstance(finish, str):
                choice.finish_reason = fit_text(finish, problems)
            if item.get("stop_reason") is not None:
                choice.stop_reason_json = canonical_json(item["stop_reason"])
            ids = _as_token_ids(item.get("token_ids"))
            if ids is not None:
                set_token_ids(choice.token_ids, ids)
            prompt_ids = _as_token_ids(item.get("prompt_token_ids"))
            if prompt_ids is not None:
                set_token_ids(choice.prompt_token_ids, prompt_ids)
            if extras is not None:
                extras.document_choice(item, choice)
        self._shared_prompt(view)

    def _stream(
        self,
        response: ResponseMessage,
        view: record_pb2.ApiView,
        problems: list[str],
        budget: ToolCallBudget,
    ) -> None:
        choices: dict[int, _ChoiceAccumulator] = {}
        extras = self._extras(budget, problems)
        extras_delta = extras.delta if extras is not None else None
        bad = 0
        delta_key, text_key = self.delta_key, self.delta_text_key
        has_id = False  # once the view has a response id, later chunks are not read for one
        for chunk in stream_data(response, view, problems):
            if type(chunk) is not dict:  # json makes plain dicts
                bad += 1
                continue
            if not has_id:
                self._header_fields(chunk, view, problems)
                has_id = bool(view.response_id)
            usage = chunk.get("usage")
            if usage is not None:
                fill_usage(usage, view)
            items = chunk.get("choices")
            if type(items) is not list:
                continue
            for item in items:
                index = item.get("index") if type(item) is dict else None
                if type(index) is not int or index < 0:
                    bad += 1
                    continue
                acc = choices.get(index)
                if acc is None:
                    acc = choices[index] = _ChoiceAccumulator()
                holder = item if delta_key is None else item.get(delta_key)
                text_alone = False
                if type(holder) is dict:
                    text = holder.get(text_key)
                    if type(text) is str:
                        if text:
                            acc.text.append(text)
                        text_alone = len(holder) == 1
                # An object holding its text alone (chat's content delta) has nothing more.
                if extras_delta is not None and not text_alone:
                    extras_delta(index, item)
                ids = item.get("token_ids")
                if type(ids) is list:
                    if acc.token_ids is None:
                        acc.token_ids = []
                    acc.token_ids += ids
                if acc.prompt_token_ids is None and "prompt_token_ids" in item:
                    acc.prompt_token_ids = _as_token_ids(item["prompt_token_ids"])
                finish = item.get("finish_reason")
                if finish is not None:
                    acc.finish_reason = str(finish)
                    if item.get("stop_reason") is not None:
                        acc.stop_reason = canonical_json(item["stop_reason"])
        for index in sorted(choices):
            acc = choices[index]
            choice = view.choices.add(
                index=index,
                text=fit_text("".join(acc.text), problems),
                finish_reason=fit_text(acc.finish_reason, problems),
                stop_reason_json=acc.stop_reason,
            )
            if acc.token_ids is not None:
                ids = _as_token_ids(acc.token_ids)
                if ids is None:
                    bad += 1
                else:
                    set_token_ids(choice.token_ids, ids)
            if acc.prompt_token_ids is not None:
                set_token_ids(choice.prompt_token_ids, acc.prompt_token_ids)
            if extras is not None:
                extras.finish(index, choice)
        if bad:
            problems.append(f"{bad} SSE event(s) are not chunks of this API")
        self._shared_prompt(view)

    @staticmethod
    def _header_fields(
        document: dict[str, object], view: record_pb2.ApiView, problems: list[str]
    ) -> None:
        """The response's id and prompt ids (its `model` is a claim, never the record's)."""
        response_id = document.get("id")
        if isinstance(response_id, str):
            view.response_id = fit_text(response_id, problems)
        prompt_ids = _as_token_ids(document.get("prompt_token_ids"))
        if prompt_ids is not None and not view.HasField("prompt_token_ids"):
            set_token_ids(view.prompt_token_ids, prompt_ids)

    @staticmethod
    def _shared_prompt(view: record_pb2.ApiView) -> None:
        """Lift per-choice prompt ids to the view when every choice has the same prompt."""
        if view.HasField("prompt_token_ids") or not view.choices:
            return
        first = view.choices[0]
        if not first.HasField("prompt_token_ids"):
            return
        if all(
            c.HasField("prompt_token_ids") and c.prompt_token_ids.ids == first.prompt_token_ids.ids
            for c in view.choices
        ):
            set_token_ids(view.prompt_token_ids, list(first.prompt_token_ids.ids))

    @abstractmethod
    def _choice_text(self, choice: dict[str, object]) -> str:
        """The text of a non-streamed choice."""
