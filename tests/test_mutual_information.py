"""Mutual information (knowledge uncertainty) is non-negative, exactly zero for a single sample, and every
classification metric is reproduced bit for bit from the saved prediction tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from ursa_ray.evaluation import ClassificationPredictive, classification_metrics, ood_metrics
from ursa_ray.evaluation.predictions import metrics_from_predictions, prediction_table


def _accumulate(logits: list[torch.Tensor]) -> ClassificationPredictive:
    pred = ClassificationPredictive(logits[0].shape[0], logits[0].shape[1])
    for sample in logits:
        pred.update(sample)
    return pred


def test_single_sample_has_exactly_zero_mutual_information_and_chance_auroc():
    torch.manual_seed(0)
    # logits of every scale, confident ones included (where rounding noise used to survive the clip)
    scale = torch.logspace(-2, 1.5, 500).unsqueeze(1)
    test = _accumulate([torch.randn(500, 10) * scale])
    ood = _accumulate([torch.randn(300, 10) * 3])
    assert np.all(test.mutual_information == 0.0) and np.all(ood.mutual_information == 0.0)
    assert np.array_equal(test.total_entropy, test.expected_entropy)
    labels = torch.randint(0, 10, (500,)).numpy()
    assert ood_metrics(test, ood)["ood_auroc_mi"] == 0.5
    assert classification_metrics(test, labels)["misclass_auroc_mi"] == 0.5


def test_mutual_information_is_non_negative_and_matches_a_float64_reference():
    torch.manual_seed(1)
    logits = [torch.randn(200, 5) * 4 for _ in range(7)]
    pred = _accumulate(logits)
    p = np.stack([torch.softmax(x.double(), -1).numpy() for x in logits])
    entropy = lambda q: -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1)), 0), axis=-1)  # noqa: E731
    reference = entropy(p.mean(0)) - entropy(p).mean(0)
    assert np.all(pred.mutual_information >= 0)
    np.testing.assert_allclose(pred.mutual_information, reference, atol=1e-12)


def test_saved_tables_reproduce_every_metric_exactly(tmp_path):
    torch.manual_seed(2)
    labels = torch.randint(0, 4, (150,)).numpy()
    for n_samples in (1, 6):
        test = _accumulate([torch.randn(150, 4) * 5 for _ in range(n_samples)])
        ood = _accumulate([torch.randn(80, 4) for _ in range(n_samples)])
        cost = np.full((4, 4), 0.1) - 0.1 * np.eye(4)
        reported = {"test": classification_metrics(test, labels, cost), "ood": ood_metrics(test, ood)}
        prediction_table(test, labels).to_parquet(tmp_path / "test.parquet")
        prediction_table(ood, None).to_parquet(tmp_path / "ood.parquet")
        tables = {name: pd.read_parquet(tmp_path / f"{name}.parquet") for name in ("test", "ood")}
        recomputed = metrics_from_predictions(tables["test"], {"ood": tables["ood"]}, cost)
        assert recomputed == reported
