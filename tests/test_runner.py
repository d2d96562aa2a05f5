"""Driver pieces that need no Ray cluster."""

from __future__ import annotations

import copy
import pickle

from ray.tune.search import Searcher

from ursa_ray.grid import parse_grid
from ursa_ray.tune.queue import SpecQueue, seed_groups
from ursa_ray.tune.trainable import config_specs


def _specs(queue, config):
    return config_specs(config, "", queue.spec_table)


def grid_raw() -> dict:
    return {
        "name": "big",
        "methods": ["sgd", "mc_dropout"],
        "models": ["mlp"],
        "datasets": [{"name": "e1", "complexity": [1, 2, 3, 4, 5]}],
        "seeds": 500,
    }


def test_spec_queue_hands_out_every_trial_once_in_order_without_copies(tmp_path):
    grid = parse_grid(grid_raw(), "big.yaml")
    specs = grid.trial_specs()
    assert len(specs) == 5000
    groups = seed_groups(specs)
    # 8 seeds (the default vectorize_seeds) of one cell per trial: 62 full groups and one of 4 per cell
    assert len(groups) == 10 * 63 and sorted({len(g) for g in groups}) == [4, 8]
    assert all(len({s.cell for s in g}) == 1 for g in groups)
    queue = SpecQueue(groups, str(tmp_path))
    handed = [queue.suggest(f"t{i}") for i in range(len(groups))]
    assert [s.trial_id for h in handed for s in _specs(queue, h)] == [s.trial_id for s in specs]
    assert [s for h in handed for s in _specs(queue, h)] == specs
    assert queue.suggest("extra") == Searcher.FINISHED
    # each trial's config holds an index into the run's table of packed seed groups, its folder name and its
    # request, not its specs: Tune keeps a config (and its JSON) several times over for every trial
    assert all(set(h) == {"group", "trial_id", "request"} for h in handed)
    assert max(len(pickle.dumps(h)) for h in handed) < 200 < min(map(len, queue.spec_table))
    assert [h["group"] for h in handed] == list(range(len(groups))) and len(queue.spec_table) == len(groups)
    assert copy.deepcopy(handed[0]) == handed[0]
    alone = parse_grid({**grid_raw(), "vectorize_seeds": 1}, "big.yaml").trial_specs()
    assert [len(g) for g in seed_groups(alone)] == [1] * 5000


def test_transfer_sources_run_first_and_their_trials_wait_for_their_examples(tmp_path):
    """sgd (the transfer source) of each seed is handed out first; mc_dropout of a seed waits until that
    seed's sgd trial is complete, then gets the location of the examples it saved (none if it saved none);
    the decision-task cells have no transfer attack and never wait."""
    from ursa_ray.results import ResultsDirectory

    raw = {
        "name": "t",
        "methods": ["mc_dropout", "sgd"],
        "models": ["mlp"],
        "datasets": ["digits", "digits_imbalanced"],
        "seeds": 2,
        "vectorize_seeds": 1,
    }
    grid = parse_grid(raw, "t.yaml")
    specs = grid.trial_specs()
    sources = {s.seed: s for s in specs if s.transfer_source}
    assert sorted(sources) == [0, 1] and all(s.method == "sgd" and s.dataset == "digits" for s in sources.values())
    waiting = [s for s in specs if s.transfer_from is not None]
    assert {(s.method, s.dataset) for s in waiting} == {("mc_dropout", "digits")}
    assert all(s.transfer_from == sources[s.seed].trial_id for s in waiting)

    results = ResultsDirectory(tmp_path)
    queue = SpecQueue(seed_groups(specs), str(tmp_path))
    first = [_specs(queue, queue.suggest(f"t{i}"))[0] for i in range(6)]  # 2 sources, then the 4 decision-task trials
    assert [s.trial_id for s in first[:2]] == [sources[0].trial_id, sources[1].trial_id]
    assert all(s.dataset == "digits_imbalanced" for s in first[2:])
    assert queue.suggest("t6") is None  # both mc_dropout trials wait for their sources
    results.transfer_examples(sources[0].trial_id).write_bytes(b"examples")
    queue.on_trial_complete("t0")  # seed 0's source finished and saved its examples
    released = _specs(queue, queue.suggest("t6"))[0]
    assert released.seed == 0 and released.transfer_examples == str(tmp_path / "transfer" / f"{sources[0].trial_id}.pt")
    assert queue.suggest("t7") is None
    queue.on_trial_complete("t1")  # seed 1's source failed: nothing saved, its trial runs without transfer sets
    last = _specs(queue, queue.suggest("t7"))[0]
    assert last.seed == 1 and last.transfer_examples is None
    assert queue.suggest("t8") == Searcher.FINISHED
    without = parse_grid({**raw, "adversarial": {"transfer": False}}, "t.yaml").trial_specs()
    assert not any(s.transfer_source or s.transfer_from is not None for s in without)

    # batched seeds: both seeds' sources are one trial, and both seeds' mc_dropout trial waits for it
    batched = seed_groups(parse_grid({**raw, "vectorize_seeds": 2}, "t.yaml").trial_specs())
    queue = SpecQueue(batched, str(tmp_path / "b"))
    handed = _specs(queue, queue.suggest("b0"))
    assert [s.seed for s in handed] == [0, 1] and all(s.transfer_source for s in handed)
    assert [len(_specs(queue, queue.suggest(f"b{i}"))) for i in (1, 2)] == [2, 2]  # the decision-task cells
    assert queue.suggest("b3") is None
    queue.on_trial_complete("b0")
    assert [s.seed for s in _specs(queue, queue.suggest("b3"))] == [0, 1]


def _point_rows(trial_id: str, method: str, n: int, shift: float = 0.0) -> list[dict]:
    return [
        {
            "trial_id": trial_id,
            "method": method,
            "experiment": "e1",
            "complexity": 1.0,
            "repetition": 0,
            "point_id": i,
            "x": [float(i)],
            "in_distribution": True,
            "truth": 0.0,
            "mean": i + shift,
            "std": 1.0,
        }
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
        "a.parquet",
        "b.parquet",
        "blr-e1-c1-s0.parquet",
    ]
    points = load_results(tmp_path).points
    assert sorted(points.groupby("trial_id").size().items()) == [("a", 3), ("b", 3), ("blr-e1-c1-s0", 3)]
    assert sorted(points.loc[points["trial_id"] == "a", "mean"]) == [10.0, 11.0, 12.0]  # replaced, not duplicated
    assert sorted(load_results(tmp_path).trials["trial_id"]) == ["a", "b"]


def test_live_fifo_scheduler_chooses_as_tunes_fifo_without_keeping_finished_trials():
    import random

    from ray.tune.experiment import Trial
    from ray.tune.schedulers import FIFOScheduler

    from ursa_ray.tune.queue import QueueOrderScheduler

    class FakeTrial:
        def __init__(self, status: str):
            self.status = status
            self.config: dict = {}  # no queue rank (a search trial): first in, first out

    class Controller:
        def __init__(self):
            self.trials: list[FakeTrial] = []

        def get_trials(self):
            return self.trials

    rng = random.Random(0)
    controller, ours, tunes = Controller(), QueueOrderScheduler(), FIFOScheduler()
    for step in range(3000):
        if rng.random() < 0.3:  # the searcher adds a trial
            trial = FakeTrial(Trial.PENDING)
            controller.trials.append(trial)
            ours.on_trial_add(controller, trial)
        alive = [t for t in controller.trials if t.status not in (Trial.TERMINATED, Trial.ERROR)]
        if alive and rng.random() < 0.5:  # a trial changes state
            trial = rng.choice(alive)
            trial.status = rng.choice([Trial.RUNNING, Trial.PAUSED, Trial.TERMINATED, Trial.ERROR, Trial.PENDING])
            if trial.status == Trial.PENDING and rng.random() < 0.5:  # a retry: Tune moves it to the end
                controller.trials.remove(trial)
                controller.trials.append(trial)
                ours.on_trial_add(controller, trial)
        assert ours.choose_trial_to_run(controller) is tunes.choose_trial_to_run(controller), step
    assert sum(t.status in (Trial.TERMINATED, Trial.ERROR) for t in controller.trials) > 500
    for trial in controller.trials:
        trial.status = Trial.TERMINATED
    assert ours.choose_trial_to_run(controller) is None
    assert not ours._alive  # finished trials are dropped as they are met: none is kept


def test_the_scheduler_starts_the_pending_final_trial_the_queue_ranks_first():
    """Tune takes final trials from the queue far ahead of the free workers; the next free worker goes to the
    pending one the queue ranks first (its ``group``), so a transfer source released late still starts next."""
    from ray.tune.experiment import Trial

    from ursa_ray.tune.queue import QueueOrderScheduler

    class FakeTrial:
        def __init__(self, group: int):
            self.status, self.config = Trial.PENDING, {"group": group}

    scheduler = QueueOrderScheduler()
    trials = [FakeTrial(g) for g in (7, 8, 9)]
    for trial in trials:
        scheduler.on_trial_add(None, trial)
    assert scheduler.choose_trial_to_run(None) is trials[0]
    source = FakeTrial(3)  # released after the others were taken
    scheduler.on_trial_add(None, source)
    assert scheduler.choose_trial_to_run(None) is source
    source.status = trials[0].status = Trial.RUNNING
    assert scheduler.choose_trial_to_run(None) is trials[1]
    trials[1].status, trials[2].status = Trial.PAUSED, Trial.TERMINATED
    assert scheduler.choose_trial_to_run(None) is trials[1]  # a paused trial only when none is pending


def test_the_spec_table_gives_back_each_group_and_reaches_workers_out_of_band():
    """The final phase's table of packed seed groups: entry i is the i-th group's bytes, and pickled as Ray
    pickles a trainable's parameters (protocol 5, buffers out of band) it is a header of a few hundred bytes
    whatever the number of groups: a worker maps the table rather than unpickling every group per trial
    (a list of bytes pickled in band grows with the grid)."""
    import os

    from ursa_ray.tune.trainable import SpecTable

    packed = [os.urandom(100 + i % 7) for i in range(5000)]
    table = SpecTable(packed)
    assert len(table) == 5000 and [table[i] for i in (0, 1, 2500, 4999)] == [packed[i] for i in (0, 1, 2500, 4999)]
    buffers: list = []
    header = pickle.dumps(table, protocol=5, buffer_callback=buffers.append)
    assert len(header) < 1000 and sum(memoryview(b).nbytes for b in buffers) >= sum(map(len, packed))
    again = pickle.loads(header, buffers=buffers)
    assert again[4321] == packed[4321]


def test_cells_without_a_reference_run_beside_it_rather_than_behind_a_waiting_trial(tmp_path):
    """The reference goes first; the cell it serves waits for it, but the cells it does not serve are handed
    out meanwhile (the queue hands groups out in order, so a waiting group ranked before them would hold
    them back and leave the other CPUs idle for the reference's whole run)."""
    raw = {
        "name": "r",
        "methods": ["sgd", "mc_dropout"],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": ["digits", "digits_imbalanced"],
        "seeds": 1,
        "reference": [{"datasets": ["digits"], "chains": 2, "n_samples": 4, "burn_in": 2}],
    }
    queue = SpecQueue(seed_groups(parse_grid(raw, "r.yaml").trial_specs()), str(tmp_path))
    reference = _specs(queue, queue.suggest("t0"))[0]
    assert reference.phase == "reference"
    free = [_specs(queue, queue.suggest(f"t{i}"))[0] for i in (1, 2)]
    assert {(s.method, s.dataset) for s in free} == {("sgd", "digits_imbalanced"), ("mc_dropout", "digits_imbalanced")}
    assert queue.suggest("t3") is None  # the digits cell waits for its reference
    queue.on_trial_complete("t0")
    assert [_specs(queue, queue.suggest("t3"))[0].dataset] == ["digits"]


def test_a_served_cells_transfer_source_goes_first_once_its_reference_is_complete(tmp_path):
    """Once the reference is complete, its cell's transfer source is handed out before the other cells' trials
    still queued, so that the source's dependants are ready before those run out (a group that waits is passed
    over, never holds back the ones behind it)."""
    raw = {
        "name": "r",
        "methods": ["sgd", "mc_dropout", "swag"],
        "models": [{"name": "mlp", "options": {"widths": [8]}}],
        "datasets": ["digits", "digits_imbalanced"],
        "seeds": 1,
        "reference": [{"datasets": ["digits"], "chains": 2, "n_samples": 4, "burn_in": 2}],
    }
    queue = SpecQueue(seed_groups(parse_grid(raw, "r.yaml").trial_specs()), str(tmp_path))
    assert _specs(queue, queue.suggest("t0"))[0].phase == "reference"
    assert _specs(queue, queue.suggest("t1"))[0].dataset == "digits_imbalanced"
    queue.on_trial_complete("t0")
    source = _specs(queue, queue.suggest("t2"))[0]
    assert (source.method, source.dataset, source.transfer_source) == ("sgd", "digits", True)
    rest = [_specs(queue, queue.suggest(f"t{i}"))[0] for i in (3, 4)]
    assert {s.dataset for s in rest} == {"digits_imbalanced"}
    assert queue.suggest("t5") is None  # the digits cell's other trials wait for its source
    queue.on_trial_complete("t2")
    released = [_specs(queue, queue.suggest(f"t{i}"))[0] for i in (5, 6)]
    assert {(s.method, s.dataset) for s in released} == {("mc_dropout", "digits"), ("swag", "digits")}
    assert queue.suggest("t7") == Searcher.FINISHED
