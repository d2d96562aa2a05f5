"""The corruption probe: in-domain metrics on the test images under each common corruption and severity
(``corrupt:TYPE:SEVERITY``, made by :func:`ursa_ray.prepare.corrupted_sets`; docs/corruptions.md)."""

from __future__ import annotations

from ursa_ray import eval_sets
from ursa_ray.evaluation.probes.base import Probe, ProbeContext
from ursa_ray.evaluation.probes.in_domain import LabelledSetsProbe


def probes(context: ProbeContext) -> list[Probe]:
    """One probe over the trial's corrupted sets, none when it has none."""
    names = [n for n in context.trial.eval_sets if eval_sets.eval_kind(n) == "corruption"]
    return [LabelledSetsProbe(context, names)] if names else []
