"""What every dialect extractor provides, and the OpenAI-style pieces they share.

Sampling parameters are copied exactly as sent: a `SamplingParams` field is set
only when the request carried it with a usable type, and every request field
except the prompt/messages also goes into `params_json` (canonical JSON:
sorted keys, no spaces, UTF-8), so nothing the client sent is lost and no
default is invented.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

from veritap.v1 import record_pb2

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


@dataclass(frozen=True, slots=True)
class Extraction:
    """The API view of an exchange and what could not be read (each a reason)."""

    view: record_pb2.ApiView
    problems: tuple[str, ...]


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _as_int(value: object) -> int | None:
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
    request: Mapping[str, object], prompt_key: str, sampling: record_pb2.SamplingParams
) -> None:
    """Fill `sampling` from the request object as sent (see the module docstring)."""
    for name in _FLOAT_FIELDS:
        number = _as_float(request.get(name))
        if number is not None:
            setattr(sampling, name, number)
    for name in _INT_FIELDS:
        integer = _as_int(request.get(name))
        if integer is not None:
            setattr(sampling, name, integer)
    for name in _BOOL_FIELDS:
        flag = request.get(name)
        if isinstance(flag, bool):
            setattr(sampling, name, flag)
    max_tokens = _as_int(request.get("max_tokens"))
    if max_tokens is None:
        max_tokens = _as_int(request.get("max_completion_tokens"))
    if max_tokens is not None:
        sampling.max_tokens = max_tokens
    stop = request.get("stop")
    if isinstance(stop, str):
        sampling.stop.append(stop)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        sampling.stop.extend(stop)
    logprobs = request.get("logprobs")
    top = _as_int(logprobs)
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
        value = _as_int(usage.get(name))
        if value is not None and value >= 0:
            setattr(view.usage, name, value)


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

    def extract(self, request_body: bytes, response: ResponseMessage | None) -> Extraction:
        view = record_pb2.ApiView(dialect=self.name)
        problems: list[str] = []
        if request_body:
            try:
                request = json.loads(request_body)
            except ValueError as exc:
                problems.append(f"request body is not JSON: {exc}")
            else:
                if isinstance(request, dict):
                    self._request(request, view)
                else:
                    problems.append("request body is not a JSON object")
        if response is not None:
            if response.is_sse:
                self._stream(response, view, problems)
            elif response.body:
                self._document(response, view, problems)
        return Extraction(view, tuple(problems))

    def _request(self, request: dict[str, object], view: record_pb2.ApiView) -> None:
        model = request.get("model")
        if isinstance(model, str):
            view.model = model
        if self.prompt_key in request:
            view.prompt_json = canonical_json(request[self.prompt_key])
        sampling_from_request(request, self.prompt_key, view.sampling)

    def _document(
        self, response: ResponseMessage, view: record_pb2.ApiView, problems: list[str]
    ) -> None:
        try:
            document = json.loads(response.body)
        except ValueError as exc:
            if response.status >= 400:
                view.error = response.body.decode("utf-8", "replace")
            else:
                problems.append(f"response body is not JSON: {exc}")
            return
        if response.status >= 400 or (isinstance(document, dict) and "error" in document):
            view.error = error_message(document)
            return
        if not isinstance(document, dict):
            problems.append("response body is not a JSON object")
            return
        self._header_fields(document, view)
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
            index = _as_int(item.get("index"))
            choice.index = index if index is not None and index >= 0 else position
            choice.text = self._choice_text(item)
            finish = item.get("finish_reason")
            if isinstance(finish, str):
                choice.finish_reason = finish
            if item.get("stop_reason") is not None:
                choice.stop_reason_json = canonical_json(item["stop_reason"])
            ids = _as_token_ids(item.get("token_ids"))
            if ids is not None:
                set_token_ids(choice.token_ids, ids)
            prompt_ids = _as_token_ids(item.get("prompt_token_ids"))
            if prompt_ids is not None:
                set_token_ids(choice.prompt_token_ids, prompt_ids)
        self._shared_prompt(view)

    def _stream(
        self, response: ResponseMessage, view: record_pb2.ApiView, problems: list[str]
    ) -> None:
        choices: dict[int, _ChoiceAccumulator] = {}
        bad = 0
        loads = json.loads
        delta_text = self._delta_text
        for event in response.sse_events:
            data = event.data
            if data[:1] != "{":
                if data and data != "[DONE]":
                    bad += 1
                continue
            try:
                chunk = loads(data)
            except ValueError:
                bad += 1
                continue
            if "error" in chunk:
                view.error = error_message(chunk)
                continue
            if not view.response_id:
                self._header_fields(chunk, view)
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
                text = delta_text(item)
                if text:
                    acc.text.append(text)
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
                text="".join(acc.text),
                finish_reason=acc.finish_reason,
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
        if bad:
            problems.append(f"{bad} SSE event(s) are not chunks of this API")
        self._shared_prompt(view)

    @staticmethod
    def _header_fields(document: dict[str, object], view: record_pb2.ApiView) -> None:
        response_id = document.get("id")
        if isinstance(response_id, str):
            view.response_id = response_id
        model = document.get("model")
        if isinstance(model, str) and not view.model:
            view.model = model
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

    @abstractmethod
    def _delta_text(self, choice: dict[str, object]) -> str:
        """The text a streamed choice chunk adds."""
