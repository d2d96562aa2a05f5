"""Composite scores and the per-principle rank summary on a hand-made metrics table.

Two methods, one model, the in-domain set ``digits`` (OOD sets ``noise`` and ``inv``) and the decision-task
set ``digits_imbalanced``, which also has an OOD set and a cost per sample: values on it that leaked into
an in-domain composite would change the expected numbers below."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from analysis.composites import COMPOSITES, PRINCIPLES, composite_coverage, composite_scores, with_eval_kinds
from ursa_ray.eval_sets import KINDS, UnknownEvalSet

# (method, dataset, seed, eval_set, metric): value
VALUES = {}
for method, seeds in (("a", (0, 1)), ("b", (0, 1))):
    for seed in seeds:
        VALUES.update(
            {
                (method, "digits", seed, "test", "accuracy"): {"a": (0.90, 0.92), "b": (0.85, 0.87)}[method][seed],
                (method, "digits", seed, "test", "nll"): {"a": (0.30, 0.32), "b": (0.25, 0.27)}[method][seed],
                (method, "digits", seed, "test", "misclass_auroc_entropy"): {"a": 0.80, "b": 0.70}[method],
                (method, "digits", seed, "test", "eaurc_maxprob"): {"a": 0.03, "b": 0.02}[method],
                (method, "digits", seed, "test", "aurc_maxprob"): {"a": 0.0, "b": 1.0}[method],  # not ranked
                (method, "digits", seed, "test", "nll_calibrated"): {"a": (0.28, 0.30), "b": (0.20, 0.22)}[method][
                    seed
                ],
                (method, "digits", seed, "noise", "ood_auroc_mi"): {"a": 0.90, "b": 0.50}[method],
                (method, "digits", seed, "noise", "ood_fpr95_mi"): {"a": 0.90, "b": 0.50}[method],
                (method, "digits", seed, "inv", "ood_fpr95_mi"): {"a": 0.90, "b": 0.70}[method],
                (method, "digits", seed, "noise", "ood_fpr95_entropy"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits", seed, "inv", "ood_auroc_mi"): {"a": 0.60, "b": 0.50}[method],
                (method, "digits", seed, "noise", "ood_auroc_entropy"): {"a": 0.80, "b": 0.70}[method],
                (method, "digits", seed, "inv", "ood_auroc_entropy"): {"a": 0.60, "b": 0.65}[method],
                (method, "digits", seed, "cost", "s_per_sample"): {"a": 0.1, "b": 0.2}[method],
                (method, "digits", seed, "cost", "flops_per_prediction"): {"a": 100.0, "b": 10.0}[method],
                (method, "digits", seed, "cost", "storage_bytes_32"): {"a": 5.0, "b": 50.0}[method],
                (method, "digits", seed, "corrupt:gaussian_noise:1", "accuracy"): {"a": 0.8, "b": 0.7}[method],
                (method, "digits", seed, "corrupt:gaussian_noise:3", "accuracy"): {"a": 0.5, "b": 0.55}[method],
                (method, "digits", seed, "corrupt:gaussian_noise:1", "ece"): {"a": 0.05, "b": 0.10}[method],
                (method, "digits", seed, "corrupt:gaussian_noise:3", "ece"): {"a": 0.2, "b": 0.1}[method],
                # PGD at the reference ε counts; another ε does not
                (method, "digits", seed, "adv:pgd_eps0.0625", "accuracy"): {"a": 0.3, "b": 0.4}[method],
                (method, "digits", seed, "adv:pgd_eps0.0625", "reference"): 1.0,
                (method, "digits", seed, "adv:pgd_eps0.25", "accuracy"): {"a": 0.9, "b": 0.0}[method],
                (method, "digits", seed, "adv:pgd_eps0.25", "reference"): 0.0,
                # a bit-depth copy of the OOD set is no OOD set of its own
                (method, "digits", seed, "noise@int8", "ood_auroc_mi"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits", seed, "noise@int8", "ood_fpr95_mi"): {"a": 0.0, "b": 1.0}[method],
                # the balanced set reports a decision cost too (same cost matrix); it enters no composite
                (method, "digits", seed, "test", "decision_cost"): {"a": 0.0, "b": 9.0}[method],
            }
        )
        if (method, seed) == ("b", 1):
            continue  # b's seed-1 trial on the decision task failed: no metric rows
        VALUES.update(
            {
                (method, "digits_imbalanced", seed, "test", "accuracy"): 0.5,
                (method, "digits_imbalanced", seed, "test", "nll"): {"a": 9.0, "b": 0.01}[method],
                (method, "digits_imbalanced", seed, "test", "misclass_auroc_entropy"): {"a": 0.1, "b": 0.99}[method],
                (method, "digits_imbalanced", seed, "test", "decision_cost"): {"a": (2.0, 2.2), "b": (1.0,)}[method][
                    seed
                ],
                (method, "digits_imbalanced", seed, "noise", "ood_auroc_mi"): {"a": 0.1, "b": 0.99}[method],
                (method, "digits_imbalanced", seed, "noise", "ood_fpr95_mi"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits_imbalanced", seed, "test", "eaurc_maxprob"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits_imbalanced", seed, "test", "nll_calibrated"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits_imbalanced", seed, "noise", "ood_auroc_entropy"): {"a": 0.0, "b": 1.0}[method],
                (method, "digits_imbalanced", seed, "cost", "s_per_sample"): 10.0,
                (method, "digits_imbalanced", seed, "cost", "flops_per_prediction"): {"a": 1.0, "b": 1e6}[method],
                (method, "digits_imbalanced", seed, "corrupt:gaussian_noise:3", "accuracy"): {"a": 0.0, "b": 1.0}[
                    method
                ],
            }
        )


def _tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    metrics = pd.DataFrame(
        [
            {
                "trial_id": f"{m}-{d}-{s}",
                "phase": "final",
                "method": m,
                "model": "mlp",
                "dataset": d,
                "seed": s,
                "eval_set": e,
                "metric": k,
                "value": v,
            }
            for (m, d, s, e, k), v in VALUES.items()
        ]
    )
    trials = pd.DataFrame(
        [
            {
                "trial_id": f"{m}-{d}-{s}",
                "phase": "final",
                "method": m,
                "model": "mlp",
                "dataset": d,
                "seed": s,
                "task": "classification",
                "decision_task": d == "digits_imbalanced",
                "status": "failed" if (m, d, s) == ("b", "digits_imbalanced", 1) else "ok",
            }
            for m in "ab"
            for d in ("digits", "digits_imbalanced")
            for s in (0, 1)
        ]
        + [  # a search trial and a regression trial never count
            {
                "trial_id": "search-x",
                "phase": "search",
                "method": "a",
                "model": "mlp",
                "dataset": "digits",
                "seed": 0,
                "task": "classification",
                "decision_task": False,
                "status": "ok",
            },
        ]
    )
    search_rows = metrics[metrics["trial_id"] == "a-digits-0"].assign(trial_id="search-x", phase="search", value=0.0)
    return pd.concat([metrics, search_rows], ignore_index=True), trials


def test_composites_and_principle_ranks_equal_hand_computed_values():
    scores = composite_scores(*_tables())
    expected = pd.DataFrame(
        {
            "accuracy": {"a": 0.91, "b": 0.86},
            "nll": {"a": 0.31, "b": 0.26},
            "misclass_auroc": {"a": 0.80, "b": 0.70},
            "eaurc": {"a": 0.03, "b": 0.02},  # by max probability
            "nll_calibrated": {"a": 0.29, "b": 0.21},
            "ood_auroc": {"a": 0.75, "b": 0.50},  # mutual information, in-domain (dataset, OOD set) pairs
            "ood_fpr95": {"a": 0.90, "b": 0.60},  # mutual information, the same pairs
            "ood_auroc_entropy": {"a": 0.70, "b": 0.675},  # total entropy, the same pairs
            "ood_fpr95_entropy": {"a": 0.0, "b": 1.0},
            "decision_cost": {"a": 2.1, "b": 1.0},  # decision-task cells only
            "s_per_sample": {"a": 0.1, "b": 0.2},
            "flops_per_prediction": {"a": 100.0, "b": 10.0},
            "storage_bytes": {"a": 5.0, "b": 50.0},
            "adv_accuracy": {"a": 0.3, "b": 0.4},
            "corrupt_accuracy": {"a": 0.65, "b": 0.625},
            "corrupt_ece": {"a": 0.125, "b": 0.1},
            "corrupt_accuracy_s3": {"a": 0.5, "b": 0.55},
            "corrupt_ece_s3": {"a": 0.2, "b": 0.1},
            # accuracy: a 1, b 2; uncertainty: nll (a 2, b 1), misclass (a 1, b 2), e-AURC (a 2, b 1) and
            # calibrated NLL (a 2, b 1); ood, each score once, on the mean over the OOD sets: by mutual
            # information AUROC (a 1, b 2) and FPR@95 (a 2, b 1), by total entropy AUROC (a 1, b 2) and FPR@95
            # (a 1, b 2); decision: a 2, b 1; robustness, each family once: PGD accuracy (a 2, b 1), and the
            # corruptions' accuracy averaged over its two sets (a 0.65, b 0.625: a 1, b 2) with their ECE
            # averaged (a 0.125, b 0.1: a 2, b 1); test_time: flops (a 2, b 1) and storage (a 1, b 2).
            # mean_rank = mean of the six principle ranks.
            "rank_accuracy": {"a": 1.0, "b": 2.0},
            "rank_uncertainty": {"a": 1.75, "b": 1.25},
            "rank_ood": {"a": 1.25, "b": 1.75},
            "rank_decision": {"a": 2.0, "b": 1.0},
            "rank_robustness": {"a": 1.75, "b": 1.25},
            "rank_test_time": {"a": 1.5, "b": 1.5},
            "mean_rank": {"a": 9.25 / 6, "b": 8.75 / 6},
        }
    )
    for column in expected:
        assert scores[column].to_dict() == pytest.approx(expected[column].to_dict(), abs=1e-12), column
    assert list(scores.index) == ["b", "a"]  # by mean_rank


def test_cells_count_decision_task_and_failed_seed_cells():
    scores = composite_scores(*_tables())
    assert scores["cells"].to_dict() == {"a": 2, "b": 2}
    assert scores["planned_cells"].to_dict() == {"a": 2, "b": 2}
    assert scores["complete"].to_dict() == {"a": True, "b": False}  # b lost one seed of the decision task


def test_coverage_names_the_cells_of_each_composite():
    coverage = composite_coverage(*_tables()).set_index("composite")
    assert coverage.loc["accuracy", "cells"] == "mlp/digits"
    assert coverage.loc["ood_auroc", "cells"] == "mlp/digits vs inv, mlp/digits vs noise"
    assert coverage.loc["decision_cost", "cells"] == "mlp/digits_imbalanced"
    assert coverage.loc["s_per_sample", "cells"] == "mlp/digits"
    assert coverage.loc["corrupt_accuracy", "cells"] == "mlp/digits × 2 corruption sets (1 types, severities 1, 3)"
    assert coverage.loc["corrupt_accuracy_s3", "n"] == 1


def _robustness_tables(
    corruption_sets: int, ece_gap: float = 0.0, transfer: bool = False
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Methods ``adv_winner`` and ``corrupt_winner`` on one cell: PGD accuracy 0.9 against 0.1 (and the same
    on the transfer set from the SGD source when ``transfer``), and on every one of ``corruption_sets``
    corruption sets accuracy 0.500 against 0.501 and ECE 0.05 + ``ece_gap`` against 0.05."""
    rows, trials = [], []
    for method, adv, corrupt, ece in (("adv_winner", 0.9, 0.500, 0.05 + ece_gap), ("corrupt_winner", 0.1, 0.501, 0.05)):
        trial = f"{method}-0"
        trials.append(
            {
                "trial_id": trial,
                "phase": "final",
                "method": method,
                "model": "mlp",
                "dataset": "digits",
                "seed": 0,
                "task": "classification",
                "decision_task": False,
                "status": "ok",
            }
        )
        values = {
            ("test", "accuracy"): 0.9,
            ("adv:pgd_eps0.0625", "accuracy"): adv,
            ("adv:pgd_eps0.0625", "reference"): 1.0,
            ("adv:pgd_eps0.25", "accuracy"): 1 - adv,  # not the reference ε: enters no composite
            ("adv:pgd_eps0.25", "reference"): 0.0,
        }
        if transfer:
            values |= {("transfer:pgd_eps0.0625", "accuracy"): adv, ("transfer:pgd_eps0.25", "accuracy"): 1 - adv}
        for k in range(corruption_sets):
            values |= {
                (f"corrupt:type{k // 5}:{k % 5 + 1}", "accuracy"): corrupt,
                (f"corrupt:type{k // 5}:{k % 5 + 1}", "ece"): ece,
            }
        rows += [
            {
                "trial_id": trial,
                "phase": "final",
                "method": method,
                "model": "mlp",
                "dataset": "digits",
                "seed": 0,
                "eval_set": e,
                "metric": m,
                "value": v,
            }
            for (e, m), v in values.items()
        ]
    return pd.DataFrame(rows), pd.DataFrame(trials)


@pytest.mark.parametrize("corruption_sets", [1, 50])
def test_robustness_rank_counts_each_family_once_however_many_corruption_sets(corruption_sets):
    """Winning adversarial accuracy 0.9 to 0.1, losing corruption accuracy by 0.001 on every corruption set
    and tying its ECE: white-box 1 against 2, corruptions (2 + 1.5) / 2 against (1 + 1.5) / 2, so 1.375
    against 1.625 whatever the number of corruption sets.  Ranking every ``corrupt:TYPE:SEVERITY`` set as its
    own cell (an older rule) gives the adversarial winner (1 + 50 × 2 + 50 × 1.5) / 101 = 1.74: last."""
    scores = composite_scores(*_robustness_tables(corruption_sets))
    assert scores.loc["adv_winner", "rank_robustness"] == pytest.approx(1.375)
    assert scores.loc["corrupt_winner", "rank_robustness"] == pytest.approx(1.625)


def test_a_method_far_better_under_attack_and_slightly_worse_under_corruption_wins_robustness():
    """Issue 44, item 9: the families (white-box attacks, transfer attacks, corruptions) weigh one each.
    The adversarial winner is 0.8 better on the white-box and on the transfer set and 0.001 worse on both
    corruption metrics: (1 + 1 + 2) / 3 = 4/3 against 5/3.  Weighing the metrics (white-box accuracy,
    corruption accuracy, corruption ECE, transfer in no composite) made it lose, 5/3 against 4/3."""
    scores = composite_scores(*_robustness_tables(10, ece_gap=0.001, transfer=True))
    assert scores["transfer_accuracy"].to_dict() == pytest.approx({"adv_winner": 0.9, "corrupt_winner": 0.1})
    assert scores["rank_robustness"].to_dict() == pytest.approx({"adv_winner": 4 / 3, "corrupt_winner": 5 / 3})


def _one_cell_tables(values: dict[tuple[str, str, str], float]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One seed of each method on the in-domain cell mlp/digits; ``values``: (method, eval_set, metric): value."""
    methods = sorted({m for m, _, _ in values})
    trials = pd.DataFrame(
        [
            {
                "trial_id": f"{m}-0",
                "phase": "final",
                "method": m,
                "model": "mlp",
                "dataset": "digits",
                "seed": 0,
                "task": "classification",
                "decision_task": False,
                "status": "ok",
            }
            for m in methods
        ]
    )
    metrics = pd.DataFrame(
        [
            {
                "trial_id": f"{m}-0",
                "phase": "final",
                "method": m,
                "model": "mlp",
                "dataset": "digits",
                "seed": 0,
                "eval_set": e,
                "metric": k,
                "value": v,
            }
            for (m, e, k), v in values.items()
        ]
    )
    return metrics, trials


def test_a_principle_weighs_once_however_many_metrics_it_has():
    """``uncertainty_winner`` wins all four uncertainty metrics and loses accuracy; ``accuracy_winner`` the
    reverse: mean_rank ties at 1.5.  Weighing each metric once in mean_rank (rather than each principle)
    gives the uncertainty winner (4 × 1 + 2) / 5 = 1.2 against 1.8."""
    values = {}
    for method, better in (("uncertainty_winner", True), ("accuracy_winner", False)):
        values |= {
            (method, "test", "accuracy"): 0.8 if better else 0.9,
            (method, "test", "nll"): 0.3 if better else 0.4,
            (method, "test", "misclass_auroc_entropy"): 0.9 if better else 0.8,
            (method, "test", "eaurc_maxprob"): 0.01 if better else 0.02,
            (method, "test", "nll_calibrated"): 0.25 if better else 0.35,
        }
    scores = composite_scores(*_one_cell_tables(values))
    assert scores.loc["uncertainty_winner", "rank_uncertainty"] == 1.0
    assert scores.loc["accuracy_winner", "rank_accuracy"] == 1.0
    assert scores["mean_rank"].to_dict() == pytest.approx({"uncertainty_winner": 1.5, "accuracy_winner": 1.5})


def test_ood_detection_ranks_each_score_once_so_zero_mutual_information_is_not_chance():
    """Issue 44, item 8: ``sngp``'s mutual information is identically 0 (one-sample predictive: AUROC 0.5 and
    FPR@95 1 by MI) while its total entropy detects the OOD set (AUROC 0.996).  Ranked on MI alone (the old
    principle) it tied the ``chance`` method on AUROC and lost on FPR@95; with MI and total entropy each counting
    once it ranks ahead of ``chance``: by MI (2.5 + 3) / 2, by entropy 1, so 1.875 against 2.625 and
    ``good``'s 1.5."""
    values = {}
    for method, mi_auroc, mi_fpr, entropy_auroc, entropy_fpr in (
        ("sngp", 0.5, 1.0, 0.996, 0.02),
        ("chance", 0.5, 0.95, 0.5, 0.95),
        ("good", 0.9, 0.3, 0.9, 0.3),
    ):
        values |= {
            (method, "test", "accuracy"): 0.9,
            (method, "noise", "ood_auroc_mi"): mi_auroc,
            (method, "noise", "ood_fpr95_mi"): mi_fpr,
            (method, "noise", "ood_auroc_entropy"): entropy_auroc,
            (method, "noise", "ood_fpr95_entropy"): entropy_fpr,
        }
    scores = composite_scores(*_one_cell_tables(values))
    assert scores["rank_ood"].to_dict() == pytest.approx({"sngp": 1.875, "chance": 2.625, "good": 1.5})


def test_readme_composite_table_lists_each_principles_composites():
    """README's table of principles names exactly the composites ranked under each (catches a composite
    added to PRINCIPLES but not to the user's guide, or the reverse)."""
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Composite scores and the report", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (.*?) \| [^|]+ \|$", section, flags=re.MULTILINE)
    listed = {principle: tuple(re.findall(r"`(\w+)`", names)) for principle, names in rows if principle in PRINCIPLES}
    assert listed == PRINCIPLES


def test_a_set_of_a_new_kind_enters_no_ood_composite():
    """Composites select sets by kind.  A set of a kind no composite names (here ``calibration``, as a new probe
    would write it) leaves every composite unchanged; the old rule (``is_ood_set``: any name without a known
    prefix or ``@`` is OOD) put ``calibration:test`` into ood_auroc and ood_fpr95 and reversed their order.
    Without a recorded kind such a name is refused, never taken for an OOD set."""
    metrics, trials = _tables()
    metrics = with_eval_kinds(metrics)
    new = metrics[metrics["eval_kind"] == "ood"].assign(eval_set="calibration:test", eval_kind="calibration")
    new = new.assign(value=new["method"].map({"a": 0.0, "b": 1.0}))
    with_new = pd.concat([metrics, new], ignore_index=True)
    pd.testing.assert_frame_equal(composite_scores(with_new, trials), composite_scores(metrics, trials))
    with pytest.raises(UnknownEvalSet, match="calibration:test"):
        composite_scores(with_new.drop(columns="eval_kind"), trials)


def test_every_composite_names_a_kind_of_evaluation_set():
    assert {kind for kind, _, _ in COMPOSITES.values()} <= set(KINDS)


def test_fidelity_composites_read_the_test_sets_fidelity_only_and_rank_under_their_own_principle():
    """``fidelity_tv`` and ``fidelity_agreement`` are the method's test predictive against the reference
    (``fidelity:test``); the OOD sets' fidelity rows (same kind) must not enter them (the mutation that drops
    ON_SET averages 0.1 and 0.9 to 0.5 for ``close``), and ``rank_fidelity`` is a principle of its own."""
    values = {}
    for method, tv, agreement, ood_tv in (("close", 0.1, 0.95, 0.9), ("far", 0.3, 0.8, 0.2)):
        values |= {
            (method, "test", "accuracy"): 0.9,
            (method, "fidelity:test", "total_variation"): tv,
            (method, "fidelity:test", "agreement"): agreement,
            (method, "fidelity:noise", "total_variation"): ood_tv,
            (method, "fidelity:noise", "agreement"): 0.5,
        }
    scores = composite_scores(*_one_cell_tables(values))
    assert scores["fidelity_tv"].to_dict() == pytest.approx({"close": 0.1, "far": 0.3})
    assert scores["fidelity_agreement"].to_dict() == pytest.approx({"close": 0.95, "far": 0.8})
    assert scores["rank_fidelity"].to_dict() == {"close": 1.0, "far": 2.0}
    assert scores["mean_rank"].to_dict() == pytest.approx({"close": 1.25, "far": 1.75})  # accuracy ties at 1.5


def test_calibrated_sets_are_a_variant_of_their_own_never_averaged_into_the_raw_method():
    """Temperature scaling's ``SET@calibrated`` rows of method ``a`` (here its NLL set to 0.1 and its OOD
    entropy AUROC to 0.99, every other value as raw) make the method ``a@calibrated``: its own row in the
    composite table, with the trial's cost copied and ``a``'s cell counts, while ``a`` and ``b`` keep every
    composite they had; in the per-cell table it is a row beside ``a``."""
    from analysis.composites import per_cell_table

    metrics, trials = _tables()
    metrics = with_eval_kinds(metrics)
    twins = metrics[
        (metrics["method"] == "a")
        & (metrics["phase"] == "final")
        & metrics["eval_kind"].isin(("in_domain", "ood", "corruption", "adversarial"))
        & (metrics["metric"] != "reference")
    ]
    twins = twins.assign(eval_set=twins["eval_set"] + "@calibrated", eval_kind="calibrated")
    twins.loc[twins["metric"] == "nll", "value"] = 0.1
    twins.loc[twins["metric"] == "ood_auroc_entropy", "value"] = 0.99
    before = composite_scores(metrics, trials)
    after = composite_scores(pd.concat([metrics, twins], ignore_index=True), trials)
    names = [c for c in COMPOSITES if c in before.columns]
    pd.testing.assert_frame_equal(after.loc[["a", "b"], names], before.loc[["a", "b"], names])
    variant = after.loc["a@calibrated"]
    assert variant["nll"] == pytest.approx(0.1) and variant["ood_auroc_entropy"] == pytest.approx(0.99)
    for name in (
        "accuracy",
        "ood_auroc",
        "adv_accuracy",
        "corrupt_ece",
        "decision_cost",
        "s_per_sample",
        "storage_bytes",
    ):
        assert variant[name] == pytest.approx(before.loc["a", name]), name
    assert (variant["cells"], variant["planned_cells"], variant["complete"]) == (2, 2, True)
    table = per_cell_table(pd.concat([metrics, twins], ignore_index=True), trials, "nll", "test")
    assert list(table.index) == ["a", "a@calibrated", "b"]
    assert table.loc["a@calibrated", "mlp / digits"].startswith("0.100 ± 0.000")
    assert table.loc["a", "mlp / digits"].startswith("0.310 ± ")
