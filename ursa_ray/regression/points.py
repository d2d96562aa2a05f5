"""Rows of ``points.parquet``: one per (trial, test point) of a regression trial.

Columns (the contract the analysis relies on): trial_id, method (the grid label), model (the model's
name), experiment (dataset name), complexity (float), repetition (int, the trial seed), point_id (int,
index into the test set), x (list of floats), in_distribution (bool), truth (noise-free G(x*)ᵀγ), mean,
std (the predictive mean and the epistemic standard deviation across posterior samples, S − 1 divisor).
The anchor's rows carry method ``"blr"`` and model ``"true_features"`` (it is linear in the true
features), whichever trial wrote them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ursa_ray.regression.anchor import anchor_for_dataset
from ursa_ray.results import POINT_COLUMNS

ANCHOR_METHOD = "blr"
ANCHOR_MODEL = "true_features"


def points_frame(
    dataset, mean, std, *, method: str, model: str, complexity: float, repetition: int, trial_id: str
) -> pd.DataFrame:
    """The rows of one trial: ``mean`` and ``std`` (length M) at ``dataset.test_x``."""
    columns = point_columns(
        dataset, mean, std, method=method, model=model, complexity=complexity, repetition=repetition, trial_id=trial_id
    )
    return pd.DataFrame(columns, columns=POINT_COLUMNS)


def points_rows(
    dataset, mean, std, *, method: str, model: str, complexity: float, repetition: int, trial_id: str
) -> list[dict[str, Any]]:
    """The rows of :func:`points_frame` as one dict of Python values per test point (what a trial returns),
    built from the columns without a DataFrame: a batched trial builds them for each of its seeds."""
    columns = point_columns(
        dataset, mean, std, method=method, model=model, complexity=complexity, repetition=repetition, trial_id=trial_id
    )
    n = len(columns["point_id"])
    values = []
    for name in POINT_COLUMNS:  # arrays as lists of Python values, scalars repeated
        value = columns[name].tolist() if isinstance(columns[name], np.ndarray) else columns[name]
        values.append(value if isinstance(value, list) else [value] * n)
    return [dict(zip(POINT_COLUMNS, row)) for row in zip(*values)]


def point_columns(
    dataset, mean, std, *, method: str, model: str, complexity: float, repetition: int, trial_id: str
) -> dict[str, Any]:
    """The columns of one trial's rows, in ``POINT_COLUMNS`` order: numpy arrays, the list ``x`` and scalars."""
    mean = np.asarray(mean, dtype=np.float64).reshape(-1)
    std = np.asarray(std, dtype=np.float64).reshape(-1)
    x = dataset.test_x.detach().cpu().double().reshape(len(dataset.test_x), -1).numpy()
    if mean.shape[0] != x.shape[0] or std.shape[0] != x.shape[0]:
        raise ValueError(f"{x.shape[0]} test points but mean/std of length {mean.shape[0]}/{std.shape[0]}")
    inside = dataset.test_info.get("in_distribution")
    inside = np.ones(len(x), bool) if inside is None else inside.detach().cpu().numpy().astype(bool)
    return {
        "trial_id": trial_id,
        "method": method,
        "model": model,
        "experiment": dataset.name,
        "complexity": float(complexity),
        "repetition": int(repetition),
        "point_id": np.arange(len(x), dtype=np.int64),
        "x": [row.tolist() for row in x],
        "in_distribution": inside,
        "truth": dataset.test_y.detach().cpu().double().reshape(-1).numpy(),
        "mean": mean,
        "std": std,
    }


def anchor_points(dataset, *, complexity: float, repetition: int, trial_id: str) -> pd.DataFrame:
    """The anchor's (``blr``) rows for one repetition of one (experiment, complexity)."""
    mean, std = anchor_for_dataset(dataset)
    return points_frame(
        dataset,
        mean,
        std,
        method=ANCHOR_METHOD,
        model=ANCHOR_MODEL,
        complexity=complexity,
        repetition=repetition,
        trial_id=trial_id,
    )
