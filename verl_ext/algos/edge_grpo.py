"""EDGE-GRPO's Entropy-Driven Advantage (arXiv 2507.21848; official code: ``GRPOAhaTrainer._compute_loss``).

    A_i  = GRPO advantage of response i (group mean, unbiased std)
    H_i  = masked mean over response i of the per-token (full-vocabulary) entropy
    H̄_g  = mean of H_i over the group g of i            (the official code: mean over the micro-batch = 1 group)
    Â_i  = A_i · H̄_g / H_i

Confident (low-H) correct answers get a larger push, confident wrong ones a larger penalty.
Degenerate entropies are handled, not propagated: a response whose H_i is NaN/inf, at or below ``entropy_eps``
or empty keeps factor 1 and is counted; so does every member of a group of one or of a group whose H̄ is
degenerate.  The official code has no epsilon and no clamp (a clamp of H_i/H̄ to [0.1, 10] is commented out);
``factor_min``/``factor_max`` offer it.
"""

from __future__ import annotations

import torch

from verl_ext.algos.groups import group_count, group_sum, masked_row_mean


def entropy_driven_factor(
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    gid: torch.Tensor,
    num_groups: int,
    entropy_eps: float = 1e-6,
    factor_min: float | None = None,
    factor_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-response factor H̄_g / H_i. Returns (factor (B,), response entropy H_i (B,), degenerate mask (B,))."""
    h_resp, _ = masked_row_mean(entropy.float(), response_mask)
    valid = torch.isfinite(h_resp) & (h_resp > entropy_eps)
    h_valid = torch.where(valid, h_resp, torch.zeros_like(h_resp))
    n_valid = group_sum(valid.float(), gid, num_groups)
    h_bar = group_sum(h_valid, gid, num_groups) / n_valid.clamp(min=1)
    usable = valid & (group_count(gid, num_groups)[gid] > 1) & (n_valid[gid] > 0)
    factor = torch.where(usable, h_bar[gid] / torch.where(valid, h_resp, torch.ones_like(h_resp)), 1.0)
    if factor_min is not None or factor_max is not None:
        factor = factor.clamp(min=factor_min, max=factor_max)
    return factor, h_resp, ~usable


def edge_grpo_advantage(
    grpo_adv: torch.Tensor,
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    gid: torch.Tensor,
    num_groups: int,
    entropy_eps: float = 1e-6,
    factor_min: float | None = None,
    factor_max: float | None = None,
    with_stats: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Â_i = A_i · H̄_g / H_i for the (B,) GRPO advantages ``grpo_adv``; returns (Â (B,), stats or {})."""
    factor, h_resp, degenerate = entropy_driven_factor(
        entropy, response_mask, gid, num_groups, entropy_eps, factor_min, factor_max
    )
    scaled = grpo_adv * factor
    if not with_stats:
        return scaled, {}
    stats = {
        "edge_grpo/factor_mean": factor.mean().item(),
        "edge_grpo/factor_max": factor.max().item(),
        "edge_grpo/factor_min": factor.min().item(),
        # responses left at factor 1: degenerate entropy (NaN/inf/<= eps/empty) or a group of one
        "edge_grpo/unscaled_count": float(degenerate.sum().item()),
        "edge_grpo/nonfinite_entropy_count": float((~torch.isfinite(h_resp)).sum().item()),
    }
    return scaled, stats
