"""verl's advantage-estimator registry entries: verl's call signature -> the pure functions of this package.

    fn = verl.trainer.ppo.core_algos.get_adv_estimator_fn("edge_grpo")
    adv, ret = fn(token_level_rewards=R, response_mask=M, index=uid, config=algo_cfg, entropy=E)
    fn = get_adv_estimator_fn("gepo")
    adv, ret = fn(token_level_rewards=R, response_mask=M, index=uid, config=algo_cfg,
                  old_log_probs=L, entropy=E, entropy_history=h, data_source=ds)

R, M, E, L are (B, T); uid is verl's array of group ids.  ``adv`` and ``ret`` are (B, T) and zero where M == 0.
A ``metrics`` dict, when given, receives the estimator's diagnostics (the verl_ext trainers log them).
"""

from __future__ import annotations

import numpy as np
import torch
from verl.trainer.ppo.core_algos import register_adv_est

from verl_ext.algos.edge_grpo import edge_grpo_advantage, entropy_grad_split
from verl_ext.algos.gepo import gepo_advantage, group_entropy
from verl_ext.algos.groups import first_member, group_ids, group_mean_std
from verl_ext.algos.grpo import grpo_scalar_advantage
from verl_ext.algos.history import GroupEntropyHistory
from verl_ext.config import algo_get, load_algorithm_config

_NEEDS_TRAINER = "run through `python -m verl_ext.main` (its trainers pass it), or pass it yourself"


def _grpo_base(token_level_rewards, index, config, epsilon):
    scores = token_level_rewards.sum(dim=-1).float()
    gid, num_groups = group_ids(index)
    gid = gid.to(scores.device)
    norm = bool(algo_get(config, "norm_adv_by_std_in_grpo", True))
    return scores, gid, num_groups, grpo_scalar_advantage(scores, gid, num_groups, epsilon, norm)


def _modified_fraction(shaped: torch.Tensor, grpo: torch.Tensor) -> dict[str, float]:
    """Share of responses whose advantage the method changed relative to plain GRPO."""
    return {"verl_ext/frac_adv_modified": (shaped != grpo).float().mean().item()}


def _to_token_level(adv: torch.Tensor, response_mask: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    out = (adv.unsqueeze(-1) * response_mask).to(dtype)
    return out, out


def _require_entropy(entropy):
    if entropy is None:
        raise ValueError(f"edge_grpo needs the per-token entropy (entropy=...); {_NEEDS_TRAINER}")


def _eda(adv, entropy, response_mask, gid, num_groups, eda_cfg, with_stats):
    _require_entropy(entropy)
    return edge_grpo_advantage(adv, entropy.to(adv.device), response_mask, gid, num_groups,
                               eda_cfg.entropy_eps, eda_cfg.factor_min, eda_cfg.factor_max, with_stats)


# per-response fields the entropy_grad loss reads (verl_ext/trainer/eda_loss.py); 0 where EDA does not rescale
EDA_H_BAR_KEY = "eda_h_bar"
EDA_H_OLD_KEY = "eda_h_old"


@register_adv_est("edge_grpo")
def compute_edge_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config=None,
    entropy: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    metrics: dict | None = None,
    loss_inputs: dict | None = None,
    **_unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """EDGE-GRPO's Entropy-Driven Advantage: Â_i = A_i^GRPO · H̄_g / H_i (see ``algos/edge_grpo.py``).

    With ``edge_grpo.entropy_grad`` the advantages are the same, and ``loss_inputs`` receives the per-response
    H̄_g and H_i(old) (``EDA_H_BAR_KEY``, ``EDA_H_OLD_KEY``) with which the actor loss swaps H_i(old) for H_i(θ).
    """
    cfg = load_algorithm_config(config)
    if cfg.edge_grpo.entropy_grad and loss_inputs is None:
        raise ValueError("edge_grpo with entropy_grad=true needs loss_inputs={} (the fields its actor loss reads) "
                         "and that loss installed on the actor; run through `python -m verl_ext.main`")
    with torch.no_grad():
        _, gid, num_groups, grpo_adv = _grpo_base(token_level_rewards, index, config, epsilon)
        if num_groups == 0:
            return _to_token_level(grpo_adv, response_mask, token_level_rewards.dtype)
        if cfg.edge_grpo.entropy_grad:
            _require_entropy(entropy)
            e = cfg.edge_grpo
            adv, h_bar, h_old, stats = entropy_grad_split(grpo_adv, entropy.to(grpo_adv.device), response_mask, gid,
                                                          num_groups, e.entropy_eps, e.factor_min, e.factor_max,
                                                          metrics is not None)
            loss_inputs.update({EDA_H_BAR_KEY: h_bar, EDA_H_OLD_KEY: h_old})
        else:
            adv, stats = _eda(grpo_adv, entropy, response_mask, gid, num_groups, cfg.edge_grpo, metrics is not None)
    if metrics is not None:  # diagnostics only when someone logs them
        metrics.update(stats)
        metrics.update(_modified_fraction(adv, grpo_adv))
    return _to_token_level(adv, response_mask, token_level_rewards.dtype)


@register_adv_est("gepo")
def compute_gepo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    config=None,
    old_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    entropy_history: GroupEntropyHistory | None = None,
    data_source=None,
    rollout_log_probs: torch.Tensor | None = None,
    epsilon: float = 1e-6,
    metrics: dict | None = None,
    **_unused,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GEPO: GRPO (or EDA) advantages damped by group entropy against EMA thresholds (see ``algos/gepo.py``).

    ``entropy_history`` is updated in place; without one, a fresh history means this batch's own thresholds.
    """
    cfg = load_algorithm_config(config)
    g = cfg.gepo
    log_probs = old_log_probs if g.logprob_source == "old" else rollout_log_probs
    if log_probs is None and g.entropy_estimator != "full_entropy":
        needs = "old_log_probs" if g.logprob_source == "old" else "rollout_log_probs"
        raise ValueError(f"gepo with entropy_estimator={g.entropy_estimator!r} needs {needs}=...; {_NEEDS_TRAINER}")
    history = GroupEntropyHistory() if entropy_history is None else entropy_history
    stats: dict[str, float] = {}
    with torch.no_grad():
        scores, gid, num_groups, grpo_adv = _grpo_base(token_level_rewards, index, config, epsilon)
        if num_groups == 0:
            return _to_token_level(grpo_adv, response_mask, token_level_rewards.dtype)
        adv = grpo_adv
        if g.base == "edge_grpo":
            adv, eda_stats = _eda(adv, entropy, response_mask, gid, num_groups, cfg.edge_grpo, metrics is not None)
            stats.update(eda_stats)
        h_group = group_entropy(g.entropy_estimator, response_mask, gid, num_groups,
                                log_probs=log_probs, entropy=entropy)
        if g.stats_scope == "per_data_source":
            if data_source is None:
                raise ValueError(f"gepo stats_scope=per_data_source needs data_source=...; {_NEEDS_TRAINER}")
            labels = np.asarray(data_source, dtype=object).reshape(-1)
            group_scope = labels[first_member(gid, num_groups).cpu().numpy()].astype(str)
        else:
            group_scope = None  # one global scope (the paper)
        stats_mask = None
        if not g.stats_include_degenerate_groups:
            _, reward_std, _ = group_mean_std(scores, gid, num_groups)
            stats_mask = reward_std > 0
        adv, gepo_stats = gepo_advantage(
            adv, h_group, gid, group_scope, history,
            alpha_low=g.alpha_low, alpha_high=g.alpha_high, beta_low=g.beta_low, beta_high=g.beta_high,
            ema_gamma=g.ema_gamma, std_unbiased=g.std_unbiased, update_before_shaping=g.update_before_shaping,
            stats_group_mask=stats_mask, with_stats=metrics is not None,
        )
        stats.update(gepo_stats)
    if metrics is not None:
        metrics.update(stats)
        metrics.update(_modified_fraction(adv, grpo_adv))
    return _to_token_level(adv, response_mask, token_level_rewards.dtype)
