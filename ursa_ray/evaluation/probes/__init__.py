"""Evaluation probes: each observes a trial's posterior samples and computes one family of metrics
(:class:`~ursa_ray.evaluation.probes.base.Probe`: ``observe(sample)``, ``compute()``, ``rows()``).

A new metric family is one module here with a ``probes(context) -> list[Probe]`` factory (empty where the
family does not apply to a trial) and its line in :data:`PROBES`.  The order of :data:`PROBES` is the
order in which every sample is observed: the bit-depth probe first (it restores the random generators, so
the float32 probes see the same dropout masks), then the float32 sets in the order
:func:`ursa_ray.prepare.prepare` made them (test or validation, OOD, corruptions), then the attacks, and last
temperature scaling's validation split (so that the other probes see the random generators as they would
without it).
"""

from __future__ import annotations

from collections.abc import Callable

from ursa_ray.evaluation.probes import (
    adversarial,
    bit_depth,
    calibration,
    corruptions,
    fidelity,
    in_domain,
    members,
    ood,
)
from ursa_ray.evaluation.probes.base import Probe, ProbeContext

PROBES: tuple[Callable[[ProbeContext], list[Probe]], ...] = (
    bit_depth.probes,
    in_domain.probes,
    members.probes,  # reads the test predictive in_domain fills
    ood.probes,
    corruptions.probes,
    adversarial.probes,
    fidelity.probes,
    calibration.probes,
)


def make_probes(context: ProbeContext) -> list[Probe]:
    """The probes of every registered family that applies to ``context.trial``, in :data:`PROBES` order."""
    return [probe for factory in PROBES for probe in factory(context)]
