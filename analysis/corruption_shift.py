"""Accuracy and calibration under common corruptions (Hendrycks & Dietterich 2019), summarised as Ovadia et
al. (2019) do: per severity, the distribution over corruption types.

Reads the ``corrupt:TYPE:SEVERITY`` evaluation sets of final classification trials (in-domain cells).  The
table gives per (method, severity) and metric two things: the mean over corruption types with its interval
over seeds (each seed's mean over types, then :func:`analysis.intervals.grouped_intervals`: per cell over seeds,
over cells with equal weight), and the inter-quartile range over types of the per-type means (over seeds,
then cells), which says how much the corruption type matters, not how sure the mean is.  The figure draws
the per-type means as box plots.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.composites import decision_task_datasets, final_metrics  # noqa: E402
from analysis.intervals import grouped_intervals, interval_text  # noqa: E402
from ursa_ray.eval_sets import parse  # noqa: E402

METRICS = ("accuracy", "ece")


def severity_summary(values: pd.DataFrame, metrics: Sequence[str], by: Sequence[str] = ()) -> pd.DataFrame:
    """Ovadia et al. (2019)'s summary of a metric under corruption: per severity, its distribution over the
    corruption types.

    ``values`` has one row per (``by``…, ``corruption``, ``severity``) and a column per metric.  Returns one
    row per (``by``…, ``severity``, ``metric``) with ``n_corruptions`` and, over the corruption types, the
    ``mean``, ``min``, quartiles ``q25``, ``median``, ``q75`` (linear interpolation between order statistics,
    as numpy's and matplotlib's box plots) and ``max``.  Raises ``ValueError`` if a (``by``…,
    ``corruption``, ``severity``) appears twice (average seeds first) or a column is missing.
    """
    keys = [*by, "severity"]
    missing = [c for c in [*keys, "corruption", *metrics] if c not in values.columns]
    if missing:
        raise ValueError(f"severity_summary: missing columns {missing}; present: {list(values.columns)}")
    repeated = values.duplicated([*keys, "corruption"], keep=False)
    if repeated.any():
        first = values.loc[repeated, [*keys, "corruption"]].iloc[0].to_dict()
        raise ValueError(f"severity_summary: more than one row for {first}")
    long = values.melt(id_vars=[*keys, "corruption"], value_vars=list(metrics), var_name="metric")
    grouped = long.groupby([*keys, "metric"], sort=True)["value"]
    summary = grouped.agg(
        n_corruptions="count",
        mean="mean",
        min="min",
        q25=lambda v: v.quantile(0.25),
        median="median",
        q75=lambda v: v.quantile(0.75),
        max="max",
    )
    return summary.reset_index()


def corruption_rows(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The final in-domain rows of the corruption sets for :data:`METRICS`, one per (trial, set, metric), with
    ``corruption`` and ``severity`` columns (empty when there are none)."""
    final = final_metrics(metrics, trials)
    final = final[
        (final["eval_kind"] == "corruption")
        & final["metric"].isin(METRICS)
        & ~final["dataset"].isin(decision_task_datasets(trials))
    ]
    if final.empty:
        return pd.DataFrame()
    parsed = {name: parse(name) for name in final["eval_set"].unique()}
    return final.assign(
        corruption=final["eval_set"].map(lambda s: parsed[s].corruption),
        severity=final["eval_set"].map(lambda s: parsed[s].severity).astype(int),
    )


def corruption_values(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, corruption, severity) of ``rows`` (:func:`corruption_rows`), a column per metric
    (means over seeds, then cells)."""
    keys = ["method", "corruption", "severity", "metric"]
    seed_means = rows.groupby([*keys, "model", "dataset"])["value"].mean()
    return seed_means.groupby(keys).mean().unstack("metric").reset_index()


def corruption_table(rows: pd.DataFrame, alpha: float = 0.05, how: str = "t") -> pd.DataFrame:
    """Per (method, severity), for each metric of ``rows`` (:func:`corruption_rows`): ``METRIC`` the mean over
    corruption types as ``mean [low, high] n=seeds`` (the 1 − ``alpha`` interval over seeds, ``how``: ``t`` or
    ``bootstrap``, propagated over cells) and ``METRIC IQR over types`` as ``[q25, q75]``."""
    intervals = grouped_intervals(rows, ["method", "severity", "metric"], alpha, how)
    intervals["text"] = [interval_text(r.mean, r.low, r.high, r.seeds) for r in intervals.itertuples()]
    shown = intervals.pivot(index=["method", "severity"], columns="metric", values="text")
    values = corruption_values(rows)
    summary = severity_summary(values, [m for m in METRICS if m in values.columns], by=["method"])
    summary["text"] = [f"[{r.q25:.3f}, {r.q75:.3f}]" for r in summary.itertuples()]
    spread = summary.pivot(index=["method", "severity"], columns="metric", values="text")
    columns = {}
    for metric in [m for m in METRICS if m in shown.columns]:
        columns[metric] = shown[metric]
        columns[f"{metric} IQR over types"] = spread[metric]
    return pd.DataFrame(columns)


def plot_corruption_shift(values: pd.DataFrame, path: Path) -> Path:
    """Box plots over corruption types of accuracy and ECE against severity, one panel per method and metric."""
    path.parent.mkdir(parents=True, exist_ok=True)
    methods = sorted(values["method"].unique())
    metrics = [m for m in METRICS if m in values.columns]
    fig, axes = plt.subplots(
        len(metrics), len(methods), figsize=(2.4 * len(methods), 2.8 * len(metrics)), squeeze=False, sharey="row"
    )
    for i, metric in enumerate(metrics):
        for j, method in enumerate(methods):
            rows = values[values["method"] == method]
            severities = sorted(rows["severity"].unique())
            axes[i, j].boxplot([rows.loc[rows["severity"] == s, metric] for s in severities], tick_labels=severities)
            axes[i, j].set_title(method if i == 0 else "", fontsize=8)
            axes[i, j].set_xlabel("severity" if i == len(metrics) - 1 else "")
        axes[i, 0].set_ylabel(metric)
    fig.suptitle("Common corruptions: distribution over corruption types")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
