"""Quality against test-time cost: the Pareto front of the methods for every quality composite, against FLOPs
per prediction and against storage (URSABench's test-time scalability, drawn as trade-offs), and against
training seconds (its training cost).

Reads the composite table (:func:`~analysis.composites.composite_scores`, one row per method label).  The
cost axes are the composites ``flops_per_prediction`` and ``storage_bytes`` (bytes at 32 bits per weight),
lower is better.  The quality composites are every other composite of the table except ``s_per_sample``
(a training cost); rank and bookkeeping columns are no composites.  Whether higher or lower quality is
better comes from :func:`~analysis.composites.better_direction`.

A method is *Pareto-optimal* on (cost, quality) when no other method is at most as costly and at least as
good, and strictly cheaper or strictly better.  So methods with identical cost and quality are optimal
together, and of two equally costly methods only the better is optimal.  A method missing either value is
left out of that pair's front and named beside it.

:func:`plot_pareto` draws any cost against the quality composites: the cost report
(:mod:`analysis.cost`) draws them against each method's search + inference CPU-hours.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.composites import COMPOSITES, NOT_RANKED, TRAINING_COSTS, better_direction  # noqa: E402
from analysis.tables import markdown_table  # noqa: E402

COST_AXES = {
    # composite: (axis label, figure file name)
    "train_s": ("training seconds of a trial", "pareto_training.png"),
    "flops_per_prediction": ("FLOPs per prediction", "pareto_flops.png"),
    "storage_bytes": ("storage of the posterior, bytes at 32 bits", "pareto_storage.png"),
}
NOT_QUALITY = (*COST_AXES, *TRAINING_COSTS)
PANEL_COLUMNS = 4


def quality_composites(scores: pd.DataFrame) -> list[str]:
    """The quality composites among ``scores``' columns, in the composite table's order."""
    return [c for c in scores.columns if c in COMPOSITES and c not in NOT_QUALITY]


def pareto_front(cost: pd.Series, quality: pd.Series, higher_is_better: bool) -> list[str]:
    """The labels of the Pareto-optimal methods, cheapest first (equally costly ones, which are then equally
    good, by label); ``cost`` (lower is better) and ``quality`` are indexed by method, and a method missing
    either value takes no part."""
    both = pd.DataFrame({"cost": cost, "quality": quality if higher_is_better else -quality}).dropna()
    optimal = [
        method
        for method, (c, q) in both.iterrows()
        if not ((both["cost"] <= c) & (both["quality"] >= q) & ((both["cost"] < c) | (both["quality"] > q))).any()
    ]
    return sorted(optimal, key=lambda method: (both.at[method, "cost"], method))


def missing_values(scores: pd.DataFrame, cost_axis: str, composite: str) -> list[str]:
    """The methods lacking the cost or the composite, so left out of that front."""
    lacking = scores[cost_axis].isna() | scores[composite].isna()
    return sorted(scores.index[lacking])


def pareto_fronts(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per (cost axis present in ``scores``, quality composite): ``better`` (higher/lower),
    ``front`` (the Pareto-optimal methods, cheapest first) and ``no_value`` (the methods left out)."""
    direction = better_direction()
    rows = [
        {
            "cost": axis,
            "composite": name,
            "better": direction[name],
            "front": pareto_front(scores[axis], scores[name], direction[name] == "higher"),
            "no_value": missing_values(scores, axis, name),
        }
        for axis in COST_AXES
        if axis in scores
        for name in quality_composites(scores)
    ]
    table = pd.DataFrame(rows, columns=["cost", "composite", "better", "front", "no_value"])
    return table.set_index(["cost", "composite"])


def draw_front(
    ax: plt.Axes, cost: pd.Series, quality: pd.Series, higher_is_better: bool, title: str, ranked: bool = True
) -> None:
    """One panel: ``cost`` (log x-axis where every cost is positive) against ``quality``, one labelled point per
    method (both indexed by method), the Pareto-optimal ones filled and joined by the front as a step line
    (extended to the costliest method); a lower-is-better quality is drawn with the y-axis inverted, so up and
    left is better.  Methods without both values are named under the panel.  Not ``ranked`` (a reference
    that did not converge): the points only, no front, the title saying so."""
    points = pd.DataFrame({"cost": cost, "quality": quality}).dropna()
    front = pareto_front(cost, quality, higher_is_better) if ranked else []
    title = title if ranked else f"{title}\n({NOT_RANKED})"
    dominated = points.drop(index=front)
    ax.scatter(dominated["cost"], dominated["quality"], s=18, facecolors="none", edgecolors="grey")
    ax.scatter(points.loc[front, "cost"], points.loc[front, "quality"], s=22, color="C0", zorder=3)
    if front:
        xs = [*points.loc[front, "cost"], points["cost"].max()]
        ys = [*points.loc[front, "quality"], points.loc[front[-1], "quality"]]
        ax.step(xs, ys, where="post", color="C0", linewidth=1)
    for _, same_cost in points.groupby("cost"):  # alternate label sides where costs coincide
        for k, (method, (x, y)) in enumerate(same_cost.sort_values("quality").iterrows()):
            side = 1 if k % 2 == 0 else -1
            ax.annotate(
                method,
                (x, y),
                xytext=(4 * side, 2),
                textcoords="offset points",
                fontsize=6,
                ha="left" if side == 1 else "right",
                color="C0" if method in front else "dimgrey",
            )
    if not points.empty and (points["cost"] > 0).all():  # a log axis needs positive costs
        ax.set_xscale("log")
        if points["cost"].max() >= 10 * points["cost"].min():  # decades only: no crowded labels
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.margins(x=0.15, y=0.1)  # room for the labels of the outermost points
    if not higher_is_better:
        ax.invert_yaxis()
    ax.set_title(title, fontsize=8)
    ax.tick_params(which="both", labelsize=6)
    lacking = sorted((set(cost.index) | set(quality.index)) - set(points.index))
    if lacking:
        ax.set_xlabel(f"no value: {', '.join(lacking)}", fontsize=6)


def plot_pareto(scores: pd.DataFrame, cost: pd.Series, label: str, path: Path) -> Path:
    """A grid of small panels (:func:`draw_front`), one per quality composite of ``scores`` against ``cost``
    (indexed by method, lower is better; ``label`` names it on the x-axis)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    names = quality_composites(scores)
    direction = better_direction()
    columns = min(PANEL_COLUMNS, len(names))
    rows = -(-len(names) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.9 * rows + 0.8), squeeze=False)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names):
        higher = direction[name] == "higher"
        draw_front(ax, cost, scores[name], higher, f"{name} ({direction[name]} is better)")
    fig.supxlabel(f"{label} (log scale)", fontsize=9)
    fig.suptitle(
        f"Quality against {label}: Pareto-optimal methods filled and joined by the front\n"
        "(up and left is better in every panel; lower-is-better composites have the y-axis inverted)",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pareto_markdown(scores: pd.DataFrame, figures_dir: Path, not_ranked: str = "") -> tuple[str, list[Path]]:
    """The Pareto section of report.md (a table per cost axis: each quality composite's Pareto-optimal
    methods, cheapest first) and its figures (``pareto_training.png``, ``pareto_flops.png``,
    ``pareto_storage.png``), one per cost axis with a value; ``("", [])`` without a cost axis or a quality
    composite.  ``not_ranked``: the sentence naming cells whose fidelity no front includes
    (:func:`analysis.composites.not_ranked_note`), said under the first paragraph."""
    axes = {axis: names for axis, names in COST_AXES.items() if axis in scores and scores[axis].notna().any()}
    if not axes or not quality_composites(scores):
        return "", []
    fronts = pareto_fronts(scores[[c for c in scores.columns if c not in COST_AXES or c in axes]])
    text = [
        "Pareto-optimal: no other method is at most as costly and at least as good, and strictly cheaper or"
        " strictly better (composites as in the composite table; methods without both values are left out).",
        *(["", not_ranked] if not_ranked else []),
    ]
    figures = []
    for axis, (label, file_name) in axes.items():
        table = (
            fronts.loc[axis]
            .assign(
                front=lambda t: t["front"].map(lambda m: ", ".join(m) or "-"),
                no_value=lambda t: t["no_value"].map(lambda m: ", ".join(m) or "-"),
            )
            .rename(columns={"front": "Pareto-optimal, cheapest first", "no_value": "left out (no value)"})
        )
        text += ["", f"### Against {label}", "", markdown_table(table)]
        figures.append(plot_pareto(scores, scores[axis], label, figures_dir / file_name))
    return "\n".join(text), figures
