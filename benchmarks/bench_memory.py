"""Peak memory of a trial with S = 200 posterior samples ÷ with S = 10 (target ≤ 1.1).

The trial is MNIST-sized: an MLP 784-200-200-10 on MNIST-format files (random images written in the real
IDX format to a temporary data root), evaluated on a 10,000-image test set and two 10,000-image OOD sets.
Storing every sample's predictions would cost S × 30,000 × 10 floats (240 MB at S = 200); accumulating the
posterior predictive online costs nothing per sample.  Each run is a fresh subprocess; we report its peak
resident set size (ru_maxrss) and the peak growth over the process's size just before the trial.

    python benchmarks/bench_memory.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CHILD = r"""
import json, resource, sys
import torch
from ursa_ray.grid import parse_grid
from ursa_ray.trial import run_trial
n_samples = int(sys.argv[1])
grid = parse_grid({
    "name": "memory", "methods": [{"name": "mc_dropout", "hyperparameters": {"p": 0.2}}],
    "models": [{"name": "mlp", "options": {"widths": [200, 200]}}],
    "datasets": [{"name": "mnist", "ood": ["fashion_mnist", "kmnist"]}],
    "seeds": [0], "budget": {"epochs": 1, "n_samples": n_samples, "batch_size": 128},
}, "memory")
spec = grid.trial_specs()[0]
torch.set_num_threads(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
run_trial(spec)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "peak_kib": peak}))
"""


def write_data(root: Path, n_train: int, n_test: int) -> None:
    from ursa_ray.data._vision_files import write_mnist_family

    rng = np.random.default_rng(0)
    for name in ("mnist", "fashion_mnist", "kmnist"):
        write_mnist_family(
            root,
            name,
            rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n_train, dtype=np.uint8),
            rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
            rng.integers(0, 10, n_test, dtype=np.uint8),
        )


def measure(n_samples: int, root: Path) -> dict[str, int]:
    env = {**os.environ, "URSA_DATA": str(root), "URSA_SKIP_CHECKSUMS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(n_samples)], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="S = 10 vs 50 on smaller sets")
    args = parser.parse_args()
    small, large = (10, 50) if args.quick else (10, 200)
    with tempfile.TemporaryDirectory(prefix="ursa-mem") as folder:
        root = Path(folder)
        write_data(root, n_train=2_000, n_test=2_000 if args.quick else 10_000)
        low, high = measure(small, root), measure(large, root)
    peak_ratio = high["peak_kib"] / low["peak_kib"]
    growth_low = low["peak_kib"] - low["before_kib"]
    growth_high = high["peak_kib"] - high["before_kib"]
    print(f"peak RSS, S={small}: {low['peak_kib'] / 1024:.0f} MiB; S={large}: {high['peak_kib'] / 1024:.0f} MiB")
    print(f"peak memory ratio S={large} / S={small}: {peak_ratio:.3f} (target <= 1.1)")
    print(f"growth during the trial: S={small}: {growth_low / 1024:.1f} MiB; S={large}: {growth_high / 1024:.1f} MiB")


if __name__ == "__main__":
    main()
