"""README's example grid is a grid `ursa-ray validate` accepts (with the data file it names)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ursa_ray.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


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
