"""How the console writes values, colours margins and checks the settings form."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from veritap.tls import TlsConfigError
from veritap.v1 import record_pb2, verifier_pb2

from tui import formats, heatmap
from tui.app import banner_text, build_parser, client_from_args
from tui.settings_form import SettingsInputError, change_lines, parse_settings


def test_times_and_ages_read_the_same_everywhere() -> None:
    assert formats.utc_time(1_740_819_610_000_000_000) == "03-01 09:00:10"
    assert formats.utc_time(0) == "—"
    minute = 60_000_000_000
    assert [formats.age(n * minute) for n in (0, 1, 59, 61, 24 * 60 + 5)] == [
        "<1m",
        "1m",
        "59m",
        "1h01m",
        "1d00h",
    ]
    assert formats.size(3 << 30) == "3.0 GiB" and formats.size(12) == "12 B"


def test_a_chat_prompt_reads_one_message_per_line() -> None:
    record = record_pb2.InferenceRecord()
    record.api.prompt_json = json.dumps(
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        ]
    )
    assert formats.prompt_text(record) == "system: Be brief.\nuser: Hi"
    record.api.prompt_json = json.dumps("Once upon")
    assert formats.prompt_text(record) == "Once upon"


@given(margin=st.floats(0, 100), delta_max=st.floats(0.1, 50))
def test_heat_never_cools_as_the_margin_grows(margin: float, delta_max: float) -> None:
    styles = [step.style for step in heatmap.STEPS]
    here = styles.index(heatmap.style_for(margin, delta_max))
    further = styles.index(heatmap.style_for(margin * 1.5 + 0.01, delta_max))
    assert further >= here
    assert (here == 0) == (margin <= 0)
    assert (here == len(styles) - 1) == (margin >= delta_max)


def test_heat_text_keeps_the_response_and_styles_each_token() -> None:
    text = heatmap.heat_text(["The", " tap", " copies"], [0.0, 2.0, 10.0], 10.0)
    assert text.plain == "The tap copies"
    assert [str(span.style) for span in text.spans] == [
        heatmap.STEPS[0].style,
        heatmap.STEPS[2].style,
        heatmap.STEPS[-1].style,
    ]


@given(threshold=st.floats(-1, 5), delta_max=st.floats(-1, 20), rate=st.floats(-0.5, 1.5))
def test_the_settings_form_accepts_exactly_what_verifierd_accepts(
    threshold: float, delta_max: float, rate: float
) -> None:
    ok = threshold >= 0 and delta_max > 0 and 0 <= rate <= 1
    try:
        settings = parse_settings(repr(threshold), repr(delta_max), repr(rate))
    except SettingsInputError:
        assert not ok
        return
    assert ok
    assert (settings.threshold, settings.delta_max, settings.sample_rate) == (
        threshold,
        delta_max,
        rate,
    )


def test_the_confirmation_lists_each_change() -> None:
    before = verifier_pb2.DifrSettings(threshold=0.05, delta_max=10, sample_rate=1)
    after = verifier_pb2.DifrSettings(threshold=0.2, delta_max=10, sample_rate=0.5)
    assert change_lines(before, after) == [
        "threshold   0.05 → 0.2",
        "Δmax        10 (unchanged)",
        "sample rate 1 → 0.5",
    ]
    with pytest.raises(SettingsInputError, match="threshold"):
        parse_settings("lots", "10", "1")
    with pytest.raises(SettingsInputError, match="finite"):
        parse_settings("inf", "10", "1")


def test_the_command_line_refuses_plaintext_off_loopback() -> None:
    args = build_parser().parse_args(["--verifier", "10.0.0.5:50061"])
    with pytest.raises(TlsConfigError):
        client_from_args(args)
    args = build_parser().parse_args(["--collector", "edge-1=127.0.0.1:50051"])
    client = client_from_args(args)
    assert [(e.name, e.address) for e in client.collectors] == [("edge-1", "127.0.0.1:50051")]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--collector", "no-address"])


def test_the_banner_names_every_daemon_that_does_not_answer() -> None:
    assert banner_text({}) == ""
    text = banner_text({"verifierd": "UNAVAILABLE", "edge-1": "DEADLINE_EXCEEDED"})
    assert "edge-1 (DEADLINE_EXCEEDED), verifierd (UNAVAILABLE)" in text


def test_captured_text_is_shown_literally_with_its_controls_escaped() -> None:
    shown = formats.shown("[b]bold?[/b] \x1b[2J \u202eevil", "red")
    assert shown.plain == "[b]bold?[/b] \\x1b[2J \\u202eevil"
    assert shown.style == "red" and not shown.spans


def test_provers_and_alarms_read_as_the_cli_names_them() -> None:
    v6 = verifier_pb2.ProverId(origin="edge-1", server_address="fd00::9", server_port=8000)
    v4 = verifier_pb2.ProverId(origin="edge-1", server_address="10.0.0.5", server_port=8000)
    assert formats.prover_label(v6) == "edge-1/[fd00::9]:8000"
    assert formats.prover_label(v4) == "edge-1/10.0.0.5:8000"
    dishonest = verifier_pb2.ProverAlarm(
        kind=verifier_pb2.ALARM_KIND_DISHONEST,
        raised_at_ns=1_740_819_610_000_000_000,
        statistic=14.2,
        bound=13.8,
        pooled_tokens=1234,
    )
    assert formats.alarm_line(dishonest) == (
        "DISHONEST: ln e 14.2 ≥ 13.8 after 1\u2009234 tokens, since 03-01 09:00:10 UTC"
    )
    hiding = verifier_pb2.ProverAlarm(
        kind=verifier_pb2.ALARM_KIND_HIDING,
        reason="no_seed",
        raised_at_ns=1_740_819_610_000_000_000,
        statistic=0.8,
        bound=0.5,
        window_s=3600,
    )
    assert formats.alarm_line(hiding) == (
        "HIDING no_seed: 80% of verdicts over 1h00m > 50%, since 03-01 09:00:10 UTC"
    )


def test_a_verdict_names_its_checkpoint_by_tree_size_and_full_root() -> None:
    root = bytes(range(32))
    verdict = verifier_pb2.Verdict(checkpoint_tree_size=1200, checkpoint_root_hash=root)
    assert formats.checkpoint_line(verdict) == f"tree size 1\u2009200, root {root.hex()}"
    assert formats.checkpoint_line(verifier_pb2.Verdict()) == "—"


def test_a_verdict_shows_its_logprobs_deviation_against_the_tolerance() -> None:
    stated = verifier_pb2.Verdict(logprobs_deviation=0.5)
    stated.settings.logprobs_tolerance = 0.25
    assert formats.logprobs_line(stated) == "largest deviation 0.5 > tolerance 0.25"
    stated.logprobs_deviation = 1e-6
    assert formats.logprobs_line(stated) == "largest deviation 1e-06 ≤ tolerance 0.25"
    default = verifier_pb2.Verdict(logprobs_deviation=0.1)
    assert formats.logprobs_line(default) == (
        "largest deviation 0.1 (the commitment's default tolerance)"
    )
    assert formats.logprobs_line(verifier_pb2.Verdict()) == "—"


def test_the_reason_line_names_a_fails_evidence_and_what_a_bare_pass_rests_on() -> None:
    fail = verifier_pb2.Verdict(
        status=verifier_pb2.VERDICT_STATUS_FAIL,
        reason="prompt_mismatch",
        detail="prompt token 3: claimed 17, rendered 42",
    )
    assert formats.reason_line(fail) == "prompt_mismatch: prompt token 3: claimed 17, rendered 42"
    bare_pass = verifier_pb2.Verdict(
        status=verifier_pb2.VERDICT_STATUS_PASS, detail="no output token was scored"
    )
    assert formats.reason_line(bare_pass) == "no output token was scored"
    assert formats.reason_line(verifier_pb2.Verdict(reason="score_over_threshold")) == (
        "score_over_threshold"
    )
    assert formats.reason_line(verifier_pb2.Verdict()) == ""
