"""Group-relative outcome advantages, vectorised: GRPO (matching verl's ``compute_grpo_outcome_advantage``),
Dr.GRPO (no std) and RLOO (leave-one-out baseline, matching verl's ``compute_rloo_outcome_advantage``)."""

from __future__ import annotations

import torch

from verl_ext.algos.groups import group_count, group_mean_std, group_sum
from verl_ext.names import BASE_ADVANTAGES


def grpo_scalar_advantage(
    scores: torch.Tensor, gid: torch.Tensor, num_groups: int, epsilon: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """A_i = (r_i - mean_g) / (std_g + eps), std unbiased; a group of one uses mean 0, std 1 (as verl does).

    ``norm_by_std=False`` is Dr.GRPO's A_i = r_i - mean_g (verl's ``norm_adv_by_std_in_grpo``).
    """
    mean, std, count = group_mean_std(scores, gid, num_groups, unbiased=True)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    centred = scores - mean[gid]
    return centred / (std[gid] + epsilon) if norm_by_std else centred


def rloo_scalar_advantage(scores: torch.Tensor, gid: torch.Tensor, num_groups: int) -> torch.Tensor:
    """A_i = r_i - mean of the group's other K-1 rewards = K/(K-1) · (r_i - mean_g) (arXiv 2402.14740).

    A group of one has no baseline and keeps its reward, as verl's ``rloo`` does (``rloo_vectorized`` gives 0).
    """
    count = group_count(gid, num_groups, scores.dtype)
    mean = group_sum(scores, gid, num_groups) / count.clamp(min=1)
    k = count[gid]
    return torch.where(k > 1, (scores - mean[gid]) * k / (k - 1).clamp(min=1), scores)


def base_scalar_advantage(
    kind: str, scores: torch.Tensor, gid: torch.Tensor, num_groups: int, epsilon: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """The (B,) advantage a method starts from: ``grpo`` (honours ``norm_by_std``), ``drgrpo`` (never divides by
    the std: Dr.GRPO, arXiv 2503.20783) or ``rloo``."""
    if kind == "grpo":
        return grpo_scalar_advantage(scores, gid, num_groups, epsilon, norm_by_std)
    if kind == "drgrpo":
        return grpo_scalar_advantage(scores, gid, num_groups, epsilon, norm_by_std=False)
    if kind == "rloo":
        return rloo_scalar_advantage(scores, gid, num_groups)
    raise ValueError(f"unknown base advantage {kind!r}; allowed: {BASE_ADVANTAGES}")
