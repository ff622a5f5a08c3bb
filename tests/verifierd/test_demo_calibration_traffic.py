"""The demo's calibration traffic asks for logprobs, so calibration measures their tolerance."""

from __future__ import annotations

from verifierd.demo.traffic import calibration_turns


def test_calibration_asks_for_logprobs_streamed_and_not_greedy_and_sampled() -> None:
    turns = calibration_turns(8, max_tokens=16, seed_base=500)
    stating = [t for t in turns if t.top_logprobs is not None]
    assert {t.top_logprobs for t in stating} == {0, 3}
    assert {t.stream for t in stating} == {True, False}
    assert {t.temperature == 0 for t in stating} == {True, False}
    # Some still ask for none: the threshold is calibrated on plain answers too.
    assert len(stating) < len(turns)


def test_a_logprobs_request_body_asks_as_the_openai_sdk_does() -> None:
    [plain, asking] = calibration_turns(2, max_tokens=16, seed_base=500)
    body = asking.body("tiny")
    assert (body["logprobs"], body["top_logprobs"]) == (True, 3)
    assert "logprobs" not in plain.body("tiny") and "top_logprobs" not in plain.body("tiny")
