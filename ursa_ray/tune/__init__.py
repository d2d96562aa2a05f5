"""Ray Tune orchestration: the trainable that wraps a trial, and the driver that runs a grid.

Nothing here knows a method's internals; nothing outside here imports Ray."""
