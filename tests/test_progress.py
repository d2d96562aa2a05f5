"""The driver's progress output (ursa_ray.tune.progress): the live status line on a fake terminal with a fake
clock, and log mode's per-trial lines unchanged.  No Ray cluster."""

from __future__ import annotations

import io
import pickle
from dataclasses import replace
from types import SimpleNamespace

import pytest
from spec_fixtures import hand_spec

from ursa_ray.cli import build_parser
from ursa_ray.tune.callback import ResultsCallback, RunSummary
from ursa_ray.tune.progress import Progress
from ursa_ray.tune.trainable import pack


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def screen(raw: str) -> list[str]:
    """What a terminal shows after ``raw``: each carriage return goes back to the line's start, ``ESC[K``
    clears the rest of it."""
    lines, current, i = [], "", 0
    while i < len(raw):
        if raw.startswith("\x1b[K", i):
            i += 3
            continue
        ch = raw[i]
        if ch == "\r":
            current = ""
        elif ch == "\n":
            lines.append(current)
            current = ""
        else:
            current += ch
        i += 1
    return lines + [current]


def live(clock: Clock) -> tuple[Progress, io.StringIO]:
    terminal = io.StringIO()
    return Progress(live=terminal, clock=clock, refresh_s=0.25, width=200), terminal


def test_the_status_line_is_rewritten_in_place_with_counts_and_time_left():
    clock = Clock()
    progress, terminal = live(clock)
    progress("final phase: 10 trials")
    progress.begin(10)
    progress.trial_started(3, "final")  # a batched trial of three seeds
    clock.now += 0.3
    progress.trial_started(1, "final")
    clock.now -= 0.3
    assert screen(terminal.getvalue()) == [
        "final phase: 10 trials",
        "final: 0/10 done, 0 failed, 4 running, 6 pending | 0s",
    ]
    clock.now += 29.75
    for _ in range(3):
        progress.trial_recorded("ok", "[n/10] ok ...")  # not printed in line mode
    clock.now += 0.25  # the next redraw (at most every refresh_s)
    progress.tick()
    # 3 done in 30 s: the other 7 at 10 s each
    assert screen(terminal.getvalue())[-1] == "final: 3/10 done, 0 failed, 1 running, 6 pending | 30s, ~1m10s left"
    assert terminal.getvalue().count("\n") == 1  # one line, redrawn with carriage returns
    assert "\r" in terminal.getvalue().split("\n")[-1]


def test_no_estimate_before_a_trial_is_done_nor_without_a_count():
    clock = Clock()
    progress, terminal = live(clock)
    progress.begin(5)
    progress.trial_started(1, "search")
    clock.now += 100
    assert progress.eta() is None and "left" not in progress.status()
    progress.begin(1)
    progress.trial_started(1, "final")
    progress.trial_recorded("ok", "")
    assert progress.eta() is None  # nothing left
    progress.begin(None)  # a budgeted search: no fixed count
    progress.trial_started(1, "search")
    progress.trial_recorded("ok", "")
    assert progress.eta() is None
    assert progress.status() == "search: 1 done, 0 failed, 0 running | 0s"


def test_redraws_are_throttled():
    clock = Clock()
    progress, terminal = live(clock)
    progress.begin(100)
    progress.trial_started(1, "final")
    drawn = terminal.getvalue().count("\r")
    for _ in range(16):  # Tune steps far more often than the line is redrawn
        clock.now += 0.03125
        progress.tick()
    assert terminal.getvalue().count("\r") == drawn + 2  # at 0.25 s and 0.50 s, not 16 times
    assert screen(terminal.getvalue())[-1].startswith("final: 0/100 done")


def test_failures_and_retries_are_permanent_lines_above_the_status_line_and_close_ends_it():
    clock = Clock()
    progress, terminal = live(clock)
    progress.begin(4)
    progress.trial_started(2, "final")
    progress("retry 1/1 final  sgd mlp digits seed=0: RayActorError: died")
    clock.now += 5
    progress.trial_recorded("failed", "[1/4] FAILED final  sgd mlp digits seed=0: FloatingPointError: nan")
    progress.trial_recorded("early_stopped", "[2/4] early_stopped ...")
    progress.close()
    shown = screen(terminal.getvalue())
    assert shown == [
        "retry 1/1 final  sgd mlp digits seed=0: RayActorError: died",
        "[1/4] FAILED final  sgd mlp digits seed=0: FloatingPointError: nan",
        "final: 2/4 done, 1 failed, 0 running, 2 pending | 5s, ~5s left",
        "",  # the status line ended with a newline: the summary starts on a line of its own
    ]
    progress.close()  # twice (Ctrl-C, then the run's end): one newline
    assert terminal.getvalue().endswith("left\x1b[K\n")


def test_interrupted_trials_stop_counting_as_running():
    clock = Clock()
    progress, terminal = live(clock)
    progress.begin(6)
    progress.trial_started(3, "final")
    progress.trial_recorded("ok", "")
    progress.end()  # Ctrl-C: the two unrecorded seeds are not running any more
    assert screen(terminal.getvalue())[-1].startswith("final: 1/6 done, 0 failed, 0 running, 5 pending")


def test_the_status_line_never_wraps():
    progress = Progress(live=io.StringIO(), clock=Clock(), width=20)
    progress.begin(1000)
    progress.trial_started(1, "final")
    assert all(len(line) <= 19 for line in screen(progress.live.getvalue()))


def test_log_mode_passes_every_line_through_unchanged():
    lines: list[str] = []
    progress = Progress(lines.append)
    progress("final phase: 2 trials")
    progress.begin(2)
    progress.trial_started(1, "final")
    progress.tick()
    progress.trial_recorded("ok", "[1/2] ok     final  sgd mlp digits seed=0")
    progress.trial_recorded("failed", "[2/2] FAILED final  sgd mlp digits seed=1: boom")
    progress.end()
    progress.close()
    assert lines == [
        "final phase: 2 trials",
        "[1/2] ok     final  sgd mlp digits seed=0",
        "[2/2] FAILED final  sgd mlp digits seed=1: boom",
    ]


def test_a_pickled_progress_is_a_plain_log_mode_one():
    progress = Progress(live=io.StringIO())  # Tune pickles its run config, the results callback with it
    copy = pickle.loads(pickle.dumps(progress))
    assert copy.live is None


def test_the_results_callback_counts_seeds_once_per_tune_trial_and_echoes_retries_above_the_line():
    clock = Clock()
    progress, terminal = live(clock)
    specs = [hand_spec(trial_id=f"t{i}") for i in range(3)]
    callback = ResultsCallback(results=None, summary=RunSummary(), echo=progress, total=6, spec_table=[pack(specs)])
    assert callback.progress is progress
    callback.setup()
    trial = SimpleNamespace(trial_id="a", config={"group": 0})
    callback.on_trial_start(0, [], trial)
    callback.on_trial_start(1, [], trial)  # Tune starts a retried trial again: its seeds are counted once
    assert progress.started == 3
    assert screen(terminal.getvalue())[-1].startswith("final: 0/6 done, 0 failed, 3 running, 3 pending")
    plain = ResultsCallback(results=None, summary=RunSummary(), echo=print, total=6)
    assert plain.progress.live is None and plain.progress.echo is print  # any other echo: log mode


def test_run_progress_option_is_validated():
    parser = build_parser()
    assert parser.parse_args(["run", "g.yaml"]).progress == "auto"
    assert parser.parse_args(["run", "g.yaml", "--progress", "line"]).progress == "line"
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "g.yaml", "--progress", "bar"])
    with pytest.raises(ValueError):
        Progress.for_stdout("bar")


def test_a_recorded_final_trial_leaves_no_metric_history_in_the_driver(tmp_path):
    """Driver memory (26.14): Tune keeps running statistics of every numeric result key of every trial (~17 KB a
    trial); once a final trial's rows are written the callback drops them, a search trial's are kept (its
    scheduler and searcher may use them).  Catches a callback that leaves Tune's per-trial history in place."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    from ursa_ray.results import ResultsDirectory

    spec = hand_spec()
    callback = ResultsCallback(
        ResultsDirectory(tmp_path), RunSummary(), lambda line: None, total=2, spec_table=[pack([spec])]
    )
    kept = {}
    for phase in ("final", "search"):
        metadata = _TrainingRunMetadata()
        for step in (1, 2):
            metadata.update_metric("cpu_s", 1.5 * step, step=step)
        config = {"group": 0} if phase == "final" else {"spec": pack(replace(spec, phase=phase)), "hp": {"lr": 0.1}}
        trial = SimpleNamespace(
            trial_id=f"{phase}_1", config=config, last_result={}, checkpoint=None, node_ip="", run_metadata=metadata
        )
        callback._record(trial, error="RuntimeError: boom")
        kept[phase] = (metadata.metric_analysis, metadata.metric_n_steps)
    assert kept["final"] == ({}, {})
    assert kept["search"][0]["cpu_s"]["last"] == 3.0 and set(kept["search"][1]["cpu_s"]) == {"5", "10"}
