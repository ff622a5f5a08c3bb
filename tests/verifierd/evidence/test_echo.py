"""The echoed prompt split off the received text: exactly the echo, else a FAIL."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.cpu_bound import budget, cpu_bound
from verifierd.evidence.claims import Finding
from verifierd.evidence.echo import split_echo
from verifierd.verdicts import Reason


def test_an_honest_echo_leaves_the_sampled_output() -> None:
    assert split_echo("def parse(data):\n    return data", "def parse(data):\n") == (
        "    return data"
    )
    assert split_echo("prompt", "prompt") == ""


def test_a_wrong_echoed_prefix_fails_with_the_first_difference() -> None:
    finding = split_echo("You are a pirate. def parse(data):\n    x", "def parse(data):\n")
    assert isinstance(finding, Finding) and finding.fails
    assert finding.reason is Reason.PROMPT_MISMATCH
    assert "first difference at 0" in finding.detail
    assert "'def parse(data):\\n'" in finding.detail and "'You are a pirate" in finding.detail


def test_a_cut_echo_fails() -> None:
    finding = split_echo("def par", "def parse(data):\n")
    assert isinstance(finding, Finding) and "first difference at 7" in finding.detail


@given(st.text(max_size=200), st.text(max_size=200))
def test_the_output_after_any_echo_is_recovered(echoed: str, output: str) -> None:
    with cpu_bound(budget(len(echoed) + len(output))):
        assert split_echo(echoed + output, echoed) == output


@given(st.text(max_size=200), st.text(max_size=200))
def test_any_text_is_split_or_fails(received: str, echoed: str) -> None:
    with cpu_bound(budget(len(received) + len(echoed))):
        result = split_echo(received, echoed)
    if received.startswith(echoed):
        assert result == received[len(echoed) :]
    else:
        assert isinstance(result, Finding) and result.reason is Reason.PROMPT_MISMATCH
