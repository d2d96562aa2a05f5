"""Flat parameter vectors of channels-last networks (the layout a GPU trial gives convolutional models):
``flat_parameters`` / ``load_flat_parameters`` round trips, ``FlatModel`` views that keep the layout and
the gradients autograd would give, and HMC's potential on such a network."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ursa_ray.methods._sgmcmc_kernels import FlatModel
from ursa_ray.methods.base import Categorical, Problem, flat_parameters, load_flat_parameters
from ursa_ray.methods.hmc import make_potential


def conv_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    net = nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 5, 1), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 6 * 6, 3)
    )
    return net.to(memory_format=torch.channels_last)


def grads_in_memory_order(net: nn.Module) -> torch.Tensor:
    """The gradients as a channels-last layout stores them: N, H, W, C for each convolution weight."""
    return torch.cat(
        [q.grad.permute(0, 2, 3, 1).reshape(-1) if q.dim() == 4 else q.grad.reshape(-1) for q in net.parameters()]
    )


def inputs(n: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 3, 8, 8, generator=generator).contiguous(memory_format=torch.channels_last)
    return x, torch.randint(0, 3, (n,), generator=generator)


def test_flat_vector_is_each_parameters_storage_and_loads_back():
    net = conv_net()
    weight = net[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    vector = flat_parameters(net)
    n_first = weight.numel()
    torch.testing.assert_close(vector[:n_first], weight.detach().permute(0, 2, 3, 1).reshape(-1))
    other = conv_net(seed=5)
    load_flat_parameters(other, vector)
    for mine, theirs in zip(net.parameters(), other.parameters()):
        torch.testing.assert_close(theirs, mine)
    assert other[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_flat_model_keeps_channels_last_outputs_and_gradients():
    net = conv_net()
    reference = copy.deepcopy(net)
    x, y = inputs()
    flat = FlatModel(net)
    weight = net[0].weight
    assert weight.is_contiguous(memory_format=torch.channels_last) and not weight.is_contiguous()
    torch.testing.assert_close(flat.theta, flat_parameters(reference))
    torch.testing.assert_close(net(x), reference(x))

    flat.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    flat.check_grad_views()
    nn.functional.cross_entropy(reference(x), y).backward()
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    torch.testing.assert_close(flat.grad, grads_in_memory_order(reference))

    flat.theta.add_(1.0)  # an update of the flat vector is an update of the network
    for p, q in zip(net.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q.detach() + 1.0)


def test_hmc_potential_on_a_channels_last_network():
    x, y = inputs(10)
    net = conv_net()
    reference = copy.deepcopy(net)
    problem = Problem(x, y, Categorical(), lambda: copy.deepcopy(net), torch.Generator(), torch.device("cpu"))
    theta = flat_parameters(net).clone()
    prior_std = 0.5
    grad, value = make_potential(problem, net, prior_std, 1.0)(theta)
    nll = nn.functional.cross_entropy(reference(x), y, reduction="sum")
    nll.backward()
    torch.testing.assert_close(grad, grads_in_memory_order(reference) + theta / prior_std**2)
    assert value.dtype == torch.float64  # the Hamiltonian is accumulated in float64
    torch.testing.assert_close(value.float(), nll.detach() + 0.5 * theta.dot(theta) / prior_std**2)
