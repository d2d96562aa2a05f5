"""The HMC reference of a cell (ursa_ray.reference) against an exact posterior, its checks and its store.

The cell: ``true_features`` (f(x) = wᵀG(x)) on E.2 with d = 1 and a Gaussian likelihood of known σ, with a
prior so wide (std 10³) that the posterior is the anchor's flat-prior Bayesian linear regression, exact in
closed form (:func:`ursa_ray.regression.anchor_for_dataset`), as in test_regression_hmc.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from ursa_ray.evaluation import fidelity
from ursa_ray.grid import parse_grid
from ursa_ray.reference import Reference, reference_spec
from ursa_ray.regression import anchor_for_dataset
from ursa_ray.results import Location
from ursa_ray.trial import TrialRun, compute_reference, stored_or_computed

pytestmark = pytest.mark.slow  # HMC chains and a Ray run: not in the fast tier (-m "not slow")

EXACT = {
    "chains": 4,
    "n_samples": 750,
    "burn_in": 200,
    "prior_std": 1e3,
    "n_leapfrog": 6,
    "step_size": 1e-3,
    "step_jitter": 0.9,
}


def blr_spec() -> dict:
    grid = parse_grid(
        {
            "name": "ref",
            "methods": ["sgd"],
            "models": ["true_features"],
            "datasets": [{"name": "e2", "complexity": [1]}],
            "seeds": 1,
        }
    )
    return grid.spec_for(grid.cells()[0], 0, "final", {})


@pytest.fixture(scope="module")
def exact_reference() -> tuple[Reference, np.ndarray, np.ndarray]:
    spec = blr_spec()
    reference = compute_reference(spec, EXACT)
    ds = TrialRun(reference_spec(spec, EXACT)).ds
    mean, std = anchor_for_dataset(ds)
    return reference, mean, std


def test_the_hmc_reference_matches_the_exact_posterior_within_monte_carlo_error(exact_reference):
    reference, exact_mean, exact_std = exact_reference
    pooled = reference.pooled["test"]
    assert reference.chains["test"].shape == (4, len(exact_mean), 2)
    assert reference.cost["n_samples"] == 4 * 750
    # 5 % as in test_regression_hmc (3,000 draws; the MC error of a std from ~1,000 effective draws is ~2 %)
    std_error = np.abs(pooled[:, 1] / exact_std - 1)
    mean_error = np.abs(pooled[:, 0] - exact_mean) / np.maximum(np.abs(exact_mean), exact_std)
    assert std_error.max() < 0.05, std_error.max()
    assert mean_error.max() < 0.05, mean_error.max()
    # its distance to the exact posterior is at the level of its own noise floor (halves of its chains, whose
    # difference has about twice the variance of the pooled error)
    w2 = fidelity.regression_fidelity(exact_mean, exact_std, pooled[:, 0], pooled[:, 1])["w2"]
    floor = reference.noise_floor["test"]["w2"]
    assert 0 < floor and w2 < 2 * floor, (w2, floor)
    assert reference.convergence.converged, reference.convergence
    assert reference.convergence.rhat_max < 1.05


def test_a_method_equal_to_the_exact_posterior_scores_zero_and_a_shifted_one_its_shift(exact_reference):
    reference, _, _ = exact_reference
    ref = reference.pooled["test"]

    class Same:
        mean, std = ref[:, 0], ref[:, 1]

    class Shifted:
        mean, std = ref[:, 0] + 0.3, ref[:, 1]

    assert reference.metrics("test", Same)["w2"] == 0.0
    scored = reference.metrics("test", Shifted)
    assert scored["w2"] == pytest.approx(0.3)
    assert scored["converged"] == 1.0 and scored["noise_w2"] == reference.noise_floor["test"]["w2"]


def test_a_reference_whose_chains_have_not_moved_is_not_converged():
    stuck = {
        "chains": 4,
        "n_samples": 20,
        "burn_in": 0,
        "prior_std": 1e3,
        "step_size": 1e-9,
        "adapt_step_size": False,
        "step_jitter": 0.0,
        "n_leapfrog": 1,
    }
    reference = compute_reference(blr_spec(), stuck)
    assert not reference.convergence.converged
    assert reference.convergence.rhat_max > 1.1
    assert (
        reference.metrics(
            "test", type("M", (), {"mean": reference.pooled["test"][:, 0], "std": reference.pooled["test"][:, 1]})
        )["converged"]
        == 0.0
    )


def test_the_store_reuses_a_reference_and_a_changed_prior_recomputes_it(tmp_path):
    short = {"chains": 2, "n_samples": 30, "burn_in": 20, "prior_std": 1e3, "n_leapfrog": 6, "step_size": 1e-3}
    store = Location.parse(tmp_path / "references")
    first, computed = stored_or_computed(blr_spec(), short, store)
    assert computed and (tmp_path / "references" / f"{first.fingerprint}.parquet").is_file()
    again, computed = stored_or_computed(blr_spec(), short, store)
    assert not computed and again.fingerprint == first.fingerprint
    for name in first.pooled:
        np.testing.assert_array_equal(again.pooled[name], first.pooled[name])
        np.testing.assert_array_equal(again.chains[name], first.chains[name])
    assert again.noise_floor == first.noise_floor and again.convergence == first.convergence
    other, computed = stored_or_computed(blr_spec(), {**short, "prior_std": 10.0}, store)
    assert computed and other.fingerprint != first.fingerprint
    assert len(list((tmp_path / "references").glob("*.parquet"))) == 2


GRID = {"name": "ref", "methods": ["sgd"], "models": ["mlp"], "datasets": [{"name": "digits"}], "seeds": 1}


@pytest.mark.parametrize(
    ("block", "message"),
    [
        ({"chain": 2}, "reference.chain: unknown option; allowed: method, chains"),
        ({"method": "sgld"}, "reference.method: expected one of ['hmc']"),
        ({"chains": 1}, "reference.chains: expected a value >= 2"),
        ({"prior_std": float("nan")}, "reference.prior_std:"),
        ([4], "reference[0]: expected a mapping"),
        (4, "reference: expected a mapping"),
    ],
)
def test_a_bad_reference_block_is_one_line_naming_the_field(tmp_path, capsys, block, message):
    import yaml

    from ursa_ray.cli import main

    grid = tmp_path / "bad.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "reference": block}))
    assert main(["validate", str(grid)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{grid}: {message}" in err, err


def test_a_reference_too_large_for_full_batch_is_refused_with_the_estimate_and_the_limit(tmp_path, capsys):
    import yaml

    from ursa_ray.cli import main

    grid = tmp_path / "big.yaml"
    wide = {**GRID, "models": [{"name": "mlp", "options": {"widths": [4000, 4000]}}], "reference": {"chains": 4}}
    grid.write_text(yaml.safe_dump(wide))
    assert main(["run", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "reference: full-batch HMC on mlp/digits needs at least" in err and "the limit is 512 MiB" in err, err
    assert not (tmp_path / "out").exists()


def test_final_specs_of_classification_cells_carry_the_reference_settings():
    from ursa_ray.reference import hmc_config

    grid = parse_grid({**GRID, "reference": {"chains": 2, "n_samples": 10, "prior_std": 0.5}})
    spec = grid.spec_for(grid.cells()[0], 0, "final", {})
    assert spec.reference == {"chains": 2, "n_samples": 10, "prior_std": 0.5}
    assert grid.spec_for(grid.cells()[0], 0, "search", {}).reference is None
    assert parse_grid(GRID).spec_for(parse_grid(GRID).cells()[0], 0, "final", {}).reference is None
    config = hmc_config(spec.reference)
    assert (config["n_chains"], config["n_samples"], config["prior_std"], config["burn_in"]) == (2, 10, 0.5, 200)


def test_a_run_computes_each_cells_reference_first_and_scores_every_final_trial_on_it(ray_session, tmp_path):
    import pandas as pd

    import ursa_ray

    grid = {
        "name": "ref_e2e",
        "methods": ["sgd"],
        "models": [{"name": "mlp", "options": {"widths": [16]}}],
        "datasets": [{"name": "digits", "ood": ["digits_inverted"]}],
        "seeds": 1,
        "budget": {"epochs": 2},
        "bit_depths": [],
        "corruptions": {"types": []},
        "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "attack_samples": 1, "transfer": False},
        "reference": {"chains": 2, "n_samples": 20, "burn_in": 10, "prior_std": 0.5, "n_leapfrog": 5},
    }
    out = tmp_path / "out"
    summary = ursa_ray.run(grid, out=out, echo=lambda line: None)
    assert not summary.failed, summary.failed
    trials = pd.read_parquet(out / "trials.parquet")
    ref = trials[trials.phase == "reference"]
    assert len(ref) == 1 and ref.status.iloc[0] == "ok" and ref.train_s.iloc[0] > 0
    sgd = trials[trials.phase == "final"]
    assert ref.finished_at.iloc[0] <= sgd.started_at.iloc[0] + 1e-6  # the reference first, its dependants after
    assert len(list((out / "references").glob("*.parquet"))) == 1
    metrics = pd.read_parquet(out / "metrics.parquet")
    scored = metrics[(metrics.phase == "final") & metrics.eval_set.str.startswith("fidelity:")]
    assert set(scored.eval_set) == {"fidelity:test", "fidelity:digits_inverted"}
    table = scored[scored.eval_set == "fidelity:test"].set_index("metric").value
    assert 0 <= table["agreement"] <= 1 and 0 <= table["total_variation"] <= 1 and table["kl"] >= 0
    assert {"noise_total_variation", "rhat_max", "ess_bulk_min", "converged"} <= set(table.index)
    # 20 draws a chain cannot pass ESS >= 100: flagged, not silently used
    assert table["converged"] == 0.0
    from analysis.report import write_report

    write_report(out)
    report = (out / "report.md").read_text()
    section = report.split("## Fidelity to the reference posterior")[1]
    assert "### mlp / digits" in section and "**Warning: the reference did not pass" in section
    assert "noise floor TV" in section and "ref R̂ max" in section and "| sgd |" in section
    assert "![fidelity_cost](figures/fidelity_cost.png)" in section and (out / "figures" / "fidelity_cost.png").exists()
    assert "rank_fidelity" in report.split("## Composite scores")[1].split("\n## ")[0]
