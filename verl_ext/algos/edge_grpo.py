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

Two modes (``algorithm.edge_grpo.entropy_grad``):

* detached (default): H_i comes from the old-log-prob pass and Â_i is a plain rescaled advantage (the figure);
* entropy_grad (the official code): the loss uses H_i(θ) of its own forward pass, with gradients, so
  ∇(-Â_i·ratio) gains +A_i·H̄_g/H_i(θ)²·∇H_i(θ), an advantage-weighted entropy term.  The driver stores
  Â_i(θ_old) with H_i(old) and H̄_g (``entropy_grad_split``); the loss multiplies Â_i(θ_old) by
  ``entropy_grad_multiplier`` = factor(H_i(θ)) / factor(H_i(old)), so Â_i(θ) = A_i·H̄_g/H_i(θ) exactly.
"""

from __future__ import annotations

import torch

from verl_ext.algos.groups import group_count, group_sum, masked_row_mean


def _group_entropy_terms(entropy, response_mask, gid, num_groups, entropy_eps):
    """(H_i (B,), H̄ of i's group (B,), usable (B,)): what the factor H̄_g / H_i is made of."""
    h_resp, _ = masked_row_mean(entropy.float(), response_mask)
    valid = torch.isfinite(h_resp) & (h_resp > entropy_eps)
    h_valid = torch.where(valid, h_resp, torch.zeros_like(h_resp))
    n_valid = group_sum(valid.float(), gid, num_groups)
    h_bar = group_sum(h_valid, gid, num_groups) / n_valid.clamp(min=1)
    usable = valid & (group_count(gid, num_groups)[gid] > 1) & (n_valid[gid] > 0)
    return h_resp, h_bar[gid], usable


def _clamped(factor: torch.Tensor, factor_min: float | None, factor_max: float | None) -> torch.Tensor:
    if factor_min is None and factor_max is None:
        return factor
    return factor.clamp(min=factor_min, max=factor_max)


def _factor_terms(entropy, response_mask, gid, num_groups, entropy_eps, factor_min, factor_max):
    """(factor H̄_g / H_i, H_i, H̄ of i's group, usable), all (B,); unusable responses get factor 1."""
    h_resp, h_bar, usable = _group_entropy_terms(entropy, response_mask, gid, num_groups, entropy_eps)
    factor = torch.where(usable, h_bar / torch.where(usable, h_resp, torch.ones_like(h_resp)), 1.0)
    return _clamped(factor, factor_min, factor_max), h_resp, h_bar, usable


def _factor_stats(factor: torch.Tensor, h_resp: torch.Tensor, usable: torch.Tensor) -> dict[str, float]:
    return {
        "edge_grpo/factor_mean": factor.mean().item(),
        "edge_grpo/factor_max": factor.max().item(),
        "edge_grpo/factor_min": factor.min().item(),
        # responses left at factor 1: degenerate entropy (NaN/inf/<= eps/empty) or a group of one
        "edge_grpo/unscaled_count": float((~usable).sum().item()),
        "edge_grpo/nonfinite_entropy_count": float((~torch.isfinite(h_resp)).sum().item()),
    }


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
    factor, h_resp, _, usable = _factor_terms(entropy, response_mask, gid, num_groups, entropy_eps,
                                              factor_min, factor_max)
    return grpo_adv * factor, _factor_stats(factor, h_resp, usable) if with_stats else {}


# ---- entropy_grad: the official code's gradient through 1/H_i(θ) ----------------------------------------------


def entropy_grad_split(
    grpo_adv: torch.Tensor,
    entropy: torch.Tensor,
    response_mask: torch.Tensor,
    gid: torch.Tensor,
    num_groups: int,
    entropy_eps: float = 1e-6,
    factor_min: float | None = None,
    factor_max: float | None = None,
    with_stats: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, float]]:
    """What the driver stores for ``entropy_grad``: (Â at θ_old (B,), H̄_g (B,), H_i(old) (B,), stats).

    Â is exactly ``edge_grpo_advantage``'s (so every advantage metric keeps its meaning).  H̄_g and H_i(old) are
    0 for responses EDA leaves unscaled (degenerate entropy, a group of one): the loss keeps their Â as it is.
    """
    factor, h_resp, h_bar, usable = _factor_terms(entropy, response_mask, gid, num_groups, entropy_eps,
                                                  factor_min, factor_max)
    zero = torch.zeros_like(h_resp)
    stats = _factor_stats(factor, h_resp, usable) if with_stats else {}
    return grpo_adv * factor, torch.where(usable, h_bar, zero), torch.where(usable, h_resp, zero), stats


def response_entropy(entropy: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Differentiable masked mean of the (b, T) token entropy per response; an empty response gives 0."""
    mask = response_mask.bool()
    total = torch.where(mask, entropy, torch.zeros_like(entropy)).sum(-1)
    return total / mask.sum(-1).clamp(min=1).to(total.dtype)


def entropy_grad_multiplier(
    h_current: torch.Tensor,
    h_bar: torch.Tensor,
    h_old: torch.Tensor,
    entropy_eps: float = 1e-6,
    factor_min: float | None = None,
    factor_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """factor(H_i(θ)) / factor(H_i(old)) per response, with gradients through ``h_current`` (b,).

    Multiplying the stored Â_i(θ_old) = A_i·factor(H_i(old)) by it gives A_i·factor(H_i(θ)) = A_i·H̄_g/H_i(θ)
    (clamped like the detached factor when factor_min/max are set).  Responses with ``h_old == 0`` (not rescaled
    by EDA) get 1.  A degenerate H_i(θ) (non-finite or <= entropy_eps) falls back to the detached factor
    (multiplier 1, no gradient).  Returns (multiplier (b,), rescaled mask (b,), fell-back mask (b,)).
    """
    rescaled = h_old > 0
    usable_now = rescaled & torch.isfinite(h_current) & (h_current > entropy_eps)
    h_bar_safe = torch.where(rescaled, h_bar, torch.ones_like(h_bar))
    old_factor = _clamped(h_bar_safe / torch.where(rescaled, h_old, torch.ones_like(h_old)), factor_min, factor_max)
    # the unselected rows get a finite stand-in: the division's backward would turn 0·(1/NaN²) into NaN
    stand_in = torch.where(rescaled, h_old, torch.ones_like(h_old)).to(h_current.dtype)
    h_now = torch.where(usable_now, h_current, stand_in)
    new_factor = _clamped(h_bar_safe / h_now, factor_min, factor_max)
    multiplier = torch.where(usable_now, new_factor / old_factor.detach(), torch.ones_like(new_factor))
    return multiplier, rescaled, rescaled & ~usable_now
