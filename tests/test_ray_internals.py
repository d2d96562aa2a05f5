"""The Ray and Ray Tune internals ursa_ray.tune relies on (private modules, settings read from the environment,
hooks of Tune's classes it overrides) still exist with the shape it uses.  pyproject.toml bounds Ray to the
versions tested; before raising that bound, run this module against the new Ray: a failure names what changed.

No Ray is started: everything here is read from Ray's modules.
"""

from __future__ import annotations

import importlib
import inspect
from importlib.metadata import version

import pytest
from packaging.requirements import Requirement

PRIVATE_FUNCTIONS = [  # (module, attribute path, parameters ursa-ray passes) -- where ursa-ray calls it
    ("ray._private.services", "canonicalize_bootstrap_address", ["addr"]),  # tune.cluster.unreachable
    ("ray._private.state", "GlobalState.get_cluster_config", ["self"]),  # tune.cluster.launchable_node_resources
    ("ray.tune.search.optuna", "OptunaSearch._setup_study", ["self", "mode"]),  # tune.search.UrsaOptunaSearch
    (
        "ray.tune.search.optuna",
        "OptunaSearch.add_evaluated_point",
        ["self", "parameters", "value", "pruned", "intermediate_values"],
    ),
    ("ray.tune.schedulers", "FIFOScheduler.choose_trial_to_run", ["self", "tune_controller"]),  # QueueOrderScheduler
    ("ray.tune.schedulers", "FIFOScheduler.on_trial_add", ["self", "tune_controller", "trial"]),
    ("ray.tune.search.basic_variant", "BasicVariantGenerator.__init__", ["self", "random_state", "max_concurrent"]),
    ("ray.tune.execution.tune_controller", "TuneController.save_to_dir", ["self"]),  # benchmarks/bench_driver.py
    ("ray.tune.execution.tune_controller", "TuneController.step", ["self"]),
]
TUNE_SETTINGS = {  # environment variable -> the module that must read it (set in ursa_ray/tune/__init__.py, trials.py, interrupt.py)
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "ray.tune.utils.callback",
    "RAY_AIR_NEW_OUTPUT": "ray.air.constants",
    "TUNE_PRINT_ALL_TRIAL_ERRORS": "ray.tune.execution.tune_controller",
    "TUNE_DISABLE_STRICT_METRIC_CHECKING": "ray.tune.execution.tune_controller",
    "TUNE_GLOBAL_CHECKPOINT_S": "ray.tune.execution.tune_controller",
    "TUNE_MAX_PENDING_TRIALS_PG": "ray.tune.execution.tune_controller",
    "TUNE_DISABLE_SIGINT_HANDLER": "ray.tune.tune",
}
TRIAL_ATTRIBUTES = [  # read by tune.callback.ResultsCallback from Tune's Trial
    "config",
    "trial_id",
    "checkpoint",
    "last_result",
    "pickled_error_file",
    "run_metadata",
    "max_failures",
    "node_ip",
    "get_error",
    "status",
    "local_path",
]
CALLBACK_HOOKS = {  # tune.callback.ResultsCallback: hook -> the parameters it takes before **info
    "setup": [],
    "on_trial_start": ["iteration", "trials", "trial"],
    "on_step_end": ["iteration", "trials"],
    "on_trial_complete": ["iteration", "trials", "trial"],
    "on_trial_error": ["iteration", "trials", "trial"],
    "on_trial_recover": ["iteration", "trials", "trial"],
    "on_experiment_end": ["trials"],
}


def _resolve(module: str, path: str):
    obj = importlib.import_module(module)
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


def test_ray_is_within_the_tested_bound():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    ray = next(Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "ray")
    assert any(s.operator == "<" for s in ray.specifier), (
        "pyproject.toml: ray needs an upper bound (the versions tested)"
    )
    assert ray.specifier.contains(version("ray")), (
        f"ray {version('ray')} is outside pyproject.toml's bound {ray.specifier}: run tests/test_ray_internals.py "
        "and the Ray tests against it, then move the bound"
    )


@pytest.mark.parametrize(("module", "path", "parameters"), PRIVATE_FUNCTIONS, ids=[p for _, p, _ in PRIVATE_FUNCTIONS])
def test_private_functions_ursa_ray_calls_still_exist(module, path, parameters):
    try:
        function = _resolve(module, path)
    except (ImportError, AttributeError) as exc:
        pytest.fail(f"ray {version('ray')}: {module}.{path} is gone ({exc}); ursa_ray.tune relies on it")
    have = list(inspect.signature(function).parameters)
    missing = [p for p in parameters if p not in have]
    assert not missing, f"ray {version('ray')}: {module}.{path} no longer takes {missing} (it takes {have})"


@pytest.mark.parametrize("variable", sorted(TUNE_SETTINGS))
def test_tune_still_reads_the_settings_ursa_ray_sets(variable):
    source = inspect.getsource(importlib.import_module(TUNE_SETTINGS[variable]))
    assert f'"{variable}"' in source, (
        f"ray {version('ray')}: {TUNE_SETTINGS[variable]} no longer reads {variable}, which ursa_ray.tune sets "
        "(see docs/performance.md and ursa_ray/tune/__init__.py for what it is for)"
    )


def test_tune_trial_and_callback_still_have_what_the_results_callback_uses():
    from ray.tune import Callback
    from ray.tune.experiment import Trial
    from ray.tune.search import Searcher

    missing = [
        name
        for name in TRIAL_ATTRIBUTES
        if not hasattr(Trial, name)
        and name not in inspect.signature(Trial.__init__).parameters
        and f"self.{name} =" not in inspect.getsource(Trial)
    ]
    assert not missing, f"ray {version('ray')}: Tune's Trial lacks {missing}, which tune.callback.ResultsCallback reads"
    assert {"PENDING", "PAUSED", "TERMINATED", "ERROR"} <= set(vars(Trial)), "Tune's Trial status names changed"
    assert "num_failures" in inspect.getsource(importlib.import_module("ray.tune.experiment.trial"))
    for hook, parameters in CALLBACK_HOOKS.items():
        have = list(inspect.signature(getattr(Callback, hook)).parameters)
        assert have[1 : 1 + len(parameters)] == parameters, f"ray {version('ray')}: Callback.{hook} now takes {have}"
    assert Searcher.FINISHED == "FINISHED", "Tune's Searcher.FINISHED changed"
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    metadata = _TrainingRunMetadata()
    assert {"metric_analysis", "metric_n_steps", "last_result"} <= set(vars(metadata)), (
        f"ray {version('ray')}: Tune's run metadata lacks what tune.callback.forget_metric_history clears"
    )
