"""Shared fixtures: one small local Ray for the whole test session."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        temp = tempfile.mkdtemp(prefix="ur", dir="/tmp")
        ray.init(
            address="local",  # never join a cluster a user started with `ray start` on this machine
            num_cpus=2,
            object_store_memory=256 * 1024**2,
            include_dashboard=False,
            log_to_driver=False,
            logging_level="ERROR",
            _temp_dir=temp,
        )
    yield ray
