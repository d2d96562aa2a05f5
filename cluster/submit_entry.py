"""Entry script for ``ray submit``: runs ``ursa-ray run`` on the cluster's head node.

    ray submit cluster/local.yaml cluster/submit_entry.py -- grids/small_scale.yaml --out /shared/results/small_scale

``ray submit`` copies this file to ``~/submit_entry.py`` on the head and runs ``python ~/submit_entry.py ARGS``
there (in the home directory), so:

- a relative grid path that does not exist in the current directory is looked up in the ursa-ray checkout
  the head has installed (``pip install -e``), or in ``$URSA_RAY_HOME``;
- ``--address auto`` is added unless ARGS name an address: the driver joins the cluster on this node;
- give ``--out`` an absolute path on storage every node sees (trials write their rows under ``OUT/ray/``).

It exits with ``ursa-ray run``'s status: 0 all ok, 1 some trials failed, 2 a bad grid or a grid the cluster
cannot place, 130 interrupted (submit the same command again to resume).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def project_roots() -> list[Path]:
    """Where a relative grid path may live: $URSA_RAY_HOME, then the installed ursa-ray checkout."""
    roots = []
    if os.environ.get("URSA_RAY_HOME"):
        roots.append(Path(os.environ["URSA_RAY_HOME"]).expanduser())
    try:
        import ursa_ray

        roots.append(Path(ursa_ray.__file__).resolve().parents[1])
    except ImportError:
        pass
    return roots


def build_argv(args: list[str]) -> list[str]:
    """The ``ursa-ray`` argv for ``submit_entry.py ARGS``."""
    args = list(args)
    if args and not args[0].startswith("-"):
        grid = Path(args[0]).expanduser()
        if not grid.is_absolute() and not grid.exists():
            for root in project_roots():
                if (root / grid).is_file():
                    grid = root / grid
                    break
        args[0] = str(grid)
    if not any(a == "--address" or a.startswith("--address=") for a in args):
        args += ["--address", "auto"]
    return ["run", *args]


def main(argv: list[str] | None = None) -> int:
    from ursa_ray.cli import main as ursa_ray_main

    return ursa_ray_main(build_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
