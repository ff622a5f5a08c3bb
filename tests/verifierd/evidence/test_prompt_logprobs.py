"""vLLM's ``prompt_logprobs`` response field: read from the body (chat at the top level,
completions per choice, a stream's chunks joined), its shape checked against the
rendered prompt, made comparable by token id, and a claimed rank measured in nats."""

from __future__ import annotations

import json
from typing import Any

import pytest

from verifierd.evidence.logprobs import LogprobsComparison, TopEntry
from verifierd.evidence.prompt_logprobs import (
    STREAMED,
    PromptLogprobsClaim,
    StatedLogprob,
    claimed_prompt_logprobs,
    comparable,
    misnamed,
    rank_deviation,
    shape_problem,
    unasked,
)

PROMPT = (1, 7, 9)
#: What vLLM writes for PROMPT at prompt_logprobs 2: the first null; token 7 not among
#: the best two (3 entries, rank 4); token 9 the best (2 entries).
STATED: list[Any] = [
    None,
    {
        "7": {"logprob": -3.0, "rank": 4, "decoded_token": "def"},
        "4": {"logprob": -0.5, "rank": 1, "decoded_token": "import"},
        "5": {"logprob": -1.5, "rank": 2, "decoded_token": "class"},
    },
    {
        "9": {"logprob": -0.1, "rank": 1, "decoded_token": " f"},
        "2": {"logprob": -2.5, "rank": 2, "decoded_token": " g"},
    },
]


def _chat(stated: object = STATED, n: int = 2) -> bytes:
    choices = [{"index": i, "message": {"content": "x"}} for i in range(n)]
    return json.dumps({"choices": choices, "prompt_logprobs": stated}).encode()


def _claim(stated: object = STATED) -> PromptLogprobsClaim:
    return claimed_prompt_logprobs(_chat(stated, 1), False, True, [0])[0]


def test_chat_states_one_list_for_every_choice() -> None:
    claims = claimed_prompt_logprobs(_chat(), False, True, [0, 1])
    assert claims[0] == claims[1] and not claims[0].problem
    assert claims[0].ids == (None, 7, 9)
    assert claims[0].positions[1] == (
        StatedLogprob(7, -3.0, 4, "def"),
        StatedLogprob(4, -0.5, 1, "import"),
        StatedLogprob(5, -1.5, 2, "class"),
    )


def test_completions_state_it_per_choice_and_a_stream_that_states_it_is_a_problem() -> None:
    body = {
        "choices": [
            {"index": 0, "text": "", "prompt_logprobs": STATED},
            {"index": 1, "text": "", "prompt_logprobs": None},
        ]
    }
    claims = claimed_prompt_logprobs(json.dumps(body).encode(), False, False, [0, 1])
    assert set(claims) == {0} and claims[0].ids == (None, 7, 9)
    chunks = [
        {"choices": [{"index": 0, "text": "a", "prompt_logprobs": STATED[:2]}]},
        {"choices": [{"index": 0, "text": "b", "prompt_logprobs": STATED[2:]}]},
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    streamed = claimed_prompt_logprobs(stream.encode(), True, False, [0])[0]
    assert streamed == PromptLogprobsClaim((), STREAMED)
    chat_stream = f"data: {json.dumps({'choices': [], 'prompt_logprobs': STATED})}\n\n"
    assert claimed_prompt_logprobs(chat_stream.encode(), True, True, [0])[0].problem == STREAMED
    # A stream asking for 0 (the only value vLLM streams) states nothing.
    assert claimed_prompt_logprobs(b"data: [DONE]\n\n", True, False, [0]) == {}


def test_a_field_absent_or_null_claims_nothing() -> None:
    assert claimed_prompt_logprobs(_chat(None), False, True, [0]) == {}
    assert claimed_prompt_logprobs(b"not json", False, True, [0]) == {}


@pytest.mark.parametrize(
    ("stated", "why"),
    [
        ({"1": 2}, "not a list"),
        ([None, [1]], "entry 1 is not an object"),
        ([None, {"x": {"logprob": -1.0}}], "not a token id"),
        ([None, {"-3": {"logprob": -1.0}}], "not a token id"),
        ([None, {"3": {"logprob": "low"}}], "not a number"),
        ([None, {"3": {"logprob": -1.0, "rank": "1"}}], "rank is not an integer"),
        ([None, {"3": {"logprob": -1.0, "decoded_token": 3}}], "decoded_token"),
    ],
)
def test_a_field_that_does_not_read_is_a_problem(stated: object, why: str) -> None:
    claim = _claim(stated)
    assert why in claim.problem
    problem = shape_problem(claim, PROMPT, 2)
    assert problem is not None and problem[0] is False and "do not read" in problem[1]


def test_vllms_shape_holds() -> None:
    assert shape_problem(_claim(), PROMPT, 2) is None


def _changed(position: int, entries: dict[str, object] | None) -> list[object]:
    stated = list(STATED)
    stated[position] = entries
    return stated


@pytest.mark.parametrize(
    ("stated", "requested", "why"),
    [
        (STATED[:2], 2, "2 prompt_logprobs entries for the 3 tokens"),
        (_changed(0, {"1": {"logprob": -1.0, "rank": 1}}), 2, "first prompt_logprobs entry"),
        (_changed(1, {}), 2, "entry 1 states nothing"),
        # The prompt token listed, but not first: not vLLM's order.
        (_changed(2, {"2": STATED[2]["2"], "9": STATED[2]["9"]}), 2, "(listed, not first)"),
        (STATED, 1, "3 entries; prompt_logprobs 1 gives 1 or 2"),
        (_changed(1, {**STATED[1], "5": {"logprob": -1.5, "rank": 3}}), 2, "ranks [1, 3]"),
        (_changed(1, {**STATED[1], "7": {"logprob": -3.0, "rank": 2}}), 2, "listed apart"),
        (_changed(2, {"9": {"logprob": -0.1, "rank": 3}, "2": STATED[2]["2"]}), 2, "not among"),
        (_changed(1, {**STATED[1], "7": {"logprob": -3.0}}), 2, "states no rank"),
        (
            _changed(1, {**STATED[1], "5": {"logprob": 0.0, "rank": 2}}),
            2,
            "non-increasing",
        ),
    ],
)
def test_shapes_vllm_does_not_write_are_logprobs_mismatches(
    stated: list[object], requested: int, why: str
) -> None:
    problem = shape_problem(_claim(stated), PROMPT, requested)
    assert problem is not None and problem[0] is False and why in problem[1], problem


def test_another_prompt_token_first_is_a_prompt_mismatch_at_its_position() -> None:
    other = _changed(2, {"8": {"logprob": -0.1, "rank": 1}, "2": STATED[2]["2"]})
    problem = shape_problem(_claim(other), PROMPT, 2)
    assert problem is not None and problem[0] is True
    assert "entry 2 names token id 8" in problem[1] and "token id 9 there" in problem[1]


def test_the_whole_row_has_every_token_once() -> None:
    row = {"9": {"logprob": -0.1, "rank": 1}, "2": {"logprob": -2.5, "rank": 2}}
    stated = [None, row]
    assert shape_problem(_claim(stated), (1, 9), -1) is None


def test_asked_or_not() -> None:
    assert unasked(None, _claim()) is not None
    assert unasked(None, PromptLogprobsClaim((), "unreadable")) is not None
    assert unasked(0, _claim()) is None


def test_names_are_vllms_where_it_names_the_token_alone() -> None:
    names: dict[int, str | None] = {7: "def", 4: "import", 5: "class", 9: " f", 2: " g"}
    assert misnamed(_claim(), names) is None
    assert misnamed(_claim(), {**names, 2: None}) is None
    wrong = misnamed(_claim(), {**names, 5: "struct"})
    assert wrong is not None and "entry 1 names token id 5 'class'" in wrong


def test_comparable_names_tokens_by_id_the_prompt_token_first() -> None:
    positions = comparable(_claim()).positions
    assert [p.token for p in positions] == ["7", "9"]
    assert positions[0].logprob == -3.0
    assert positions[0].top == (TopEntry("7", -3.0), TopEntry("4", -0.5), TopEntry("5", -1.5))


def test_a_claimed_rank_costs_how_far_the_values_are_from_it() -> None:
    others = [-0.5, -1.5, -2.0]
    assert rank_deviation(4, -3.0, others) == 0.0
    assert rank_deviation(1, -3.0, others) == pytest.approx(2.5)  # -0.5 must fall below
    assert rank_deviation(3, -3.0, others) == pytest.approx(1.0)  # -2.0 must fall below
    assert rank_deviation(2, -1.0, others) == 0.0
    assert rank_deviation(4, -1.0, others) == pytest.approx(1.0)  # -2.0 must rise above
    # Beyond the verifier's list: at least as far as its last value.
    assert rank_deviation(9, -1.0, others) == pytest.approx(1.0)
    assert rank_deviation(1, -1.0, []) == 0.0


def test_the_evidence_names_the_prompt_logprobs_entry() -> None:
    output = LogprobsComparison((0.0,), ("x",), (-1.0,), (-1.0,))
    stated = LogprobsComparison((0.0, 3.0), ("7", "9"), (-0.1, -0.1), (-0.1, -3.1))
    joined = output.then_stated_prompt(stated)
    assert joined.stated_prompt_positions == 2 and joined.largest == 3.0
    evidence = joined.over(0.01)
    assert evidence is not None and "at prompt_logprobs entry 2 by 3" in evidence


def test_a_position_listing_more_than_the_server_lists_is_a_problem() -> None:
    # STATED's longest position lists 3 tokens: prompt_logprobs 2 on any server with
    # --max-logprobs 2 or more (most_listed 3).
    body = _chat(STATED, 1)
    assert not claimed_prompt_logprobs(body, False, True, [0], most_listed=3)[0].problem
    problem = claimed_prompt_logprobs(body, False, True, [0], most_listed=2)[0].problem
    assert problem == "prompt_logprobs: entry 1 lists 3 tokens; the server lists at most 2"
    # A hostile whole-vocabulary listing is refused at its first position's length.
    row = {str(i): {"logprob": -1.0, "rank": i + 1} for i in range(5000)}
    problem = claimed_prompt_logprobs(_chat([None, row], 1), False, True, [0], 21)[0].problem
    assert "entry 1 lists 5000 tokens; the server lists at most 21" in problem
