"""URSABench's composite scores, and a rank summary across methods.

A *cell* is one (model, in-domain dataset) pair.  Every metric is first averaged over seeds within its
cell (and, for OOD metrics, kept per OOD set); a composite then averages those cell means:

- ``accuracy``: test accuracy averaged over models and in-domain test sets;
- ``nll``: test NLL averaged likewise (lower is better);
- ``misclass_auroc``: misclassification-detection AUROC with the predictive-entropy score, averaged likewise;
- ``ood_auroc``: OOD-detection AUROC with total predictive entropy, averaged over models and (dataset, OOD set);
- ``ood_auroc_mi``: the same with mutual information (knowledge uncertainty);
- ``decision_cost``: mean cost per test example of the Bayes decision, over cells whose dataset defines a
  cost matrix (the ``*_imbalanced`` decision-task sets; lower is better);
- ``s_per_sample``: training seconds per posterior sample, averaged likewise (lower is better);
- ``mean_rank``: for each cell and each of the composite metrics above except cost, methods are ranked
  (1 = best, ties share the mean rank); a method's mean rank averages its ranks over all (cell, metric).

Only classification trials count (regression is judged against the anchor model instead).
Cells a method lacks (failed or not run) are left out of its averages, never filled in; the ``cells``
column says over how many cells each method was averaged, and ``complete`` is false when a method has
fewer cells than the most complete method, so its composite is not directly comparable.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

COMPOSITES = {
    # name: (eval-set kind, metric, higher is better)
    "accuracy": ("test", "accuracy", True),
    "nll": ("test", "nll", False),
    "misclass_auroc": ("test", "misclass_auroc_entropy", True),
    "ood_auroc": ("ood", "ood_auroc_entropy", True),
    "ood_auroc_mi": ("ood", "ood_auroc_mi", True),
    "decision_cost": ("test", "decision_cost", False),
    "s_per_sample": ("cost", "s_per_sample", False),
}
RANKED = ("accuracy", "nll", "misclass_auroc", "ood_auroc", "ood_auroc_mi")


def final_metrics(metrics: pd.DataFrame, trials: pd.DataFrame, task: str | None = "classification") -> pd.DataFrame:
    """Metric rows of final-phase trials that finished ok (of one task, unless ``task`` is None)."""
    keep = (trials["phase"] == "final") & (trials["status"] == "ok")
    if task is not None:
        keep &= trials["task"] == task
    ok = trials.loc[keep, "trial_id"]
    return metrics[metrics["trial_id"].isin(ok) & (metrics["phase"] == "final")]


def cell_means(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (composite, method, model, dataset, eval_set): the mean over seeds."""
    final = final_metrics(metrics, trials)
    frames = []
    for name, (kind, metric, _) in COMPOSITES.items():
        rows = final[final["metric"] == metric]
        if kind == "test":
            rows = rows[rows["eval_set"] == "test"]
        if name == "decision_cost":
            rows = rows[rows["dataset"].str.endswith("_imbalanced")]
        elif kind == "test":
            rows = rows[~rows["dataset"].str.endswith("_imbalanced")]
        if rows.empty:
            continue
        means = rows.groupby(["method", "model", "dataset", "eval_set"], as_index=False)["value"].mean()
        means.insert(0, "composite", name)
        frames.append(means)
    if not frames:
        return pd.DataFrame(columns=["composite", "method", "model", "dataset", "eval_set", "value"])
    return pd.concat(frames, ignore_index=True)


def composite_scores(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """One row per method: the composites, the mean rank, and how many cells each average covers."""
    cells = cell_means(metrics, trials)
    if cells.empty:
        return pd.DataFrame()
    table = cells.groupby(["method", "composite"])["value"].mean().unstack("composite")
    table = table[[c for c in COMPOSITES if c in table.columns]]
    ranks = []
    for name in RANKED:
        rows = cells[cells["composite"] == name]
        if rows.empty:
            continue
        higher = COMPOSITES[name][2]
        ranked = rows.groupby(["model", "dataset", "eval_set"])["value"].rank(ascending=not higher, method="average")
        ranks.append(pd.DataFrame({"method": rows["method"], "rank": ranked}))
    if ranks:
        table["mean_rank"] = pd.concat(ranks).groupby("method")["rank"].mean()
    n_cells = cells[cells["composite"] == "accuracy"].groupby("method").size() if "accuracy" in table else cells.groupby("method").size()
    table["cells"] = n_cells.reindex(table.index).fillna(0).astype(int)
    table["complete"] = table["cells"] == table["cells"].max()
    return table.sort_values("mean_rank" if "mean_rank" in table else table.columns[0])


def better_direction() -> dict[str, str]:
    return {name: ("higher" if higher else "lower") for name, (_, _, higher) in COMPOSITES.items()} | {"mean_rank": "lower"}


def per_cell_table(
    metrics: pd.DataFrame, trials: pd.DataFrame, metric: str, eval_set: str, task: str | None = "classification"
) -> pd.DataFrame:
    """Mean ± std over seeds of one metric on one evaluation set: rows methods, columns model/dataset
    (trials of one task, or of every task when ``task`` is None)."""
    final = final_metrics(metrics, trials, task=task)
    rows = final[(final["metric"] == metric) & (final["eval_set"] == eval_set)]
    if rows.empty:
        return pd.DataFrame()
    stats = rows.groupby(["method", "model", "dataset"])["value"].agg(["mean", "std"]).reset_index()
    stats["text"] = [
        f"{m:.3f} ± {0.0 if np.isnan(s) else s:.3f}" for m, s in zip(stats["mean"], stats["std"], strict=True)
    ]
    stats["cell"] = stats["model"] + " / " + stats["dataset"]
    return stats.pivot(index="method", columns="cell", values="text").fillna("-")
