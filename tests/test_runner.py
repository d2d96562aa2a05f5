"""Driver pieces that need no Ray cluster."""

from __future__ import annotations

from ray.tune.search import Searcher

from ursa_ray.grid import parse_grid
from ursa_ray.tune.runner import SpecQueue


def test_spec_queue_hands_out_every_trial_once_in_order_without_copies():
    grid = parse_grid(
        {
            "name": "big",
            "methods": ["sgd", "mc_dropout"],
            "models": ["mlp"],
            "datasets": [{"name": "e1", "complexity": [1, 2, 3, 4, 5]}],
            "seeds": 500,
        },
        "big.yaml",
    )
    specs = grid.trial_specs()
    assert len(specs) == 5000
    queue = SpecQueue(specs)
    handed = [queue.suggest(f"t{i}") for i in range(len(specs))]
    assert [h["spec"]["trial_id"] for h in handed] == [s["trial_id"] for s in specs]
    assert queue.suggest("extra") == Searcher.FINISHED
    # the queue hands out the caller's spec objects: nothing is copied per trial (a grid_search over the
    # specs deep-copies all of them for every trial it generates, quadratic in the grid's size)
    assert all(h["spec"] is s for h, s in zip(handed, specs, strict=True))


def _point_rows(trial_id: str, method: str, n: int, shift: float = 0.0) -> list[dict]:
    return [
        {"trial_id": trial_id, "method": method, "experiment": "e1", "complexity": 1.0, "repetition": 0,
         "point_id": i, "x": [float(i)], "in_distribution": True, "truth": 0.0, "mean": i + shift, "std": 1.0}
        for i in range(n)
    ]


def test_points_are_written_per_trial_and_read_back_as_one_table(tmp_path):
    from analysis.tables import load_results
    from ursa_ray.results import ResultsDirectory

    results = ResultsDirectory(tmp_path)
    anchor = _point_rows("blr-e1-c1-s0", "blr", 3)
    results.add({"trial_id": "a", "status": "ok"}, points=_point_rows("a", "bd", 3) + anchor)
    results.add({"trial_id": "b", "status": "ok"}, points=_point_rows("b", "cd", 3) + anchor)
    results.add({"trial_id": "a", "status": "ok"}, points=_point_rows("a", "bd", 3, shift=10.0) + anchor)  # rerun
    assert sorted(p.name for p in (tmp_path / "points.parquet").iterdir()) == [
        "a.parquet", "b.parquet", "blr-e1-c1-s0.parquet"
    ]
    points = load_results(tmp_path).points
    assert sorted(points.groupby("trial_id").size().items()) == [("a", 3), ("b", 3), ("blr-e1-c1-s0", 3)]
    assert sorted(points.loc[points["trial_id"] == "a", "mean"]) == [10.0, 11.0, 12.0]  # replaced, not duplicated
    assert list(load_results(tmp_path).trials["trial_id"]) == ["b", "a"]
