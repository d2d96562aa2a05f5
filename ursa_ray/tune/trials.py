"""The trial-running machinery both phases use: Ray Tune experiments whose finished trials are written into the
results directory as they finish.

:func:`run_trials` runs one Tune experiment (the final phase's specs through
:class:`~ursa_ray.tune.queue.SpecQueue`, or one search cell's configurations).  Its parts live in modules by
role: :mod:`ursa_ray.tune.callback` (the :class:`~ursa_ray.tune.callback.ResultsCallback` writing each finished
trial's rows, the run's summary), :mod:`ursa_ray.tune.interrupt` (Ctrl-C and the stopper),
:mod:`ursa_ray.tune.queue` (seed groups, the final phase's searcher and scheduler) and
:mod:`ursa_ray.tune.cluster` (connecting to Ray, the resource-fit check).

The dependency goes one way: :mod:`ursa_ray.tune.runner` (the driver: :func:`~ursa_ray.tune.runner.run_grid`)
and :mod:`ursa_ray.tune.search` (the search phase) import this module; it imports neither.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import ray
from ray import tune

from ursa_ray.grid import Grid
from ursa_ray.results import ResultsDirectory
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.callback import ResultsCallback, RunSummary
from ursa_ray.tune.interrupt import Interrupt, RunStopper
from ursa_ray.tune.progress import Echo
from ursa_ray.tune.queue import QueueOrderScheduler, SpecQueue, seed_groups
from ursa_ray.tune.trainable import placement, run_ursa_trial, trial_folder_name


def run_trials(
    specs: list[TrialSpec],
    grid: Grid,
    results: ResultsDirectory,
    experiment: str,
    summary: RunSummary,
    echo: Echo,
    interrupt: Interrupt | None = None,
    tune_config: tune.TuneConfig | None = None,
    param_space: dict[str, Any] | None = None,
    budget: Any = None,
    total: int | None = None,
) -> RunStopper:
    """Run trials on Ray Tune: the specs, several seeds of a cell per Tune trial where they batch
    (:func:`seed_groups`, handed out by :class:`SpecQueue`), or a search given
    ``param_space`` (``total`` trials at most, shown in the progress lines; ``budget``, a
    :class:`~ursa_ray.tune.search.ComputeBudget`, ends it early).  Returns the stopper, whose ``reason`` says
    whether Ctrl-C or the budget ended the experiment.

    What Tune does in the driver per trial does not grow with the trials run so far (docs/performance.md, "The
    driver on large grids"): the final phase's trials come from :class:`SpecQueue` and are chosen by
    :class:`QueueOrderScheduler`, and Tune snapshots its experiment state every 10 minutes
    (``TUNE_GLOBAL_CHECKPOINT_S``, set in :mod:`ursa_ray.tune`), not every 10 s."""
    stopper = RunStopper(interrupt or Interrupt(), echo, budget)
    trainable: Any = run_ursa_trial
    spec_table: Any = ()
    final = param_space is None
    if final:
        param_space = {}
        queue = SpecQueue(seed_groups(specs), results.location.uri)
        spec_table = queue.spec_table
        trainable = tune.with_parameters(run_ursa_trial, spec_table=spec_table)  # once, in the object store
        tune_config = tune.TuneConfig(
            search_alg=queue,
            num_samples=len(spec_table),
            reuse_actors=True,
            max_concurrent_trials=grid.max_concurrent_trials,
            scheduler=QueueOrderScheduler(),
            trial_dirname_creator=trial_folder_name,
        )
    callback = ResultsCallback(results, summary, echo, len(specs) if final else total, stopper, spec_table)
    stopper.callback = callback
    trainable = tune.with_resources(trainable, placement)  # each trial's own request, from its config
    storage = results.location / "ray"  # checkpoints: a local folder, or the same object store as the results
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune_config,
        run_config=tune.RunConfig(
            name=experiment,
            storage_path=storage.path,
            storage_filesystem=None if storage.is_local else storage.fs,  # endpoint etc. from the --out URI
            verbose=0,
            callbacks=[callback],
            failure_config=tune.FailureConfig(max_failures=grid.max_failures),
            stop=stopper,
        ),
    )
    with _pending_trials(param_space):
        tuner.fit()
    return stopper


@contextlib.contextmanager
def _pending_trials(param_space: dict[str, Any]) -> Iterator[None]:
    """Let Tune keep as many final-phase trials pending (placement groups requested, workers starting) as it
    does for a grid search, ``max(200, 1.1 × cluster CPUs)``: with a searcher of its own (:class:`SpecQueue`)
    Tune keeps one, so workers would start one after another and short trials run one at a time however many
    fit.  ``TUNE_MAX_PENDING_TRIALS_PG`` set by the user wins; the search phase keeps Tune's choice."""
    if param_space or "TUNE_MAX_PENDING_TRIALS_PG" in os.environ:
        yield
        return
    os.environ["TUNE_MAX_PENDING_TRIALS_PG"] = str(max(200, int(1.1 * ray.cluster_resources().get("CPU", 1.0))))
    try:
        yield
    finally:
        os.environ.pop("TUNE_MAX_PENDING_TRIALS_PG", None)
