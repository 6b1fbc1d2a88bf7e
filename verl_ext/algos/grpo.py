"""GRPO's outcome advantage, vectorised, numerically matching verl's ``compute_grpo_outcome_advantage``."""

from __future__ import annotations

import torch

from verl_ext.algos.groups import group_mean_std


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
