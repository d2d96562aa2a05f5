"""The trial pipeline's shape (issue 28.1): data preparation, then evaluation probes that each observe every
posterior sample; a metric family is one probe and its registration."""

from __future__ import annotations

import pytest

import ursa_ray.evaluation.probes
from ursa_ray.eval_sets import UnknownEvalSet
from ursa_ray.evaluation.probes.base import Probe, ProbeContext, SetsProbe
from ursa_ray.evaluation.probes.bit_depth import BitDepthProbe
from ursa_ray.grid import parse_grid
from ursa_ray.spec import TrialSpec
from ursa_ray.trial import TrialRun, run_trial

GRID = {
    "name": "probes",
    "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}}],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": ["digits"],
    "seeds": [0],
    "budget": {"epochs": 1, "batch_size": 256},
    "save_predictions": True,
    "bit_depths": ["float16"],
    "corruptions": {"types": ["gaussian_noise"], "severities": [3], "n_examples": 30},
    "adversarial": {"attacks": ["fgsm"], "n_examples": 30, "attack_samples": 1},
}


@pytest.fixture(scope="module")
def final_spec() -> TrialSpec:
    specs = parse_grid(GRID, "probes.yaml").trial_specs()
    return next(s for s in specs if s.phase == "final")


def test_every_evaluation_set_is_observed_by_exactly_one_probe_after_the_bit_depth_probe(final_spec):
    """Each float32 set's predictive is filled by one probe (a set left out would be scored on no samples,
    one observed twice on every sample twice), and the bit-depth probe, which restores the random
    generators, observes first.  Catches a registration that drops, or repeats, a family of sets."""
    run = TrialRun(final_spec)
    observed = [name for probe in run.probes if isinstance(probe, SetsProbe) for name in probe.names]
    assert sorted(observed) == sorted(run.eval_sets)
    assert any(name.startswith("corrupt:") for name in observed) and "test" in observed
    assert isinstance(run.probes[0], BitDepthProbe)


class _CountingProbe(Probe):
    """A metric family of one metric: the number of samples it saw, with one row per sample count."""

    def __init__(self, context: ProbeContext) -> None:
        super().__init__()
        self.n = 0

    def observe(self, predictor) -> None:
        self.n += 1

    def compute(self) -> dict[str, dict[str, float]]:
        return {"test": {"samples_seen": float(self.n)}}

    def rows(self):
        import pandas as pd

        return {"counted": pd.DataFrame({"n": [self.n]})}


def test_a_new_metric_family_is_one_probe_and_its_registration(final_spec, monkeypatch):
    """A probe added to ``PROBES`` sees every posterior sample, and its metrics and rows reach the trial's
    outcome beside the built-in families', with nothing else changed.  Catches a trial that bypasses the
    registry (a family wired by hand into the trial) or drops a probe's rows."""
    registered = ursa_ray.evaluation.probes.PROBES
    monkeypatch.setattr(ursa_ray.evaluation.probes, "PROBES", (*registered, lambda context: [_CountingProbe(context)]))
    outcome = run_trial(final_spec)
    values = {(m["eval_set"], m["metric"]): m["value"] for m in outcome.metrics}
    assert values[("test", "samples_seen")] == outcome.record["n_samples"] == 1
    assert outcome.predictions["counted"]["n"].tolist() == [1]
    assert ("test", "accuracy") in values and ("test@float16", "accuracy") in values
    assert any(k[0].startswith("adv:") for k in values) and any(k[0].startswith("corrupt:") for k in values)
    assert {m["eval_kind"] for m in outcome.metrics} >= {"in_domain", "corruption", "adversarial", "bit_depth"}


class _MisnamedProbe(_CountingProbe):
    """A metric family that names its set outside the grammar of :mod:`ursa_ray.eval_sets` (an unknown
    prefix; a plain name would be read as an OOD set's)."""

    def compute(self) -> dict[str, dict[str, float]]:
        return {"shifted:test": {"samples_seen": float(self.n)}}


def test_a_probe_naming_an_unknown_set_fails_its_own_trial(final_spec, monkeypatch):
    """The worker gives every metric row its ``eval_kind``, so a probe's set name outside the grammar fails
    the trial that made it (recorded as failed, the grid goes on) with the name and the known prefixes,
    rather than reaching the driver, whose results directory would refuse the rows of a finished trial."""
    registered = ursa_ray.evaluation.probes.PROBES
    monkeypatch.setattr(ursa_ray.evaluation.probes, "PROBES", (*registered, lambda context: [_MisnamedProbe(context)]))
    with pytest.raises(UnknownEvalSet, match="shifted"):
        run_trial(final_spec)


def test_a_calibrating_trial_holds_out_its_split_and_reports_every_set_twice(final_spec):
    """``calibrate: temperature``: the trial trains on 90% of the training set, the validation split is
    observed by the calibration probe alone (never at a lower bit depth, never as an in-domain set), every
    test, OOD, corruption and attack set gets its ``@calibrated`` twin (bit depths none), T and the fit's
    seconds are in method_stats (the seconds inside eval_s), and the saved tables give the same calibrated
    metrics bit for bit.  The same entry without the key: whole training set, no twin, no T."""
    import dataclasses
    import json
    import math

    from ursa_ray.evaluation.adversarial import metrics_from_adversarial_tables
    from ursa_ray.evaluation.predictions import metrics_from_predictions
    from ursa_ray.evaluation.probes.calibration import ValidationProbe

    spec = dataclasses.replace(final_spec, calibrate="temperature")
    run = TrialRun(spec)
    assert run.problem.n_train == 1437 - 144 and TrialRun(final_spec).problem.n_train == 1437
    assert [p.names for p in run.probes if isinstance(p, ValidationProbe)] == [["validation"]]
    assert "validation" not in run.trial.full_precision_sets
    outcome = run_trial(spec)
    sets = {row["eval_set"] for row in outcome.metrics}
    raw = {s for s in sets if s != "cost" and "@" not in s}
    assert "validation" not in sets and {"test", "corrupt:gaussian_noise:3", "adv:clean"} <= raw
    assert {s for s in sets if s.endswith("@calibrated")} == {f"{s}@calibrated" for s in raw}
    stats = json.loads(outcome.record["method_stats"])
    assert 0 < stats["temperature_fit_s"] < outcome.record["eval_s"]
    values = {(r["eval_set"], r["metric"]): r["value"] for r in outcome.metrics}
    assert values["test@calibrated", "validation_temperature"] == stats["validation_temperature"]
    saved = outcome.predictions
    cost = None if run.ds.cost_matrix is None else run.ds.cost_matrix.numpy()
    again = metrics_from_predictions(saved["test"], {}, cost, saved["validation"])["test@calibrated"]
    again_attacked = metrics_from_adversarial_tables(
        {n.partition(":")[2]: t for n, t in saved.items() if n.startswith("adv:")}, stats["validation_temperature"]
    )
    for (name, metric), value in values.items():
        if name == "test@calibrated":
            assert again[metric] == value or (math.isnan(value) and math.isnan(again[metric])), metric
        if name.startswith("adv:") and name.endswith("@calibrated"):
            assert again_attacked[name[4 : -len("@calibrated")]][metric] == value, (name, metric)
    plain = run_trial(final_spec)
    assert not {r["eval_set"] for r in plain.metrics if "calibrated" in r["eval_set"]}
    assert "validation_temperature" not in json.loads(plain.record["method_stats"])
