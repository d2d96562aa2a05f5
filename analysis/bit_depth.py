"""The effect of the bit depth at which posterior samples are stored (URSABench's test-time storage).

Each final classification trial also evaluates its posterior predictive with every sample's weights
rounded to float16 or bfloat16, or int8-quantised per output channel (``SET@SCHEME`` evaluation sets,
``ursa_ray.evaluation.test_time_cost``).  Per method and scheme, over the in-domain cells (seed means,
then cell means, as the composites): test accuracy, test NLL and OOD AUROC by mutual information (mean
over the OOD sets), beside the float32 values.
"""

from __future__ import annotations

import pandas as pd

from analysis.composites import decision_task_datasets, final_metrics
from ursa_ray.eval_sets import kinds_by_name, parse

COLUMNS = {"accuracy": "accuracy", "nll": "nll", "ood_auroc_mi": "ood_auroc"}


def bit_depth_table(
    metrics: pd.DataFrame, trials: pd.DataFrame, alpha: float | None = None, interval: str = "t"
) -> pd.DataFrame:
    """Rows (method, scheme) with scheme ``float32`` first; columns accuracy, nll, ood_auroc (empty frame
    when no trial evaluated a lower bit depth); with ``alpha``, text cells ``mean [low, high] n=seeds``
    (:func:`analysis.intervals.grouped_intervals`, per-cell ``interval``: ``t`` or ``bootstrap``; OOD sets
    averaged within each trial)."""
    final = final_metrics(metrics, trials)
    final = final[~final["dataset"].isin(decision_task_datasets(trials)) & final["metric"].isin(COLUMNS)]
    final = final[final["eval_kind"].isin(("in_domain", "ood", "bit_depth"))]
    final = final[final["method"].isin(set(final.loc[final["eval_kind"] == "bit_depth", "method"]))]  # no variants
    parsed = {name: parse(name) for name in final["eval_set"].unique()}
    final = final.assign(
        base_set=final["eval_set"].map(lambda s: parsed[s].base),
        scheme=final["eval_set"].map(lambda s: parsed[s].scheme or "float32"),
    )
    if (final["scheme"] == "float32").all():
        return pd.DataFrame()
    base_kind = final["base_set"].map(kinds_by_name(final["base_set"].unique()))
    final = final[
        ((base_kind == "in_domain") & (final["metric"] != "ood_auroc_mi"))
        | ((base_kind == "ood") & (final["metric"] == "ood_auroc_mi"))
    ]
    if alpha is not None:
        from analysis.intervals import grouped_intervals, interval_pivot

        table = (
            interval_pivot(
                grouped_intervals(final, ["method", "scheme", "metric"], alpha, interval),
                ["method", "scheme"],
                "metric",
            )
            .rename(columns=COLUMNS)
            .fillna("-")
        )
    else:
        seed_means = final.groupby(["method", "scheme", "metric", "model", "dataset", "base_set"])["value"].mean()
        table = seed_means.groupby(["method", "scheme", "metric"]).mean().unstack("metric").rename(columns=COLUMNS)
    order = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}
    table = table.reset_index().sort_values(
        ["method", "scheme"], key=lambda c: c.map(order) if c.name == "scheme" else c
    )
    return table.set_index(["method", "scheme"])[[c for c in COLUMNS.values() if c in table.columns]]
