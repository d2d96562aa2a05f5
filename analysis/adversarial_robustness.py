"""Robustness of the posterior predictive to adversarial examples: accuracy, attack success rate and the
detection AUROC by mutual information against ε, per method and attack.

Reads the ``adv:ATTACK_epsE`` (white box, crafted on the method's own model average) and
``transfer:ATTACK_epsE`` (crafted on the SGD network of the same model, dataset and seed; attack named
``transfer-ATTACK``) evaluation sets of final classification trials (in-domain cells): each metric is
averaged over seeds, then over cells, per (method, attack, ε).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.composites import decision_task_datasets, final_metrics  # noqa: E402
from ursa_ray.eval_sets import parse  # noqa: E402

METRICS = ("accuracy", "attack_success_rate", "adv_auroc_mi")


def adversarial_table(
    metrics: pd.DataFrame, trials: pd.DataFrame, alpha: float | None = None, interval: str = "t"
) -> pd.DataFrame:
    """Rows (method, attack, epsilon), columns accuracy, attack_success_rate, adv_auroc_mi; with ``alpha``,
    text cells ``mean [low, high] n=seeds`` (:func:`analysis.intervals.grouped_intervals`, per-cell ``interval``:
    ``t`` or ``bootstrap``)."""
    final = final_metrics(metrics, trials)
    final = final[
        final["eval_kind"].isin(("adversarial", "transfer")) & ~final["dataset"].isin(decision_task_datasets(trials))
    ]
    attacks = {name: parse(name).attack for name in final["eval_set"].unique()}  # None: the clean examples
    final = final[final["eval_set"].map(attacks).notna()]
    if final.empty:
        return pd.DataFrame()
    on = ["trial_id", "method", "eval_set"]  # a trial's method and its calibrated variant share its sets
    epsilon = final[final["metric"] == "epsilon"].set_index(on)["value"]
    final = final[final["metric"].isin(METRICS)].join(epsilon.rename("epsilon"), on=on)
    attack = final["eval_set"].map(attacks)
    final = final.assign(attack=attack.where(final["eval_kind"] == "adversarial", "transfer-" + attack))
    keys = ["method", "attack", "epsilon", "metric"]
    if alpha is not None:
        from analysis.intervals import grouped_intervals, interval_pivot

        table = interval_pivot(grouped_intervals(final, keys, alpha, interval), keys[:3], "metric")
        return table[[m for m in METRICS if m in table.columns]].fillna("-")
    seed_means = final.groupby([*keys, "model", "dataset"])["value"].mean()
    return seed_means.groupby(keys).mean().unstack("metric")[[m for m in METRICS]]


def robustness_skipped(metrics: pd.DataFrame, trials: pd.DataFrame) -> list[str]:
    """Datasets of final classification cells (decision tasks aside) scored on the test set but on no
    adversarial, transfer or corruption set: attacks and corruptions perturb pixels, so sequence, graph and
    tabular inputs skip them (as do image sets whose grid turned them off).  Sorted names."""
    final = final_metrics(metrics, trials)
    final = final[~final["dataset"].isin(decision_task_datasets(trials))]
    scored = set(final.loc[final["eval_kind"] == "in_domain", "dataset"])
    perturbed = set(final.loc[final["eval_kind"].isin(("adversarial", "transfer", "corruption")), "dataset"])
    return sorted(scored - perturbed)


def plot_accuracy_against_epsilon(table: pd.DataFrame, path: Path) -> Path:
    """Accuracy under attack against ε, one panel per attack (white box, then transfer), a line per method."""
    path.parent.mkdir(parents=True, exist_ok=True)
    attacks = sorted(table.index.get_level_values("attack").unique())
    fig, axes = plt.subplots(1, len(attacks), figsize=(5 * len(attacks), 3.8), squeeze=False, sharey=True)
    for ax, attack in zip(axes[0], attacks):
        for method, rows in table.xs(attack, level="attack").groupby(level="method"):
            ax.plot(rows.index.get_level_values("epsilon"), rows["accuracy"], marker="o", label=method)
        ax.set_title(attack.upper())
        ax.set_xlabel("ε (pixel units)")
    axes[0, 0].set_ylabel("accuracy under attack")
    axes[0, -1].legend(fontsize=7)
    fig.suptitle("Attacks on the posterior predictive: white box on the model average; transfer from sgd's examples")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
