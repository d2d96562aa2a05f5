"""Synthetic regression problems with an exact anchor (Schmähling, Martin & Elster, experiments E.1–E.3).

Every problem has the form y = G(x)ᵀγ + ε, ε ~ N(0, σ²) with σ known, where the feature map G is
nonlinear in x but the model is linear in γ ∈ R^p, so the flat-prior Bayesian posterior (the *anchor*,
:mod:`ursa_ray.regression.anchor`) is available in closed form.

Randomness is split in three:

* a fixed **coefficient seed** per experiment draws γ, the same at every complexity level, so that a curve
  over complexity varies the complexity alone, not the random function as well (the paper varies only
  f_main and keeps the function's other coefficients);
* a fixed **input seed** per (experiment, complexity) draws the training inputs: as in the paper, every
  complexity level has its own training set, and every repetition of a level sees the same x;
* the trial's ``seed`` is the **repetition**: it draws only the observation noise ε of the training targets.

Test inputs are deterministic grids that reach beyond the training region; ``test_y`` is the noise-free
truth G(x*)ᵀγ and ``test_info["in_distribution"]`` flags the test points inside the training region.
The named test points the paper reports on are part of every test set (see :func:`named_points`).
Frequencies are angular: sin(f·x) has period 2π/f.

E.1 (``e1``), complexity = f_main ∈ [0.5, 12] (default 2), p = 6, σ = 0.1, N = 200:
    G(x) = (1, x, sin(f x), cos(f x), sin(1.5 f x), cos(1.5 f x)),
    train x ~ U[−4, 4]; test x: the grid −6, −5.9, …, 6 (which holds 1.2) plus −5.11 (OOD) and −2.38: 123 points.
E.2 (``e2``), complexity = input dimension d ∈ {1, …, 16} (default 2), p = 4d, σ = 0.1, N = 200·d:
    G(x) = (1, x_1..x_d, sin x_1..sin x_d, cos x_1..cos x_d, sin(x_1 + x_2), …, sin(x_{d−1} + x_d)),
    train x ~ U[−4, 4]^d; test x on the diagonal x_λ = (1−λ)(−5,…,−5) + λ(5,…,5), λ = 0, 0.01, …, 1
    (named: λ = 0.6 in-distribution, λ = 0.07 OOD); in-distribution iff every coordinate is in [−4, 4].
E.3 (``e3``), complexity = frequency f ∈ [0.5, 8] (default 1), p = 9, σ = 0.1, N = 400:
    G(x) = (1, x_1, x_2, sin f x_1, cos f x_1, sin f x_2, cos f x_2, sin f x_1 · sin f x_2,
    cos f x_1 · cos f x_2), train x ~ U[1, 4]²; test x on the regular grid {−1, −0.75, …, 6}² (841 points).

γ: E.1 and E.3 draw γ_j ~ N(0, 1) except the trend coefficients (x, x_1, x_2), drawn as N(0, 0.3²); p
does not depend on the complexity, so one γ serves every level.  E.2's p = 4d grows with d, so what is held
fixed there is one standard-normal draw per feature of the largest design (d = 16): z_0 for the
intercept and, for every coordinate j, (a_j, b_j, c_j, e_j) for x_j, sin x_j, cos x_j and sin(x_j + x_{j+1}).
Level d uses z_0 and the draws of coordinates 1..d (pairs 1..d−1), scaled by 1/√d so that the function's
scale does not grow with d: γ(d) = (z_0, (a_1..a_d, b_1..b_d, c_1..c_d, e_1..e_{d−1}) / √d).  Going from d
to d + 1 adds coordinate d + 1's terms and rescales the others; it redraws nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ursa_ray.data.base import Dataset, DatasetSpec
from ursa_ray.methods.base import Hyperparameter

EXPERIMENTS = ("e1", "e2", "e3")
NOISE_STD = {"e1": 0.1, "e2": 0.1, "e3": 0.1}
DEFAULT_COMPLEXITY = {"e1": 2.0, "e2": 2.0, "e3": 1.0}
COMPLEXITY_BOUNDS = {"e1": (0.5, 12.0), "e2": (1.0, 16.0), "e3": (0.5, 8.0)}
E2_MAX_DIMENSION = int(COMPLEXITY_BOUNDS["e2"][1])
TRAIN_BOX = {"e1": (-4.0, 4.0), "e2": (-4.0, 4.0), "e3": (1.0, 4.0)}
"""Training inputs are uniform on this interval in every coordinate; it is also the in-distribution region."""

E1_NAMED = {"x=-2.38": -2.38, "x=1.2": 1.2, "x=-5.11": -5.11}
E2_NAMED = {"lambda=0.6": 0.6, "lambda=0.07": 0.07}
E3_GRID = (-1.0, 6.0, 0.25)

_DESIGN_TAG = 20230517  # mixed into every input and coefficient seed; changing it changes every problem
_NOISE_TAG = 977


def n_features(experiment: str, complexity: float) -> int:
    """p, the length of G(x)."""
    if experiment == "e1":
        return 6
    if experiment == "e2":
        return 4 * _dimension(complexity)
    if experiment == "e3":
        return 9
    raise KeyError(experiment)


def input_dim(experiment: str, complexity: float) -> int:
    return _dimension(complexity) if experiment == "e2" else (1 if experiment == "e1" else 2)


def default_n_train(experiment: str, complexity: float) -> int:
    if experiment == "e1":
        return 200
    if experiment == "e2":
        return 200 * _dimension(complexity)
    if experiment == "e3":
        return 400
    raise KeyError(experiment)


def _dimension(complexity: float) -> int:
    d = float(complexity)
    if not d.is_integer() or d < 1:
        raise ValueError(f"e2's complexity is the input dimension d, a positive integer; got {complexity!r}")
    return int(d)


@dataclass(frozen=True)
class FeatureMap:
    """G: inputs (n × d) → features (n × p), in the inputs' floating dtype (float64 in, float64 out).

    A small picklable object, so models holding it can travel to worker processes.
    """

    experiment: str
    complexity: float

    @property
    def p(self) -> int:
        return n_features(self.experiment, self.complexity)

    def __call__(self, x: Tensor) -> Tensor:
        x = torch.as_tensor(x)
        if not torch.is_floating_point(x):
            x = x.to(torch.get_default_dtype())
        x = x.reshape(x.shape[0], -1)
        f = float(self.complexity)
        if self.experiment == "e1":
            t = x[:, 0]
            cols = [torch.ones_like(t), t]
            for scale in (1.0, 1.5):
                cols += [torch.sin(scale * f * t), torch.cos(scale * f * t)]
            return torch.stack(cols, dim=1)
        if self.experiment == "e2":
            d = _dimension(self.complexity)
            if x.shape[1] != d:
                raise ValueError(f"e2 with d={d} needs inputs of width {d}, got {x.shape[1]}")
            parts = [torch.ones_like(x[:, :1]), x, torch.sin(x), torch.cos(x), torch.sin(x[:, :-1] + x[:, 1:])]
            return torch.cat(parts, dim=1)
        if self.experiment == "e3":
            a, b = x[:, 0], x[:, 1]
            sa, ca, sb, cb = torch.sin(f * a), torch.cos(f * a), torch.sin(f * b), torch.cos(f * b)
            return torch.stack([torch.ones_like(a), a, b, sa, ca, sb, cb, sa * sb, ca * cb], dim=1)
        raise KeyError(self.experiment)


def inputs_seed(experiment: str, complexity: float) -> int:
    """The fixed seed of the training inputs of one (experiment, complexity)."""
    return int(
        np.random.SeedSequence(
            [_DESIGN_TAG, EXPERIMENTS.index(experiment), int(round(1000 * complexity))]
        ).generate_state(1)[0]
    )


def coefficients_seed(experiment: str) -> int:
    """The fixed seed of γ, one per experiment: it does not depend on the complexity."""
    return int(np.random.SeedSequence([_DESIGN_TAG, EXPERIMENTS.index(experiment)]).generate_state(1)[0])


def coefficients(experiment: str, complexity: float) -> np.ndarray:
    """γ (p), float64: one draw per experiment, shared by every complexity level (see the module docstring)."""
    rng = np.random.default_rng(coefficients_seed(experiment))
    if experiment == "e2":
        d = _dimension(complexity)
        intercept = rng.standard_normal()
        # row j: the draws for x_j, sin x_j, cos x_j and sin(x_j + x_{j+1})
        per_coordinate = rng.standard_normal((E2_MAX_DIMENSION, 4))
        linear, sine, cosine, pair = per_coordinate[:d].T
        return np.concatenate([[intercept], np.concatenate([linear, sine, cosine, pair[: d - 1]]) / np.sqrt(d)])
    gamma = rng.standard_normal(n_features(experiment, complexity))
    if experiment == "e1":
        gamma[1] *= 0.3
    elif experiment == "e3":
        gamma[1:3] *= 0.3
    return gamma


def design(experiment: str, complexity: float, n_train: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(train_x (N × d), γ (p)) in float64, the same for every repetition: the training inputs from the
    level's input seed, γ from the experiment's coefficient seed (:func:`coefficients`)."""
    n = default_n_train(experiment, complexity) if not n_train else int(n_train)
    low, high = TRAIN_BOX[experiment]
    x_rng = np.random.default_rng([inputs_seed(experiment, complexity), 0])
    train_x = x_rng.uniform(low, high, size=(n, input_dim(experiment, complexity)))
    return train_x, coefficients(experiment, complexity)


def eval_inputs(experiment: str, complexity: float) -> np.ndarray:
    """The fixed test inputs (M × d), float64, named points included exactly."""
    if experiment == "e1":
        grid = np.arange(-60, 61) / 10.0
        named = [v for v in E1_NAMED.values() if not np.isclose(grid, v, atol=1e-9).any()]  # 1.2 is on the grid
        return np.sort(np.concatenate([grid, named]))[:, None]
    if experiment == "e2":
        d = _dimension(complexity)
        lam = np.arange(101) / 100.0
        t = -5.0 + np.arange(101) / 10.0  # = (1 − λ)(−5) + 5λ, written so that λ = k/100 is exact
        assert np.allclose(t, -5 + 10 * lam)
        return np.repeat(t[:, None], d, axis=1)
    if experiment == "e3":
        start, stop, step = E3_GRID
        axis = start + step * np.arange(int(round((stop - start) / step)) + 1)
        a, b = np.meshgrid(axis, axis, indexing="ij")
        return np.stack([a.ravel(), b.ravel()], axis=1)
    raise KeyError(experiment)


def in_distribution(experiment: str, x: np.ndarray) -> np.ndarray:
    """True where every coordinate lies in the training box."""
    low, high = TRAIN_BOX[experiment]
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    return np.all((x >= low - 1e-9) & (x <= high + 1e-9), axis=1)


def named_points(experiment: str, complexity: float) -> dict[str, np.ndarray]:
    """The paper's reported test points: label → input (length-d array); empty for E.3."""
    if experiment == "e1":
        return {label: np.array([v]) for label, v in E1_NAMED.items()}
    if experiment == "e2":
        d = _dimension(complexity)
        return {label: np.full(d, -5.0 + 10.0 * lam) for label, lam in E2_NAMED.items()}
    return {}


def noise(experiment: str, complexity: float, seed: int, n: int) -> np.ndarray:
    """The repetition's noise draw ε ~ N(0, σ²) (float64), determined by ``seed`` alone per experiment."""
    rng = np.random.default_rng([_NOISE_TAG, EXPERIMENTS.index(experiment), int(seed)])
    return NOISE_STD[experiment] * rng.standard_normal(n)


def make_dataset(experiment: str, complexity: float, seed: int, n_train: int | None = None) -> Dataset:
    """One repetition (``seed``) of one experiment at one complexity."""
    lo, hi = COMPLEXITY_BOUNDS[experiment]
    complexity = float(complexity)
    if not lo <= complexity <= hi:
        raise ValueError(f"{experiment}'s complexity must lie in [{lo}, {hi}], got {complexity}")
    if experiment == "e2":
        _dimension(complexity)
    gmap = FeatureMap(experiment, complexity)
    train_x, gamma = design(experiment, complexity, n_train)
    if train_x.shape[0] <= gmap.p:
        raise ValueError(f"{experiment} needs more than p = {gmap.p} training points, got {train_x.shape[0]}")
    test_x = eval_inputs(experiment, complexity)
    g = torch.from_numpy(gamma)
    train_f = gmap(torch.from_numpy(train_x)) @ g
    truth = gmap(torch.from_numpy(test_x)) @ g
    train_y = train_f.numpy() + noise(experiment, complexity, seed, train_x.shape[0])
    return Dataset(
        name=experiment,
        task="regression",
        input_shape=(train_x.shape[1],),
        n_outputs=1,
        train_x=torch.from_numpy(train_x).to(torch.float32),
        train_y=torch.from_numpy(train_y).to(torch.float32),
        test_x=torch.from_numpy(test_x).to(torch.float32),
        test_y=truth.to(torch.float32),
        noise_std=NOISE_STD[experiment],
        test_info={"in_distribution": torch.from_numpy(in_distribution(experiment, test_x))},
        feature_map=gmap,
    )


def _loader(experiment: str):
    def load(options: Mapping[str, Any], ood_names: tuple[str, ...], root: Path, download: bool, seed: int) -> Dataset:
        if ood_names:
            raise ValueError(f"{experiment} is a regression problem; its OOD points are part of the test set")
        complexity = options.get("complexity", DEFAULT_COMPLEXITY[experiment])
        return make_dataset(experiment, complexity, seed, options.get("n_train") or None)

    return load


def _options(experiment: str, doc: str) -> tuple[Hyperparameter, ...]:
    lo, hi = COMPLEXITY_BOUNDS[experiment]
    return (
        Hyperparameter("complexity", float, DEFAULT_COMPLEXITY[experiment], doc, low=lo, high=hi),
        Hyperparameter("n_train", int, 0, "training set size; 0 = the experiment's default", low=0),
    )


DATASETS = (
    DatasetSpec(
        name="e1",
        task="regression",
        description="E.1: 1-D sinusoid regression, train x in [-4, 4], test x in [-6, 6]; complexity = f_main",
        load=_loader("e1"),
        options=_options("e1", "main angular frequency f_main of the sinusoid features"),
        sweep="complexity",
    ),
    DatasetSpec(
        name="e2",
        task="regression",
        description="E.2: d-dim regression, train x in [-4, 4]^d, test on the diagonal of [-5, 5]^d; complexity = d",
        load=_loader("e2"),
        options=_options("e2", "input dimension d (an integer)"),
        sweep="complexity",
    ),
    DatasetSpec(
        name="e3",
        task="regression",
        description="E.3: 2-D regression, train x in [1, 4]^2, test on a 29x29 grid over [-1, 6]^2; complexity = frequency",
        load=_loader("e3"),
        options=_options("e3", "angular frequency f of the 2-D sinusoid features"),
        sweep="complexity",
    ),
)
