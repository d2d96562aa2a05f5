"""Ray Tune orchestration: the trainable that wraps a trial, the trial-running machinery both phases use
(:mod:`ursa_ray.tune.trials`, with its callback, interrupt, queue and cluster modules), the search phase
(:mod:`ursa_ray.tune.search`) and the driver that runs a grid (:mod:`ursa_ray.tune.runner`).

Nothing here knows a method's internals; nothing outside here imports Ray.

Tune reads these settings when it is first imported, so they are set here, before any module of this package
imports Ray, whichever of them is imported first.
"""

import os

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
os.environ.setdefault("TUNE_PRINT_ALL_TRIAL_ERRORS", "0")  # a retried or failed trial is one line of ours
# A failed search trial reports no selection metric (it has none): an ordinary outcome, recorded as failed and
# told to the searcher as pruned (see ursa_ray.tune.search), not a reason for Tune to abort the whole run.
os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
# Tune snapshots its experiment state (every trial's JSON, some 24 KB a trial) to restore an experiment from; ursa-ray
# never restores one (a rerun resumes from its own results), and the snapshot's cost grows with the trials so far:
# every 10 minutes (and Tune's forced one at the experiment's end) instead of Tune's "auto" (every 10 s or more),
# see docs/performance.md, "The driver on large grids".
os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "600")
