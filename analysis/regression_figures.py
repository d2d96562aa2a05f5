"""Figures of the deep-regression benchmark (PNG, matplotlib Agg), from a ``points`` table alone.

* ``{exp}_bands_c{complexity}.png`` (paper figs. 1–2): for one repetition, each method's prediction with a
  ±1.96·std band against the noise-free truth, along x (1-D inputs) or along λ of the diagonal
  x_λ = (1−λ)(−5,…,−5) + λ(5,…,5) (E.2); the in-distribution range is shaded.
* ``{exp}_named_points.png`` (figs. 3–6): deviation, uncertainty and coverage against complexity at each
  named test point, mean ± standard error over repetitions (coverage: binomial SE).
* ``{exp}_regions.png``: the same three quantities averaged over in-distribution and OOD points.
* ``{exp}_heatmaps_c{complexity}.png`` (fig. 7, 2-D inputs on a grid): per method, log10 deviation,
  log10 uncertainty and coverage over the grid; the training region is outlined.

A method label run on several models is drawn as one series per model, named ``label (model)``.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.coverage import (  # noqa: E402
    ANCHOR,
    Z,
    coverage_summary,
    coverage_table,
    method_order,
    named_point_table,
    x_array,
)

DPI = 110


def _colours(methods: list[str]) -> dict[str, str]:
    cycle = [c for c in plt.rcParams["axes.prop_cycle"].by_key()["color"] if c != "#d62728"]
    out, i = {}, 0
    for m in methods:
        if m == ANCHOR:
            out[m] = "#d62728"
        else:
            out[m] = cycle[i % len(cycle)]
            i += 1
    return out


def _xs(frame: pd.DataFrame) -> np.ndarray:
    return np.stack([x_array(v) for v in frame["x"]])


def _axis(x: np.ndarray) -> tuple[np.ndarray, str] | None:
    """A 1-D coordinate for band plots: x itself, or λ on the diagonal from −5·1 to 5·1; None otherwise."""
    if x.shape[1] == 1:
        return x[:, 0], "x"
    if np.allclose(x, x[:, :1]):
        return (x[:, 0] + 5.0) / 10.0, "λ  (x = (1−λ)(−5,…,−5) + λ(5,…,5))"
    return None


def _fmt(c: float) -> str:
    return f"{c:g}".replace(".", "p")


def _shade_in_distribution(ax, t: np.ndarray, inside: np.ndarray) -> None:
    if inside.any():
        ax.axvspan(t[inside].min(), t[inside].max(), color="0.92", zorder=0, label="in-distribution")


def _band_figure(cell: pd.DataFrame, experiment: str, complexity: float, path: Path) -> Path | None:
    x = _xs(cell)
    axis = _axis(x)
    if axis is None:
        return None
    cell = cell.assign(_t=axis[0])
    methods = method_order(cell["method"].unique())
    colours = _colours(methods)
    ncols = min(4, len(methods))
    nrows = -(-len(methods) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False, sharex=True, sharey=True)
    truth = cell.drop_duplicates("point_id").sort_values("_t")
    lo, hi = truth["truth"].min(), truth["truth"].max()
    pad = 0.25 * (hi - lo + 1e-9)
    for ax, method in zip(axes.ravel(), methods):
        m = cell[cell["method"] == method].sort_values("_t")
        t = m["_t"].to_numpy()
        _shade_in_distribution(ax, t, m["in_distribution"].to_numpy(bool))
        ax.fill_between(t, m["mean"] - Z * m["std"], m["mean"] + Z * m["std"], color=colours[method], alpha=0.3, lw=0)
        ax.plot(t, m["mean"], color=colours[method], lw=1.4, label=f"{method} ± {Z}·std")
        ax.plot(truth["_t"], truth["truth"], "--", color="black", lw=1.0, label="ground truth")
        ax.set_title(method)
        ax.set_ylim(lo - pad, hi + pad)
    for ax in axes.ravel()[len(methods) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel(axis[1])
    axes[0][0].legend(fontsize=7, loc="best")
    rep = int(cell["repetition"].iloc[0])
    fig.suptitle(f"{experiment}, complexity {complexity:g}: prediction ± {Z}·std (repetition {rep})")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _curves(frame: pd.DataFrame, rows: list[tuple[str, pd.DataFrame]], title: str, path: Path) -> Path:
    methods = method_order(frame["method"].unique())
    colours = _colours(methods)
    fig, axes = plt.subplots(len(rows), 3, figsize=(11.5, 2.8 * len(rows)), squeeze=False)
    quantities = (
        ("deviation", "deviation |mean − truth|"),
        ("uncertainty", "uncertainty (std)"),
        ("coverage", "coverage"),
    )
    for r, (label, part) in enumerate(rows):
        for c, (column, name) in enumerate(quantities):
            ax = axes[r][c]
            for method in methods:
                m = part[part["method"] == method].sort_values("complexity")
                if m.empty:
                    continue
                ax.errorbar(
                    m["complexity"],
                    m[column],
                    yerr=m[f"{column}_se"].fillna(0.0),
                    color=colours[method],
                    marker="o",
                    ms=3,
                    lw=1.2,
                    capsize=2,
                    label=method,
                )
            if column == "coverage":
                ax.axhline(0.95, color="0.4", ls=":", lw=1)
                ax.set_ylim(-0.03, 1.03)
            elif (part[column] > 0).any():
                ax.set_yscale("log")
            ax.set_title(f"{label}: {name}", fontsize=9)
            ax.set_xlabel("complexity")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _heatmaps(table: pd.DataFrame, experiment: str, complexity: float, path: Path) -> Path | None:
    x = _xs(table)
    if x.shape[1] != 2:
        return None
    table = table.assign(_x1=np.round(x[:, 0], 8), _x2=np.round(x[:, 1], 8))
    methods = method_order(table["method"].unique())
    panels = (
        ("deviation", "log10 deviation", True),
        ("uncertainty", "log10 uncertainty", True),
        ("coverage", "coverage", False),
    )
    grids = {}
    for method in methods:
        m = table[table["method"] == method]
        for column, _, log in panels:
            values = np.log10(m[column].clip(lower=1e-12)) if log else m[column]
            grids[method, column] = m.assign(_v=values).pivot_table(index="_x2", columns="_x1", values="_v")
    inside = table[table["in_distribution"]]
    fig, axes = plt.subplots(len(methods), 3, figsize=(11.5, 3.1 * len(methods)), squeeze=False)
    for c, (column, name, log) in enumerate(panels):
        stack = np.concatenate([grids[m, column].to_numpy().ravel() for m in methods])
        finite = stack[np.isfinite(stack)]
        vmin, vmax = (0.0, 1.0) if not log else (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
        for r, method in enumerate(methods):
            ax = axes[r][c]
            g = grids[method, column]
            image = ax.pcolormesh(
                g.columns.to_numpy(),
                g.index.to_numpy(),
                g.to_numpy(),
                shading="nearest",
                vmin=vmin,
                vmax=vmax,
                cmap="viridis",
            )
            fig.colorbar(image, ax=ax, fraction=0.046)
            if not inside.empty:
                x1, x2 = inside["_x1"], inside["_x2"]
                ax.add_patch(
                    plt.Rectangle(
                        (x1.min(), x2.min()),
                        x1.max() - x1.min(),
                        x2.max() - x2.min(),
                        fill=False,
                        ec="white",
                        lw=1.2,
                        ls="--",
                    )
                )
            ax.set_title(f"{method}: {name}", fontsize=9)
            ax.set_xlabel("x1")
            ax.set_ylabel("x2")
    fig.suptitle(f"{experiment}, complexity {complexity:g} (training region dashed)")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _series_names(points: pd.DataFrame) -> pd.Series:
    """Each row's series name: its method label, with the model in parentheses where the label was run on
    more than one model."""
    several = points.groupby("method")["model"].transform("nunique") > 1
    return points["method"].where(~several, points["method"] + " (" + points["model"] + ")")


def write_regression_figures(points: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write every regression figure for ``points`` into ``out_dir``; return the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if points.empty:
        return []
    written: list[Path] = []
    points = points.assign(method=_series_names(points))
    table = coverage_table(points)
    summary = coverage_summary(points)
    named = named_point_table(points)
    for experiment in sorted(points["experiment"].unique()):
        exp_points = points[points["experiment"] == experiment]
        exp_table = table[table["experiment"] == experiment]
        sample_x = _xs(exp_points.head(1))
        for complexity in sorted(exp_points["complexity"].astype(float).unique()):
            cell = exp_points[exp_points["complexity"].astype(float) == complexity]
            if sample_x.shape[1] == 2 and "x" in cell.columns:
                path = _heatmaps(
                    exp_table[exp_table["complexity"] == complexity],
                    experiment,
                    complexity,
                    out_dir / f"{experiment}_heatmaps_c{_fmt(complexity)}.png",
                )
            else:
                # the lowest repetition that every method of this cell has
                common = set.intersection(*(set(g["repetition"]) for _, g in cell.groupby("method")))
                if not common:
                    continue
                rep = min(common)
                path = _band_figure(
                    cell[cell["repetition"] == rep],
                    experiment,
                    complexity,
                    out_dir / f"{experiment}_bands_c{_fmt(complexity)}.png",
                )
            if path is not None:
                written.append(path)
        if not named.empty and (named["experiment"] == experiment).any():
            n = named[named["experiment"] == experiment]
            rows = [(label, n[n["label"] == label]) for label in dict.fromkeys(n["label"])]
            for label, part in rows:
                inside = bool(part["in_distribution"].iloc[0])
                rows[rows.index((label, part))] = (f"{label} ({'in-dist' if inside else 'OOD'})", part)
            written.append(
                _curves(
                    n,
                    rows,
                    f"{experiment}: named test points against complexity",
                    out_dir / f"{experiment}_named_points.png",
                )
            )
        s = summary[summary["experiment"] == experiment]
        rows = [
            (name, s[s["in_distribution"] == flag])
            for flag, name in ((True, "in-dist"), (False, "OOD"))
            if (s["in_distribution"] == flag).any()
        ]
        if rows:
            written.append(
                _curves(
                    s,
                    rows,
                    f"{experiment}: averages over test points against complexity",
                    out_dir / f"{experiment}_regions.png",
                )
            )
    return written
