"""What the demo reads back from the running verifierd, and how it judges it.

The rows come from the daemon's own API (ListVerdicts, GetRecord,
ListCommitments), as an operator's script would read them; the checks and the
margin summary are plain functions over those rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from veritap.v1 import verifier_pb2, verifier_pb2_grpc

from verifierd.commitments import DifrSettings
from verifierd.demo.scrape import MetricsSnapshot

TERMINAL = {
    verifier_pb2.VERDICT_STATUS_PASS,
    verifier_pb2.VERDICT_STATUS_FAIL,
    verifier_pb2.VERDICT_STATUS_UNVERIFIABLE,
    verifier_pb2.VERDICT_STATUS_SKIPPED,
}


@dataclass(frozen=True)
class VerdictRow:
    record_id: str
    seq: int
    prover: str
    tokens: int
    #: Scored tokens that differ from what the verifier's sampler would have chosen.
    changed: int
    score: float
    status: str
    reason: str
    #: The threshold the verdict was decided with (the settings in force then).
    threshold: float


@dataclass(frozen=True)
class Calibration:
    """The calibration phase: what `verifierd calibrate` printed and what took effect."""

    #: `verifierd calibrate`'s report, verbatim.
    report: str
    #: Records 1..last_seq of the demo's collector are the calibration traffic.
    last_seq: int
    #: The settings in the commitment file.
    committed: DifrSettings
    #: The settings the running daemon reports in force after `--apply`.
    in_force: DifrSettings


@dataclass(frozen=True)
class DemoResult:
    calibration: Calibration
    #: Verdicts on the honest calibration traffic (decided with the committed settings).
    calibration_rows: tuple[VerdictRow, ...]
    #: Verdicts on the mixed honest/dishonest traffic (decided after calibration).
    rows: tuple[VerdictRow, ...]
    #: Both daemons' /metrics counters at the end.
    metrics: MetricsSnapshot


@dataclass(frozen=True)
class Margins:
    """How far the judged scores sit from the threshold."""

    threshold: float
    #: Largest score of an honest scored response (None when there is none).
    max_honest: float | None
    #: Smallest score of a dishonest scored response (None when there is none).
    min_dishonest: float | None
    #: Fewest changed tokens in a dishonest scored response: Token-DiFR sees only
    #: changed tokens, so a response with none cannot be caught at any threshold.
    fewest_changed: int | None
    #: Tokens of that response.
    fewest_changed_of: int


def _status_name(status: verifier_pb2.VerdictStatus.ValueType) -> str:
    return verifier_pb2.VerdictStatus.Name(status).removeprefix("VERDICT_STATUS_")


def fetch_rows(address: str, honest_port: int) -> list[VerdictRow]:
    """Every verdict the daemon holds, with the prover told apart by server port."""
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        verdicts: list[verifier_pb2.Verdict] = []
        token = ""
        while True:
            page = stub.ListVerdicts(
                verifier_pb2.ListVerdictsRequest(page_size=500, page_token=token), timeout=10
            )
            verdicts.extend(page.verdicts)
            token = page.next_page_token
            if not token:
                break
        rows = []
        for verdict in verdicts:
            record = stub.GetRecord(
                verifier_pb2.GetRecordRequest(record_id=verdict.record_id), timeout=10
            ).record
            rows.append(
                VerdictRow(
                    record_id=verdict.record_id,
                    seq=verdict.seq,
                    prover="honest" if record.flow.server_port == honest_port else "dishonest",
                    tokens=verdict.token_count,
                    changed=verdict.token_count - verdict.exact_matches,
                    score=verdict.score,
                    status=_status_name(verdict.status),
                    reason=verdict.reason,
                    threshold=verdict.settings.threshold,
                )
            )
    return rows


def count_terminal(address: str) -> int:
    """Verdicts in a final state so far (0 while the daemon does not answer)."""
    try:
        with grpc.insecure_channel(address) as channel:
            stub = verifier_pb2_grpc.VerifierServiceStub(channel)
            stats = stub.GetStats(verifier_pb2.GetStatsRequest(), timeout=5)
    except grpc.RpcError:
        return 0
    names = {verifier_pb2.VerdictStatus.Name(status) for status in TERMINAL}
    return sum(count for status, count in stats.verdicts_by_status.items() if status in names)


def settings_in_force(address: str, model: str) -> tuple[DifrSettings, DifrSettings]:
    """(committed, in force) DiFR settings of the commitment serving ``model``."""
    with grpc.insecure_channel(address) as channel:
        stub = verifier_pb2_grpc.VerifierServiceStub(channel)
        listed = stub.ListCommitments(verifier_pb2.ListCommitmentsRequest(), timeout=10)
    for commitment in listed.commitments:
        if model in commitment.served_model_names:
            return (
                DifrSettings.from_proto(commitment.committed_settings),
                DifrSettings.from_proto(commitment.settings),
            )
    raise LookupError(f"verifierd lists no commitment serving {model!r}")


def check_outcome(result: DemoResult) -> list[str]:
    """What went wrong, if anything.

    Honest seeded traffic must PASS and dishonest FAIL (unseeded requests are
    UNVERIFIABLE(no_seed) and not judged), the calibration must have changed the
    settings in force, and every judged verdict must carry the calibrated threshold.
    """
    problems = []
    calibration = result.calibration
    if calibration.in_force == calibration.committed:
        problems.append("verifierd still runs with the committed settings: calibration not applied")
    every = (*result.calibration_rows, *result.rows)
    for row in every:
        if row.status == "UNVERIFIABLE" and row.reason == "no_seed":
            continue
        expected = "PASS" if row.prover == "honest" else "FAIL"
        if row.status != expected:
            problems.append(f"{row.record_id} from the {row.prover} prover: {row.status}")
    if result.metrics.collector_records < len(every):
        problems.append(
            f"the collector's /metrics counted {result.metrics.collector_records:g} records, "
            f"fewer than the {len(every)} verdicts"
        )
    counted = {status.upper(): n for status, n in result.metrics.verifier_verdicts.items() if n}
    shown = {
        name: float(sum(r.status == name for r in every)) for name in map(_status_name, TERMINAL)
    }
    if counted != {status: n for status, n in shown.items() if n}:
        problems.append(f"verifierd's /metrics counted verdicts {counted}, the API shows {shown}")
    for row in result.rows:
        if row.status in ("PASS", "FAIL") and row.threshold != calibration.in_force.threshold:
            problems.append(
                f"{row.record_id} was judged with threshold {row.threshold:g}, "
                f"not the calibrated {calibration.in_force.threshold:g}"
            )
    return problems


def margins(rows: Sequence[VerdictRow], threshold: float) -> Margins:
    """The closest scores on either side of the threshold among scored responses."""
    scored = [r for r in rows if r.status in ("PASS", "FAIL")]
    honest = [r.score for r in scored if r.prover == "honest"]
    dishonest = [r for r in scored if r.prover == "dishonest"]
    least = min(dishonest, key=lambda r: (r.changed, r.tokens), default=None)
    return Margins(
        threshold=threshold,
        max_honest=max(honest) if honest else None,
        min_dishonest=min(r.score for r in dishonest) if dishonest else None,
        fewest_changed=None if least is None else least.changed,
        fewest_changed_of=0 if least is None else least.tokens,
    )


def describe_margins(m: Margins) -> str:
    """One line per side: the closest score and how far from the threshold it is."""
    lines = []
    if m.min_dishonest is not None:
        ratio = m.min_dishonest / m.threshold if m.threshold > 0 else float("inf")
        lines.append(
            f"closest dishonest score {m.min_dishonest:.4g} = {ratio:.3g}x "
            f"the threshold {m.threshold:.4g}"
        )
    if m.fewest_changed is not None:
        lines.append(
            f"fewest changed tokens in a dishonest response: {m.fewest_changed} "
            f"of {m.fewest_changed_of}"
        )
    if m.max_honest is not None:
        lines.append(f"largest honest score {m.max_honest:.4g} (threshold {m.threshold:.4g})")
    return "\n".join(lines)


def format_table(rows: Sequence[VerdictRow]) -> str:
    header = f"{'record':<28} {'prover':<10} {'tokens':>6} {'changed':>7} {'score':>9}  verdict"
    lines = [header, "-" * len(header)]
    for row in sorted(rows, key=lambda r: (r.prover, r.record_id)):
        verdict = row.status + (f" ({row.reason})" if row.reason else "")
        lines.append(
            f"{row.record_id:<28} {row.prover:<10} {row.tokens:>6} {row.changed:>7} "
            f"{row.score:>9.4g}  {verdict}"
        )
    return "\n".join(lines)
