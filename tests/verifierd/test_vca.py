"""VCA: the report's arithmetic, the range-vector parser, the time parser, and the `verifierd
vca` command end to end on CPU (a real process tree metered by a real prover meter)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.verifierd.prover_meter_process import prover_meter
from verifierd.commands import vca as vca_command
from verifierd.commands.vca import format_report, parse_time
from verifierd.cost_log import BatchCost, CostLog
from verifierd.meter.readings import Method
from verifierd.vca import (
    PRESETS,
    ProverActivity,
    VcaError,
    build_report,
    parse_matrix,
    traffic_span,
)

S = 1_000_000_000
NOW = 1_763_000_000 * S


def batch(
    commitment: str = "c1",
    *,
    method: Method = Method.NVML_GPM,
    activity: float = 2.0,
    tokens: int = 1000,
    sample_rate: float = 1.0,
    traffic: tuple[int, int] = (NOW, NOW + 10 * S),
    n: int = 0,
) -> BatchCost:
    return BatchCost(
        batch_id=f"{commitment}-{n}",
        commitment_id=commitment,
        method=method,
        start_ns=traffic[1] + S,
        end_ns=traffic[1] + 2 * S,
        targets=("gpu0",),
        activity_seconds=activity,
        sm_seconds=None,
        dram_seconds=None,
        covered_seconds=1.0,
        records=8,
        prompt_tokens=500,
        completion_tokens=tokens,
        sample_rate=sample_rate,
        traffic_start_ns=traffic[0],
        traffic_end_ns=traffic[1],
    )


def prover(activity: float, preset: str = "dcgm", series: int = 1) -> ProverActivity:
    return ProverActivity(
        source="http://prom",
        query=PRESETS[preset],
        start_ns=NOW,
        end_ns=NOW + 10 * S,
        activity_seconds=activity,
        covered_seconds=10.0 * series,
        series=series,
    )


def test_one_commitment_fully_verified() -> None:
    report = build_report([batch(activity=2.0), batch(activity=3.0, n=1)], prover(40.0), 0, NOW)
    (row,) = report.rows
    assert (row.batches, row.records, row.verified_tokens) == (2, 16, 2000)
    assert row.generated_tokens == 2000
    assert row.verifier_activity_seconds == 5.0
    assert row.prover_activity_seconds == 40.0
    assert row.vca == pytest.approx(8.0)
    assert report.total is not None and report.total.vca == pytest.approx(8.0)
    assert report.notes == ()


def test_sampling_scales_the_prover_tokens() -> None:
    # A quarter of the responses verified: the prover generated 4x the verified tokens.
    report = build_report([batch(activity=1.0, sample_rate=0.25)], prover(40.0), 0, NOW)
    (row,) = report.rows
    assert row.generated_tokens == 4000
    assert row.vca == pytest.approx((40.0 / 4000) / (1.0 / 1000))
    assert "generated tokens estimated as verified tokens / sample rate" in report.notes


def test_two_commitments_share_the_prover_by_generated_tokens() -> None:
    batches = [batch("a", activity=1.0, tokens=3000), batch("b", activity=4.0, tokens=1000)]
    report = build_report(batches, prover(80.0), 0, NOW)
    a, b = report.rows
    assert (a.prover_activity_seconds, b.prover_activity_seconds) == (60.0, 20.0)
    assert (a.vca, b.vca) == pytest.approx((60.0, 5.0))
    assert report.total is not None
    assert report.total.vca == pytest.approx(80.0 / 5.0)
    assert "prover activity split across commitments by generated tokens" in report.notes


def test_unlike_quantities_are_called_out() -> None:
    cpu = build_report([batch(method=Method.CPU_SECONDS)], prover(10.0, "dcgm"), 0, NOW)
    assert any("not like for like" in note for note in cpu.notes)
    assert any(note.startswith("cpu-seconds: CPU time of the prover") for note in cpu.notes)
    mixed = build_report(
        [batch("a", method=Method.NVML_GPM), batch("b", method=Method.NVML_UTILIZATION)],
        prover(1.0),
        0,
        NOW,
    )
    assert mixed.total is None
    assert any("metered in different ways" in note for note in mixed.notes)


def test_missing_pieces_give_no_vca() -> None:
    no_prover = build_report([batch()], None, 0, NOW)
    assert no_prover.rows[0].vca is None
    assert "no prover measurement: VCA unknown" in no_prover.notes
    empty = build_report([], prover(5.0), 0, NOW)
    assert empty.rows == () and empty.total is None
    assert "no verified batch in the window" in empty.notes
    silent = build_report([batch(activity=0.0)], prover(5.0, series=0), 0, NOW)
    assert silent.rows[0].vca is None
    assert any("returned no series" in note for note in silent.notes)
    text = format_report(silent)
    assert "c1" in text and text.splitlines()[-1].startswith("  - ")


def test_traffic_span_is_clipped_to_the_window() -> None:
    batches = [batch(traffic=(NOW, NOW + 5 * S)), batch(traffic=(NOW + 2 * S, NOW + 9 * S))]
    assert traffic_span(batches, 0, 2**63) == (NOW, NOW + 9 * S)
    assert traffic_span(batches, NOW + S, NOW + 8 * S) == (NOW + S, NOW + 8 * S)
    assert traffic_span([], 5, 7) == (5, 7)


def test_parse_matrix_reads_a_prometheus_answer() -> None:
    body = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [
                {
                    "metric": {"__name__": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gpu": "0"},
                    "values": [[1763000000, "0.25"], [1763000001.5, "NaN"], [1763000002, "0.5"]],
                }
            ],
        },
    }
    (series,) = parse_matrix(body)
    assert dict(series.labels)["gpu"] == "0"
    assert [(p.t_ns, p.value) for p in series.points] == [
        (1763000000 * S, 0.25),
        (1763000002 * S, 0.5),
    ]
    with pytest.raises(VcaError, match="bad_data: parse error"):
        parse_matrix({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(VcaError, match="range vector"):
        parse_matrix({"status": "success", "data": {"resultType": "vector", "result": []}})


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=20,
)


@given(json_values)
def test_parse_matrix_never_fails_any_other_way(result: object) -> None:
    body = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    with contextlib.suppress(VcaError):
        parse_matrix(body)


@given(st.integers(min_value=0, max_value=4_000_000_000))
def test_unix_seconds_and_nanoseconds(seconds: int) -> None:
    assert parse_time(str(seconds), NOW) == seconds * S
    assert parse_time(str(seconds * S + 7), NOW) == seconds * S + 7 or seconds * S + 7 < 10**15


def test_relative_iso_and_bad_times() -> None:
    assert parse_time("now", NOW) == NOW
    assert parse_time("-90s", NOW) == NOW - 90 * S
    assert parse_time("-1.5m", NOW) == NOW - 90 * S
    assert parse_time("-2h", NOW) == NOW - 7200 * S
    assert parse_time("2025-11-13T02:13:20Z", NOW) == NOW
    assert parse_time("2025-11-13T02:13:20", NOW) == NOW
    assert parse_time("2025-11-13T03:13:20+01:00", NOW) == NOW
    for bad in ("yesterday", "-5 minutes", ""):
        with pytest.raises(ValueError, match="not a time"):
            parse_time(bad, NOW)


@given(st.text(max_size=30))
def test_any_text_is_a_time_or_a_value_error(text: str) -> None:
    with contextlib.suppress(ValueError):
        parse_time(text, NOW)


# -- end to end on CPU --------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """`verifierd ARGV` for the vca command (without importing every other command)."""
    parser = argparse.ArgumentParser(prog="verifierd")
    vca_command.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


BURNER = """
import sys, time
for line in sys.stdin:
    end = time.process_time() + float(line)
    while time.process_time() < end:
        pass
    print("burnt", flush=True)
"""


@pytest.fixture
def cpu_prover() -> Iterator[subprocess.Popen[str]]:
    """A stand-in prover process that burns as much CPU as it is told to."""
    proc = subprocess.Popen(
        [sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    yield proc
    if proc.stdin:
        proc.stdin.close()
    proc.wait(timeout=30)


@pytest.fixture
def meter_url(cpu_prover: subprocess.Popen[str]) -> Iterator[str]:
    """`verifierd prover-meter --pid` on the stand-in prover; yields its base URL."""
    with prover_meter(["--pid", str(cpu_prover.pid), "--interval", "0.05"]) as url:
        yield url


def burn(proc: subprocess.Popen[str], seconds: float) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{seconds}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "burnt"


def test_vca_command_on_cpu_traffic(
    tmp_path: Path,
    cpu_prover: subprocess.Popen[str],
    meter_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The prover generates 1000 tokens with 0.6 CPU-seconds; the verifier's engine spent 0.1
    # CPU-seconds checking them (as its meter recorded in the cost log): VCA about 6.
    time.sleep(0.3)
    start = time.time_ns()
    burn(cpu_prover, 0.6)
    end = time.time_ns()
    time.sleep(0.3)
    state = tmp_path / "state"
    with CostLog.open(state / "costs") as log:
        log.append(
            replace(
                batch(method=Method.CPU_SECONDS, activity=0.1, traffic=(start, end)),
                targets=("pid1",),
            )
        )
    code = main(
        ["vca", "--from", str(start - S), "--to", "now", "--state-dir", str(state),
         "--prometheus", meter_url, "--step", "0.05", "--json"]
    )  # fmt: skip
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["prover"]["query"]["query"] == PRESETS["cpu"].query
    assert report["prover"]["series"] == 1
    # The burn, give or take one 50 ms sample of a busy core at each edge.
    assert report["prover"]["activity_seconds"] == pytest.approx(0.6, abs=0.15)
    (row,) = report["rows"]
    assert row["method"] == "cpu-seconds"
    assert row["vca"] == pytest.approx(6.0, rel=0.25)
    code = main(
        ["vca", "--from", str(start - S), "--cost-log", str(state / "costs"),
         "--prometheus", meter_url]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0
    assert "cpu-seconds: CPU time of the prover's process tree" in text
    assert re.search(r"c1\s+cpu-seconds\s+1\s+8\s+1000\s+1000\s+0\.100\s+0\.\d+\s+\d+\.\d\dx", text)


def test_vca_command_reports_its_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vca", "--from=-1h", "--cost-log", str(tmp_path / "none")]) == 1
    assert "no cost log at" in capsys.readouterr().err
    with CostLog.open(tmp_path / "costs") as log:
        log.append(batch())
    unreachable = ["vca", "--from", "0", "--cost-log", str(tmp_path / "costs")]
    assert main([*unreachable, "--prometheus", "http://127.0.0.1:9"]) == 1
    assert "cannot query http://127.0.0.1:9/api/v1/query_range" in capsys.readouterr().err
    assert main(["vca", "--from", "soon", "--cost-log", "x"]) == 2
    assert "'soon' is not a time" in capsys.readouterr().err
    assert main(["vca", "--from", "now", "--to=-1m", "--cost-log", "x"]) == 2
