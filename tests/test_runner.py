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
