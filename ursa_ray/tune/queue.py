"""How the final phase's trials reach Tune: grouped into batched Tune trials (:func:`seed_groups`), handed out
in order by a searcher (:class:`SpecQueue`: references and transfer sources first, their dependants when they
are complete, the first ready group first), and started in that order (:class:`QueueOrderScheduler`)."""

from __future__ import annotations

import heapq
import json
import math
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
    a 6,800-trial grid starts).  This is linear (a heap of the groups ready to run).

    Some trials wait for others: a trial of a cell with a computed reference (``reference_from``) for the
    reference trial (phase ``reference``), and a trial scored on a transfer attack's examples
    (``transfer_from``) for its seeds' transfer source (``transfer_source``).  ``suggest`` hands out the
    first ready group in the order: references, transfer sources, trials that need no source, trials scored
    on a source's examples; a group that waits is passed over until what it waits for is complete (Tune's
    ``on_trial_complete``, failed or not), and ``suggest`` returns None while only waiting groups remain
    (Tune asks again).  So the cells a reference does not serve run beside it, and once it is complete its
    cell's transfer source goes before them, so that the source's dependants are ready before the other
    cells' trials run out (a worker with nothing to run is stopped by Tune and a fresh one started later).

    What a group gets when it is handed out: each spec with computed ``reference`` settings ``references_dir``
    (the block's ``dir``, a store shared between results directories, else the ``references/`` folder of
    ``results_uri``; a reference from file has no trial), and each scored on transfer examples
    ``transfer_examples``, the location of the file its source saved under ``results_uri``, when there is one
    (a failed source saves none).  Tune calls the searcher's ``on_trial_complete`` before the callbacks' and
    never suggests in between, so the source's file is written before the waiting trial is handed out.
    """

    def __init__(self, groups: list[list[TrialSpec]], results_uri: str):
        super().__init__()

        def rank(group: list[TrialSpec]) -> int:
            if group[0].phase == "reference":
                return -1
            return 0 if group[0].transfer_source else 2 if group[0].transfer_from is not None else 1

        self._groups = sorted(groups, key=rank)
        self.spec_table = SpecTable([pack(group) for group in self._groups])
        """The seed groups, packed (:func:`~ursa_ray.tune.trainable.config_specs`): a handed-out config holds
        an index into it; the trainable gets it once, through Ray's object store."""
        self._results_uri = results_uri
        sources = {s.trial_id for g in groups for s in g if s.transfer_source or s.phase == "reference"}
        self._dependants: dict[str, list[int]] = {}  # a source's trial id -> the groups waiting for it
        self._waits_for = [0] * len(self._groups)  # per group: how many unfinished sources it waits for
        self._ready: list[int] = []  # a heap of the indices of the groups ready to be handed out
        for index, group in enumerate(self._groups):
            needs = ({s.transfer_from for s in group} | {s.reference_from for s in group}) & sources
            for source in needs:
                self._dependants.setdefault(source, []).append(index)
            self._waits_for[index] = len(needs)
            if not self._waits_for[index]:
                self._ready.append(index)  # ascending: already a heap
        self._running: dict[str, list[str]] = {}  # Tune trial id -> its specs' trial ids
        self._handed_out = 0

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if self._handed_out == len(self._groups):
            return Searcher.FINISHED
        if not self._ready:
            return None
        index = heapq.heappop(self._ready)
        group = self._groups[index]
        config: dict[str, Any] = {
            "group": index,
            "trial_id": group[0].trial_id,  # its first seed's: the Tune trial's folder name
            "request": request(group[0].resources),
        }
        additions = [self._additions(spec) for spec in group]
        if any(additions):
            config["additions"] = additions
        self._handed_out += 1
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
        """A finished (or failed) reference or transfer source releases the groups waiting for it."""
        for source in self._running.pop(trial_id, []):
            for index in self._dependants.pop(source, []):
                self._waits_for[index] -= 1
                if not self._waits_for[index]:
                    heapq.heappush(self._ready, index)


class QueueOrderScheduler(FIFOScheduler):
    """Tune's first-in-first-out scheduler in the queue's order, without its scan of every trial at every step.

    Tune asks the scheduler which trial to start at every step of its loop (several steps per trial) and gives
    that trial the next free worker; ``FIFOScheduler`` answers by scanning every trial of the experiment,
    finished ones included, for the first pending one (then for a paused one): the driver's time per trial
    grew with the trials already run.  This one keeps the trials not yet finished, in the order Tune added
    them (a retried trial goes last, as Tune moves it to the end of its list), and drops a finished one when
    it meets it, in time that depends on the trials alive (running, pending) only.  Of the pending final-phase
    trials it chooses the one :class:`SpecQueue` ranks first (its ``group``), others first in, first out.

    The rank matters because Tune takes trials from the queue up to 200 ahead of the free workers: a cell's
    transfer source, released when its reference completes, would otherwise start behind every trial taken
    before it, and once it ran alone at the end the other worker had nothing to run, so Tune stopped it and
    started a fresh one for the source's dependants (the quickstart with its reference: a 6.5 s gap and an 8.6 s
    warm-up, gone with this order).
    """

    def __init__(self) -> None:
        super().__init__()
        self._alive: dict[Trial, None] = {}  # insertion-ordered

    def on_trial_add(self, tune_controller: Any, trial: Trial) -> None:
        self._alive.pop(trial, None)
        self._alive[trial] = None

    def choose_trial_to_run(self, tune_controller: Any) -> Trial | None:
        pending = paused = None
        for trial in list(self._alive):
            if trial.status in (Trial.TERMINATED, Trial.ERROR):
                del self._alive[trial]
            elif trial.status == Trial.PENDING and (pending is None or _rank(trial) < _rank(pending)):
                pending = trial
            elif paused is None and trial.status == Trial.PAUSED:
                paused = trial
        return pending or paused


def _rank(trial: Trial) -> float:
    """A final-phase trial's place in the queue's order (its ``group``); any other trial's is last."""
    return trial.config.get("group", math.inf)
