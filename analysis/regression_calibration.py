"""The regression report's proper scores and calibration curves, read from ``metrics.parquet`` only.

Every regression trial writes, on its test set (``ursa_ray.evaluation.metrics.regression_metrics``, docs/metrics.md):
the CRPS of its Gaussian predictive, the observed coverage of its central intervals at levels 0.05 … 0.95 (the
calibration curve, ``interval_coverage_05`` … ``_95``), the curve's miscalibration area, the sharpness (RMS
predictive std) and the 95% interval score.  On a synthetic experiment the test targets are the noise-free
truth and the predictive is the epistemic one (suffix ``_epistemic``); on data from files they are observed
targets (no suffix).  This module shows them per experiment: a table of (complexity, method, model) rows, each
score ``mean [1 − alpha interval over repetitions] n`` (Student's t), and a figure of the calibration curves,
one panel per complexity, the mean observed coverage over repetitions against the nominal level.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from analysis.composites import final_metrics
from ursa_ray.eval_sets import TEST

SCORES = ("crps", "miscalibration_area", "sharpness", "interval_score_95")
"""The scores of the table, by base name (lower is better for each but sharpness, which is read beside coverage)."""
CURVE = re.compile(r"interval_coverage_(\d\d)(_epistemic)?")


def regression_rows(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The final regression trials' test rows with a ``complexity`` column and a ``score`` column: the metric's
    base name without the ``_epistemic`` suffix (one kind of target per dataset)."""
    rows = final_metrics(metrics, trials, task="regression")
    rows = rows[rows["eval_set"] == TEST]
    complexity = trials.set_index("trial_id")["complexity"] if "complexity" in trials else pd.Series(dtype=float)
    rows = rows.assign(
        complexity=rows["trial_id"].map(complexity).astype(float),
        score=rows["metric"].str.removesuffix("_epistemic"),
    )
    return rows


def scores_markdown(rows: pd.DataFrame, alpha: float = 0.05) -> str:
    """Per experiment, the table of :data:`SCORES`; empty string when no trial has them."""
    from analysis.intervals import experiment_tables

    rows = rows[rows["score"].isin(SCORES)].assign(complexity=lambda r: r["complexity"].fillna(-1.0))
    if rows.empty:
        return ""
    legend = (
        "Proper scores and calibration of each method's Gaussian predictive on the test set (against the "
        "noise-free truth on synthetic experiments): CRPS, the miscalibration area of the central-interval "
        "calibration curve, sharpness (RMS predictive std) and the 95% interval score; lower is better for all "
        f"but sharpness; mean [{1 - alpha:.0%} interval over repetitions] n (docs/metrics.md)."
    )
    return "\n\n".join([legend, *experiment_tables(rows, "score", SCORES, alpha)])


def calibration_curves(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (dataset, complexity, method, model, level): the mean observed coverage over repetitions."""
    levels = rows["metric"].str.extract(CURVE)[0]
    curve = rows[levels.notna()].assign(level=levels.dropna().astype(int) / 100)
    keys = ["dataset", "complexity", "method", "model", "level"]
    return curve.groupby(keys, as_index=False, dropna=False)["value"].mean()


def plot_calibration_curves(curves: pd.DataFrame, dataset: str, path: Path) -> Path:
    """One panel per complexity: each (method, model)'s observed coverage against the nominal level, with the
    diagonal of perfect calibration (above it: intervals too wide, below: too narrow)."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    these = curves[curves["dataset"] == dataset]
    complexities = sorted(these["complexity"].unique(), key=lambda c: (pd.isna(c), c))
    fig, axes = plt.subplots(1, len(complexities), figsize=(3.6 * len(complexities), 3.6), squeeze=False)
    for ax, complexity in zip(axes[0], complexities):
        panel = these[these["complexity"] == complexity] if pd.notna(complexity) else these[these["complexity"].isna()]
        for (method, model), line in panel.groupby(["method", "model"]):
            ax.plot(line["level"], line["value"], marker=".", label=f"{method} ({model})")
        ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.8)
        ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="nominal level of the central interval", ylabel="observed coverage")
        ax.set_title(f"{dataset}" + (f", complexity {complexity:g}" if pd.notna(complexity) else ""), fontsize=9)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def regression_calibration_section(
    metrics: pd.DataFrame, trials: pd.DataFrame, figures_dir: Path, alpha: float = 0.05
) -> tuple[str, list[Path]]:
    """The table (:func:`scores_markdown`) and one calibration-curve figure per experiment
    (``figures/<dataset>_calibration_curves.png``); ``("", [])`` without regression scores."""
    rows = regression_rows(metrics, trials)
    text = scores_markdown(rows, alpha)
    if not text:
        return "", []
    curves = calibration_curves(rows)
    figures = [
        plot_calibration_curves(curves, dataset, figures_dir / f"{dataset}_calibration_curves.png")
        for dataset in sorted(curves["dataset"].unique())
    ]
    return text, figures
