"""Adversarial robustness of the posterior predictive (ursa_ray/evaluation/adversarial.py)."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from ursa_ray.evaluation.adversarial import (
    ATTACKS,
    AdversarialPredictives,
    ModelAverage,
    PixelScale,
    craft,
    default_epsilons,
    examples_from_bytes,
    examples_to_bytes,
    fgsm,
    kept_sample_indices,
    metrics_from_adversarial_tables,
    pgd,
    reference_epsilon,
    validate_adversarial,
)
from ursa_ray.evaluation.predictive import ClassificationPredictive
from ursa_ray.methods.base import flat_parameters

SCALE = PixelScale(mean=(0.2, 0.5, 0.7), std=(0.3, 0.1, 0.25))  # three channels, unequal: exercises un-normalising
SHAPE = (3, 2, 2)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two threads contending for a core run ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def average_of(*networks: nn.Module, batch_size: int = 512) -> ModelAverage:
    average = ModelAverage(len(networks), len(networks), batch_size=batch_size)
    for network in networks:
        average.observe(network)
    return average


def mlp(seed: int, dropout: float = 0.0, classes: int = 4) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 32), nn.Tanh(), nn.Dropout(dropout), nn.Linear(32, classes)).eval()


def pixel_weights(w: torch.Tensor) -> torch.Tensor:
    """Weights of a linear layer on normalised inputs, per pixel: w_j / std_channel(j)."""
    std = torch.tensor(SCALE.std, dtype=torch.float64).repeat_interleave(4)
    return w.double() / std


def margins(model: nn.Sequential, pixels: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Float64 logit margin z_y − z_other of a two-class linear model at pixel images."""
    linear = model[1]
    w, b = linear.weight.double(), linear.bias.double()
    z = SCALE.to_inputs(pixels.double()).flatten(1) @ w.T + b
    return z.gather(1, y[:, None]).squeeze(1) - z.gather(1, 1 - y[:, None]).squeeze(1)


@pytest.mark.parametrize("weight_scale", [1.0, 300.0])
@pytest.mark.parametrize("box_binds", [False, True])
def test_linear_two_class_attacks_reach_the_closed_form(weight_scale: float, box_binds: bool) -> None:
    """For a two-class linear model the NLL falls with the margin m = (w_y − w_k)·z + b_y − b_k, which is
    linear in the pixels x (z = (x − mean)/std), so the worst L∞ perturbation is per pixel
    δ_j = clip(x_j − ε sign d_j, 0, 1) − x_j with d = (w_y − w_k)/std: the margin drops by ε‖d‖₁ where the
    pixel range does not bind.  FGSM is exactly that; PGD (8 steps of ε/4 cross the ball) reaches it too.
    ``weight_scale`` 300 makes margins of hundreds, where a float32 softmax gradient is exactly 0."""
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 2)).eval()
    with torch.no_grad():
        model[1].weight.mul_(weight_scale)
        model[1].bias.mul_(weight_scale)
    n, eps = 64, 0.1 if not box_binds else 0.3
    pixels = torch.rand(n, *SHAPE) if box_binds else 0.35 + 0.3 * torch.rand(n, *SHAPE)
    y = torch.randint(0, 2, (n,))
    w = pixel_weights(model[1].weight.detach())
    d = w[y] - w[1 - y]  # n × 12, per example
    flat = pixels.double().flatten(1)
    worst = (flat - eps * d.sign()).clamp(0, 1) - flat
    expected = margins(model, pixels, y) + (d * worst).sum(1)
    if not box_binds:
        torch.testing.assert_close(expected, margins(model, pixels, y) - eps * d.abs().sum(1))
    average = average_of(model)
    for attack in (fgsm(average, pixels, y, SCALE, [eps]), pgd(average, pixels, y, SCALE, [eps], steps=10)):
        reached = margins(model, attack[eps], y)
        torch.testing.assert_close(reached, expected, atol=1e-4 * weight_scale, rtol=0)


def test_pgd_stays_in_the_ball_and_the_pixel_range() -> None:
    torch.manual_seed(2)
    pixels = torch.rand(50, *SHAPE)
    x, y = SCALE.to_inputs(pixels), torch.randint(0, 4, (50,))
    examples = craft(average_of(mlp(0), mlp(1)), x, y, SCALE, ATTACKS, [0.0, 0.03, 0.1, 0.5, 1.0])
    clean = examples.clean_pixels
    torch.testing.assert_close(clean, pixels, atol=1e-6, rtol=0)
    moved = 0.0
    for name, crafted in examples.sets.items():
        assert crafted.pixels.min() >= 0 and crafted.pixels.max() <= 1, name
        distance = (crafted.pixels - clean).abs().max().item()
        assert distance <= crafted.epsilon + 1e-6, (name, distance)
        moved = max(moved, distance)
        if crafted.epsilon == 0:
            assert torch.equal(crafted.pixels, clean)
    assert moved > 0.4  # the attacks do use the ball
    # the normalised inputs the network sees are those pixels
    inputs = examples.inputs()
    pixels_back = SCALE.to_pixels(inputs["pgd_eps0.1"])
    torch.testing.assert_close(pixels_back, examples.sets["pgd_eps0.1"].pixels, atol=1e-6, rtol=0)


def autograd_nll(average: ModelAverage, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    nll = -average.log_predictive(x).gather(1, y[:, None]).squeeze(1)
    (grad,) = torch.autograd.grad(nll.sum(), x)
    return nll.detach().double(), grad.double()


def test_attack_gradient_is_that_of_the_model_average() -> None:
    """attack_loss (one graph at a time, chunked) equals autograd through log p̄ = lse_s log softmax − log M,
    and log p̄ equals the accumulated posterior predictive of the same samples."""
    torch.manual_seed(3)
    x, y = torch.randn(23, *SHAPE), torch.randint(0, 4, (23,))
    average = average_of(mlp(0), mlp(1), mlp(2), batch_size=10)
    loss = average.attack_loss(x, y)
    nll, grad = autograd_nll(average, x, y)
    torch.testing.assert_close(loss.nll, nll, atol=1e-5, rtol=0)
    torch.testing.assert_close(loss.gradient(), grad, atol=1e-6, rtol=1e-4)
    predictive = ClassificationPredictive(23, 4)
    for predictor in average.predictors():
        predictive.update(predictor(x))
    p_true = predictive.mean_probs[np.arange(23), y.numpy()]
    np.testing.assert_allclose(-np.log(p_true), loss.nll.numpy(), atol=1e-5)


@pytest.mark.parametrize("confident_first", [True, False])
def test_attack_gradient_with_a_saturated_sample(confident_first: bool) -> None:
    """A sample with logit margins of hundreds (float32 softmax saturated) next to an ordinary one: the
    gradient still equals float64 autograd, whichever comes first (the running sum is rescaled when a later
    sample outweighs the first by more than e^20)."""
    torch.manual_seed(6)
    confident, ordinary = (nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval() for _ in range(2))
    with torch.no_grad():
        confident[1].weight.mul_(300)
    networks = (confident, ordinary) if confident_first else (ordinary, confident)
    x, y = torch.randn(30, *SHAPE), torch.randint(0, 3, (30,))
    loss = average_of(*networks).attack_loss(x, y)
    exact_x = x.double().requires_grad_(True)
    log_p = torch.stack([torch.log_softmax(n.double()(exact_x), 1) for n in networks])
    exact_nll = math.log(2) - torch.logsumexp(log_p, 0).gather(1, y[:, None]).squeeze(1)
    (exact_grad,) = torch.autograd.grad(exact_nll.sum(), exact_x)
    for n in networks:
        n.float()
    torch.testing.assert_close(loss.nll, exact_nll.detach(), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(loss.gradient(), exact_grad, atol=1e-6, rtol=1e-4)


def test_dropout_samples_are_fixed_masks_shared_by_attack_and_evaluation() -> None:
    """MC dropout: one stored copy, M different masks; the same masks in every call, in the attack's
    gradient and in the evaluation; torch's generator and the network are left as they were."""
    network = mlp(0, dropout=0.5)
    for m in network.modules():
        if isinstance(m, nn.Dropout):
            m.train()
    average = ModelAverage(30, 3)
    for _ in range(30):
        average.observe(network)  # the MC dropout stream: the same module each time
    assert average.n_kept == 3 and average.stored_bytes == 4 * flat_parameters(network).numel()
    x, y = torch.randn(40, *SHAPE), torch.randint(0, 4, (40,))
    state = torch.get_rng_state()
    first = [average.logits(s, x) for s in range(3)]
    assert not torch.equal(first[0], first[1])  # different masks
    assert all(torch.equal(a, average.logits(s, x)) for s, a in enumerate(first))  # the same masks again
    assert torch.equal(torch.get_rng_state(), state)
    loss = average.attack_loss(x, y)
    nll, grad = autograd_nll(average, x, y)
    torch.testing.assert_close(loss.gradient(), grad, atol=1e-6, rtol=1e-4)
    exact = torch.logsumexp(torch.stack([torch.log_softmax(a.double(), 1) for a in first]), 0) - math.log(3)
    torch.testing.assert_close(loss.nll, -exact.gather(1, y[:, None]).squeeze(1), atol=1e-5, rtol=0)
    network.eval()
    assert not network[3].training  # the network's own modes are put back after each call
    before = flat_parameters(network).clone()
    average.attack_loss(x, y)
    assert torch.equal(flat_parameters(network), before) and not network[3].training


def test_model_average_attack_differs_from_a_single_sample_attack() -> None:
    torch.manual_seed(4)
    pixels, y = torch.rand(60, *SHAPE), torch.randint(0, 4, (60,))
    one, other = mlp(0), mlp(1)
    single = fgsm(average_of(one), pixels, y, SCALE, [0.1])[0.1]
    averaged = fgsm(average_of(one, other), pixels, y, SCALE, [0.1])[0.1]
    assert (single != averaged).float().mean() > 0.1
    copies = fgsm(average_of(one, mlp(0)), pixels, y, SCALE, [0.1])[0.1]  # two identical samples
    assert torch.equal(copies, single)


@pytest.fixture(scope="module")
def trained_digits() -> tuple[nn.Module, torch.Tensor, torch.Tensor, PixelScale]:
    """An MLP 64-200-200-10 trained by Adam (20 epochs) on scikit-learn's digits, and 150 test digits."""
    from ursa_ray.data.digits import load_digits_dataset
    from ursa_ray.models.mlp import build_mlp

    data = load_digits_dataset({}, (), Path("unused"), False, 0)
    torch.manual_seed(0)
    network = build_mlp((1, 8, 8), 10)
    optimiser = torch.optim.Adam(network.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        order = torch.randperm(len(data.train_y), generator=generator)
        for batch in order.split(128):
            optimiser.zero_grad()
            nn.functional.cross_entropy(network(data.train_x[batch]), data.train_y[batch]).backward()
            optimiser.step()
    return network.eval(), data.test_x[:150], data.test_y[:150], PixelScale(data.pixel_mean, data.pixel_std)


def mlp_with_dropout(network: nn.Module) -> nn.Module:
    """A copy of ``network`` with its dropout slots at rate 0.2 and in training mode (MC dropout)."""
    noisy = copy.deepcopy(network)
    for m in noisy.modules():
        if isinstance(m, nn.Dropout):
            m.p = 0.2
            m.train()
    return noisy


@pytest.mark.parametrize("samples", ["sgd", "mc_dropout"])
def test_attack_success_rate_does_not_fall_with_epsilon(trained_digits, samples: str) -> None:
    network, x, y, scale = trained_digits
    if samples == "mc_dropout":
        network = mlp_with_dropout(network)
    copies = 5 if samples == "mc_dropout" else 1  # MC dropout: five fixed masks of the one network
    average = ModelAverage(copies, copies)
    for _ in range(copies):
        average.observe(network)
    epsilons = [0.0, 1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4]
    evaluation = AdversarialPredictives(craft(average, x, y, scale, ATTACKS, epsilons), 10)
    for predictor in average.predictors():
        evaluation.update(predictor)
    metrics = evaluation.metrics()
    assert metrics["clean"]["accuracy"] > 0.9
    for attack in ATTACKS:
        rates = [metrics[f"{attack}_eps{eps:.6g}"]["attack_success_rate"] for eps in epsilons]
        assert rates[0] == 0.0 and rates[-1] > 0.9, (attack, rates)
        assert all(a <= b for a, b in zip(rates, rates[1:], strict=False)), (attack, rates)
    assert metrics["pgd_eps0.25"]["accuracy"] <= metrics["fgsm_eps0.25"]["accuracy"]
    assert metrics["pgd_eps0.125"]["adv_auroc_entropy"] > 0.7  # attacked inputs sit near a boundary: higher entropy


def test_metrics_recomputed_from_saved_adversarial_predictions(tmp_path: Path) -> None:
    """White-box sets on the attacked average (an ensemble of three), and the transfer API: examples
    crafted on one network, evaluated with another predictor stream.  The saved tables (written and read
    back as parquet) give the same metrics to the last bit."""
    torch.manual_seed(5)
    x, y = SCALE.to_inputs(torch.rand(80, *SHAPE)), torch.randint(0, 4, (80,))
    members = [mlp(s) for s in range(3)]
    white_box = AdversarialPredictives(craft(average_of(*members), x, y, SCALE, ATTACKS, [0.0, 0.05, 0.2]), 4)
    for predictor in average_of(*members).predictors():
        white_box.update(predictor)
    transfer = AdversarialPredictives(craft(average_of(mlp(7)), x, y, SCALE, ["pgd"], [0.2]), 4)
    for member in members:
        transfer.update(lambda inputs, m=member: m(inputs).detach())
    for evaluation in (white_box, transfer):
        reported = evaluation.metrics()
        read_back = {}
        for name, table in evaluation.tables().items():
            table.to_parquet(tmp_path / f"{name}.parquet")
            read_back[name] = pd.read_parquet(tmp_path / f"{name}.parquet")
        assert metrics_from_adversarial_tables(read_back) == reported
    reported = white_box.metrics()
    tables = white_box.tables()
    clean_right = tables["clean"].filter(regex=r"^p\d").to_numpy().argmax(1) == y.numpy()
    attacked_wrong = tables["pgd_eps0.2"].filter(regex=r"^p\d").to_numpy().argmax(1) != y.numpy()
    assert reported["pgd_eps0.2"]["attack_success_rate"] == (clean_right & attacked_wrong).sum() / clean_right.sum()
    assert reported["fgsm_eps0"]["attack_success_rate"] == 0
    assert reported["fgsm_eps0"]["adv_auroc_mi"] == pytest.approx(0.5)
    assert reported["pgd_eps0.2"]["accuracy"] < reported["clean"]["accuracy"]
    assert reported["pgd_eps0.2"]["adv_auroc_mi"] != 0.5  # three different members: MI varies
    clean_probs = np.mean([torch.softmax(m(x), 1).detach().numpy() for m in members], axis=0)
    assert transfer.metrics()["clean"]["accuracy"] == np.mean(clean_probs.argmax(1) == y.numpy())


def test_transfer_examples_survive_the_file_between_trials_bit_for_bit() -> None:
    """What a transfer source saves is what the trials scored on it read: same pixels, labels, sets."""
    torch.manual_seed(6)
    x, y = SCALE.to_inputs(torch.rand(20, *SHAPE)), torch.randint(0, 4, (20,))
    crafted = craft(average_of(mlp(1)), x, y, SCALE, ATTACKS, [0.05, 0.2])
    again = examples_from_bytes(examples_to_bytes(crafted), SCALE, torch.device("cpu"))
    assert torch.equal(again.clean_pixels, crafted.clean_pixels) and torch.equal(again.labels, crafted.labels)
    assert again.sets.keys() == crafted.sets.keys()
    for name, adversarial in crafted.sets.items():
        assert (again.sets[name].attack, again.sets[name].epsilon) == (adversarial.attack, adversarial.epsilon)
        assert torch.equal(again.sets[name].pixels, adversarial.pixels)


def test_kept_sample_indices_are_even_and_end_with_the_last() -> None:
    assert kept_sample_indices(100, 20) == tuple(range(4, 100, 5))
    assert kept_sample_indices(5, 20) == (0, 1, 2, 3, 4)
    assert kept_sample_indices(1, 20) == (0,)
    assert kept_sample_indices(30, 1) == (29,)
    kept = kept_sample_indices(30, 20)
    assert len(set(kept)) == 20 and kept[-1] == 29 and max(np.diff(kept)) == 2


@pytest.mark.parametrize("chains_in_turn", [False, True], ids=["interleaved", "chains-in-turn"])
def test_kept_sample_indices_take_every_chains_last_samples(chains_in_turn: bool) -> None:
    """C chains of S samples: the M kept are shared evenly by the chains, each keeping its own evenly spaced
    draws ending with its last, at their positions in the stream's order (catches a plan over S samples
    only, and evenly spaced positions over C·S interleaved ones, which land on one chain when C divides
    the spacing: 19, 39, ... of 4 × 100 are all chain 4's)."""
    n_chains, per_chain = 4, 100

    def chain_and_draw(position: int) -> tuple[int, int]:
        if chains_in_turn:
            return divmod(position, per_chain)
        draw, chain = divmod(position, n_chains)
        return chain, draw

    kept = kept_sample_indices(per_chain, 20, n_chains, chains_in_turn)
    assert len(kept) == 20 and list(kept) == sorted(set(kept))
    by_chain: dict[int, list[int]] = {}
    for position in kept:
        chain, draw = chain_and_draw(position)
        by_chain.setdefault(chain, []).append(draw)
    assert by_chain == {c: [19, 39, 59, 79, 99] for c in range(n_chains)}
    uneven = [chain_and_draw(p) for p in kept_sample_indices(per_chain, 6, n_chains, chains_in_turn)]
    assert sorted(uneven) == [(0, 49), (0, 99), (1, 49), (1, 99), (2, 99), (3, 99)]
    assert kept_sample_indices(3, 20, n_chains, chains_in_turn) == tuple(range(12))  # every sample
    assert kept_sample_indices(per_chain, 20, 1, chains_in_turn) == kept_sample_indices(per_chain, 20)


def test_the_digits_loader_declares_the_pixel_scale_of_its_images() -> None:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from ursa_ray.data.digits import load_digits_dataset

    data = load_digits_dataset({}, (), Path("unused"), False, 0)
    digits = load_digits()
    raw_test = train_test_split(digits.images, digits.target, test_size=0.2, stratify=digits.target, random_state=0)[1]
    pixels = PixelScale(data.pixel_mean, data.pixel_std).to_pixels(data.test_x)
    np.testing.assert_allclose(pixels.squeeze(1).numpy(), raw_test / 16.0, atol=1e-6)


# The ε each built-in dataset declares, as the families hard-coded in evaluation/adversarial.py gave them
MNIST_BUDGET = ((0.05, 0.1, 0.2, 0.3), 0.1)
CIFAR_BUDGET = ((2 / 255, 4 / 255, 8 / 255, 16 / 255), 8 / 255)
DECLARED_BUDGETS = {
    "digits": ((1 / 32, 1 / 16, 1 / 8, 1 / 4), 1 / 16),
    "digits_imbalanced": ((1 / 32, 1 / 16, 1 / 8, 1 / 4), 1 / 16),
    **dict.fromkeys(
        ("mnist", "mnist_imbalanced", "mnist_5k", "mnist_5k_imbalanced", "fashion_mnist", "kmnist"), MNIST_BUDGET
    ),
    **dict.fromkeys(("cifar10", "cifar10_imbalanced", "cifar100", "cifar100_imbalanced"), CIFAR_BUDGET),
}


def test_each_dataset_declares_its_attack_budget() -> None:
    """Every built-in image dataset with ε defaults declares them (and no other does): a dataset that lost its
    declaration, or a family mapped to the wrong ε, fails here."""
    from ursa_ray import data

    declared = {
        name: (spec.attack_budget.epsilons, spec.attack_budget.reference)
        for name, spec in data.registry().items()
        if spec.attack_budget is not None
    }
    assert declared == DECLARED_BUDGETS
    assert default_epsilons("fashion_mnist") == MNIST_BUDGET[0] and reference_epsilon("cifar10") == 8 / 255
    assert math.isnan(reference_epsilon("e1"))  # declares none: no set is the robustness composite's
    with pytest.raises(ValueError, match="no adversarial defaults for dataset 'e1'; known: cifar10, cifar100, "):
        default_epsilons("e1")


def test_a_plug_in_dataset_gets_the_epsilons_it_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    from ursa_ray import data
    from ursa_ray.data.base import AttackBudget, DatasetSpec

    spec = DatasetSpec("tiles", "classification", "a plug-in", load=None, attack_budget=AttackBudget((0.2,), 0.05))
    monkeypatch.setattr(data, "registry", lambda: {"tiles": spec})
    assert validate_adversarial(None).epsilons_for("tiles") == (0.05, 0.2)
    assert validate_adversarial({"epsilons": [0.3]}).epsilons_for("tiles") == (0.05, 0.3)  # the reference too
    assert validate_adversarial({"epsilons": [0.3]}).epsilons_for("from_files") == (0.3,)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"attacks": ["fgsm", "cw"]}, "adversarial.attacks[1]: unknown attack 'cw'; allowed: fgsm, pgd"),
        ({"epsilons": [0.1, -0.05]}, "adversarial.epsilons[1]: expected a number in [0, 1] (pixel units), got -0.05"),
        ({"attack_samples": 0}, "adversarial.attack_samples: expected an integer >= 1, got 0"),
        ({"n_examples": 0}, "adversarial.n_examples: expected an integer >= 1, got 0"),
        ({"pgd_steps": 2.5}, "adversarial.pgd_steps: expected an integer >= 1, got 2.5"),
        ({"epsilon": [0.1]}, "adversarial.epsilon: unknown key; allowed: attacks, epsilons, n_examples"),
    ],
)
def test_validate_adversarial_names_the_bad_field(settings: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        validate_adversarial(settings)
    assert str(error.value).startswith(message)


def test_validate_adversarial_defaults() -> None:
    settings = validate_adversarial({"epsilons": [0.3, 0.1], "attack_samples": 5})
    assert settings.attacks == ("fgsm", "pgd") and settings.epsilons == (0.1, 0.3)
    assert settings.attack_samples == 5 and settings.pgd_steps == 10 and settings.n_examples == 1000
    assert validate_adversarial(None).epsilons_for("digits") == default_epsilons("digits")
