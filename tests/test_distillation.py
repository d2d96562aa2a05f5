"""Posterior distillation (``bdk``, ``gped``): the student against a fixed teacher on the digits data, GPED's
expected-entropy head and the mutual information it hands to the evaluation, BDK's teacher against the exact
posterior of Bayesian linear regression while the student trains, and the cost accounting."""

from __future__ import annotations

import dataclasses
from functools import cache

import numpy as np
import pytest
import torch
from exact_blr import batch_means_mcse, make_blr_problem
from scipy.stats import spearmanr
from test_sgmcmc import PRIOR_STD, assert_spread, lr_for

from ursa_ray.data import get_dataset
from ursa_ray.evaluation import ClassificationPredictive
from ursa_ray.evaluation.precision import keep_output_layer_float32
from ursa_ray.evaluation.test_time_cost import cost_metrics_at_test_time, forward_flops
from ursa_ray.grid import GridError, parse_grid
from ursa_ray.methods import get_method
from ursa_ray.methods.base import Categorical, Problem, check_constraints, flat_parameters, resolve_config
from ursa_ray.methods.distillation import (
    ExpectationStudent,
    StudentTrainer,
    bdk_loss,
    expectation_loss,
    expected_entropy,
    gaussian_kl,
    gped_loss,
    interleaved_distillation,
    soft_cross_entropy,
)
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import run_trial

N_TEACHERS = 4
STUDENT_STEPS = 2000
# Mean KL(p̄_teacher ‖ p_student) in nats after STUDENT_STEPS Adam steps (measured: 0.007 on the training inputs
# and 0.009-0.010 on the test inputs, for both methods); the bounds leave about 3x room.  With 1000 steps GPED's
# head reaches Spearman 0.805 only, hence 2000.
KL_TRAIN, KL_TEST = 0.02, 0.03


def digits_problem(seed: int = 0) -> tuple[Problem, torch.Tensor]:
    ds = get_dataset("digits").load({}, (), None, False, 0)
    problem = Problem(
        ds.train_x,
        ds.train_y,
        Categorical(),
        lambda: build_mlp((1, 8, 8), 10, [64]),
        torch.Generator().manual_seed(seed),
        torch.device("cpu"),
    )
    return problem, ds.test_x


@cache
def teachers() -> tuple[torch.nn.Module, ...]:
    """A fixed Monte Carlo teacher: 4 MLPs 64-64-10 trained by SGD for 2 epochs from different initialisations
    (they disagree on a share of the inputs, so the expected entropy varies between inputs)."""
    problem, _ = digits_problem()
    networks = []
    for seed in range(N_TEACHERS):
        torch.manual_seed(seed)
        network = problem.make_model()
        optimiser = torch.optim.SGD(network.parameters(), lr=0.05, momentum=0.9)
        for _ in range(2):
            for xb, yb in problem.minibatches(64):
                optimiser.zero_grad()
                problem.likelihood.nll(network(xb), yb).backward()
                optimiser.step()
        networks.append(network.eval())
    return tuple(networks)


def teacher_expectations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(p̄, (1/S) Σ_s H[p_s]) of the fixed teacher on ``x``."""
    with torch.no_grad():
        probs = torch.stack([torch.softmax(t(x), -1) for t in teachers()]).double()
    return probs.mean(0), torch.special.entr(probs).sum(-1).mean(0)


@cache
def distilled(name: str) -> torch.nn.Module:
    """The method's student distilled from the fixed teacher, one teacher sample per step in turn."""
    problem, _ = digits_problem()
    config = resolve_config(get_method(name), {"batch_size": 64, "student_lr": 3e-3, "input_noise_std": 0.1})
    torch.manual_seed(10)
    student = problem.make_model() if name == "bdk" else ExpectationStudent(problem.make_model())
    trainer = StudentTrainer(student, bdk_loss(problem) if name == "bdk" else gped_loss, problem, config)
    for step in range(STUDENT_STEPS):
        trainer.step(teachers()[step % N_TEACHERS])
    return student.eval()


def mean_kl(p: torch.Tensor, q: torch.Tensor) -> float:
    return float((p * (p.clamp_min(1e-12).log() - q.clamp_min(1e-12).log())).sum(-1).mean())


@pytest.mark.parametrize("name", ["bdk", "gped"])
@pytest.mark.slow
def test_the_student_matches_a_fixed_teachers_predictive(name):
    problem, test_x = digits_problem()
    student = distilled(name)
    for x, bound in ((problem.x, KL_TRAIN), (test_x, KL_TEST)):
        target, _ = teacher_expectations(x)
        with torch.no_grad():
            kl = mean_kl(target, torch.softmax(student(x), -1).double())
        print(f"{name}: mean KL(teacher ‖ student) = {kl:.4f} on {len(x)} inputs (bound {bound})")
        assert kl < bound
    untrained = problem.make_model()
    with torch.no_grad():
        assert mean_kl(teacher_expectations(test_x)[0], torch.softmax(untrained(test_x), -1).double()) > 10 * KL_TEST


@pytest.mark.slow
def test_gped_head_ranks_inputs_like_the_teachers_expected_entropy_and_hands_over_mutual_information():
    """The distilled mutual information ranks the test inputs as the teacher's does.  Measured: Spearman 0.75,
    no input clipped to MI 0.  With h a free softplus head (the old parameterisation) h and the student's
    H[s] erred independently by more than most inputs' MI (median 0.009 nats): 54% clipped to 0, Spearman
    0.59, which this test rejects."""
    _, test_x = digits_problem()
    student = distilled("gped")
    teacher_probs, teacher_entropy = teacher_expectations(test_x)
    with torch.no_grad():
        logits, head = student.outputs(test_x)
        assert torch.equal(student.distilled_expected_entropy(test_x), head.clamp_min(0.0))
        assert torch.equal(student(test_x), logits)
    rho = spearmanr(head.numpy(), teacher_entropy.numpy()).statistic
    print(f"Spearman(head, teacher expected entropy) = {rho:.3f}")
    assert rho >= 0.8
    handed = ClassificationPredictive(len(test_x), 10)
    handed.update(logits, head.clamp_min(0.0))
    np.testing.assert_allclose(handed.expected_entropy, head.clamp_min(0.0).double().numpy())
    mi = handed.mutual_information
    teacher_mi = (torch.special.entr(teacher_probs).sum(-1) - teacher_entropy).numpy()
    rho_mi = spearmanr(mi, teacher_mi).statistic
    print(f"MI > 0 on {np.mean(mi > 0):.2f} of the test inputs; Spearman(MI, teacher MI) = {rho_mi:.3f}")
    assert rho_mi >= 0.7
    assert np.mean(mi > 0) > 0.95 and mi.max() > 0.05
    plain = ClassificationPredictive(len(test_x), 10)  # the same sample without its head: S = 1, MI exactly 0
    plain.update(logits)
    assert np.all(plain.mutual_information == 0.0)


def test_distillation_losses_against_hand_computations():
    """Each loss formula shared by the lone and the batched students, on numbers worked by hand; a leading
    copy dimension gives one loss per copy.  Catches swapped teacher and student in the cross-entropy, a sum
    in place of a mean, a missing ½ or σ² in the Gaussian KL, and a wrong target or sign in GPED's loss."""
    log = np.log
    # teacher logits (0, log 3): p_t = (1/4, 3/4); student logits (log 2, 0): s = (2/3, 1/3)
    teacher = torch.tensor([[0.0, log(3)], [0.0, 0.0]])
    student = torch.tensor([[log(2), 0.0], [0.0, 0.0]])
    row0 = -(0.25 * log(2 / 3) + 0.75 * log(1 / 3))
    row1 = log(2)  # uniform teacher and student: −Σ ½ log ½
    assert soft_cross_entropy(student, teacher).item() == pytest.approx((row0 + row1) / 2, rel=1e-6)
    copies = soft_cross_entropy(torch.stack([student, student[[1, 0]]]), torch.stack([teacher, teacher]))
    assert copies.shape == (2,)
    crossed = -(0.25 * log(0.5) + 0.75 * log(0.5)) - (0.5 * log(2 / 3) + 0.5 * log(1 / 3))  # rows swapped
    assert copies.tolist() == pytest.approx([(row0 + row1) / 2, crossed / 2], rel=1e-6)

    # (f_s − f_t)²/(2σ²) averaged over examples and outputs: ((1 − 0.5)² + (3 − 1)²)/2 / (2 · 0.25) = 4.25
    f_s, f_t = torch.tensor([[1.0], [3.0]]), torch.tensor([[0.5], [1.0]])
    assert gaussian_kl(f_s, f_t, 0.5).item() == pytest.approx(4.25, rel=1e-6)
    assert gaussian_kl(torch.stack([f_s, f_t]), torch.stack([f_t, f_t]), 0.5).tolist() == pytest.approx([4.25, 0.0])

    # GPED: cross-entropy + mean squared error of h against the teacher sample's entropy H[p_t]
    teacher_entropy = [-(0.25 * log(0.25) + 0.75 * log(0.75)), log(2)]
    h = torch.tensor([0.3, 0.9])
    expected = (row0 + row1) / 2 + ((0.3 - teacher_entropy[0]) ** 2 + (0.9 - teacher_entropy[1]) ** 2) / 2
    assert expectation_loss(student, h, teacher).item() == pytest.approx(expected, rel=1e-6)

    # h = H[s] − softplus(g): g = 0 gives H[s] − log 2, g = log(e − 1) gives H[s] − 1; no gradient reaches
    # the logits through H[s]
    logits = student.clone().requires_grad_(True)
    g = torch.tensor([[0.0], [log(np.e - 1)]], requires_grad=True)
    h = expected_entropy(logits, g)
    student_entropy = [-(2 / 3 * log(2 / 3) + 1 / 3 * log(1 / 3)), log(2)]
    assert h.tolist() == pytest.approx([student_entropy[0] - log(2), student_entropy[1] - 1.0], rel=1e-6)
    h.sum().backward()
    assert logits.grad is None or torch.all(logits.grad == 0)
    assert g.grad.squeeze(-1).tolist() == pytest.approx([-0.5, -(np.e - 1) / np.e], rel=1e-6)  # −sigmoid(g)


def test_gped_heads_stay_float32_under_bfloat16_autocast():
    """On a GPU evaluation runs the body under bfloat16 autocast with the output layer in float32
    (``keep_output_layer_float32``); GPED's expected-entropy head must stay float32 too.  h(x) under a CPU
    bfloat16 autocast equals its float32 computation from the same (bfloat16-body) features to float32
    precision, and keeps its 2,000 distinct values.  A head computed in bfloat16 (8 significant bits) had
    errors up to ~1e-2 and collapsed the values to a few hundred."""
    torch.manual_seed(0)
    network = keep_output_layer_float32(build_mlp((64,), 10, [64]), 10)
    student = ExpectationStudent(network).eval()
    with torch.no_grad():
        student.entropy_head.weight.normal_(0.0, 0.3)
        student.entropy_head.bias.fill_(-1.0)
    x = torch.randn(2000, 64)
    features: list[torch.Tensor] = []
    handle = network[-1].register_forward_hook(lambda module, inputs, output: features.append(inputs[0]))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = student(x)
        h = student.distilled_expected_entropy(x)
    handle.remove()
    assert logits.dtype == h.dtype == torch.float32
    phi = features[-1].float()
    knowledge = phi @ student.entropy_head.weight.T + student.entropy_head.bias
    reference = torch.special.entr(torch.softmax(logits, -1)).sum(-1) - torch.nn.functional.softplus(knowledge).squeeze(
        -1
    )
    torch.testing.assert_close(h, reference.clamp_min(0.0), rtol=1e-5, atol=1e-6)
    assert len(torch.unique(h)) >= 1990


def test_the_student_draws_its_inputs_and_augmentation_from_its_own_stream():
    """The student's mini-batches, noise and augmentation come from its own generator, seeded once from
    the problem's: the teacher's stream (mini-batch order, augmentation) is not drawn from by student steps,
    and the same problem seed gives the same student inputs.  Catches augmentation drawn from
    ``problem.generator`` (the teacher's stream), the old behaviour."""
    problem, _ = digits_problem(seed=3)
    seen: list[torch.Generator] = []

    def augment(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        seen.append(generator)
        return x + torch.rand(x.shape, generator=generator)

    problem = dataclasses.replace(problem, augment=augment)
    config = resolve_config(get_method("bdk"), {"batch_size": 16})
    trainer = StudentTrainer(problem.make_model(), bdk_loss(problem), problem, config)
    teacher_stream = problem.generator.get_state()
    first = trainer.inputs()
    trainer.step(problem.make_model())
    assert torch.equal(problem.generator.get_state(), teacher_stream)
    assert seen and all(g is trainer.generator for g in seen)
    again, _ = digits_problem(seed=3)
    again = dataclasses.replace(again, augment=augment)
    assert torch.equal(StudentTrainer(again.make_model(), bdk_loss(again), again, config).inputs(), first)


@pytest.mark.parametrize("name", ["bdk", "gped"])
def test_distillation_on_a_regression_dataset_is_refused_by_validation(name):
    """The student is one sample: on a Gaussian likelihood it would report zero epistemic uncertainty, so
    a grid naming bdk or gped on a regression dataset is refused before any trial, in one line naming the
    method entry; restricted to classification datasets it is accepted."""
    raw = {
        "name": "distil",
        "methods": [{"name": "sgd"}, {"name": name}],
        "models": [{"name": "mlp"}],
        "datasets": ["digits", {"name": "e1", "complexity": [1]}],
        "seeds": 1,
    }
    with pytest.raises(GridError) as refused:
        parse_grid(raw, "grids/distil.yaml")
    text = str(refused.value)
    assert "\n" not in text
    assert text == (
        f"grids/distil.yaml: methods[1]: method {name!r} supports classification datasets only, not the "
        "regression dataset 'e1'; restrict it with 'datasets:'"
    )
    raw["methods"][1]["datasets"] = ["digits"]
    assert len(parse_grid(raw, "grids/distil.yaml").trial_specs()) == 3


def test_a_handed_over_expected_entropy_must_have_one_value_per_example():
    acc = ClassificationPredictive(5, 3)
    with pytest.raises(ValueError, match="expected_entropy of shape"):
        acc.update(torch.zeros(5, 3), torch.zeros(5, 1))


def test_bdk_teacher_samples_the_exact_blr_posterior_while_the_student_trains():
    """The settings of tests/test_sgmcmc.py's SGLD chain (ηλ_max = 0.08, 4,000 post-burn-in steps), a student
    step after every 4th teacher step: the 1,000 teacher samples distilled pass the same spread and mean
    checks, and the student (a linear model on MSE to the teacher's mean) ends near the posterior mean: within
    1.5 posterior stds (measured: at most 0.92; constant-step Adam keeps tracking recent teacher samples) from an
    initialisation 4 to 35 stds away."""
    problem, mean, cov = make_blr_problem(n=256, prior_std=PRIOR_STD, seed=0)
    method = get_method("bdk")
    config = resolve_config(
        method,
        dict(
            lr=lr_for(0.08, cov),
            prior_std=PRIOR_STD,
            batch_size=128,
            epochs=2100,
            burn_in_epochs=100,
            distill_every=4,
            student_lr=1e-2,
            input_noise_std=0.0,
        ),
    )
    student = problem.make_model()
    start = (flat_parameters(student).double() - mean) / cov.diag().sqrt()
    trainer = StudentTrainer(student, bdk_loss(problem), problem, config)
    stats: dict[str, float] = {}
    samples = torch.stack(
        [flat_parameters(t).double() for t in interleaved_distillation(problem, config, trainer, stats)]
    )
    assert len(samples) == 1000 == stats["student_steps"] == stats["teacher_samples"]
    assert stats["grad_evals"] == stats["teacher_steps"] + stats["student_steps"] == 4200 + 1000
    assert_spread(samples, cov, tol=0.2)
    mcse = batch_means_mcse(samples, n_batches=20)
    z = (samples.mean(0) - mean) / mcse
    assert (z.abs() < 3.5).all(), f"(mean − exact) / MCSE = {z.tolist()}"
    off = (flat_parameters(student).double() - mean) / cov.diag().sqrt()
    print(f"student − posterior mean, in posterior stds: {off.tolist()}; initially {start.abs().min():.1f} or more")
    assert (off.abs() < 1.5).all() and (start.abs() > 4).all()


@pytest.mark.parametrize("name, head", [("bdk", 0), ("gped", 64 + 1)])
def test_grad_evals_count_teacher_and_student_and_test_time_cost_is_one_student(name, head):
    problem, _ = digits_problem()
    method = get_method(name)
    config = resolve_config(method, {"epochs": 3, "burn_in_epochs": 1, "batch_size": 64, "distill_every": 3})
    stats: dict[str, float] = {}
    (student,) = list(method.sample_posterior(problem, config, stats))
    per_epoch = 23  # ⌈1437 / 64⌉
    assert stats["teacher_steps"] == 3 * per_epoch and stats["student_steps"] == 2 * per_epoch // 3 == 15
    assert stats["grad_evals"] == 3 * per_epoch + 15 and stats["n_samples"] == 1
    cost = cost_metrics_at_test_time(method, student, config, 1, (1, 8, 8))
    network = 2 * (64 * 64 + 64 * 10)  # the MLP 64-64-10's matrix products
    assert cost["forward_flops"] == cost["flops_per_prediction"] == forward_flops(student, (1, 8, 8))
    assert cost["forward_flops"] == network + 2 * 64 * (head > 0)  # gped: and its head's 64 × 1 product
    parameters = 64 * 64 + 64 + 64 * 10 + 10
    assert cost["storage_weights"] == parameters + head and cost["storage_other_values"] == 0


def test_end_to_end_trial_on_digits():
    grid = parse_grid(
        {
            "name": "distil",
            "methods": [
                {"name": m, "hyperparameters": {"burn_in_epochs": 1, "student_lr": 3e-3}} for m in ("bdk", "gped")
            ],
            "models": [{"name": "mlp", "options": {"widths": [32]}}],
            "datasets": [{"name": "digits", "ood": ["noise"]}],
            "seeds": 1,
            "budget": {"epochs": 4, "batch_size": 64},
            "corruptions": {"types": []},
            "adversarial": {"n_examples": 50},
            "bit_depths": ["float16"],
        },
        "distil.yaml",
    )
    for spec in grid.trial_specs():
        outcome = run_trial(spec, torch.device("cpu"))
        values = {(r["eval_set"], r["metric"]): r["value"] for r in outcome.metrics}
        assert outcome.record["n_samples"] == 1 and values["test", "accuracy"] > 0.7
        assert outcome.record["grad_evals"] == 4 * 23 + 3 * 23
        assert values["cost", "flops_per_prediction"] == values["cost", "forward_flops"]
        mi_auroc = values["noise", "ood_auroc_mi"]
        if spec.method == "bdk":
            assert mi_auroc == 0.5  # one sample: MI exactly 0, every score tied
        else:
            assert mi_auroc != 0.5 and values["noise@float16", "ood_auroc_mi"] != 0.5


def test_hyperparameters_are_bounded_and_constraints_checked():
    for name in ("bdk", "gped"):
        method = get_method(name)
        assert {
            "lr",
            "prior_std",
            "temperature",
            "batch_size",
            "epochs",
            "burn_in_epochs",
            "distill_every",
            "student_lr",
            "input_noise_std",
        } == {h.name for h in method.hyperparameters}
        for bad in ({"distill_every": 0}, {"input_noise_std": -0.1}, {"student_lr": -1.0}, {"temperature": -1.0}):
            with pytest.raises(ValueError):
                resolve_config(method, bad)
        with pytest.raises(ValueError, match="burn_in_epochs must be below epochs"):
            check_constraints(method, resolve_config(method, {"epochs": 5, "burn_in_epochs": 5}))
        with pytest.raises(ValueError, match="distill_every must be at most the 23 post-burn-in teacher steps"):
            check_constraints(
                method,
                resolve_config(method, {"epochs": 2, "burn_in_epochs": 1, "batch_size": 64, "distill_every": 24}),
                1437,
            )
        raw = {
            "name": "bad",
            "methods": [{"name": name}],
            "models": ["mlp"],
            "datasets": ["digits"],
            "seeds": 1,
            "budget": {"epochs": 20},
        }
        with pytest.raises(GridError, match="burn_in_epochs must be below epochs"):
            parse_grid(raw, "bad.yaml")
    with pytest.raises(ValueError, match="classification only"):
        next(
            iter(get_method("gped").sample_posterior(make_blr_problem()[0], resolve_config(get_method("gped"), {}), {}))
        )
