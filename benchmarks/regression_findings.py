"""Why does our E.1 benchmark disagree with the paper's Fig. 3?  Reproducible diagnosis runs.

Runs E.1 trials of ``grids/regression.yaml`` one by one through ``ursa_ray.trial.run_trial`` (no Ray, one
thread), optionally with hyperparameter overrides (a controlled change of one setting), and stores every
test point of the method and of the anchor (``blr``).  ``summary`` prints coverage / uncertainty / deviation
in distribution, at the paper's named points and out of distribution; ``plot`` draws std(x) and
|mean - truth|(x).  See docs/regression-findings.md for the experiments and their results.

    # the grid's settings, complexities 2 and 5, 3 repetitions (seeds 0..2), 1000 epochs:
    python benchmarks/regression_findings.py run --labels bd,cd,vd,ens_bs,ens_adv --complexities 2,5 \
        --reps 3 --tag grid --out /tmp/findings.parquet
    # one controlled change (dropout rate, adversarial step, noise level, ...):
    python benchmarks/regression_findings.py run --labels bd --set bd.p=0.01 --tag p0.01 --out /tmp/findings.parquet
    python benchmarks/regression_findings.py run --labels bd --noise-std 0.5 --tag noise0.5 --out /tmp/findings.parquet
    python benchmarks/regression_findings.py summary /tmp/findings.parquet
    # the k = 50 sweep over complexity, from an ursa-ray run:
    ursa-ray run grids/regression_e1_sweep.yaml --out results/e1_sweep
    python benchmarks/regression_findings.py summary results/e1_sweep
    python benchmarks/regression_findings.py curves results/e1_sweep --png docs/figures/e1_sweep.png
    python benchmarks/regression_findings.py plot /tmp/findings.parquet --tag grid --complexity 2 --png fig.png

Rows are appended to ``--out`` (parquet), keyed by (tag, label, complexity, repetition); rerunning a key
replaces it.  Every trial is independent, so a batched runner only has to feed the same specs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAMED = {"x=-2.38": -2.38, "x=1.2": 1.2, "x=-5.11": -5.11}


def _parse_value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _overrides(items: list[str]) -> dict[str, dict[str, object]]:
    """``label.key=value`` (or ``*.key=value``) → {label: {key: value}}."""
    out: dict[str, dict[str, object]] = {}
    for item in items:
        lhs, value = item.split("=", 1)
        label, key = lhs.split(".", 1)
        out.setdefault(label, {})[key] = _parse_value(value)
    return out


def specs(
    grid_path: str,
    labels: list[str],
    complexities: list[float],
    reps: int,
    first_seed: int,
    epochs: int | None,
    overrides: dict[str, dict[str, object]],
) -> list[dict]:
    from ursa_ray.grid import load_grid

    chosen = []
    for spec in load_grid(grid_path).trial_specs("final"):
        if spec.dataset != "e1" or spec.label not in labels:
            continue
        if float(spec.complexity) not in complexities or not first_seed <= spec.seed < first_seed + reps:
            continue
        config = dict(spec.config)
        if epochs is not None and "epochs" in config:
            config["epochs"] = epochs
            if "burn_in_epochs" in config:
                config["burn_in_epochs"] = epochs // 2
        config.update(overrides.get("*", {}))
        config.update(overrides.get(spec.label, {}))
        chosen.append(dataclasses.replace(spec, config=config))
    order = {label: i for i, label in enumerate(labels)}
    return sorted(chosen, key=lambda s: (s.complexity, s.seed, order[s.label]))


def run(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    from ursa_ray.data import synthetic_regression
    from ursa_ray.trial import run_trial

    if args.noise_std is not None:  # a controlled change of the design's σ (the anchor and the likelihood follow)
        synthetic_regression.NOISE_STD["e1"] = args.noise_std
    labels = args.labels.split(",")
    complexities = [float(c) for c in args.complexities.split(",")]
    todo = specs(args.grid, labels, complexities, args.reps, args.first_seed, args.epochs, _overrides(args.set))
    if not todo:
        sys.exit("no trial matches")
    out = Path(args.out)
    frames = []
    for spec in todo:
        tick = time.perf_counter()
        outcome = run_trial(spec)
        wall = time.perf_counter() - tick
        points = pd.DataFrame(outcome.points)
        points["x"] = [float(v[0]) for v in points["x"]]
        points["tag"] = args.tag
        points["label"] = spec.label  # the trial's label also on the anchor's rows (method 'blr')
        points["config"] = repr(sorted(spec.config.items()))
        points["noise_std"] = synthetic_regression.NOISE_STD["e1"]
        points["wall_s"] = wall
        frames.append(points)
        test = {m["metric"]: m["value"] for m in outcome.metrics if m.get("eval_set") == "test"}
        print(
            f"{args.tag} {spec.label} f={spec.complexity} rep={spec.seed} {wall:.0f}s "
            f"{ {k: round(v, 4) for k, v in test.items()} }",
            flush=True,
        )
        new = pd.concat(frames, ignore_index=True)
        old = pd.read_parquet(out) if out.exists() else None
        if old is not None:
            keys = set(map(tuple, new[["tag", "label", "complexity", "repetition"]].drop_duplicates().values))
            keep = ~old[["tag", "label", "complexity", "repetition"]].apply(tuple, axis=1).isin(keys)
            new = pd.concat([old[keep], new], ignore_index=True)
        new.to_parquet(out)  # after every trial, so an interrupted run keeps what it has


def _table(points: pd.DataFrame) -> pd.DataFrame:
    """Per (tag, label, complexity): in-distribution, named-point and OOD coverage / std / deviation."""
    p = points.copy()
    p["dev"] = (p["mean"] - p["truth"]).abs()
    p["covered"] = p["dev"] <= 1.96 * p["std"]
    anchor = p[p["method"] == "blr"][["tag", "label", "complexity", "repetition", "point_id", "std", "dev"]]
    anchor = anchor.rename(columns={"std": "a_std", "dev": "a_dev"})
    m = p[p["method"] != "blr"].merge(anchor, on=["tag", "label", "complexity", "repetition", "point_id"])
    rows = []
    for (tag, label, c), g in m.groupby(["tag", "label", "complexity"], sort=False):
        ind = g[g["in_distribution"]]
        far = g[~g["in_distribution"]]
        # the frequentist error of the prediction at a point: its bias over repetitions and its spread
        per_point = ind.groupby("point_id").agg(bias=("mean", "mean"), truth=("truth", "first"), sd=("mean", "std"))
        row = {
            "tag": tag,
            "label": label,
            "f": c,
            "k": g["repetition"].nunique(),
            "cov_in": ind["covered"].mean(),
            "a_cov_in": (ind["a_dev"] <= 1.96 * ind["a_std"]).mean(),
            "std_in": ind["std"].mean(),
            "a_std_in": ind["a_std"].mean(),
            "ratio_in": (ind["std"] / ind["a_std"]).median(),
            "rmse_in": float(np.sqrt((ind["dev"] ** 2).mean())),
            "a_rmse_in": float(np.sqrt((ind["a_dev"] ** 2).mean())),
            "bias_in": float(np.sqrt(((per_point["bias"] - per_point["truth"]) ** 2).mean())),
            "repsd_in": float(np.sqrt((per_point["sd"] ** 2).mean())) if g["repetition"].nunique() > 1 else np.nan,
            "cov_ood": far["covered"].mean(),
        }
        for x in NAMED.values():
            at = g[np.isclose(g["x"], x)]
            row[f"cov[{x}]"] = at["covered"].mean()
            row[f"std[{x}]"] = at["std"].mean()
            row[f"dev[{x}]"] = at["dev"].mean()
            row[f"a_std[{x}]"] = at["a_std"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def results_points(results_dir: str, tag: str) -> pd.DataFrame:
    """The points of an ``ursa-ray run`` results directory in this script's layout: every method's rows
    with ``label`` its grid label, and the anchor's shared rows (method ``blr``) repeated under each label."""
    from ursa_ray.results import ResultsDirectory

    points = ResultsDirectory(results_dir).read("points")
    points["x"] = [float(v[0]) for v in points["x"]]
    points["tag"] = tag
    methods = points[points["method"] != "blr"].copy()
    methods["label"] = methods["method"]
    anchor = points[points["method"] == "blr"]
    frames = [methods]
    for label in methods["label"].unique():
        frames.append(anchor.assign(label=label))
    return pd.concat(frames, ignore_index=True)


def summary(args: argparse.Namespace) -> None:
    points = results_points(args.path, args.tag or "run") if Path(args.path).is_dir() else pd.read_parquet(args.path)
    t = _table(points)
    if args.tag:
        t = t[t["tag"].isin(args.tag.split(","))]
    pd.set_option("display.width", 250, "display.max_columns", 40, "display.max_rows", 400)
    cols = [
        "tag",
        "label",
        "f",
        "k",
        "cov_in",
        "a_cov_in",
        "std_in",
        "a_std_in",
        "ratio_in",
        "rmse_in",
        "a_rmse_in",
        "bias_in",
        "repsd_in",
        "cov_ood",
    ]
    print(t[cols].to_string(index=False, float_format=lambda v: f"{v:.3g}"))
    print()
    named = ["tag", "label", "f"] + [c for c in t.columns if "[" in c]
    print(t[named].to_string(index=False, float_format=lambda v: f"{v:.3g}"))


def plot(args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = pd.read_parquet(args.path)
    p = p[p["tag"].isin(args.tag.split(",")) & np.isclose(p["complexity"], args.complexity)]
    p["dev"] = (p["mean"] - p["truth"]).abs()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6), sharex=True)
    anchor_done = False
    for (tag, label, method), g in p.groupby(["tag", "label", "method"], sort=False):
        if method == "blr":
            if anchor_done:
                continue
            anchor_done, name, style = True, "BLR (anchor)", dict(color="k", lw=2)
        else:
            name, style = (label if len(args.tag.split(",")) == 1 else f"{label} [{tag}]"), dict(lw=1)
        avg = g.groupby("x")[["std", "dev"]].mean()
        axes[0].semilogy(avg.index, avg["std"], label=name, **style)
        axes[1].semilogy(avg.index, avg["dev"], label=name, **style)
    for ax, title in zip(axes, ("uncertainty (epistemic std)", "|mean − truth|")):
        ax.axvspan(-6, -4, color="0.92")
        ax.axvspan(4, 6, color="0.92")
        for x in NAMED.values():
            ax.axvline(x, color="0.6", ls=":", lw=0.8)
        ax.set_title(f"{title}, E.1 f={args.complexity:g}, mean over reps", fontsize=9)
        ax.set_xlabel("x")
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(args.png, dpi=90)
    print("wrote", args.png)


def curves(args: argparse.Namespace) -> None:
    """In-distribution coverage, std ÷ anchor std and OOD coverage against complexity, one line per method
    (the anchor's coverage as a black line), from a results directory or a ``run`` parquet file."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = results_points(args.path, "run") if Path(args.path).is_dir() else pd.read_parquet(args.path)
    t = _table(points).sort_values("f")
    panels = (
        ("cov_in", "in-distribution coverage"),
        ("ratio_in", "std ÷ anchor std (in-dist., median)"),
        ("cov_ood", "OOD coverage"),
        ("cov[-5.11]", "coverage at x = −5.11"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(14, 3.4))
    for ax, (column, title) in zip(axes, panels):
        for label, g in t.groupby("label", sort=False):
            ax.plot(g["f"], g[column], marker="o", ms=3, lw=1.2, label=label)
        if column.startswith("cov"):
            anchor_column = {"cov_in": "a_cov_in"}.get(column)
            if anchor_column:
                a = t.groupby("f")[anchor_column].mean()
                ax.plot(a.index, a.values, color="k", lw=2, label="BLR (anchor)")
            ax.axhline(0.95, color="0.5", ls=":", lw=0.8)
            ax.set_ylim(-0.02, 1.02)
        else:
            ax.set_yscale("log")
            ax.axhline(1.0, color="k", lw=2)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("complexity f")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"E.1, k = {int(t['k'].max())} repetitions", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=90)
    print("wrote", args.png)


def anchor(args: argparse.Namespace) -> None:
    """The anchor alone over many noise draws (no networks): its coverage must be 0.95 everywhere."""
    from ursa_ray.data import synthetic_regression as sr
    from ursa_ray.regression.anchor import anchor_for_dataset

    if args.noise_std is not None:
        sr.NOISE_STD["e1"] = args.noise_std
    for c in [float(v) for v in args.complexities.split(",")]:
        covered, stds = [], []
        for seed in range(args.reps):
            ds = sr.make_dataset("e1", c, seed)
            mean, std = anchor_for_dataset(ds)
            covered.append(np.abs(mean - ds.test_y.double().numpy()) <= 1.96 * std)
            stds.append(std)
        covered, stds = np.array(covered), np.array(stds)
        x = ds.test_x[:, 0].double().numpy()
        inside = ds.test_info["in_distribution"].numpy()
        at = {name: int(np.argmin(np.abs(x - v))) for name, v in NAMED.items()}
        print(
            f"f={c:g} k={args.reps}: coverage in-dist {covered[:, inside].mean():.3f}, OOD {covered[:, ~inside].mean():.3f}; "
            + ", ".join(f"{n}: cov {covered[:, i].mean():.2f} std {stds[:, i].mean():.4f}" for n, i in at.items())
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--grid", default=str(ROOT / "grids" / "regression.yaml"))
    r.add_argument("--labels", default="bd,cd,vd,ens_bs,ens_adv")
    r.add_argument("--complexities", default="2")
    r.add_argument("--reps", type=int, default=3)
    r.add_argument("--first-seed", type=int, default=0)
    r.add_argument("--epochs", type=int, default=None, help="override the grid's epochs (default: keep 1000)")
    r.add_argument("--set", action="append", default=[], help="label.key=value hyperparameter override")
    r.add_argument("--noise-std", type=float, default=None, help="override E.1's σ (default 0.1)")
    r.add_argument("--tag", default="grid")
    r.add_argument("--out", default="regression_findings.parquet")
    s = sub.add_parser("summary")
    s.add_argument("path", help="a parquet file written by run, or an ursa-ray run's results directory")
    s.add_argument("--tag", default=None)
    pl = sub.add_parser("plot")
    pl.add_argument("path")
    pl.add_argument("--tag", default="grid")
    pl.add_argument("--complexity", type=float, default=2.0)
    pl.add_argument("--png", default="regression_findings.png")
    c = sub.add_parser("curves")
    c.add_argument("path", help="a parquet file written by run, or an ursa-ray run's results directory")
    c.add_argument("--png", default="regression_curves.png")
    a = sub.add_parser("anchor")
    a.add_argument("--complexities", default="1,2,3,4,5,6")
    a.add_argument("--reps", type=int, default=500)
    a.add_argument("--noise-std", type=float, default=None)
    args = parser.parse_args()
    {"run": run, "summary": summary, "plot": plot, "curves": curves, "anchor": anchor}[args.command](args)


if __name__ == "__main__":
    main()
