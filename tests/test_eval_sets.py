"""Evaluation-set names (ursa_ray.eval_sets): every name built parses back to its kind and parts, a name
outside the grammar is refused, and the module stays a pure naming module (no torch, numpy or pandas)."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ursa_ray import eval_sets
from ursa_ray.eval_sets import UnknownEvalSet, eval_kind, parse
from ursa_ray.results import ResultsDirectory


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


@pytest.mark.parametrize("raw", ["test", "noise", "corrupt:rotate:3", "adv:pgd_eps0.0625", "transfer:clean"])
def test_a_calibrated_set_is_a_kind_of_its_own_that_keeps_its_raw_sets_parts(raw):
    """``SET@calibrated`` is never of ``SET``'s kind (no table of that kind may average it in) and names it."""
    got = parse(eval_sets.calibrated(raw))
    assert (got.name, got.kind, got.raw) == (f"{raw}@calibrated", "calibrated", raw)
    assert dataclasses.replace(got, name=raw, kind=parse(raw).kind, raw=None) == parse(raw)


def test_an_attack_sets_crafted_name_builds_it_back():
    for crafted in ("clean", eval_sets.attack_set("pgd", 1 / 16), eval_sets.attack_set("fgsm", 8 / 255)):
        for build in (eval_sets.adversarial, eval_sets.transfer):
            assert eval_sets.crafted_set(build(crafted)) == crafted
    with pytest.raises(UnknownEvalSet, match="not an adv: or transfer: set"):
        eval_sets.crafted_set("corrupt:rotate:3")


@pytest.mark.parametrize(
    "name",
    [
        "calibration:test",  # a new kind's prefix, not registered
        "test@float8",  # a suffix that is no bit depth
        "noise@int8@calibrated",  # temperature scaling's twin of a kind that has none
        "cost@calibrated",
        "validation@calibrated",
        "fidelity:test@calibrated",
        "test@calibrated@calibrated",
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


QUICKSTART = Path("/tmp/qs_a19")  # the quickstart's results at a19ab6b, before the eval_kind column


def test_metric_rows_are_written_with_their_kind(tmp_path):
    results = ResultsDirectory(tmp_path)
    key = {"trial_id": "t", "method": "sgd", "model": "mlp", "dataset": "digits", "seed": 0, "phase": "final"}
    names = ["test", "noise", "noise@int8", "corrupt:rotate:3", "adv:clean", "transfer:pgd_eps0.0625", "cost"]
    results.add({"trial_id": "t", "status": "ok"}, [{**key, "eval_set": n, "metric": "m", "value": 1.0} for n in names])
    metrics = results.read("metrics")
    assert metrics.set_index("eval_set")["eval_kind"].to_dict() == {
        "test": "in_domain", "noise": "ood", "noise@int8": "bit_depth", "corrupt:rotate:3": "corruption",
        "adv:clean": "adversarial", "transfer:pgd_eps0.0625": "transfer", "cost": "cost",
    }  # fmt: skip
    part = pq.read_table(next((tmp_path / "metrics.parquet").rglob("t.parquet")))
    assert part.column("eval_kind").null_count == 0  # written, not only derived when read
    with pytest.raises(UnknownEvalSet, match="calibration:test"):
        results.add({"trial_id": "u", "status": "ok"}, [{**key, "eval_set": "calibration:test", "metric": "m"}])


@pytest.mark.skipif(not QUICKSTART.exists(), reason="the quickstart's results at a19ab6b are not on this machine")
def test_every_set_of_the_quickstart_has_a_kind_even_when_read_from_before_the_column(tmp_path):
    """Every eval_set the quickstart wrote parses; its metrics.parquet has no eval_kind, which reading derives."""
    assert "eval_kind" not in pq.read_schema(next((QUICKSTART / "metrics.parquet").rglob("*.parquet"))).names
    shutil.copytree(QUICKSTART / "metrics.parquet", tmp_path / "metrics.parquet", symlinks=False)
    metrics = ResultsDirectory(tmp_path).read("metrics")
    kinds = metrics.groupby("eval_set")["eval_kind"].unique().map(list).to_dict()
    assert all(len(k) == 1 for k in kinds.values()) and metrics["eval_kind"].notna().all()
    by_kind = metrics.groupby("eval_kind")["eval_set"].nunique().to_dict()
    # 1 test; 3 OOD sets; (test + 3 OOD) x 3 bit depths; 10 corruption types x 3 severities; clean + 2 attacks x 4 ε
    assert by_kind == {
        "in_domain": 1, "ood": 3, "bit_depth": 12, "corruption": 30, "adversarial": 9, "transfer": 9, "cost": 1,
    }  # fmt: skip
    assert set(metrics.loc[metrics["eval_kind"] == "ood", "eval_set"]) == {"digits_inverted", "digits_rotated", "noise"}


@pytest.mark.parametrize("name", ["test", "cost", "validation", "adv:clean", "noise@int8"])
def test_a_file_dataset_may_not_name_an_ood_set_as_another_kind(tmp_path, name):
    """The OOD set names a file block may give are plain names no other kind reserves, so every row of
    theirs is written with kind ood."""
    from ursa_ray.data.files import FileDatasetError, parse_file_settings

    (tmp_path / "d.npz").write_bytes(b"")
    with pytest.raises(FileDatasetError, match="an OOD set name is letters, digits, '_' and '-', not test, valid"):
        parse_file_settings(
            {"format": "npz", "path": "d.npz", "task": "classification", "ood": {name: "d.npz"}}, tmp_path
        )
    assert eval_kind("my-set_2") == "ood" and not eval_sets.is_ood_name(name)
