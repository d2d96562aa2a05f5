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
