"""Evaluation-set names (ursa_ray.eval_sets): every name built parses back to its kind and parts, a name
outside the grammar is refused, and the module stays a pure naming module (no torch, numpy or pandas)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ursa_ray import eval_sets
from ursa_ray.eval_sets import UnknownEvalSet, eval_kind, parse


def test_each_builder_parses_back_to_its_kind_and_parts():
    assert parse(eval_sets.bit_depth("noise", "int8")) == eval_sets.EvalSet("noise@int8", "bit_depth", "noise", "int8")
    got = parse(eval_sets.corruption("gaussian_noise", 3))
    assert (got.name, got.kind, got.base, got.corruption, got.severity) == (
        "corrupt:gaussian_noise:3", "corruption", "test", "gaussian_noise", 3,
    )  # fmt: skip
    got = parse(eval_sets.adversarial(eval_sets.attack_set("pgd", 1 / 16)))
    assert (got.name, got.kind, got.attack, got.epsilon) == ("adv:pgd_eps0.0625", "adversarial", "pgd", 0.0625)
    got = parse(eval_sets.transfer(eval_sets.CLEAN))
    assert (got.name, got.kind, got.attack, got.epsilon) == ("transfer:clean", "transfer", None, 0.0)
    assert parse(eval_sets.fidelity("digits_rotated")).base == "digits_rotated"
    assert eval_kind(eval_sets.reference("test")) == "reference"
    assert [eval_kind(n) for n in ("test", "validation", "cost", "noise")] == ["in_domain", "validation", "cost", "ood"]


@pytest.mark.parametrize(
    "name",
    [
        "calibration:test",  # a new kind's prefix, not registered
        "test@calibrated",  # a suffix that is no bit depth
        "adv:cw_eps0.1",  # an unknown attack
        "adv:pgd_epsx",
        "corrupt:gaussian_noise",  # no severity
        "corrupt:gaussian_noise:high",
        "fidelity:adv:clean",  # fidelity of a set that is neither test nor OOD
        "cost@int8",
        "",
    ],
)
def test_a_name_outside_the_grammar_is_refused_never_taken_for_ood(name):
    with pytest.raises(UnknownEvalSet, match="evaluation set"):
        eval_kind(name)


def test_builders_refuse_what_parse_refuses():
    with pytest.raises(UnknownEvalSet, match="unknown bit depth 'int4'"):
        eval_sets.bit_depth("test", "int4")


def test_the_naming_lists_match_the_modules_that_use_them():
    from ursa_ray.evaluation.adversarial import ATTACKS
    from ursa_ray.evaluation.test_time_cost import QUANTISATION_SCHEMES

    assert eval_sets.BIT_DEPTH_SCHEMES == QUANTISATION_SCHEMES
    assert eval_sets.ATTACKS == ATTACKS
    assert set(eval_sets.KINDS) == set(eval_sets.EvalKind.__args__)


def test_the_naming_module_imports_nothing_heavy():
    """analysis/ reads only Parquet and may import ursa_ray.eval_sets: it must not pull in torch."""
    code = "import sys, ursa_ray.eval_sets; print(sorted({'torch', 'numpy', 'pandas', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
