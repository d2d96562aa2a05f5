"""Evaluation-set names: the one module that builds them and parses them (issue 28, item 3).

Every metric row names the set it was measured on (``eval_set`` in metrics.parquet).  The names form a
closed grammar, and each name has one *kind* (``eval_kind``, also a column of metrics.parquet):

==============  =================================  ==================================================
kind            name                               the set
==============  =================================  ==================================================
``in_domain``   ``test``                           the test split
``validation``  ``validation``                     held out of training for the search phase
``cost``        ``cost``                           not a set: the trial's time, FLOPs and storage
``ood``         ``NAME`` (no ``:`` or ``@``)       an OOD set the dataset declares, e.g. ``noise``
``bit_depth``   ``SET@SCHEME``                     ``test`` or an OOD set at a lower bit depth
``corruption``  ``corrupt:TYPE:SEVERITY``          the test set under a common corruption
``adversarial`` ``adv:ATTACK_epsE`` / ``adv:clean``  white-box adversarial examples of the test set
``transfer``    ``transfer:ATTACK_epsE`` / ...     examples crafted on an SGD source network
``fidelity``    ``fidelity:SET``                   ``test`` or an OOD set, against the reference
``reference``   ``reference:SET``                  the reference posterior's own noise floor
``members``     ``members:M``                      the test set under an ensemble's first M members
``calibrated``  ``SET@calibrated``                 ``SET`` (the test set, an OOD, corruption, ``adv:`` or
                                                   ``transfer:`` set) under the posterior predictive
                                                   tempered by the trial's fitted temperature
==============  =================================  ==================================================

A ``@calibrated`` set has a kind of its own, so that no table or composite of the raw set's kind ever
averages it in with the raw values: the report shows it as its own variant of the method
(``analysis.composites.final_metrics``).

A name outside this grammar (an unknown ``PREFIX:``, an unknown ``@SCHEME``, a reserved name used as an OOD
set) is refused with :class:`UnknownEvalSet`: a new kind of set must be added here, so that it never counts
as an OOD set by default.  A plain name is an OOD set because only a dataset's declared OOD sets have plain
names; anything else carries its kind's prefix or suffix.

Pure naming: this module imports nothing heavy, so that ``analysis/`` (which reads only Parquet) may use it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

EvalKind = Literal[
    "in_domain", "validation", "cost", "ood", "bit_depth", "corruption", "adversarial", "transfer", "fidelity",
    "reference", "members", "calibrated",
]  # fmt: skip
KINDS: tuple[EvalKind, ...] = (
    "in_domain", "validation", "cost", "ood", "bit_depth", "corruption", "adversarial", "transfer", "fidelity",
    "reference", "members", "calibrated",
)  # fmt: skip

TEST = "test"
VALIDATION = "validation"
COST = "cost"
CLEAN = "clean"
"""The attacked examples before the attack (``adv:clean``, ``transfer:clean``)."""
BIT_DEPTH_SCHEMES = ("float16", "bfloat16", "int8")
"""The ``@SCHEME`` suffixes: :data:`ursa_ray.evaluation.test_time_cost.QUANTISATION_SCHEMES` (a test keeps
the two equal; that module imports torch)."""
CALIBRATED = "calibrated"
"""The suffix of a set under the temperature-scaled predictive (``SET@calibrated``)."""
CALIBRATED_KINDS: tuple[EvalKind, ...] = ("in_domain", "ood", "corruption", "adversarial", "transfer")
"""The kinds of set that have a ``@calibrated`` twin."""
ATTACKS = ("fgsm", "pgd")
"""The attacks of ``adv:`` and ``transfer:`` sets (:data:`ursa_ray.evaluation.adversarial.ATTACKS`)."""

_PREFIX_KINDS: dict[str, EvalKind] = {
    "corrupt": "corruption",
    "adv": "adversarial",
    "transfer": "transfer",
    "fidelity": "fidelity",
    "reference": "reference",
    "members": "members",
}
_PLAIN_KINDS: dict[str, EvalKind] = {TEST: "in_domain", VALIDATION: "validation", COST: "cost"}
RESERVED_NAMES = tuple(_PLAIN_KINDS)
"""The plain names that are no OOD set: a dataset's OOD set may not be called so."""
_ATTACK_SET = re.compile(r"(?P<attack>[a-z0-9]+)_eps(?P<epsilon>.+)")


class UnknownEvalSet(ValueError):
    """An evaluation-set name outside the grammar of :mod:`ursa_ray.eval_sets`."""

    def __init__(self, name: str, why: str):
        super().__init__(f"evaluation set {name!r}: {why}")


@dataclass(frozen=True)
class EvalSet:
    """One parsed evaluation-set name.  ``base`` is the set whose examples it evaluates (``test`` for a
    corruption or attack, the OOD set's name for ``noise@int8``, the set itself for a plain name)."""

    name: str
    kind: EvalKind
    base: str
    scheme: str | None = None
    """Bit depth (``bit_depth``)."""
    corruption: str | None = None
    severity: int | None = None
    attack: str | None = None
    """``fgsm`` or ``pgd`` (``adversarial``, ``transfer``); None for the clean examples."""
    epsilon: float | None = None
    """The attack's ε in pixel units; 0 for the clean examples."""
    n_members: int | None = None
    """The ensemble members behind the predictive (``members``)."""
    raw: str | None = None
    """For a ``calibrated`` set, the name of the set it is the tempered twin of (the other fields are that
    set's: ``base``, ``corruption``, ``attack``, ...); None otherwise."""


# --------------------------------------------------------------------------------------------------
# Building


def bit_depth(base: str, scheme: str) -> str:
    """``SET@SCHEME``: ``base`` (``test`` or an OOD set) evaluated with the weights at bit depth ``scheme``."""
    return _checked(f"{base}@{scheme}")


def corruption(corruption_type: str, severity: int) -> str:
    """``corrupt:TYPE:SEVERITY``: the test set under one common corruption (Hendrycks & Dietterich 2019)."""
    return _checked(f"corrupt:{corruption_type}:{severity}")


def attack_set(attack: str, epsilon: float) -> str:
    """The name of one crafted set within an attack's sets, e.g. ``pgd_eps0.1`` (``%.6g`` of ε)."""
    return f"{attack}_eps{epsilon:.6g}"


def adversarial(crafted: str) -> str:
    """``adv:CRAFTED``: white-box examples, ``crafted`` being :func:`attack_set`'s name or ``clean``."""
    return _checked(f"adv:{crafted}")


def transfer(crafted: str) -> str:
    """``transfer:CRAFTED``: examples crafted on the SGD source network (:func:`adversarial`'s names)."""
    return _checked(f"transfer:{crafted}")


def fidelity(base: str) -> str:
    """``fidelity:SET``: a method's fidelity on ``base`` (``test`` or an OOD set) to its cell's reference."""
    return _checked(f"fidelity:{base}")


def reference(base: str) -> str:
    """``reference:SET``: the reference posterior's noise floor and convergence on ``base``."""
    return _checked(f"reference:{base}")


def members(n_members: int) -> str:
    """``members:M``: the test set under the predictive of an ensemble's first ``n_members`` members."""
    return _checked(f"members:{n_members}")


def calibrated(raw: str) -> str:
    """``SET@calibrated``: the set ``raw`` (a kind of :data:`CALIBRATED_KINDS`) under the posterior predictive
    tempered by the temperature fitted on the trial's validation split (``calibrate: temperature``)."""
    return _checked(f"{raw}@{CALIBRATED}")


def crafted_set(name: str) -> str:
    """The crafted set an ``adv:`` or ``transfer:`` name scores (:func:`attack_set`'s name, or ``clean``):
    what :func:`adversarial` and :func:`transfer` were built from."""
    parsed = parse(name)
    if parsed.kind not in ("adversarial", "transfer"):
        raise UnknownEvalSet(name, "not an adv: or transfer: set")
    return CLEAN if parsed.attack is None else attack_set(parsed.attack, float(parsed.epsilon or 0.0))


def _checked(name: str) -> str:
    parse(name)
    return name


# --------------------------------------------------------------------------------------------------
# Parsing


def parse(name: str) -> EvalSet:
    """The kind and parts of ``name``; :class:`UnknownEvalSet` for a name outside the grammar."""
    if not isinstance(name, str) or not name:
        raise UnknownEvalSet(str(name), "expected a non-empty string")
    if name.endswith(f"@{CALIBRATED}"):
        return _parse_calibrated(name)
    prefix, colon, rest = name.partition(":")
    if colon:
        if prefix not in _PREFIX_KINDS:
            raise UnknownEvalSet(name, f"unknown prefix {prefix + ':'!r}; known: {', '.join(_PREFIX_KINDS)}")
        return _parse_prefixed(name, _PREFIX_KINDS[prefix], rest)
    base, at, scheme = name.partition("@")
    if at:
        if scheme not in BIT_DEPTH_SCHEMES:
            raise UnknownEvalSet(name, f"unknown bit depth {scheme!r}; known: {', '.join(BIT_DEPTH_SCHEMES)}")
        _require_test_or_ood(name, base)
        return EvalSet(name, "bit_depth", base, scheme=scheme)
    return EvalSet(name, _PLAIN_KINDS.get(name, "ood"), name)


def eval_kind(name: str) -> EvalKind:
    """The kind of ``name`` (:data:`KINDS`); :class:`UnknownEvalSet` for a name outside the grammar."""
    return parse(name).kind


def kinds_by_name(names: Iterable[str]) -> dict[str, EvalKind]:
    """``{name: eval_kind(name)}`` for each distinct name of ``names`` (a column of metrics.parquet: each name
    is parsed once)."""
    return {name: eval_kind(name) for name in set(names)}


def is_ood_name(name: str) -> bool:
    """Whether ``name`` may name a dataset's OOD set: a plain name that no other kind reserves."""
    return bool(name) and ":" not in name and "@" not in name and name not in RESERVED_NAMES


def _parse_calibrated(name: str) -> EvalSet:
    raw = name[: -len(f"@{CALIBRATED}")]
    parsed = parse(raw)
    if parsed.kind not in CALIBRATED_KINDS:
        raise UnknownEvalSet(
            name, f"{raw!r} is a {parsed.kind} set; calibrated twins exist of {', '.join(CALIBRATED_KINDS)} sets"
        )
    return dataclasses.replace(parsed, name=name, kind="calibrated", raw=raw)


def _parse_prefixed(name: str, kind: EvalKind, rest: str) -> EvalSet:
    if kind == "corruption":
        corruption_type, _, severity = rest.partition(":")
        if not corruption_type or not severity.isdigit():
            raise UnknownEvalSet(name, "expected corrupt:TYPE:SEVERITY with an integer severity")
        return EvalSet(name, kind, TEST, corruption=corruption_type, severity=int(severity))
    if kind in ("adversarial", "transfer"):
        if rest == CLEAN:
            return EvalSet(name, kind, TEST, epsilon=0.0)
        match = _ATTACK_SET.fullmatch(rest)
        if match is None or match["attack"] not in ATTACKS or not _is_float(match["epsilon"]):
            raise UnknownEvalSet(name, f"expected {name.partition(':')[0]}:clean or ATTACK_epsE with ATTACK in "
                                 f"{', '.join(ATTACKS)}")  # fmt: skip
        return EvalSet(name, kind, TEST, attack=match["attack"], epsilon=float(match["epsilon"]))
    if kind == "members":
        if not rest.isdigit() or int(rest) < 1:
            raise UnknownEvalSet(name, "expected members:M with an integer M >= 1")
        return EvalSet(name, kind, TEST, n_members=int(rest))
    _require_test_or_ood(name, rest)  # fidelity:SET, reference:SET
    return EvalSet(name, kind, rest)


def _require_test_or_ood(name: str, base: str) -> None:
    if base != TEST and not is_ood_name(base):
        raise UnknownEvalSet(name, f"{base!r} is neither the test set nor an OOD set")


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
