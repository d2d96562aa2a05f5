"""The ``lstm`` and ``gru`` models: PyTorch's cells written out, variational RNN dropout (one mask per
sequence, the same at every time step; Gal & Ghahramani 2016), NaN padding that acts as packing, and the
sequence datasets."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from ursa_ray import data
from ursa_ray.data.sequence import pad_sequences
from ursa_ray.methods.concrete_dropout import ConcreteDropout, install_concrete_dropout
from ursa_ray.methods.mc_dropout import set_dropout
from ursa_ray.models.rnn import RecurrentCell, build_recurrent

REFERENCE = {"lstm": nn.LSTM, "gru": nn.GRU}


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_cells_are_pytorchs_with_copied_weights(kind, bidirectional):
    torch.manual_seed(0)
    model = build_recurrent(kind)((7, 3), 5, hidden=4, layers=2, bidirectional=bidirectional)
    reference = REFERENCE[kind](3, 4, num_layers=2, bidirectional=bidirectional, batch_first=True)
    with torch.no_grad():
        for layer, cells in enumerate(model.cells):
            for direction, cell in enumerate(cells):
                suffix = f"_l{layer}" + ("_reverse" if direction else "")
                getattr(reference, "weight_ih" + suffix).copy_(cell.input_map.weight)
                getattr(reference, "bias_ih" + suffix).copy_(cell.input_map.bias)
                getattr(reference, "weight_hh" + suffix).copy_(cell.hidden_map.weight)
                getattr(reference, "bias_hh" + suffix).copy_(cell.hidden_map.bias)
    x = torch.randn(6, 7, 3)
    outputs, final = reference(x)
    h_n = final[0] if kind == "lstm" else final
    last = torch.cat([h_n[-2], h_n[-1]], dim=-1) if bidirectional else h_n[-1]
    torch.testing.assert_close(model(x), model.head(last))
    mean_model = build_recurrent(kind)((7, 3), 5, hidden=4, layers=2, bidirectional=bidirectional, pooling="mean")
    mean_model.load_state_dict(model.state_dict())
    torch.testing.assert_close(mean_model(x), model.head(outputs.mean(1)))


def masked_inputs(model: nn.Module) -> dict[str, list[torch.Tensor]]:
    """Record what each cell's input map and recurrent map receive (the masked x and h_{t-1})."""
    seen: dict[str, list[torch.Tensor]] = {"input": [], "hidden": []}
    for module in model.modules():
        if isinstance(module, RecurrentCell):
            module.input_map.register_forward_hook(lambda m, i, o: seen["input"].append(i[0].detach()))
            module.hidden_map.register_forward_hook(lambda m, i, o: seen["hidden"].append(i[0].detach()))
    return seen


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("install", ["mc_dropout", "concrete_dropout"])
def test_dropout_masks_are_constant_over_time_and_differ_between_sequences(kind, install):
    torch.manual_seed(0)
    model = build_recurrent(kind)((12, 6), 3, hidden=16)
    if install == "mc_dropout":
        set_dropout(model, 0.5)
        model.train()
    else:
        install_concrete_dropout(model, 0.5, 0.1)
        model.eval()  # exact Bernoulli masks at the (initial) rate, as when sampling
    seen = masked_inputs(model)
    model(torch.ones(4, 12, 6))
    (inputs,) = seen["input"]  # (B, T, F): one mask per sequence applied to every step of ones
    assert (inputs == inputs[:, :1]).all(), "the input mask changed between time steps"
    assert not (inputs[0] == inputs[1]).all() and (inputs == 0).any()
    steps = seen["hidden"][1:]  # h_0 = 0; from t = 1 on, h_{t-1} ⊙ m: zeros exactly where the mask drops
    assert len(steps) == 11
    dropped = [(h == 0) for h in steps]
    assert dropped[0].any() and all(torch.equal(d, dropped[0]) for d in dropped)
    assert not torch.equal(dropped[0][0], dropped[0][1])


def test_concrete_dropout_pairs_each_slot_with_the_map_it_feeds():
    model = build_recurrent("lstm")((5, 6), 3, hidden=7, layers=2, bidirectional=True)
    pairs = install_concrete_dropout(model, 0.1, 0.1)
    widths = [(d.in_features, layer.in_features) for d, layer in pairs if d is not None]
    assert widths == [(6, 6), (7, 7)] * 2 + [(14, 14), (7, 7)] * 2 + [(14, 14)]  # cells, then the head
    assert all(isinstance(d, ConcreteDropout) for d, _ in pairs)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_nan_padding_gives_what_the_shorter_sequence_gives(kind, pooling):
    torch.manual_seed(0)
    model = build_recurrent(kind)((9, 2), 3, hidden=5, layers=2, bidirectional=True, pooling=pooling)
    short = [np.random.default_rng(i).normal(size=(t, 2)).astype(np.float32) for i, t in enumerate((4, 9, 6))]
    padded = torch.from_numpy(pad_sequences(short))
    assert padded.shape == (3, 9, 2) and torch.isnan(padded[0, 4:]).all()
    together = model(padded)
    for i, s in enumerate(short):
        torch.testing.assert_close(together[i], model(torch.from_numpy(s)[None])[0])


def test_sequence_datasets_read_digits_row_by_row():
    digits = data.get_dataset("digits").load({}, (), None, False, 0)
    spec = data.get_dataset("digits_seq")
    seq = spec.load({}, spec.ood_sets, None, False, 0)
    assert seq.input_shape == (8, 8) and seq.pixel_mean is None  # no pixels: no attacks, no corruptions
    torch.testing.assert_close(seq.train_x, digits.train_x[:, 0])
    torch.testing.assert_close(seq.ood["digits_seq_reversed"], seq.test_x.flip(1))
    assert seq.ood["digits_seq_doubled"].shape == (360, 16, 8)
    torch.testing.assert_close(seq.ood["digits_seq_doubled"][:, 1::2], seq.test_x)
    imbalanced = data.get_dataset("mnist_5k_seq_imbalanced").load({}, (), None, False, 0)
    assert imbalanced.input_shape == (28, 28) and (imbalanced.train_y == 3).sum() == 40
    assert data.get_dataset("mnist_5k_seq_imbalanced").decision_task


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_variable_lengths_from_an_npz_file_give_what_the_shorter_sequences_give(kind, tmp_path):
    """A file's ``lengths_*`` make the steps past each length padding (here 99s, as a file may hold anything
    there): the model's output on a padded sequence equals its output on the sequence cut to its length."""
    from ursa_ray.data.files import load_file_dataset, parse_file_settings

    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 7, 2))
    lengths = np.array([7, 1, 3, 5] * 3)
    x[np.arange(7) >= lengths[:, None]] = 99.0
    y = np.arange(12) % 2
    np.savez(tmp_path / "s.npz", x_train=x, y_train=y, lengths_train=lengths, x_test=x, y_test=y, lengths_test=lengths)
    block = {"format": "npz", "path": "s.npz", "task": "classification", "layout": "sequence"}
    ds = load_file_dataset("s", parse_file_settings(block, tmp_path), {}, (), tmp_path, False, 0)
    torch.manual_seed(0)
    model = build_recurrent(kind)(ds.input_shape, 2, hidden=5, layers=2, bidirectional=True, pooling="mean")
    together = model(ds.test_x)
    for i, length in enumerate(lengths):
        torch.testing.assert_close(together[i], model(ds.test_x[i : i + 1, :length])[0])
