"""``ursa-ray validate``'s time under two versions of the code, side by side: the quickstart and a grid of the
quickstart's 38 cells with 2,631 seeds, 99,978 final trials (validation counts trials without building them).

Each repetition runs both codes in fresh processes, alternating which goes first (old-new, new-old, ...), and
each process reports its phases: the imports (the registries' packages bring torch), reading and checking the
grid (``load_grid``, which also loads the registered methods, models and datasets on first use; ``load_grid
warm``: the median of 20 more calls in the same process, the schema's own cost), its data (``check_data``:
loading the datasets, building the reference's models) and every cell's configuration (``Grid.check_cells``),
then the whole command as a user runs it (``main(["validate", GRID])`` in a fresh process).  Prints the median of each phase per code and the ratio new/old; run it under
``flock /tmp/ursa-cpu.lock`` with ``benchmarks/host_speed.py`` before and after on a shared host.

    python benchmarks/bench_validate.py --old /work/main --new . [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PHASES = ("imports", "load_grid", "load_grid warm", "check_data", "check_cells", "command")
PROBE = """
import json, sys, time
start = time.perf_counter()
from ursa_ray import data, methods, models  # the registries, torch with them
from ursa_ray.grid import check_data, load_grid
t_import = time.perf_counter()
grid = load_grid(sys.argv[1])
t_load = time.perf_counter()
check_data(grid)
t_data = time.perf_counter()
grid.check_cells()
t_cells = time.perf_counter()
assert grid.n_final_trials() == int(sys.argv[2]), grid.n_final_trials()
warm = []
for _ in range(20):
    t = time.perf_counter()
    load_grid(sys.argv[1])
    warm.append(time.perf_counter() - t)
print(json.dumps({"imports": t_import - start, "load_grid": t_load - t_import, "check_data": t_data - t_load,
                  "check_cells": t_cells - t_data, "load_grid warm": sorted(warm)[10]}))
"""
COMMAND = "import sys; from ursa_ray.cli import main; sys.exit(main(['validate', sys.argv[1]]))"


def grids(folder: Path, root: Path) -> dict[str, tuple[Path, int]]:
    """{label: (grid file, its final trials)}: the quickstart, and its cells with 100,000 final trials."""
    quickstart = root / "grids" / "quickstart.yaml"
    raw = yaml.safe_load(quickstart.read_text())
    raw["seeds"] = 100_000 // 38  # 38 cells
    raw["max_trials"] = 100_000
    large = folder / "quickstart_100k.yaml"
    large.write_text(yaml.safe_dump(raw, sort_keys=False))
    return {"quickstart": (quickstart, 76), "100k trials": (large, 38 * raw["seeds"])}


def run_once(code: Path, grid: Path, trials: int) -> dict[str, float]:
    """One fresh process's phases, then one fresh process's whole ``validate`` command, under ``code``."""
    env = {**os.environ, "PYTHONPATH": str(code.resolve())}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, str(grid), str(trials)], env=env, capture_output=True, text=True, check=True
    )
    times = json.loads(probe.stdout.strip().splitlines()[-1])
    start = os.times().elapsed
    subprocess.run([sys.executable, "-c", COMMAND, str(grid)], env=env, capture_output=True, check=True)
    times["command"] = os.times().elapsed - start
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the root of the old code (e.g. /work/main)")
    parser.add_argument("--new", type=Path, default=Path("."), help="the root of the new code")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for label, (grid, trials) in grids(Path(folder), args.new).items():
            runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
            for i in range(args.repeat):
                order = ("old", "new") if i % 2 == 0 else ("new", "old")
                for which in order:
                    runs[which].append(run_once(getattr(args, which), grid, trials))
            print(f"{label} ({trials:,} final trials), median of {args.repeat} per code, seconds:")
            for phase in PHASES:
                old, new = (statistics.median(r[phase] for r in runs[w]) for w in ("old", "new"))
                print(f"  {phase:15s} old {old:7.4f}  new {new:7.4f}  new/old {new / old:5.2f}")


if __name__ == "__main__":
    main()
