"""The Verdicts screen's filter line: parsing, round trips, and what it lets through."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.v1 import verifier_pb2

from tui.verdict_filter import STATUS_WORDS, FilterSyntaxError, VerdictFilterSpec, parse_filter

specs = st.builds(
    VerdictFilterSpec,
    statuses=st.frozensets(st.sampled_from(sorted(STATUS_WORDS.values()))),
    model=st.sampled_from(["", "tiny-chat", "org/model-7b"]),
    min_score=st.none() | st.floats(-10, 0, allow_nan=False),
    max_score=st.none() | st.floats(0, 10, allow_nan=False),
    from_ns=st.integers(0, 10**18),
    to_ns=st.just(0) | st.integers(10**18, 2 * 10**18),
)


@given(spec=specs)
def test_a_spec_written_as_text_parses_back_to_itself(spec: VerdictFilterSpec) -> None:
    assert parse_filter(spec.text()) == spec


@given(line=st.text(max_size=60))
def test_any_line_parses_or_names_its_bad_term(line: str) -> None:
    try:
        spec = parse_filter(line)
    except FilterSyntaxError as exc:
        assert str(exc)
        return
    assert parse_filter(spec.text()) == spec


def test_the_words_operators_type() -> None:
    spec = parse_filter("FAIL error model:tiny-chat score>1.5 score<=9 since:2025-03-01T09:00")
    assert spec.statuses == {verifier_pb2.VERDICT_STATUS_FAIL, verifier_pb2.VERDICT_STATUS_ERROR}
    assert (spec.model, spec.min_score, spec.max_score) == ("tiny-chat", 1.5, 9.0)
    assert spec.from_ns == 1_740_819_600_000_000_000
    request = spec.request(50)
    assert list(request.statuses) == [2, 5] and request.min_score == 1.5
    assert request.page_size == 50
    for bad in ("score>=x", "model:", "colour:red", "score>=3 score<=1", "since:yesterday"):
        with pytest.raises(FilterSyntaxError):
            parse_filter(bad)


@given(
    spec=specs,
    verdict=st.builds(
        verifier_pb2.Verdict,
        status=st.sampled_from(sorted(STATUS_WORDS.values())),
        model=st.sampled_from(["tiny-chat", "other"]),
        score=st.floats(-20, 20),
        decided_at_ns=st.integers(0, 3 * 10**18),
    ),
)
def test_live_verdicts_are_judged_like_the_server_judges_listed_ones(
    spec: VerdictFilterSpec, verdict: verifier_pb2.Verdict
) -> None:
    request = spec.request(10)
    expected = (
        (not request.statuses or verdict.status in request.statuses)
        and (not request.model or verdict.model == request.model)
        and (not request.HasField("min_score") or verdict.score >= request.min_score)
        and (not request.HasField("max_score") or verdict.score <= request.max_score)
        and verdict.decided_at_ns >= request.from_ns
        and (not request.to_ns or verdict.decided_at_ns <= request.to_ns)
    )
    assert spec.accept(verdict) == expected
