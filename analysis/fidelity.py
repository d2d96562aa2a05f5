"""The fidelity section of the report: each method's posterior predictive against its cell's reference
posterior (multi-chain HMC, docs/fidelity.md), read from ``metrics.parquet`` only.

One table per (model, dataset) cell, one row per method, means over seeds of the final trials' ``fidelity:test``
metrics: top-1 agreement, total variation and KL(reference ‖ method); TV averaged over the OOD sets; the
reference's own noise floor (the same metrics between two halves of its chains) and its checks (largest
split-R̂, smallest bulk ESS).  A reference that failed its checks gets a warning line above its table.
"""

from __future__ import annotations

import pandas as pd

from analysis.composites import final_metrics
from analysis.tables import markdown_table
from ursa_ray.eval_sets import TEST, fidelity


def fidelity_frame(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, dataset, method) with the mean over seeds of every ``fidelity:test`` metric, and
    ``tv_ood``: the mean of ``total_variation`` over the ``fidelity:`` OOD sets."""
    rows = final_metrics(metrics, trials, task=None)
    rows = rows[rows["eval_kind"] == "fidelity"]
    if rows.empty:
        return pd.DataFrame()
    keys = ["model", "dataset", "method"]
    on_test = rows["eval_set"] == fidelity(TEST)
    test = rows[on_test].pivot_table(index=keys, columns="metric", values="value", aggfunc="mean")
    ood = rows[~on_test & (rows["metric"] == "total_variation")]
    if not ood.empty:
        test["tv_ood"] = ood.groupby(keys)["value"].mean()
    return test


COLUMNS = (
    ("agreement", "agreement"),
    ("total_variation", "TV"),
    ("kl", "KL(ref‖method)"),
    ("tv_ood", "TV (OOD mean)"),
    ("noise_agreement", "noise floor agreement"),
    ("noise_total_variation", "noise floor TV"),
    ("rhat_max", "ref R̂ max"),
    ("ess_bulk_min", "ref ESS min"),
)


def fidelity_markdown(metrics: pd.DataFrame, trials: pd.DataFrame) -> str:
    """The fidelity tables, one per cell (empty string when no trial was scored against a reference)."""
    frame = fidelity_frame(metrics, trials)
    if frame.empty:
        return ""
    parts = [
        "Each method's posterior predictive on the test set against its cell's reference posterior (the grid's "
        "`reference`: multi-chain full-batch HMC with the grid's prior and temperature, whatever the method's own "
        "prior). Means over seeds. The noise floor is the same metric between two halves of the reference's "
        "chains: a method within it is as close as a second run of the reference."
    ]
    for (model, dataset), table in frame.groupby(level=["model", "dataset"]):
        table = table.droplevel(["model", "dataset"])
        shown = table[[c for c, _ in COLUMNS if c in table.columns]].rename(columns=dict(COLUMNS))
        parts.append(f"### {model} / {dataset}")
        if "converged" in table.columns and (table["converged"] < 1).any():
            parts.append(
                "**Warning: the reference did not pass its convergence checks (R̂ ≤ 1.1 and bulk ESS ≥ 100 by "
                "default); these figures are measured against an unconverged reference.**"
            )
        parts.append(markdown_table(shown.sort_values("TV") if "TV" in shown.columns else shown))
    return "\n\n".join(parts)
