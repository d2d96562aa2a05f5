"""Test-time cost: FLOPs of a forward pass against hand counts, each method's storage formula against hand
counts, int8 per-channel quantisation error bounds, and the effect of float16/bfloat16/int8 weights on the
posterior predictive of the quickstart MLP."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ursa_ray.data import get_dataset
from ursa_ray.evaluation import ClassificationPredictive, classification_metrics, ood_metrics
from ursa_ray.evaluation.test_time_cost import (
    BITS_PER_WEIGHT,
    QUANTISATION_SCHEMES,
    cost_metrics_at_test_time,
    evaluate_at_bit_depths,
    flops_per_prediction,
    forward_flops,
    int8_per_channel,
    quantise_module,
    quantise_tensor,
    storage_bytes,
)
from ursa_ray.methods import catalogue, get_method
from ursa_ray.methods._sgmcmc_kernels import FlatModel
from ursa_ray.methods.base import (
    Categorical,
    Problem,
    StorageCount,
    flat_parameters,
    posterior_storage_count,
    resolve_config,
)
from ursa_ray.methods.concrete_dropout import install_concrete_dropout
from ursa_ray.methods.distillation import ExpectationStudent
from ursa_ray.methods.mfvi import install_bayesian_layers
from ursa_ray.methods.sngp import install_sngp
from ursa_ray.methods.variational_dropout import install_variational_linear
from ursa_ray.models.mlp import build_mlp
from ursa_ray.trial import predict

MNIST_MLP_MATRIX_WEIGHTS = 784 * 200 + 200 * 200 + 200 * 10  # 198,800 entries of the three weight matrices
MNIST_MLP_PARAMETERS = MNIST_MLP_MATRIX_WEIGHTS + 200 + 200 + 10  # plus the biases: 199,210


def mnist_mlp() -> nn.Sequential:
    return build_mlp((1, 28, 28), 10, [200, 200])


# ----------------------------------------------------------------------------------------------------
# FLOPs
# ----------------------------------------------------------------------------------------------------


def test_mlp_forward_flops_equal_the_hand_count():
    # 2 FLOPs per multiply-accumulate of each weight matrix; FlopCounterMode charges addmm 2·m·n·k and
    # nothing for its bias add, so a network without biases costs the same
    hand_count = 2 * (784 * 200 + 200 * 200 + 200 * 10)
    assert forward_flops(mnist_mlp(), (1, 28, 28)) == hand_count == 397_600
    no_bias = nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, 200, bias=False),
        nn.ReLU(),
        nn.Linear(200, 200, bias=False),
        nn.ReLU(),
        nn.Linear(200, 10, bias=False),
    )
    assert forward_flops(no_bias, (1, 28, 28)) == hand_count


def test_conv_net_forward_flops_equal_the_hand_count():
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8 × 16 × 16 → 8 × 8 × 8
        nn.Conv2d(8, 16, 3, groups=2),
        nn.ReLU(),
        nn.Flatten(),  # 16 × 6 × 6, each output sees 4 channels
        nn.Linear(16 * 6 * 6, 10),
    )
    hand_count = (
        2 * (8 * 16 * 16) * (3 * 3 * 3)  # outputs × (inputs per output) of the first convolution
        + 2 * (16 * 6 * 6) * (4 * 3 * 3)  # the grouped one: C_in / groups = 4 channels per output
        + 2 * 576 * 10
    )
    assert forward_flops(net, (3, 16, 16)) == hand_count == 110_592 + 41_472 + 11_520


def test_forward_flops_leave_modes_and_random_stream_as_they_were():
    model = mnist_mlp()
    model.eval()
    model[3].p = 0.5
    model[3].train()  # MC dropout's sampling mode: dropout on, the rest in evaluation mode
    modes = [m.training for m in model.modules()]
    state = torch.get_rng_state()
    forward_flops(model, (1, 28, 28))
    assert [m.training for m in model.modules()] == modes
    assert torch.equal(torch.get_rng_state(), state)


def test_variational_dropout_pays_for_both_products_of_the_local_reparameterisation():
    model = mnist_mlp()
    install_variational_linear(model, -10.0)
    assert forward_flops(model, (1, 28, 28)) == 2 * 397_600


def test_flops_per_prediction_is_samples_times_forward_flops():
    assert flops_per_prediction(397_600, 30) == 30 * 397_600
    assert flops_per_prediction(397_600, 1) == 397_600


@pytest.mark.parametrize("name, n_samples", [("sgld", 30), ("mc_dropout", 30), ("sgd", 1)])
def test_flops_per_prediction_of_the_quickstart_mlp_against_a_hand_count(name, n_samples):
    """The quickstart's MLP 64-200-200-10 as a trial reports it: one forward pass is its three matrix
    products, 2 FLOPs per multiply-accumulate, 2·(64·200 + 200·200 + 200·10) = 109,600 for one example
    (FlopCounterMode charges addmm 2·m·n·k and nothing for the bias adds, ReLU, dropout or flatten), and a
    prediction of an S-sample method is S passes.  Catches a count per mini-batch instead of per example, a
    count that ignores S, or one that charges only some layers."""
    hand_count = 2 * (64 * 200 + 200 * 200 + 200 * 10)
    assert hand_count == 109_600
    method = get_method(name)
    config = resolve_config(method, {"n_samples": n_samples} if name != "sgd" else {})
    model = build_mlp((1, 8, 8), 10, [200, 200])  # with Dropout(0) layers, as mc_dropout sets their p
    cost = cost_metrics_at_test_time(method, model, config, n_samples, (1, 8, 8))
    assert cost["forward_flops"] == hand_count
    assert cost["flops_per_prediction"] == n_samples * hand_count


# ----------------------------------------------------------------------------------------------------
# Storage
# ----------------------------------------------------------------------------------------------------


def test_storage_bytes_at_each_bit_depth():
    count = StorageCount(weights=1_000, other_values=10)
    assert [storage_bytes(count, bits) for bits in BITS_PER_WEIGHT] == [4_040, 2_040, 1_040]
    assert storage_bytes(StorageCount(weights=3), 4) == 2  # ⌈12 / 8⌉ bytes
    with pytest.raises(ValueError, match="at least 1"):
        storage_bytes(count, 0)


def _sample_of(method_name: str) -> nn.Module:
    """One posterior sample of ``method_name`` on the MNIST MLP, with the parameters the method adds."""
    model = mnist_mlp()
    if method_name == "concrete_dropout":
        install_concrete_dropout(model, 0.1, 0.1)
    if method_name == "variational_dropout":
        install_variational_linear(model, -10.0)
    if method_name == "gped":
        return ExpectationStudent(model)
    if method_name == "mfvi":
        install_bayesian_layers(model, 1e-3)
    if method_name == "sngp":
        install_sngp(model, resolve_config(get_method("sngp"), {}), None)
    return model


P = MNIST_MLP_PARAMETERS
S = 12
# method → (hyperparameters, hand count of what it stores for S = 12 samples of the MNIST MLP)
HAND_COUNTS: dict[str, tuple[dict, StorageCount]] = {
    "sgd": ({}, StorageCount(weights=P)),
    "mfvi": ({}, StorageCount(weights=2 * P)),  # a mean and a ρ per weight and bias
    # hidden layers (784·200 + 200 + 200·200 + 200), β (10 × 512), the projection (512 × 200), the phases
    # (512) and one 512 × 512 covariance block per class
    "sngp": ({}, StorageCount(weights=784 * 200 + 200 + 200 * 200 + 200 + 10 * 512 + 512 * 200 + 512 + 10 * 512 * 512)),
    "swa": ({}, StorageCount(weights=P)),  # the mean θ̄
    "mc_dropout": ({}, StorageCount(weights=P)),  # p is a hyperparameter; masks drawn at prediction time
    "concrete_dropout": ({}, StorageCount(weights=P, other_values=2)),  # a learned rate per dropout slot
    "variational_dropout": ({}, StorageCount(weights=P + MNIST_MLP_MATRIX_WEIGHTS)),  # θ, biases, log σ² per weight
    "sgld": ({}, StorageCount(weights=S * P)),
    "sghmc": ({}, StorageCount(weights=S * P)),
    "csgld": ({}, StorageCount(weights=S * P)),
    "csghmc": ({}, StorageCount(weights=S * P)),
    "hmc": ({}, StorageCount(weights=S * P)),
    "deep_ensemble": ({}, StorageCount(weights=S * P)),
    "swag": ({"rank": 10, "swa_epochs": 20}, StorageCount(weights=(2 + 10) * P)),  # θ̄, σ², 10 deviations
    "pca_ess": ({"rank": 10}, StorageCount(weights=(10 + 1) * P, other_values=S * 10)),  # B, θ̄; S coordinates
    # θ_MAP and the output layer's KFAC factors: 10² + 200² for its 10 × 200 weight, 10² for its bias; λ₀
    "laplace": ({}, StorageCount(weights=P + 10**2 + 200**2 + 10**2, other_values=1)),
    "bdk": ({}, StorageCount(weights=P)),  # the student; the teacher chain is training only
    "gped": ({}, StorageCount(weights=P + 200 + 1)),  # the student and its expected-entropy head on the 200 features
}


def test_every_registered_method_has_a_hand_checked_storage_formula():
    assert set(HAND_COUNTS) == set(catalogue().built_ins)  # installed plug-ins declare their own


@pytest.mark.parametrize("name", sorted(HAND_COUNTS))
def test_storage_formula_equals_the_hand_count(name):
    method = get_method(name)
    overrides, expected = HAND_COUNTS[name]
    config = resolve_config(method, overrides)
    assert posterior_storage_count(method, _sample_of(name), config, S) == expected


@pytest.mark.parametrize(
    "overrides, deviations",
    [
        ({"rank": 20, "swa_epochs": 5}, 5),  # only 5 iterates collected: 5 deviations stored
        ({"rank": 20, "swa_epochs": 5, "swa_collect_every": 3}, 20),  # iterates depend on N: rank, an upper bound
        ({"rank": 1}, 0),  # SWAG-diagonal: θ̄ and σ² only
        ({"rank": 10, "swa_epochs": 1}, 0),  # one iterate: SWAG-diagonal
    ],
)
def test_swag_stores_only_the_deviations_it_draws_with(overrides, deviations):
    method = get_method("swag")
    count = posterior_storage_count(method, mnist_mlp(), resolve_config(method, overrides), S)
    assert count == StorageCount(weights=(2 + deviations) * P)


def test_a_method_without_a_declaration_stores_its_samples():
    class PlugIn:
        name = "plug_in"

    assert posterior_storage_count(PlugIn(), mnist_mlp(), {}, 7) == StorageCount(weights=7 * P)


def test_cost_metrics_of_a_trial():
    method = get_method("pca_ess")
    config = resolve_config(method, {"rank": 10})
    metrics = cost_metrics_at_test_time(method, mnist_mlp(), config, 30, (1, 28, 28))
    weights, coordinates = 11 * P, 30 * 10
    assert metrics == {
        "forward_flops": 397_600.0,
        "flops_per_prediction": 30 * 397_600.0,
        "storage_weights": float(weights),
        "storage_other_values": float(coordinates),
        "storage_bytes_32": 4.0 * weights + 4 * coordinates,
        "storage_bytes_16": 2.0 * weights + 4 * coordinates,
        "storage_bytes_8": 1.0 * weights + 4 * coordinates,
    }


# ----------------------------------------------------------------------------------------------------
# Bit depth
# ----------------------------------------------------------------------------------------------------


def test_int8_error_is_at_most_half_a_step_per_weight():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 8, 3, 3, generator=gen) * torch.logspace(-3, 1, 16).view(16, 1, 1, 1)
    codes, scales = int8_per_channel(weight)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) == 127
    torch.testing.assert_close(scales.flatten(), weight.abs().amax(dim=(1, 2, 3)) / 127)
    error = (quantise_tensor(weight, "int8") - weight).abs()
    assert (error <= scales * (0.5 + 1e-5)).all()
    assert (error > scales * 0.4).any()  # the bound is nearly reached: really a grid of 255 levels


def test_int8_reproduces_weights_already_on_the_grid():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (6, 40), generator=gen)
    codes[:, 0] = 127  # each row's largest |code| is 127, so scale_c is that row's step
    steps = 2.0 ** torch.arange(-12, -6).view(6, 1)  # powers of two: every product exact in float32
    on_grid = codes.float() * steps
    assert torch.equal(quantise_tensor(on_grid, "int8"), on_grid)
    zeros = torch.zeros(3, 5)
    assert torch.equal(quantise_tensor(zeros, "int8"), zeros)  # a channel of zeros stays zero


def test_quantise_module_changes_what_each_scheme_stores_and_restores_everything():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    model = model.to(memory_format=torch.channels_last)
    with torch.no_grad():  # every parameter off the float16 grid, as trained ones are (batch norm starts at 1 and 0)
        for p in model.parameters():
            p.normal_()
    originals = {name: p.detach().clone() for name, p in model.named_parameters()}
    for scheme in QUANTISATION_SCHEMES:
        with quantise_module(model, scheme):
            for name, p in model.named_parameters():
                if scheme == "int8" and p.dim() < 2:  # biases and batch-norm parameters stay float32
                    assert torch.equal(p, originals[name])
                elif scheme == "int8":
                    codes, scales = int8_per_channel(originals[name])
                    assert torch.equal(p, codes.float() * scales)
                else:
                    assert torch.equal(p, originals[name].to(getattr(torch, scheme)).float())
                    assert not torch.equal(p, originals[name])
        assert all(torch.equal(p, originals[name]) for name, p in model.named_parameters())
    assert model[0].weight.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(RuntimeError, match="inside"), quantise_module(model, "int8"):
        raise RuntimeError("inside")
    assert all(torch.equal(p, originals[name]) for name, p in model.named_parameters())
    with pytest.raises(ValueError, match="unknown quantisation scheme"), quantise_module(model, "int4"):
        pass


def test_quantise_module_writes_through_a_samplers_flat_parameter_vector():
    # SG-MCMC's parameters are views into one vector that the sampler keeps stepping after the sample
    model = build_mlp((1, 8, 8), 10, [16])
    flat = FlatModel(model)
    original = flat.theta.clone()
    with quantise_module(model, "int8"):
        assert not torch.equal(flat.theta, original)
        assert torch.equal(flat.theta, flat_parameters(model))
    assert torch.equal(flat.theta, original)
    storage = flat.theta.untyped_storage().data_ptr()
    assert all(p.untyped_storage().data_ptr() == storage for p in model.parameters())  # still views


def test_every_scheme_sees_the_masks_of_the_float32_evaluation_that_follows():
    torch.manual_seed(0)
    model = build_mlp((1, 8, 8), 10, [32])
    with torch.no_grad():  # weights on the float16 grid: float16 storage changes nothing
        for p in model.parameters():
            p.copy_(p.half().float())
    model[3].p = 0.5
    x = torch.rand(64, 1, 8, 8)
    outputs: dict[str, torch.Tensor] = {}
    state = torch.get_rng_state()
    evaluate_at_bit_depths(model, lambda scheme: outputs.__setitem__(scheme, model(x)))
    assert torch.equal(torch.get_rng_state(), state)  # the trial's random stream is untouched
    full = model(x)
    assert torch.equal(outputs["float16"], full)  # same masks, same weights
    assert not torch.equal(outputs["int8"], full)  # int8 did change the weights
    assert not torch.equal(model(x), full)  # and dropout is really drawing masks


def test_float16_weights_keep_the_quickstart_accuracy():
    """MC dropout on the embedded digits with the quickstart's MLP (a shorter run than the quickstart's, as
    tests/test_mixed_precision.py): the posterior predictive with every sample's weights at float16 is within
    0.005 accuracy of float32.  The printout reports each scheme's change in accuracy, NLL and OOD AUROC."""
    torch.manual_seed(0)
    ds = get_dataset("digits").load({}, ("noise", "digits_rotated"), None, False, 0)
    problem = Problem(
        ds.train_x,
        ds.train_y,
        Categorical(),
        lambda: build_mlp((1, 8, 8), 10, [200, 200]),
        torch.Generator().manual_seed(0),
        torch.device("cpu"),
    )
    method = get_method("mc_dropout")
    config = resolve_config(method, {"lr": 0.05, "p": 0.2, "epochs": 10, "n_samples": 10, "batch_size": 64})
    sets = [("test", ds.test_x), *ds.ood.items()]
    schemes = ("float32", *QUANTISATION_SCHEMES)
    accumulators = {(scheme, name): ClassificationPredictive(len(x), 10) for scheme in schemes for name, x in sets}

    def evaluate(scheme: str) -> None:
        for name, x in sets:
            accumulators[scheme, name].update(predict(predictor, x))

    for predictor in method.sample_posterior(problem, config, {}):
        evaluate_at_bit_depths(predictor, evaluate)
        evaluate("float32")
    results = {}
    for scheme in schemes:
        metrics = classification_metrics(accumulators[scheme, "test"], ds.test_y.numpy(), ds.cost_matrix.numpy())
        for ood in ds.ood:
            metrics[f"ood_auroc_mi_{ood}"] = ood_metrics(accumulators[scheme, "test"], accumulators[scheme, ood])[
                "ood_auroc_mi"
            ]
        results[scheme] = metrics
    reference = results["float32"]
    reported = ("accuracy", "nll", *sorted(k for k in reference if k.startswith("ood_auroc_mi_")))
    for scheme in schemes:
        changes = ", ".join(f"{k} {results[scheme][k] - reference[k]:+.1e}" for k in reported)
        print(f"{scheme}: accuracy {results[scheme]['accuracy']:.4f}; change from float32: {changes}")
    assert reference["accuracy"] > 0.9
    assert abs(results["float16"]["accuracy"] - reference["accuracy"]) <= 0.005
    assert results["float16"]["nll"] != reference["nll"]  # float16 was in effect, within the tolerance
    for scheme in ("bfloat16", "int8"):  # coarser grids, a looser bound (both measured at 0)
        assert abs(results[scheme]["accuracy"] - reference["accuracy"]) <= 0.01
