"""The shape every evaluation probe has, and the forward passes they share: one posterior sample's outputs
on an evaluation set, in batches, under the evaluation's autocast."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

EVAL_BATCH = 2048


def predict(predictor: Any, x: Tensor, precision: torch.dtype | None = None) -> Tensor:
    """Outputs of one posterior sample on ``x`` in batches, as float32, under autocast to ``precision``."""
    with (
        torch.no_grad(),
        torch.autocast(x.device.type, dtype=precision or torch.float32, enabled=precision is not None),
    ):
        out = torch.cat([predictor(x[i : i + EVAL_BATCH]).float() for i in range(0, x.shape[0], EVAL_BATCH)])
    if not torch.isfinite(out).all():
        raise FloatingPointError("the network produced non-finite outputs")
    return out


def predict_expected_entropy(predictor: Any, x: Tensor, precision: torch.dtype | None = None) -> Tensor | None:
    """A predictor's own estimate of the expected entropy on ``x`` (shape n, float32), in batches under
    autocast to ``precision``, when it has a ``distilled_expected_entropy(x)`` method (GPED's head), else None:
    the accumulator then computes H[p_s] from the sample's logits (see ``ClassificationPredictive``)."""
    head = getattr(predictor, "distilled_expected_entropy", None)
    if head is None:
        return None
    return predict(head, x, precision)


def accumulate(accumulator: Any, predictor: Any, x: Tensor, precision: torch.dtype | None) -> None:
    """Add ``predictor``'s outputs on ``x`` to ``accumulator``, with its distilled expected entropy where it
    has one (classification only; see :func:`predict_expected_entropy`)."""
    outputs = predict(predictor, x, precision)
    entropy = predict_expected_entropy(predictor, x, precision)
    if entropy is None:
        accumulator.update(outputs)
    else:
        accumulator.update(outputs, expected_entropy=entropy)
