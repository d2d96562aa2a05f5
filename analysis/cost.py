"""Compute-cost report: hyperparameter search + inference, per method and cell.

Every trial of every phase (search, final and a reference posterior's) counts, whatever its status (ok,
early_stopped, failed).  Reserved compute is the resources a trial requested × its wall time from start to
finish as seen by the driver (worker start-up and data loading included): ``reserved_cpu_s`` and
``reserved_gpu_s`` in trials.parquet.
Totals here are plain sums of those rows, so they can be checked against trials.parquet directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.composites import calibrated_variant, not_ranked_note  # noqa: E402
from analysis.pareto import plot_pareto  # noqa: E402
from analysis.tables import markdown_table  # noqa: E402

HOUR = 3600.0
COMPUTE_LABEL = "search + inference CPU-hours (reserved) of the method"


def cost_table(trials: pd.DataFrame, metrics: pd.DataFrame) -> pd.DataFrame:
    """Per (method, cell): search, final and total reserved CPU-hours and GPU-hours, trial counts, and the
    final phase's mean seconds per posterior sample and per test prediction.  With reference posteriors
    (phase ``reference``, method ``reference``) also the reference phase's trials and hours, in the totals."""
    if trials.empty:
        return pd.DataFrame()
    frame = trials.assign(cell_name=trials["cell"].str.split("/", n=1).str[1])
    sums = frame.pivot_table(
        index=["method", "cell_name"],
        columns="phase",
        values=["reserved_cpu_s", "reserved_gpu_s"],
        aggfunc="sum",
        fill_value=0.0,
    )
    counts = frame.pivot_table(
        index=["method", "cell_name"], columns="phase", values="trial_id", aggfunc="count", fill_value=0
    )
    out = pd.DataFrame(index=sums.index)
    phases = ["search", "final", *(["reference"] if "reference" in counts else [])]
    for phase in phases:
        out[f"{phase}_trials"] = counts[phase] if phase in counts else 0
        out[f"{phase}_cpu_h"] = sums[("reserved_cpu_s", phase)] / HOUR if ("reserved_cpu_s", phase) in sums else 0.0
        out[f"{phase}_gpu_h"] = sums[("reserved_gpu_s", phase)] / HOUR if ("reserved_gpu_s", phase) in sums else 0.0
    out["total_cpu_h"] = sum(out[f"{phase}_cpu_h"] for phase in phases)
    out["total_gpu_h"] = sum(out[f"{phase}_gpu_h"] for phase in phases)
    if not metrics.empty:
        final = metrics[(metrics["phase"] == "final") & (metrics["eval_set"] == "cost")]
        trial_cell = frame.set_index("trial_id")["cell_name"]
        final = final.assign(cell_name=final["trial_id"].map(trial_cell))
        per = final.pivot_table(index=["method", "cell_name"], columns="metric", values="value", aggfunc="mean")
        for metric in ("s_per_sample", "predict_s_per_example"):
            if metric in per:
                out[metric] = per[metric].reindex(out.index)
    out.index.names = ["method", "cell"]
    return out.sort_index()


def anytime_curves(trials: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per searched cell: trials in finishing order with cumulative reserved CPU-hours and the best
    selection metric found so far (the metric named in the trial's ``selection``, minimised or maximised
    as the grid's search block says: ``val_accuracy`` is maximised, every other metric minimised)."""
    search = trials[trials["phase"] == "search"].sort_values("finished_at")
    curves = {}
    for cell, rows in search.groupby("cell"):
        selection = rows["selection"].map(lambda s: json.loads(s) if isinstance(s, str) and s else {})
        metric = _selection_metric(selection)
        if metric is None:
            continue
        values = selection.map(lambda d: d.get(metric, np.nan)).astype(float)
        sign = -1.0 if metric == "val_accuracy" else 1.0
        best = (sign * values).cummin() * sign
        curves[cell] = pd.DataFrame(
            {
                "cpu_h": rows["reserved_cpu_s"].cumsum().to_numpy() / HOUR,
                "value": values.to_numpy(),
                "best": best.to_numpy(),
                "metric": metric,
            }
        )
    return curves


def _selection_metric(selection: pd.Series) -> str | None:
    for d in selection:
        if d:
            return "val_nll" if "val_nll" in d else sorted(d)[0]
    return None


def cost_markdown(
    trials: pd.DataFrame, metrics: pd.DataFrame, scores: pd.DataFrame, figures_dir: Path
) -> tuple[str, list[Path]]:
    """The cost section of report.md and the anytime and Pareto figures it refers to; ``scores`` are the
    composite scores (:func:`~analysis.composites.composite_scores`) for the Pareto figure."""
    table = cost_table(trials, metrics)
    if table.empty:
        return "no trials", []
    totals = table[[c for c in table if c.endswith("_cpu_h")] + [c for c in table if c.endswith("_gpu_h")]].sum()
    text = [
        markdown_table(table, digits=4),
        "",
        "All cells: "
        + ", ".join(f"{k} = {v:.4f}" for k, v in totals.items())
        + " (reserved resources × wall time; every trial of every phase counted, whatever its status).",
    ]
    figures = []
    curves = anytime_curves(trials)
    if curves:
        figures.append(_plot_anytime(curves, figures_dir / "search_anytime.png"))
    if not scores.empty:
        compute = compute_hours(trials, scores.index)
        figures.append(plot_pareto(scores, compute, COMPUTE_LABEL, figures_dir / "pareto_compute.png"))
        not_ranked = not_ranked_note(metrics, trials) if not metrics.empty else ""
        text += ["", f"Pareto fronts against compute: {not_ranked}"] if not_ranked else []
    return "\n".join(text), figures


def compute_hours(trials: pd.DataFrame, methods: pd.Index) -> pd.Series:
    """Per method of ``methods`` (the composite table's labels): the reserved CPU-hours of its classification
    trials of the search and final phases.  A calibrated variant (``METHOD@calibrated``) is its method's
    trials, so it costs what they did; a method without trials gets NaN."""
    classification = trials[trials["task"] == "classification"]
    per_method = classification.groupby("method")["reserved_cpu_s"].sum() / HOUR
    of_method = methods.str.removesuffix(calibrated_variant(""))
    return pd.Series(per_method.reindex(of_method).to_numpy(), index=methods)


def _plot_anytime(curves: dict[str, pd.DataFrame], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for cell, curve in curves.items():
        ax.step(curve["cpu_h"], curve["best"], where="post", label=cell)
        ax.scatter(curve["cpu_h"], curve["value"], s=10, alpha=0.5)
    metric = next(iter(curves.values()))["metric"].iloc[0]
    ax.set_xlabel("cumulative search compute (reserved CPU-hours)")
    ax.set_ylabel(f"best {metric} so far")
    ax.set_title("Hyperparameter search: anytime performance")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
