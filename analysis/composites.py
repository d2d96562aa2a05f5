"""URSABench's composite scores, and a rank summary in which each evaluation principle counts once.

A *cell* is one (model, dataset) pair of final-phase classification trials.  A cell is a *decision-task*
cell when its dataset is declared a decision-task training set (``decision_task`` in trials.parquet: the
``*_imbalanced`` copies); every other cell is *in-domain* (balanced sets also report ``decision_cost``
with the same cost matrix, shown per cell, but it enters no composite).  A model trained on an imbalanced copy is not the in-domain
benchmark, so the two kinds never mix: every composite except ``decision_cost`` averages in-domain cells
only, and ``decision_cost`` averages decision-task cells only.

Every metric is first averaged over the seeds of its cell (OOD metrics per OOD set); a composite then
averages those cell means with equal weight:

- ``accuracy``: test accuracy over in-domain cells (higher is better);
- ``nll``: test NLL over in-domain cells (lower is better);
- ``misclass_auroc``: misclassification-detection AUROC, predictive-entropy score, over in-domain cells;
- ``eaurc``: excess area under the risk–coverage curve by max probability (``eaurc_maxprob``; Geifman,
  Uziel & El-Yaniv 2019), in-domain cells (lower).  E-AURC rather than AURC because AURC = AURC* + E-AURC
  and AURC* depends on the error rate alone, so AURC would count accuracy a second time, under uncertainty;
  E-AURC is the part due to the ordering.  Max probability (the softmax response of Geifman & El-Yaniv
  2017) rather than MI because it ranks every method: a one-sample method's MI is zero everywhere, so its
  MI curve is that of accepting at random;
- ``nll_calibrated``: test NLL at the optimal temperature by test-time cross-validation (Ashukha et al.
  2020), in-domain cells (lower);
- ``ood_auroc``: OOD-detection AUROC scored by knowledge uncertainty (mutual information, URSABench's
  score) over in-domain (cell, OOD set) pairs.  A single-sample method (SGD, SWA) has zero mutual
  information everywhere, so all its scores tie and its ``ood_auroc`` is exactly 0.5;
- ``ood_fpr95``: the in-distribution share flagged at the threshold that flags 95% of the OOD set, scored
  by mutual information like ``ood_auroc`` (``ood_fpr95_mi``), the same pairs (lower; a constant score
  flags every example, so a one-sample method's is 1);
- ``ood_auroc_entropy``, ``ood_fpr95_entropy``: the same two scored by total predictive entropy, which
  every method has: ranked beside the MI pair, each score one family of ``rank_ood``, so a method is never
  ranked at chance because its stored predictive has one sample;
- ``decision_cost``: mean cost per test example of the Bayes decision over decision-task cells (lower);
- ``s_per_sample``: training seconds per posterior sample over in-domain cells (lower; not ranked);
- ``adv_accuracy``: accuracy under white-box PGD at the dataset family's reference ε (MNIST 0.1, CIFAR
  8/255, digits 1/16; the ``adv:pgd_eps…`` set whose ``reference`` metric is 1), in-domain cells;
- ``transfer_accuracy``: accuracy on the same attack crafted on the SGD network of the same model, dataset
  and seed (the ``transfer:`` set of that crafted set), in-domain cells;
- ``corrupt_accuracy``, ``corrupt_ece``: accuracy and ECE on the common-corruption sets
  (``corrupt:TYPE:SEVERITY``: the test set under each corruption type and severity), the mean over
  in-domain cells, types and severities; ``corrupt_accuracy_s3``, ``corrupt_ece_s3`` the same at severity 3
  (reported, not ranked);
- ``fidelity_tv``, ``fidelity_agreement``: total variation (lower) and top-1 agreement (higher) of the test
  predictive against the cell's reference posterior (``fidelity:test``, docs/fidelity.md), in-domain cells
  with a converged reference (a cell whose reference failed its checks is :data:`NOT_RANKED`: shown in the
  fidelity section, left out of these composites and so of every rank, test and front);
- ``train_s``: training seconds of a trial (lower; not ranked: a cost axis of the Pareto fronts);
- ``flops_per_prediction``: FLOPs of one prediction, all test-time samples (lower), in-domain cells;
- ``storage_bytes``: bytes of the stored posterior at 32 bits per weight (lower), in-domain cells.

Each composite selects its rows by evaluation-set kind (the ``eval_kind`` column, :mod:`ursa_ray.eval_sets`:
``in_domain`` for ``test``, ``ood`` for a dataset's OOD sets, ``corruption``, ``adversarial``, ``transfer``,
``cost``),
never by testing names: a set of a new kind enters no composite until a composite names its kind.

Rank summary.  Each *family* of metrics (:data:`FAMILIES`; a metric not named there is a family of its own)
counts once within its principle, however many metrics and evaluation sets it has: a metric's value in a cell
is first averaged over its sets in that cell (the OOD sets for ``ood_auroc``, the ``corrupt:TYPE:SEVERITY``
sets for the corruption metrics, as the mean corruption error does), and the methods are ranked on that
value within every cell: 1 = best, ties share the mean rank.  ``rank_P`` is the mean over P's families of
the mean over the family's metrics of a method's mean rank over the cells of that metric, and ``mean_rank``
is the equal-weight mean of the ``rank_P`` it has:

    value_{c,m}(method) = mean over sets s of m in cell c of (mean over seeds of m on s)
    rank_m(method) = mean over c in cells(m) of rank of value_{c,m}(method)
    rank_P(method) = mean over families F in P of (mean over m in F of rank_m(method))
    mean_rank(method) = mean over principles P with results of rank_P(method)

So ten corruption types at five severities, scored by accuracy and ECE, weigh as much as one adversarial set
in ``rank_robustness``, and mutual information and total entropy one half each in ``rank_ood``.
``mean_rank`` is a summary, not a test: which orders are real is :mod:`analysis.statistics`' business.

The principles: ``accuracy`` (accuracy), ``uncertainty`` (nll, misclass_auroc, eaurc, nll_calibrated),
``ood`` (families mutual information: ood_auroc, ood_fpr95; total entropy: ood_auroc_entropy,
ood_fpr95_entropy), ``decision`` (decision_cost), ``robustness`` (families white-box: adv_accuracy;
transfer: transfer_accuracy; corruptions: corrupt_accuracy, corrupt_ece), ``fidelity`` (fidelity_tv,
fidelity_agreement: how close the predictive is to the posterior itself, where the grid asks for a
reference) and ``test_time`` (flops_per_prediction, storage_bytes: URSABench's test-time scalability).
Adding a metric to a principle changes the weight of that principle's other metrics, never the principle's.

Cells a method lacks (failed, or not run) are left out of its averages, never filled in.  ``cells``
counts the cells (in-domain and decision-task) where the method has at least one successful seed,
``planned_cells`` the cells the grid gave it, and ``complete`` is true only when every planned final
trial of the method finished ok, so that its composites are directly comparable.

Only classification trials count (regression is judged against the anchor model instead).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ursa_ray.eval_sets import (
    CALIBRATED,
    TEST,
    EvalKind,
    adversarial,
    crafted_set,
    fidelity,
    kinds_by_name,
    parse,
    transfer,
)
from ursa_ray.results import with_eval_kinds

COMPOSITES: dict[str, tuple[EvalKind, str, bool]] = {
    # name: (eval-set kind, metric, higher is better)
    "accuracy": ("in_domain", "accuracy", True),
    "nll": ("in_domain", "nll", False),
    "misclass_auroc": ("in_domain", "misclass_auroc_entropy", True),
    "eaurc": ("in_domain", "eaurc_maxprob", False),
    "nll_calibrated": ("in_domain", "nll_calibrated", False),
    "ood_auroc": ("ood", "ood_auroc_mi", True),
    "ood_fpr95": ("ood", "ood_fpr95_mi", False),
    "ood_auroc_entropy": ("ood", "ood_auroc_entropy", True),
    "ood_fpr95_entropy": ("ood", "ood_fpr95_entropy", False),
    "decision_cost": ("in_domain", "decision_cost", False),
    "s_per_sample": ("cost", "s_per_sample", False),
    "train_s": ("cost", "train_s", False),
    "fidelity_tv": ("fidelity", "total_variation", False),  # on fidelity:test only (ON_SET)
    "fidelity_agreement": ("fidelity", "agreement", True),
    "adv_accuracy": ("adversarial", "accuracy", True),  # at the reference ε only (REFERENCE_FLAGGED)
    "transfer_accuracy": ("transfer", "accuracy", True),  # the same crafted set, from the SGD source
    "corrupt_accuracy": ("corruption", "accuracy", True),
    "corrupt_ece": ("corruption", "ece", False),
    "corrupt_accuracy_s3": ("corruption", "accuracy", True),  # at severity 3 only (AT_SEVERITY)
    "corrupt_ece_s3": ("corruption", "ece", False),
    "flops_per_prediction": ("cost", "flops_per_prediction", False),
    "storage_bytes": ("cost", "storage_bytes_32", False),
}
PRINCIPLES = {
    # principle: the composites ranked under it
    "accuracy": ("accuracy",),
    "uncertainty": ("nll", "misclass_auroc", "eaurc", "nll_calibrated"),
    "ood": ("ood_auroc", "ood_fpr95", "ood_auroc_entropy", "ood_fpr95_entropy"),
    "decision": ("decision_cost",),
    "robustness": ("adv_accuracy", "transfer_accuracy", "corrupt_accuracy", "corrupt_ece"),
    "fidelity": ("fidelity_tv", "fidelity_agreement"),
    "test_time": ("flops_per_prediction", "storage_bytes"),
}
FAMILIES = {
    # composite: its family within its principle (a composite not named here is a family of its own)
    "ood_auroc": "mutual information",
    "ood_fpr95": "mutual information",
    "ood_auroc_entropy": "total entropy",
    "ood_fpr95_entropy": "total entropy",
    "corrupt_accuracy": "corruptions",
    "corrupt_ece": "corruptions",
}
"""Within a principle each family weighs once, its composites sharing the weight: OOD detection counts each
score once, robustness each of white-box attacks, transfer attacks and corruptions once."""
REFERENCE_FLAGGED = {"adv_accuracy": "adversarial", "transfer_accuracy": "transfer"}
"""Composites of the one crafted set (``adv:`` or ``transfer:``) that the trial's white-box set with
``reference`` metric 1 scores (PGD at the dataset family's reference ε)."""
AT_SEVERITY = {"corrupt_accuracy_s3": 3, "corrupt_ece_s3": 3}
"""Composites of the corruption sets at one severity."""
TRAINING_COSTS = ("s_per_sample", "train_s")
"""Composites that are training costs: ranked under no principle, the x-axes of cost trade-offs."""
ON_SET = {"fidelity_tv": fidelity(TEST), "fidelity_agreement": fidelity(TEST)}
"""Composites of one evaluation set of their kind (the test set's fidelity, not the OOD sets')."""
CELL_KEYS = ["model", "dataset", "eval_set"]
NOT_RANKED = "not ranked: reference not converged"
"""How the report marks the fidelity of a cell whose reference failed its convergence checks."""


def final_metrics(metrics: pd.DataFrame, trials: pd.DataFrame, task: str | None = "classification") -> pd.DataFrame:
    """Metric rows of final-phase trials that finished ok (of one task, unless ``task`` is None), each with its
    ``eval_kind`` (:func:`with_eval_kinds`), temperature scaling's sets as rows of calibrated variants
    (:func:`as_calibrated_variants`)."""
    keep = (trials["phase"] == "final") & (trials["status"] == "ok")
    if task is not None:
        keep &= trials["task"] == task
    ok = trials.loc[keep, "trial_id"]
    return as_calibrated_variants(
        with_eval_kinds(metrics[metrics["trial_id"].isin(ok) & (metrics["phase"] == "final")])
    )


def calibrated_variant(method: str) -> str:
    """The name under which the report shows ``method``'s temperature-scaled predictive: ``METHOD@calibrated``."""
    return f"{method}@{CALIBRATED}"


def as_calibrated_variants(final: pd.DataFrame) -> pd.DataFrame:
    """``final`` (rows with ``eval_kind``) with each ``SET@calibrated`` row (kind ``calibrated``: temperature
    scaling, ``calibrate: temperature``) made a row of the method's calibrated variant
    (:func:`calibrated_variant`) on ``SET``, with ``SET``'s kind, and the trial's ``cost`` rows copied to the
    variant (same network, same samples).  So every table and composite shows the variant as a method of its
    own, ranked beside the raw one, and never averages calibrated values into the raw method's."""
    calibrated = final["eval_kind"] == "calibrated"
    if not calibrated.any():
        return final
    raw = {name: parse(name).raw for name in final.loc[calibrated, "eval_set"].unique()}
    twins = final[calibrated]
    twins = twins.assign(method=twins["method"].map(calibrated_variant), eval_set=twins["eval_set"].map(raw))
    twins = twins.assign(eval_kind=twins["eval_set"].map(kinds_by_name(twins["eval_set"].unique())))
    cost = final[(final["eval_kind"] == "cost") & final["trial_id"].isin(set(twins["trial_id"]))]
    cost = cost.assign(method=cost["method"].map(calibrated_variant))
    return pd.concat([final[~calibrated], twins, cost], ignore_index=True)


def decision_task_datasets(trials: pd.DataFrame) -> set[str]:
    """Datasets declared decision-task training sets (results written before the ``decision_task`` column
    existed: the ``*_imbalanced`` names)."""
    if "decision_task" not in trials:
        return {d for d in trials["dataset"] if str(d).endswith("_imbalanced")}
    return set(trials.loc[trials["decision_task"].fillna(False).astype(bool), "dataset"])


def composite_rows(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The metric rows behind each composite, one per (composite, trial, eval_set), with a ``composite``
    column: decision-task cells for ``decision_cost``, in-domain cells for every other composite; fidelity
    composites leave out the cells whose reference did not converge (:func:`unconverged_cells`)."""
    final = final_metrics(metrics, trials)
    decision = final["dataset"].isin(decision_task_datasets(trials))
    unconverged = pd.MultiIndex.from_tuples(unconverged_cells(final), names=["model", "dataset"])
    not_ranked = pd.MultiIndex.from_frame(final[["model", "dataset"]]).isin(unconverged)
    frames = []
    for name, (kind, metric, _) in COMPOSITES.items():
        rows = final[
            (final["metric"] == metric)
            & (final["eval_kind"] == kind)
            & (decision if name == "decision_cost" else ~decision)
            & ~(not_ranked & (kind == "fidelity"))
        ]
        if name in REFERENCE_FLAGGED:
            rows = rows.merge(reference_sets(final, REFERENCE_FLAGGED[name]), on=["trial_id", "eval_set"])
        if name in AT_SEVERITY:
            rows = rows[rows["eval_set"].map(lambda s: parse(s).severity) == AT_SEVERITY[name]]
        if name in ON_SET:
            rows = rows[rows["eval_set"] == ON_SET[name]]
        if not rows.empty:
            frames.append(rows.assign(composite=name))
    if not frames:
        return pd.DataFrame(columns=["composite", *metrics.columns])
    return pd.concat(frames, ignore_index=True)


def reference_sets(final: pd.DataFrame, kind: EvalKind) -> pd.DataFrame:
    """Per trial, the set of ``kind`` (``adversarial`` or ``transfer``) that scores the crafted set of its
    white-box set flagged ``reference`` = 1 (PGD at the dataset family's reference ε): columns ``trial_id``,
    ``eval_set``."""
    flagged = final.loc[(final["metric"] == "reference") & (final["value"] == 1.0), ["trial_id", "eval_set"]]
    named = adversarial if kind == "adversarial" else transfer
    flagged = flagged.assign(eval_set=flagged["eval_set"].map(lambda s: named(crafted_set(s))))
    return flagged.drop_duplicates()


def unconverged_cells(final: pd.DataFrame) -> list[tuple[str, str]]:
    """The (model, dataset) cells of ``final`` (rows with ``eval_kind``) whose reference posterior failed its
    convergence checks (a fidelity row ``converged`` < 1): their fidelity is shown, never ranked or tested.
    A reference from file (no chains, no check) is not among them."""
    failed = final[(final["eval_kind"] == "fidelity") & (final["metric"] == "converged") & (final["value"] < 1)]
    return sorted(set(zip(failed["model"], failed["dataset"], strict=True)))


def not_ranked_note(metrics: pd.DataFrame, trials: pd.DataFrame) -> str:
    """One sentence naming the cells whose fidelity is :data:`NOT_RANKED` (empty when none)."""
    cells = unconverged_cells(final_metrics(metrics, trials))
    if not cells:
        return ""
    names = ", ".join(f"{model}/{dataset}" for model, dataset in cells)
    return (
        f"Fidelity of {names}: {NOT_RANKED} (left out of fidelity_tv, fidelity_agreement, rank_fidelity, "
        "mean_rank, the paired tests, the critical-difference diagram and the Pareto fronts; shown in the "
        "fidelity section)."
    )


def cell_means(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (composite, method, model, dataset, eval_set): the mean over seeds (see :func:`composite_rows`)."""
    rows = composite_rows(metrics, trials)
    if rows.empty:
        return pd.DataFrame(columns=["composite", "method", *CELL_KEYS, "value"])
    return rows.groupby(["composite", "method", *CELL_KEYS], as_index=False, sort=False)["value"].mean()


def unit_values(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (composite, method, model, dataset, seed), a *unit*: the composite's metric in that trial averaged
    over the composite's sets (OOD sets, corruption sets; one set for the others).  The unit of every
    interval over seeds and of every paired comparison (:mod:`analysis.statistics`)."""
    rows = composite_rows(metrics, trials)
    keys = ["composite", "method", "model", "dataset", "seed"]
    if rows.empty:
        return pd.DataFrame(columns=[*keys, "value"])
    return rows.groupby(keys, as_index=False, sort=False)["value"].mean()


def principle_ranks(cells: pd.DataFrame) -> pd.DataFrame:
    """Per method: ``rank_P`` for each principle P with results, and ``mean_rank`` (see the module doc);
    ``cells``: a ``value`` per composite, method, model, dataset (and optionally eval_set, averaged here)."""
    per_cell = cells.groupby(["composite", "method", "model", "dataset"], as_index=False)["value"].mean()
    columns = {}
    for principle, names in PRINCIPLES.items():
        metric_ranks = []
        for name in names:
            rows = per_cell[per_cell["composite"] == name]
            if rows.empty:
                continue
            higher = COMPOSITES[name][2]
            ranked = rows.groupby(["model", "dataset"])["value"].rank(ascending=not higher, method="average")
            metric_ranks.append(ranked.groupby(rows["method"]).mean().rename(name))
        if metric_ranks:
            columns[f"rank_{principle}"] = family_mean(pd.concat(metric_ranks, axis=1))
    table = pd.DataFrame(columns)
    if not table.empty:
        table["mean_rank"] = table.mean(axis=1, skipna=True)
    return table


def family_mean(ranks: pd.DataFrame) -> pd.Series:
    """Per row of ``ranks`` (columns: composites of one principle): the mean over the :data:`FAMILIES` present
    of the mean over each family's composites, missing values skipped, so each family weighs once."""
    families = [FAMILIES.get(name, name) for name in ranks.columns]
    return ranks.T.groupby(families, sort=False).mean().mean(skipna=True)


def cell_counts(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per method: ``cells`` with at least one ok seed, ``planned_cells`` in the grid, and ``complete``
    (every planned final trial finished ok)."""
    planned = trials[(trials["phase"] == "final") & (trials["task"] == "classification")]
    with_results = final_metrics(metrics, trials)[["method", "model", "dataset"]].drop_duplicates()
    calibrated = planned[planned["method"].map(calibrated_variant).isin(set(with_results["method"]))]
    planned = pd.concat([planned, calibrated.assign(method=calibrated["method"].map(calibrated_variant))])
    table = pd.DataFrame(
        {
            "cells": with_results.groupby("method").size(),
            "planned_cells": planned.groupby("method")[["model", "dataset"]].apply(lambda g: len(g.drop_duplicates())),
            "complete": planned.groupby("method")["status"].apply(lambda s: bool((s == "ok").all())),
        }
    )
    table["cells"] = table["cells"].fillna(0).astype(int)
    table["complete"] = table["complete"].fillna(False).astype(bool)
    return table


def composite_scores(
    metrics: pd.DataFrame, trials: pd.DataFrame, alpha: float = 0.05, interval: str = "t"
) -> pd.DataFrame:
    """One row per method: the composites, the per-principle ranks, the mean rank, the cell counts, and per
    composite C its 1 − ``alpha`` interval ``C_low``, ``C_high`` and ``C_seeds`` (the fewest seeds behind any
    of its cells) at the end: :func:`analysis.intervals.composite_interval` over the cells'
    ``interval`` intervals (``t`` or ``bootstrap``)."""
    from analysis.intervals import cell_intervals, composite_interval

    units = unit_values(metrics, trials)
    if units.empty:
        return pd.DataFrame()
    cells = cell_intervals(units, ["composite", "method", "model", "dataset"], alpha, interval)
    rows = {}
    for (name, method), group in cells.groupby(["composite", "method"], sort=False):
        mean, low, high = composite_interval(group, alpha)
        rows.setdefault(method, {}).update(
            {name: mean, f"{name}_low": low, f"{name}_high": high, f"{name}_seeds": int(group["seeds"].min())}
        )
    everything = pd.DataFrame.from_dict(rows, orient="index")
    names = [c for c in COMPOSITES if c in everything.columns]
    per_cell = cells.rename(columns={"mean": "value"})
    table = everything[names].join(principle_ranks(per_cell)).join(cell_counts(metrics, trials), how="left")
    table = table.join(everything[[f"{c}_{part}" for c in names for part in ("low", "high", "seeds")]])
    table.index.name = "method"
    return table.sort_values("mean_rank" if "mean_rank" in table else table.columns[0])


def composite_coverage(metrics: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Which cells each composite averages: one row per composite, its cells as ``model/dataset`` (with
    ``vs OOD set`` for OOD composites, and the count of corruption sets for corruption composites), so a
    reader sees what every number in the table stands for; ``n`` counts the averaged (cell, set) pairs."""
    cells = cell_means(metrics, trials)
    rows = []
    for name in COMPOSITES:
        these = cells[cells["composite"] == name][CELL_KEYS].drop_duplicates().sort_values(CELL_KEYS)
        if these.empty:
            continue
        kind = COMPOSITES[name][0]
        if kind == "corruption":
            text = []
            for (model, dataset), sets in these.groupby(["model", "dataset"])["eval_set"]:
                parsed = [parse(s) for s in sets]
                types, severities = {p.corruption for p in parsed}, sorted({p.severity for p in parsed})
                text.append(
                    f"{model}/{dataset} × {len(sets)} corruption sets ({len(types)} types, severities "
                    f"{', '.join(map(str, severities))})"
                )
        else:
            text = [
                f"{r.model}/{r.dataset}" + (f" vs {r.eval_set}" if kind == "ood" else "") for r in these.itertuples()
            ]
        rows.append({"composite": name, "n": len(these), "cells": ", ".join(text)})
    return pd.DataFrame(rows, columns=["composite", "n", "cells"])


def better_direction() -> dict[str, str]:
    ranks = {f"rank_{p}": "lower" for p in PRINCIPLES} | {"mean_rank": "lower"}
    return {name: ("higher" if higher else "lower") for name, (_, _, higher) in COMPOSITES.items()} | ranks


def per_cell_table(
    metrics: pd.DataFrame,
    trials: pd.DataFrame,
    metric: str,
    eval_set: str,
    task: str | None = "classification",
    alpha: float = 0.05,
    interval: str = "t",
) -> pd.DataFrame:
    """Mean ± std over seeds of one metric on one evaluation set, then the 1 − ``alpha`` interval of the mean
    (:func:`analysis.intervals.mean_interval`) and the number of seeds: rows methods, columns model/dataset
    (trials of one task, or of every task when ``task`` is None)."""
    from analysis.intervals import cell_intervals
    from analysis.tables import format_number

    final = final_metrics(metrics, trials, task=task)
    rows = final[(final["metric"] == metric) & (final["eval_set"] == eval_set)]
    if rows.empty:
        return pd.DataFrame()
    stats = cell_intervals(rows, ["method", "model", "dataset"], alpha, interval)
    stats["text"] = [
        f"{format_number(float(m))} ± {format_number(0.0 if np.isnan(s) else float(s))} "
        + (f"[{format_number(float(lo))}, {format_number(float(hi))}] n={n}" if n > 1 else "(1 seed: no interval)")
        for m, s, lo, hi, n in zip(
            stats["mean"], stats["std"], stats["low"], stats["high"], stats["seeds"], strict=True
        )
    ]
    stats["cell"] = stats["model"] + " / " + stats["dataset"]
    return stats.pivot(index="method", columns="cell", values="text").fillna("-")
