"""The fidelity probe: the trial's posterior predictive on the test and OOD sets against its cell's stored
reference posterior (``fidelity:SET``, :meth:`ursa_ray.reference.Reference.metrics`; docs/fidelity.md)."""

from __future__ import annotations

from ursa_ray import data, eval_sets, reference
from ursa_ray.evaluation.probes.base import Probe, ProbeContext
from ursa_ray.results import Location
from ursa_ray.spec import TrialSpec


def scoring_reference(spec: TrialSpec, ds: data.base.Dataset) -> tuple[reference.Reference | None, str]:
    """(the reference that scores ``spec``'s trial, what it is for ``trials.parquet``'s ``reference_from``):
    the grid's file (``reference: {file: ...}``; ``file:SHA256`` of its bytes), else the one stored with this
    cell's fingerprint in ``spec.references_dir`` (the id of the reference trial that computed it); (None, "")
    when no such reference is stored (its reference trial failed)."""
    if "file" in spec.reference:
        return reference.file_reference(spec.reference), f"file:{spec.reference['sha256']}"
    key = reference.fingerprint(spec, spec.reference, reference.data_digest(ds))
    stored = reference.reference_location(Location.parse(spec.references_dir), key)
    if not stored.exists():
        return None, ""
    return reference.read_reference(stored), spec.reference_from or ""


class FidelityProbe(Probe):
    """``fidelity:SET`` metrics of the trial's predictive on the test and OOD sets against its cell's reference
    (:meth:`ursa_ray.reference.Reference.metrics`); none when the reference is missing.  Reads the
    predictives the in-domain and OOD probes accumulate; observes nothing itself.  ``reference_from``: what
    scored the trial (:func:`scoring_reference`), set by :meth:`compute`."""

    def __init__(self, context: ProbeContext) -> None:
        super().__init__()
        self.context = context
        self.reference_from = ""

    def compute(self) -> dict[str, dict[str, float]]:
        trial, accumulators = self.context.trial, self.context.predictives
        ref, self.reference_from = scoring_reference(trial.spec, trial.ds)
        if ref is None:
            return {}
        return {
            eval_sets.fidelity(name): ref.metrics(name, accumulators[name])
            for name in ref.pooled
            if name in accumulators
        }


def probes(context: ProbeContext) -> list[Probe]:
    """Final trials of a cell with a reference (from file, or computed and stored in a known folder), else none."""
    spec = context.trial.spec
    wanted = spec.phase == "final" and spec.reference is not None and ("file" in spec.reference or spec.references_dir)
    return [FidelityProbe(context)] if wanted else []
