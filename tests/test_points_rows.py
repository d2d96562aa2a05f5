"""A regression trial's per-test-point rows, built column-wise (``regression.points.points_rows``, used by
``trial._points``), are exactly the rows of the DataFrame path they replace: ``points_frame`` and
``anchor_points`` concatenated and converted with ``to_dict("records")`` -- the same keys in
``POINT_COLUMNS`` order, the same values and the same Python types (what lands in points.parquet)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from spec_fixtures import hand_spec

from ursa_ray.data.synthetic_regression import make_dataset
from ursa_ray.regression.points import anchor_points, points_frame
from ursa_ray.results import POINT_COLUMNS
from ursa_ray.trial import _anchor, _anchor_fidelity, _points


class _Predictive:
    def __init__(self, mean: np.ndarray, std: np.ndarray) -> None:
        self.mean, self.std = mean, std


@pytest.mark.parametrize("experiment, complexity", [("e1", 2.0), ("e2", 3.0)])
def test_points_rows_equal_the_dataframe_records(experiment: str, complexity: float) -> None:
    ds = make_dataset(experiment, complexity, 3)
    rng = np.random.default_rng(0)
    pred = _Predictive(rng.normal(size=len(ds.test_y)), rng.uniform(0.1, 1.0, size=len(ds.test_y)))
    spec = hand_spec(label="bd", model="mlp", dataset=experiment, complexity=complexity, seed=3, trial_id="t")
    where = {"complexity": complexity, "repetition": 3}
    anchor_id = f"blr-{experiment}-c{complexity:g}-s3"
    expected = pd.concat(
        [
            points_frame(ds, pred.mean, pred.std, method="bd", model="mlp", trial_id="t", **where),
            anchor_points(ds, trial_id=anchor_id, **where),
        ],
        ignore_index=True,
    ).to_dict("records")
    rows = _points(spec, ds, pred, _anchor(ds))
    assert rows == expected
    assert all(list(row) == list(POINT_COLUMNS) for row in rows)
    for got, want in zip(rows, expected, strict=True):
        assert {k: type(v) for k, v in got.items()} == {k: type(v) for k, v in want.items()}
    assert {row["method"] for row in rows} == {"bd", "blr"}
    if "in_distribution" in ds.test_info:  # E.2's out-of-distribution test points keep their flag
        assert not all(row["in_distribution"] for row in rows)


def test_a_regression_trial_is_scored_against_the_anchor_in_and_out_of_distribution() -> None:
    """Issue 29, regression: the exact anchor is the cell's reference; a trial's ``fidelity:test`` rows hold W₂
    between its Gaussian predictive of the noise-free output and the anchor's, over every test point and over
    those inside and outside the training region, equal to the closed form at each point (checked by hand
    against the points' own means and stds); the anchor scores 0 against itself."""
    ds = make_dataset("e2", 3.0, 1)
    anchor = _anchor(ds)
    rng = np.random.default_rng(1)
    pred = _Predictive(
        anchor[0] + rng.normal(0, 0.1, len(ds.test_y)), anchor[1] * rng.uniform(0.5, 2.0, len(ds.test_y))
    )
    scores = _anchor_fidelity(ds, pred, anchor)
    w2 = np.sqrt((pred.mean - anchor[0]) ** 2 + (pred.std - anchor[1]) ** 2)
    inside = ds.test_info["in_distribution"].numpy()
    assert inside.any() and (~inside).any()
    assert scores == pytest.approx(
        {"w2": w2.mean(), "w2_in_distribution": w2[inside].mean(), "w2_out_of_distribution": w2[~inside].mean()}
    )
    assert _anchor_fidelity(ds, _Predictive(*anchor), anchor) == {
        "w2": 0.0, "w2_in_distribution": 0.0, "w2_out_of_distribution": 0.0
    }  # fmt: skip
