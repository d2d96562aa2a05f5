"""``ursa-ray run``'s Tune driver never imports torch (issue 26.14: torch is ~480 MB of the driver's resident
memory): the grid is checked in a child process (:func:`ursa_ray.api.check`) and the driver uses only the
checked grid, its final specs built once (docs/performance.md, "Driver memory per trial").

Each test runs a fresh interpreter: the test process itself has imported torch long before.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # fresh processes (and, for the run, a Ray): not in the fast tier

GRID = """\
name: tiny
methods: [sgd]
models: [{name: mlp, options: {widths: [8]}}]
datasets: [{name: e1, complexity: [1]}]
seeds: 1
budget: {epochs: 1, n_samples: 2}
"""
"""A regression cell with a complexity sweep: its cells need the sweep's option name, its specs the registries."""


def run_fresh(code: str, timeout: int) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_driver_uses_a_checked_grid_without_importing_torch(tmp_path):
    """Everything the driver asks of the grid (cells, resources, final specs, the results' fingerprint) is
    answered without the registries.  Fails when ursa_ray.grid imports a registry on import, when cells() looks up
    the sweep in the dataset registry, or when the final specs are rebuilt rather than kept."""
    (tmp_path / "g.yaml").write_text(GRID)
    out = run_fresh(
        f"""
        import sys
        from ursa_ray import api
        from ursa_ray.guard import grid_fingerprint
        from ursa_ray.tune.cluster import grid_requests
        from ursa_ray.tune.runner import run_grid

        grid = api.check({str(tmp_path / "g.yaml")!r})
        specs = grid.trial_specs("final", {{}})
        assert [s.dataset_options["complexity"] for s in specs] == [1], specs
        assert specs == grid.trial_specs() and specs is not grid.trial_specs()
        grid_requests(grid), grid_fingerprint(grid)
        print("torch imported:", "torch" in sys.modules)
        """,
        timeout=600,
    )
    assert "torch imported: False" in out


def test_ursa_ray_run_drives_tune_without_importing_torch(ray_session, tmp_path):
    """A whole ``ursa-ray run`` of a one-trial grid, then the driver's modules: the trial ran (in a Ray
    worker, which imports torch), the driver did not import it.  The driver joins the session's Ray
    (``--address``, as on a cluster): starting a Ray of its own imports no torch either, and costs seconds."""
    (tmp_path / "g.yaml").write_text(GRID)
    address = ray_session.get_runtime_context().gcs_address
    out = run_fresh(
        f"""
        import sys
        from ursa_ray.cli import main

        argv = ["run", {str(tmp_path / "g.yaml")!r}, "--out", {str(tmp_path / "out")!r}, "--progress", "log"]
        status = main(argv + ["--address", {address!r}])
        print("status:", status, "torch imported:", "torch" in sys.modules)
        """,
        timeout=900,
    )
    assert "status: 0 torch imported: False" in out


def test_the_report_modules_import_without_torch():
    """``ursa-ray report`` reads Parquet: its modules, the metrics and the saved-prediction tables import
    without torch or torchvision (~3 s of every report; a regression cell's named points still import the
    data module when the results have them).  Fails when a module the report imports pulls torch in on import."""
    out = run_fresh(
        """
        import sys
        import analysis.report, analysis.calibration_figures, analysis.corruption_shift
        import ursa_ray.evaluation.metrics, ursa_ray.evaluation.predictions
        print(sorted(m for m in ("torch", "torchvision") if m in sys.modules))
        """,
        timeout=120,
    )
    assert out.strip() == "[]"
