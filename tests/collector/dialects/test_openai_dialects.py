"""OpenAI chat and completions extraction against vLLM-shaped traffic."""

from __future__ import annotations

import hashlib
import json

from veritap.v1 import record_pb2

from collector.records import quality_name
from tests.collector.dialects.dialect_records import MESSAGES, records, sse_response
from tests.openai_traffic import Call, error_response, words


def test_chat_non_streamed_with_token_ids() -> None:
    call = Call(
        "/v1/chat/completions",
        "tiny-llama",
        MESSAGES,
        {"temperature": 1, "top_p": 0.9, "seed": 42, "max_tokens": 8, "return_token_ids": True},
        [words(5)],
        prompt_token_ids=(7, 8, 9),
        response_id="chatcmpl-abc",
    )
    (rec,) = records((call.request(), call.response()))
    api = rec.api
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE and rec.quality_reason == ""
    assert api.dialect == "openai-chat" and api.model == "tiny-llama"
    assert api.response_id == "chatcmpl-abc"
    assert list(api.prompt_token_ids.ids) == [7, 8, 9]
    (choice,) = api.choices
    assert choice.text == words(5).text and list(choice.token_ids.ids) == list(words(5).token_ids)
    assert choice.finish_reason == "length"
    s = api.sampling
    assert (s.temperature, s.top_p, s.seed, s.max_tokens, s.return_token_ids) == (
        1.0,
        0.9,
        42,
        8,
        True,
    )
    for unset in ("top_k", "min_p", "n", "stream", "logprobs", "presence_penalty"):
        assert not s.HasField(unset), unset
    assert json.loads(s.params_json) == {
        "model": "tiny-llama",
        "temperature": 1,
        "top_p": 0.9,
        "seed": 42,
        "max_tokens": 8,
        "return_token_ids": True,
    }
    assert s.params_json == json.dumps(
        json.loads(s.params_json), sort_keys=True, separators=(",", ":")
    )
    assert json.loads(api.prompt_json) == MESSAGES
    assert (api.usage.prompt_tokens, api.usage.completion_tokens) == (3, 5)
    # The view holds the request whole, so its body is stored once (as the view).
    assert rec.request.body == b"" and rec.response.body == call.response_json()
    assert rec.request.body_sha256 == hashlib.sha256(call.request_json()).digest()
    assert rec.request.body_length == len(call.request_json())
    assert "Authorization" not in [h.name for h in rec.request.headers]
    assert rec.request.host == "prover:8000"
    assert rec.flow.client_address == "::1" and rec.flow.ip_version == 6


def test_chat_streamed_n2_with_token_ids_and_usage() -> None:
    call = Call(
        "/v1/chat/completions",
        "m",
        MESSAGES,
        {
            "stream": True,
            "n": 2,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
        [words(4, seed=1), words(7, seed=2)],
        prompt_token_ids=(5, 6),
    )
    (rec,) = records((call.request(), call.response()))
    api = rec.api
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE, rec.quality_reason
    assert list(api.prompt_token_ids.ids) == [5, 6]
    assert [c.index for c in api.choices] == [0, 1]
    for choice, gen in zip(api.choices, call.generations, strict=True):
        assert choice.text == gen.text
        assert list(choice.token_ids.ids) == list(gen.token_ids)
        assert choice.finish_reason == gen.finish_reason
    assert api.usage.completion_tokens == 11
    assert api.sampling.stream and api.sampling.n == 2
    assert len(rec.response.sse_arrival_offsets_ns) == len(call.sse_events())
    assert rec.response.body == b"".join(call.sse_events())
    assert rec.api.events_after_end == 0


def test_without_return_token_ids_the_ids_are_absent_not_empty() -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(3)])
    (rec,) = records((call.request(), call.response()))
    assert not rec.api.HasField("prompt_token_ids")
    assert not rec.api.choices[0].HasField("token_ids")
    assert rec.api.choices[0].text == words(3).text


def test_completions_streamed_and_batched_prompts() -> None:
    streamed = Call(
        "/v1/completions",
        "m",
        "Once upon",
        {"stream": True, "return_token_ids": True, "logprobs": 2, "stop": "\n"},
        [words(6)],
        prompt_token_ids=(11, 12),
        response_id="cmpl-1",
    )
    batched = Call(
        "/v1/completions",
        "m",
        ["a", "b"],
        {"return_token_ids": True, "stop": ["x", "y"]},
        [words(2), words(3)],
    )
    rec1, rec2 = records(
        (streamed.request(), streamed.response()), (batched.request(), batched.response())
    )
    assert rec1.api.dialect == "openai-completions"
    assert rec1.api.choices[0].text == words(6).text
    assert list(rec1.api.choices[0].token_ids.ids) == list(words(6).token_ids)
    assert list(rec1.api.prompt_token_ids.ids) == [11, 12]
    assert list(rec1.api.choices[0].prompt_token_ids.ids) == [11, 12]
    s = rec1.api.sampling
    assert (s.logprobs, s.top_logprobs, list(s.stop)) == (True, 2, ["\n"])
    assert json.loads(rec1.api.prompt_json) == "Once upon"
    assert [c.text for c in rec2.api.choices] == [words(2).text, words(3).text]
    assert list(rec2.api.sampling.stop) == ["x", "y"]


def test_error_responses_keep_status_and_message() -> None:
    call = Call("/v1/chat/completions", "nope", MESSAGES, {"temperature": -1})
    (rec,) = records((call.request(), error_response(400, "temperature must be >= 0")))
    assert rec.response.status == 400
    assert rec.api.error == "temperature must be >= 0"
    assert rec.quality == record_pb2.CAPTURE_QUALITY_COMPLETE
    assert rec.api.sampling.temperature == -1.0


def test_error_event_inside_a_stream() -> None:
    call = Call("/v1/chat/completions", "m", MESSAGES, {"stream": True}, [words(2)])
    events = call.sse_events()
    error = b'data: {"error":{"message":"Internal server error","type":"x","code":500}}\n\n'
    (rec,) = records((call.request(), sse_response([*events[:2], error, *events[2:]])))
    assert rec.api.error == "Internal server error"
    # The SDK raises at the error: what follows never reaches the client.
    assert rec.api.choices[0].text == words(2).tokens[0]
    assert rec.api.events_after_end == len(events) - 2


def test_unparseable_json_is_a_parse_error_with_the_reason() -> None:
    body = b'{"model": "m", "messages": ['
    request = b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    (rec,) = records((request, error_response(400, "bad json")))
    assert quality_name(rec.quality) == "parse_error"
    assert rec.quality_reason.startswith("api: request body is not JSON")


def test_types_that_do_not_fit_are_kept_only_in_params_json() -> None:
    call = Call(
        "/v1/chat/completions",
        "m",
        MESSAGES,
        {"temperature": "hot", "top_k": 2.5, "seed": True, "n": 3.0, "max_completion_tokens": 9},
        [words(1)],
    )
    (rec,) = records((call.request(), call.response()))
    s = rec.api.sampling
    assert not s.HasField("temperature") and not s.HasField("top_k") and not s.HasField("seed")
    assert s.n == 3 and s.max_tokens == 9
    assert json.loads(s.params_json)["temperature"] == "hot"
