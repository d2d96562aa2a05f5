"""bfloat16 evaluation (used on GPUs for classification) stays within the documented tolerance of float32.

The same autocast runs on the CPU here; the tolerance is the one README states: accuracy and AUROCs within
0.01, NLL within 2% relative, ECE and Brier within 0.01."""

from __future__ import annotations

import pytest
import torch

from ursa_ray.data import get_dataset
from ursa_ray.evaluation import ClassificationPredictive, classification_metrics, ood_metrics
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Categorical, Problem, resolve_config
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import evaluation_precision, predict


def test_precision_policy():
    assert evaluation_precision(torch.device("cuda", 0), "classification") is torch.bfloat16
    assert evaluation_precision(torch.device("cuda", 0), "regression") is None
    assert evaluation_precision(torch.device("cpu"), "classification") is None


def test_bfloat16_evaluation_matches_float32_within_tolerance():
    torch.manual_seed(0)
    ds = get_dataset("digits").load({}, ("noise",), None, False, 0)
    problem = Problem(ds.train_x, ds.train_y, Categorical(), lambda: build_mlp((1, 8, 8), 10, [200, 200]),
                      torch.Generator().manual_seed(0), torch.device("cpu"))
    method = get_method("mc_dropout")
    config = resolve_config(method, {"epochs": 10, "n_samples": 10, "batch_size": 64})
    full = {k: ClassificationPredictive(len(x), 10) for k, x in (("test", ds.test_x), ("noise", ds.ood["noise"]))}
    half = {k: ClassificationPredictive(len(x), 10) for k, x in (("test", ds.test_x), ("noise", ds.ood["noise"]))}
    for predictor in method.sample_posterior(problem, config, {}):
        for name, x in (("test", ds.test_x), ("noise", ds.ood["noise"])):
            state = torch.get_rng_state()
            full[name].update(predict(predictor, x))
            torch.set_rng_state(state)  # the same dropout masks for both precisions
            low = predict(predictor, x, torch.bfloat16)
            assert low.dtype == torch.float32
            half[name].update(low)
    a = classification_metrics(full["test"], ds.test_y.numpy(), ds.cost_matrix.numpy())
    b = classification_metrics(half["test"], ds.test_y.numpy(), ds.cost_matrix.numpy())
    assert b["accuracy"] == pytest.approx(a["accuracy"], abs=0.01)
    assert b["nll"] == pytest.approx(a["nll"], rel=0.02)
    assert b["ece"] == pytest.approx(a["ece"], abs=0.01)
    assert b["brier"] == pytest.approx(a["brier"], abs=0.01)
    assert b["misclass_auroc_entropy"] == pytest.approx(a["misclass_auroc_entropy"], abs=0.01)
    oa, ob = ood_metrics(full["test"], full["noise"]), ood_metrics(half["test"], half["noise"])
    assert ob["ood_auroc_entropy"] == pytest.approx(oa["ood_auroc_entropy"], abs=0.01)
    assert ob["ood_auroc_mi"] == pytest.approx(oa["ood_auroc_mi"], abs=0.01)
    # the two evaluations really differ (bfloat16 was in effect), just not beyond the tolerance
    assert abs(b["nll"] - a["nll"]) > 0
