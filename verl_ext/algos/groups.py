"""Vectorised per-group reductions: uid -> dense group id, then sums/means/stds with index_add (no Python loop)."""

from __future__ import annotations

import numpy as np
import torch


def group_ids(index) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels (verl's uid object array, a list, or a tensor) to dense ids 0..G-1."""
    if isinstance(index, torch.Tensor):
        labels = index.reshape(-1).cpu().numpy()
    else:
        labels = np.asarray(index, dtype=object).reshape(-1)
    if labels.size == 0:
        return torch.zeros(0, dtype=torch.long), 0
    try:
        _, inverse = np.unique(labels, return_inverse=True)
    except TypeError:  # mixed, unorderable labels: compare by their string form
        _, inverse = np.unique(labels.astype(str), return_inverse=True)
    inverse = inverse.reshape(-1)
    return torch.from_numpy(inverse.astype(np.int64)), int(inverse.max()) + 1


def group_sum(values: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


def group_count(gid: torch.Tensor, num_groups: int, dtype=torch.float32) -> torch.Tensor:
    return torch.bincount(gid, minlength=num_groups).to(dtype)


def group_mean_std(values: torch.Tensor, gid: torch.Tensor, num_groups: int, unbiased: bool = True):
    """Per-group mean, std and count of a (B,) tensor; two-pass so equal values give an exact 0 std.

    A group of one has std 0 here; callers decide what a singleton means (verl's GRPO uses mean 0, std 1).
    """
    count = group_count(gid, num_groups, values.dtype)
    mean = group_sum(values, gid, num_groups) / count.clamp(min=1)
    sq = group_sum((values - mean[gid]) ** 2, gid, num_groups)
    denom = (count - 1).clamp(min=1) if unbiased else count.clamp(min=1)
    return mean, (sq / denom).sqrt(), count


def first_member(gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """Row index of the first member of each group (to read a per-group label such as data_source)."""
    rows = torch.arange(gid.numel(), device=gid.device)
    first = torch.full((num_groups,), gid.numel(), dtype=torch.long, device=gid.device)
    return first.scatter_reduce(0, gid, rows, reduce="amin")


def masked_row_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each row's masked positions, ignoring whatever (even NaN/inf) sits under mask == 0.

    One fused dot product per row (no (B, T) temporary); only rows whose result is not finite are redone with an
    explicit select, so padding that holds NaN costs nothing unless it is there.
    """
    weights = mask if mask.dtype == values.dtype else mask.to(values.dtype)
    total = torch.einsum("bt,bt->b", values, weights)
    bad = ~torch.isfinite(total)
    if bad.any():
        rows = bad.nonzero().squeeze(-1)
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        total[rows] = torch.where(weights[rows] != 0, values[rows], zero).sum(-1)
    return total


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over each row's masked positions (see ``masked_row_sum``); returns (mean, n_tokens).

    Rows with no tokens get mean NaN, so callers must treat them explicitly.
    """
    n_tokens = mask.sum(-1).to(values.dtype)
    return masked_row_sum(values, mask) / n_tokens, n_tokens
