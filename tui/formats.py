"""How the console writes times, ages, sizes, ids, statuses and scores: pure functions.

Every string the daemons send may come from the prover (model names, prompts, responses,
error messages): the console shows it through :func:`shown`, as a Rich ``Text`` (never
parsed as markup) with its control and bidi characters escaped.
"""

from __future__ import annotations

import datetime
import json
import math

from rich.text import Text
from veritap.control_chars import escape_controls
from veritap.v1 import record_pb2, verifier_pb2

_STATUS_PREFIX = "VERDICT_STATUS_"
_ENGINE_PREFIX = "ENGINE_STATE_"
_ALARM_PREFIX = "ALARM_KIND_"


def shown(text: str, style: str = "") -> Text:
    """Captured or remote ``text`` as the console shows it: literally, never as markup,
    with what a terminal would act on escaped (``\\x1b``, ``\\u202e``)."""
    return Text(escape_controls(text), style=style)


def utc_time(ns: int) -> str:
    """``MM-DD HH:MM:SS`` in UTC ("—" for 0): the same on every operator's terminal."""
    if ns <= 0:
        return "—"
    when = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.UTC)
    return when.strftime("%m-%d %H:%M:%S")


def age(ns: int) -> str:
    """A coarse age: "<1m", "12m", "3h05m", "2d04h"."""
    minutes = max(0, ns) // 60_000_000_000
    if minutes < 1:
        return "<1m"
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def count(n: int) -> str:
    """Thousands separated by a thin space, so wide numbers stay readable."""
    return f"{n:,}".replace(",", "\u2009")


def short_id(hex_id: str, width: int = 12) -> str:
    return hex_id[:width] if hex_id else "—"


def status_name(status: verifier_pb2.VerdictStatus.ValueType) -> str:
    """PASS, FAIL, UNVERIFIABLE, ... (from VerdictStatus)."""
    return verifier_pb2.VerdictStatus.Name(status).removeprefix(_STATUS_PREFIX)


def engine_state_name(state: verifier_pb2.EngineState.ValueType) -> str:
    return verifier_pb2.EngineState.Name(state).removeprefix(_ENGINE_PREFIX)


def score(verdict: verifier_pb2.Verdict) -> str:
    """The DiFR score, or the reason when the record was not scored."""
    if verdict.status in (verifier_pb2.VERDICT_STATUS_PASS, verifier_pb2.VERDICT_STATUS_FAIL):
        return f"{verdict.score:.3f}"
    return verdict.reason or "—"


def rate(per_second: float) -> str:
    if not math.isfinite(per_second):
        return "—"
    return f"{per_second:.1f}/s" if per_second < 100 else f"{per_second:.0f}/s"


def checkpoint_line(verdict: verifier_pb2.Verdict) -> str:
    """The collector's signed checkpoint that authenticated the verdict's entry: its tree
    size and the full Merkle root in hex, to compare with the collector's own checkpoint
    ("—" for a verdict that names none)."""
    if not verdict.checkpoint_tree_size:
        return "—"
    root = verdict.checkpoint_root_hash.hex()
    return f"tree size {count(verdict.checkpoint_tree_size)}, root {root}"


def logprobs_line(verdict: verifier_pb2.Verdict) -> str:
    """The response's stated logprobs against the verifier's: the largest deviation and the
    tolerance it was judged by ("—" when none were stated or compared)."""
    if not verdict.HasField("logprobs_deviation"):
        return "—"
    deviation = verdict.logprobs_deviation
    if not verdict.settings.HasField("logprobs_tolerance"):
        return f"largest deviation {deviation:.3g} (the commitment's default tolerance)"
    tolerance = verdict.settings.logprobs_tolerance
    relation = ">" if deviation > tolerance else "≤"
    return f"largest deviation {deviation:.3g} {relation} tolerance {tolerance:g}"


def reason_line(verdict: verifier_pb2.Verdict) -> str:
    """The verdict's reason and detail: a FAIL's evidence, why a record is UNVERIFIABLE, or
    what a PASS that scored no output token rests on ("" when it has neither)."""
    return ": ".join(part for part in (verdict.reason, verdict.detail) if part)


def superseded_line(verdict: verifier_pb2.Verdict) -> str:
    """What the verdict a record_amended one superseded said: status, reason, score, when,
    and the start of the SHA-256 of its signed bytes (kept in the verifier's history)."""
    was = verdict.supersedes
    said = status_name(was.status) + (f" ({was.reason})" if was.reason else "")
    if was.status in (verifier_pb2.VERDICT_STATUS_PASS, verifier_pb2.VERDICT_STATUS_FAIL):
        said += f" {was.score:.3f}"
    return (
        f"{said}, decided {utc_time(was.decided_at_ns)} UTC, signed verdict sha256 "
        f"{was.signed_sha256.hex()[:16]}"
    )


def settings_line(settings: verifier_pb2.DifrSettings) -> str:
    return (
        f"threshold {settings.threshold:g}  Δmax {settings.delta_max:g}  "
        f"sample {settings.sample_rate:g}"
    )


def prompt_text(record: record_pb2.InferenceRecord) -> str:
    """The request's prompt as a person reads it: chat messages one per paragraph."""
    try:
        prompt = json.loads(record.api.prompt_json) if record.api.prompt_json else ""
    except json.JSONDecodeError:
        return record.api.prompt_json
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
        parts = []
        for message in prompt:
            content = message.get("content", "")
            if isinstance(content, list):  # content parts: keep the text ones
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(f"{message.get('role', '?')}: {content}")
        return "\n".join(parts)
    if isinstance(prompt, str):
        return prompt
    return json.dumps(prompt, ensure_ascii=False)


def prover_label(prover: verifier_pb2.ProverId) -> str:
    """``origin/address:port`` (``[v6]:port`` for IPv6), as verifierd's CLI and metrics
    name a prover."""
    address = prover.server_address
    host = f"[{address}]" if ":" in address else address
    return f"{prover.origin}/{host}:{prover.server_port}"


def alarm_kind_name(kind: verifier_pb2.AlarmKind.ValueType) -> str:
    """DISHONEST or HIDING (from AlarmKind)."""
    return verifier_pb2.AlarmKind.Name(kind).removeprefix(_ALARM_PREFIX)


def alarm_line(alarm: verifier_pb2.ProverAlarm) -> str:
    """What an alarm says, in one line: kind, reason, when, and the evidence against its
    bound (the test statistic, or the unverifiable share over its window)."""
    raised = f"{utc_time(alarm.raised_at_ns)} UTC"
    if alarm.kind == verifier_pb2.ALARM_KIND_HIDING:
        window = age(alarm.window_s * 1_000_000_000)
        return (
            f"HIDING {alarm.reason}: {alarm.statistic:.0%} of verdicts over {window} "
            f"> {alarm.bound:.0%}, since {raised}"
        )
    return (
        f"{alarm_kind_name(alarm.kind)}: ln e {alarm.statistic:.1f} ≥ {alarm.bound:.1f} "
        f"after {count(alarm.pooled_tokens)} tokens, since {raised}"
    )
