"""Ctrl-C (SIGINT) is ours, not Tune's (:class:`Interrupt`): the first asks every phase to stop (the
:class:`RunStopper` ends the running Tune experiment at its next step, trials that did not finish are not
recorded, no later cell or phase starts), a second aborts at once, though never in the middle of writing
a trial's rows.  The stopper also ends a search cell's experiment when its compute budget is spent."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from ray import tune
from ray.tune.stopper import NoopStopper

from ursa_ray.tune.progress import Echo


class Interrupt:
    """Ctrl-C during a run.  The first SIGINT only sets a flag: the running Tune experiment stops at its next
    step (:class:`RunStopper`), and no later cell or phase starts.  A second SIGINT raises KeyboardInterrupt,
    deferred while a trial's rows are being written (:meth:`critical`), so no file is ever half-written."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.announced = False
        self._critical = 0
        self._abort_pending = False

    def is_set(self) -> bool:
        return self.event.is_set()

    def __reduce__(self) -> tuple:  # Tune pickles its run config (stopper included): a copy is a fresh Interrupt
        return (Interrupt, ())

    @contextlib.contextmanager
    def catching(self) -> Iterator[Interrupt]:
        """Handle SIGINT (main thread only) instead of Tune, whose own handler would end one experiment and
        let the driver carry on to the next cell and phase."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.getsignal(signal.SIGINT)
        tune_handler = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
        signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
            if tune_handler is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = tune_handler

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.event.is_set():
            self.event.set()  # nothing printed here: a handler must not write to a stream the driver may be using
            return
        if self._critical:
            self._abort_pending = True
            return
        raise KeyboardInterrupt

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A block a second Ctrl-C does not cut short (writing one trial's rows)."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
            if self._abort_pending and not self._critical:
                self._abort_pending = False
                raise KeyboardInterrupt


class RunStopper(tune.Stopper):
    """Ends a Tune experiment when Ctrl-C was pressed, or (search phase) when the cell's compute budget is spent.

    Tune asks :meth:`stop_all` at every step of its loop (about every 0.1 s), so the budget is checked while
    trials run, counting their reserved seconds so far (:meth:`ResultsCallback.reserved`)."""

    def __init__(self, interrupt: Interrupt, echo: Echo, budget: Any = None):
        self.interrupt, self.echo, self.budget = interrupt, echo, budget
        self.callback: Any = None  # the experiment's ResultsCallback, whose reserved seconds the budget counts
        self.reason: str | None = None  # "interrupt" or "budget" once it stopped the experiment
        self.stopped_at: float | None = None

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def __reduce__(self) -> tuple:
        """Tune's experiment-state snapshots pickle the run config, this stopper with it (its echo and live
        callback cannot be pickled).  ursa-ray never restores a Tune experiment (a rerun resumes from its own
        results), so a snapshot holds a stopper that never stops."""
        return (NoopStopper, ())

    def stop_all(self) -> bool:
        if self.reason is not None:
            return True
        now = time.time()
        if self.interrupt.is_set():
            self.reason, self.stopped_at = "interrupt", now
            if not self.interrupt.announced:
                self.interrupt.announced = True
                self.echo(
                    "interrupted: stopping; finished trials are kept, running ones are not recorded "
                    "(Ctrl-C again to abort at once)"
                )
        elif (
            self.budget is not None and self.callback is not None and self.budget.exhausted(self.callback.reserved(now))
        ):
            self.reason, self.stopped_at = "budget", now
        return self.reason is not None
