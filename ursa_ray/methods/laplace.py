"""Laplace approximations after SGD training, through laplace-torch (Daxberger, Kristiadi, Immer,
Eschenhagen, Bauer & Hennig 2021, "Laplace Redux — effortless Bayesian deep learning"), the maintained
library, rather than our own implementation: ursa-ray's first built-in method that wraps a library.

Training: ``epochs`` epochs of SGD (:func:`train_sgd`) towards θ_MAP, the minimiser of
−(1/N) Σₙ log p(yₙ | xₙ, θ) + (wd/2)‖θ‖², i.e. the MAP under the prior N(0, (wd·N)⁻¹ I).  The
approximation is centred on the last SGD iterate, which is the MAP only once training has converged: give
the method enough epochs (a cosine schedule helps mini-batch SGD settle); the exactness test trains full
batch to convergence.

Posterior (MacKay 1992): on the weights θ_s it covers (``subset_of_weights``: the output layer, the last
``nn.Linear`` of the network, or all weights; the others stay at θ_MAP),

    q(θ_s) = N(θ_MAP,s, Λ⁻¹),   Λ = Σₙ Jₙᵀ Hₙ Jₙ + P₀,

Jₙ = ∂f(xₙ)/∂θ_s at θ_MAP, Hₙ = I/σ² (Gaussian likelihood with the dataset's known σ) or diag(pₙ) − pₙpₙᵀ
(softmax): the generalised Gauss–Newton matrix of the negative log-likelihood (laplace-torch's default
curvlinops backend), equal to its Hessian for the output layer and for any model linear in θ.  P₀ is the
prior precision, λ₀ I (``prior_structure`` scalar), one λ per parameter tensor (layerwise) or one per
weight (diag).  ``hessian_structure`` shapes the likelihood term: ``full`` (a dense P_s × P_s matrix: for
the output layer or small networks only; all weights of the MLP 784-200-200-10 would need P² ≈ 4·10¹⁰
numbers), ``diag``, or ``kron`` (Kronecker-factored: an output-side and an input-side factor per weight
matrix, one factor per bias; KFAC, Ritter, Botev & Barber 2018).

Prior precision: fixed at ``prior_precision`` (``optimize_prior_precision`` none), or initialised there and
set post hoc by maximising laplace-torch's Laplace approximation of the log marginal likelihood (MacKay
1992)

    log p(D | P₀) ≈ log p(D | θ_MAP) − ½ θ_MAP,sᵀ P₀ θ_MAP,s − ½ log(det Λ / det P₀),

by ``marglik_steps`` Adam steps (learning rate 0.1) on log P₀ (``marglik``); θ_MAP is not retrained, and
for regression σ stays at the dataset's known value.  With ``none`` and ``prior_precision`` = wd·N, q is
the Laplace approximation of the very posterior whose MAP SGD sought.

Predictive: a stream of ``n_samples`` networks, each with θ_s ~ q drawn afresh (laplace-torch's
``sample``; on the trial's device, from a generator seeded by the trial's data stream) and loaded into
the trained network, so the evaluator's average of softmax outputs is the Monte Carlo ("nn" sampling)
predictive.  laplace-torch's closed-form linearised predictives (probit, Laplace bridge) give one predictive
distribution per input rather than networks, so they do not fit the sample-stream interface and are not
offered; for the output layer the network is linear in θ_s, so the sampled outputs are exactly the
linearised ones and sampling estimates the softmax integral that probit approximates.  The curvature pass
sees the training inputs in order, ``batch_size`` at a time, without augmentation; batch-norm statistics
stay those of θ_MAP (as in laplace-torch).

laplace-torch rejects two combinations under ``marglik``, declared as :class:`Constraint` so validation
catches them before any trial: a diagonal prior with ``kron``, and a layer-wise prior with
``last_layer``.

Batched (:mod:`~ursa_ray.methods.batched`): the seeds of a grid cell train to θ_MAP as one computation
(:func:`~ursa_ray.methods.batched.train_sgd_copies`); each seed's Laplace fit and draws then run on its own,
interleaved, so every seed's posteriors are held at once (``batched_copies`` counts them for the memory cap).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

from ursa_ray.methods._training import SGD_HYPERPARAMETERS, train_sgd
from ursa_ray.methods.base import (
    Constraint,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    StorageCount,
    check_constraints,
    n_parameters,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks, train_sgd_copies

if TYPE_CHECKING:
    from laplace.baselaplace import ParametricLaplace

LAPLACE_HYPERPARAMETERS = (
    Hyperparameter(
        "subset_of_weights",
        str,
        "last_layer",
        "weights under the Laplace posterior: the output layer (last nn.Linear) or all; the rest stay at θ_MAP",
        choices=("last_layer", "all"),
    ),
    Hyperparameter(
        "hessian_structure",
        str,
        "kron",
        "structure of the GGN: kron (KFAC, per layer), diag, or full (P_s² numbers: output layer or small "
        "networks only)",
        choices=("kron", "diag", "full"),
    ),
    Hyperparameter(
        "prior_precision",
        float,
        1.0,
        "λ₀ of the prior N(0, λ₀⁻¹ I) on the posterior's weights (the start of marglik); SGD's weight decay "
        "wd implies λ₀ = wd·N",
        low=1e-12,
    ),
    Hyperparameter(
        "optimize_prior_precision",
        str,
        "marglik",
        "marglik: maximise the Laplace log marginal likelihood over the prior precision, post hoc; none: keep "
        "prior_precision",
        choices=("marglik", "none"),
    ),
    Hyperparameter(
        "prior_structure",
        str,
        "scalar",
        "prior precision that marglik fits: one λ (scalar), one per parameter tensor (layerwise) or one per "
        "weight (diag)",
        choices=("scalar", "layerwise", "diag"),
    ),
    Hyperparameter("marglik_steps", int, 100, "Adam steps (learning rate 0.1) on log prior precision", low=1),
    Hyperparameter("n_samples", int, 30, "S: weight draws from the Laplace posterior (Monte Carlo predictive)", low=1),
)


def _kron_prior(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """laplace-torch's Kronecker-factored posterior takes a scalar or per-layer prior precision."""
    if (config["optimize_prior_precision"], config["hessian_structure"], config["prior_structure"]) != (
        "marglik",
        "kron",
        "diag",
    ):
        return None
    return (
        "prior_structure must be scalar or layerwise with hessian_structure=kron and optimize_prior_precision="
        "marglik (laplace-torch's Kronecker-factored posterior takes no per-weight prior); got prior_structure=diag"
    )


def _last_layer_prior(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """laplace-torch's last-layer posteriors take a scalar or per-weight prior precision."""
    if (config["optimize_prior_precision"], config["subset_of_weights"], config["prior_structure"]) != (
        "marglik",
        "last_layer",
        "layerwise",
    ):
        return None
    return (
        "prior_structure must be scalar or diag with subset_of_weights=last_layer and optimize_prior_precision="
        "marglik (laplace-torch's last-layer posteriors take no per-layer prior); got prior_structure=layerwise"
    )


KRON_PRIOR = Constraint(
    ("prior_structure", "hessian_structure", "optimize_prior_precision"),
    "prior_structure ≠ diag when hessian_structure = kron and optimize_prior_precision = marglik",
    _kron_prior,
)
LAST_LAYER_PRIOR = Constraint(
    ("prior_structure", "subset_of_weights", "optimize_prior_precision"),
    "prior_structure ≠ layerwise when subset_of_weights = last_layer and optimize_prior_precision = marglik",
    _last_layer_prior,
)


def output_layer_name(model: nn.Module) -> str:
    """The dotted name of the last ``nn.Linear`` of ``model`` (its output layer in every ursa-ray model)."""
    names = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    if not names:
        raise ValueError(f"{type(model).__name__} has no nn.Linear layer, so last-layer Laplace cannot apply")
    return names[-1]


def posterior_parameters(model: nn.Module, subset_of_weights: str) -> list[nn.Parameter]:
    """The parameters under the Laplace posterior, in laplace-torch's order: the output layer's
    (``last_layer``) or every parameter (``all``)."""
    if subset_of_weights == "last_layer":
        return list(model.get_submodule(output_layer_name(model)).parameters())
    return list(model.parameters())


def load_vector(parameters: list[nn.Parameter], vector: Tensor) -> None:
    """Copy ``vector`` (each parameter flattened in its logical order, as laplace-torch's samples are) into
    ``parameters``, keeping their memory layout."""
    offset = 0
    with torch.no_grad():
        for p in parameters:
            p.copy_(vector[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()


def _curvature_loader(x: Tensor, y: Tensor, batch_size: int) -> DataLoader:
    """The training set in order, ``batch_size`` examples a batch, without augmentation."""
    dataset = TensorDataset(x, y)
    return DataLoader(dataset, batch_size=None, sampler=BatchSampler(SequentialSampler(dataset), batch_size, False))


def fit_laplace(
    problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
) -> tuple[nn.Module, ParametricLaplace]:
    """A fresh model trained by SGD to θ_MAP and laplace-torch's posterior around it (:func:`laplace_around`).
    ``stats`` gets ``grad_evals`` (SGD steps) too."""
    model = train_sgd(problem.make_model(), problem, config, stats)
    return model, laplace_around(model, problem, config, stats)


def laplace_around(
    model: nn.Module, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
) -> ParametricLaplace:
    """laplace-torch's posterior around the trained ``model`` (θ_MAP), its prior precision optimised when
    ``optimize_prior_precision`` is marglik.

    Puts the model in evaluation mode.  ``stats`` gets ``laplace_params`` (P_s), ``prior_precision`` (the
    final prior precision; the mean of its entries for a layer-wise or diagonal prior) and ``log_marglik``
    (the Laplace log marginal likelihood at it).
    """
    # imported here, not at the top: laplace-torch pulls in torchmetrics (seconds), and every command and
    # worker imports every method module to list the registry
    with warnings.catch_warnings():  # asdl, which laplace-torch imports, calls the deprecated torch.jit.script
        warnings.simplefilter("ignore", FutureWarning)
        from laplace import Laplace as laplace_approximation

    model.eval()
    options: dict[str, Any] = {}
    if config["subset_of_weights"] == "last_layer":
        options["last_layer_name"] = output_layer_name(model)
    if problem.likelihood.name == "gaussian":
        likelihood, targets = "regression", problem.y.reshape(problem.n_train, -1)
        options["sigma_noise"] = problem.likelihood.noise_std
    elif problem.likelihood.name == "categorical":
        likelihood, targets = "classification", problem.y
    else:
        raise ValueError(f"laplace supports the gaussian and categorical likelihoods, not {problem.likelihood.name!r}")
    la = laplace_approximation(
        model,
        likelihood,
        subset_of_weights=config["subset_of_weights"],
        hessian_structure=config["hessian_structure"],
        prior_precision=config["prior_precision"],
        **options,
    )
    la.fit(_curvature_loader(problem.x, targets, config["batch_size"]))
    if config["optimize_prior_precision"] == "marglik":
        with warnings.catch_warnings():  # a reminder about the probit predictive, which marglik does not use
            warnings.filterwarnings("ignore", message="By default `link_approx` is `probit`")
            la.optimize_prior_precision(
                method="marglik",
                n_steps=config["marglik_steps"],
                init_prior_prec=config["prior_precision"],
                prior_structure=config["prior_structure"],
            )
    stats["laplace_params"] = la.n_params
    stats["prior_precision"] = float(torch.as_tensor(la.prior_precision).mean())
    with torch.no_grad():
        stats["log_marglik"] = float(la.log_marginal_likelihood())
    return la


def laplace_samples(
    model: nn.Module, la: ParametricLaplace, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
) -> Iterator[nn.Module]:
    """``n_samples`` draws θ_s ~ q, each loaded into ``model``, from a generator on the problem's device
    seeded by one draw from ``problem.generator``."""
    parameters = posterior_parameters(model, config["subset_of_weights"])
    seed = int(torch.randint(2**62, (1,), generator=problem.generator))
    generator = torch.Generator(device=problem.device).manual_seed(seed)
    for s in range(config["n_samples"]):
        load_vector(parameters, la.sample(1, generator)[0])
        stats["n_samples"] = s + 1
        yield model


def _kron_factor_values(p: Tensor) -> int:
    """Numbers in laplace-torch's Kronecker factors of one parameter: d² for a bias of d entries,
    out² + (numel/out)² for a weight with ``out`` output units (linear or convolution)."""
    if p.dim() == 1:
        return p.numel() ** 2
    out = p.shape[0]
    return out**2 + (p.numel() // out) ** 2


def laplace_storage(sample: nn.Module, config: Mapping[str, Any], n_samples: int) -> StorageCount:
    """The Laplace posterior, whatever S: θ_MAP (P weights) and the posterior precision Λ over the P_s
    weights it covers.  ``full``: Λ, P_s² weights; ``diag``: its diagonal, P_s weights (both with the prior
    added in); ``kron``: the Kronecker factors of the GGN, per parameter tensor d² for a bias and
    out² + in² for a weight, as weights, and the prior precision (1 value, or one per parameter tensor when
    marglik fits a layer-wise one) as other values, since Λ = GGN + P₀ is not itself Kronecker-factored."""
    parameters = posterior_parameters(sample, config["subset_of_weights"])
    n_posterior = sum(p.numel() for p in parameters)
    structure = config["hessian_structure"]
    if structure == "full":
        return StorageCount(weights=n_parameters(sample) + n_posterior**2)
    if structure == "diag":
        return StorageCount(weights=n_parameters(sample) + n_posterior)
    layerwise = config["optimize_prior_precision"] == "marglik" and config["prior_structure"] == "layerwise"
    return StorageCount(
        weights=n_parameters(sample) + sum(_kron_factor_values(p) for p in parameters),
        other_values=len(parameters) if layerwise else 1,
    )


class Laplace(Method):
    name = "laplace"
    description = (
        "Laplace approximation N(θ_MAP, (GGN + P₀)⁻¹) after SGD, through laplace-torch: last-layer or all "
        "weights, KFAC / diagonal / full, prior precision by marginal likelihood; one weight draw per sample"
    )
    hyperparameters = SGD_HYPERPARAMETERS + LAPLACE_HYPERPARAMETERS
    constraints = (KRON_PRIOR, LAST_LAYER_PRIOR)
    posterior_storage = staticmethod(laplace_storage)

    def model_refusal(self, model: Any, config: Mapping[str, Any]) -> str | None:
        """laplace-torch's diagonal and full curvature of every weight take per-example Jacobians (forward-mode
        AD), which cannot pass through a sparse matrix product (the GCN's propagation; ``expand is unsupported
        for Sparse tensors``); KFAC and the last layer only need the Linear layers' inputs and outputs."""
        if (
            getattr(model, "sparse_propagation", False)
            and config["subset_of_weights"] == "all"
            and config["hessian_structure"] in ("diag", "full")
        ):
            return (
                f"subset_of_weights=all with hessian_structure={config['hessian_structure']} cannot differentiate "
                f"{model.name}'s sparse propagation; use hessian_structure=kron or subset_of_weights=last_layer"
            )
        return None

    def warm_up(self, device: torch.device) -> None:
        """Import laplace-torch (and the torchmetrics it pulls in, about 1 s) once per worker, in
        ``worker_setup_s`` rather than in the first laplace trial's ``train_s``."""
        import laplace  # noqa: F401

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        check_constraints(self, config, problem.n_train)
        model, la = fit_laplace(problem, config, stats)
        yield from laplace_samples(model, la, problem, config, stats)

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """A copy's network in training, then its Laplace posterior (:func:`laplace_storage`), in networks'
        training state (4 values per parameter)."""
        return 1 + math.ceil(laplace_storage(model, config, 1).weights / (4 * n_parameters(model)))

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's SGD run to θ_MAP as one batched computation; then each problem's Laplace fit and
        draws on their own, one draw of each per item."""
        check_constraints(self, config, problems[0].n_train)
        stacked = StackedNetworks([problem.make_model() for problem in problems])
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        steps = train_sgd_copies(stacked, data, problems[0].likelihood, config)
        for one in stats:
            one["grad_evals"] = one.get("grad_evals", 0.0) + steps
        streams = [
            laplace_samples(model, laplace_around(model, problem, config, one), problem, config, one)
            for model, problem, one in zip(stacked.models, problems, stats, strict=True)
        ]
        for samples in zip(*streams, strict=True):
            yield list(samples)


METHODS = (Laplace(),)
