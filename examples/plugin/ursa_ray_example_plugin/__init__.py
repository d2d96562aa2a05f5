"""An example ursa-ray plug-in (docs/extending.md): the method ``temperature_sgd`` and the dataset
``two_moons``, registered through the entry points in this package's pyproject.toml."""
