"""Where a cell's reference posterior comes from (docs/fidelity.md): per-cell ``reference`` blocks, a reference
from file (``reference: {file: PATH}``: the stored-reference or saved-predictions Parquet layout, or the NeurIPS
2021 competition's CSV) and a store shared between results directories (``reference: {dir: PATH}``)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import yaml

from ursa_ray.cli import main
from ursa_ray.grid import parse_grid

LIGHT = {
    "budget": {"epochs": 1},
    "bit_depths": [],
    "corruptions": {"types": []},
    "adversarial": {"attacks": ["fgsm"], "n_examples": 20, "attack_samples": 1, "transfer": False},
}
SHORT = {"chains": 2, "n_samples": 10, "burn_in": 5, "prior_std": 0.5, "n_leapfrog": 5}
DIGITS = {"name": "digits", "ood": ["digits_inverted"]}
GRID = {
    "name": "refsrc",
    "methods": ["sgd"],
    "models": [{"name": "mlp", "options": {"widths": [16]}}],
    "datasets": [DIGITS],
    "seeds": 1,
    **LIGHT,
}
N_TEST, N_CLASSES = 360, 10  # digits' test set as ursa-ray loads it (and digits_inverted, its inverted copy)


def test_per_cell_blocks_give_each_cell_the_first_block_that_matches_it():
    grid = parse_grid(
        {
            **GRID,
            "models": ["mlp", "linear"],
            "datasets": ["digits", "digits_imbalanced"],
            "reference": [
                {"models": ["mlp"], "datasets": ["digits"], **SHORT},
                {"datasets": ["digits"], **SHORT, "chains": 3},
            ],
        }
    )
    specs = grid.trial_specs()
    given = {(s.model, s.dataset): s.reference for s in specs if s.phase == "final"}
    assert given[("mlp", "digits")] == SHORT
    assert given[("linear", "digits")] == {**SHORT, "chains": 3}
    assert given[("mlp", "digits_imbalanced")] is None and given[("linear", "digits_imbalanced")] is None
    references = [s for s in specs if s.phase == "reference"]
    assert sorted(s.cell for s in references) == ["reference/linear/digits", "reference/mlp/digits"]
    linked = {s.model: s.reference_from for s in specs if s.phase == "final" and s.dataset == "digits"}
    by_model = {s.model: s.trial_id for s in references}
    assert linked == by_model
    assert all(s.reference_from is None for s in specs if s.dataset == "digits_imbalanced")


def test_a_single_block_may_select_cells_too_and_a_file_block_has_no_reference_trial(tmp_path):
    probs = tmp_path / "probs.csv"
    np.savetxt(probs, np.full((N_TEST, N_CLASSES), 0.1), delimiter=",")
    grid = parse_grid({**GRID, "models": ["mlp", "linear"], "reference": {"models": ["linear"], "file": str(probs)}})
    specs = grid.trial_specs()
    assert not [s for s in specs if s.phase == "reference"]
    given = {s.model: s.reference for s in specs}
    assert given["mlp"] is None and given["linear"]["file"] == str(probs) and len(given["linear"]["sha256"]) == 64


def test_a_trial_id_follows_its_references_content_not_where_it_is(tmp_path):
    """A final trial's fidelity rows depend on its cell's reference: a changed file (or prior) is a new trial, and
    a new grid for the results directory's guard; a moved file or another store (``dir``) is not."""

    def final_ids(reference: dict) -> list[str]:
        return [s.trial_id for s in parse_grid({**GRID, "reference": reference}).trial_specs()]

    for name, value in (("a.csv", 0.1), ("b.csv", 0.1), ("c.csv", 0.2)):
        np.savetxt(tmp_path / name, np.full((N_TEST, N_CLASSES), value), delimiter=",")
    moved = final_ids({"file": str(tmp_path / "a.csv")})
    assert moved == final_ids({"file": str(tmp_path / "b.csv")})
    assert moved != final_ids({"file": str(tmp_path / "c.csv")})
    assert (
        final_ids({**SHORT, "dir": "/a"}) == final_ids({**SHORT, "dir": "/b"}) != final_ids({**SHORT, "rhat_max": 1.2})
    )
    assert parse_grid(GRID).trial_specs()[0].trial_id not in final_ids(SHORT)


def _digits_test_labels() -> np.ndarray:
    from ursa_ray.data import get_dataset

    return get_dataset("digits").load({}, (), None, False, 0).test_y.numpy()


def _confident(labels: np.ndarray) -> np.ndarray:
    """Probabilities 0.91 on each example's label, 0.01 on the other classes: a reference in the set's order."""
    probs = np.full((labels.size, N_CLASSES), 0.01)
    probs[np.arange(labels.size), labels] = 0.91
    return probs


def test_file_and_dir_paths_are_taken_from_the_grid_files_folder(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    (folder / "refs").mkdir(parents=True)
    np.savetxt(folder / "refs" / "probs.csv", _confident(_digits_test_labels()), delimiter=",")
    grid_file = folder / "grid.yaml"
    grid_file.write_text(yaml.safe_dump({**GRID, "reference": {"file": "refs/probs.csv"}}))
    monkeypatch.chdir(tmp_path)  # elsewhere than the grid file
    assert main(["validate", str(grid_file)]) == 0
    from ursa_ray.grid import load_grid

    assert load_grid(grid_file).references[0].settings["file"] == str(folder / "refs" / "probs.csv")
    grid_file.write_text(yaml.safe_dump({**GRID, "reference": {"dir": "../store", **SHORT}}))
    assert load_grid(grid_file).references[0].settings == {**SHORT, "dir": str(tmp_path / "store")}


def test_a_blocks_resources_are_its_reference_trials_alone_and_change_no_id_or_fingerprint():
    """``resources`` in a block is the reference trial's request (each key over the cell's); the method trials
    keep theirs, and no trial id or reference fingerprint changes with it (it says where the reference runs,
    not what it is)."""
    from ursa_ray import reference

    plain = parse_grid({**GRID, "reference": SHORT}).trial_specs()
    wide = parse_grid({**GRID, "reference": {**SHORT, "resources": {"cpu": 2}}}).trial_specs()
    assert [s.trial_id for s in wide] == [s.trial_id for s in plain]
    (ref,) = [s for s in wide if s.phase == "reference"]
    assert ref.resources["cpu"] == 2 and all(s.resources["cpu"] == 1 for s in wide if s.phase == "final")
    assert ref.resources["gpu"] == plain[0].resources["gpu"]  # the keys the block leaves out are the cell's
    digest = "0" * 64
    assert reference.fingerprint(ref, ref.reference, digest) == reference.fingerprint(ref, plain[0].reference, digest)
    assert reference.hmc_config(ref.reference) == reference.hmc_config(plain[0].reference)


def test_a_reference_request_no_node_can_place_is_refused_before_any_trial(ray_session, tmp_path):
    """A block's ``resources`` beyond every node is refused in one line naming the reference trial, as a
    method's is (Ray would otherwise wait forever), and nothing runs."""
    import ursa_ray
    from ursa_ray.grid import GridError

    grid = {**GRID, "reference": {**SHORT, "resources": {"cpu": 64}}}
    with pytest.raises(
        GridError, match=r"resources: the reference trial on model 'mlp' asks for CPU=64, which no node"
    ):
        ursa_ray.run(grid, out=tmp_path / "out", echo=lambda line: None)
    assert not (tmp_path / "out" / "trials.parquet").exists()


def _bad(tmp_path, block, files=None):
    """The grid file of GRID with ``reference: block``, written beside ``files`` (arrays as CSV, frames as Parquet)."""
    for name, frame in (files or {}).items():
        if isinstance(frame, np.ndarray):
            np.savetxt(tmp_path / name, frame, delimiter=",")
        else:
            frame.to_parquet(tmp_path / name)
    grid = tmp_path / "bad.yaml"
    grid.write_text(yaml.safe_dump({**GRID, "reference": block}))
    return grid


def _stored_layout(sets: dict[str, int], classes: int = N_CLASSES) -> pd.DataFrame:
    frames = []
    for name, n in sets.items():
        frame = pd.DataFrame(np.full((n, classes), 1 / classes), columns=[f"p{k}" for k in range(classes)])
        frame.insert(0, "example", np.arange(n))
        frame.insert(0, "chain", -1)
        frame.insert(0, "eval_set", name)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


UNIFORM = np.full((N_TEST, N_CLASSES), 0.1)


@pytest.mark.parametrize(
    ("block", "files", "message"),
    [
        ({"models": ["resnet50"], **SHORT}, None, "reference.models: 'resnet50' is not among the grid's models: mlp"),
        ({"datasets": ["mnist"]}, None, "reference.datasets: 'mnist' is not among the grid's datasets: digits"),
        (
            [{"datasets": ["digits"]}, {"models": ["mlp"]}],
            None,
            "reference[1]: gives no cell its reference: it matches no classification (model, dataset)",
        ),
        ({"file": "probs.csv", "chains": 2}, None, "reference.chains: a reference from file is not computed"),
        ({**SHORT, "resources": {"cpu": 0}}, None, "reference.resources.cpu: "),
        ({"file": "missing.csv"}, None, "reference.file: {tmp}/missing.csv: no such file"),
        ({"file": "probs.txt"}, {"probs.txt": UNIFORM}, "reference.file: {tmp}/probs.txt: expected a .parquet or .csv"),
        (
            {"file": "probs.csv"},
            {"probs.csv": UNIFORM[:100]},
            "reference.file: {tmp}/probs.csv: test: 100 examples of 10 classes; the cell's test set has 360 "
            "examples of 10 classes",
        ),
        (
            {"file": "probs.csv"},
            {"probs.csv": np.full((N_TEST, 5), 0.2)},
            "reference.file: {tmp}/probs.csv: test: 360 examples of 5 classes; the cell's test set has 360",
        ),
        (
            {"file": "probs.csv"},
            {"probs.csv": np.full((N_TEST, N_CLASSES), 0.2)},
            "reference.file: {tmp}/probs.csv: test: row 0 is not a probability vector",
        ),
        (
            [{"datasets": ["digits"], "file": "ref.parquet"}],
            {"ref.parquet": _stored_layout({"test": N_TEST, "svhn": N_TEST})},
            "reference[0].file: {tmp}/ref.parquet: set 'svhn' is not evaluated on this cell (its sets: test, "
            "digits_inverted)",
        ),
        (
            {"file": "ref.parquet"},
            {"ref.parquet": _stored_layout({"digits_inverted": N_TEST})},
            "reference.file: {tmp}/ref.parquet: has no test set",
        ),
    ],
)
def test_a_bad_reference_block_or_file_is_one_line_naming_the_field_and_nothing_is_written(
    tmp_path, capsys, block, files, message
):
    grid = _bad(tmp_path, block, files)
    assert main(["run", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{grid}: {message.format(tmp=tmp_path)}" in err, err
    assert not (tmp_path / "out").exists()


def test_a_saved_prediction_table_in_another_example_order_is_refused_by_its_labels(tmp_path, capsys):
    """A saved prediction table carries the test labels: the right order passes the check, the same table with
    its rows renumbered (another example order) is refused in one line before anything is written."""
    from ursa_ray import reference
    from ursa_ray.data import get_dataset

    labels = get_dataset("digits").load({}, (), None, False, 0).test_y.numpy()
    table = pd.DataFrame(UNIFORM, columns=[f"p{k}" for k in range(N_CLASSES)])
    table.insert(0, "label", labels)
    table.insert(0, "index", np.arange(N_TEST))
    table.to_parquet(tmp_path / "saved.parquet")
    reference.check_reference_labels(reference.file_test_labels(str(tmp_path / "saved.parquet")), labels)
    shifted = table.assign(index=np.roll(np.arange(N_TEST), 1))
    grid = _bad(tmp_path, {"file": "shifted.parquet"}, {"shifted.parquet": shifted})
    assert main(["run", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    expected = f"{grid}: reference.file: {tmp_path}/shifted.parquet: test: its labels differ from the cell's test set"
    assert len(err.splitlines()) == 1 and expected in err and "another example order" in err, err
    assert not (tmp_path / "out").exists()


def test_a_csv_in_another_example_order_is_refused_by_its_agreement_with_the_labels(tmp_path, capsys):
    """A CSV carries no labels: probabilities that put 0.91 on each test example's label pass the order check,
    the same rows shifted by one example (another order: top-1 agreement near chance) are refused in one line
    before anything is written."""
    from ursa_ray import reference

    labels = _digits_test_labels()
    confident = _confident(labels)
    reference.check_reference_order(confident, labels)
    grid = _bad(tmp_path, {"file": "shifted.csv"}, {"shifted.csv": np.roll(confident, 1, axis=0)})
    assert main(["run", str(grid), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    expected = f"{grid}: reference.file: {tmp_path}/shifted.csv: test: its top-1 predictions match the cell's test"
    assert len(err.splitlines()) == 1 and expected in err and "another example order" in err, err
    assert not (tmp_path / "out").exists()


def test_the_order_check_against_its_hand_case():
    """p₀ = Σ_c f̂_c f_c: 40 labels, 20 of class 0 and 20 of class 1, every prediction class 0: p₀ = 1/2, and 20
    agreements of 40 are what chance gives (refused); 30 of 40 right with balanced predictions: one-sided
    binomial p = 0.0011 > 1e-3 (refused); 31 of 40: p = 0.0003 (accepted)."""
    from ursa_ray.reference import ReferenceFileError, check_reference_order

    labels = np.repeat([0, 1], 20)
    with pytest.raises(ReferenceFileError, match="20 of 40 examples"):
        check_reference_order(np.tile([0.9, 0.1], (40, 1)), labels)
    for right, refused in ((30, True), (31, False)):
        predicted = labels.copy()
        wrong = 40 - right
        predicted[: wrong // 2] = 1  # balanced mistakes: predicted frequencies stay 1/2, 1/2 (odd: one more 0)
        predicted[20 : 20 + wrong - wrong // 2] = 0
        probs = np.eye(2)[predicted] * 0.8 + 0.1
        if refused:
            with pytest.raises(ReferenceFileError, match="no more than in a random order"):
                check_reference_order(probs, labels)
        else:
            check_reference_order(probs, labels)


def test_reading_the_three_file_layouts(tmp_path):
    from ursa_ray.reference import ReferenceFileError, read_reference_file

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=7)
    np.savetxt(tmp_path / "probs.csv", probs, delimiter=",", fmt="%.18e")  # the competition's layout
    np.testing.assert_array_equal(read_reference_file(str(tmp_path / "probs.csv"))["test"], probs)
    saved = pd.DataFrame(probs, columns=[f"p{k}" for k in range(4)])
    saved.insert(0, "label", 0)
    saved.insert(0, "index", np.arange(7))
    saved["total_entropy"] = 0.0
    saved.iloc[::-1].to_parquet(tmp_path / "saved.parquet")  # rows out of order: ``index`` orders them
    np.testing.assert_array_equal(read_reference_file(str(tmp_path / "saved.parquet"))["test"], probs)
    stored = _stored_layout({"test": 7, "ood": 3}, classes=4)
    stored.loc[stored.eval_set == "test", ["p0", "p1", "p2", "p3"]] = probs
    chain0 = stored[stored.eval_set == "test"].assign(chain=0, p0=1.0, p1=0.0, p2=0.0, p3=0.0)
    pd.concat([chain0, stored]).to_parquet(tmp_path / "stored.parquet")  # chain rows are not the pooled ones
    sets = read_reference_file(str(tmp_path / "stored.parquet"))
    assert set(sets) == {"test", "ood"} and sets["ood"].shape == (3, 4)
    np.testing.assert_array_equal(sets["test"], probs)
    saved.drop(columns="p2").to_parquet(tmp_path / "gap.parquet")
    with pytest.raises(ReferenceFileError, match="p0, p1, ..., p{K-1}"):
        read_reference_file(str(tmp_path / "gap.parquet"))
    saved.assign(index=0).to_parquet(tmp_path / "index.parquet")
    with pytest.raises(ReferenceFileError, match="index must number the examples"):
        read_reference_file(str(tmp_path / "index.parquet"))


@pytest.mark.slow
def test_a_reference_from_file_scores_as_the_computed_one_it_was_written_from(tmp_path):
    """The computed reference's pooled test predictive written as the competition's CSV and as a saved prediction
    table, and the stored file itself (test and OOD), give the method's trial the same fidelity metrics; its
    rows carry ``reference_from_file`` instead of R̂, ESS, noise floor and ``converged``, and the report says so."""
    from analysis.fidelity import fidelity_markdown
    from ursa_ray.results import Location
    from ursa_ray.trial import run_trial, stored_or_computed

    grid = parse_grid({**GRID, "reference": SHORT})
    spec = next(s for s in grid.trial_specs() if s.phase == "final")
    store = Location.parse(tmp_path / "references")
    computed, _ = stored_or_computed(spec, spec.reference, store)

    def fidelity_rows(reference: dict, references_dir: str | None) -> dict:
        outcome = run_trial(dataclasses.replace(spec, reference=reference, references_dir=references_dir))
        rows = [m for m in outcome.metrics if m["eval_set"].startswith("fidelity:")]
        scored_by.append(outcome.record["reference_from"])
        return {(m["eval_set"], m["metric"]): m["value"] for m in rows}, rows

    scored_by: list[str] = []
    against_computed, _ = fidelity_rows(spec.reference, store.uri)
    assert spec.reference_from and scored_by == [spec.reference_from]  # the reference trial that computed it
    scores = [(s, m) for s, m in against_computed if m in ("agreement", "total_variation", "kl")]
    assert len(scores) == 6 and against_computed[("fidelity:test", "total_variation")] > 0

    probs = computed.pooled["test"]
    np.savetxt(tmp_path / "probs.csv", probs, delimiter=",", fmt="%.18e")
    saved = pd.DataFrame(probs, columns=[f"p{k}" for k in range(N_CLASSES)])
    saved.insert(0, "index", np.arange(N_TEST))
    saved.sample(frac=1.0, random_state=0).to_parquet(tmp_path / "saved.parquet")
    stored_file = tmp_path / "references" / f"{computed.fingerprint}.parquet"
    for name, sets in (("probs.csv", ["fidelity:test"]), ("saved.parquet", ["fidelity:test"]), (stored_file, None)):
        from_file, rows = fidelity_rows({"file": str(tmp_path / name), "sha256": "0" * 64}, None)
        expected = [(s, m) for s, m in scores if sets is None or s in sets]
        assert expected and {k: from_file[k] for k in expected} == {k: against_computed[k] for k in expected}, name
        assert all(from_file[(s, "reference_from_file")] == 1.0 for s, _ in expected)
        assert not {m for _, m in from_file} & {"rhat_max", "ess_bulk_min", "converged", "noise_total_variation"}
        assert scored_by[-1] == "file:" + "0" * 64

    trials = pd.DataFrame([{"trial_id": spec.trial_id, "phase": "final", "status": "ok", "task": "classification",
                            "method": "sgd", "model": "mlp", "dataset": "digits", "seed": 0}])  # fmt: skip
    metrics = pd.DataFrame(rows).assign(eval_kind="fidelity")
    text, _ = fidelity_markdown(metrics, trials, tmp_path / "figures")
    assert "Reference from file: no convergence check" in text and "R̂ max" not in text and "Warning" not in text
    assert not math.isnan(float(text.split("| sgd |")[1].split("|")[0]))


@pytest.mark.slow
def test_a_shared_store_is_reused_by_another_results_directory_and_a_changed_prior_recomputes(ray_session, tmp_path):
    import ursa_ray

    store = tmp_path / "shared"

    def run(out: str, prior_std: float) -> tuple[pd.DataFrame, pd.DataFrame]:
        grid = {**GRID, "reference": {**SHORT, "prior_std": prior_std, "dir": str(store)}}
        summary = ursa_ray.run(grid, out=tmp_path / out, echo=lambda line: None)
        assert not summary.failed, summary.failed
        assert not (tmp_path / out / "references").exists()  # the block's dir, not the results' references/
        trials, metrics = (pd.read_parquet(tmp_path / out / f"{t}.parquet") for t in ("trials", "metrics"))
        computed = metrics[(metrics.phase == "reference") & (metrics.metric == "computed")].value
        scored = metrics[(metrics.phase == "final") & (metrics.eval_set == "fidelity:test")]
        return trials[trials.phase == "reference"], computed.tolist(), scored.set_index("metric").value

    first, computed, scores = run("one", 0.5)
    assert computed == [1.0] and first.train_s.iloc[0] > 0 and len(list(store.glob("*.parquet"))) == 1
    second, computed, again = run("two", 0.5)
    assert computed == [0.0] and second.train_s.iloc[0] == 0.0 and len(list(store.glob("*.parquet"))) == 1
    assert again["rhat_max"] == scores["rhat_max"] and again["noise_total_variation"] == scores["noise_total_variation"]
    _, computed, _ = run("three", 0.25)
    assert computed == [1.0] and len(list(store.glob("*.parquet"))) == 2
