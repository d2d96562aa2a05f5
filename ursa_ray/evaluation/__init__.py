"""Evaluation of posterior predictives: online accumulators and URSABench's metrics."""

from ursa_ray.evaluation.metrics import (
    accuracy,
    brier,
    classification_metrics,
    decision_cost,
    expected_calibration_error,
    misclassification_detection,
    nll,
    ood_detection,
    ood_metrics,
    regression_metrics,
)
from ursa_ray.evaluation.predictive import ClassificationPredictive, RegressionPredictive

__all__ = [
    "ClassificationPredictive",
    "RegressionPredictive",
    "accuracy",
    "brier",
    "classification_metrics",
    "decision_cost",
    "expected_calibration_error",
    "misclassification_detection",
    "nll",
    "ood_detection",
    "ood_metrics",
    "regression_metrics",
]
