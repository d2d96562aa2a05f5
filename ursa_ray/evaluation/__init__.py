"""Evaluation of posterior predictives: online accumulators and URSABench's metrics.

The accumulators (:mod:`ursa_ray.evaluation.predictive`) need torch and are imported on first use, so that
the metrics and saved-prediction tables, which the report (``analysis/``) reads, do not import torch."""

from ursa_ray.evaluation.metrics import (
    accuracy,
    adaptive_calibration_error,
    aurc,
    brier,
    calibrated_nll,
    classification_metrics,
    crps_gaussian,
    decision_cost,
    expected_calibration_error,
    fpr_at_95_tpr,
    gaussian_forecast_metrics,
    interval_score,
    miscalibration_area,
    misclassification_detection,
    nll,
    ood_detection,
    ood_metrics,
    regression_metrics,
    risk_coverage_curve,
    selective_prediction,
)

__all__ = [
    "ClassificationPredictive",
    "RegressionPredictive",
    "accuracy",
    "adaptive_calibration_error",
    "aurc",
    "calibrated_nll",
    "crps_gaussian",
    "fpr_at_95_tpr",
    "gaussian_forecast_metrics",
    "interval_score",
    "miscalibration_area",
    "risk_coverage_curve",
    "selective_prediction",
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


def __getattr__(name: str) -> object:
    """``ClassificationPredictive`` and ``RegressionPredictive`` from :mod:`~ursa_ray.evaluation.predictive`,
    imported when first asked for (PEP 562)."""
    if name in ("ClassificationPredictive", "RegressionPredictive"):
        from ursa_ray.evaluation import predictive

        return getattr(predictive, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
