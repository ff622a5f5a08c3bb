"""Prover claims against the client's view: each contradiction is a FAIL with its reason."""

from __future__ import annotations

from verifierd.evidence.claims import (
    FinishRules,
    check_finish,
    check_prompt,
    check_text,
    first_difference,
)
from verifierd.evidence.vllm_views import DecodedOutput
from verifierd.verdicts import Reason

EOS = 2
STOP_ID = 9


def _rules(finish: str, claimed: object = None, length: int = 4) -> FinishRules:
    return FinishRules(finish, claimed, frozenset({EOS, STOP_ID}), length, ignore_eos=False)


def _decoded(text: str = "abc", stop: str | None = None, used: int = 4) -> DecodedOutput:
    return DecodedOutput(text, stop, used)


def test_first_difference() -> None:
    assert first_difference([1, 2, 3], [1, 2, 4]) == 2
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference("", "x") == 0


def test_prompt_claims_must_equal_the_rendering() -> None:
    assert check_prompt(None, [1, 2, 3]) is None
    assert check_prompt([1, 2, 3], (1, 2, 3)) is None
    hidden_system_prompt = [7, 7, 7, 1, 2, 3]
    finding = check_prompt(hidden_system_prompt, [1, 2, 3])
    assert finding is not None and finding.fails
    assert finding.reason is Reason.PROMPT_MISMATCH
    assert "first difference at 0" in finding.detail and "6 prompt ids claimed" in finding.detail


def test_text_must_be_what_the_client_received() -> None:
    assert check_text("héllo", "héllo") is None
    finding = check_text("hello world", "hello there")
    assert finding is not None and finding.reason is Reason.TOKEN_TEXT_MISMATCH
    assert "first difference at 6" in finding.detail
    assert "'there'" in finding.detail and "'world'" in finding.detail
    # Empty ids decode to nothing: a non-empty text is a mismatch.
    empty = check_text("some text", "")
    assert empty is not None and empty.reason is Reason.TOKEN_TEXT_MISMATCH


def test_stop_on_an_end_token() -> None:
    assert check_finish(_rules("stop"), [5, 6, 7, EOS], _decoded()) is None
    assert check_finish(_rules("stop", STOP_ID), [5, 6, 7, STOP_ID], _decoded()) is None
    truncated = check_finish(_rules("stop"), [5, 6, 7, 8], _decoded())
    assert truncated is not None and truncated.reason is Reason.FINISH_MISMATCH
    wrong_id = check_finish(_rules("stop", STOP_ID), [5, 6, 7, EOS], _decoded())
    assert wrong_id is not None and "stop_reason 9" in wrong_id.detail


def test_stop_on_a_stop_string() -> None:
    decoded = _decoded(stop="END")
    assert check_finish(_rules("stop", "END"), [5, 6, 7, 8], decoded) is None
    other = check_finish(_rules("stop", "STOP"), [5, 6, 7, 8], decoded)
    assert other is not None and other.reason is Reason.FINISH_MISMATCH
    claimed_but_absent = check_finish(_rules("stop", "END"), [5, 6, 7, EOS], _decoded())
    assert claimed_but_absent is not None and "ends nothing" in claimed_but_absent.detail


def test_an_earlier_stop_means_the_claim_is_longer_than_the_generation() -> None:
    finding = check_finish(_rules("stop"), [5, EOS, 7, EOS], _decoded(used=2))
    assert finding is not None and "stops at token 2 of 4" in finding.detail


def test_length_means_exactly_max_tokens() -> None:
    assert check_finish(_rules("length", length=4), [5, 6, 7, 8], _decoded()) is None
    halved = check_finish(_rules("length", length=8), [5, 6, 7, 8], _decoded())
    assert halved is not None and "'length' after 4 tokens; the request allows 8" in halved.detail
    on_eos = check_finish(_rules("length", length=4), [5, 6, 7, EOS], _decoded())
    assert on_eos is not None and on_eos.reason is Reason.FINISH_MISMATCH


def test_other_finish_reasons_are_not_replayed() -> None:
    finding = check_finish(_rules("abort"), [5, 6, 7, 8], _decoded())
    assert finding is not None and not finding.fails
    assert finding.reason is Reason.TOKENS_UNAVAILABLE
