"""Intervals, paired tests, Friedman/Nemenyi and the report's verdict (analysis/intervals.py, analysis/statistics.py).

Results directories are written through the real results writer (:class:`ursa_ray.results.ResultsDirectory`)
and read back with ``ursa_ray.load``; the many-simulation rates (false positives, coverage) run the same
functions on in-memory unit tables, after a test shows a written directory gives the same tables."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

import ursa_ray
from analysis.intervals import composite_interval, mean_interval, wilson_interval
from analysis.statistics import (
    EXACT_UNITS,
    compare,
    friedman_test,
    holm,
    median_interval,
    nemenyi_critical_difference,
    paired_tests,
    wilcoxon_p_values,
)
from ursa_ray.results import ResultsDirectory

SIMULATIONS = 300


def write_results(path, values: dict, failed: frozenset = frozenset()) -> None:
    """One final classification trial per (method, model, dataset, seed) key of ``values`` (a dict metric:
    value on the test set, or (eval_set, metric): value), written through the results writer; keys in
    ``failed`` are failed trials."""
    results = ResultsDirectory(path)
    for (method, model, dataset, seed), metrics in values.items():
        trial_id = f"{method}-{model}-{dataset}-{seed}"
        status = "failed" if (method, model, dataset, seed) in failed else "ok"
        record = {
            "trial_id": trial_id,
            "phase": "final",
            "cell": f"{method}/{model}/{dataset}",
            "method": method,
            "method_name": method,
            "model": model,
            "dataset": dataset,
            "task": "classification",
            "decision_task": False,
            "seed": seed,
            "status": status,
            "reserved_cpu_s": 1.0,
            "reserved_gpu_s": 0.0,
            "finished_at": float(seed),
            "selection": "",
        }
        rows = (
            []
            if status == "failed"
            else [
                {
                    "trial_id": trial_id,
                    "method": method,
                    "model": model,
                    "dataset": dataset,
                    "seed": seed,
                    "phase": "final",
                    "eval_set": metric[0] if isinstance(metric, tuple) else "test",
                    "metric": metric[1] if isinstance(metric, tuple) else metric,
                    "value": value,
                }
                for metric, value in metrics.items()
            ]
        )
        results.add(record, rows)


def simulated_values(rng, shifts: dict[str, float], cells=(("mlp", "digits"), ("mlp", "wine")), seeds=6) -> dict:
    """Accuracy and NLL of each method: a cell effect, a seed effect shared by the methods of a seed (the
    pairing), the method's shift and independent noise (σ = 0.01)."""
    values = {}
    for model, dataset in cells:
        cell = rng.normal(0.9, 0.03)
        for seed in range(seeds):
            shared = rng.normal(0.0, 0.02)
            for method, shift in shifts.items():
                accuracy = cell + shared + shift + rng.normal(0.0, 0.01)
                values[(method, model, dataset, seed)] = {"accuracy": accuracy, "nll": 1.0 - accuracy}
    return values


def units_frame(values: dict) -> pd.DataFrame:
    """The unit table :func:`analysis.composites.unit_values` gives for ``values`` (test-set metrics only)."""
    rows = [
        {"composite": metric, "method": m, "model": model, "dataset": d, "seed": s, "value": v}
        for (m, model, d, s), metrics in values.items()
        for metric, v in metrics.items()
    ]
    return pd.DataFrame(rows)


def test_a_written_directory_gives_the_tables_of_its_units(tmp_path):
    values = simulated_values(np.random.default_rng(0), {"a": 0.0, "b": 0.0, "c": 0.0})
    write_results(tmp_path, values)
    loaded = ursa_ray.load(tmp_path).compare(principle="uncertainty")
    direct = paired_tests(units_frame(values), principles=["uncertainty"])
    pd.testing.assert_frame_equal(loaded.pairs.drop(columns="composite"), direct.drop(columns="composite"))


def test_a_clear_shift_is_significant_in_the_right_direction_and_stated(tmp_path):
    """b is 0.02 more accurate on every unit (2σ of the noise): b beats a on accuracy (higher is better) and on
    NLL (lower is better); an orientation that ignored the direction would name a for NLL."""
    write_results(tmp_path, simulated_values(np.random.default_rng(1), {"a": 0.0, "b": 0.02, "c": 0.0}))
    results = ursa_ray.load(tmp_path)
    pairs = results.compare().pairs.set_index(["composite", "method_a", "method_b"])
    assert pairs.loc[("accuracy", "a", "b"), "better"] == "b"
    assert pairs.loc[("nll", "a", "b"), "better"] == "b"
    assert pairs.loc[("accuracy", "a", "b"), "units"] == 12
    assert pairs.loc[("accuracy", "a", "b"), "median_difference"] < 0
    assert pairs.loc[("accuracy", "a", "b"), "difference_high"] < 0  # the interval excludes 0
    assert (pairs.loc["accuracy", "p_holm"] >= pairs.loc["accuracy", "p_value"]).all()
    from analysis.report import write_report

    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    summary = report.split("**Summary.**")[1].split("\n### ")[0]
    assert "b better than a on accuracy" in summary and "b better than a on nll" in summary
    assert "than b" not in summary  # no ordering against the best one is stated
    assert (tmp_path / "figures" / "cd_accuracy.png").read_bytes().startswith(b"\x89PNG")
    assert "![cd_accuracy](figures/cd_accuracy.png)" in report


@pytest.mark.slow
def test_same_distribution_methods_are_tied_at_the_stated_rate():
    """Three methods drawn from one distribution on 12 paired units, 300 simulated benchmarks: the share of
    benchmarks stating any ordering (family-wise, Holm over the three pairs) stays within the binomial bound
    for α = 0.05; without Holm's correction it is about 0.12 and exceeds it.  Each pair alone rejects at a
    rate near α (the exact test's attainable level at n = 12 is below α, so the lower bound uses α/2)."""
    rng = np.random.default_rng(2)
    any_ordering = raw_rejections = 0
    for _ in range(SIMULATIONS):
        pairs = paired_tests(units_frame(simulated_values(rng, {"a": 0.0, "b": 0.0, "c": 0.0})), 0.05, ["accuracy"])
        any_ordering += bool((pairs["better"] != "tie").any())
        raw_rejections += int((pairs["p_value"] < 0.05).sum())
    assert any_ordering <= stats.binom.ppf(0.999, SIMULATIONS, 0.05)
    assert (
        stats.binom.ppf(0.001, 3 * SIMULATIONS, 0.025)
        <= raw_rejections
        <= stats.binom.ppf(0.999, 3 * SIMULATIONS, 0.05)
    )


def test_t_interval_covers_the_true_mean_at_its_level():
    """5 seeds, 2,000 simulations: coverage within the binomial band around 0.95 (a normal quantile instead
    of Student's t covers about 0.88)."""
    rng = np.random.default_rng(3)
    n = 2000
    covered = 0
    for _ in range(n):
        _, low, high = mean_interval(rng.normal(1.0, 0.1, size=5))
        covered += low <= 1.0 <= high
    assert stats.binom.ppf(0.0005, n, 0.95) <= covered <= stats.binom.ppf(0.9995, n, 0.95)


def test_composite_interval_propagates_cells_and_covers_the_composite_mean():
    """Three cells with different spreads and seed counts: the Welch–Satterthwaite interval of the mean of
    the cell means covers the mean of the true cell means at close to 95%."""
    rng = np.random.default_rng(4)
    truth, spread, seeds = np.array([0.9, 0.8, 0.7]), np.array([0.01, 0.05, 0.02]), np.array([3, 5, 8])
    n = 2000
    covered = 0
    for _ in range(n):
        draws = [rng.normal(t, s, size=k) for t, s, k in zip(truth, spread, seeds)]
        cells = pd.DataFrame({"mean": [d.mean() for d in draws], "std": [d.std(ddof=1) for d in draws], "seeds": seeds})
        _, low, high = composite_interval(cells)
        covered += low <= truth.mean() <= high
    assert 0.93 * n <= covered <= 0.97 * n


def test_one_seed_gives_no_interval_and_says_why(tmp_path):
    values = {
        ("a", "mlp", "digits", 0): {"accuracy": 0.9},
        ("b", "mlp", "digits", 0): {"accuracy": 0.8},
        ("a", "mlp", "wine", 0): {"accuracy": 0.9},
        ("a", "mlp", "wine", 1): {"accuracy": 0.92},
        ("a", "mlp", "wine", 2): {"accuracy": 0.94},
    }
    write_results(tmp_path, values)
    cells = ursa_ray.load(tmp_path).compare().cells.set_index(["method", "dataset"])
    assert np.isnan(cells.loc[("a", "digits"), "low"]) and cells.loc[("a", "digits"), "seeds"] == 1
    half = stats.t.ppf(0.975, 2) * 0.02 / math.sqrt(3)
    assert cells.loc[("a", "wine"), "low"] == pytest.approx(0.92 - half)
    assert cells.loc[("a", "wine"), "high"] == pytest.approx(0.92 + half)
    from analysis.report import write_report

    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "0.900 ± 0.000 (1 seed: no interval)" in report  # the per-cell table
    assert "0.910 (1 seed: no interval)" in report  # the composite over a one-seed cell and a three-seed one


def test_a_method_missing_a_cell_is_compared_on_shared_units_only(tmp_path):
    """c's trials on ``wine`` failed: its pairs use the 6 ``digits`` units (nothing imputed), a-b all 12, and
    the Friedman test uses the 6 blocks every method completed."""
    values = simulated_values(np.random.default_rng(5), {"a": 0.0, "b": 0.0, "c": 0.0})
    failed = frozenset(k for k in values if k[0] == "c" and k[2] == "wine")
    write_results(tmp_path, values, failed)
    comparison = ursa_ray.load(tmp_path).compare(principle="accuracy")
    units = comparison.pairs.set_index(["method_a", "method_b"])["units"].to_dict()
    assert units == {("a", "b"): 12, ("a", "c"): 6, ("b", "c"): 6}
    friedman = comparison.friedman.set_index("principle")
    assert friedman.loc["accuracy", "blocks"] == 6 and friedman.loc["accuracy", "all_blocks"] == 12
    from analysis.report import write_report

    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "units per pair 6–12" in report and "over 6 of 12 blocks" in report


# Demšar (2006), Table 6: AUC of C4.5, C4.5+m, C4.5+cf, C4.5+m+cf on 14 data sets.  The paper's ranks break
# the printed tie on ``voting`` (0.975, 0.975) in favour of C4.5+cf, as its average ranks show; so does 0.97501.
DEMSAR_AUC = np.array(
    [
        [0.763, 0.768, 0.771, 0.798],
        [0.599, 0.591, 0.590, 0.569],
        [0.954, 0.971, 0.968, 0.967],
        [0.628, 0.661, 0.654, 0.657],
        [0.882, 0.888, 0.886, 0.898],
        [0.936, 0.931, 0.916, 0.931],
        [0.661, 0.668, 0.609, 0.685],
        [0.583, 0.583, 0.563, 0.625],
        [0.775, 0.838, 0.866, 0.875],
        [1.000, 1.000, 1.000, 1.000],
        [0.940, 0.962, 0.965, 0.962],
        [0.619, 0.666, 0.614, 0.669],
        [0.972, 0.981, 0.97501, 0.975],
        [0.957, 0.978, 0.946, 0.970],
    ]
)
DEMSAR_METHODS = ["C4.5", "C4.5+m", "C4.5+cf", "C4.5+m+cf"]


def _demsar_units() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"composite": "accuracy", "method": m, "model": "tree", "dataset": f"set{i}", "seed": 0, "value": v}
            for i, row in enumerate(DEMSAR_AUC)
            for m, v in zip(DEMSAR_METHODS, row)
        ]
    )


def test_friedman_and_nemenyi_reproduce_demsar_2006_worked_example():
    """Average ranks 3.143, 2.000, 2.893, 1.964; χ²_F = 9.28 by the paper's formula (scipy's statistic is
    tie-corrected: times the correction factor it gives 9.28); CD = 1.25 at α = 0.05 (q = 2.569) and 1.12 at
    α = 0.10 (q = 2.291).  At 0.05 Nemenyi separates no method from the best; at 0.10 C4.5 is worse than
    C4.5+m+cf (1.18 > 1.12), as the paper concludes."""
    result = friedman_test(_demsar_units(), "accuracy", alpha=0.05)
    assert result.mean_ranks[DEMSAR_METHODS].round(3).tolist() == [3.143, 2.000, 2.893, 1.964]
    ties = sum(t**3 - t for row in DEMSAR_AUC for t in np.unique(row, return_counts=True)[1])
    correction = 1 - ties / (14 * 4 * (4**2 - 1))
    assert result.statistic * correction == pytest.approx(9.28, abs=0.005)
    assert result.p_value < 0.05
    assert nemenyi_critical_difference(4, 14, 0.05) == pytest.approx(1.25, abs=0.005)
    assert nemenyi_critical_difference(4, 14, 0.10) == pytest.approx(1.12, abs=0.005)
    assert result.critical_difference == pytest.approx(1.25, abs=0.005)
    assert sorted(result.best_group) == sorted(DEMSAR_METHODS)
    at_ten = friedman_test(_demsar_units(), "accuracy", alpha=0.10)
    assert sorted(at_ten.best_group) == ["C4.5+cf", "C4.5+m", "C4.5+m+cf"]


def test_holm_matches_the_step_down_rule_on_demsar_comparisons_with_a_control():
    """Demšar's Holm example (Section 3.2.2): C4.5+m+cf as control, z = (R_i − R_c)/√(k(k+1)/6N).  Holm
    multiplies the i-th smallest of m p-values by (m − i + 1) and keeps the running maximum; Bonferroni
    (3 p everywhere) or no correction would differ."""
    se = math.sqrt(4 * 5 / (6 * 14))
    p = 2 * stats.norm.sf(np.array([3.143 - 1.964, 2.893 - 1.964, 2.000 - 1.964]) / se)
    expected = [3 * p[0], max(3 * p[0], 2 * p[1]), max(3 * p[0], 2 * p[1], p[2])]
    assert holm(p[[2, 0, 1]]).tolist() == pytest.approx([expected[2], expected[0], expected[1]])
    assert holm(p)[0] < 0.05 < holm(p)[1]  # only C4.5 is worse than the control at α = 0.05


def test_holm_equals_statsmodels_and_leaves_missing_p_values_out():
    from statsmodels.stats.multitest import multipletests

    p = np.random.default_rng(6).uniform(0, 0.2, size=12)
    assert holm(p) == pytest.approx(multipletests(p, method="holm")[1])
    with_missing = holm(np.array([0.01, np.nan, 0.04]))
    assert np.isnan(with_missing[1]) and with_missing[[0, 2]] == pytest.approx([0.02, 0.04])


@pytest.mark.parametrize("n", [5, 6, 9, 17, 30])
def test_median_interval_is_scipys_order_statistic_interval(n):
    d = np.random.default_rng(n).normal(size=n)
    low, high = median_interval(d, 0.05)
    interval = stats.quantile_test(d, q=0.0, p=0.5).confidence_interval(0.95)
    if n < 6:
        assert np.isnan(low) and np.isnan(high)
    else:
        assert (low, high) == (interval.low, interval.high)


def test_wilson_interval_equals_the_score_formula():
    z = stats.norm.ppf(0.975)
    for count, total in ((0, 10), (7, 10), (19, 20)):
        p = count / total
        centre = (p + z**2 / (2 * total)) / (1 + z**2 / total)
        half = z / (1 + z**2 / total) * math.sqrt(p * (1 - p) / total + z**2 / (4 * total**2))
        low, high = wilson_interval(np.array([count]), np.array([total]))
        assert (low[0], high[0]) == pytest.approx((centre - half, centre + half))


def test_regression_coverage_gets_a_wilson_interval_over_repetitions():
    from analysis.coverage import coverage_table

    # one test point, 4 repetitions, covered in 2 (|mean − truth| ≤ 1.96 std)
    points = pd.DataFrame(
        {
            "method": "m",
            "model": "mlp",
            "experiment": "e1",
            "complexity": 1.0,
            "repetition": range(4),
            "point_id": 0,
            "in_distribution": True,
            "truth": 0.0,
            "mean": [0.1, 0.3, 0.0, 0.5],
            "std": [0.1, 0.1, 0.2, 0.2],
        }
    )
    row = coverage_table(points).iloc[0]
    low, high = wilson_interval(np.array([2]), np.array([4]))
    assert row["coverage"] == 0.5 and (row["coverage_low"], row["coverage_high"]) == pytest.approx((low[0], high[0]))


def test_compare_rejects_an_unknown_principle_and_a_bad_alpha():
    units = _demsar_units()
    metrics = units.assign(trial_id="x", phase="final", eval_set="test", metric="accuracy")
    with pytest.raises(ValueError, match="principle: unknown 'speed'; allowed: accuracy"):
        compare(metrics, pd.DataFrame(), principle="speed")
    with pytest.raises(ValueError, match="alpha"):
        compare(metrics, pd.DataFrame(), alpha=1.5)


def test_report_alpha_out_of_range_is_one_line_and_writes_nothing(tmp_path, capsys):
    from ursa_ray.cli import main

    write_results(tmp_path, {("a", "mlp", "digits", 0): {"accuracy": 0.9}})
    assert main(["report", str(tmp_path), "--alpha", "1.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --alpha 1.5: must be between 0 and 1 (exclusive), e.g. 0.05"]
    assert not (tmp_path / "report.md").exists()


def test_region_coverage_gets_a_wilson_interval_with_n_the_repetitions():
    """Region coverage per repetition 1/2 and 2/2: Wilson at 1.5 of 2 (a t interval over two repetitions,
    0.75 ± 12.7 · 0.25, would leave [0, 1])."""
    from analysis.coverage import coverage_summary

    points = pd.DataFrame(
        {
            "method": "m",
            "model": "mlp",
            "experiment": "e1",
            "complexity": 1.0,
            "repetition": [0, 0, 1, 1],
            "point_id": [0, 1, 0, 1],
            "in_distribution": True,
            "truth": 0.0,
            "mean": [0.1, 0.5, 0.1, 0.1],
            "std": [0.1, 0.1, 0.1, 0.1],
        }
    )
    row = coverage_summary(points).iloc[0]
    low, high = wilson_interval(np.array([1.5]), np.array([2]))
    assert row["coverage"] == 0.75 and (row["coverage_low"], row["coverage_high"]) == pytest.approx((low[0], high[0]))
    assert 0 <= row["coverage_low"] <= row["coverage_high"] <= 1
    from analysis.coverage import regression_markdown

    shown = regression_markdown(points)  # the report's table shows those Wilson bounds, not a t interval
    assert f"| 0.750 [{low[0]:.3f}, {high[0]:.3f}] |" in shown


def test_grouped_intervals_average_sets_within_a_trial_before_seeds_and_cells():
    """Two OOD sets per trial are one unit (their mean), not two seeds: 3 seeds of means 0.5, 0.6, 0.7."""
    from analysis.intervals import grouped_intervals

    rows = pd.DataFrame(
        [
            {"method": "a", "model": "mlp", "dataset": "digits", "seed": s, "set": k, "value": v}
            for s, (v0, v1) in enumerate(((0.4, 0.6), (0.5, 0.7), (0.6, 0.8)))
            for k, v in enumerate((v0, v1))
        ]
    )
    row = grouped_intervals(rows, ["method"]).iloc[0]
    half = stats.t.ppf(0.975, 2) * 0.1 / math.sqrt(3)
    assert row["seeds"] == 3 and row["mean"] == pytest.approx(0.6)
    assert (row["low"], row["high"]) == pytest.approx((0.6 - half, 0.6 + half))


BOOTSTRAP_SEEDS = [0.80, 0.85, 0.90, 0.95, 0.99]


def bootstrap_text(values) -> str:
    from analysis.intervals import mean_interval

    _, low, high = mean_interval(np.array(values), how="bootstrap")
    return f"[{low:.3f}, {high:.3f}] n={len(values)}"


def test_a_grid_asking_for_bootstrap_gives_a_report_of_bootstrap_intervals(tmp_path):
    """The results' grid.yaml says ``statistics: {interval: bootstrap}``: the per-cell table, the one-cell
    composite, the adversarial and the bit-depth tables show scipy's percentile-bootstrap interval and not
    Student's t (catches the key not reaching the report or one of its tables, or the composite of one cell
    ignoring its cell's interval)."""
    from analysis.report import write_report

    seeds = {
        ("a", "mlp", "digits", s): {
            "accuracy": v,
            ("adv:pgd_eps0.1", "accuracy"): v,
            ("adv:pgd_eps0.1", "epsilon"): 0.1,
            ("adv:pgd_eps0.1", "attack_success_rate"): 1 - v,
            ("adv:pgd_eps0.1", "adv_auroc_mi"): 0.5,
            ("test@int8", "accuracy"): v,
        }
        for s, v in enumerate(BOOTSTRAP_SEEDS)
    }
    write_results(tmp_path, seeds)
    _, t_low, t_high = mean_interval(np.array(BOOTSTRAP_SEEDS))
    t_text = f"[{t_low:.3f}, {t_high:.3f}] n=5"
    write_report(tmp_path)
    assert t_text in (tmp_path / "report.md").read_text()  # no grid.yaml: Student t

    grid = (Path(__file__).parents[1] / "grids" / "quickstart.yaml").read_text()
    (tmp_path / "grid.yaml").write_text(grid + "\nstatistics: {interval: bootstrap}\n")
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert bootstrap_text(BOOTSTRAP_SEEDS) != t_text
    composite_row = report.split("## Composite scores")[1].split("\n| a ")[1].split("\n")[0]
    per_cell = report.split("## Per-cell results")[1]
    assert bootstrap_text(BOOTSTRAP_SEEDS) in composite_row and bootstrap_text(BOOTSTRAP_SEEDS) in per_cell
    for section in ("## Adversarial examples", "## Posterior samples stored at lower bit depths"):
        assert bootstrap_text(BOOTSTRAP_SEEDS) in report.split(section)[1].split("\n## ")[0], section
    assert t_text not in report
    assert "percentile bootstrap" in per_cell.split("\n")[0]
    loaded = ursa_ray.load(tmp_path)  # the Python entry point reads the grid's choice too, as the report does
    assert loaded.interval == "bootstrap"
    cell = loaded.compare(principle="accuracy").cells.set_index("method").loc["a"]
    assert bootstrap_text(BOOTSTRAP_SEEDS) == f"[{cell['low']:.3f}, {cell['high']:.3f}] n=5"
    t_cell = loaded.compare(principle="accuracy", interval="t").cells.set_index("method").loc["a"]
    assert (t_cell["low"], t_cell["high"]) == pytest.approx((t_low, t_high))


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ("{interval: normal}", "statistics.interval"),
        ("{n_resamples: 10}", "statistics.n_resamples"),
        ("3", "statistics"),
    ],
)
def test_a_bad_statistics_block_is_refused_in_one_line(tmp_path, capsys, block, field):
    """In a grid (before any trial) and in a results directory's grid.yaml (``ursa-ray report``: exit 2,
    nothing written); catches an unvalidated block or a report that silently falls back to t."""
    import yaml

    from ursa_ray.cli import main
    from ursa_ray.grid import GridError, parse_grid

    grid = (Path(__file__).parents[1] / "grids" / "quickstart.yaml").read_text() + f"\nstatistics: {block}\n"
    with pytest.raises(GridError) as refused:
        parse_grid(yaml.safe_load(grid), "g.yaml")
    assert str(refused.value).startswith(f"g.yaml: {field}: ") and "\n" not in str(refused.value)
    write_results(tmp_path, {("a", "mlp", "digits", 0): {"accuracy": 0.9}})
    (tmp_path / "grid.yaml").write_text(grid)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {tmp_path / 'grid.yaml'}: {field}: ")
    assert not (tmp_path / "report.md").exists()


def test_corruption_table_gives_the_interval_over_seeds_and_labels_the_spread_over_types(tmp_path):
    """Per seed the mean over corruption types, then Student t over the 3 seeds (hand computed), beside the
    inter-quartile range over types of the per-type means; catches the old table (mean [IQR], no interval
    over seeds) and an interval taken over types instead of seeds."""
    from analysis.corruption_shift import corruption_rows, corruption_table
    from analysis.tables import load_results

    types = {"gaussian_noise": [0.70, 0.74, 0.72], "blur": [0.60, 0.61, 0.65], "fog": [0.50, 0.52, 0.48]}
    values = {
        ("a", "mlp", "digits", seed): {
            "accuracy": 0.9,
            **{(f"corrupt:{name}:1", "accuracy"): by_seed[seed] for name, by_seed in types.items()},
        }
        for seed in range(3)
    }
    write_results(tmp_path, values)
    results = load_results(tmp_path)
    table = corruption_table(corruption_rows(results.metrics, results.trials)).loc[("a", 1)]
    per_seed = np.mean(list(types.values()), axis=0)
    mean, low, high = per_seed.mean(), *mean_interval(per_seed)[1:]
    assert table["accuracy"] == f"{mean:.3f} [{low:.3f}, {high:.3f}] n=3"
    q25, q75 = np.quantile([np.mean(v) for v in types.values()], [0.25, 0.75])
    assert table["accuracy IQR over types"] == f"[{q25:.3f}, {q75:.3f}]"


ADVERSARIAL_ROW = {"accuracy": 0.5, "epsilon": 0.1, "attack_success_rate": 0.4, "adv_auroc_mi": 0.6}


def test_the_report_names_the_datasets_no_attack_or_corruption_reached(tmp_path):
    """Issue 32: a sequence or graph dataset gets no adversarial or corruption sets (no pixels); the report says
    which datasets went unperturbed rather than leaving their absence from the robustness tables unexplained.
    A dataset with an attack row or a corruption row is not named."""
    from analysis.adversarial_robustness import robustness_skipped
    from analysis.report import write_report

    values = {
        (m, "mlp", dataset, s): {"accuracy": 0.9 - 0.01 * s, **extra}
        for m in ("a", "b")
        for s in range(2)
        for dataset, extra in (
            ("digits", {("adv:pgd_eps0.1", k): v for k, v in ADVERSARIAL_ROW.items()}),
            ("noisy", {("corrupt:gaussian_noise:3", "accuracy"): 0.7}),
            ("digits_seq", {}),
            ("csbm", {}),
        )
    }
    write_results(tmp_path, values)
    results = ursa_ray.load(tmp_path)
    assert robustness_skipped(results.metrics, results.trials) == ["csbm", "digits_seq"]
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Not attacked and not corrupted: csbm, digits_seq. Attacks and corruptions perturb pixels" in report


def sign_flip_p_value(differences) -> float:
    """Brute force: the two-sided p of the signed-rank statistic over every one of the 2ⁿ sign assignments of
    the nonzero differences (exact rationals or integers: no float ties), ranks of |d| with ties at their
    mean, P(|T⁺ − E T⁺| ≥ |t − E T⁺|)."""
    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    ranks = stats.rankdata([abs(d) for d in nonzero])
    observed = sum(r for r, d in zip(ranks, nonzero) if d > 0)
    centre = ranks.sum() / 2
    flips = [
        sum(r for r, sign in zip(ranks, signs) if sign > 0) for signs in itertools.product((1, -1), repeat=len(ranks))
    ]
    return float(np.mean(np.abs(np.array(flips) - centre) >= abs(observed - centre) - 1e-9))


@pytest.mark.parametrize("seed", range(6))
def test_signed_rank_p_equals_brute_force_over_all_sign_flips(seed):
    """Issue 44, item 1: n ≤ 10 differences with ties and zeros (small integers over 360, as accuracy steps are)
    and distinct ones: the p-value is the enumeration of all 2ⁿ sign flips, float rounding of the tied
    differences notwithstanding.  The old normal approximation without continuity correction differs."""
    rng = np.random.default_rng(seed)
    for n in range(1, 11):
        steps = rng.integers(-3, 4, size=n)
        accuracy = rng.integers(250, 350, size=n)
        tied = (accuracy / 360) - ((accuracy - steps) / 360)  # float differences of equal rationals
        assert wilcoxon_p_values(tied[:, None], np.array([1.0]))[0] == pytest.approx(
            sign_flip_p_value([Fraction(int(k), 360) for k in steps]), abs=1e-12
        ), steps
        distinct = rng.normal(size=n)
        assert wilcoxon_p_values(distinct[:, None])[0] == pytest.approx(sign_flip_p_value(distinct), abs=1e-12)
    steps = rng.integers(-2, 4, size=8).astype(float)  # and scipy's enumeration of the same flips
    exact = stats.wilcoxon(steps, method=stats.PermutationMethod(n_resamples=np.inf)).pvalue
    assert wilcoxon_p_values(steps[:, None])[0] == pytest.approx(exact, abs=1e-12)


@pytest.mark.parametrize("n", range(1, 16))
def test_the_smallest_p_with_n_pairs_is_at_least_two_over_two_to_the_n(n):
    """All differences of one sign is the most extreme outcome: p = 2/2ⁿ when they are distinct or all tied,
    2/2ⁿ⁻ᶻ (still ≥ 2/2ⁿ) with z zeros; never below, whatever the ties."""
    floor = 2 / 2**n
    distinct = np.arange(1, n + 1) / 7
    tied = np.full(n, 1 / 360)
    zeros = np.r_[np.zeros(n // 3), np.full(n - n // 3, 0.1)]
    p = wilcoxon_p_values(np.column_stack([distinct, tied, zeros, -tied]))
    assert p[0] == pytest.approx(min(1.0, floor)) and p[1] == pytest.approx(min(1.0, floor))
    assert p[2] == pytest.approx(min(1.0, 2 / 2 ** (n - n // 3))) and p[3] == p[1]
    assert (p >= floor * (1 - 1e-12)).all()


def test_four_units_one_step_apart_are_no_ordering_whatever_the_rounding():
    """The issue's case: four units all d = +1/360 give the exact p = 2/16 = 0.125 (the old normal approximation
    gave 0.0455, "significant"); accuracies whose equal differences round apart in float ([342, 340, 344, 345]
    against two fewer correct; [340, 341, 342, 343]) give the p of their exact rational differences."""
    assert wilcoxon_p_values(np.full((4, 1), 1 / 360))[0] == pytest.approx(0.125)
    for correct in ([342, 340, 344, 345], [340, 341, 342, 343], [300, 301, 302, 310]):
        correct = np.array(correct)
        differences = correct / 360 - (correct - 2) / 360
        exact = sign_flip_p_value([Fraction(2, 360)] * 4)
        assert exact == 0.125
        assert wilcoxon_p_values(differences[:, None], np.array([1.0]))[0] == pytest.approx(exact)


def test_above_the_exact_range_the_normal_approximation_is_continuity_corrected():
    d = np.random.default_rng(7).integers(-2, 5, size=EXACT_UNITS + 20).astype(float)
    expected = stats.wilcoxon(d, correction=True, method="asymptotic").pvalue
    assert wilcoxon_p_values(d[:, None])[0] == pytest.approx(expected, rel=1e-12)
    assert stats.wilcoxon(d, correction=False, method="asymptotic").pvalue != pytest.approx(expected, rel=1e-6)


def test_holm_corrects_over_every_test_of_the_report():
    """Issue 44, item 13: the report's summary lists orders from every principle, so Holm's family is every
    (principle, composite, pair) test, not one principle's; the summary says so."""
    values = simulated_values(np.random.default_rng(1), {"a": 0.0, "b": 0.02, "c": 0.0})
    pairs = paired_tests(units_frame(values))
    assert set(pairs["principle"]) == {"accuracy", "uncertainty"}
    np.testing.assert_allclose(pairs["p_holm"], holm(pairs["p_value"].to_numpy()))
    per_principle = pairs.groupby("principle")["p_value"].transform(lambda p: holm(p.to_numpy()))
    assert not np.allclose(pairs["p_holm"], per_principle)


def test_the_summary_says_holm_covers_the_whole_report(tmp_path):
    from analysis.report import write_report

    write_results(tmp_path, simulated_values(np.random.default_rng(1), {"a": 0.0, "b": 0.02, "c": 0.0}))
    write_report(tmp_path)
    summary = (tmp_path / "report.md").read_text().split("**Summary.**")[1].split("\n### ")[0]
    comparison = ursa_ray.load(tmp_path).compare()
    assert comparison.family_size == 6 + 2  # 3 pairs on each of 2 composites, one Friedman test per principle
    assert "Holm over the report's 8 tests: its pairwise Wilcoxon tests and its Friedman tests" in summary


def test_one_seed_on_each_of_four_cells_claims_no_difference_anywhere(tmp_path):
    """Issue 44, item 7, found by the independent check: four methods in one order, one seed on each of four
    cells.  The pairwise tests tie (p ≥ 0.125), and the per-principle Friedman test (p = 0.0074 raw) used to
    call ``d`` outside the best group at α, a claim outside the summary's family; both now share Holm's
    family, so the report claims no difference anywhere."""
    from analysis.report import write_report

    cells = [("mlp", "digits"), ("mlp", "wine"), ("cnn", "digits"), ("cnn", "wine")]
    values = {
        (method, model, dataset, 0): {"accuracy": 0.9 - 0.01 * k, "nll": 0.3 + 0.01 * k}
        for k, method in enumerate("abcd")
        for model, dataset in cells
    }
    write_results(tmp_path, values)
    comparison = ursa_ray.load(tmp_path).compare()
    raw = comparison.friedman.set_index("principle")["p_value"]
    assert (raw < 0.05).all()  # alone, each Friedman test rejects
    assert (comparison.friedman["p_holm"] >= 0.05).all()
    assert all(r.best_group == list(r.mean_ranks.index) for r in comparison.tests.values())
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "the methods differ" not in report and "significantly different from the best" not in report
    assert "no significant difference among the methods after Holm's correction" in report


def test_a_pair_sharing_no_unit_is_left_out_of_the_stated_family(tmp_path):
    """A pair of methods with no unit in common has no p-value; Holm leaves it out of m, and so does every
    figure the report states (the independent check found the text counting it)."""
    rng = np.random.default_rng(3)
    values = {}
    for method, cells in {"a": ["digits", "wine"], "b": ["digits"], "c": ["wine"]}.items():
        for dataset in cells:
            for seed in range(6):
                values[(method, "mlp", dataset, seed)] = {"accuracy": 0.8 + 0.01 * rng.standard_normal()}
    write_results(tmp_path, values)
    comparison = ursa_ray.load(tmp_path).compare()
    finite = int(np.isfinite(comparison.pairs["p_value"]).sum()) + int(
        np.isfinite(comparison.friedman["p_value"]).sum()
    )
    assert finite < len(comparison.pairs) + len(comparison.friedman)  # b and c share no unit
    assert comparison.family_size == finite
    assert (comparison.resolution["tests"] == finite).all()


def test_one_seed_per_cell_makes_no_significance_claim(tmp_path):
    """Issue 44, item 7: four methods in the same order on every principle, one seed of one cell.  The old
    best group ran Friedman and Nemenyi with the principles as blocks and called ``d`` significantly worse than
    ``a``; without replicated units nothing is claimed: no best group, no Friedman test (one block), every
    paired test a tie."""
    from analysis.report import write_report

    values = {
        (method, "mlp", "digits", 0): {
            "accuracy": 0.9 - 0.01 * k,
            "nll": 0.3 + 0.01 * k,
            ("noise", "ood_auroc_mi"): 0.9 - 0.01 * k,
            ("fidelity:test", "total_variation"): 0.1 + 0.01 * k,
            ("cost", "flops_per_prediction"): 1e6 * (k + 1),
        }
        for k, method in enumerate("abcd")
    }
    write_results(tmp_path, values)
    results = ursa_ray.load(tmp_path)
    assert "best_group" not in results.composites or results.composites["best_group"].astype(bool).all()
    comparison = results.compare()
    assert (comparison.pairs["better"] == "tie").all()
    assert comparison.friedman["note"].str.contains("at least 3 methods and 2 blocks").all()
    write_report(tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "No ordering survives" in report and "significantly different from the best" not in report


def unconverged_values(converged_tv: dict[str, float], unconverged_tv: dict[str, float]) -> dict:
    """Three seeds of three methods on mlp/digits (reference converged) and mlp/wine (reference not converged:
    ``converged`` 0 on every fidelity row), their test TV and agreement as given per cell, with accuracy and
    test-time cost."""
    values = {}
    for dataset, tv, converged in (("digits", converged_tv, 1.0), ("wine", unconverged_tv, 0.0)):
        for k, method in enumerate(sorted(tv)):
            for seed in range(3):
                values[(method, "mlp", dataset, seed)] = {
                    "accuracy": 0.9 - 0.01 * k + 0.001 * seed,
                    ("fidelity:test", "total_variation"): tv[method] + 0.001 * seed,
                    ("fidelity:test", "agreement"): 1 - tv[method] + 0.002 * seed,
                    ("fidelity:test", "converged"): converged,
                    ("fidelity:noise", "converged"): converged,
                    ("cost", "flops_per_prediction"): 1e6 * (k + 1),
                    ("cost", "train_s"): 10.0 * (3 - k),
                }
    return values


def test_an_unconverged_reference_changes_no_rank_test_or_front(tmp_path):
    """Issue 44, item 6: a deliberately short reference on mlp/wine (``converged`` 0) that orders the methods
    the other way round.  Every rank (``rank_fidelity``, ``mean_rank``), paired test, Friedman test and Pareto
    front equals the one without that cell's fidelity rows; the report shows the cell, marked
    "not ranked: reference not converged" in each section that ranks."""
    from analysis.composites import composite_scores
    from analysis.pareto import pareto_fronts
    from analysis.report import write_report

    tv = {"a": 0.1, "b": 0.2, "c": 0.3}
    reversed_tv = {"a": 0.6, "b": 0.4, "c": 0.05}
    write_results(tmp_path / "with", unconverged_values(tv, reversed_tv))
    without = {
        key: {
            k: v
            for k, v in row.items()
            if not (key[2] == "wine" and isinstance(k, tuple) and k[0].startswith("fidelity"))
        }
        for key, row in unconverged_values(tv, reversed_tv).items()
    }
    write_results(tmp_path / "without", without)
    loaded = {name: ursa_ray.load(tmp_path / name) for name in ("with", "without")}
    scores = {n: composite_scores(r.metrics, r.trials) for n, r in loaded.items()}
    ranked = [c for c in scores["without"].columns if c.startswith(("rank_", "fidelity_")) or c == "mean_rank"]
    pd.testing.assert_frame_equal(scores["with"][ranked], scores["without"][ranked])
    assert scores["with"]["rank_fidelity"].to_dict() == {"a": 1.0, "b": 2.0, "c": 3.0}
    comparisons = {n: r.compare() for n, r in loaded.items()}
    pd.testing.assert_frame_equal(comparisons["with"].pairs, comparisons["without"].pairs)
    pd.testing.assert_frame_equal(comparisons["with"].friedman, comparisons["without"].friedman)
    pd.testing.assert_frame_equal(pareto_fronts(scores["with"]), pareto_fronts(scores["without"]))
    write_report(tmp_path / "with")
    report = (tmp_path / "with" / "report.md").read_text()
    sections = {part.split("\n", 1)[0]: part for part in report.split("\n## ")[1:]}
    for title in (
        "Composite scores",
        "Which differences are real",
        "Fidelity to the reference posterior",
        "Quality against cost (Pareto fronts)",
        "Compute cost: hyperparameter search + inference",
    ):
        assert "not ranked: reference not converged" in sections[title], title
    assert "mlp / wine" in sections["Fidelity to the reference posterior"]  # shown
