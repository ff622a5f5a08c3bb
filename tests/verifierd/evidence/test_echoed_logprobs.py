"""A completions claim with ``echo``: the echoed prompt's entries lead, split off as vLLM
joined them."""

from __future__ import annotations

import json

from verifierd.evidence.logprobs import (
    ClaimedPosition,
    EchoedClaim,
    LogprobsClaim,
    LogprobsComparison,
    ShapeMismatch,
    TopEntry,
    claimed_logprobs,
    echoed_spelling,
    echoed_top_count,
    split_echoed,
)

#: What vLLM's server writes for a 3-token echoed prompt ("<s>", "def", " f") and one
#: output token ("(") at logprobs 1: the first prompt token named, without a value.
ECHOED_BODY = {
    "choices": [
        {
            "index": 0,
            "text": "def f(",
            "logprobs": {
                "tokens": ["<s>", "def", " f", "("],
                "token_logprobs": [None, -2.5, -4.0, -0.25],
                "top_logprobs": [
                    None,
                    {"def": -2.5, "import": -1.0},
                    {" f": -4.0, " main": -0.5},
                    {"(": -0.25},
                ],
                "text_offset": [0, 3, 6, 8],
            },
        }
    ]
}


def _claim(body: object = ECHOED_BODY) -> LogprobsClaim:
    return claimed_logprobs("openai-completions", json.dumps(body).encode(), False, False)[0]


def _split(claim: LogprobsClaim, prompt_len: int = 3) -> EchoedClaim:
    split = split_echoed(claim, prompt_len)
    assert isinstance(split, EchoedClaim), split
    return split


def test_the_echoed_prompt_leads_and_its_first_token_has_no_value() -> None:
    split = _split(_claim())
    assert split.first == ClaimedPosition("<s>", None, None, ())
    assert [p.token for p in split.prompt.positions] == ["def", " f"]
    assert split.prompt.positions[0].top == (TopEntry("def", -2.5), TopEntry("import", -1.0))
    assert [p.token for p in split.output.positions] == ["("]


def test_max_tokens_0_leaves_no_output_entries() -> None:
    body = json.loads(json.dumps(ECHOED_BODY))
    logprobs = body["choices"][0]["logprobs"]
    for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
        logprobs[key] = logprobs[key][:3]
    assert _split(_claim(body)).output.positions == ()


def test_a_claim_shorter_than_the_prompt_or_with_a_first_value_does_not_split() -> None:
    short = split_echoed(_claim(), 5)
    assert isinstance(short, ShapeMismatch) and "fewer than the 5 tokens" in short.detail
    body = json.loads(json.dumps(ECHOED_BODY))
    body["choices"][0]["logprobs"]["token_logprobs"][0] = -1.0
    valued = split_echoed(_claim(body), 3)
    assert isinstance(valued, ShapeMismatch) and "first entry states a value" in valued.detail
    # Nor does a claim that does not read.
    assert isinstance(split_echoed(LogprobsClaim((), "unreadable"), 3), ShapeMismatch)


def test_a_null_value_beside_top_entries_does_not_read() -> None:
    body = json.loads(json.dumps(ECHOED_BODY))
    body["choices"][0]["logprobs"]["token_logprobs"][1] = None
    assert "null beside top_logprobs" in _claim(body).problem


def test_the_echoed_tokens_must_spell_the_rendered_prompt() -> None:
    split = _split(_claim())
    assert echoed_spelling(split, ["<s>", "def", " f"]) is None
    # A token vLLM names from its context is not checked.
    assert echoed_spelling(split, ["<s>", None, " f"]) is None
    evidence = echoed_spelling(split, ["<s>", "def", " g"])
    assert evidence is not None and "' f' as its token 2" in evidence and "' g'" in evidence
    hidden = echoed_spelling(split, ["<|system|>", "def", " f"])
    assert hidden is not None and "token 0" in hidden


def test_prompt_deviations_are_named_as_the_prompts_before_the_outputs() -> None:
    prompt = LogprobsComparison((0.0, 0.75), ("def", " f"), (-2.5, -4.0), (-2.5, -3.25))
    output = LogprobsComparison((0.5,), ("(",), (-0.25,), (-0.75,))
    joined = output.after_prompt(prompt)
    assert joined.prompt_positions == 2 and joined.largest == 0.75
    evidence = joined.over(0.6)
    assert evidence is not None and evidence.startswith("logprobs differ at echoed prompt token 2")
    assert joined.over(0.8) is None
    tail = output.after_prompt(LogprobsComparison((0.0,), ("x",), (0.0,), (0.0,))).over(0.4)
    assert tail is not None and "at output position 0 by 0.5" in tail


def test_the_echoed_top_count_is_vllms() -> None:
    assert echoed_top_count(False, 3, None) is None
    assert echoed_top_count(True, None, 2) is None
    assert echoed_top_count(True, 3, None) == 3
    # prompt_logprobs sets how many vLLM computes; logprobs how many it shows.
    assert echoed_top_count(True, 3, 1) == 1
    assert echoed_top_count(True, 1, 5) == 1
    assert echoed_top_count(True, 2, -1) == 2


def test_text_offsets_must_be_the_lengths_of_the_names_before_them() -> None:
    assert not _claim().problem
    # A harness finds the output by its offset: moving it moves what the client scores.
    body = json.loads(json.dumps(ECHOED_BODY))
    body["choices"][0]["logprobs"]["text_offset"] = [0, 3, 6, 7]
    assert "text_offset of entry 3 is 7; the names before it have 8 characters" in (
        _claim(body).problem
    )
    body["choices"][0]["logprobs"]["text_offset"] = [0, 3, 6]
    assert "text_offset is not a list of 4 offsets" in _claim(body).problem
    # A claim without offsets states nothing about them.
    del body["choices"][0]["logprobs"]["text_offset"]
    assert not _claim(body).problem


def test_a_streamed_claims_offsets_run_on_over_its_chunks() -> None:
    def chunk(tokens: list[str], offsets: list[int]) -> str:
        logprobs = {
            "tokens": tokens,
            "token_logprobs": [-1.0] * len(tokens),
            "top_logprobs": [{t: -1.0} for t in tokens],
            "text_offset": offsets,
        }
        return "data: " + json.dumps({"choices": [{"index": 0, "logprobs": logprobs}]}) + "\n\n"

    def problem(second: list[int]) -> str:
        body = chunk(["def", " f"], [0, 3]) + chunk(["(", "x"], second) + "data: [DONE]\n\n"
        return claimed_logprobs("openai-completions", body.encode(), True, False)[0].problem

    assert problem([5, 6]) == ""
    # Each chunk starting again at 0 is not how vLLM's server streams them.
    assert "text_offset of entry 2 is 0; the names before it have 5 characters" in problem([0, 1])
