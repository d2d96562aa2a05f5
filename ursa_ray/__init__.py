"""ursa-ray: benchmarking approximate Bayesian inference for deep networks on Ray Tune.

``ursa_ray.run(grid, out=..., address=None)`` and ``ursa_ray.load(out)`` are the Python API
(:mod:`ursa_ray.api`), imported on first use so that ``import ursa_ray`` stays light in Ray workers.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["load", "run"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from ursa_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'ursa_ray' has no attribute {name!r}")
