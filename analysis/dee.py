"""The deep-ensemble equivalent (DEE) of every method, read from ``metrics.parquet`` only.

Ashukha, Lyzhov, Molchanov & Vetrov (2020, "Pitfalls of in-domain uncertainty estimation and ensembling in
deep learning", §4): the DEE of a method is the number of members a deep ensemble of the same cell needs to
reach the method's calibrated log-likelihood,

    DEE(method) = min { l ∈ ℝ, l ≥ 1 : CLL_DE(l) ≥ CLL(method) },

with CLL_DE(l) the ensemble's calibrated log-likelihood at l members, linear between whole numbers.  Here in
calibrated NLL (CLL = −``nll_calibrated``): the smallest l ≥ 1 at which the ensemble's curve is at or below the
method's ``nll_calibrated`` on the test set.  The curve is the ``members:M`` sets a ``deep_ensemble`` trial
writes (its test metrics after each member, ``ursa_ray/evaluation/probes/members.py``); both sides are means
over the cell's seeds.  A method no better than one member has DEE 1 (the definition's floor); one better than
the whole measured ensemble of M members has none (shown ``> M``: the curve is not extrapolated).  A cell
without an ensemble has no DEE, and the report names it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis.composites import final_metrics
from ursa_ray.eval_sets import TEST, parse

METRIC = "nll_calibrated"


def deep_ensemble_equivalent(curve: np.ndarray, nll: float) -> float:
    """DEE of a method with calibrated NLL ``nll`` on the ensemble's curve (``curve[m − 1]`` the calibrated
    NLL of m members): 1 where one member is already at or below it, else the first crossing, interpolated
    linearly between member counts, else NaN (better than the whole ensemble)."""
    if curve[0] <= nll:
        return 1.0
    for m in range(1, len(curve)):
        if curve[m] <= nll:  # crossed between m and m + 1 members (curve[m - 1] > nll >= curve[m])
            return m + (curve[m - 1] - nll) / (curve[m - 1] - curve[m])
    return math.nan


def ensemble_curves(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (model, dataset, ensemble method label, members): the mean over seeds of ``nll_calibrated`` on the
    ``members:M`` sets."""
    rows = final_metrics(metrics, trials)
    rows = rows[(rows["eval_kind"] == "members") & (rows["metric"] == METRIC)]
    rows = rows.assign(members=rows["eval_set"].map(lambda s: parse(s).n_members))
    return rows.groupby(["model", "dataset", "method", "members"], as_index=False)["value"].mean()


def dee_table(metrics: pd.DataFrame, trials: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """(DEE per method and cell as text, rows methods and columns ``model / dataset [ensemble]``; the cells
    that have methods but no ensemble curve).  Where a cell has several ensemble entries, the one labelled
    ``deep_ensemble`` gives the curve, else the first label."""
    curves = ensemble_curves(metrics, trials)
    final = final_metrics(metrics, trials)
    nll = final[(final["eval_set"] == TEST) & (final["metric"] == METRIC)]
    nll = nll.groupby(["model", "dataset", "method"])["value"].mean()
    rows, missing = [], []
    for (model, dataset), methods in nll.groupby(level=["model", "dataset"]):
        cell = curves[(curves["model"] == model) & (curves["dataset"] == dataset)]
        if cell.empty:
            missing.append(f"{model}/{dataset}")
            continue
        labels = sorted(set(cell["method"]))
        ensemble = "deep_ensemble" if "deep_ensemble" in labels else labels[0]
        curve = cell[cell["method"] == ensemble].sort_values("members")
        if list(curve["members"]) != list(range(1, len(curve) + 1)):
            raise ValueError(f"{model}/{dataset}: {ensemble}'s members:M sets are not 1..M: {list(curve['members'])}")
        column = f"{model} / {dataset} [{ensemble}, M = {len(curve)}]"
        for (_, _, method), value in methods.items():
            dee = deep_ensemble_equivalent(curve["value"].to_numpy(), float(value))
            rows.append(
                {"method": method, "cell": column, "dee": f"> {len(curve)}" if math.isnan(dee) else f"{dee:.2f}"}
            )
    if not rows:
        return pd.DataFrame(), missing
    return pd.DataFrame(rows).pivot(index="method", columns="cell", values="dee").fillna("-"), missing


def dee_markdown(metrics: pd.DataFrame, trials: pd.DataFrame) -> str:
    """The report's DEE table with its legend, or the line saying why there is none."""
    table, missing = dee_table(metrics, trials)
    why = (
        f"No DEE for {', '.join(missing)}: no `deep_ensemble` entry in the cell, so no ensemble curve to read it on."
        if missing
        else ""
    )
    if table.empty:
        return why
    from analysis.tables import markdown_table

    legend = (
        "Deep-ensemble equivalent (Ashukha et al. 2020): the number of deep-ensemble members of the same cell "
        "whose calibrated NLL equals the method's (test set, means over seeds; linear between member counts; "
        "1: no better than one member; > M: better than the whole measured ensemble)."
    )
    return "\n\n".join(part for part in (legend, markdown_table(table), why) if part)
