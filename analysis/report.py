"""``ursa-ray report DIR``: composite scores, per-cell tables (mean ± std over seeds), regression coverage
statistics and figures, and the search + inference cost report, written to ``DIR/report.md``.

DIR may be an object-store URI (``s3://bucket/prefix``, as given to ``ursa-ray run --out``): the tables are
read from it and ``report.md`` and ``figures/`` are written back to it (the figures are drawn in a local
temporary folder, then uploaded one object each)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd

from analysis.adversarial_robustness import adversarial_table, plot_accuracy_against_epsilon, robustness_skipped
from analysis.bit_depth import bit_depth_table
from analysis.calibration_figures import calibration_section
from analysis.composites import (
    COMPOSITES,
    better_direction,
    composite_coverage,
    composite_scores,
    not_ranked_note,
    per_cell_table,
    with_eval_kinds,
)
from analysis.corruption_shift import corruption_rows, corruption_table, corruption_values, plot_corruption_shift
from analysis.dee import dee_markdown
from analysis.fidelity import anchor_fidelity_markdown, fidelity_markdown
from analysis.intervals import interval_text
from analysis.pareto import pareto_markdown
from analysis.regression_calibration import regression_calibration_section
from analysis.statistics import statistics_markdown
from analysis.tables import load_results, markdown_table
from ursa_ray.results import Location, is_uri

TEST_METRICS = (
    ("accuracy", "accuracy (higher is better)"),
    ("nll", "negative log-likelihood (lower is better)"),
    ("brier", "Brier score (lower is better)"),
    ("nll_calibrated", "calibrated NLL: at the test-time temperature, cross-validated (lower is better)"),
    ("ece", "expected calibration error, 15 bins (lower is better)"),
    ("ece_adaptive", "adaptive expected calibration error, 15 equal-mass bins (lower is better)"),
    ("eaurc_maxprob", "excess area under the risk-coverage curve, max-probability ordering (lower is better)"),
    ("misclass_auroc_entropy", "misclassification-detection AUROC, entropy score"),
    ("misclass_aupr_entropy", "misclassification-detection AUPR, entropy score"),
    ("misclass_auroc_mi", "misclassification-detection AUROC, mutual-information score"),
    ("decision_cost", "decision task: mean cost per test example (lower is better)"),
    ("validation_temperature", "temperature scaling: T fitted on the held-out validation split (calibrated variants)"),
)
COST_METRICS = (
    ("s_per_sample", "training seconds per posterior sample"),
    ("predict_s_per_example", "prediction seconds per evaluated example (test, OOD, corruption sets; all samples)"),
    ("n_params", "parameters"),
    ("flops_per_prediction", "FLOPs per prediction (one forward pass × test-time samples)"),
    ("storage_bytes_32", "storage of the posterior, bytes at 32 bits per weight"),
    ("storage_bytes_8", "storage of the posterior, bytes at 8 bits per weight"),
)


def composite_display(scores: pd.DataFrame) -> pd.DataFrame:
    """The composite table as shown: each composite as ``mean [low, high] n=seeds`` (its interval and the
    fewest seeds behind a cell), the interval columns folded in."""
    shown = scores.copy()
    for name in [c for c in COMPOSITES if c in scores.columns]:
        shown[name] = [
            interval_text(m, lo, hi, n)
            for m, lo, hi, n in zip(
                scores[name],
                scores[f"{name}_low"],
                scores[f"{name}_high"],
                scores[f"{name}_seeds"].fillna(0).astype(int),
                strict=True,
            )
        ]
    return shown.drop(columns=[c for c in scores.columns if c.endswith(("_low", "_high", "_seeds"))])


def composite_text(scores: pd.DataFrame, coverage: pd.DataFrame, alpha: float = 0.05, interval: str = "t") -> str:
    """The composite-score table (from :func:`~analysis.composites.composite_scores`) with its legend, and
    the cells each composite averages (from :func:`~analysis.composites.composite_coverage`)."""
    direction = better_direction()
    legend = ", ".join(f"{c}: {direction[c]} is better" for c in scores.columns if c in direction)
    return (
        markdown_table(composite_display(scores))
        + f"\n\n({legend}; means over cells of seed means with their {1 - alpha:.0%} interval ({INTERVAL_NAMES[interval]}"
        " over seeds for one cell; over several, the cells' standard errors propagated with Welch's t) and the"
        " fewest seeds behind a cell; rank_* rank within each principle,"
        " mean_rank averages the principles with equal weight and is a summary, not a test: which orders are"
        " real is stated per principle in the next section; see README, Composite scores, and"
        " docs/statistics.md)\n\nCells behind each composite:\n\n" + markdown_table(coverage, index=False)
    )


INTERVAL_NAMES = {"t": "Student t", "bootstrap": "percentile bootstrap"}


def recorded_interval(where: Location) -> str:
    """The per-cell interval the results' grid asks for: ``statistics.interval`` of ``where/grid.yaml``
    (:func:`ursa_ray.grid.parse_statistics`; ``t`` without the file or the block).  A bad value raises
    :class:`~ursa_ray.grid.GridError` in one line naming the file and field."""
    import yaml

    from ursa_ray.grid import GridError, parse_statistics

    record = where / "grid.yaml"
    if not record.exists():
        return "t"
    try:
        raw = yaml.safe_load(record.read_text())
    except yaml.YAMLError:
        raise GridError(f"{record}: not readable as YAML") from None
    return parse_statistics(str(record), raw.get("statistics") if isinstance(raw, dict) else None)["interval"]


def write_report(
    results_dir: str | Path | Location, cost: bool = False, alpha: float = 0.05, interval: str | None = None
) -> str:
    """Write ``results_dir/report.md`` (and figures) and return the text to print; ``results_dir`` is a local
    folder or an object-store URI; ``alpha``: the level of every interval (1 − alpha) and test; ``interval``:
    the per-cell interval, ``t`` or ``bootstrap`` (None: what the results' grid asks, :func:`recorded_interval`)."""
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha {alpha}: must be between 0 and 1 (exclusive)")
    if interval is not None and interval not in INTERVAL_NAMES:
        raise ValueError(f"interval: expected one of {', '.join(INTERVAL_NAMES)}, got {interval!r}")
    shown = results_dir if isinstance(results_dir, Location) or is_uri(results_dir) else Path(results_dir)
    where = Location.parse(shown)
    interval = interval or recorded_interval(where)
    if where.is_local:
        return _write_report(where, where.local_path / "figures", shown, cost, alpha, interval)
    with tempfile.TemporaryDirectory(prefix="ursa-ray-figures-") as staging:
        return _write_report(where, Path(staging), shown, cost, alpha, interval)


def _write_report(
    where: Location, figures_dir: Path, shown: object, cost: bool, alpha: float, interval: str = "t"
) -> str:
    """The report of the results at ``where``, its figures drawn into the local ``figures_dir`` (uploaded to
    ``where/figures/`` when ``where`` is not local); ``interval``: the per-cell interval (``t`` or ``bootstrap``)."""
    interval_name = INTERVAL_NAMES[interval]
    results = load_results(where)
    trials, metrics = results.trials, results.metrics
    counts = trials.groupby(["phase", "status"]).size().rename("trials").reset_index()
    sections = [f"# ursa-ray report: {where.name}", "", "## Trials", "", markdown_table(counts, index=False)]
    failed = trials[trials["status"] == "failed"]
    if not failed.empty:
        sections += ["", "Failed trials:", ""] + [f"- `{r.trial_id}`: {r.error}" for r in failed.itertuples()]

    printed = []
    figures_extra: list[Path] = []  # figures of the classification sections
    scores = composite_scores(metrics, trials, alpha, interval) if not metrics.empty else pd.DataFrame()
    if not scores.empty and (metrics["eval_set"] == "test").any():
        composites = composite_text(scores, composite_coverage(metrics, trials), alpha, interval)
        not_ranked = not_ranked_note(metrics, trials)
        composites += f"\n\n{not_ranked}" if not_ranked else ""
        sections += ["", "## Composite scores", "", composites]
        printed += ["Composite scores", composites]
        verdict, cd_figures = statistics_markdown(metrics, trials, figures_dir, alpha, interval)
        figures_extra += cd_figures
        sections += ["", "## Which differences are real", "", verdict]
        printed += ["Which differences are real", verdict.split("\n\n### ")[0]]
        sections += [
            "",
            f"## Per-cell results (mean ± std over seeds, then the {1 - alpha:.0%} interval of the mean "
            f"({interval_name}) and the number of seeds n)",
        ]
        for metric, title in TEST_METRICS:
            table = per_cell_table(metrics, trials, metric, "test", alpha=alpha, interval=interval)
            if not table.empty:
                sections += ["", f"### {title}", "", markdown_table(table)]
        dee = dee_markdown(metrics, trials)
        if dee:
            sections += ["", "### Deep-ensemble equivalent (DEE)", "", dee]
        kinds = with_eval_kinds(metrics)
        ood_sets = sorted(set(kinds.loc[kinds["eval_kind"] == "ood", "eval_set"]))
        for ood in ood_sets:
            for metric in ("ood_auroc_mi", "ood_auroc_entropy", "ood_fpr95_mi"):
                table = per_cell_table(metrics, trials, metric, ood, alpha=alpha, interval=interval)
                if not table.empty:
                    sections += ["", f"### OOD detection vs {ood}: {metric}", "", markdown_table(table)]
        for metric, title in COST_METRICS:
            table = per_cell_table(metrics, trials, metric, "cost", task=None, alpha=alpha, interval=interval)
            if not table.empty:
                sections += ["", f"### {title}", "", markdown_table(table)]
        robustness = adversarial_table(metrics, trials)
        if not robustness.empty:
            robustness_figure = plot_accuracy_against_epsilon(robustness, figures_dir / "adversarial.png")
            robustness = adversarial_table(metrics, trials, alpha, interval)
            figures_extra.append(robustness_figure)
            sections += [
                "",
                "## Adversarial examples",
                "",
                "White box (`fgsm`, `pgd`): crafted on each method's model average of kept samples. "
                "Transfer (`transfer-*`): the examples crafted on the `sgd` network of the same model, "
                "dataset and seed, scored under each method's posterior predictive. "
                f"Means over in-domain cells and seeds [{1 - alpha:.0%} interval] n=seeds.",
                "",
                markdown_table(robustness),
                "",
                f"![adversarial](figures/{robustness_figure.name})",
            ]
        shift = corruption_rows(metrics, trials)
        if not shift.empty:
            shift_figure = plot_corruption_shift(corruption_values(shift), figures_dir / "corruption_shift.png")
            figures_extra.append(shift_figure)
            sections += [
                "",
                "## Common corruptions",
                "",
                f"Per metric: the mean over corruption types [{1 - alpha:.0%} interval over seeds ({interval_name}), "
                "propagated over in-domain cells] n=seeds, then the inter-quartile range over corruption types of "
                "the per-type means (how much the type matters, not an interval).",
                "",
                markdown_table(corruption_table(shift, alpha, interval)),
                "",
                f"![corruption_shift](figures/{shift_figure.name})",
            ]
        skipped = robustness_skipped(metrics, trials)
        if skipped:
            sections += [
                "",
                "Not attacked and not corrupted: "
                f"{', '.join(skipped)}. Attacks and corruptions perturb pixels: sequence, graph and tabular "
                "inputs skip them, as do image sets whose grid turned them off.",
            ]
        bits = bit_depth_table(metrics, trials, alpha, interval)
        if not bits.empty:
            sections += [
                "",
                "## Posterior samples stored at lower bit depths",
                "",
                f"Means over in-domain cells [{1 - alpha:.0%} interval over seeds, propagated over cells] n=seeds; "
                "ood_auroc by mutual information, mean over OOD sets.",
                "",
                markdown_table(bits),
            ]
        calibration_lines, calibration_figures = calibration_section(where, metrics, trials, figures_dir)
        sections += calibration_lines
        figures_extra += calibration_figures
        fidelity_text, fidelity_figures = fidelity_markdown(metrics, trials, figures_dir)
        figures_extra += fidelity_figures
        if fidelity_text:
            sections += ["", "## Fidelity to the reference posterior", "", fidelity_text, ""]
            sections += [f"![{p.stem}](figures/{p.name})" for p in fidelity_figures]
            printed += ["Fidelity to the reference posterior", fidelity_text]
        pareto_text, pareto_figures = pareto_markdown(scores, figures_dir, not_ranked)
        if pareto_figures:
            figures_extra += pareto_figures
            sections += ["", "## Quality against cost (Pareto fronts)", "", pareto_text, ""]
            sections += [f"![{p.stem}](figures/{p.name})" for p in pareto_figures]

    figures: list[Path] = []
    if not results.points.empty:
        from analysis.coverage import regression_markdown
        from analysis.regression_figures import write_regression_figures

        figures = write_regression_figures(results.points, figures_dir)
        text = regression_markdown(results.points, alpha=alpha)
        sections += ["", "## Deep regression against the anchor model", "", text, ""]
        sections += [f"![{p.stem}](figures/{p.name})" for p in figures]
        printed += ["Deep regression against the anchor model", text]
        anchor_text = anchor_fidelity_markdown(metrics, trials, alpha)
        if anchor_text:
            sections += ["", "## Fidelity to the exact posterior (regression)", "", anchor_text, ""]
        scores_text, calibration_figures = regression_calibration_section(metrics, trials, figures_dir, alpha)
        if scores_text:
            figures += calibration_figures
            sections += ["", "## Proper scores and calibration curves (regression)", "", scores_text, ""]
            sections += [f"![{p.stem}](figures/{p.name})" for p in calibration_figures]

    from analysis.cost import cost_markdown

    cost_text, cost_figures = cost_markdown(trials, metrics, scores, figures_dir)
    sections += ["", "## Compute cost: hyperparameter search + inference", "", cost_text, ""]
    sections += [f"![{p.stem}](figures/{p.name})" for p in cost_figures]
    if cost:
        printed += ["Compute cost: search + inference", cost_text]

    report = "\n".join(sections) + "\n"
    if not where.is_local:  # the report's links are relative (figures/NAME), as in a local results folder
        for figure in [*figures_extra, *figures, *cost_figures]:
            (where / "figures" / figure.name).write_bytes(figure.read_bytes())
    (where / "report.md").write_text(report)
    printed.append(f"wrote {shown / 'report.md' if isinstance(shown, Path) else where / 'report.md'}")
    return "\n\n".join(printed)
