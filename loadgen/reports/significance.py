"""Whether a difference between two runs is real: each figure's ratio B/A with a
confidence interval and a verdict (faster, slower, no difference), for ``compare``.

The interval rests on the variation *between runs* wherever a stage was repeated
(``--repeats N``): a t interval on the logs of the per-repeat values (Student's with
as many repeats on each side, Welch's otherwise), so it is an interval of the ratio.
A run of thousands of requests has a narrow interval within itself, yet the same
configuration run again lands a few per cent elsewhere; only repeats see that. Where
one side has a single run, its spread between runs is taken to be the other side's;
where both do, the interval comes from the requests of each run (a seeded bootstrap)
and says so. Every interval is widened for the number of figures judged together
(Bonferroni), so a verdict is "different" exactly when its interval excludes 1. A
quantile from too few requests is not judged ("too short").
The method and why: ``docs/compare.md``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = [
    "BOOTSTRAP_DRAWS",
    "MIN_BEYOND",
    "Basis",
    "Difference",
    "FigureQuestion",
    "Samples",
    "Verdict",
    "judge",
    "needed_requests",
]

Verdict = Literal["faster", "slower", "no difference", "too short", "cannot tell"]
#: What an interval rests on: the repeats of both runs; the repeats of one run (the
#: other's single run taken to vary as much); or the requests of one run each.
Basis = Literal["repeats", "one side repeated", "one run each"]

#: A figure is judged only when each run has at least this many requests beyond its
#: quantile (for a mean: this many requests): a p95 needs 200, a p99 1,000, a median
#: 20. With fewer, the quantile is decided by a handful of requests in the tail, so
#: its value moves by whole tail gaps from run to run, and neither the spread of a
#: few repeats nor a bootstrap of those few tail values can be trusted to show it.
MIN_BEYOND = 10
#: Bootstrap draws for a quantile from one run; they estimate a standard error, whose
#: own error at 2,000 draws is about 1.6 % (1/sqrt(2 * draws)).
BOOTSTRAP_DRAWS = 2000

_Array = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Samples:
    """One run's evidence for one figure at one level."""

    #: The figure computed on each repeat of the stage (one value without repeats).
    repeats: tuple[float, ...]
    #: The per-request values behind the figure (all repeats' together), for the
    #: judgement of one run each; None for a figure without them (a throughput).
    requests: tuple[float, ...] | None
    #: Values the figure rests on, summed over the repeats.
    n_requests: int

    def __post_init__(self) -> None:
        if not self.repeats:
            raise ValueError("a figure needs its value from at least one run")
        if self.n_requests < 0:
            raise ValueError(f"n_requests is {self.n_requests}, below 0")

    @property
    def per_run(self) -> float:
        """Requests one repeat's figure rests on, on average."""
        return self.n_requests / len(self.repeats)


@dataclass(frozen=True, slots=True)
class FigureQuestion:
    """One figure at one level of two runs: is B's different from A's?"""

    level: str
    figure: str
    #: True for throughputs (more is better), False for latencies and error rates.
    higher_is_better: bool
    #: 0.95 for a p95, 0.5 for a median; None for a mean or a rate.
    quantile: float | None
    a: Samples
    b: Samples

    def __post_init__(self) -> None:
        if self.quantile is not None and not 0.0 <= self.quantile < 1.0:
            raise ValueError(f"quantile {self.quantile} is outside [0, 1)")


@dataclass(frozen=True, slots=True)
class Difference:
    """One figure's difference: B's value against A's, the interval, the verdict."""

    level: str
    figure: str
    #: Point values: the mean of each run's repeats.
    a: float
    b: float
    #: b / a; None when a is 0.
    ratio: float | None
    #: The confidence interval of the ratio b/a at ``confidence``; None when there
    #: is none (not judged, or a value of 0 or below: the note gives B - A's).
    low: float | None
    high: float | None
    #: From B's side: "slower" is B worse (longer latency, less throughput).
    verdict: Verdict
    basis: Basis
    #: The confidence each interval is at once corrected for the family (None when
    #: not judged): 1 - (1 - confidence) / figures judged.
    confidence: float | None
    note: str | None


def needed_requests(quantile: float | None) -> int:
    """The fewest requests one run needs for a figure at ``quantile`` (None: a mean)
    to be judged: :data:`MIN_BEYOND` of them beyond the quantile."""
    share = 1.0 if quantile is None else 1.0 - quantile
    return math.ceil(round(MIN_BEYOND / share, 6))


@dataclass(frozen=True, slots=True)
class _Estimate:
    """B - A on one scale (logs, or the values themselves), with its standard error
    and degrees of freedom (infinite: a normal interval)."""

    log: bool
    diff: float
    se: float
    df: float
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Refusal:
    verdict: Verdict
    note: str


def judge(
    questions: Sequence[FigureQuestion], *, confidence: float = 0.95, seed: int = 0
) -> list[Difference]:
    """Each figure's difference, with an interval corrected for how many figures are
    judged at once (every question that is neither too short nor without a spread to
    judge by); the same questions and seed give the same answer."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is outside (0, 1)")
    evidence = [
        _evidence(q, np.random.default_rng([seed, i])) for i, q in enumerate(questions)
    ]
    family = sum(isinstance(e, _Estimate) for e in evidence)
    level = 1.0 - (1.0 - confidence) / max(family, 1)
    return [_difference(q, e, level) for q, e in zip(questions, evidence, strict=True)]


def _basis(q: FigureQuestion) -> Basis:
    repeated = (len(q.a.repeats) > 1) + (len(q.b.repeats) > 1)
    return ("one run each", "one side repeated", "repeats")[repeated]


def _evidence(q: FigureQuestion, rng: np.random.Generator) -> _Estimate | _Refusal:
    need = needed_requests(q.quantile)
    for name, side in (("A", q.a), ("B", q.b)):
        if side.per_run < need:
            what = "mean" if q.quantile is None else f"p{_percent(q.quantile)}"
            return _Refusal(
                "too short",
                f"{what} from {side.per_run:.0f} requests per run in {name}: "
                f"too short (needs >= {need})",
            )
    basis = _basis(q)
    if basis == "one run each":
        return _one_run_each(q, rng)
    log = _positive(q.a.repeats, q.b.repeats)
    a, b = (np.log(s.repeats) if log else np.asarray(s.repeats) for s in (q.a, q.b))
    diff = float(b.mean() - a.mean())
    if basis == "repeats":
        va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
        # As many repeats on each side (what --repeats gives): Student's t, whose
        # statistic is then Welch's and which stays near its error rate when the
        # spreads differ (1.4 times it at twice the spread). Welch's freedoms,
        # estimated from 3 + 3 values, spend half the error rate allowed and miss
        # a 25 % difference at 3 % spread among 20 figures 4 times in 10. Unequal
        # counts: Welch.
        if a.size == b.size:
            df = float(a.size + b.size - 2)
        else:
            df = _welch(((va, a.size - 1), (vb, b.size - 1)))
        return _Estimate(log, diff, math.sqrt(va + vb), df, ())
    repeated, single = (a, "B") if a.size > 1 else (b, "A")
    # The single run is one draw from a spread taken to be the repeated run's: the
    # variance of B - A is s^2 / n + s^2, with the repeated side's n - 1 freedoms.
    spread = float(repeated.std(ddof=1))
    se = spread * math.sqrt(1.0 / repeated.size + 1.0)
    note = f"{single} has one run: its spread between runs is taken to be the other's"
    return _Estimate(log, diff, se, float(repeated.size - 1), (note,))


def _one_run_each(q: FigureQuestion, rng: np.random.Generator) -> _Estimate | _Refusal:
    if q.a.requests is None or q.b.requests is None:
        return _Refusal(
            "cannot tell",
            "one run each, and this figure has no per-request values to show its "
            "spread: repeat the runs (--repeats 3)",
        )
    a, b = np.asarray(q.a.requests, float), np.asarray(q.b.requests, float)
    if min(a.size, b.size) < 2:
        return _Refusal("cannot tell", "one run each, with under 2 request values")
    log = _positive(q.a.repeats, q.b.repeats, q.a.requests, q.b.requests)
    errors = [_spread(values, q.quantile, log, rng) for values in (a, b)]
    points = [s.repeats[0] for s in (q.a, q.b)]
    diff = math.log(points[1] / points[0]) if log else points[1] - points[0]
    note = (
        "rests on one run each: the interval holds the variation between requests, "
        "not between runs (repeat the runs: --repeats 3)"
    )
    return _Estimate(log, diff, math.hypot(*errors), math.inf, (note,))


def _spread(
    values: _Array, quantile: float | None, log: bool, rng: np.random.Generator
) -> float:
    """The standard error of one run's figure (of its log, if ``log``) over its
    requests: a mean's from its variance, a quantile's from the bootstrap."""
    if quantile is None:
        mean, sd = float(values.mean()), float(values.std(ddof=1))
        error = sd / math.sqrt(values.size)
        return error / mean if log else error  # the delta method for log(mean)
    drawn = _bootstrap_quantile(np.sort(values), quantile, rng, BOOTSTRAP_DRAWS)
    return float((np.log(drawn) if log else drawn).std(ddof=1))


def _bootstrap_quantile(
    ordered: _Array, quantile: float, rng: np.random.Generator, draws: int
) -> _Array:
    """``draws`` bootstrap replicates of the quantile (linear between ranks, as
    :func:`servemon.loadgen.record.figures.exact_quantile`) of sorted values.

    A resample's value of rank k (counted from 0) is ``ordered[floor(n * U)]``,
    U the value of rank k among n uniforms, which is Beta(k + 1, n - k); the next
    rank up is the smallest of the n - k - 1 uniforms above U. So a replicate costs
    two draws instead of a resample of n values and a sort (exact, not an
    approximation: a test holds it to the plain bootstrap)."""
    n = ordered.size
    rank = quantile * (n - 1)
    k = math.floor(rank)
    u = rng.beta(k + 1, n - k, size=draws)
    low = ordered[np.minimum((u * n).astype(np.int64), n - 1)]
    if rank == k or k + 1 >= n:
        return low
    above = u + (1.0 - u) * rng.beta(1, n - k - 1, size=draws)
    high = ordered[np.minimum((above * n).astype(np.int64), n - 1)]
    return low + (high - low) * (rank - k)


def _welch(parts: Sequence[tuple[float, int]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of variances, each with its
    own freedoms (a part of variance 0 adds nothing)."""
    total = sum(v for v, _ in parts)
    spread = sum(v * v / df for v, df in parts if v > 0.0)
    return total * total / spread if spread > 0.0 else math.inf


def _difference(q: FigureQuestion, e: _Estimate | _Refusal, level: float) -> Difference:
    a, b = (math.fsum(s.repeats) / len(s.repeats) for s in (q.a, q.b))
    ratio = b / a if a != 0.0 else None
    basis = _basis(q)
    if isinstance(e, _Refusal):
        return Difference(
            q.level, q.figure, a, b, ratio, None, None, e.verdict, basis, None, e.note
        )
    notes = list(e.notes)
    if e.se == 0.0:
        half = 0.0
        notes.append("no spread at all: the interval is a point")
    elif math.isinf(e.df):
        half = e.se * float(stats.norm.ppf(1.0 - (1.0 - level) / 2.0))
    else:
        half = e.se * float(stats.t.ppf(1.0 - (1.0 - level) / 2.0, e.df))
    lo, hi = e.diff - half, e.diff + half
    low: float | None
    high: float | None
    if e.log:
        low, high = _exp(lo), _exp(hi)
    else:
        low = high = None
        notes.append(
            f"a value of 0 or below: no interval of the ratio; "
            f"B - A is {e.diff:.4g} in [{lo:.4g}, {hi:.4g}]"
        )
    larger = lo > 0.0  # B's value is above A's, beyond doubt at this confidence
    verdict: Verdict
    if not larger and not hi < 0.0:
        verdict = "no difference"
    else:
        verdict = "faster" if larger == q.higher_is_better else "slower"
    return Difference(
        q.level,
        q.figure,
        a,
        b,
        ratio,
        low,
        high,
        verdict,
        basis,
        level,
        "; ".join(notes) or None,
    )


def _exp(x: float) -> float:
    """e ** x, infinite past the largest float (an interval from wild values)."""
    return math.exp(x) if x < 709.0 else math.inf


def _positive(*groups: Sequence[float]) -> bool:
    return all(v > 0.0 for group in groups for v in group)


def _percent(quantile: float) -> str:
    return f"{quantile * 100:g}"
