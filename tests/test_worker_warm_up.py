"""A method's measured cost does not depend on whether it ran first in a fresh worker process.

Each order runs in a fresh Python process that warms up (:func:`ursa_ray.trial.warm_up_worker`, as every
Ray worker does before its first trial and before its first trial of each method) and then runs the same two trials; each trial's CPU time (``cpu_s``: process CPU seconds, which other load on the
machine does not inflate as it does wall time) must agree across the two orders within noise (a factor
of 2 plus 0.15 s).  Without the warm-up, the first trial in a process pays torch's first calls: about
1.3 s against 0.3 s for SGD here."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from ursa_ray import methods, trial

SCRIPT = """
import json, sys, time, torch
from ursa_ray.grid import parse_grid
from ursa_ray.trial import pick_device, run_trial, warm_up_worker
grid = {"name": "order", "models": [{"name": "mlp", "options": {"widths": [200, 200]}}], "datasets": ["digits"],
        "seeds": [0], "budget": {"epochs": 10, "batch_size": 64, "n_samples": 5}, "save_predictions": False,
        "methods": [{"name": "sgd", "hyperparameters": {"lr": 0.05}},
                    {"name": "sgld", "hyperparameters": {"lr": 0.1, "burn_in_epochs": 5}}]}
specs = {s.method: s for s in parse_grid(grid, "order.yaml").trial_specs()}
torch.set_num_threads(1)
setup = warm_up_worker(pick_device(0), [])
def cpu_s(spec):  # as the Tune worker measures a trial (ursa_ray.tune.trainable): process CPU seconds around it,
    warm_up_worker(pick_device(0), [spec.method])  # after the method's warm-up
    started = time.process_time()
    run_trial(spec)
    return time.process_time() - started
costs = {name: cpu_s(specs[name]) for name in sys.argv[1].split(",")}
print(json.dumps({"setup": setup, **costs}))
"""


def _costs(*orders: str) -> list[dict[str, float]]:
    """Each order's costs, its process run beside the others' (CPU seconds: the processes' own, one thread each)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, order], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for order in orders
    ]
    costs = []
    for process in processes:
        out, err = process.communicate()
        assert process.returncode == 0, err
        costs.append(json.loads(out.strip().splitlines()[-1]))
    return costs


@pytest.mark.slow  # starts fresh Python processes: not in the fast tier (-m "not slow")
def test_order_of_methods_does_not_change_their_measured_cost():
    sgd_first, sgd_second = _costs("sgd,sgld", "sgld,sgd")
    assert sgd_first["setup"] > 0 and sgd_second["setup"] > 0
    for method in ("sgd", "sgld"):
        a, b = sgd_first[method], sgd_second[method]
        assert max(a, b) <= 2 * min(a, b) + 0.15, (method, sgd_first, sgd_second)


def test_a_worker_warms_up_once_and_each_method_the_first_time_it_runs_it(monkeypatch):
    """The process's warm-up runs on the first call, a method's on the first trial of that method, nothing
    twice (0.0 s then), and a method the worker never runs is never warmed (csghmc's kernels and ArviZ,
    laplace-torch and torchvision: seconds a worker paid whatever it ran, when every registered method
    warmed up with the process)."""
    warmed: list[str] = []

    class Counting:
        def __init__(self, name: str) -> None:
            self.name = name

        def warm_up(self, device: torch.device) -> None:
            warmed.append(self.name)

    monkeypatch.setattr(trial, "_warmed_up", set())
    monkeypatch.setattr(methods, "get_method", Counting)
    cpu = torch.device("cpu")
    assert trial.warm_up_worker(cpu, ["sgd"]) > 0 and warmed == ["sgd"]
    assert trial.warm_up_worker(cpu, ["sgd"]) == 0.0 and warmed == ["sgd"]
    assert trial.warm_up_worker(cpu, ["sgld", "sgd"]) > 0 and warmed == ["sgd", "sgld"]
    assert trial._warmed_up == {("", cpu), ("sgd", cpu), ("sgld", cpu)}


def test_torchvision_is_warmed_up_once_and_only_for_a_trial_that_may_import_it(monkeypatch):
    """``torchvision=True`` imports torchvision on the first call only.  A trial may import it to build corruption
    sets (a final trial with corruption types, not the decision task's) or to load its dataset (torchvision's
    readers: MNIST, CIFAR, image folders); a search trial on digits, a decision-task trial or one with no
    corruption types may not."""
    from ursa_ray.data.files import file_dataset
    from ursa_ray.grid import parse_grid
    from ursa_ray.prepare import needs_torchvision

    imported: list[str] = []
    monkeypatch.setattr(trial, "_warmed_up", set())
    monkeypatch.setattr(trial, "_warm_up_torchvision", lambda: imported.append("torchvision"))
    cpu = torch.device("cpu")
    trial.warm_up_worker(cpu, ["sgd"])
    assert imported == []
    assert trial.warm_up_worker(cpu, ["sgd"], torchvision=True) > 0 and imported == ["torchvision"]
    assert trial.warm_up_worker(cpu, ["sgd"], torchvision=True) == 0.0 and len(imported) == 1
    grid = {"name": "c", "methods": ["sgd"], "models": [{"name": "mlp", "options": {"widths": [8]}}], "seeds": 1}
    none = {"corruptions": {"types": []}}
    (final,) = parse_grid({**grid, "datasets": ["digits"]}, "c.yaml").trial_specs()
    (plain,) = parse_grid({**grid, "datasets": ["digits"], **none}, "c.yaml").trial_specs()
    decision = parse_grid({**grid, "datasets": ["digits_imbalanced"]}, "c.yaml").trial_specs()
    (mnist,) = parse_grid({**grid, "datasets": ["mnist"], **none}, "c.yaml").trial_specs()
    assert needs_torchvision(final) and not needs_torchvision(plain) and not any(map(needs_torchvision, decision))
    assert not needs_torchvision(dataclasses.replace(final, phase="search"))
    assert needs_torchvision(mnist) and needs_torchvision(dataclasses.replace(mnist, phase="search"))
    folder = {"task": "classification", "path": "imgs"}
    assert file_dataset("f", {**folder, "format": "image_folder"}).torchvision
    assert not file_dataset("f", {**folder, "format": "npz"}).torchvision


@pytest.mark.slow  # a fresh Python process: not in the fast tier
def test_a_worker_imports_torchvision_only_when_its_trial_may_need_it():
    """A fresh process (a Ray worker) that warms up and runs a digits trial without corruption sets never imports
    torchvision (about a second of every worker's start, with torch._dynamo); warming up for a trial that may
    need it imports it before anything is timed."""
    script = """
import sys, torch
from ursa_ray.grid import parse_grid
from ursa_ray.trial import pick_device, run_trial, warm_up_worker
grid = {"name": "tv", "methods": ["sgd"], "models": [{"name": "mlp", "options": {"widths": [8]}}], "seeds": 1,
        "datasets": ["digits"], "budget": {"epochs": 1, "n_samples": 1}, "corruptions": {"types": []},
        "bit_depths": [], "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "transfer": False}}
(spec,) = parse_grid(grid, "tv.yaml").trial_specs()
warm_up_worker(pick_device(0), [spec.method])
run_trial(spec)
before = "torchvision" in sys.modules
warm_up_worker(pick_device(0), [spec.method], torchvision=True)
print(before, "torchvision" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"]
