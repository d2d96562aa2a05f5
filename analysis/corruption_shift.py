"""Accuracy and calibration under common corruptions (Hendrycks & Dietterich 2019), summarised as Ovadia et
al. (2019) do: per severity, the distribution over corruption types.

Reads the ``corrupt:TYPE:SEVERITY`` evaluation sets of final classification trials (in-domain cells):
each metric is averaged over seeds, then over in-domain cells, per (method, type, severity); the table gives
per (method, severity) the mean, quartiles and extremes over types, and the figure draws them as box plots.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.composites import decision_task_datasets, final_metrics  # noqa: E402
from ursa_ray.evaluation.corruptions import severity_summary  # noqa: E402

METRICS = ("accuracy", "ece")


def corruption_values(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """One row per (method, corruption, severity), a column per metric (means over seeds, then cells)."""
    final = final_metrics(metrics, trials)
    final = final[
        final["eval_set"].str.startswith("corrupt:")
        & final["metric"].isin(METRICS)
        & ~final["dataset"].isin(decision_task_datasets(trials))
    ]
    if final.empty:
        return pd.DataFrame()
    parts = final["eval_set"].str.split(":")
    final = final.assign(corruption=parts.str[1], severity=parts.str[2].astype(int))
    keys = ["method", "corruption", "severity", "metric"]
    seed_means = final.groupby([*keys, "model", "dataset"])["value"].mean()
    return seed_means.groupby(keys).mean().unstack("metric").reset_index()


def corruption_table(values: pd.DataFrame) -> pd.DataFrame:
    """Per (method, severity): mean, median and inter-quartile range over corruption types of accuracy and ECE."""
    summary = severity_summary(values, [m for m in METRICS if m in values.columns], by=["method"])
    summary["text"] = [f"{r.mean:.3f} [{r.q25:.3f}, {r.q75:.3f}]" for r in summary.itertuples()]
    return summary.pivot(index=["method", "severity"], columns="metric", values="text")


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
