"""A cell's reference posterior predictive: multi-chain full-batch HMC, its checks, and its stored form.

The reference of a (model, dataset) cell is the existing :mod:`~ursa_ray.methods.hmc` method run with the
grid's reference settings (``chains`` → ``n_chains``, ``n_samples`` per chain, ``burn_in``, ``prior_std``,
``temperature``, and any other HMC hyperparameter) through the same :class:`~ursa_ray.trial.TrialRun` as
every trial (:func:`ursa_ray.trial.compute_reference`; same data, model, likelihood and device; phase ``reference``: the test set and every OOD set,
no corruptions, attacks or bit depths).  The chains run batched where the network is small (HMC's
``n_chains``).  Its stream yields, at each post-burn-in iteration, chain 1's sample, then chain 2's, ...;
each sample's outputs on every evaluation set are added online to the pooled accumulator of the trial and
to one accumulator per chain (:class:`~ursa_ray.evaluation.ClassificationPredictive` /
:class:`~ursa_ray.evaluation.RegressionPredictive`), so memory does not grow with the samples -- except
for the convergence check, which needs the draws themselves: the predictive probabilities (regression:
predicted means) of the first :data:`N_DIAGNOSTIC_EXAMPLES` test examples, per chain and draw.

Checks (:mod:`~ursa_ray.evaluation.fidelity`): the split-R̂ and bulk ESS of those per-example quantities,
and the noise floor on every evaluation set: the fidelity of the first half of the chains' predictive to
the second half's.

Stored form: one Parquet file ``references/<fingerprint>.parquet`` in the results directory, written
atomically (:meth:`~ursa_ray.results.Location.write_parquet`), with one row per (eval_set, chain, example):
``chain`` −1 is the pooled predictive, 0..C−1 the chains; classification columns ``p0..p{K−1}``, regression
``mean`` and ``std``.  The file's Parquet metadata key ``ursa_ray.reference`` holds JSON: fingerprint, task,
settings, convergence, noise floors and cost.  The fingerprint (:func:`fingerprint`) hashes everything the
reference depends on, so a changed prior, model or data is another file; the store is the results directory's
``references/`` folder, or the block's ``dir`` (a store shared between results directories).

A reference from file (the grid's ``reference: {file: PATH}``, :func:`read_reference_file`): per-example
predictive probabilities computed elsewhere, pooled only -- no chains, so no R̂, ESS or noise floor
(:attr:`Reference.convergence` None; its fidelity rows say ``reference_from_file`` instead).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.stats import binomtest

from ursa_ray.data.base import Dataset
from ursa_ray.evaluation import fidelity
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Hyperparameter, resolve_config
from ursa_ray.results import Location
from ursa_ray.spec import REFERENCE_LOCATION_KEYS, TrialSpec

N_DIAGNOSTIC_EXAMPLES = 25
"""Test examples whose per-draw predictive probabilities (all classes) the convergence check monitors."""

SETTINGS_DEFAULTS: dict[str, Any] = {"method": "hmc", "chains": 4, "n_samples": 400, "burn_in": 200, "seed": 0}
"""Reference settings a grid may leave out (``prior_std`` and ``temperature`` default to HMC's own)."""

METADATA_KEY = b"ursa_ray.reference"


FILE_SUFFIXES = (".parquet", ".csv")
"""The files a ``reference: {file: PATH}`` may be (:func:`read_reference_file`)."""

PROBABILITY_TOLERANCE = 1e-3
"""How far a file's row of probabilities may sum from 1 (the competition's CSV holds float32 values)."""

OWN_SETTINGS = (
    Hyperparameter("method", str, "hmc", "the reference's sampler (the existing full-batch HMC)", choices=("hmc",)),
    Hyperparameter("chains", int, 4, "chains (at least 2: R-hat and the noise floor compare chains)", low=2),
    Hyperparameter(
        "seed", int, 0, "the reference trial's seed (its data, initialisations, draws)", low=0, high=2**31 - 1
    ),
    Hyperparameter(
        "rhat_max", float, fidelity.RHAT_MAX, "converged only when the largest split-R-hat is at most this", low=1.0
    ),
    Hyperparameter(
        "ess_min", float, fidelity.ESS_MIN, "converged only when the smallest bulk ESS is at least this", low=0.0
    ),
)
"""The reference's own settings; every HMC hyperparameter but ``n_chains`` may be given too."""


def declared_settings() -> tuple[Hyperparameter, ...]:
    """Every key a grid's ``reference`` block may hold: :data:`OWN_SETTINGS` and HMC's hyperparameters
    (``n_samples`` per chain, ``burn_in``, ``prior_std``, ``temperature``, ...) except ``n_chains``."""
    return OWN_SETTINGS + tuple(h for h in get_method("hmc").hyperparameters if h.name != "n_chains")


MAX_FULL_BATCH_BYTES = 512 * 2**20
"""Largest full-batch memory estimate (:func:`full_batch_bytes`) of a cell a grid may ask a reference for."""


def full_batch_bytes(n_train: int, input_size: int, n_params: int, n_chains: int) -> int:
    """A lower estimate of a reference's memory: the training inputs, float32, resident (n_train × input
    size × 4 bytes), plus each chain's parameters, gradient and momentum (3 × 4 bytes each); activations of
    the full-batch pass come on top."""
    return 4 * n_train * input_size + 12 * n_params * n_chains


def hmc_config(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The HMC configuration of the reference: ``chains`` as ``n_chains``, every other setting except
    ``method``, ``seed`` and the convergence thresholds as the HMC hyperparameter of that name."""
    own = {"method", "seed", "chains", "rhat_max", "ess_min", *REFERENCE_LOCATION_KEYS}
    given = {k: v for k, v in {**SETTINGS_DEFAULTS, **settings}.items() if k not in own}
    return resolve_config(get_method("hmc"), {**given, "n_chains": int({**SETTINGS_DEFAULTS, **settings}["chains"])})


def fingerprint(spec: TrialSpec, settings: Mapping[str, Any], data_digest: str) -> str:
    """sha256 (first 16 hex digits) of what a reference depends on: dataset, its options and file block
    (paths left out; ``data_digest`` hashes the tensors themselves), model and options, the task (so the
    likelihood), the resolved HMC configuration (prior, temperature, chains, samples, burn-in...), the
    reference's seed and thresholds; not where it is stored (``dir``)."""
    settings = what_it_is(settings)
    identity = {
        "dataset": spec.dataset,
        "dataset_options": spec.dataset_options,
        "dataset_file": {k: v for k, v in (spec.dataset_file or {}).items() if k not in ("path", "ood")},
        "ood": list(spec.ood),
        "model": spec.model,
        "model_options": spec.model_options,
        "task": spec.task,
        "config": hmc_config(settings),
        "settings": {**SETTINGS_DEFAULTS, **settings},
        "data": data_digest,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def what_it_is(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` without the keys that say where the reference is stored or runs
    (:data:`~ursa_ray.spec.REFERENCE_LOCATION_KEYS`)."""
    return {k: v for k, v in settings.items() if k not in REFERENCE_LOCATION_KEYS}


def data_digest(ds: Dataset) -> str:
    """sha256 of a loaded dataset's training inputs and labels, test inputs and OOD inputs (in name order)."""
    h = hashlib.sha256()
    tensors = [ds.train_x, ds.train_y, ds.test_x] + [ds.ood[name] for name in sorted(ds.ood)]
    for t in tensors:
        h.update(str(tuple(t.shape)).encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def reference_spec(spec: TrialSpec, settings: Mapping[str, Any]) -> TrialSpec:
    """The trial spec of a cell's reference, from any final spec of the cell: method ``hmc`` with
    :func:`hmc_config`, phase ``reference``, the block's ``resources`` over the cell's, the reference's own
    seed, nothing attacked or calibrated (the reference conditions on the whole training set); its pooled
    predictive saved when the grid saves predictions (``save_predictions``)."""
    merged = {**SETTINGS_DEFAULTS, **settings}
    return dataclasses.replace(
        spec,
        method="hmc",
        label="reference",
        phase="reference",
        resources={**spec.resources, **settings.get("resources", {})},
        seed=int(merged["seed"]),
        config=hmc_config(settings),
        save_predictions=spec.save_predictions,
        bit_depths=(),
        calibrate=None,
        transfer_source=False,
        transfer_examples=None,
    )


@dataclass
class Reference:
    """A computed or stored reference: pooled and per-chain predictives by evaluation set (classification
    (n, K) / (C, n, K) probabilities; regression (n, 2) / (C, n, 2) columns mean, std), its checks and cost.
    A reference from file (:func:`file_reference`) has no chains, no noise floor and ``convergence`` None."""

    fingerprint: str
    task: str
    pooled: dict[str, np.ndarray]
    chains: dict[str, np.ndarray]
    convergence: fidelity.Convergence | None
    """None: a reference from file, which has no chains to check."""
    noise_floor: dict[str, dict[str, float]]
    settings: dict[str, Any] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)

    def metrics(self, eval_set: str, accumulator: Any) -> dict[str, float]:
        """A method's fidelity on ``eval_set`` (its accumulated predictive) beside the reference's noise floor
        (``noise_*``) and checks (``rhat_max``, ``ess_bulk_min``, ``converged``); a reference from file has
        neither and says ``reference_from_file`` = 1 instead."""
        ref = self.pooled[eval_set]
        if self.task == "classification":
            scores = fidelity.classification_fidelity(ref, accumulator.mean_probs)
        else:
            scores = fidelity.regression_fidelity(ref[:, 0], ref[:, 1], accumulator.mean, accumulator.std)
        return {**scores, **self.checks(eval_set)}

    def checks(self, eval_set: str) -> dict[str, float]:
        """The reference's noise floor on ``eval_set`` (``noise_*``) and its convergence (``rhat_max``,
        ``ess_bulk_min``, ``converged``), as every fidelity row of that set carries them."""
        floor = {f"noise_{k}": v for k, v in self.noise_floor.get(eval_set, {}).items()}
        checks = {"reference_from_file": 1.0} if self.convergence is None else self.convergence.as_metrics()
        return {**floor, **checks}

    def to_table(self) -> pa.Table:
        frames = []
        columns = None
        for name, pooled in self.pooled.items():
            for chain, values in [(-1, pooled)] + list(enumerate(self.chains[name])):
                if columns is None:
                    columns = (
                        [f"p{k}" for k in range(values.shape[1])] if self.task == "classification" else ["mean", "std"]
                    )
                frame = pd.DataFrame(values, columns=columns)
                frame.insert(0, "example", np.arange(len(frame)))
                frame.insert(0, "chain", chain)
                frame.insert(0, "eval_set", name)
                frames.append(frame)
        table = pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False)
        meta = {
            "fingerprint": self.fingerprint,
            "task": self.task,
            "settings": self.settings,
            "convergence": self.convergence.as_metrics(),
            "noise_floor": self.noise_floor,
            "cost": self.cost,
        }
        return table.replace_schema_metadata(
            {**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta, default=str).encode()}
        )

    @classmethod
    def from_table(cls, table: pa.Table) -> Reference:
        meta = json.loads(table.schema.metadata[METADATA_KEY])
        frame = table.to_pandas()
        value_columns = [c for c in frame.columns if c not in ("eval_set", "chain", "example")]
        pooled, chains = {}, {}
        for name, rows in frame.groupby("eval_set", sort=False):
            rows = rows.sort_values(["chain", "example"])
            pooled[name] = rows[rows.chain == -1][value_columns].to_numpy(np.float64)
            per_chain = rows[rows.chain >= 0]
            n_chains = per_chain.chain.nunique()
            chains[name] = per_chain[value_columns].to_numpy(np.float64).reshape(n_chains, -1, len(value_columns))
        c = meta["convergence"]
        return cls(
            meta["fingerprint"],
            meta["task"],
            pooled,
            chains,
            fidelity.Convergence(c["rhat_max"], c["ess_bulk_min"], bool(c["converged"])),
            meta["noise_floor"],
            meta["settings"],
            meta["cost"],
        )


def reference_location(references: Location, key: str) -> Location:
    """Where the reference of fingerprint ``key`` lives in a ``references/`` folder."""
    return references / f"{key}.parquet"


def read_reference(location: Location) -> Reference:
    if location.is_local:
        return Reference.from_table(pq.read_table(location.local_path))
    return Reference.from_table(pq.read_table(location.path, filesystem=location.fs))


class ReferenceFileError(ValueError):
    """A reference file that cannot be used; the message says what is wrong with it (not where it is)."""


def read_reference_file(path: str) -> dict[str, np.ndarray]:
    """The per-example predictive probabilities of a reference file, (n, K) float64 by evaluation set:

    - ``.csv``: the NeurIPS 2021 approximate-inference competition's release (``probs.csv``): no header, one
      row per test example, K comma-separated probabilities; the test set only.
    - ``.parquet`` with an ``eval_set`` column: the stored reference layout (one row per eval_set, chain,
      example; :meth:`Reference.to_table`): the pooled rows (``chain`` −1 where there is a ``chain`` column),
      ordered by ``example``; every set it names.
    - ``.parquet`` without: a saved prediction table (``predictions/<trial>__test.parquet``,
      :func:`ursa_ray.evaluation.predictions.prediction_table`): the test set, ordered by ``index``.

    Columns ``p0..p{K−1}``; each row's probabilities non-negative, summing to 1 within
    :data:`PROBABILITY_TOLERANCE`.  A file that breaks these raises :class:`ReferenceFileError`."""
    if not Path(path).is_file():
        raise ReferenceFileError("no such file")
    if not path.endswith(FILE_SUFFIXES):
        raise ReferenceFileError(f"expected a {' or '.join(FILE_SUFFIXES)} file")
    try:
        if path.endswith(".csv"):
            sets = {"test": np.loadtxt(path, delimiter=",", ndmin=2, dtype=np.float64)}
        else:
            sets = _parquet_sets(pd.read_parquet(path))
    except (ValueError, OSError, pa.ArrowException) as exc:
        raise ReferenceFileError(f"cannot read it: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    for name, probs in sets.items():
        _check_probabilities(name, probs)
    return sets


def _parquet_sets(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The probabilities by set of a Parquet reference file (:func:`read_reference_file`'s two layouts)."""
    numbered = sorted((int(c[1:]), c) for c in frame.columns if isinstance(c, str) and c[:1] == "p" and c[1:].isdigit())
    if not numbered or [k for k, _ in numbered] != list(range(len(numbered))):
        raise ReferenceFileError("expected probability columns p0, p1, ..., p{K-1}")
    columns = [c for _, c in numbered]
    if "eval_set" not in frame.columns:
        return {"test": _ordered(frame, "index", columns)}
    if "chain" in frame.columns:
        frame = frame[frame["chain"] == -1]
        if frame.empty:
            raise ReferenceFileError("has a chain column but no pooled rows (chain -1)")
    return {str(name): _ordered(rows, "example", columns) for name, rows in frame.groupby("eval_set", sort=False)}


def _ordered(rows: pd.DataFrame, order: str, columns: list[str]) -> np.ndarray:
    """``rows``' probabilities in the order of their ``order`` column, which must number them 0..n−1 (no column:
    the rows' own order)."""
    if order in rows.columns:
        rows = rows.sort_values(order)
        if not np.array_equal(rows[order].to_numpy(), np.arange(len(rows))):
            raise ReferenceFileError(f"column {order} must number the examples 0..n-1, each once")
    return rows[columns].to_numpy(np.float64)


def _check_probabilities(name: str, probs: np.ndarray) -> None:
    if probs.ndim != 2 or probs.shape[0] == 0 or probs.shape[1] < 2:
        raise ReferenceFileError(f"{name}: expected one row per example of at least 2 class probabilities")
    sums = probs.sum(axis=1)
    bad = np.flatnonzero(~np.isfinite(sums) | (probs.min(axis=1) < 0) | (np.abs(sums - 1) > PROBABILITY_TOLERANCE))
    if bad.size:
        raise ReferenceFileError(
            f"{name}: row {bad[0]} is not a probability vector (non-negative, summing to 1 within "
            f"{PROBABILITY_TOLERANCE:g}; it sums to {sums[bad[0]]:.6g})"
        )


def check_reference_sets(sets: Mapping[str, np.ndarray], sizes: Mapping[str, int], n_classes: int) -> None:
    """Refuse probabilities that do not fit a cell: a set other than its evaluation sets (``sizes``: examples by
    set, ``test`` and its OOD sets), no ``test`` set, or a set whose examples or classes differ from the cell's."""
    if "test" not in sets:
        raise ReferenceFileError(f"has no test set (sets in the file: {', '.join(sets)})")
    for name, probs in sets.items():
        if name not in sizes:
            raise ReferenceFileError(f"set {name!r} is not evaluated on this cell (its sets: {', '.join(sizes)})")
        if probs.shape != (sizes[name], n_classes):
            raise ReferenceFileError(
                f"{name}: {probs.shape[0]:,} examples of {probs.shape[1]} classes; the cell's {name} set has "
                f"{sizes[name]:,} examples of {n_classes} classes"
            )


def file_test_labels(path: str) -> np.ndarray | None:
    """The test labels a reference file carries, in its example order: a saved prediction table's ``label``
    column ordered by ``index``; None for the other layouts, which carry none (call after
    :func:`read_reference_file` has accepted the file)."""
    if not path.endswith(".parquet"):
        return None
    frame = pd.read_parquet(path)
    if "eval_set" in frame.columns or "label" not in frame.columns:
        return None
    return frame.sort_values("index")["label"].to_numpy(np.int64) if "index" in frame else frame["label"].to_numpy()


def check_reference_labels(labels: np.ndarray | None, test_labels: np.ndarray) -> None:
    """Refuse a file whose test labels (:func:`file_test_labels`) differ from the cell's test set, example by
    example: the predictions of another dataset, or of this one in another order."""
    if labels is None:
        return
    differ = np.flatnonzero(labels != np.asarray(test_labels))
    if differ.size:
        i = int(differ[0])
        raise ReferenceFileError(
            f"test: its labels differ from the cell's test set at {differ.size:,} of {labels.size:,} examples "
            f"(first: example {i}, label {labels[i]} in the file, {int(test_labels[i])} in the set): another "
            "dataset, or another example order"
        )


ORDER_TEST_LEVEL = 1e-3
"""Level of :func:`check_reference_order`'s one-sided test."""


def check_reference_order(probs: np.ndarray, test_labels: np.ndarray) -> None:
    """Refuse test probabilities without labels (a CSV, the stored layout) whose top-1 predictions agree with
    the cell's test labels no more than in a random order: k agreements of n, against the binomial with
    p₀ = Σ_c f̂_c f_c, the agreement expected when the file's predicted-class frequencies f̂ meet the set's
    label frequencies f in a random pairing (scipy.stats.binomtest, one-sided, level
    :data:`ORDER_TEST_LEVEL`).  A reference in the set's order scores far above p₀ (a posterior predictive at
    90% accuracy on 10 balanced classes: 0.9 against 0.1), so only another order, another dataset or a
    predictive no better than chance is refused."""
    labels = np.asarray(test_labels, dtype=np.int64)
    predicted = probs.argmax(axis=1)
    k = probs.shape[1]
    chance = float(np.bincount(predicted, minlength=k) @ np.bincount(labels, minlength=k)) / labels.size**2
    agree = int((predicted == labels).sum())
    p_value = binomtest(agree, labels.size, min(chance, 1.0), alternative="greater").pvalue
    if p_value > ORDER_TEST_LEVEL:
        raise ReferenceFileError(
            f"test: its top-1 predictions match the cell's test labels at {agree:,} of {labels.size:,} examples, "
            f"no more than in a random order ({chance:.1%} expected, one-sided binomial p = {p_value:.2g}): "
            "another example order, another dataset, or a predictive no better than chance"
        )


def file_reference(settings: Mapping[str, Any]) -> Reference:
    """The reference of a ``reference: {file: PATH}`` block (``settings``: ``file``, ``sha256``): its pooled
    probabilities (:func:`read_reference_file`), no chains, checks or noise floor."""
    pooled = read_reference_file(settings["file"])
    return Reference(f"file:{settings['sha256'][:16]}", "classification", pooled, {}, None, {}, dict(settings))
