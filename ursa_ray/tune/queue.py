"""How the final phase's trials reach Tune: grouped into batched Tune trials (:func:`seed_groups`), handed out
in order by a searcher (:class:`SpecQueue`: references and transfer sources first, their dependants when they
are complete), and started first in, first out (:class:`LiveFIFOScheduler`)."""

from __future__ import annotations

import json
from typing import Any

from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import Searcher

from ursa_ray.results import Location, transfer_examples_location
from ursa_ray.spec import TrialSpec
from ursa_ray.tune.trainable import SpecTable, pack, request


def seed_groups(specs: list[TrialSpec]) -> list[list[TrialSpec]]:
    """The final phase's Tune trials: ``specs`` grouped into runs of up to ``spec.vectorize_seeds`` seeds
    of one cell, configuration and resource request (a batched computation, see
    :func:`ursa_ray.trial.run_trials_batched`; the Tune trial asks for one seed's ``resources``),
    in the order of each group's first seed; a spec with ``vectorize_seeds`` 1 is a trial of its own."""
    groups: dict[str, list[list[TrialSpec]]] = {}
    order: list[list[TrialSpec]] = []
    for spec in specs:
        size = spec.vectorize_seeds
        key = json.dumps(
            [spec.cell, spec.config, spec.transfer_source, spec.resources],
            sort_keys=True,
            default=str,
        )
        open_groups = groups.setdefault(key, [])
        if size > 1 and open_groups and len(open_groups[-1]) < size:
            open_groups[-1].append(spec)
            continue
        group = [spec]
        open_groups.append(group)
        order.append(group)
    return order


class SpecQueue(Searcher):
    """Hands Tune the final phase's trials (groups of specs, :func:`seed_groups`) one at a time.

    A ``tune.grid_search`` over the specs would do the same, but Tune deep-copies the whole search space
    for every variant it generates: quadratic in the number of trials (minutes before the first trial of
    a 6,800-trial grid starts).  This is linear.

    Reference trials (phase ``reference``) go before everything, and a trial of their cell
    (``reference_from``) waits for its reference as a transfer attack's trial waits for its source, so the
    trials of cells without a reference are handed out before any that wait (they run beside the references
    rather than behind the first waiting trial, which the queue hands out in order); each
    spec with computed ``reference`` settings gets ``references_dir``: the block's ``dir`` (a store shared between
    results directories), else the ``references/`` folder of ``results_uri``.  A reference from file has no trial.
    The transfer attack's order: transfer sources (``transfer_source``) go first, trials that need none
    next, and a trial scored on a source's examples (``transfer_from``) waits until its seeds' sources are
    complete (``suggest`` returns None meanwhile; Tune asks again), then gets ``transfer_examples``, the
    location of the file its source saved under ``results_uri``, when there is one (a failed source saves
    none).  Tune calls the searcher's ``on_trial_complete`` before the callbacks' and never suggests in
    between, so the source's file is written before the waiting trial is handed out.
    """

    def __init__(self, groups: list[list[TrialSpec]], results_uri: str):
        super().__init__()

        def rank(group: list[TrialSpec]) -> tuple[int, int]:
            if group[0].phase == "reference":
                return -1, 0
            waits = int(group[0].reference_from is not None)  # behind every trial that needs no reference
            return waits, 0 if group[0].transfer_source else 2 if group[0].transfer_from is not None else 1

        self._groups = sorted(groups, key=rank)
        self.spec_table = SpecTable([pack(group) for group in self._groups])
        """The seed groups, packed (:func:`~ursa_ray.tune.trainable.config_specs`): a handed-out config holds
        an index into it; the trainable gets it once, through Ray's object store."""
        self._results_uri = results_uri
        self._unfinished_sources = {
            s.trial_id for g in groups for s in g if s.transfer_source or s.phase == "reference"
        }
        self._running: dict[str, list[str]] = {}  # Tune trial id -> its specs' trial ids
        self._next = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._next >= len(self._groups):
            return Searcher.FINISHED
        group = self._groups[self._next]
        if any(
            spec.transfer_from in self._unfinished_sources or spec.reference_from in self._unfinished_sources
            for spec in group
        ):
            return None
        config: dict[str, Any] = {
            "group": self._next,
            "trial_id": group[0].trial_id,  # its first seed's: the Tune trial's folder name
            "request": request(group[0].resources),
        }
        additions = [self._additions(spec) for spec in group]
        if any(additions):
            config["additions"] = additions
        self._next += 1
        self._running[trial_id] = [spec.trial_id for spec in group]
        return config

    def _additions(self, spec: TrialSpec) -> dict[str, str]:
        """What ``spec`` gets when it is handed out: where its cell's reference is stored (by fingerprint), and
        the transfer examples its source saved (a failed source saves none)."""
        added = {}
        if spec.reference is not None and "file" not in spec.reference:
            added["references_dir"] = (
                spec.reference.get("dir") or (Location.parse(self._results_uri) / "references").uri
            )
        if spec.transfer_from is not None:
            saved = transfer_examples_location(self._results_uri, spec.transfer_from)
            if saved.exists():
                added["transfer_examples"] = saved.uri
        return added

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        """A finished (or failed) transfer source releases the trials waiting for it."""
        self._unfinished_sources.difference_update(self._running.pop(trial_id, []))


class LiveFIFOScheduler(FIFOScheduler):
    """Tune's first-in-first-out scheduler without its scan of every trial at every step.

    Tune asks the scheduler which trial to start at every step of its loop (several steps per trial), and
    ``FIFOScheduler`` answers by scanning every trial of the experiment, finished ones included, for the first
    pending one (then for a paused one): the driver's time per trial grew with the trials already run.  This
    one keeps the trials not yet finished, in the order Tune added them (a retried trial goes last, as Tune
    moves it to the end of its list), and drops a finished one when it meets it: the same choice, in time
    that depends on the trials alive (running, pending) only.
    """

    def __init__(self) -> None:
        super().__init__()
        self._alive: dict[Trial, None] = {}  # insertion-ordered

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._alive.pop(trial, None)
        self._alive[trial] = None

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        paused = None
        for trial in list(self._alive):
            if trial.status in (Trial.TERMINATED, Trial.ERROR):
                del self._alive[trial]
            elif trial.status == Trial.PENDING:
                return trial
            elif paused is None and trial.status == Trial.PAUSED:
                paused = trial
        return paused
