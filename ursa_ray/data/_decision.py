"""The decision-making task of Cobb et al. (2018) as URSABench defines it.

Training data are made imbalanced by keeping only the first ``fraction`` of the examples of each
important class; the test set stays balanced.  Decisions are scored with a cost matrix
C[true, decision]: 0 on the diagonal, ``other_cost`` off it, and ``important_cost`` off the diagonal in
the rows of the important classes (misclassifying an important class is expensive).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def cost_matrix(n_classes: int, important: tuple[int, ...], important_cost: float, other_cost: float = 0.1) -> Tensor:
    costs = torch.full((n_classes, n_classes), float(other_cost))
    for c in important:
        costs[c, :] = float(important_cost)
    costs.fill_diagonal_(0.0)
    return costs


def imbalance(x: Tensor, y: Tensor, important: tuple[int, ...], fraction: float) -> tuple[Tensor, Tensor]:
    """Keep the first ⌈fraction · n_c⌉ examples of each important class c, all examples of the others."""
    keep = torch.ones(len(y), dtype=torch.bool)
    for c in important:
        index = torch.nonzero(y == c).flatten()
        keep[index[max(1, math.ceil(fraction * len(index))) :]] = False
    return x[keep], y[keep]
