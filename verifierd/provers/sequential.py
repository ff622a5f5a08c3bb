"""A sequential test per prover over its pooled per-token Token-DiFR margins.

Pure numpy, no I/O, no clock of its own: the caller passes the verifier's time.
A prover's evidence is a `SequentialState`; `update` folds in the margins of
one scored response (or several) and returns a new state; `crossed` says
whether the test has ever raised its alarm (sticky). States serialise to JSON.

**The statistic.** Margins are clipped at Δmax like scoring does (+inf, a
claimed token outside the mask, counts as Δmax). For levels c_1 < ... < c_K
(below Δmax) the commitment's honest traffic gives upper bounds q_k on the
honest per-token rate P(m > c_k) (`HonestTails`, `SequentialTest`). For each
level k and bet fraction f in F = {2^-1, ..., 2^-16} a token contributes the
factor

    e_{k,f}(m) = 1 - f + f * [m > c_k] / q_k,

and the e-value after n pooled tokens is the fixed mixture

    E_n = sum_{k,f} w * prod_{i<=n} e_{k,f}(m_i),    w = 1 / (K * |F|).

It depends only on n and on how many tokens exceeded each level, so a state is
a few integers, and the e-value is the same whatever the order of the tokens
and however they are split into updates. The alarm is raised at the first token
n with E_n >= 1 / (alpha * d), d the day (below) of the update that scores it,
or at the start of an update whose new day lowers the threshold under the
evidence already pooled. Tokens are checked one by one in the order given, so
splitting updates never changes when it is raised (within one day), and
reordering can only move it.

**The bound.** Null hypothesis (an honest prover): for every scored token i and
level k, P(m_i > c_k | everything before token i) <= q_k. Then each factor
e_{k,f} >= 0 has conditional mean 1 - f + f * P(m_i > c_k | ...) / q_k <= 1,
so each product is a nonnegative supermartingale starting at 1, and so is
their fixed mixture E_n. Ville's inequality: P(exists n: E_n >= b) <= 1 / b.

"alpha per prover per day": day d(t) = max(1, ceil((t - t_0) / 86400 s)),
t_0 the verifier's time when the prover's test started (first seen, or the
admin's clear), t the verifier's time when a token is scored. The alarm
threshold 1 / (alpha * d) never rises, so an alarm raised at a token scored
within the first D days had E_n >= 1 / (alpha * d) >= 1 / (alpha * D), and

    P(an honest prover alarms within its first D days) <= alpha * D

for every D, whatever the amount and timing of its traffic: the false-alarm
budget accrues alpha per day. (Restarting the test every day gives the same
bound by a union over days, but throws the evidence away at each restart.)
When an admin clears an alarm the prover starts a fresh state, whose bound
counts from the clear.

**Where q_k come from.** Calibration counted n_k of N honest tokens with
margin > c_k. q_k is the binomial Chernoff upper confidence bound at miss
delta / K: the largest q with N * KL(n_k / N || q) <= ln(K / delta), so an
honest rate above q_k would have produced at most n_k exceedances with
probability <= delta / K. Treating the calibration tokens as independent draws
of the honest margin distribution, every q_k holds with probability >= 1 -
delta, and overall P(false alarm within D days) <= delta + alpha * D. Both
default to 1e-6. The assumption is what calibration must make true: the honest
traffic it recomputes must come from the deployment's own engine and dtype
(bfloat16 noise, GPU batch shapes), since more frequent honest noise than
calibration saw is outside the null. So is honest noise that clusters within
responses, which both the per-token null and the calibration's independence
leave out: bfloat16 near-ties on a trained model do (bench/RESULTS.md,
prover_alarms), and there the bound is not guaranteed.

**Robustness.** float32 reproduction is exact, so every honest margin is 0,
q_1 ~ ln(K / delta) / N at c_1 = 0 and any changed token is evidence. bfloat16
gives honest margins above 0: the levels honest noise reaches get large q_k
(little evidence), those above it keep small ones; a level whose q_k is not
below that of the level under it adds nothing and is dropped. Honest
out-of-mask tokens count at every level in calibration as in the test. One
token can multiply E by at most 1 / q_k, so an alarm needs about
ln(1 / alpha) / ln(1 / q) exceeding tokens, whatever their margins.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from verifierd.errors import VerifierdError

#: Margin levels the honest tails are counted at (those below Δmax are used).
LEVELS: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: Bet fractions f of the mixture.
BET_FRACTIONS: tuple[float, ...] = tuple(2.0**-j for j in range(1, 17))
DEFAULT_FALSE_ALARM_PER_DAY = 1e-6
DEFAULT_CALIBRATION_MISS = 1e-6
SECONDS_PER_DAY = 86400.0
#: Version of the JSON form of `SequentialState`.
STATE_FORMAT = 1
_BISECTION_STEPS = 200


class SequentialTestError(VerifierdError):
    """Invalid input to the sequential test."""


def clipped(margins: npt.ArrayLike, delta_max: float) -> npt.NDArray[np.float64]:
    """Margins as float64 clipped at ``delta_max`` (+inf -> delta_max); NaN or a
    negative margin is an error (Token-DiFR margins are >= 0)."""
    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    if np.isnan(m).any() or (m < 0).any():
        raise SequentialTestError("margins must be >= 0 (NaN or negative given)")
    return np.minimum(m, delta_max)


@dataclass(frozen=True)
class HonestTails:
    """How many of the honest calibration tokens had a margin above each level."""

    delta_max: float
    tokens: int
    levels: tuple[float, ...]
    exceedances: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta_max) and self.delta_max > 0):
            raise SequentialTestError(f"delta_max must be finite and > 0: {self.delta_max}")
        if len(self.levels) != len(self.exceedances) or not self.levels:
            raise SequentialTestError("need one exceedance count per level")
        if list(self.levels) != sorted(set(self.levels)) or self.levels[-1] >= self.delta_max:
            raise SequentialTestError("levels must increase and stay below delta_max")
        if not all(self.tokens >= n >= 0 for n in self.exceedances):
            raise SequentialTestError("exceedance counts must be in [0, tokens]")

    @classmethod
    def from_margins(
        cls,
        honest: Sequence[npt.ArrayLike],
        delta_max: float,
        levels: Sequence[float] = LEVELS,
    ) -> HonestTails:
        """Count the honest raw margins (+inf = outside the mask) above each level
        below ``delta_max``, after clipping at it."""
        kept = tuple(c for c in levels if c < delta_max)
        parts = [clipped(m, delta_max) for m in honest]
        m = np.concatenate(parts) if parts else np.zeros(0)
        return cls(
            delta_max=delta_max,
            tokens=int(m.size),
            levels=kept,
            exceedances=tuple(int(np.count_nonzero(m > c)) for c in kept),
        )


def tail_upper_bound(exceedances: int, tokens: int, miss: float) -> float:
    """The largest rate q >= n / N with N * KL(n / N || q) <= ln(1 / miss): a rate
    above it yields at most n exceedances in N tokens with probability <= miss
    (Chernoff). 1.0 when N = 0."""
    if tokens == 0:
        return 1.0
    p, budget = exceedances / tokens, math.log(1 / miss) / tokens

    def kl(q: float) -> float:
        out = (1 - p) * math.log((1 - p) / (1 - q)) if p < 1 else 0.0
        return out + (p * math.log(p / q) if p > 0 else 0.0)

    lo, hi = p, 1.0
    for _ in range(_BISECTION_STEPS):
        mid = (lo + hi) / 2
        if mid >= 1.0 or kl(mid) > budget:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class SequentialTest:
    """The fixed parameters of a prover's test: levels, their honest rate bounds
    q_k (decreasing, each < 1) and the false-alarm probability per day."""

    false_alarm_per_day: float
    delta_max: float
    levels: tuple[float, ...]
    tails: tuple[float, ...]

    def __post_init__(self) -> None:
        if not 0 < self.false_alarm_per_day < 1:
            raise SequentialTestError(
                f"false alarm per day must be in (0, 1): {self.false_alarm_per_day}"
            )
        if not self.levels or len(self.levels) != len(self.tails):
            raise SequentialTestError("need one tail bound per level")
        if list(self.levels) != sorted(set(self.levels)) or self.levels[-1] >= self.delta_max:
            raise SequentialTestError("levels must increase and stay below delta_max")
        if not all(0 < q < 1 for q in self.tails) or list(self.tails) != sorted(
            set(self.tails), reverse=True
        ):
            raise SequentialTestError("tail bounds must decrease within (0, 1)")

    @classmethod
    def from_honest(
        cls,
        honest: HonestTails,
        *,
        false_alarm_per_day: float = DEFAULT_FALSE_ALARM_PER_DAY,
        calibration_miss: float = DEFAULT_CALIBRATION_MISS,
    ) -> SequentialTest:
        """Bound each level's honest rate (miss ``calibration_miss`` / levels in
        all) and keep the levels whose bound is below that of every lower one."""
        miss = calibration_miss / len(honest.levels)
        levels: list[float] = []
        tails: list[float] = []
        for c, n in zip(honest.levels, honest.exceedances, strict=True):
            q = tail_upper_bound(n, honest.tokens, miss)
            if q < (tails[-1] if tails else 1.0):
                levels.append(c)
                tails.append(q)
        if not levels:
            raise SequentialTestError("the honest margins leave no level to test at")
        return cls(false_alarm_per_day, honest.delta_max, tuple(levels), tuple(tails))

    def log_threshold(self, day: int) -> float:
        """ln(1 / (alpha * day)): the alarm level of log E on that day (1-based)."""
        return -math.log(self.false_alarm_per_day) - math.log(day)

    def log_e_values(
        self, tokens: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """ln E after ``tokens`` [n] pooled tokens with ``counts`` [n, K] of them
        above each level."""
        f = np.asarray(BET_FRACTIONS)
        q = np.asarray(self.tails)
        miss = np.log1p(-f)
        hit = np.log1p(f[None, :] * (1 / q[:, None] - 1))
        s = counts.astype(np.float64)[:, :, None]
        t = tokens.astype(np.float64)[:, None, None]
        terms = ((t - s) * miss[None, None, :] + s * hit[None, :, :]).reshape(len(tokens), -1)
        top = terms.max(axis=1)
        weight = math.log(terms.shape[1])
        out: npt.NDArray[np.float64] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
        return out - weight


@dataclass(frozen=True)
class Alarm:
    """Where the e-value first crossed its threshold."""

    #: Verifier time (seconds) of the update that crossed.
    at: float
    #: Day of the prover's test (1-based) at that time.
    day: int
    #: Pooled tokens up to and including the one that crossed.
    token: int
    log_e_value: float
    log_threshold: float


@dataclass(frozen=True)
class SequentialState:
    """A prover's evidence: its test, when the test started, the pooled tokens,
    how many exceeded each level, and the alarm once raised (sticky)."""

    test: SequentialTest
    started_at: float
    tokens: int
    exceedances: tuple[int, ...]
    alarm: Alarm | None = None

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": STATE_FORMAT,
                "test": {
                    "false_alarm_per_day": self.test.false_alarm_per_day,
                    "delta_max": self.test.delta_max,
                    "levels": list(self.test.levels),
                    "tails": list(self.test.tails),
                },
                "started_at": self.started_at,
                "tokens": self.tokens,
                "exceedances": list(self.exceedances),
                "alarm": None if self.alarm is None else asdict(self.alarm),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SequentialState:
        try:
            d: dict[str, Any] = json.loads(text)
            if d["format"] != STATE_FORMAT:
                raise SequentialTestError(f"unknown state format {d['format']!r}")
            t = d["test"]
            test = SequentialTest(
                float(t["false_alarm_per_day"]),
                float(t["delta_max"]),
                tuple(float(c) for c in t["levels"]),
                tuple(float(q) for q in t["tails"]),
            )
            a = d["alarm"]
            alarm = (
                None
                if a is None
                else Alarm(
                    float(a["at"]),
                    int(a["day"]),
                    int(a["token"]),
                    float(a["log_e_value"]),
                    float(a["log_threshold"]),
                )
            )
            state = cls(
                test,
                float(d["started_at"]),
                int(d["tokens"]),
                tuple(int(n) for n in d["exceedances"]),
                alarm,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SequentialTestError(f"not a sequential test state: {exc}") from exc
        if len(state.exceedances) != len(test.levels):
            raise SequentialTestError("one exceedance count per level needed")
        return state


def start(test: SequentialTest, at: float) -> SequentialState:
    """A prover's test with no evidence yet, started at verifier time ``at``."""
    return SequentialState(test, at, 0, (0,) * len(test.levels))


def day_of(state: SequentialState, at: float) -> int:
    """The day (1-based) of ``state``'s test at verifier time ``at``."""
    return max(1, math.ceil((at - state.started_at) / SECONDS_PER_DAY))


def log_bound(state: SequentialState, at: float) -> float:
    """The alarm level of `log_e_value` at verifier time ``at``."""
    return state.test.log_threshold(day_of(state, at))


def update(state: SequentialState, margins: npt.ArrayLike, at: float) -> SequentialState:
    """Fold in ``margins`` (raw or clipped, in scoring order) scored at verifier
    time ``at``; the alarm is raised at the first of them whose e-value reaches
    the threshold of ``at``'s day."""
    test = state.test
    m = clipped(margins, test.delta_max)
    above = m[:, None] > np.asarray(test.levels)[None, :]
    counts = np.asarray(state.exceedances, dtype=np.int64) + np.cumsum(above, axis=0)
    alarm = state.alarm
    if alarm is None:
        # E can rise only at a token above the lowest level, so those are checked,
        # and the evidence so far, against today's threshold (a new day lowers it).
        rises = np.flatnonzero(above[:, 0])
        tokens = np.concatenate([[state.tokens], state.tokens + rises + 1]).astype(np.int64)
        log_e = test.log_e_values(tokens, np.vstack([state.exceedances, counts[rises]]))
        day = day_of(state, at)
        level = test.log_threshold(day)
        hits = np.flatnonzero((log_e >= level) & (tokens > 0))
        if hits.size:
            first = int(hits[0])
            alarm = Alarm(at, day, int(tokens[first]), float(log_e[first]), level)
    exceedances = tuple(int(n) for n in counts[-1]) if m.size else state.exceedances
    return replace(state, tokens=state.tokens + int(m.size), exceedances=exceedances, alarm=alarm)


def log_e_value(state: SequentialState) -> float:
    """ln E of all the evidence so far (0 before any token)."""
    return float(
        state.test.log_e_values(
            np.array([state.tokens], dtype=np.int64),
            np.array([state.exceedances], dtype=np.int64),
        )[0]
    )


def crossed(state: SequentialState) -> bool:
    """Whether the alarm has been raised (it stays raised)."""
    return state.alarm is not None
