"""Posterior distillation: an SGLD teacher chain distilled online into one student network.

Both methods run the SGLD chain of :mod:`ursa_ray.methods.sgmcmc` (:class:`~ursa_ray.methods.sgmcmc.LangevinChain`,
constant step size, the same hyperparameters ``lr``, ``prior_std``, ``temperature``, ``batch_size``) for
``epochs`` epochs; after the first ``burn_in_epochs``, every ``distill_every`` teacher steps the teacher's
current parameters θ_t are one Monte Carlo sample, and the student takes one Adam step (``student_lr``) on a
fresh mini-batch of perturbed training inputs x' = x + ``input_noise_std``·ε, ε ~ N(0, I) (Balan et al.'s
student data D': training inputs perturbed by Gaussian noise), with the teacher's outputs on x' as targets.
Only the current teacher sample and the student are held: memory is two networks (plus Adam's two moments
of the student), whatever the number of teacher samples.

* ``bdk``, Bayesian Dark Knowledge (Balan et al. 2015): the student S(y | x, w) minimises the Monte Carlo
  estimate of KL(p(y | x, D) ‖ S(y | x, w)) over x ~ D', one teacher sample at a time:
  loss(w) = −(1/|B'|) Σ_{x'∈B'} Σ_k p(k | x', θ_t) log S(k | x', w) (soft-target cross-entropy; it differs
  from the KL by the teacher's entropy, constant in w).  Averaged over θ_t its minimiser is the posterior
  predictive p̄(y | x) = E_θ[p(y | x, θ)].  For a Gaussian likelihood of known noise σ the KL between
  N(f_t, σ²) and N(f_s, σ²) is (f_s − f_t)²/(2σ²), the loss used there (the student predicts the mean;
  Balan et al. also distil a variance, which is not done here, so a grid may not name ``bdk`` on a
  regression dataset: ``tasks`` is classification only; the loss serves direct use from Python).
* ``gped``, Generalized Posterior Expectation Distillation (Vadera et al. 2020a), classification only:
  the student (:class:`ExpectationStudent`) has two heads on one network, logits for the posterior
  predictive and h(x) for the expected entropy E_θ[H[p(· | x, θ)]].  Each head regresses its own
  posterior expectation from one teacher sample at a time:
  loss = soft-target cross-entropy(logits, p(· | x', θ_t)) + (h(x') − H[p(· | x', θ_t)])²,
  whose minimisers over the teacher's samples are p̄(x) and E_θ[H[p_θ(x)]].  h is parameterised as the
  student's predictive entropy less a non-negative knowledge uncertainty, h = H[s] − softplus(g)
  (:func:`expected_entropy`), which builds in E_θ H[p_θ] ≤ H[p̄]: fitted as a free softplus head, h and
  H[s] erred independently by more than the mutual information of most inputs, and max(H[s] − h, 0)
  clipped 54% of the digits test inputs to 0 (Spearman with the teacher's MI 0.59; now none clipped, 0.75).
  The student alone then gives total uncertainty H[p̄], aleatoric uncertainty h(x) and knowledge
  uncertainty H[p̄] − h(x) = softplus(g(x)) in one forward pass; the trial hands max(h(x), 0) to the
  accumulator through ``distilled_expected_entropy``
  (:class:`~ursa_ray.evaluation.predictive.ClassificationPredictive`).

The student is a fresh ``problem.make_model()`` (the teacher's architecture), trained in training mode; the
teacher's outputs on x' are computed without gradients in evaluation mode (batch-norm statistics untouched).
The method yields one sample, the student.  ``stats``: ``teacher_steps`` (teacher gradient evaluations, one
mini-batch backward pass each), ``student_steps`` (one backward pass through the student each; the teacher's
forward pass on x' is not a gradient evaluation), ``grad_evals`` = their sum, ``teacher_samples`` = the
teacher samples distilled (= ``student_steps``), ``n_samples`` = 1.  At test time the student alone counts:
one network's storage (plus the entropy head for ``gped``) and one forward pass per prediction.

Batched (:mod:`~ursa_ray.methods.batched`): the seeds of a grid cell run their teacher chains
(:class:`~ursa_ray.methods.sgmcmc.LangevinCopies`) and their students (:class:`StudentCopies`) as one
computation each, every copy with the random streams it has alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ursa_ray.evaluation.precision import Float32Linear
from ursa_ray.methods._training import autocast_body, optimiser_options
from ursa_ray.methods.base import (
    Constraint,
    Hyperparameter,
    Method,
    Predictor,
    Problem,
    check_constraints,
    one_network_storage,
)
from ursa_ray.methods.batched import CopyData, StackedNetworks
from ursa_ray.methods.sgmcmc import CHAIN_CONSTRAINTS, LangevinChain, LangevinCopies, _common, _steps_per_epoch


def _hyperparameters(distill_every: int) -> tuple[Hyperparameter, ...]:
    return _common(lr=0.1, prior_std=0.17) + (
        Hyperparameter("epochs", int, 150, "teacher epochs in all, burn-in included", low=1),
        Hyperparameter("burn_in_epochs", int, 50, "teacher epochs before the student starts learning", low=0),
        Hyperparameter(
            "distill_every",
            int,
            distill_every,
            "teacher steps between two student steps after burn-in (each distils the teacher's current sample)",
            low=1,
        ),
        Hyperparameter("student_lr", float, 1e-3, "Adam learning rate of the student", low=0.0),
        Hyperparameter(
            "input_noise_std",
            float,
            0.1,
            "std of the Gaussian noise added to the student's training inputs (its data D')",
            low=0.0,
        ),
    )


def _student_steps(n_train: int, config: Mapping[str, Any]) -> int:
    """Student steps (teacher samples distilled): one every ``distill_every`` post-burn-in teacher steps."""
    per_epoch = _steps_per_epoch(n_train, config)
    return max(0, config["epochs"] - config["burn_in_epochs"]) * per_epoch // config["distill_every"]


def _distils_something(config: Mapping[str, Any], n_train: int | None) -> str | None:
    """At least one student step after burn-in (checked when ``n_train`` is known)."""
    if n_train is None or _student_steps(n_train, config) >= 1:
        return None
    sampling = (config["epochs"] - config["burn_in_epochs"]) * _steps_per_epoch(n_train, config)
    return (
        f"distill_every must be at most the {sampling} post-burn-in teacher steps ((epochs − burn_in_epochs) × "
        f"{_steps_per_epoch(n_train, config)} steps per epoch of {n_train} examples at batch_size "
        f"{config['batch_size']}); got distill_every={config['distill_every']}"
    )


CONSTRAINTS = (
    CHAIN_CONSTRAINTS[0],  # burn_in_epochs < epochs
    Constraint(
        ("distill_every", "epochs", "burn_in_epochs", "batch_size"),
        "distill_every ≤ (epochs − burn_in_epochs) · ⌈N / batch_size⌉ (N training examples)",
        _distils_something,
    ),
)


def _entropy(probs: Tensor) -> Tensor:
    return torch.special.entr(probs).sum(-1)


def output_layer(network: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` of ``network`` (its output layer: the models here end in one)."""
    linears = [m for m in network.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("gped's expected-entropy head needs a network whose output layer is an nn.Linear")
    return linears[-1]


def expected_entropy(logits: Tensor, knowledge: Tensor) -> Tensor:
    """GPED's expected-entropy head h(x) = H[s(x)] − softplus(g(x)) from the student's logits (..., K) and
    the knowledge head's output g(x) (..., 1): the student's predictive entropy less a knowledge uncertainty
    m(x) = softplus(g(x)) ≥ 0, H[s] held fixed (no gradient: only the cross-entropy trains the logits).

    Its least-squares target E_θ H[p_θ(x)] is unchanged, so m(x) learns H[s(x)] − E_θ H[p_θ(x)], which for
    s = p̄ is the mutual information, ≥ 0 by the concavity of entropy; the distilled MI, H[s] − h(x), is
    then m(x) itself, never a difference of two separately fitted entropies clipped at 0.  In float32."""
    entropy = _entropy(torch.softmax(logits.detach().float(), -1))
    return entropy - nn.functional.softplus(knowledge.float()).squeeze(-1)


class ExpectationStudent(nn.Module):
    """GPED's student: ``network`` (logits, the posterior-predictive head) and a second head on the output
    layer's inputs (the penultimate features φ(x)), g(x) = v·φ(x) + c, giving the expected entropy
    h(x) = H[s(x)] − softplus(g(x)) (:func:`expected_entropy`).

    The head starts at v = 0, c = 0 and computes in float32 (:class:`~ursa_ray.evaluation.precision.Float32Linear`,
    also under a bfloat16 autocast: h feeds the mutual information, a small difference of entropies).
    ``outputs(x)`` returns the logits and h(x) (trained on); ``forward(x)`` the logits and
    ``distilled_expected_entropy(x)`` max(h(x), 0), an entropy; each runs the whole student (both heads),
    so one forward pass, the one FLOPs are counted on, is the cost of a prediction.  An ``nn.Module`` whose
    parameters are the network's and the head's (storage, bit depths).
    """

    def __init__(self, network: nn.Module):
        super().__init__()
        self.network = network
        layer = output_layer(network)
        # no random draw, so the teacher built next gets the initialisation it would get without the head,
        # batched or not
        self.entropy_head = nn.utils.skip_init(Float32Linear, layer.in_features, 1, device=layer.weight.device)
        nn.init.zeros_(self.entropy_head.weight)
        nn.init.zeros_(self.entropy_head.bias)
        self._features: Tensor | None = None
        layer.register_forward_hook(self._keep_features)

    def _keep_features(self, module: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> None:
        self._features = inputs[0]

    def outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(logits, h(x)) of one pass."""
        logits = self.network(x)
        features, self._features = self._features, None
        return logits, expected_entropy(logits, self.entropy_head(features))

    def forward(self, x: Tensor) -> Tensor:
        return self.outputs(x)[0]

    def distilled_expected_entropy(self, x: Tensor) -> Tensor:
        return self.outputs(x)[1].clamp_min(0.0)


StudentLoss = Callable[[nn.Module, Tensor, Tensor], Tensor]
"""``loss(student, x', teacher outputs on x')``: the student's loss on one mini-batch."""


def soft_cross_entropy(student_logits: Tensor, teacher_logits: Tensor) -> Tensor:
    """−mean_x Σ_k p_t(k | x) log s(k | x): the KL from the teacher's to the student's predictive, less the
    teacher's entropy (constant in the student).  Logits (..., B, K) give one value per leading index (a
    scalar for one student, (C,) for C batched students)."""
    targets = torch.softmax(teacher_logits.float(), -1)
    return -(targets * torch.log_softmax(student_logits.float(), -1)).sum(-1).mean(-1)


def gaussian_kl(student_outputs: Tensor, teacher_outputs: Tensor, noise_std: float) -> Tensor:
    """(f_s − f_t)²/(2σ²) averaged over a mini-batch of (..., B, out) outputs, one value per leading index."""
    squared = (student_outputs.float() - teacher_outputs.float()) ** 2
    return 0.5 / noise_std**2 * squared.flatten(-2).mean(-1)


def expectation_loss(logits: Tensor, entropy: Tensor, teacher_logits: Tensor) -> Tensor:
    """GPED's loss: soft-target cross-entropy on the predictive head + squared error of the expected-entropy
    head h(x') (..., B) against H[p(· | x', θ_t)], one value per leading index."""
    target = _entropy(torch.softmax(teacher_logits.float(), -1))
    return soft_cross_entropy(logits, teacher_logits) + ((entropy - target) ** 2).mean(-1)


def bdk_loss(problem: Problem) -> StudentLoss:
    """Balan et al.'s per-sample KL: soft-target cross-entropy, or (f_s − f_t)²/(2σ²) for a Gaussian."""
    if problem.likelihood.name == "gaussian":
        noise_std = problem.likelihood.noise_std
        return lambda student, x, teacher: gaussian_kl(student(x), teacher, noise_std)
    return lambda student, x, teacher: soft_cross_entropy(student(x), teacher)


def gped_loss(student: ExpectationStudent, x: Tensor, teacher_logits: Tensor) -> Tensor:
    """:func:`expectation_loss` of the student's two heads."""
    return expectation_loss(*student.outputs(x), teacher_logits)


class StudentTrainer:
    """The student's side: one Adam step on perturbed inputs against a given teacher network.

    Each :meth:`step` draws ``batch_size`` training inputs uniformly with replacement (``problem.augment``
    applied where the dataset has one) and adds N(0, input_noise_std²) noise, all from the student's own
    generator on the problem's device, seeded once from ``problem.generator`` (one draw, at construction):
    the teacher's stream (its mini-batch order, its augmentation) is never drawn from by the student.
    """

    def __init__(self, student: nn.Module, loss: StudentLoss, problem: Problem, config: Mapping[str, Any]):
        self.student, self.loss, self.problem = student, loss, problem
        self.batch_size, self.noise_std = config["batch_size"], config["input_noise_std"]
        self.optimiser = torch.optim.Adam(
            student.parameters(), lr=config["student_lr"], **optimiser_options(problem.device)
        )
        seed = int(torch.randint(0, 2**62, (1,), generator=problem.generator))
        self.generator = torch.Generator(problem.device).manual_seed(seed)
        self.steps = 0
        student.train()

    def inputs(self) -> Tensor:
        """One mini-batch of the student's data D': perturbed training inputs."""
        index = torch.randint(
            0, self.problem.n_train, (self.batch_size,), generator=self.generator, device=self.problem.device
        )
        x = self.problem.x[index]
        if self.problem.augment is not None:
            x = self.problem.augment(x, self.generator)  # the student's own stream, never the teacher's
        if self.noise_std > 0:
            x = x + self.noise_std * torch.randn(x.shape, generator=self.generator, device=x.device, dtype=x.dtype)
        return x

    def step(self, teacher: nn.Module) -> Tensor:
        """One student step against ``teacher``'s outputs; returns the loss (detached)."""
        x = self.inputs()
        mode = teacher.training
        device, precision = self.problem.device, self.problem.training_precision
        teacher.eval()
        with torch.no_grad(), autocast_body(device, precision):
            target = teacher(x)
        teacher.train(mode)
        with torch.enable_grad(), autocast_body(device, precision):
            loss = self.loss(self.student, x, target)
            self.optimiser.zero_grad(set_to_none=True)
            loss.backward()
        self.optimiser.step()
        self.steps += 1
        return loss.detach()


def interleaved_distillation(
    problem: Problem, config: Mapping[str, Any], trainer: StudentTrainer, stats: dict[str, float]
) -> Iterator[nn.Module]:
    """Run the SGLD teacher chain for ``epochs`` epochs, a student step after every ``distill_every``-th
    post-burn-in teacher step; yields the teacher network (its current sample, valid until the next) right
    after each student step.  Fills ``stats`` (module docstring); FloatingPointError on a non-finite loss.
    """
    chain = LangevinChain(problem.make_model(), problem, config, momentum=False)
    burn_in = config["burn_in_epochs"] * _steps_per_epoch(problem.n_train, config)
    lr, every = config["lr"], config["distill_every"]
    teacher_loss = student_loss = torch.zeros(())
    chain.model.train()
    for epoch in range(config["epochs"]):
        for xb, yb in problem.minibatches(config["batch_size"]):
            teacher_loss = chain.step(xb, yb, lr)
            if chain.steps > burn_in and (chain.steps - burn_in) % every == 0:
                student_loss = trainer.step(chain.model)
                stats.update(teacher_steps=float(chain.steps), student_steps=float(trainer.steps))
                yield chain.model
        chain.flat.check_finite(teacher_loss, f"in teacher epoch {epoch + 1}")
        if not torch.isfinite(student_loss):
            raise FloatingPointError(f"the student's loss became {student_loss.item()} in epoch {epoch + 1}")
    stats.update(
        teacher_steps=float(chain.steps),
        student_steps=float(trainer.steps),
        teacher_samples=float(trainer.steps),
        grad_evals=float(chain.steps + trainer.steps),
    )


class StudentCopies:
    """:class:`StudentTrainer` for C students trained as one batched computation: the students' networks
    (and, for ``gped``, their entropy heads) are :class:`~ursa_ray.methods.batched.StackedNetworks`, one
    Adam over both (elementwise, so exact per copy) minimises the sum of the copies' losses, and each copy
    draws its inputs and noise from a generator seeded from its problem's generator, as its trainer alone
    would.  Needs networks without augmentation (:func:`~ursa_ray.methods.batched.can_batch`); ``gped``'s
    head reads the features of the output layer from :meth:`StackedNetworks.forward_with_features`."""

    def __init__(self, students: Sequence[nn.Module], problems: Sequence[Problem], config: Mapping[str, Any]):
        self.problems = problems
        self.gaussian = problems[0].likelihood.name == "gaussian"
        self.expectations = isinstance(students[0], ExpectationStudent)
        networks = [s.network for s in students] if self.expectations else list(students)
        self.networks = StackedNetworks(networks)
        tensors = [self.networks.theta]
        if self.expectations:
            self.heads = StackedNetworks([s.entropy_head for s in students])
            tensors.append(self.heads.theta)
        self.optimiser = torch.optim.Adam(tensors, lr=config["student_lr"], fused=True)
        self.batch_size, self.noise_std = config["batch_size"], config["input_noise_std"]
        seeds = [int(torch.randint(0, 2**62, (1,), generator=p.generator)) for p in problems]
        self.generators = [torch.Generator(p.device).manual_seed(seed) for p, seed in zip(problems, seeds, strict=True)]
        self.steps = 0
        for student in students:
            student.train()

    def inputs(self) -> Tensor:
        """One (C, B, ...) mini-batch of perturbed training inputs, each copy's from its own generator."""
        batches = []
        for problem, generator in zip(self.problems, self.generators, strict=True):
            index = torch.randint(0, problem.n_train, (self.batch_size,), generator=generator, device=problem.device)
            x = problem.x[index]
            if self.noise_std > 0:
                x = x + self.noise_std * torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype)
            batches.append(x)
        return torch.stack(batches)

    def losses(self, x: Tensor, teacher: Tensor) -> Tensor:
        """Each copy's loss (C,): :func:`bdk_loss` or :func:`gped_loss` of its student on its inputs."""
        if self.gaussian:
            return gaussian_kl(self.networks(x), teacher, self.problems[0].likelihood.noise_std)
        if not self.expectations:
            return soft_cross_entropy(self.networks(x), teacher)
        logits, features = self.networks.forward_with_features(x)
        head = self.heads.parameters()
        knowledge = torch.baddbmm(head["bias"].unsqueeze(1), features, head["weight"].transpose(1, 2))
        return expectation_loss(logits, expected_entropy(logits, knowledge), teacher)

    def step(self, teachers: StackedNetworks) -> Tensor:
        """One step of every student against its own teacher's outputs; returns the losses (C,), detached."""
        x = self.inputs()
        device, precision = self.problems[0].device, self.problems[0].training_precision
        teachers.train(False)
        with torch.no_grad(), autocast_body(device, precision):
            target = teachers(x)
        teachers.train(True)
        with torch.enable_grad(), autocast_body(device, precision):
            losses = self.losses(x, target)
            self.networks.zero_grad()
            if self.expectations:
                self.heads.zero_grad()
            losses.sum().backward()
        self.optimiser.step()
        self.steps += 1
        return losses.detach()


class _Distillation(Method):
    """``bdk`` (``expectations`` False) and ``gped`` (True): the shared teacher chain and student loop."""

    def __init__(self, name: str, description: str, *, expectations: bool, distill_every: int):
        self.name = name
        self.description = description
        self.hyperparameters = _hyperparameters(distill_every)
        self.constraints = CONSTRAINTS
        # classification only (grid validation refuses a regression dataset): the student is one network
        # and one sample, whose predictive has no epistemic variance, so a Gaussian student would report
        # zero epistemic uncertainty (95% coverage of the truth about 0); distilling the predictive variance
        # (Balan et al.'s second output) is not done here
        self.tasks = ("classification",)
        self.posterior_storage = one_network_storage  # the student (with its entropy head for gped)
        self.expectations = expectations

    def student(self, problem: Problem) -> tuple[nn.Module, StudentLoss]:
        """A fresh student and its loss."""
        if not self.expectations:
            return problem.make_model(), bdk_loss(problem)
        if problem.likelihood.name != "categorical":
            raise ValueError("gped distils expected entropies of class probabilities: classification only")
        return ExpectationStudent(problem.make_model()), gped_loss

    def sample_posterior(
        self, problem: Problem, config: Mapping[str, Any], stats: dict[str, float]
    ) -> Iterator[Predictor]:
        check_constraints(self, config, problem.n_train)
        student, loss = self.student(problem)
        trainer = StudentTrainer(student, loss, problem, config)
        for _ in interleaved_distillation(problem, config, trainer, stats):
            pass
        student.eval()
        stats["n_samples"] = 1
        yield student

    def batched_copies(self, config: Mapping[str, Any], model: nn.Module) -> int:
        """Networks trained side by side per seed: the teacher and the student."""
        return 2

    def sample_posterior_batched(
        self, problems: Sequence[Problem], config: Mapping[str, Any], stats: Sequence[dict[str, float]]
    ) -> Iterator[list[Predictor]]:
        """Every problem's teacher chain and student as one batched computation each; one item, the
        students.  Per problem the streams are drawn in :meth:`sample_posterior`'s order: the student's
        initialisation and input seed, then the teacher's initialisation and noise key."""
        check_constraints(self, config, problems[0].n_train)
        students = [self.student(problem)[0] for problem in problems]
        trainer = StudentCopies(students, problems, config)
        teachers = LangevinCopies(
            [p.make_model() for p in problems], [p.generator for p in problems], problems[0], config, momentum=False
        )
        data = CopyData.from_problems(problems, [p.generator for p in problems], [None] * len(problems))
        burn_in = config["burn_in_epochs"] * _steps_per_epoch(problems[0].n_train, config)
        lr, every, steps = config["lr"], config["distill_every"], 0
        student_losses = torch.zeros(len(problems))
        teachers.stacked.train()
        for epoch in range(config["epochs"]):
            for xb, yb in data.minibatches(config["batch_size"]):
                teacher_losses = teachers.step(xb, yb, lr)
                steps += 1
                if steps > burn_in and (steps - burn_in) % every == 0:
                    student_losses = trainer.step(teachers.stacked)
            teachers.check_finite(teacher_losses, f"in teacher epoch {epoch + 1}")
            if not bool(torch.isfinite(student_losses).all()):
                raise FloatingPointError(f"the students' losses became {student_losses.tolist()} in epoch {epoch + 1}")
        for one in stats:
            one.update(
                teacher_steps=float(steps),
                student_steps=float(trainer.steps),
                teacher_samples=float(trainer.steps),
                grad_evals=float(steps + trainer.steps),
                n_samples=1,
            )
        for student in students:
            student.eval()
        yield students


METHODS = (
    _Distillation(
        "bdk",
        "Bayesian Dark Knowledge (Balan et al. 2015): an SGLD teacher distilled online into one student "
        "network by the KL between their predictives on noise-perturbed inputs",
        expectations=False,
        distill_every=1,
    ),
    _Distillation(
        "gped",
        "Generalized Posterior Expectation Distillation (Vadera et al. 2020a): an SGLD teacher's predictive "
        "and expected entropy distilled online into a two-head student (total, aleatoric and knowledge "
        "uncertainty in one pass)",
        expectations=True,
        distill_every=1,
    ),
)
