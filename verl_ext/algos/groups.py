"""Vectorised per-group reductions: uid -> dense group id, then sums/means/stds with index_add (no Python loop).

torch/numpy/pandas only, importable without verl. verl has helpers for two of these jobs
(``verl.utils.groupwise``); these are kept because ``algos/`` must not import verl (which pulls Ray and
transformers), ``group_ids`` keeps labels apart that verl's index merges ("1" and "01"), and singleton groups are
reported as they are (std 0) for the caller to decide. ``benchmarks/bench_groupwise.py`` checks both agree and
times them (numbers: docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch


def group_ids(index) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels (verl's uid object array, a list, or a tensor) to dense ids 0..G-1.

    Ids follow first appearance (a hash factorisation: verl's uids are strings, and sorting them is the slow part).
    """
    if isinstance(index, torch.Tensor):
        labels = index.reshape(-1).cpu().numpy()
    else:
        labels = np.asarray(index, dtype=object).reshape(-1)
    if labels.size == 0:
        return torch.zeros(0, dtype=torch.long), 0
    codes, uniques = pd.factorize(labels)
    return torch.from_numpy(codes.astype(np.int64, copy=False)), len(uniques)


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


_CHUNK_ELEMENTS = 1 << 20  # ~4 MB of float32: the product of a chunk stays in cache


def masked_row_sum_and_count(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Σ_t values·mask, Σ_t mask) per row, ignoring whatever (even NaN/inf) sits under mask == 0.

    Rows are processed in cache-sized chunks, so values, mask and their product are each read from memory once
    (about half the time of a fused einsum here); only rows whose sum is not finite are redone with a select,
    so NaN padding costs nothing unless it is there.
    """
    weights = mask if mask.dtype == values.dtype else mask.to(values.dtype)
    rows = max(1, _CHUNK_ELEMENTS // max(values.shape[-1], 1))
    scratch = values.new_empty((min(rows, values.shape[0]), *values.shape[1:]))  # reused: no page faults per chunk
    sums, counts = [], []
    for v, w in zip(values.split(rows), weights.split(rows)):
        sums.append(torch.mul(v, w, out=scratch[: v.shape[0]]).sum(-1))
        counts.append(w.sum(-1))
    total = torch.cat(sums) if sums else values.new_zeros(0)
    count = torch.cat(counts) if counts else values.new_zeros(0)
    bad = ~torch.isfinite(total)
    if bad.any():
        idx = bad.nonzero().squeeze(-1)
        zero = torch.zeros((), dtype=values.dtype, device=values.device)
        total[idx] = torch.where(weights[idx] != 0, values[idx], zero).sum(-1)
    return total, count


def masked_row_mean(values: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean over each row's masked positions (see ``masked_row_sum_and_count``); returns (mean, n_tokens).

    Rows with no tokens get mean NaN, so callers must treat them explicitly.
    """
    total, n_tokens = masked_row_sum_and_count(values, mask)
    return total / n_tokens, n_tokens
