"""The fidelity probe: the trial's posterior predictive on the test and OOD sets against its cell's stored
reference posterior (``fidelity:SET``, :meth:`ursa_ray.reference.Reference.metrics`; docs/fidelity.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ursa_ray import data, eval_sets, reference
from ursa_ray.evaluation.probes.base import Probe, ProbeContext
from ursa_ray.results import Location
from ursa_ray.spec import TrialSpec


def _fidelity(spec: TrialSpec, ds: data.base.Dataset, accumulators: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``fidelity:SET`` metrics of the trial's predictive on the test and OOD sets against its cell's reference
    (:meth:`ursa_ray.reference.Reference.metrics`): the grid's file (``reference: {file: ...}``), else the one
    stored with this cell's fingerprint in ``spec.references_dir``; none when no such reference is stored (its
    reference trial failed)."""
    if "file" in spec.reference:
        ref = reference.file_reference(spec.reference)
    else:
        key = reference.fingerprint(spec, spec.reference, reference.data_digest(ds))
        stored = reference.reference_location(Location.parse(spec.references_dir), key)
        if not stored.exists():
            return {}
        ref = reference.read_reference(stored)
    return {
        eval_sets.fidelity(name): ref.metrics(name, accumulators[name]) for name in ref.pooled if name in accumulators
    }


class FidelityProbe(Probe):
    """Reads the predictives the in-domain and OOD probes accumulate; observes nothing itself."""

    def __init__(self, context: ProbeContext) -> None:
        super().__init__()
        self.context = context

    def compute(self) -> dict[str, dict[str, float]]:
        return _fidelity(self.context.trial.spec, self.context.trial.ds, self.context.predictives)


def probes(context: ProbeContext) -> list[Probe]:
    """Final trials of a cell with a reference (from file, or computed and stored in a known folder), else none."""
    spec = context.trial.spec
    wanted = spec.phase == "final" and spec.reference is not None and ("file" in spec.reference or spec.references_dir)
    return [FidelityProbe(context)] if wanted else []
