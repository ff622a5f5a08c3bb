"""A sequential test per prover over its pooled per-token Token-DiFR margins.

Pure numpy, no I/O, no clock of its own: the caller passes the verifier's time.
A prover's evidence is a `SequentialState`; `update` folds in the margins of
one scored response and returns a new state; `crossed` says whether the test
has ever raised its alarm (sticky). States serialise to JSON.

**Units.** Margins are clipped at Δmax like scoring does (+inf, a claimed token
outside the mask, counts as Δmax). For levels c_1 < ... < c_K (below Δmax) a
*unit* exceeds level k when it holds a margin > c_k. Each level has its unit:
the token where calibration saw no honest response with two tokens above c_k
(float32: reproduction is exact, every honest margin 0; bfloat16 above the
levels its near-tie flips reach), and the response otherwise (bfloat16 below
them: a near-tie prompt flips several tokens of one response by small margins,
so honest exceedances of a low level cluster and its tokens are not
independent; responses are). Tokens above c_k are above every lower level, so
the per-token levels are the top ones, c_k0 < ... < c_K, and a token above c_k0
makes its response exceed every per-response level. The calibration measured
N_k honest units of level k's kind, n_k of them exceeding it; the prover has
pooled u_k, s_k of them exceeding (`HonestTails`, `SequentialTest`).

**The statistic.** One level, rates p in [0, 1]. For a rate p let L_cal(p) be
the likelihood of the calibration's counts (N, n) and, for each rate r_j of
R = {2^-1, ..., 2^-20}, r'_j(p) = max(r_j, p). Then

    M(p) = A / L_cal(p) * sum_j w_j * prod_{i<=u} (r'_j/p)^[x_i] ((1-r'_j)/(1-p))^(1-[x_i]),

x_i the prover's i-th unit exceeding or not, w_j fixed weights summing to 1
(`PROVER_WEIGHTS`), and A = 1/2 [n = 0] + 1/2 mean over rates 2^-1, ...,
2^-48 of their likelihood of (N, n): a probability distribution over the
calibration's outcomes, fixed before it ran.
The level's e-value is a lower bound of inf over p of M(p), computed exactly
per interval between consecutive rates of R (each term of M is monotone or
log-concave in p there); E is the mean of the levels' e-values. It depends only
on (N_k, n_k) and (u_k, s_k), so a state is a few integers and the evidence is
the same whatever the order of the tokens within a response. At fixed p every
factor of a unit that does not exceed is <= 1, so E rises only where a unit
exceeds, and the alarm, raised at the first check with E >= 1 / (alpha * d), d
the day of the update that scores it (or at the start of an update whose new
day lowers the threshold under the evidence already pooled), is checked there:
at each token above c_k0, with the response it ends counted as exceeding every
per-response level (which that token already decides), and at the end of a
response that exceeded c_1. Per token at every level, splitting updates never
changes when it is raised (within one day); where any level is per response,
one update is one response (the unit: a verdict's choices together). A response
whose verdict is withdrawn stays pooled as one that did not exceed (`withdraw`).

**The bound.** Null hypothesis (an honest prover), per level k: its unit is one
honest noise is independent in, i.e. there is a rate p*_k such that the
calibration's units of level k's kind were independent draws exceeding c_k with
rate p*_k, and each of the prover's units exceeds it with rate <= p*_k given
everything before it (per token: every earlier token, those of its own response
included; per response: every earlier response). For p = p*_k each product
above is a nonnegative supermartingale in its units (r'_j >= p*: a unit's
factor has conditional mean 1 - (1 - rate/p*)(r'_j - p*)/(1 - p*) <= 1) and the
calibration's factor A / L_cal(p*) has mean sum over outcomes of A = 1; so each
level's M_k(p*_k) is a nonnegative supermartingale whose start has mean 1, above
its e-value at every unit. The levels' units differ, so the time is the
prover's responses. Let b be the threshold, t the first check with E >= b (a
stopping time in the tokens: what a check reads is decided by then) and m_t the
response holding t; Z_m is the mean over k of M_k(p*_k), a per-token level's
after min(end of response m, t) tokens, a per-response level's after
min(m, m_t) responses. A per-token M_k stopped at t and sampled at the
responses' ends (stopping times) is a nonnegative supermartingale by optional
sampling; a per-response one, stopped after m_t, is one in the responses (on
t beyond response m, response m + 1 counts whole either way); so Z is a
nonnegative supermartingale in the responses whose start has mean 1. Z_{m_t}
is at least the E checked at t: at a response's end by definition, and at a
token above c_k0, the check's count of response m_t as exceeding every
per-response level is what that token decided. So an alarm means Z_m >= b for
some m, and Ville's inequality: P(exists m: Z_m >= b) <= 1 / b. No check is
made at a token inside a response that is not above c_k0: the response's
per-response factors are not decided there. With every level per token this is
the test in the tokens, with every level per response the test in the
responses.

"alpha per day" of one test (alpha its `SequentialTest.false_alarm_per_day`,
the prover's share below): day d(t) = max(1, ceil((t - t_0) / 86400 s)),
t_0 the verifier's time when the prover's test started (first seen, or the
admin's clear), t the verifier's time when a token is scored. The alarm
threshold 1 / (alpha * d) never rises, so an alarm raised at a unit scored
within the first D days had E >= 1 / (alpha * d) >= 1 / (alpha * D), and

    P(a test of an honest prover alarms within its first D days) <= alpha * D

for every D, whatever the amount and timing of its traffic: the false-alarm
budget accrues alpha per day (default 1e-6). The calibration is inside the
bound (no separate miss probability for its counts): what calibration must
make true is the null, i.e. the honest traffic it recomputes must come from the
deployment's own engine and dtype (bfloat16 noise, GPU batch shapes), since
more frequent honest noise than calibration saw is outside it; at a per-token
level, so is honest noise that clusters within responses above it, which is why
a level at which calibration saw any cluster is tested per response. The unit
is read off the same calibration, so a level whose honest tokens do cluster
although calibration saw no cluster there is outside it too: calibration must
be large enough to show the engine's clusters (its near-tie flips) where they
occur. Tails stored before clusters were counted per level
(`HonestTails.clusters` None) saw a cluster at the lowest level and test every
level per response, as they did. When an admin clears an alarm the prover
starts a fresh state, whose bound counts from the clear.

**Per prover, across its commitments.** A prover may serve several commitments
(models behind one address and port, a model re-committed), each with a test of
its own, and a cleared or restarted test is a new one. So the prover's tests are
numbered j = 1, 2, ... in the order they start (first sight of a commitment, a
clear, a restart of an earlier format; stored durably, never reused), and test j
runs at alpha * v_j with v_j = 6 / (pi^2 j^2) (`alpha_share`; sum_j v_j = 1).
Test j, from the first calibration on, is a nonnegative supermartingale whose
start has mean 1 when it is taken as constant until its start (a stopping time:
when the commitment is first scored, or when its previous test alarmed and was
cleared): Ville bounds its crossing 1 / (alpha v_j D) by alpha v_j D whatever
came before it. A test started within the prover's first D days has counted at
most D days, so by the union bound over tests

    P(an honest prover alarms within its first D days) <= sum_j alpha v_j D <= alpha D,

the expected number of its false alarms too, for any number of commitments and
clears: over its lifetime an honest prover is accused at most alpha per day of
it, not alpha per day per commitment. The price is the threshold: the j-th test
needs ln(1 / v_j) more (0.5 for the first, 1.9 for the second, 2.7 for the third).

**Power.** Per token with N exact honest tokens (n = 0), s exceeding tokens
among u give ln E ~ s ln(N / (e u)) - ln(1 / w_j) - ln 2 - ln K at best, w_j
the weight of the rate nearest s / u and K the levels (at N = 150,000, one level, 3
such tokens within ~1,000 alarm): the calibration's tokens and the prover's are
judged together, so an honest rate high enough to explain s exceedances in u
tokens would have shown in N. A level whose count is not below that of the
level under it in the same unit adds nothing and is dropped. Per response, one
response is worth at most ~ln(N / n) whatever its margins: where every level
is per response (a cluster at every level, or tails of the earlier format), a
commitment needs tens of responses to alarm; where the levels above the honest
flips' margins are per token (bfloat16), a prover whose changed tokens exceed
them is judged per token there, at the price ln K of the mean over levels,
while changes that stay below them count per response.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from enum import StrEnum
from typing import Any

import numpy as np
import numpy.typing as npt

from verifierd.errors import VerifierdError

#: Margin levels the honest tails are counted at (those below Δmax are used).
LEVELS: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)
#: Rates of the prover's alternatives (the mixture R), and their weights: 4/5 on the
#: rates 2^-6..2^-10 (1.6% to 0.1% of units changed), whose evidence accrues slowly;
#: a higher rate crosses within a few units whatever its weight.
PROVER_RATES: tuple[float, ...] = tuple(2.0**-j for j in range(1, 21))
PROVER_WEIGHTS: tuple[float, ...] = tuple(
    0.8 / 5 if 6 <= j <= 10 else 0.2 / 15 for j in range(1, 21)
)
#: Rates of the calibration's reference distribution A (besides rate 0).
CALIBRATION_RATES: tuple[float, ...] = tuple(2.0**-j for j in range(1, 49))
DEFAULT_FALSE_ALARM_PER_DAY = 1e-6
SECONDS_PER_DAY = 86400.0
#: Version of the JSON form of `SequentialState`, and those it reads (2: one unit for
#: every level).
STATE_FORMAT = 3
READ_FORMATS = (2, 3)

Counts = npt.NDArray[np.float64]


class Unit(StrEnum):
    """What the test counts as one independent observation."""

    TOKEN = "token"
    RESPONSE = "response"


class SequentialTestError(VerifierdError):
    """Invalid input to the sequential test."""


class StateFormatError(SequentialTestError):
    """A state written by another version of the test (its evidence does not carry over)."""


def clipped(margins: npt.ArrayLike, delta_max: float) -> npt.NDArray[np.float64]:
    """Margins as float64 clipped at ``delta_max`` (+inf -> delta_max); NaN or a
    negative margin is an error (Token-DiFR margins are >= 0)."""
    m = np.asarray(margins, dtype=np.float64).reshape(-1)
    if np.isnan(m).any() or (m < 0).any():
        raise SequentialTestError("margins must be >= 0 (NaN or negative given)")
    return np.minimum(m, delta_max)


def _check_levels(levels: Sequence[float], delta_max: float) -> None:
    if not levels or list(levels) != sorted(set(levels)) or levels[-1] >= delta_max:
        raise SequentialTestError("levels must increase and stay below delta_max")


def _check_counts(
    counts: Sequence[int], levels: Sequence[float], units: int | Sequence[int]
) -> None:
    """One count per level, each in [0, units] (``units``: per level, or for all)."""
    sizes = [units] * len(levels) if isinstance(units, int) else list(units)
    if not len(counts) == len(sizes) == len(levels):
        raise SequentialTestError("need one count per level")
    if not all(size >= n >= 0 for n, size in zip(counts, sizes, strict=True)):
        raise SequentialTestError("counts must be in [0, units]")


@dataclass(frozen=True)
class HonestTails:
    """What calibration measured of the honest margins, per level: the tokens above
    it, the responses holding one, and the responses holding two or more (clusters;
    None for tails measured before clusters were counted per level, which saw one
    at the lowest level)."""

    delta_max: float
    tokens: int
    levels: tuple[float, ...]
    exceedances: tuple[int, ...]
    responses: int
    response_exceedances: tuple[int, ...]
    clusters: tuple[int, ...] | None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta_max) and self.delta_max > 0):
            raise SequentialTestError(f"delta_max must be finite and > 0: {self.delta_max}")
        _check_levels(self.levels, self.delta_max)
        _check_counts(self.exceedances, self.levels, self.tokens)
        _check_counts(self.response_exceedances, self.levels, self.responses)
        if self.responses > self.tokens:
            raise SequentialTestError("need responses <= tokens")
        if self.clusters is not None:
            _check_counts(self.clusters, self.levels, self.responses)
            if list(self.clusters) != sorted(self.clusters, reverse=True) or not all(
                2 * c <= n and c <= r
                for c, n, r in zip(
                    self.clusters, self.exceedances, self.response_exceedances, strict=True
                )
            ):
                raise SequentialTestError(
                    "clusters must not rise with the level, each of two tokens or more of a "
                    "response above it"
                )

    @classmethod
    def from_margins(
        cls,
        honest: Sequence[npt.ArrayLike],
        delta_max: float,
        levels: Sequence[float] = LEVELS,
    ) -> HonestTails:
        """Count the honest raw margins (one array per response; +inf = outside the
        mask) above each level below ``delta_max``, after clipping at it."""
        kept = tuple(c for c in levels if c < delta_max)
        parts = [np.asarray(m, dtype=np.float64).reshape(-1) for m in honest]
        sizes = np.array([p.size for p in parts if p.size], dtype=np.int64)
        m = clipped(np.concatenate(parts) if parts else np.zeros(0), delta_max)
        above = (m[:, None] > np.asarray(kept)[None, :]).astype(np.int64)
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        # Tokens above each level, per response: [responses, K].
        per_level = np.add.reduceat(above, starts, axis=0) if sizes.size else above[:0]
        return cls(
            delta_max=delta_max,
            tokens=int(m.size),
            levels=kept,
            exceedances=tuple(int(n) for n in per_level.sum(axis=0)),
            responses=int(sizes.size),
            response_exceedances=tuple(int(n) for n in (per_level > 0).sum(axis=0)),
            clusters=tuple(int(n) for n in (per_level > 1).sum(axis=0)),
        )

    def units(self) -> tuple[Unit, ...]:
        """Each level's unit: the token where no honest response held two tokens above
        it, else the response (every level, for tails without per-level clusters)."""
        if self.clusters is None:
            return (Unit.RESPONSE,) * len(self.levels)
        return tuple(Unit.RESPONSE if c else Unit.TOKEN for c in self.clusters)


def _xlogy(x: Counts, y: Counts) -> Counts:
    """x * ln(y), 0 where x == 0."""
    with np.errstate(divide="ignore"):
        out: Counts = np.where(x == 0, 0.0, x * np.log(np.where(x == 0, 1.0, y)))
    return out


def _log_likelihood(hits: Counts, units: Counts, p: Counts) -> Counts:
    """ln of p^hits (1 - p)^(units - hits)."""
    return _xlogy(hits, p) + _xlogy(units - hits, 1.0 - p)


def _logsumexp(a: Counts, axis: int) -> Counts:
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out: Counts = np.squeeze(top, axis) + np.log(np.sum(np.exp(a - top), axis=axis))
    return out


@dataclass(frozen=True)
class SequentialTest:
    """The fixed parameters of a prover's test: its levels, each level's unit (the
    per-response ones below the per-token ones), the honest calibration's units and
    counts per level, and the false-alarm probability per day."""

    false_alarm_per_day: float
    delta_max: float
    levels: tuple[float, ...]
    units: tuple[Unit, ...]
    calibration_units: tuple[int, ...]
    calibration_counts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 0 < self.false_alarm_per_day < 1:
            raise SequentialTestError(
                f"false alarm per day must be in (0, 1): {self.false_alarm_per_day}"
            )
        _check_levels(self.levels, self.delta_max)
        if not len(self.units) == len(self.calibration_units) == len(self.levels):
            raise SequentialTestError("need one unit and one calibration size per level")
        if list(self.units) != sorted(self.units, key=lambda u: u is Unit.TOKEN):
            raise SequentialTestError("per-response levels must lie below per-token ones")
        if min(self.calibration_units) < 1:
            raise SequentialTestError("the test needs calibrated units")
        _check_counts(self.calibration_counts, self.levels, self.calibration_units)
        for unit in Unit:
            counts = [
                n for u, n in zip(self.units, self.calibration_counts, strict=True) if u is unit
            ]
            if counts != sorted(set(counts), reverse=True):
                raise SequentialTestError("calibration counts must decrease with the level")

    @classmethod
    def from_honest(
        cls, honest: HonestTails, *, false_alarm_per_day: float = DEFAULT_FALSE_ALARM_PER_DAY
    ) -> SequentialTest:
        """The test of a commitment calibrated to ``honest``: each level per token where
        no honest response held a cluster above it, else per response; of each unit's
        levels, those whose count is below that of every lower one."""
        if honest.tokens < 1:
            raise SequentialTestError("the honest margins leave no level to test at")
        levels: list[float] = []
        units: list[Unit] = []
        sizes: list[int] = []
        kept: list[int] = []
        lowest: dict[Unit, int] = {}
        for c, unit, tokens_above, responses_above in zip(
            honest.levels,
            honest.units(),
            honest.exceedances,
            honest.response_exceedances,
            strict=True,
        ):
            n = tokens_above if unit is Unit.TOKEN else responses_above
            if unit not in lowest or n < lowest[unit]:
                lowest[unit] = n
                levels.append(c)
                units.append(unit)
                sizes.append(honest.tokens if unit is Unit.TOKEN else honest.responses)
                kept.append(n)
        return cls(
            false_alarm_per_day,
            honest.delta_max,
            tuple(levels),
            tuple(units),
            tuple(sizes),
            tuple(kept),
        )

    @property
    def per_token(self) -> npt.NDArray[np.bool_]:
        """Which levels are tested per token: [K]."""
        return np.array([u is Unit.TOKEN for u in self.units])

    @property
    def lowest_per_token(self) -> int:
        """Index of the lowest per-token level (the number of levels if none is)."""
        return len(self.units) - int(self.per_token.sum())

    def log_threshold(self, day: int) -> float:
        """ln(1 / (alpha * day)): the alarm level of log E on that day (1-based)."""
        return -math.log(self.false_alarm_per_day) - math.log(day)

    def log_e_values(
        self, units: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
    ) -> npt.NDArray[np.float64]:
        """ln E after ``units`` [n, K] pooled units of each level's kind with ``counts``
        [n, K] of them above the level."""
        big_n = np.asarray(self.calibration_units, dtype=np.float64)[:, None]  # [K, 1]
        small_n = np.asarray(self.calibration_counts, dtype=np.float64)[:, None]  # [K, 1]
        rates = np.asarray(PROVER_RATES)  # [J], decreasing
        weights = np.asarray(PROVER_WEIGHTS)
        # Interval i of p: [rates[i], 1] for i = 0, [rates[i], rates[i-1]], [0, rates[-1]]
        # for i = J; the alternatives r_j >= p there are the first i.
        lo = np.concatenate([rates, [0.0]])
        hi = np.concatenate([[1.0], rates])
        below = np.concatenate([np.cumsum(weights[::-1])[::-1], [0.0]])
        with np.errstate(divide="ignore"):
            others = np.log(np.minimum(below, 1.0))  # ln of the weight of the r_j < p
        cal_rates = np.asarray(CALIBRATION_RATES)
        cal_ll = _log_likelihood(small_n, big_n, cal_rates[None, :])  # [K, R]
        log_a = np.logaddexp(
            np.where(small_n[:, 0] == 0, math.log(0.5), -np.inf),
            math.log(0.5) + _logsumexp(cal_ll, axis=1) - math.log(cal_rates.size),
        )  # [K]
        cal_best = _log_likelihood(small_n, big_n, np.clip(small_n / big_n, lo, hi))  # [K, J+1]
        u = units.astype(np.float64)[:, :, None]  # [n, K, 1]
        s = counts.astype(np.float64)[:, :, None]  # [n, K, 1]
        prover = _log_likelihood(s, u, rates[None, None, :]) + np.log(weights)  # [n, K, J]
        mixed = np.concatenate(
            [np.full((*prover.shape[:2], 1), -np.inf), np.logaddexp.accumulate(prover, axis=2)],
            axis=2,
        )  # [n, K, J+1]: the first i alternatives
        hits, total = small_n[None] + s, big_n[None] + u
        joint = _log_likelihood(hits, total, np.clip(hits / total, lo, hi))  # [n, K, J+1]
        bound = np.logaddexp(others - cal_best, mixed - joint).min(axis=2)  # [n, K]
        out: npt.NDArray[np.float64] = _logsumexp(log_a[None, :] + bound, axis=1) - math.log(
            len(self.levels)
        )
        return out


@dataclass(frozen=True)
class Alarm:
    """Where the e-value first crossed its threshold."""

    #: Verifier time (seconds) of the update that crossed.
    at: float
    #: Day of the prover's test (1-based) at that time.
    day: int
    #: Pooled tokens up to and including the one that crossed (at a response's end:
    #: up to that end).
    token: int
    log_e_value: float
    log_threshold: float


@dataclass(frozen=True)
class SequentialState:
    """A prover's evidence: its test, when the test started, the pooled tokens and
    responses, how many units of each level's kind exceeded it, and the alarm once
    raised (sticky)."""

    test: SequentialTest
    started_at: float
    tokens: int
    responses: int
    exceedances: tuple[int, ...]
    alarm: Alarm | None = None

    @property
    def units(self) -> tuple[int, ...]:
        """Pooled units of each level's kind: tokens, or responses."""
        return tuple(self.tokens if u is Unit.TOKEN else self.responses for u in self.test.units)

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": STATE_FORMAT,
                "test": {
                    "false_alarm_per_day": self.test.false_alarm_per_day,
                    "delta_max": self.test.delta_max,
                    "levels": list(self.test.levels),
                    "units": [u.value for u in self.test.units],
                    "calibration_units": list(self.test.calibration_units),
                    "calibration_counts": list(self.test.calibration_counts),
                },
                "started_at": self.started_at,
                "tokens": self.tokens,
                "responses": self.responses,
                "exceedances": list(self.exceedances),
                "alarm": None if self.alarm is None else asdict(self.alarm),
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> SequentialState:
        """A state as `to_json` wrote it, or as the format before it did (one unit for
        every level: the same test, its evidence carried over)."""
        try:
            d: dict[str, Any] = json.loads(text)
            if d["format"] not in READ_FORMATS:
                raise StateFormatError(f"state format {d['format']!r}, not {STATE_FORMAT}")
            test = _test_from_json(d["test"], d["format"])
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
                int(d["responses"]),
                tuple(int(n) for n in d["exceedances"]),
                alarm,
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise SequentialTestError(f"not a sequential test state: {exc}") from exc
        _check_counts(state.exceedances, test.levels, state.units)
        return state


def _test_from_json(t: dict[str, Any], form: int) -> SequentialTest:
    """The test of a stored state; format 2 had one unit and calibration size for
    every level."""
    levels = tuple(float(c) for c in t["levels"])
    if form == 2:
        units = (Unit(t["unit"]),) * len(levels)
        sizes = (int(t["calibration_units"]),) * len(levels)
    else:
        units = tuple(Unit(u) for u in t["units"])
        sizes = tuple(int(n) for n in t["calibration_units"])
    return SequentialTest(
        float(t["false_alarm_per_day"]),
        float(t["delta_max"]),
        levels,
        units,
        sizes,
        tuple(int(n) for n in t["calibration_counts"]),
    )


def alpha_share(j: int) -> float:
    """v_j = 6 / (pi^2 j^2), the share of a prover's false-alarm probability its j-th
    test (1-based, in order of start) runs at; the shares of all j sum to 1."""
    if j < 1:
        raise SequentialTestError(f"tests are numbered from 1: {j}")
    return 6.0 / (math.pi**2 * j * j)


def start(test: SequentialTest, at: float) -> SequentialState:
    """A prover's test with no evidence yet, started at verifier time ``at``."""
    return SequentialState(test, at, 0, 0, (0,) * len(test.levels))


def day_of(state: SequentialState, at: float) -> int:
    """The day (1-based) of ``state``'s test at verifier time ``at``."""
    return max(1, math.ceil((at - state.started_at) / SECONDS_PER_DAY))


def log_bound(state: SequentialState, at: float) -> float:
    """The alarm level of `log_e_value` at verifier time ``at``."""
    return state.test.log_threshold(day_of(state, at))


def _exceeding(test: SequentialTest, above: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
    """The units of one response exceeding each level, from its tokens above each
    level ``above`` [T, K]: per token the tokens, per response the response once."""
    return np.where(test.per_token, above.sum(axis=0), above.any(axis=0)).astype(np.int64)


def update(state: SequentialState, margins: npt.ArrayLike, at: float) -> SequentialState:
    """Fold in ``margins`` (raw or clipped, in scoring order) of one response scored
    at verifier time ``at`` (with every level per token, several responses may come
    together); the alarm is raised at the first check (a token above the lowest
    per-token level, the end of a response above the lowest level) whose e-value
    reaches the threshold of ``at``'s day."""
    test = state.test
    m = clipped(margins, test.delta_max)
    above = m[:, None] > np.asarray(test.levels)[None, :]
    prior = np.asarray(state.exceedances, dtype=np.int64)
    after = prior + _exceeding(test, above)
    per_token = test.per_token
    responses = state.responses + int(m.size > 0)
    # Checks at the tokens above the lowest per-token level: the per-token levels count
    # the tokens so far; the per-response ones the response whole, which that token
    # decided exceeds them all.
    rises = (
        np.flatnonzero(above[:, test.lowest_per_token])
        if per_token.any()
        else np.zeros(0, dtype=np.int64)
    )
    rise_counts = np.where(per_token, prior + np.cumsum(above, axis=0)[rises], after)
    rise_tokens = state.tokens + rises + 1
    # And at the response's end, where its per-response levels are decided.
    ends = 1 if not per_token.all() and above[:, 0].any() else 0
    check_counts = np.vstack([prior, rise_counts, np.repeat(after[None], ends, axis=0)])
    check_tokens = np.concatenate(
        [[state.tokens], rise_tokens, np.full(ends, state.tokens + m.size)]
    ).astype(np.int64)
    check_responses = np.concatenate(
        [[state.responses], np.full(rise_tokens.size + ends, responses)]
    )
    alarm = state.alarm
    if alarm is None:
        # The evidence so far is checked too, against today's threshold (a new day
        # lowers it).
        check_units = np.where(per_token, check_tokens[:, None], check_responses[:, None])
        log_e = test.log_e_values(check_units, check_counts)
        day = day_of(state, at)
        level = test.log_threshold(day)
        hits = np.flatnonzero((log_e >= level) & (check_tokens > 0))
        if hits.size:
            first = int(hits[0])
            alarm = Alarm(at, day, int(check_tokens[first]), float(log_e[first]), level)
    return replace(
        state,
        tokens=state.tokens + int(m.size),
        responses=responses,
        exceedances=tuple(int(n) for n in after),
        alarm=alarm,
    )


def withdraw(state: SequentialState, margins: npt.ArrayLike) -> SequentialState:
    """``state`` with one response it folded in (``margins`` as `update` got them) counted
    as a response none of whose units exceeded a level: its units stay pooled, its
    exceedances go; the alarm, once raised, stays (an admin clears it).

    Used when the collector amends the response's record: the client may not have
    received the bytes that were scored. Dropping the response's units instead is not
    sound. E depends on (u, s_k) and a unit that did not exceed lowers it (at fixed p
    each such factor is <= 1), while which records get amended is decided after they
    were scored (by the network, a third party or the prover itself): a rule that drops
    units could drop exactly those that did not exceed and lift an honest prover's E past
    Ville's bound (drop every clean response and any honest exceedance looks like a rate
    of 1). Counting the units as not exceeding is sound: at fixed p an exceeding unit's
    factor r'_j / p >= 1 >= (1 - r'_j) / (1 - p), a non-exceeding one's, so every term of
    M, now and at every later unit, is at most what it would be had that unit been the
    honest one, exceeding or not; per response the statistic stays under that of the
    honest prover's own sequence, which the bound covers. Per token the recorded copy's
    token count stands in for the honest one's, which whoever injects shorter copies
    could lower (fewer clean units); each such response is UNVERIFIABLE(record_amended),
    which the hiding alarm counts. What this gives up: an amended response's exceedances
    no longer count against the prover (they are about bytes the client may not have
    received), so a prover that amends its cheats hides them at the price of an
    UNVERIFIABLE verdict each. Raises SequentialTestError when the response's
    exceedances are not in ``state``."""
    test = state.test
    m = clipped(margins, test.delta_max)
    taken = _exceeding(test, m[:, None] > np.asarray(test.levels)[None, :])
    left = np.asarray(state.exceedances, dtype=np.int64) - taken
    if (left < 0).any():
        raise SequentialTestError("the withdrawn response's exceedances are not in the state")
    return replace(state, exceedances=tuple(int(n) for n in left))


def log_e_value(state: SequentialState) -> float:
    """ln E of all the evidence so far (before any token, the calibration's alone: <= 0)."""
    return float(
        state.test.log_e_values(
            np.array([state.units], dtype=np.int64),
            np.array([state.exceedances], dtype=np.int64),
        )[0]
    )


def crossed(state: SequentialState) -> bool:
    """Whether the alarm has been raised (it stays raised)."""
    return state.alarm is not None
