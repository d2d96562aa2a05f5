"""Mixed-precision evaluation (bfloat16 body, float32 output layer; used on GPUs for classification) stays
within the documented tolerance of float32.

The same autocast runs on the CPU here.  Tolerances, as README states: mutual-information AUROCs within
0.002; accuracy, entropy AUROCs, ECE and Brier within 0.01; NLL within 2% relative."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ursa_ray.data import get_dataset
from ursa_ray.evaluation import ClassificationPredictive, classification_metrics, ood_metrics
from ursa_ray.evaluation.precision import Float32Linear, evaluation_precision, keep_output_layer_float32
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Categorical, Problem, resolve_config
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import predict


def test_precision_policy():
    assert evaluation_precision(torch.device("cuda", 0), "classification") is torch.bfloat16
    assert evaluation_precision(torch.device("cuda", 0), "regression") is None
    assert evaluation_precision(torch.device("cpu"), "classification") is None


def test_output_layer_computes_float32_under_autocast():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 10))
    with torch.no_grad():
        model[0].weight.mul_(40.0)  # logits of order 10-30, where bfloat16's spacing is 0.06-0.125
    x = torch.randn(256, 64)
    full = predict(model, x)
    assert (predict(model, x, torch.bfloat16) - full).abs().max() > 1e-3  # plain autocast rounds the logits
    keep_output_layer_float32(model, 10)
    assert type(model[0]) is Float32Linear and isinstance(model[0], nn.Linear)
    assert torch.equal(predict(model, x, torch.bfloat16), full)
    assert list(model.state_dict()) == ["0.weight", "0.bias"]


def test_only_the_output_layer_is_kept_float32():
    model = keep_output_layer_float32(build_mlp((1, 8, 8), 10, [200, 200]), 10)
    kinds = [type(m) for m in model.modules() if isinstance(m, nn.Linear)]
    assert kinds == [nn.Linear, nn.Linear, Float32Linear]


def test_mixed_precision_evaluation_matches_float32_within_tolerance():
    torch.manual_seed(0)
    ds = get_dataset("digits").load({}, ("noise", "digits_rotated"), None, False, 0)
    problem = Problem(
        ds.train_x,
        ds.train_y,
        Categorical(),
        lambda: keep_output_layer_float32(build_mlp((1, 8, 8), 10, [200, 200]), 10),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    method = get_method("mc_dropout")
    config = resolve_config(method, {"epochs": 10, "n_samples": 10, "batch_size": 64})
    sets = [("test", ds.test_x), *ds.ood.items()]
    full = {k: ClassificationPredictive(len(x), 10) for k, x in sets}
    half = {k: ClassificationPredictive(len(x), 10) for k, x in sets}
    for predictor in method.sample_posterior(problem, config, {}):
        for name, x in sets:
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
    assert b["misclass_auroc_mi"] == pytest.approx(a["misclass_auroc_mi"], abs=0.002)
    for ood in ds.ood:
        oa, ob = ood_metrics(full["test"], full[ood]), ood_metrics(half["test"], half[ood])
        assert ob["ood_auroc_entropy"] == pytest.approx(oa["ood_auroc_entropy"], abs=0.01)
        assert ob["ood_auroc_mi"] == pytest.approx(oa["ood_auroc_mi"], abs=0.002)
    # the two evaluations really differ (bfloat16 was in effect), just not beyond the tolerance
    assert abs(b["nll"] - a["nll"]) > 0
