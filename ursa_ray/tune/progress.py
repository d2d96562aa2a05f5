"""What the driver prints while a grid runs: one line per trial (logs), or one live status line (a terminal).

:class:`Progress` is an ``echo`` (``progress(line)`` prints a permanent line), so it travels everywhere the
driver's echo goes; the results callback (:class:`~ursa_ray.tune.callback.ResultsCallback`) also tells it when
trials start and finish.  Two modes:

- **log** (the default, and ``ursa-ray run --progress log``; what logs, CI and pytest capture get): every
  finished trial's line (``[3/8] ok     final ...``, ``[4/8] FAILED ...``), retries and phase lines, exactly as
  printed by ``echo``; nothing else.
- **line** (``--progress line``, or ``auto`` when stdout is a terminal): one status line rewritten in place
  (carriage return, then ``ESC[K`` to clear what is left of the old one)::

      final: 120/6800 done, 3 failed, 4 running, 6676 pending | 12m03s, ~5h10m left

  Failed trials, retries and every other echoed line are printed as permanent lines above it (the status
  line is cleared, the line written, the status line drawn again); finished trials that did not fail only
  change the counts.  The status line is redrawn at most every ``refresh_s`` seconds (Tune steps ten times a
  second), always after a permanent line, and left with a newline by :meth:`Progress.close` (before the
  run's summary lines, and on Ctrl-C).

Counts are of ursa-ray trials (seeds, the rows of ``trials.parquet``), not of Tune trials: a batched Tune
trial running three seeds counts three running, then three done.  They are the current Tune experiment's
(the final phase, or one search cell): each experiment starts the counts and the clock anew (:meth:`begin`).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable
from typing import TextIO

Echo = Callable[[str], None]

MODES = ("auto", "line", "log")


def _duration(seconds: float) -> str:
    """``42s``, ``12m03s``, ``5h10m``: a duration at the precision a person reads it."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    """The driver's progress output (see the module docstring).  ``echo``: where log mode's lines go;
    ``live``: the terminal stream of line mode (None: log mode); ``clock``: seconds (tests pass a fake one);
    ``width``: the terminal's columns (default: asked of the terminal at each redraw), the status line is
    cut to one less so it never wraps (a wrapped line cannot be rewritten with a carriage return)."""

    def __init__(
        self,
        echo: Callable[[str], None] = print,
        live: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        refresh_s: float = 0.25,
        width: int | None = None,
    ):
        self.echo, self.live, self.clock, self.refresh_s, self.width = echo, live, clock, refresh_s, width
        self.phase = ""
        self.total: int | None = None
        self.started = self.done = self.failed = 0
        self.t0 = clock()
        self.active = False  # an experiment has begun: there is a status to show
        self._drawn = False  # a status line is on the terminal (no newline after it yet)
        self._last_draw = float("-inf")

    @classmethod
    def for_stdout(cls, mode: str = "auto") -> Progress:
        """``mode``: ``line`` (a live status line on stdout), ``log`` (per-trial lines through ``print``) or
        ``auto`` (line when stdout is a terminal, else log)."""
        if mode not in MODES:
            raise ValueError(f"progress: expected one of {', '.join(MODES)}, got {mode!r}")
        if mode == "line" or (mode == "auto" and sys.stdout.isatty()):
            return cls(live=sys.stdout)
        return cls()

    def __reduce__(self) -> tuple:
        """Tune pickles its run config (the results callback, this with it) into its experiment folder; ursa-ray
        never restores from it, and a terminal stream cannot be pickled: a copy is a fresh log-mode Progress."""
        return (Progress, ())

    # -- what the driver tells it ---------------------------------------------------------------------------

    def __call__(self, line: str) -> None:
        """A permanent line (a phase line, a retry, a failed trial, Ctrl-C's notice)."""
        if self.live is None:
            self.echo(line)
            return
        self._clear()
        self.live.write(line + "\n")
        if self.active:
            self._draw()
        else:
            self.live.flush()

    def begin(self, total: int | None) -> None:
        """A Tune experiment starts: ``total`` trials (None: a budgeted search, no fixed count)."""
        self.total, self.started, self.done, self.failed = total, 0, 0, 0
        self.t0 = self.clock()
        self.active = True

    def trial_started(self, n_specs: int, phase: str) -> None:
        """A Tune trial of ``n_specs`` seeds started (once per Tune trial, not again on a retry)."""
        self.started += n_specs
        self.phase = phase
        self.tick()

    def trial_recorded(self, status: str, line: str) -> None:
        """One seed's outcome was written: ``line`` is its log line (``[3/8] ok ...``); in line mode only a
        failure's line is printed, as a permanent line."""
        self.done += 1
        if status == "failed":
            self.failed += 1
        if self.live is None:
            self.echo(line)
        elif status == "failed":
            self(line)
        else:
            self.tick()

    def end(self) -> None:
        """The Tune experiment ended: trials still running were not recorded (Ctrl-C), so none runs now."""
        self.started = self.done
        if self._drawn:
            self._draw()

    def tick(self) -> None:
        """Redraw the status line if ``refresh_s`` has passed since the last redraw (each Tune step calls this)."""
        if self.live is not None and self.active and self.clock() - self._last_draw >= self.refresh_s:
            self._draw()

    def close(self) -> None:
        """End the status line with a newline (before the run's summary lines, and on Ctrl-C)."""
        if self.live is not None and self._drawn:
            self._draw()
            self.live.write("\n")
            self.live.flush()
            self._drawn = False

    # -- the status line ------------------------------------------------------------------------------------

    def eta(self) -> float | None:
        """Seconds until the experiment's last trial is done, estimated as the trials not yet done × (elapsed ÷
        trials done): the experiment's own throughput so far, which counts the concurrency Ray actually gave
        it, the scheduling overheads and the failures alike, with no model of any of them.  None before the
        first trial is done (nothing to extrapolate from), after the last, and without a fixed count (a
        budgeted search).  Trials still running count as not done, so early on, with every slot busy, it errs
        long by at most one trial's duration."""
        if self.total is None or self.done == 0 or self.done >= self.total:
            return None
        return (self.total - self.done) * (self.clock() - self.t0) / self.done

    def status(self) -> str:
        """The status line's text."""
        running = max(0, self.started - self.done)
        counts = f"{self.done}/{self.total} done" if self.total is not None else f"{self.done} done"
        counts += f", {self.failed} failed, {running} running"
        if self.total is not None:
            counts += f", {max(0, self.total - self.done - running)} pending"
        eta = self.eta()
        left = "" if eta is None else f", ~{_duration(eta)} left"
        return f"{self.phase or 'trials'}: {counts} | {_duration(self.clock() - self.t0)}{left}"

    def _draw(self) -> None:
        assert self.live is not None
        width = self.width or shutil.get_terminal_size((100, 24)).columns
        self.live.write("\r" + self.status()[: max(1, width - 1)] + "\x1b[K")
        self.live.flush()
        self._drawn = True
        self._last_draw = self.clock()

    def _clear(self) -> None:
        assert self.live is not None
        if self._drawn:
            self.live.write("\r\x1b[K")
            self._drawn = False
