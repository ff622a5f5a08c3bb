"""The prover's logprobs claim: read as the client reads it, shape-checked, compared."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.cpu_bound import budget, cpu_bound
from verifierd.evidence.logprobs import (
    ClaimedPosition,
    LogprobsClaim,
    LogprobsComparison,
    RankedToken,
    ShapeMismatch,
    VerifiedPosition,
    claimed_logprobs,
    compare,
    top_count,
    verified_name,
)


def _chat_entry(token: str, logprob: float, top: list[tuple[str, float]]) -> dict[str, object]:
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in top],
    }


#: The verifier's view of two positions: "a" then "b" sampled.
VERIFIED = (
    VerifiedPosition(
        "a", -0.5, (RankedToken("a", -0.5), RankedToken("x", -1.5), RankedToken("y", -2.0))
    ),
    VerifiedPosition(
        "b", -3.0, (RankedToken("z", -0.2), RankedToken("w", -2.5), RankedToken("b", -3.0))
    ),
)


def _honest_chat(top: int = 2) -> list[dict[str, object]]:
    """What vLLM writes for VERIFIED: the sampled token first, then the others by rank."""
    return [
        _chat_entry("a", -0.5, [("a", -0.5), ("x", -1.5)][:top]),
        _chat_entry("b", -3.0, [("b", -3.0), ("z", -0.2)][:top]),
    ]


def _chat_body(content: list[dict[str, object]]) -> bytes:
    choice = {"index": 0, "message": {"content": "ab"}, "logprobs": {"content": content}}
    return json.dumps({"object": "chat.completion", "choices": [choice]}).encode()


def _sse(chunks: list[dict[str, object]]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + (
        b"data: [DONE]\n\n"
    )


def _claim(body: bytes, *, streamed: bool = False, chat: bool = True) -> LogprobsClaim:
    return claimed_logprobs("openai-chat", body, streamed, chat)[0]


def _compared(claim: LogprobsClaim, *, chat: bool = True, top: int = 2) -> LogprobsComparison:
    result = compare(claim, VERIFIED, chat=chat, requested_top=top)
    assert isinstance(result, LogprobsComparison), result
    return result


def _finding(claim: LogprobsClaim, *, chat: bool = True, top: int = 2) -> str:
    result = compare(claim, VERIFIED, chat=chat, requested_top=top)
    assert isinstance(result, ShapeMismatch)
    return result.detail


def test_honest_chat_logprobs_deviate_by_nothing() -> None:
    claim = _claim(_chat_body(_honest_chat()))
    assert len(claim.positions) == 2 and claim.problem == ""
    compared = _compared(claim)
    assert compared.deviations == (0.0, 0.0) and compared.over(0.0) is None


def test_a_streamed_chat_claim_is_the_sum_of_its_chunks() -> None:
    first, second = _honest_chat()
    chunks: list[dict[str, object]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None}]},
        {"choices": [{"index": 0, "delta": {"content": "a"}, "logprobs": {"content": [first]}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}, "logprobs": {"content": [second]}}]},
        {"choices": [], "usage": {"completion_tokens": 2}},
    ]
    streamed = _claim(_sse(chunks), streamed=True)
    assert streamed == _claim(_chat_body(_honest_chat()))


def test_completions_logprobs_are_read_from_their_lists() -> None:
    logprobs = {
        "tokens": ["a", "b"],
        "token_logprobs": [-0.5, -3.0],
        "top_logprobs": [{"a": -0.5, "x": -1.5}, {"b": -3.0, "z": -0.2, "w": -2.5}],
        "text_offset": [0, 1],
    }
    body = json.dumps({"choices": [{"index": 0, "text": "ab", "logprobs": logprobs}]}).encode()
    claim = claimed_logprobs("openai-completions", body, False, False)[0]
    assert _compared(claim, chat=False).largest == 0.0
    # `logprobs: 2` allows the sampled token and two more: a fourth entry is not vLLM's.
    logprobs["top_logprobs"][1]["y"] = -4.0  # type: ignore[index]
    body = json.dumps({"choices": [{"index": 0, "text": "ab", "logprobs": logprobs}]}).encode()
    claim = claimed_logprobs("openai-completions", body, False, False)[0]
    assert "4 top_logprobs, the request asked for 2" in _finding(claim, chat=False)


def test_a_position_listing_more_than_the_server_lists_is_a_problem() -> None:
    chat = _chat_body(_honest_chat())
    assert not claimed_logprobs("openai-chat", chat, False, True, most_listed=2)[0].problem
    problem = claimed_logprobs("openai-chat", chat, False, True, most_listed=1)[0].problem
    expected = "openai-chat choice 0: entry 0 lists 2 top_logprobs; the server lists at most 1"
    assert problem == expected
    logprobs = {"tokens": ["a"], "token_logprobs": [-0.5], "top_logprobs": [{"a": -0.5, "x": -1}]}
    body = json.dumps({"choices": [{"index": 0, "text": "a", "logprobs": logprobs}]}).encode()
    assert not claimed_logprobs("openai-completions", body, False, False, 2)[0].problem
    problem = claimed_logprobs("openai-completions", body, False, False, 1)[0].problem
    assert "entry 0 lists 2 top_logprobs; the server lists at most 1" in problem


def test_another_models_values_fail_with_the_first_position_and_both_values() -> None:
    content = _honest_chat()
    content[1] = _chat_entry("b", -2.4, [("b", -2.4), ("z", -0.2)])
    compared = _compared(_claim(_chat_body(content)))
    assert compared.deviations[0] == 0.0 and abs(compared.largest - 0.6) < 1e-12
    detail = compared.over(0.5)
    assert detail is not None
    assert "position 1" in detail and "claimed -2.4" in detail and "recomputed -3" in detail
    assert compared.over(0.7) is None


def test_a_top_entry_the_verifier_ranks_elsewhere_deviates() -> None:
    content = _honest_chat()
    # "w" is the verifier's second choice at position 1 only by -2.5, not -0.2.
    content[1] = _chat_entry("b", -3.0, [("b", -3.0), ("w", -0.2)])
    compared = _compared(_claim(_chat_body(content)))
    # "w" claimed 2.3 too high; leaving "z" out costs nothing (it ties the listed -0.2).
    assert abs(compared.largest - 2.3) < 1e-12


def test_an_unknown_top_token_costs_its_height_above_the_verifiers_list() -> None:
    content = _honest_chat()
    content[0] = _chat_entry("a", -0.5, [("a", -0.5), ("q", -1.0)])
    compared = _compared(_claim(_chat_body(content)))
    # "q" is not in the verifier's top 3 (lowest -2.0); "x" (-1.5) is left out.
    assert abs(compared.deviations[0] - 1.0) < 1e-12


def test_a_token_the_prover_may_have_masked_matches_its_value_or_the_floor() -> None:
    # "x" sits at a top-p cut the prover's rounding could put either side of.
    open_cut = VerifiedPosition(
        "a",
        -0.5,
        (RankedToken("a", -0.5), RankedToken("x", -1.5, True), RankedToken("y", -9999.0)),
    )
    kept = _chat_entry("a", -0.5, [("a", -0.5), ("x", -1.5)])
    masked = _chat_entry("a", -0.5, [("a", -0.5), ("y", -9999.0)])
    moved = _chat_entry("a", -0.5, [("a", -0.5), ("x", -1.0)])
    for entry, deviation in ((kept, 0.0), (masked, 0.0), (moved, 0.5)):
        result = compare(_claim(_chat_body([entry])), [open_cut], chat=True, requested_top=2)
        assert isinstance(result, LogprobsComparison) and result.largest == deviation
    # Surely kept, the same "x" left out costs its height above the listed floor.
    settled = VerifiedPosition(
        "a", -0.5, (*open_cut.top[:1], RankedToken("x", -1.5), open_cut.top[2])
    )
    result = compare(_claim(_chat_body([masked])), [settled], chat=True, requested_top=2)
    assert isinstance(result, LogprobsComparison) and result.largest > 9000


def test_a_masked_entry_is_not_matched_with_a_token_vllm_renames() -> None:
    # The verifier lists a token vLLM names from its context ("\ufffd" decoded); the
    # claim lists a masked token at the floor under a name the verifier does not list.
    renamed = VerifiedPosition(
        "a", -0.5, (RankedToken("a", -0.5), RankedToken(None, -1.5), RankedToken("y", -9999.0))
    )
    entry = _chat_entry("a", -0.5, [("a", -0.5), ("<eos>", -9999.0)])
    result = compare(_claim(_chat_body([entry])), [renamed], chat=True, requested_top=2)
    assert isinstance(result, LogprobsComparison) and result.largest == 0.0
    entry = _chat_entry("a", -0.5, [("a", -0.5), ("<eos>", -1.0)])
    result = compare(_claim(_chat_body([entry])), [renamed], chat=True, requested_top=2)
    assert isinstance(result, LogprobsComparison) and result.largest == 0.5


def test_the_shape_of_the_claim_is_checked() -> None:
    content = _honest_chat()
    content[0] = _chat_entry("A", -0.5, [("A", -0.5), ("x", -1.5)])
    assert "names 'A'" in _finding(_claim(_chat_body(content)))
    content = _honest_chat()
    content[0]["bytes"] = [0x41]
    assert "bytes" in _finding(_claim(_chat_body(content)))
    assert "1 top_logprobs, the request asked for 2" in _finding(
        _claim(_chat_body(_honest_chat(top=1)))
    )
    content = _honest_chat()
    content[1]["top_logprobs"] = list(reversed(content[1]["top_logprobs"]))  # type: ignore[call-overload]
    assert "first top_logprobs entry" in _finding(_claim(_chat_body(content)))
    assert "1 logprobs entries for the 2" in _finding(_claim(_chat_body(_honest_chat()[:1])))
    content = _honest_chat()
    content[0]["logprob"] = "high"
    assert "not a number" in _finding(_claim(_chat_body(content)))


def test_ranks_must_not_increase_after_the_sampled_entry() -> None:
    verified = (
        VerifiedPosition(
            "a", -2.0, (RankedToken("x", -0.5), RankedToken("y", -1.5), RankedToken("a", -2.0))
        ),
    )
    content = [_chat_entry("a", -2.0, [("a", -2.0), ("y", -1.5), ("x", -0.5)])]
    claim = _claim(_chat_body(content))
    result = compare(claim, verified, chat=True, requested_top=3)
    assert isinstance(result, ShapeMismatch) and "non-increasing" in result.detail


def test_names_vllm_gives_from_context_are_not_checked() -> None:
    assert verified_name("ab\ufffd") is None and verified_name("ab") == "ab"
    verified = (VerifiedPosition(None, -0.5, (RankedToken("\ufffd", -0.5),)),)
    claim = LogprobsClaim((ClaimedPosition("é", -0.5, None, ()),))
    result = compare(claim, verified, chat=True, requested_top=0)
    assert isinstance(result, LogprobsComparison) and result.largest == 0.0


def test_a_top_token_vllm_renames_matches_by_value() -> None:
    # The verifier's second choice decodes to an unfinished UTF-8 sequence: vLLM's
    # server names it from the context (here ""), the verifier cannot.
    verified = (
        VerifiedPosition(
            "a", -2.0, (RankedToken("x", -0.5), RankedToken(None, -1.5), RankedToken("a", -2.0))
        ),
    )
    content = [_chat_entry("a", -2.0, [("a", -2.0), ("x", -0.5), ("", -1.5)])]
    result = compare(_claim(_chat_body(content)), verified, chat=True, requested_top=3)
    assert isinstance(result, LogprobsComparison) and result.largest == 0.0
    content = [_chat_entry("a", -2.0, [("a", -2.0), ("x", -0.5), ("", -1.0)])]
    result = compare(_claim(_chat_body(content)), verified, chat=True, requested_top=3)
    assert isinstance(result, LogprobsComparison) and result.largest == 0.5


def test_choices_without_logprobs_and_unreadable_bodies_claim_nothing() -> None:
    body = json.dumps({"choices": [{"index": 0, "logprobs": None}]}).encode()
    assert claimed_logprobs("openai-chat", body, False, True) == {}
    assert claimed_logprobs("openai-chat", b"\xff{", False, True) == {}
    assert claimed_logprobs("openai-chat", b"data: {\n\n", True, True) == {}


def test_top_count_reads_the_request_as_vllm_does() -> None:
    assert top_count({"logprobs": True, "top_logprobs": 3}, chat=True) == 3
    assert top_count({"logprobs": True}, chat=True) == 0
    assert top_count({"logprobs": 2}, chat=False) == 2
    assert top_count({"logprobs": True}, chat=False) == 0


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=4))
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "index",
                    "logprobs",
                    "content",
                    "token",
                    "logprob",
                    "bytes",
                    "top_logprobs",
                    "tokens",
                    "token_logprobs",
                    "text_offset",
                ]
            ),
            inner,
            max_size=5,
        )
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(document=_json, streamed=st.booleans(), chat=st.booleans(), raw=st.binary(max_size=64))
def test_any_body_gives_claims_or_problems_within_a_linear_bound(
    document: object, streamed: bool, chat: bool, raw: bytes
) -> None:
    text = json.dumps(document).encode()
    body = (b"data: " + text + b"\n\n" + raw) if streamed else text + raw[:1]
    with cpu_bound(budget(len(body))):
        claims = claimed_logprobs("openai-chat", body, streamed, chat)
        for claim in claims.values():
            result = compare(claim, VERIFIED, chat=chat, requested_top=2)
            assert isinstance(result, LogprobsComparison | ShapeMismatch)
