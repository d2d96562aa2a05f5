"""``ursa-ray report DIR``: composite scores, per-cell tables (mean ± std over seeds), regression coverage
statistics and figures, and the search + inference cost report, written to ``DIR/report.md``."""

from __future__ import annotations

from pathlib import Path

from analysis.composites import better_direction, composite_scores, per_cell_table
from analysis.tables import load_results, markdown_table
from ursa_ray.results import write_atomic

TEST_METRICS = (
    ("accuracy", "accuracy (higher is better)"),
    ("nll", "negative log-likelihood (lower is better)"),
    ("brier", "Brier score (lower is better)"),
    ("ece", "expected calibration error, 15 bins (lower is better)"),
    ("misclass_auroc_entropy", "misclassification-detection AUROC, entropy score"),
    ("misclass_aupr_entropy", "misclassification-detection AUPR, entropy score"),
    ("misclass_auroc_mi", "misclassification-detection AUROC, mutual-information score"),
    ("decision_cost", "decision task: mean cost per test example (lower is better)"),
)
COST_METRICS = (
    ("s_per_sample", "training seconds per posterior sample"),
    ("predict_s_per_example", "prediction seconds per test example (all samples)"),
    ("n_params", "parameters"),
)


def composite_text(results_dir: Path) -> str:
    results = load_results(results_dir)
    table = composite_scores(results.metrics, results.trials)
    if table.empty:
        return "no finished final-phase classification trials yet"
    direction = better_direction()
    legend = ", ".join(f"{c}: {direction[c]} is better" for c in table.columns if c in direction)
    return markdown_table(table) + f"\n\n({legend}; averages over cells, see README)"


def write_report(results_dir: Path, cost: bool = False) -> str:
    """Write ``results_dir/report.md`` (and figures) and return the text to print."""
    results = load_results(results_dir)
    trials, metrics = results.trials, results.metrics
    counts = trials.groupby(["phase", "status"]).size().rename("trials").reset_index()
    sections = [f"# ursa-ray report: {results_dir.resolve().name}", "", "## Trials", "", markdown_table(counts, index=False)]
    failed = trials[trials["status"] == "failed"]
    if not failed.empty:
        sections += ["", "Failed trials:", ""] + [f"- `{r.trial_id}`: {r.error}" for r in failed.itertuples()]

    printed = []
    composites = composite_text(results_dir)
    if not metrics.empty and (metrics["eval_set"] == "test").any() and "no finished" not in composites:
        sections += ["", "## Composite scores", "", composites]
        printed += ["Composite scores", composites]
        sections += ["", "## Per-cell results (mean ± std over seeds)"]
        for metric, title in TEST_METRICS:
            table = per_cell_table(metrics, trials, metric, "test")
            if not table.empty:
                sections += ["", f"### {title}", "", markdown_table(table)]
        ood_sets = sorted(set(metrics["eval_set"]) - {"test", "validation", "cost"})
        for ood in ood_sets:
            for metric in ("ood_auroc_entropy", "ood_auroc_mi"):
                table = per_cell_table(metrics, trials, metric, ood)
                if not table.empty:
                    sections += ["", f"### OOD detection vs {ood}: {metric}", "", markdown_table(table)]
        for metric, title in COST_METRICS:
            table = per_cell_table(metrics, trials, metric, "cost")
            if not table.empty:
                sections += ["", f"### {title}", "", markdown_table(table)]

    if not results.points.empty:
        from analysis.coverage import regression_markdown
        from analysis.regression_figures import write_regression_figures

        figures = write_regression_figures(results.points, results_dir / "figures")
        text = regression_markdown(results.points)
        sections += ["", "## Deep regression against the anchor model", "", text, ""]
        sections += [f"![{p.stem}](figures/{p.name})" for p in figures]
        printed += ["Deep regression against the anchor model", text]

    from analysis.cost import cost_markdown

    cost_text, cost_figures = cost_markdown(trials, metrics, results_dir / "figures")
    sections += ["", "## Compute cost: hyperparameter search + inference", "", cost_text, ""]
    sections += [f"![{p.stem}](figures/{p.name})" for p in cost_figures]
    if cost:
        printed += ["Compute cost: search + inference", cost_text]

    report = "\n".join(sections) + "\n"
    write_atomic(results_dir / "report.md", lambda tmp: Path(tmp).write_text(report))
    printed.append(f"wrote {results_dir / 'report.md'}")
    return "\n\n".join(printed)
