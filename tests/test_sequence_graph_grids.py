"""Every built-in method on ``lstm``, ``gru`` and ``gcn`` end to end: a tiny grid's trials through
:func:`ursa_ray.trial.run_trials_batched` (the path a Ray trial takes), on tiny instances of the embedded
sequence and graph data; and the shipped grids validate."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from ursa_ray import data, methods
from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.grid import load_grid, parse_grid
from ursa_ray.trial import run_trials_batched

GRIDS = Path(__file__).resolve().parent.parent / "grids"


def _tiny_sequences(options: Mapping[str, Any], ood: tuple[str, ...], root: Path, download: bool, seed: int) -> Dataset:
    """digits_seq cut to 96 training and 40 test sequences (OOD sets cut alike)."""
    spec = data.get_dataset("digits_seq")
    ds = spec.load({}, tuple(o.replace("tiny_seq", "digits_seq") for o in ood), root, download, seed)
    ds.train_x, ds.train_y, ds.test_x, ds.test_y = ds.train_x[:96], ds.train_y[:96], ds.test_x[:40], ds.test_y[:40]
    ds.ood = {o: ds.ood[o.replace("tiny_seq", "digits_seq")][:40] for o in ood}
    return ds


TINY_SEQUENCES = DatasetSpec(
    name="tiny_seq",
    task="classification",
    description="digits_seq, 96 / 40",
    load=_tiny_sequences,
    ood_sets=("tiny_seq_reversed", "tiny_seq_doubled"),
    images=False,
)
TINY_GRAPH = {"n_nodes": 160, "n_classes": 3, "n_features": 8, "p_in": 0.1, "p_out": 0.01}

TINY = {  # per method: the few settings that make one trial take about a second
    "sgld": {"burn_in_epochs": 1},
    "sghmc": {"burn_in_epochs": 1},
    "csgld": {"n_cycles": 1, "epochs_per_cycle": 4, "samples_per_cycle": 2, "exploration": 0.5},
    "csghmc": {"n_cycles": 1, "epochs_per_cycle": 4, "samples_per_cycle": 2, "exploration": 0.5},
    "hmc": {"burn_in": 2, "n_leapfrog": 2},
    "swa": {"swa_epochs": 1},
    "swag": {"swa_epochs": 2, "rank": 2},
    "pca_ess": {"swa_epochs": 3, "rank": 2},
    "laplace": {"marglik_steps": 2},
    "bdk": {"burn_in_epochs": 1},
    "gped": {"burn_in_epochs": 1},
}
CASES = {
    "lstm": ("tests.test_sequence_graph_grids:TINY_SEQUENCES", ["tiny_seq_reversed", "tiny_seq_doubled"], {}),
    "gru": (
        "tests.test_sequence_graph_grids:TINY_SEQUENCES",
        ["tiny_seq_reversed"],
        {"bidirectional": True, "pooling": "mean"},
    ),
    "gcn": ("csbm", ["left_out_classes", "perturbed_features"], {"dropout": 0.1}),
}


def tiny_grid(method: str, model: str) -> Any:
    dataset, ood, options = CASES[model]
    declared = {h.name for h in methods.get_method(method).hyperparameters}
    settings = {k: v for k, v in TINY.get(method, {}).items() if k in declared}
    entry = {"name": dataset, "ood": ood} | ({"options": TINY_GRAPH} if dataset == "csbm" else {})
    return parse_grid(
        {
            "name": "tiny",
            "methods": [{"name": method, "hyperparameters": settings}],
            "models": [{"name": model, "options": ({"hidden": 6} if model != "gcn" else {"hidden": 8}) | options}],
            "datasets": [entry],
            "seeds": 2,
            "budget": {"epochs": 2, "batch_size": 32, "n_samples": 2},
            "bit_depths": ["int8"],
        },
        "tiny.yaml",
    )


@pytest.mark.parametrize("model", list(CASES))
@pytest.mark.parametrize("method", sorted(methods.catalogue().built_ins))
def test_every_method_runs_end_to_end(method, model, stream_calls):
    grid = tiny_grid(method, model)
    specs = grid.trial_specs()
    outcomes = run_trials_batched(specs, torch.device("cpu"))
    assert len(outcomes) == 2
    for outcome in outcomes:
        values = {(r["eval_set"], r["metric"]): r["value"] for r in outcome.metrics}
        sets = {r["eval_set"] for r in outcome.metrics}
        assert 0.0 <= values["test", "accuracy"] <= 1.0 and math.isfinite(values["test", "nll"])
        for name in CASES[model][1]:
            assert math.isfinite(values[name, "ood_auroc_entropy"]) and f"{name}@int8" in sets
        assert not any(s.startswith(("adv:", "corrupt:", "transfer:")) for s in sets)  # no pixels: skipped
        assert values["cost", "n_params"] > 0 and values["cost", "forward_flops"] > 0
    # seeds of a Linear-only RNN train as one batched computation; the GCN's graph buffers run one a trial
    if methods.get_method(method).batchable and model != "gcn":
        assert all(together for _, together in stream_calls) and sum(n for n, _ in stream_calls) == 2
    else:
        assert stream_calls == [(1, False)] * 2


def test_gcn_is_never_grouped_and_rnns_are():
    grid = tiny_grid("sgd", "gcn")
    assert grid.vectorized_seeds(grid.methods[0], "gcn") == 1
    grid = tiny_grid("sgd", "lstm")
    assert grid.vectorized_seeds(grid.methods[0], "lstm") > 1


@pytest.mark.parametrize("name", ["sequence.yaml", "graph.yaml"])
def test_shipped_grids_validate_with_every_method(name):
    grid = load_grid(GRIDS / name)
    assert {m.name for m in grid.methods} >= set(methods.catalogue().built_ins)
    assert all(not data.get_dataset(d.name).images for d in grid.datasets)


def test_full_network_laplace_with_per_example_jacobians_is_refused_on_gcn():
    """laplace-torch's diagonal and full curvature of every weight cannot differentiate the GCN's sparse
    propagation (the trial failed with "expand is unsupported for Sparse tensors" after training): the grid is
    refused in one line naming the method entry, the model and what works; KFAC and the last layer run, and
    the MLP takes every structure.  Searched structures are checked at every choice."""
    from ursa_ray.grid import GridError

    def grid(hyperparameters: dict, models: list, search: dict | None = None) -> dict:
        entry = {"name": "laplace", "hyperparameters": hyperparameters, **({"search": search} if search else {})}
        phase = {"search": {"algorithm": "random", "n_trials": 2, "metric": "val_nll"}} if search else {}
        return {"name": "g", "methods": [entry], "models": models, "datasets": ["csbm"], "seeds": 1, **phase}

    for structure in ("diag", "full"):
        with pytest.raises(GridError) as info:
            parse_grid(grid({"subset_of_weights": "all", "hessian_structure": structure}, ["gcn"]), "g.yaml")
        assert str(info.value).startswith(
            f"g.yaml: methods[0]: subset_of_weights=all with hessian_structure={structure} cannot differentiate "
            "gcn's sparse propagation; use hessian_structure=kron or subset_of_weights=last_layer"
        ), str(info.value)
        parse_grid(grid({"subset_of_weights": "all", "hessian_structure": structure}, ["mlp"]), "g.yaml")
    parse_grid(grid({"subset_of_weights": "all", "hessian_structure": "kron"}, ["gcn"]), "g.yaml")
    parse_grid(grid({"subset_of_weights": "last_layer", "hessian_structure": "full"}, ["gcn"]), "g.yaml")
    searched = {"hessian_structure": {"type": "choice", "values": ["kron", "diag"]}}
    with pytest.raises(GridError, match=r"hessian_structure=diag \(one of its search choices\)"):
        parse_grid(grid({"subset_of_weights": "all"}, ["gcn"], searched), "g.yaml")
