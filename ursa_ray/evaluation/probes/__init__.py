"""Evaluation probes: each observes the posterior samples of a trial and computes one family of metrics."""
