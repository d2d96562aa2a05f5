"""ResNet50 (CIFAR variant) and WideResNet: shapes, parameter counts of the published configurations,
dropout slots for MC dropout, batch norm."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ursa_ray.models import get_model


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads, and on a busy two-core runner threads contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def n_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


TINY = [("resnet50", {"width": 4}), ("wide_resnet", {"depth": 10, "widen_factor": 1})]


@pytest.mark.parametrize("name, options", TINY)
def test_forward_and_backward(name, options):
    torch.manual_seed(0)
    model = get_model(name).build((3, 32, 32), 10, **options)
    out = model(torch.randn(3, 3, 32, 32))
    assert out.shape == (3, 10) and torch.isfinite(out).all()
    out.logsumexp(1).mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name, options", TINY + [("wide_resnet", {"depth": 16, "widen_factor": 2})])
def test_other_inputs_and_outputs(name, options):
    with torch.no_grad():
        assert get_model(name).build((1, 32, 32), 100, **options).eval()(torch.randn(2, 1, 32, 32)).shape == (2, 100)
        assert get_model(name).build((3, 28, 28), 7, **options).eval()(torch.randn(2, 3, 28, 28)).shape == (2, 7)


def test_resnet50_parameter_count_and_structure():
    model = get_model("resnet50").build((3, 32, 32), 10)
    assert n_parameters(model) == 23_520_842  # ≈ 23.5 M, the CIFAR ResNet50 for 10 classes
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    stem = convs[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())
    # 16 bottlenecks of 3 convolutions + 4 projection shortcuts + stem = 53 convolutions
    assert len(convs) == 53
    assert model.classifier.in_features == 2048
    assert n_parameters(get_model("resnet50").build((3, 32, 32), 100)) == 23_520_842 + 2048 * 90 + 90


def test_wide_resnet_28_10_parameter_count():
    model = get_model("wide_resnet").build((3, 32, 32), 10)
    assert n_parameters(model) == 36_479_194  # ≈ 36.5 M, WRN-28-10 (Zagoruyko & Komodakis)
    assert model.classifier.in_features == 640
    assert sum(isinstance(m, nn.Dropout) for m in model.modules()) == 12  # one per block, 3 groups × 4


@pytest.mark.parametrize("name, options", TINY)
def test_dropout_slots_and_batch_norm(name, options):
    model = get_model(name).build((3, 32, 32), 10, **options)
    dropouts = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    x = torch.randn(2, 3, 32, 32)
    model.eval()
    with torch.no_grad():
        base = model(x)
        model.train()
        for m in model.modules():  # batch norm in evaluation mode, as MC dropout samples
            if isinstance(m, nn.BatchNorm2d):
                m.eval()
        assert torch.allclose(model(x), base, atol=1e-5)  # p = 0: dropout changes nothing
        for m in dropouts:
            m.p = 0.5
        assert not torch.allclose(model(x), base, atol=1e-3)  # the slots act when a method sets them


def test_fresh_initialisation_from_the_global_generator():
    build = get_model("wide_resnet").build
    torch.manual_seed(0)
    a = build((3, 32, 32), 10, depth=10, widen_factor=1)
    torch.manual_seed(0)
    b = build((3, 32, 32), 10, depth=10, widen_factor=1)
    c = build((3, 32, 32), 10, depth=10, widen_factor=1)
    pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
    assert torch.equal(pa, pb) and not torch.equal(pa, pc)


def test_invalid_wide_resnet_depth():
    with pytest.raises(ValueError, match="6n \\+ 4"):
        get_model("wide_resnet").build((3, 32, 32), 10, depth=27)


def test_specs():
    for name in ("resnet50", "wide_resnet"):
        spec = get_model(name)
        assert spec.tasks == ("classification",)
    assert {h.name: h.default for h in get_model("wide_resnet").options} == {"depth": 28, "widen_factor": 10}
    assert {h.name: h.default for h in get_model("resnet50").options} == {"width": 64}
