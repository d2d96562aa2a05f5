"""Which differences between methods are real: paired tests, Friedman ranks with a critical difference, and how
small a difference the seeds can resolve.  Reads only the metrics and trials tables; docs/statistics.md
explains each test's assumptions and how to read the figures.

The *unit* of comparison is one (model, dataset, seed) of a composite (:func:`analysis.composites.unit_values`:
the composite's metric in that trial, averaged over its sets).  Methods of one seed share the seed's data,
splits and streams, so two methods' values on the same unit are paired.

* **Paired tests** (:func:`paired_tests`): for each principle, each of its composites and each pair of
  methods, the Wilcoxon signed-rank test of the differences a − b over the units both methods completed
  (never imputed), Holm-corrected over every (principle, composite, pair) test of the report (Holm 1979;
  :func:`holm`), so the chance of any false ordering in the report's summary is at most α.  Zeros are
  dropped (Wilcoxon's convention, as R's ``wilcox.test``), ties share their mid-rank, both within
  :data:`TIE_TOLERANCE` of the values' magnitude; the p-value is the exact permutation p over all 2ⁿ sign
  flips of the n nonzero differences (:func:`signed_rank_null`; never below 2/2ⁿ, ties and zeros
  included) up to :data:`EXACT_UNITS`, the normal approximation with tie and continuity correction above.
  Effect size: the median paired difference with its distribution-free order-statistic interval
  (:func:`scipy.stats.quantile_test`; none below 6 units).  ``better`` names the better method where the
  corrected p is below α, else ``tie``.
* **Friedman and Nemenyi** (:func:`friedman_test`; Demšar 2006): blocks are the units all compared methods
  completed; within a block each composite of the principle ranks the methods (1 = best, ties share the
  mean) and a method's block score is its mean rank over the principle's composites, each family of
  :data:`analysis.composites.FAMILIES` once.  The Friedman test (:func:`scipy.stats.friedmanchisquare`,
  tie-corrected) asks whether any method ranks differently; Nemenyi's post-hoc (:func:`scikit_posthocs.posthoc_nemenyi_friedman`) compares every
  pair, and two methods differ when their mean ranks differ by more than the critical difference
  CD = q_α · √(k(k + 1) / (6N)), q_α the studentized range quantile for k methods over √2.  Post-hoc
  differences count only when the Friedman test rejects after Holm's correction (below); otherwise every
  method is in the best group.
* **One family** (:func:`compare`): Holm's correction runs over every test the report states, the pairwise
  Wilcoxon tests and the per-principle Friedman tests together (m = their finite p-values; a pair sharing
  no unit has none), so the chance of any false claim of a difference anywhere in the report is at most α.
* **Resolution** (:func:`resolvable_differences`): with n units per pair and spread s_d (the median over
  pairs of the standard deviation of paired differences), the smallest difference a paired test finds with
  80% power at Holm's first step α/m (m tests in the report) is
  δ = (t_{1−α/(2m), n−1} + t_{0.8, n−1}) · s_d / √n (the paired t approximation of the Wilcoxon test), and
  the exact Wilcoxon test cannot give p below 2/2ⁿ, so it needs n ≥ log₂(2m/α) units before any
  ordering can survive.

The composite table's ``mean_rank`` carries no significance claim: its principles are measured on different
cells (``decision_cost`` on decision-task cells, the others on in-domain ones), so no unit ranks the methods
on every principle, and the principles themselves are not replicates (a test over them, as blocks, calls a
method "significantly worse" from one seed per cell).  Which orders are real is stated per principle, over
replicated units, by the tests above.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import combinations
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.composites import COMPOSITES, PRINCIPLES, family_mean, not_ranked_note, unit_values

UNIT = ["model", "dataset", "seed"]
POWER = 0.8
EXACT_UNITS = 60
"""Up to this many nonzero paired differences the signed-rank test is exact (all 2ⁿ sign flips, counted in
int64); above it, the normal approximation with continuity correction."""
TIE_TOLERANCE = 1e-12
"""Differences within this fraction of the compared values' magnitude are ties (and of zero, zeros): float
rounding of equal differences, e.g. 342/360 − 340/360 against 344/360 − 342/360."""


def _better_sign(composite: str) -> int:
    return 1 if COMPOSITES[composite][2] else -1


def wide_units(units: pd.DataFrame, composite: str) -> pd.DataFrame:
    """``composite``'s units as rows (model, dataset, seed) and methods as columns (NaN where a method lacks
    the unit)."""
    rows = units[units["composite"] == composite]
    return rows.pivot_table(index=UNIT, columns="method", values="value", aggfunc="first")


def pair_differences(wide: pd.DataFrame) -> tuple[list[tuple[str, str]], np.ndarray]:
    """Every pair (a, b) of ``wide``'s methods (a before b alphabetically) and a units × pairs array of
    a − b, NaN where either lacks the unit."""
    methods = sorted(wide.columns)
    values = wide[methods].to_numpy(dtype=float)
    pairs = list(combinations(range(len(methods)), 2))
    if not pairs:
        return [], np.empty((len(wide), 0))
    first, second = (np.array(index) for index in zip(*pairs, strict=True))
    return [(methods[i], methods[j]) for i, j in pairs], values[:, first] - values[:, second]


def pair_scales(wide: pd.DataFrame) -> np.ndarray:
    """Per pair of :func:`pair_differences` (same order): the largest |value| of either method over the units
    both completed, the scale of the rounding error in their differences (0 where they share none)."""
    methods = sorted(wide.columns)
    values = np.abs(wide[methods].to_numpy(dtype=float))
    pairs = list(combinations(range(len(methods)), 2))
    if not pairs:
        return np.empty(0)
    first, second = (np.array(index) for index in zip(*pairs, strict=True))
    a, b = values[:, first], values[:, second]
    return np.where(np.isnan(a - b), 0.0, np.fmax(a, b)).max(axis=0, initial=0.0)


def doubled_signed_ranks(differences: np.ndarray, tolerance: float) -> tuple[np.ndarray, np.ndarray]:
    """(2 × the Wilcoxon ranks of |d|, whether d > 0) of the nonzero ``differences``: |d| ≤ ``tolerance`` is a
    zero and left out (Wilcoxon's convention), |d| within ``tolerance`` of each other are ties sharing their
    mean rank; doubled, the mid-ranks of ties are integers."""
    kept = differences[np.abs(differences) > tolerance]
    magnitude = np.abs(kept)
    order = np.argsort(magnitude, kind="stable")
    groups = np.concatenate([[0], np.cumsum(np.diff(magnitude[order]) > tolerance)])
    doubled = np.empty(kept.size, dtype=np.int64)
    doubled[order] = np.rint(2 * stats.rankdata(groups, method="average")).astype(np.int64)
    return doubled, kept > 0


@lru_cache(maxsize=4096)
def signed_rank_null(doubled_ranks: tuple[int, ...]) -> np.ndarray:
    """How many of the 2ⁿ sign assignments of ``doubled_ranks`` (sorted) give each doubled T⁺ = 0, 1, …,
    Σ ranks: the exact null distribution of the signed-rank statistic given the ranks, ties included, by
    convolving in one rank at a time (each sign ± with probability ½).  Exact in int64 up to n = 62."""
    counts = np.zeros(sum(doubled_ranks) + 1, dtype=np.int64)
    counts[0] = 1
    for rank in doubled_ranks:
        shifted = counts.copy()
        shifted[rank:] += counts[: counts.size - rank]
        counts = shifted
    return counts


def signed_rank_p_value(differences: np.ndarray, scale: float) -> float:
    """Two-sided p of the Wilcoxon signed-rank test of ``differences`` (no NaN), conditional on their |d|:
    zeros and ties within ``TIE_TOLERANCE`` × ``scale`` (:func:`doubled_signed_ranks`); with at most
    :data:`EXACT_UNITS` nonzero differences the exact permutation p, 2 · min(P(T⁺ ≥ t), P(T⁺ ≤ t)) capped at 1
    over all sign flips (:func:`signed_rank_null`), so never below 2/2ⁿ; above, the normal approximation with
    tie and continuity correction (:func:`scipy.stats.wilcoxon`); 1 when every difference is zero."""
    doubled, positive = doubled_signed_ranks(differences, TIE_TOLERANCE * scale)
    if doubled.size == 0:
        return 1.0
    if doubled.size > EXACT_UNITS:
        signed = np.where(positive, doubled, -doubled).astype(float)
        return float(stats.wilcoxon(signed, correction=True, method="asymptotic").pvalue)
    counts = signed_rank_null(tuple(sorted(doubled.tolist())))
    t = int(doubled[positive].sum())
    tail = min(int(counts[: t + 1].sum()), int(counts[t:].sum()))
    return min(1.0, 2 * tail / 2**doubled.size)


def wilcoxon_p_values(differences: np.ndarray, scales: np.ndarray | None = None) -> np.ndarray:
    """Two-sided Wilcoxon signed-rank p-values of each column of ``differences`` (units × pairs; NaN rows of a
    column are units a method lacks, left out) by :func:`signed_rank_p_value`; ``scales``: per column the
    magnitude of the values differenced (:func:`pair_scales`), which sets the tolerance of zeros and ties
    (default: the largest |difference|).  NaN without units."""
    if scales is None:
        with np.errstate(all="ignore"):
            scales = np.nanmax(np.abs(differences), axis=0, initial=0.0)
    p = np.full(differences.shape[1], np.nan)
    for column in range(differences.shape[1]):
        d = differences[:, column]
        d = d[~np.isnan(d)]
        if d.size:
            p[column] = signed_rank_p_value(d, float(scales[column]))
    return p


def median_interval(differences: np.ndarray, alpha: float) -> tuple[float, float]:
    """The distribution-free 1 − ``alpha`` interval [d_(j+1), d_(n−j)] of the median of ``differences`` from
    order statistics, j the largest with P(Binomial(n, ½) ≤ j) ≤ α/2 (the interval
    :func:`scipy.stats.quantile_test` gives, tests/test_statistics.py; written out here because that call
    costs milliseconds per pair); NaN where no j exists (n < 6 at α = 0.05)."""
    n = differences.size
    j = int(stats.binom.ppf(alpha / 2, n, 0.5)) if n else -1
    while j >= 0 and stats.binom.cdf(j, n, 0.5) > alpha / 2:
        j -= 1
    if j < 0:
        return float("nan"), float("nan")
    ordered = np.sort(differences)
    return float(ordered[j]), float(ordered[n - 1 - j])


def holm(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjusted p-values: the i-th smallest of m finite p-values times (m − i + 1), the
    running maximum, capped at 1; NaN stays NaN.  The values of statsmodels'
    ``multipletests(method="holm")`` (tests/test_statistics.py), written out because that call runs a full
    garbage collection each time (about 0.3 s, per principle and per simulated benchmark)."""
    p_values = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p_values, np.nan)
    finite = np.flatnonzero(np.isfinite(p_values))
    order = finite[np.argsort(p_values[finite], kind="stable")]
    m = order.size
    adjusted[order] = np.minimum(np.maximum.accumulate((m - np.arange(m)) * p_values[order]), 1.0)
    return adjusted


def principle_units(units: pd.DataFrame, principle: str) -> pd.DataFrame:
    return units[units["composite"].isin(PRINCIPLES[principle])]


def paired_tests(
    units: pd.DataFrame,
    alpha: float = 0.05,
    principles: list[str] | None = None,
    other_p_values: Sequence[float] = (),
) -> pd.DataFrame:
    """One row per (principle, composite, method_a, method_b): ``units`` compared, ``median_difference``
    (a − b, in the metric's units) with ``difference_low`` / ``difference_high``, ``p_value``, ``p_holm``
    (Holm over every test of ``principles`` and ``other_p_values``, the other tests of the same family: the
    whole report's when all, :func:`compare`) and ``better`` (a method, or ``tie``).  See the module doc."""
    family = []
    for principle in principles or list(PRINCIPLES):
        these = principle_units(units, principle)
        for composite in [c for c in PRINCIPLES[principle] if c in set(these["composite"])]:
            wide = wide_units(these, composite)
            pairs, differences = pair_differences(wide)
            p_values = wilcoxon_p_values(differences, pair_scales(wide))
            for (a, b), d, p in zip(pairs, differences.T, p_values, strict=True):
                d = d[~np.isnan(d)]
                low, high = median_interval(d, alpha)
                median = float(np.median(d)) if d.size else float("nan")
                direction = np.sign(median) if median else np.sign(d.mean() if d.size else 0.0)
                family.append(
                    {
                        "principle": principle,
                        "composite": composite,
                        "method_a": a,
                        "method_b": b,
                        "units": d.size,
                        "median_difference": median,
                        "difference_low": low,
                        "difference_high": high,
                        "p_value": float(p),
                        "_direction": direction,
                    }
                )
    adjusted = holm(np.array([r["p_value"] for r in family] + list(other_p_values)))[: len(family)]
    rows = []
    for row, p in zip(family, adjusted, strict=True):
        direction = row.pop("_direction")
        significant = bool(np.isfinite(p) and p < alpha and direction != 0)
        winner = row["method_a"] if direction * _better_sign(row["composite"]) > 0 else row["method_b"]
        rows.append(row | {"p_holm": float(p), "better": winner if significant else "tie"})
    columns = [
        "principle",
        "composite",
        "method_a",
        "method_b",
        "units",
        "median_difference",
        "difference_low",
        "difference_high",
        "p_value",
        "p_holm",
        "better",
    ]
    return pd.DataFrame(rows, columns=columns)


def block_scores(units: pd.DataFrame, principle: str) -> pd.DataFrame:
    """Rows: the units (model, dataset, seed) every method with results in ``principle`` completed on every
    composite of it; columns: methods; values: the method's rank in the unit (1 = best) averaged over the
    principle's composites, each family once (:func:`analysis.composites.family_mean`)."""
    these = principle_units(units, principle)
    ranks = {}
    for composite in [c for c in PRINCIPLES[principle] if c in set(these["composite"])]:
        table = these[these["composite"] == composite].pivot_table(index=UNIT, columns="method", values="value")
        ranks[composite] = table.rank(axis=1, ascending=not COMPOSITES[composite][2], method="average")
    if not ranks:
        return pd.DataFrame()
    methods = sorted(set().union(*(r.columns for r in ranks.values())))
    stacked = pd.concat({c: r.reindex(columns=methods) for c, r in ranks.items()}, axis=1, join="inner")
    complete = stacked.dropna()
    if complete.empty:
        return pd.DataFrame(columns=methods)
    return pd.DataFrame({m: family_mean(complete.xs(m, axis=1, level=1)) for m in methods})[methods]


@dataclass
class FriedmanResult:
    """The Friedman test and Nemenyi post-hoc of one principle (see the module doc)."""

    principle: str
    methods: list[str]
    blocks: int  # complete blocks used
    all_blocks: int  # units with any result in the principle
    mean_ranks: pd.Series = field(default_factory=pd.Series)  # per method, 1 = best
    statistic: float = float("nan")
    p_value: float = float("nan")
    p_holm: float = float("nan")  # corrected within the report's family (:func:`compare`); NaN when run alone
    critical_difference: float = float("nan")
    nemenyi: pd.DataFrame = field(default_factory=pd.DataFrame)  # p-values, methods × methods
    best_group: list[str] = field(default_factory=list)  # not significantly different from the best
    note: str = ""


def nemenyi_critical_difference(k: int, n: int, alpha: float = 0.05) -> float:
    """CD = q_α √(k(k+1)/(6N)), q_α = studentized range quantile (k, ∞) / √2 (Demšar 2006, Section 3.2.2)."""
    q = stats.studentized_range.ppf(1 - alpha, k, np.inf) / math.sqrt(2)
    return float(q * math.sqrt(k * (k + 1) / (6 * n)))


def friedman_test(units: pd.DataFrame, principle: str, alpha: float = 0.05) -> FriedmanResult:
    """Friedman's test over the complete blocks of ``principle`` and Nemenyi's post-hoc (module doc)."""
    import scikit_posthocs

    scores = block_scores(units, principle)
    these = principle_units(units, principle)
    all_blocks = len(these[UNIT].drop_duplicates())
    methods = list(scores.columns)
    result = FriedmanResult(principle, methods, len(scores), all_blocks)
    if len(methods) < 3 or len(scores) < 2:
        result.note = (
            f"{len(methods)} methods over {len(scores)} complete blocks: the Friedman test needs at "
            "least 3 methods and 2 blocks (see the paired tests)"
        )
        result.best_group = methods
        return result
    within = scores.rank(axis=1, method="average")
    result.mean_ranks = within.mean().sort_values()
    if (scores.nunique(axis=1) == 1).all():
        result.statistic, result.p_value = 0.0, 1.0
    else:
        test = stats.friedmanchisquare(*[scores[m].to_numpy() for m in methods])
        result.statistic, result.p_value = float(test.statistic), float(test.pvalue)
    result.critical_difference = nemenyi_critical_difference(len(methods), len(scores), alpha)
    result.nemenyi = scikit_posthocs.posthoc_nemenyi_friedman(scores.to_numpy())
    result.nemenyi.index = result.nemenyi.columns = methods
    result.best_group = nemenyi_best_group(result, result.p_value, alpha)
    return result


def nemenyi_best_group(result: FriedmanResult, p_value: float, alpha: float) -> list[str]:
    """The methods Nemenyi's post-hoc does not separate from the best mean rank, given the Friedman test's
    ``p_value`` (raw, or corrected within a family): every method unless that p-value is below ``alpha``."""
    if result.note or not p_value < alpha:
        return list(result.mean_ranks.index) or list(result.methods)
    best = result.mean_ranks.index[0]
    return [m for m in result.mean_ranks.index if m == best or result.nemenyi.loc[best, m] >= alpha]


def resolvable_differences(units: pd.DataFrame, alpha: float = 0.05, family_size: int | None = None) -> pd.DataFrame:
    """Per (principle, composite): ``units`` per pair (median), ``cells``, ``seeds`` (median per cell), the
    spread ``sd_difference`` of paired differences, ``resolvable`` (the smallest difference found with 80%
    power at α/m), ``tests`` (m) and ``units_needed`` (the fewest units with which the exact Wilcoxon test
    can pass α/m).  See the module doc."""
    differences = {
        (principle, composite): pair_differences(wide_units(units, composite))[1]
        for principle, names in PRINCIPLES.items()
        for composite in names
        if composite in set(units["composite"])
    }
    m = family_size or sum(d.shape[1] for d in differences.values())  # Holm's family: every test of the report
    rows = []
    for (principle, composite), pair_values in differences.items():
        if not pair_values.shape[1]:
            continue
        diffs = [d[~np.isnan(d)] for d in pair_values.T]
        n = int(np.median([d.size for d in diffs]))
        spreads = [d.std(ddof=1) for d in diffs if d.size > 1]
        sd = float(np.median(spreads)) if spreads else float("nan")
        rows_c = units[units["composite"] == composite]
        cells = len(rows_c[["model", "dataset"]].drop_duplicates())
        seeds = int(rows_c.groupby(["method", "model", "dataset"])["seed"].nunique().median())
        delta = float("nan")
        if n > 1 and np.isfinite(sd):
            level = alpha / m
            delta = (stats.t.ppf(1 - level / 2, n - 1) + stats.t.ppf(POWER, n - 1)) * sd / math.sqrt(n)
        rows.append(
            {
                "principle": principle,
                "composite": composite,
                "units": n,
                "cells": cells,
                "seeds": seeds,
                "sd_difference": sd,
                "resolvable": delta,
                "tests": m,
                "units_needed": math.ceil(math.log2(2 * m / alpha)),
            }
        )
    return pd.DataFrame(
        rows,
        columns=[
            "principle",
            "composite",
            "units",
            "cells",
            "seeds",
            "sd_difference",
            "resolvable",
            "tests",
            "units_needed",
        ],
    )


def plot_critical_difference(result: FriedmanResult, path: Path, alpha: float = 0.05) -> Path:
    """Demšar's critical-difference diagram of ``result``: mean ranks on the axis (1 = best, left), a bar
    joining methods not significantly different (all of them when the Friedman test does not reject), and the
    CD drawn above the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import scikit_posthocs

    decisive = result.p_value if np.isnan(result.p_holm) else result.p_holm  # corrected within the report's family
    significance = result.nemenyi.copy()
    if not decisive < alpha:
        significance.loc[:, :] = 1.0
    k = len(result.methods)
    figure, ax = plt.subplots(figsize=(9, 1.6 + 0.32 * k), layout="constrained")
    scikit_posthocs.critical_difference_diagram(
        result.mean_ranks,
        significance,
        ax=ax,
        alpha=alpha,
        cd=result.critical_difference,
        label_fmt_left="{label} ({rank:.2f})",
        label_fmt_right="({rank:.2f}) {label}",
        label_props={"fontsize": 9},
        crossbar_props={"linewidth": 2.5},
    )
    verdict = "differences exist" if decisive < alpha else "no significant difference"
    corrected = "" if np.isnan(result.p_holm) else f", Holm {result.p_holm:.3g}"
    ax.set_title(
        f"{result.principle}: mean rank over {result.blocks} blocks (1 = best); bars join methods not "
        f"significantly different\nFriedman p = {result.p_value:.3g}{corrected} ({verdict} at α = {alpha}); "
        f"Nemenyi CD = {result.critical_difference:.2f}",
        fontsize=9,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=130)
    plt.close(figure)
    return path


@dataclass(frozen=True)
class Comparison:
    """The tables behind the report's statistics (pandas frames; docs/statistics.md).

    ``cells``: per composite, method, model, dataset: seeds, mean, std, low, high.
    ``composites``: per composite and method: value, low, high, cells, seeds (fewest per cell).
    ``pairs``: :func:`paired_tests`.  ``friedman``: per principle: methods, blocks, all_blocks, statistic,
    p_value, p_holm, critical_difference, best_group, note.  ``ranks``: per principle and method: mean_rank (Friedman
    blocks) and in_best_group.  ``resolution``: :func:`resolvable_differences`."""

    cells: pd.DataFrame
    composites: pd.DataFrame
    pairs: pd.DataFrame
    friedman: pd.DataFrame
    ranks: pd.DataFrame
    resolution: pd.DataFrame
    tests: dict[str, FriedmanResult]
    family_size: int  # m of Holm's correction: the finite p-values of every pairwise and Friedman test


def compare(
    metrics: pd.DataFrame,
    trials: pd.DataFrame,
    principle: str | None = None,
    alpha: float = 0.05,
    interval: str = "t",
) -> Comparison:
    """Every table of the statistical comparison, for one ``principle`` or all (see :class:`Comparison`)."""
    from analysis.intervals import cell_intervals, composite_interval

    if principle is not None and principle not in PRINCIPLES:
        raise ValueError(f"principle: unknown {principle!r}; allowed: {', '.join(PRINCIPLES)}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha: {alpha} is not in (0, 1)")
    principles = [principle] if principle else list(PRINCIPLES)
    wanted = {c for p in principles for c in PRINCIPLES[p]}
    units = unit_values(metrics, trials)
    units = units[units["composite"].isin(wanted)]
    cells = (
        cell_intervals(units, ["composite", "method", "model", "dataset"], alpha, interval)
        if not units.empty
        else pd.DataFrame(columns=["composite", "method", "model", "dataset", "seeds", "mean", "std", "low", "high"])
    )
    composite_rows = []
    for (name, method), group in cells.groupby(["composite", "method"], sort=False):
        value, low, high = composite_interval(group, alpha)
        composite_rows.append(
            {
                "composite": name,
                "method": method,
                "value": value,
                "low": low,
                "high": high,
                "cells": len(group),
                "seeds": int(group["seeds"].min()),
            }
        )
    tests = {p: friedman_test(units, p, alpha) for p in principles if not principle_units(units, p).empty}
    friedman_p = [r.p_value for r in tests.values()]
    pairs = paired_tests(units, alpha, principles, friedman_p)
    joint = np.array(list(pairs["p_value"]) + friedman_p, dtype=float)
    for result, p_holm in zip(tests.values(), holm(joint)[len(pairs) :], strict=True):
        result.p_holm = float(p_holm)
        result.best_group = nemenyi_best_group(result, p_holm, alpha)
    friedman = pd.DataFrame(
        [
            {
                "principle": p,
                "methods": len(r.methods),
                "blocks": r.blocks,
                "all_blocks": r.all_blocks,
                "statistic": r.statistic,
                "p_value": r.p_value,
                "p_holm": r.p_holm,
                "critical_difference": r.critical_difference,
                "best_group": ", ".join(r.best_group),
                "note": r.note,
            }
            for p, r in tests.items()
        ],
        columns=[
            "principle",
            "methods",
            "blocks",
            "all_blocks",
            "statistic",
            "p_value",
            "p_holm",
            "critical_difference",
            "best_group",
            "note",
        ],
    )
    ranks = pd.DataFrame(
        [
            {
                "principle": p,
                "method": m,
                "mean_rank": r.mean_ranks.get(m, float("nan")),
                "in_best_group": m in r.best_group,
            }
            for p, r in tests.items()
            for m in r.methods
        ],
        columns=["principle", "method", "mean_rank", "in_best_group"],
    )
    family_size = int(np.isfinite(joint).sum())
    resolution = resolvable_differences(units, alpha, family_size)
    return Comparison(
        cells,
        pd.DataFrame(composite_rows, columns=["composite", "method", "value", "low", "high", "cells", "seeds"]),
        pairs,
        friedman,
        ranks,
        resolution[resolution["principle"].isin(principles)].reset_index(drop=True),
        tests,
        family_size,
    )


def _number(value: float) -> str:
    from analysis.tables import format_number

    return format_number(float(value), 3)


def _ordering(row: pd.Series) -> str:
    loser = row["method_b"] if row["better"] == row["method_a"] else row["method_a"]
    interval = (
        ""
        if np.isnan(row["difference_low"])
        else f" [{_number(row['difference_low'])}, {_number(row['difference_high'])}]"
    )
    return (
        f"{row['better']} better than {loser} on {row['composite']} (median {row['method_a']} − "
        f"{row['method_b']} = {_number(row['median_difference'])}{interval}, {row['units']} units, "
        f"Holm p = {row['p_holm']:.3g})"
    )


def resolution_text(row: pd.Series, alpha: float) -> str:
    """One sentence: how many units a comparison of ``row``'s composite has and what they can resolve."""
    seeds_needed = math.ceil(row["units_needed"] / max(row["cells"], 1))
    cells = f"{row['cells']} cell{'s' if row['cells'] != 1 else ''}"
    text = (
        f"{row['composite']}: {row['units']} units per pair ({cells} × {row['seeds']} seeds); "
        f"an exact Wilcoxon test over n units cannot give p below 2/2ⁿ, so passing Holm's first step "
        f"(α/m = {alpha}/{row['tests']}) takes ≥ {row['units_needed']} units (≥ {seeds_needed} seeds on {cells})"
    )
    if row["sd_difference"] == 0:
        text += "; the paired differences do not vary over seeds (a deterministic quantity), so any difference is real"
    elif np.isfinite(row["resolvable"]):
        text += (
            f"; at the observed spread (SD of paired differences {_number(row['sd_difference'])}), "
            f"differences below {_number(row['resolvable'])} in {row['composite']} are not resolvable with "
            f"{row['units']} units (80% power, paired t approximation)"
        )
    return text + "."


def statistics_markdown(
    metrics: pd.DataFrame, trials: pd.DataFrame, figures_dir: Path, alpha: float = 0.05, interval: str = "t"
) -> tuple[str, list[Path]]:
    """The report's section on which differences are real: a summary stating only the orderings that survive
    Holm's correction, then per principle the Friedman test, its critical-difference diagram
    (``figures_dir/cd_<principle>.png``), the significant pairs and what the seeds can resolve."""
    from analysis.tables import markdown_table

    comparison = compare(metrics, trials, alpha=alpha, interval=interval)
    pairs = comparison.pairs
    significant = pairs[pairs["better"] != "tie"]
    out = [
        f"Units are (model, dataset, seed): methods of one seed share its data, splits and streams, so "
        f"comparisons are paired; nothing missing is imputed (docs/statistics.md). α = {alpha}.",
        "",
        "**Summary.** ",
    ]
    not_ranked = not_ranked_note(metrics, trials)
    m = comparison.family_size
    family = (
        f"Holm over the report's {m} tests: its pairwise Wilcoxon tests and its Friedman tests, so the chance of "
        "any false claim of a difference in this report is at most α"
    )
    if significant.empty:
        out[-1] += (
            f"No ordering survives Holm's correction ({family}): all {len(pairs)} pairwise comparisons "
            "are ties at these seeds (see how many seeds each principle needs below)."
        )
    else:
        out[-1] += (
            f"{len(significant)} of {len(pairs)} pairwise orderings survive Holm's correction (Wilcoxon "
            f"signed-rank; {family}); every other pair is a tie:"
        )
        out += [""] + [f"- {row['principle']}: {_ordering(row)}" for _, row in significant.iterrows()]
    out += ["", not_ranked] if not_ranked else []
    figures = []
    for principle, result in comparison.tests.items():
        out += ["", f"### {principle}", ""] + ([not_ranked, ""] if not_ranked and principle == "fidelity" else [])
        if result.note:
            out.append(f"Friedman test: not run ({result.note}).")
        else:
            if not result.p_holm < alpha:
                verdict = "no significant difference among the methods after Holm's correction: all are tied"
            elif len(result.best_group) == len(result.methods):
                verdict = (
                    "the test rejects, but Nemenyi's post-hoc separates no method from the best: all are in "
                    "the best group"
                )
            else:
                verdict = (
                    f"the methods differ; best group (not significantly different from the best by "
                    f"Nemenyi): {', '.join(result.best_group)}"
                )
            if result.blocks < 10:
                verdict += (
                    f" (only {result.blocks} blocks: the χ² approximation of the Friedman p-value is rough "
                    "below about 10)"
                )
            out.append(
                f"Friedman test over {result.blocks} of {result.all_blocks} blocks (the units every one of "
                f"the {len(result.methods)} methods completed): χ² = {result.statistic:.3g}, p = "
                f"{result.p_value:.3g} (Holm over the report's {m}: {result.p_holm:.3g}); {verdict}. Nemenyi critical difference {result.critical_difference:.2f} ranks."
            )
            path = plot_critical_difference(result, figures_dir / f"cd_{principle}.png", alpha)
            figures.append(path)
            out += ["", f"![cd_{principle}](figures/{path.name})"]
        these = pairs[pairs["principle"] == principle]
        if not these.empty:
            wins = these[these["better"] != "tie"]
            out += [
                "",
                f"Paired Wilcoxon tests of this principle: {len(these)} (Holm over the report's {m}), "
                f"{len(wins)} significant; units per pair {these['units'].min()}–{these['units'].max()}.",
            ]
            if not wins.empty:
                shown = wins[
                    [
                        "composite",
                        "better",
                        "method_a",
                        "method_b",
                        "units",
                        "median_difference",
                        "difference_low",
                        "difference_high",
                        "p_holm",
                    ]
                ]
                out += ["", markdown_table(shown, index=False)]
        resolution = comparison.resolution[comparison.resolution["principle"] == principle]
        out += ["", "How many seeds: " + " ".join(resolution_text(r, alpha) for _, r in resolution.iterrows())]
    return "\n".join(out), figures
