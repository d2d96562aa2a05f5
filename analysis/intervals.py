"""Intervals over seeds and repetitions: a cell's mean, a composite over cells, a proportion.

Per cell (one method, model and dataset), a metric's n seed values x₁..xₙ give the mean x̄ and

* ``t`` (default): x̄ ± t_{1−α/2, n−1} · s/√n, Student's t on the seed values (s with ddof = 1);
* ``bootstrap``: the percentile interval of x̄ over 9,999 resamples of the seeds
  (:func:`scipy.stats.bootstrap`, fixed random state), for skewed metrics with many seeds (it under-covers
  with few: docs/statistics.md); the grid's ``statistics: {interval: bootstrap}`` chooses it for the report.

One seed gives no interval (NaN bounds; the report says "1 seed: no interval").

A composite averages C cell means with equal weight, so its standard error propagates the cells' independent
ones, SE = √(Σ_c s_c²/n_c) / C, with the Welch–Satterthwaite degrees of freedom
ν = (Σ_c v_c)² / Σ_c v_c²/(n_c − 1), v_c = s_c²/n_c, and the interval is mean ± t_{1−α/2, ν} · SE (whichever
``how`` the cells used).  A composite of one cell is that cell's own interval (for ``t`` the same number); a
composite with a one-seed cell has no interval.

A proportion (a regression test point covered in c of k repetitions) gets Wilson's score interval
(:func:`statsmodels.stats.proportion.proportion_confint`), which stays inside [0, 1] and keeps close to its
level at c = 0 or k where the normal interval collapses to a point (Wilson 1927; Brown, Cai & DasGupta 2001).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

from analysis.tables import markdown_table

INTERVALS = ("t", "bootstrap")
BOOTSTRAP_RESAMPLES = 9_999


def mean_interval(values: np.ndarray, alpha: float = 0.05, how: str = "t") -> tuple[float, float, float]:
    """The mean of ``values`` and its two-sided 1 − ``alpha`` interval (``how``: ``t`` or ``bootstrap``; see
    the module doc); NaN bounds for fewer than two values."""
    values = np.asarray(values, dtype=float)
    mean = float(values.mean()) if values.size else float("nan")
    if values.size < 2:
        return mean, float("nan"), float("nan")
    if how == "t":
        half = stats.t.ppf(1 - alpha / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
        return mean, mean - half, mean + half
    if how == "bootstrap":
        if np.all(values == values[0]):
            return mean, mean, mean
        result = stats.bootstrap(
            (values,),
            np.mean,
            confidence_level=1 - alpha,
            n_resamples=BOOTSTRAP_RESAMPLES,
            method="percentile",
            random_state=0,
        )
        return mean, float(result.confidence_interval.low), float(result.confidence_interval.high)
    raise ValueError(f"interval: expected one of {INTERVALS}, got {how!r}")


def cell_intervals(units: pd.DataFrame, keys: list[str], alpha: float = 0.05, how: str = "t") -> pd.DataFrame:
    """Per group of ``keys`` in ``units`` (one row per seed, a ``value`` column): ``seeds``, ``mean``, ``std``
    (ddof = 1), ``low`` and ``high`` (the 1 − ``alpha`` interval of the mean)."""
    rows = []
    for key, group in units.groupby(keys, sort=True):
        mean, low, high = mean_interval(group["value"].to_numpy(), alpha, how)
        std = float(group["value"].std(ddof=1)) if len(group) > 1 else float("nan")
        rows.append((*key, len(group), mean, std, low, high))
    return pd.DataFrame(rows, columns=[*keys, "seeds", "mean", "std", "low", "high"])


def composite_interval(cells: pd.DataFrame, alpha: float = 0.05) -> tuple[float, float, float]:
    """The equal-weight mean of the cell means in ``cells`` (columns ``mean``, ``std``, ``seeds``) and its
    1 − ``alpha`` Welch–Satterthwaite interval (module doc); one cell with ``low`` and ``high`` columns: its own
    interval; NaN bounds when a cell has one seed."""
    mean = float(cells["mean"].mean())
    if (cells["seeds"] < 2).any() or cells["std"].isna().any():
        return mean, float("nan"), float("nan")
    if len(cells) == 1 and {"low", "high"} <= set(cells.columns):
        return mean, float(cells["low"].iloc[0]), float(cells["high"].iloc[0])
    v = (cells["std"] ** 2 / cells["seeds"]).to_numpy()
    se = np.sqrt(v.sum()) / len(cells)
    if se == 0:
        return mean, mean, mean
    dof = v.sum() ** 2 / np.sum(v**2 / (cells["seeds"].to_numpy() - 1))
    half = stats.t.ppf(1 - alpha / 2, dof) * se
    return mean, mean - half, mean + half


def wilson_interval(count: np.ndarray, total: np.ndarray, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval of the proportions ``count / total`` (module doc)."""
    from statsmodels.stats.proportion import proportion_confint

    low, high = proportion_confint(np.asarray(count), np.asarray(total), alpha=alpha, method="wilson")
    return np.asarray(low, dtype=float), np.asarray(high, dtype=float)


def interval_text(mean: float, low: float, high: float, seeds: int, digits: int = 3) -> str:
    """``mean [low, high] n=seeds``, or ``mean (1 seed: no interval)`` where a cell behind it has one seed."""
    from analysis.tables import format_number

    if np.isnan(mean):
        return "-"
    if seeds < 2 or np.isnan(low):
        return f"{format_number(float(mean), digits)} (1 seed: no interval)"
    return (
        f"{format_number(float(mean), digits)} [{format_number(float(low), digits)}, "
        f"{format_number(float(high), digits)}] n={seeds}"
    )


def grouped_intervals(rows: pd.DataFrame, keys: list[str], alpha: float = 0.05, how: str = "t") -> pd.DataFrame:
    """Per group of ``keys``: the value averaged within each trial (model, dataset, seed) over the group's
    sets, then per cell over seeds (``how`` intervals), then over cells with equal weight, with the 1 − ``alpha``
    interval of :func:`composite_interval` (``mean``, ``low``, ``high``, ``seeds``: the fewest behind a cell)."""
    per_seed = rows.groupby([*keys, "model", "dataset", "seed"], as_index=False)["value"].mean()
    cells = cell_intervals(per_seed, [*keys, "model", "dataset"], alpha, how)
    out = []
    for key, group in cells.groupby(keys, sort=False):
        mean, low, high = composite_interval(group, alpha)
        out.append((*(key if isinstance(key, tuple) else (key,)), mean, low, high, int(group["seeds"].min())))
    return pd.DataFrame(out, columns=[*keys, "mean", "low", "high", "seeds"])


def interval_pivot(table: pd.DataFrame, index: list[str], column: str) -> pd.DataFrame:
    """:func:`grouped_intervals`' ``table`` as text cells (:func:`interval_text`), ``index`` rows by ``column``."""
    text = table.assign(
        text=[
            interval_text(m, lo, hi, n)
            for m, lo, hi, n in zip(table["mean"], table["low"], table["high"], table["seeds"], strict=True)
        ]
    )
    return text.pivot(index=index, columns=column, values="text")


def experiment_tables(rows: pd.DataFrame, column: str, shown: tuple[str, ...], alpha: float = 0.05) -> list[str]:
    """Regression ``rows`` (one per trial and value of ``column``, with a ``complexity`` column) as one table per
    experiment (dataset): a ``### dataset`` heading, then (complexity, method, model) rows by the ``shown``
    values of ``column`` present, each ``mean [1 − alpha interval over repetitions] n`` (:func:`cell_intervals`)."""
    keys = ["dataset", "complexity", "method", "model", column]
    table = interval_pivot(cell_intervals(rows, keys, alpha), keys[:-1], column)
    parts = []
    for dataset, cell in table.groupby(level="dataset"):
        columns = [c for c in shown if c in cell.columns]
        parts += [f"### {dataset}", markdown_table(cell.droplevel("dataset")[columns].fillna("-"))]
    return parts
