"""The fidelity section of the report: each method's posterior predictive against its cell's reference
posterior (multi-chain HMC, docs/fidelity.md), read from ``metrics.parquet`` only.

One table per (model, dataset) cell, one row per method, means over seeds of the final trials' ``fidelity:test``
metrics: top-1 agreement, total variation and KL(reference ‖ method); TV averaged over the OOD sets; the
reference's own noise floor (the same metrics between two halves of its chains) and its checks (largest
split-R̂, smallest bulk ESS).  A reference that failed its checks gets a warning line above its table
saying its cell is not ranked (:func:`analysis.composites.unconverged_cells`: left out of every composite,
rank, test and front) and its panel of the figure no front; a reference from file (``reference_from_file``:
no chains, so no checks or noise floor) a line saying so.

And a figure per report, ``figures/fidelity_cost.png``: per cell, each method's total variation against its
training seconds and against its FLOPs per prediction (means over seeds), with the Pareto front
(:func:`analysis.pareto.draw_front`): the methods that no other method beats on fidelity at no more cost.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.composites import NOT_RANKED, final_metrics, unconverged_cells
from analysis.tables import markdown_table
from ursa_ray.eval_sets import TEST, fidelity


def fidelity_frame(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Rows (model, dataset, method) with the mean over seeds of every ``fidelity:test`` metric, and
    ``tv_ood``: the mean of ``total_variation`` over the ``fidelity:`` OOD sets."""
    rows = final_metrics(metrics, trials)  # classification: a regression cell's reference is its anchor
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


COST_AXES = (("train_s", "training seconds"), ("flops_per_prediction", "FLOPs per prediction"))
"""The cost axes of the fidelity figure: ``cost`` metrics of the same trials."""


def fidelity_cost_frame(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """:func:`fidelity_frame` with the mean over seeds of the :data:`COST_AXES` metrics of the same trials
    (absent where a trial has none)."""
    frame = fidelity_frame(metrics, trials)
    if frame.empty:
        return frame
    rows = final_metrics(metrics, trials)
    cost = rows[(rows["eval_kind"] == "cost") & rows["metric"].isin([axis for axis, _ in COST_AXES])]
    means = cost.pivot_table(index=["model", "dataset", "method"], columns="metric", values="value", aggfunc="mean")
    return frame.join(means, how="left")


def plot_fidelity_cost(frame: pd.DataFrame, path: Path, not_ranked: frozenset[tuple[str, str]] = frozenset()) -> Path:
    """One row of panels per cell of ``frame`` (:func:`fidelity_cost_frame`): total variation (lower is
    better, y inverted) against each cost axis, log scale, with the Pareto front; the cells in ``not_ranked``
    (model, dataset: reference not converged) without a front, marked."""
    import matplotlib.pyplot as plt

    from analysis.pareto import draw_front

    path.parent.mkdir(parents=True, exist_ok=True)
    cells = list(frame.groupby(level=["model", "dataset"]))
    fig, axes = plt.subplots(len(cells), len(COST_AXES), figsize=(7.2, 3.0 * len(cells) + 0.6), squeeze=False)
    for row, ((model, dataset), cell) in zip(axes, cells):
        cell = cell.droplevel(["model", "dataset"])
        for ax, (axis, label) in zip(row, COST_AXES):
            cost = cell[axis] if axis in cell else pd.Series(float("nan"), index=cell.index)
            title = f"{model} / {dataset}: TV against {label}"
            draw_front(ax, cost, cell["total_variation"], False, title, ranked=(model, dataset) not in not_ranked)
            ax.set_ylabel("TV to the reference", fontsize=7)
    fig.suptitle(
        "Fidelity against cost: Pareto-optimal methods filled and joined by the front\n"
        "(log x-axis; TV axis inverted, so up and left is better)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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


ANCHOR_COLUMNS = ("w2", "w2_in_distribution", "w2_out_of_distribution")


def anchor_fidelity_markdown(metrics: pd.DataFrame, trials: pd.DataFrame, alpha: float = 0.05) -> str:
    """Regression cells against their exact anchor: per experiment, a table of (complexity, method, model)
    rows with the mean W₂ over all test points, the in-distribution and the out-of-distribution ones, each
    ``mean [1 − alpha interval over repetitions] n`` (Student's t); empty string when no trial has them."""
    from analysis.intervals import experiment_tables

    rows = final_metrics(metrics, trials, task="regression")
    rows = rows[(rows["eval_kind"] == "fidelity") & rows["metric"].isin(ANCHOR_COLUMNS)]
    if rows.empty:
        return ""
    complexity = trials.set_index("trial_id")["complexity"]
    rows = rows.assign(complexity=rows["trial_id"].map(complexity).fillna(float("nan")))
    legend = (
        "W₂ between each method's Gaussian predictive of the noise-free output and the exact anchor's (the "
        "cell's true posterior predictive), per test point, averaged over all points, those inside the training "
        f"region and those outside; mean [{1 - alpha:.0%} interval over repetitions] n."
    )
    return "\n\n".join([legend, *experiment_tables(rows, "metric", ANCHOR_COLUMNS, alpha)])


def fidelity_markdown(metrics: pd.DataFrame, trials: pd.DataFrame, figures_dir: Path) -> tuple[str, list[Path]]:
    """The fidelity tables, one per cell, and the fidelity-against-cost figure (:func:`plot_fidelity_cost`)
    in ``figures_dir``; ``("", [])`` when no trial was scored against a reference."""
    frame = fidelity_cost_frame(metrics, trials)
    if frame.empty or "total_variation" not in frame:
        return "", []
    unconverged = frozenset(unconverged_cells(final_metrics(metrics, trials)))
    parts = [
        "Each method's posterior predictive on the test set against its cell's reference posterior (the grid's "
        "`reference`: multi-chain full-batch HMC with the grid's prior and temperature, whatever the method's own "
        "prior, or probabilities from a file). Means over seeds. The noise floor is the same metric between two halves of the reference's "
        "chains: a method within it is as close as a second run of the reference."
    ]
    for (model, dataset), table in frame.groupby(level=["model", "dataset"]):
        table = table.droplevel(["model", "dataset"])
        shown = table[[c for c, _ in COLUMNS if c in table.columns]].dropna(axis=1, how="all")
        shown = shown.rename(columns=dict(COLUMNS))
        parts.append(f"### {model} / {dataset}")
        if "reference_from_file" in table.columns and (table["reference_from_file"] == 1).any():
            parts.append(
                "Reference from file: no convergence check (a file holds no chains: no R̂, ESS or noise floor)."
            )
        if (model, dataset) in unconverged:
            parts.append(
                f"**Warning: the reference did not pass its convergence checks (R̂ and bulk ESS, "
                f"docs/fidelity.md); these figures are measured against an unconverged reference. {NOT_RANKED}: "
                "shown here only, left out of every rank, test and Pareto front.**"
            )
        parts.append(markdown_table(shown.sort_values("TV") if "TV" in shown.columns else shown))
        parts += reference_cost_lines(trials, model, dataset)
    return "\n\n".join(parts), [plot_fidelity_cost(frame, figures_dir / "fidelity_cost.png", unconverged)]


def reference_cost_lines(trials: pd.DataFrame, model: str, dataset: str) -> list[str]:
    """What the cell's reference cost, from its finished reference trial in these results (the cost report's
    ``reference`` row also counts failed attempts); none when the reference came from a file or from a store
    that another run filled."""
    computed = (trials["phase"] == "reference") & (trials["status"] == "ok")
    rows = trials[computed & (trials["model"] == model) & (trials["dataset"] == dataset)]
    return [
        f"Cost of the reference (trial `{row.trial_id}`): {row.wall_s:.1f} s on {row.n_cpus:g} CPU(s)"
        + (f" and {row.n_gpus:g} GPU(s)" if row.n_gpus else "")
        + f", {row.reserved_cpu_s / 3600:.4f} reserved CPU-hours, {row.grad_evals:,.0f} full-batch gradients."
        for row in rows.itertuples()
    ]
