"""Coverage statistics of the deep-regression benchmark, computed from a ``points`` table alone.

``points`` has one row per (trial, test point) with the columns method, model, experiment, complexity,
repetition, point_id, x, in_distribution, truth, mean, std (trial_id is not needed).  The anchor model's
rows carry method = ``"blr"``.  A method label run on several models gives one series per model: every
statistic is keyed on (method, model).  ``std`` is the epistemic spread across posterior samples with the
S − 1 divisor (:class:`~ursa_ray.evaluation.predictive.RegressionPredictive`).

Per method, model, experiment, complexity and test point, over the k repetitions r = 1..k:

* deviation   d̄ = (1/k) Σ_r |mean_r − truth|,     SE = sd_r(|mean_r − truth|) / √k  (sd with ddof = 1);
* uncertainty ū = (1/k) Σ_r std_r,                  SE = sd_r(std_r) / √k;
* coverage    c = (1/k) Σ_r 1[|mean_r − truth| ≤ 1.96 · std_r],  SE = √(c (1 − c) / k);
* uncertainty ratio ū / ū_blr, and ``below_anchor`` = ū < ū_blr.  By the paper's lemma, an uncertainty
  below the anchor's means the prediction is biased or the uncertainty is too small.

Aggregates over the in-distribution and the out-of-distribution test points (:func:`coverage_summary`)
first average each repetition over the region's points and then take mean and standard error over the
repetitions (SE = sd_r / √k for all three quantities, since points within a repetition are correlated).

Intervals (``*_low``, ``*_high``, level 1 − α, α = 0.05 unless given): coverage is a proportion over the k
repetitions, so it gets Wilson's score interval (:func:`analysis.intervals.wilson_interval`) with n = k: a
test point's coverage is c of k covered; a region's is the mean of k per-repetition shares c_r ∈ [0, 1],
whose variance is at most μ(1 − μ), so Wilson with n = k is a conservative interval inside [0, 1].
Deviation and uncertainty get Student's t interval mean ± t_{1−α/2, k−1} · SE over the repetitions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

Z = 1.96
ANCHOR = "blr"
CELL = ["method", "model", "experiment", "complexity"]
POINT = CELL + ["point_id"]
NAMED_TOLERANCE = 1e-4


def _with_indicators(points: pd.DataFrame) -> pd.DataFrame:
    missing = set(POINT + ["repetition", "in_distribution", "truth", "mean", "std"]) - set(points.columns)
    if missing:
        raise KeyError(f"points table lacks columns {sorted(missing)}")
    # A runner may write the anchor's rows once per trial of a repetition: keep one row per point.
    df = points.drop_duplicates(POINT + ["repetition"]).copy()
    df["complexity"] = df["complexity"].astype(float)
    df["deviation"] = (df["mean"] - df["truth"]).abs()
    df["covered"] = (df["deviation"] <= Z * df["std"]).astype(float)
    return df


def _se(name: str, column: str | None = None) -> dict[str, tuple[str, str]]:
    """Named aggregations for ``name_se``, the standard error of the mean of ``column`` (default ``name``):
    the sample std and the count, which :func:`_finish_se` turns into std/√k (NaN where k < 2).  Built-in
    aggregations, so no Python call per group."""
    column = column or name
    return {f"{name}_se": (column, "std"), f"_{name}_count": (column, "count")}


def _finish_se(table: pd.DataFrame) -> pd.DataFrame:
    counts = [c for c in table.columns if c.startswith("_") and c.endswith("_count")]
    for count in counts:
        k = table[count]
        se = f"{count[1 : -len('_count')]}_se"
        table[se] = (table[se] / np.sqrt(k)).where(k > 1)
    return table.drop(columns=counts)


def uncertainty_ratio(points: pd.DataFrame, anchor: str = ANCHOR) -> pd.DataFrame:
    """Per method, model, experiment, complexity and point: mean std, the anchor's mean std, their ratio and
    ``below_anchor`` (False where the cell has no anchor rows; the ratio is then NaN)."""
    df = _with_indicators(points)
    per_point = df.groupby(POINT, as_index=False)["std"].mean().rename(columns={"std": "uncertainty"})
    base = per_point[per_point["method"] == anchor].drop(columns=["method", "model"])
    base = base.rename(columns={"uncertainty": "anchor_uncertainty"})
    out = per_point.merge(base, on=["experiment", "complexity", "point_id"], how="left")
    out["uncertainty_ratio"] = out["uncertainty"] / out["anchor_uncertainty"]
    out["below_anchor"] = (out["uncertainty"] < out["anchor_uncertainty"]).fillna(False).astype(bool)
    return out


def _t_intervals(table: pd.DataFrame, names: Iterable[str], alpha: float) -> pd.DataFrame:
    """``name_low`` / ``name_high`` = name ∓ t_{1−α/2, k−1} · name_se for each of ``names`` (NaN where k < 2)."""
    from scipy import stats

    t = stats.t.ppf(1 - alpha / 2, (table["k"] - 1).clip(lower=1)).astype(float)
    for name in names:
        table[f"{name}_low"] = table[name] - t * table[f"{name}_se"]
        table[f"{name}_high"] = table[name] + t * table[f"{name}_se"]
    return table


def coverage_table(points: pd.DataFrame, anchor: str = ANCHOR, alpha: float = 0.05) -> pd.DataFrame:
    """One row per method, model, experiment, complexity and point_id with k, deviation, uncertainty and coverage
    (each with its standard error and 1 − ``alpha`` interval: t for the first two, Wilson for coverage), x,
    in_distribution, truth, the anchor ratio and the below-anchor flag."""
    from analysis.intervals import wilson_interval

    df = _with_indicators(points)
    grouped = df.groupby(POINT, sort=True)
    extra = {"x": ("x", "first")} if "x" in df.columns else {}
    table = grouped.agg(
        k=("repetition", "count"),
        **extra,
        in_distribution=("in_distribution", "first"),
        truth=("truth", "first"),
        deviation=("deviation", "mean"),
        **_se("deviation"),
        uncertainty=("std", "mean"),
        **_se("uncertainty", "std"),
        coverage=("covered", "mean"),
    ).reset_index()
    table = _finish_se(table)
    table["coverage_se"] = np.sqrt(table["coverage"] * (1 - table["coverage"]) / table["k"])
    table = _t_intervals(table, ("deviation", "uncertainty"), alpha)
    table["coverage_low"], table["coverage_high"] = wilson_interval(
        np.rint(table["coverage"] * table["k"]), table["k"], alpha
    )
    table["in_distribution"] = table["in_distribution"].astype(bool)
    ratio = uncertainty_ratio(points, anchor)[POINT + ["anchor_uncertainty", "uncertainty_ratio", "below_anchor"]]
    return table.merge(ratio, on=POINT, how="left")


def coverage_summary(points: pd.DataFrame, anchor: str = ANCHOR, alpha: float = 0.05) -> pd.DataFrame:
    """Per method, model, experiment, complexity and region (in_distribution True / False): k repetitions,
    n_points, deviation, uncertainty and coverage with standard errors and 1 − ``alpha`` intervals over
    repetitions (t; Wilson for coverage), the mean over the region's points of the uncertainty ratio to the anchor, and the share of
    points below the anchor."""
    df = _with_indicators(points)
    region = CELL + ["in_distribution"]
    per_rep = df.groupby(region + ["repetition"], as_index=False).agg(
        deviation=("deviation", "mean"),
        uncertainty=("std", "mean"),
        coverage=("covered", "mean"),
        n_points=("point_id", "nunique"),
    )
    summary = (
        per_rep.groupby(region)
        .agg(
            k=("repetition", "count"),
            n_points=("n_points", "max"),
            deviation=("deviation", "mean"),
            **_se("deviation"),
            uncertainty=("uncertainty", "mean"),
            **_se("uncertainty"),
            coverage=("coverage", "mean"),
            **_se("coverage"),
        )
        .reset_index()
    )
    from analysis.intervals import wilson_interval

    summary = _t_intervals(_finish_se(summary), ("deviation", "uncertainty"), alpha)
    summary["coverage_low"], summary["coverage_high"] = wilson_interval(
        summary["coverage"] * summary["k"], summary["k"], alpha
    )
    table = coverage_table(points, anchor)
    ratios = table.groupby(region, as_index=False).agg(
        uncertainty_ratio=("uncertainty_ratio", "mean"), share_below_anchor=("below_anchor", "mean")
    )
    summary["in_distribution"] = summary["in_distribution"].astype(bool)
    ratios["in_distribution"] = ratios["in_distribution"].astype(bool)
    return summary.merge(ratios, on=region, how="left")


def x_array(value: object) -> np.ndarray:
    """A points row's input ``x`` (a scalar or a sequence) as a 1-D float array."""
    return np.atleast_1d(np.asarray(list(value) if not np.isscalar(value) else [value], dtype=float))


def named_points(points: pd.DataFrame) -> pd.DataFrame:
    """The test points the paper reports on, found by their inputs: experiment, complexity, point_id, label
    and ``order`` (the paper's order of the labels)."""
    from ursa_ray.data.synthetic_regression import named_points as named_inputs

    if "x" not in points.columns:
        return pd.DataFrame(columns=["experiment", "complexity", "point_id", "label", "order"])
    rows = []
    unique = points.drop_duplicates(["experiment", "complexity", "point_id"])
    for (experiment, complexity), group in unique.groupby(["experiment", "complexity"]):
        try:
            wanted = named_inputs(str(experiment), float(complexity))
        except (KeyError, ValueError):
            continue
        xs = [x_array(v) for v in group["x"]]
        for label, target in wanted.items():
            for point_id, x in zip(group["point_id"], xs):
                if x.shape == target.shape and np.allclose(x, target, atol=NAMED_TOLERANCE, rtol=0):
                    rows.append((experiment, float(complexity), int(point_id), label, len(rows)))
                    break
    return pd.DataFrame(rows, columns=["experiment", "complexity", "point_id", "label", "order"])


def named_point_table(points: pd.DataFrame, anchor: str = ANCHOR, alpha: float = 0.05) -> pd.DataFrame:
    """:func:`coverage_table` restricted to the named points, with their ``label``."""
    labels = named_points(points)
    if labels.empty:
        return labels
    table = coverage_table(points, anchor, alpha).merge(labels, on=["experiment", "complexity", "point_id"])
    first = table.groupby("label")["order"].transform("min")
    return table.assign(order=first).sort_values(["experiment", "order", "complexity"]).reset_index(drop=True)


def _interval(frame: pd.DataFrame, name: str, digits: int = 3) -> list[str]:
    """``mean [low, high]`` of column ``name`` per row (``mean`` alone where k < 2)."""
    from analysis.tables import format_number

    texts = []
    for value, low, high in zip(frame[name], frame[f"{name}_low"], frame[f"{name}_high"], strict=True):
        if isinstance(value, float) and math.isnan(value):
            texts.append("-")
        elif math.isnan(float(low)):
            texts.append(f"{format_number(float(value), digits)} (k = 1: no interval)")
        else:
            texts.append(
                f"{format_number(float(value), digits)} [{format_number(float(low), digits)}, "
                f"{format_number(float(high), digits)}]"
            )
    return texts


def method_order(methods: Iterable[str], anchor: str = ANCHOR) -> list[str]:
    """The anchor first (when present), then the other methods alphabetically, each once."""
    methods = list(dict.fromkeys(methods))
    return ([anchor] if anchor in methods else []) + sorted(m for m in methods if m != anchor)


def regression_markdown(points: pd.DataFrame, anchor: str = ANCHOR, alpha: float = 0.05) -> str:
    """Coverage tables as markdown: per experiment, the in-distribution / OOD summary and the named points,
    every quantity with its 1 − ``alpha`` interval over the k repetitions."""
    from analysis.tables import markdown_table

    if points.empty:
        return "no regression points"
    out = [
        f"Deviation |mean − truth|, uncertainty (std) and coverage (share of repetitions with "
        f"|mean − truth| ≤ {Z}·std; ideal 0.95) as mean [{1 - alpha:.0%} interval] over the k repetitions: "
        f"Wilson's interval with n = k for coverage (a proportion), Student's t otherwise. "
        f"`ratio` is the uncertainty divided by the anchor's ({anchor}); `below` flags an uncertainty below "
        f"the anchor's (then the prediction is biased or the uncertainty too small)."
    ]
    summary = coverage_summary(points, anchor, alpha)
    named = named_point_table(points, anchor, alpha)
    order = {m: i for i, m in enumerate(method_order(list(points["method"].unique()), anchor))}
    for experiment in sorted(summary["experiment"].unique()):
        s = summary[summary["experiment"] == experiment].copy()
        s["_o"] = s["method"].map(order)
        s = s.sort_values(["complexity", "in_distribution", "_o", "model"], ascending=[True, False, True, True])
        rows = pd.DataFrame(
            {
                "complexity": s["complexity"].map(lambda c: f"{c:g}"),
                "region": s["in_distribution"].map({True: "in-dist", False: "OOD"}),
                "method": s["method"],
                "model": s["model"],
                "k": s["k"].astype(int).astype(str),
                "deviation": _interval(s, "deviation"),
                "uncertainty": _interval(s, "uncertainty"),
                "coverage": _interval(s, "coverage"),
                "ratio": s["uncertainty_ratio"].astype(float),
                "share below": s["share_below_anchor"].astype(float),
            }
        )
        out += [
            "",
            f"### {experiment}: averages over in-distribution and OOD test points",
            "",
            markdown_table(rows, index=False),
        ]
        if not named.empty and (named["experiment"] == experiment).any():
            n = named[named["experiment"] == experiment].copy()
            n["_o"] = n["method"].map(order)
            n = n.sort_values(["order", "complexity", "_o", "model"])
            rows = pd.DataFrame(
                {
                    "point": n["label"] + n["in_distribution"].map({True: " (in-dist)", False: " (OOD)"}),
                    "complexity": n["complexity"].map(lambda c: f"{c:g}"),
                    "method": n["method"],
                    "model": n["model"],
                    "deviation": _interval(n, "deviation"),
                    "uncertainty": _interval(n, "uncertainty"),
                    "coverage": _interval(n, "coverage"),
                    "ratio": n["uncertainty_ratio"].astype(float),
                    "below": n["below_anchor"].map({True: "yes", False: ""}),
                }
            )
            out += ["", f"### {experiment}: named test points", "", markdown_table(rows, index=False)]
    return "\n".join(out)
