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


@pytest.fixture
def stream_calls(monkeypatch):
    """(runs fed, batched) of every posterior stream ``ursa_ray.trial`` drives from here on: a batched stream
    feeds several seeds' runs at once (:func:`ursa_ray.trial.run_trials_batched`), a lone one feeds one."""
    import ursa_ray.trial as trial_module

    calls: list[tuple[int, bool]] = []
    stream_into = trial_module._stream_into

    def spy(runs, stream, batched_stream, progress=None):
        calls.append((len(runs), batched_stream))
        return stream_into(runs, stream, batched_stream, progress)

    monkeypatch.setattr(trial_module, "_stream_into", spy)
    return calls
