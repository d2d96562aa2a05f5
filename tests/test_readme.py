"""README's example grid is a grid `ursa-ray validate` accepts (with the data file it names), and CI runs the test
command README gives a new user."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ursa_ray.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
CI = README.parent / ".ci" / "run"


def test_readme_example_grid_validates(tmp_path, capsys):
    block = re.search(r"```yaml\n(.*?)```", README.read_text(), re.S).group(1)
    (tmp_path / "data").mkdir()
    rng = np.random.default_rng(0)
    np.savez(
        tmp_path / "data" / "my.npz",
        x_train=rng.normal(size=(40, 5)),
        y_train=np.arange(40) % 3,
        x_test=rng.normal(size=(10, 5)),
        y_test=np.arange(10) % 3,
    )
    (tmp_path / "grid.yaml").write_text(block)
    assert main(["validate", str(tmp_path / "grid.yaml")]) == 0, capsys.readouterr().err
    assert "valid: 2 methods x 1 models x 3 datasets" in capsys.readouterr().out


def test_ci_runs_the_readme_test_command():
    """.ci/run's one command is README's second set-up block, word for word (fails if either drifts)."""
    readme_blocks = re.findall(r"```bash\n(.*?)\n```", README.read_text(), re.S)
    ci_commands = [
        line for line in CI.read_text().splitlines() if line.strip() and not line.startswith(("#", "set ", "cd "))
    ]
    assert ci_commands == [readme_blocks[1].strip()]
