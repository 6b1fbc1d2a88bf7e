"""verl's advantage-estimator registry entries: verl's call signature -> the pure functions of this package.

    fn = verl.trainer.ppo.core_algos.get_adv_estimator_fn("edge_grpo")
    adv, ret = fn(token_level_rewards=R, response_mask=M, index=uid, config=algo_cfg, entropy=E)
    fn = get_adv_estimator_fn("gepo")
    adv, ret = fn(token_level_rewards=R, response_mask=M, index=uid, config=algo_cfg,
                  old_log_probs=L, entropy=E, entropy_history=h, data_source=ds)

R, M, E, L are (B, T); uid is verl's array of group ids.  ``adv`` and ``ret`` are (B, T) and zero where M == 0.
A ``metrics`` dict, when given, receives the estimator's diagnostics (the verl_ext trainers log them).
Inputs are strict (``algos/inputs.py``): a malformed argument is a ``ValueError`` that names it.
"""

from __future__ import annotations

import numpy as np
import torch
from verl.trainer.ppo import core_algos

from verl_ext.algos.edge_grpo import edge_grpo_advantage, entropy_grad_split
from verl_ext.algos.gepo import gepo_advantage, group_entropy
from verl_ext.algos.groups import first_member, group_ids, group_mean_std
from verl_ext.algos.grpo import base_scalar_advantage
from verl_ext.algos.history import GroupEntropyHistory, ThresholdRule
from verl_ext.algos.inputs import advantage_dtype, check_batch_tensors, check_finite_scores, check_row_labels
from verl_ext.config import GepoConfig, config_value, load_algorithm_config


def _register_adv_est(name: str):
    """verl's ``register_adv_est``; a re-run of this module (a reload) replaces its own earlier function, where verl's
    would raise for a second function under the same name. Another module's function under the name still raises."""

    def decorator(fn):
        registry = core_algos.ADV_ESTIMATOR_REGISTRY
        previous = registry.get(name)
        if previous is not None and (previous.__module__, previous.__qualname__) == (fn.__module__, fn.__qualname__):
            del registry[name]
        return core_algos.register_adv_est(name)(fn)

    return decorator


_NEEDS_TRAINER = "run through `python -m verl_ext.main` (its trainers pass it), or pass it yourself"


def _checked_inputs(token_level_rewards, response_mask, data_source, tensors: dict):
    """Strict inputs (``algos/inputs.py``): every (B, T) tensor, used or not, and data_source's length."""
    rewards, mask, tensors = check_batch_tensors(
        token_level_rewards, response_mask, **{name: tensors.get(name) for name in _BATCH_TENSOR_ARGS})
    if data_source is not None:
        data_source = check_row_labels("data_source", data_source, rewards.shape[0])
    return rewards, mask, tensors, data_source


_BATCH_TENSOR_ARGS = ("entropy", "old_log_probs", "rollout_log_probs")


def _grpo_base(token_level_rewards, index, config, epsilon, kind: str = "grpo"):
    """(scores, gid, num_groups, base advantage (B,)); rejects non-finite rewards and a wrong-length index."""
    scores = token_level_rewards.sum(dim=-1).float()
    check_finite_scores(scores)
    labels = check_row_labels("index", index, scores.shape[0])
    gid, num_groups = group_ids(index if isinstance(index, torch.Tensor) else labels)
    gid = gid.to(scores.device)
    norm = bool(config_value(config, "norm_adv_by_std_in_grpo", True))
    return scores, gid, num_groups, base_scalar_advantage(kind, scores, gid, num_groups, epsilon, norm)


def threshold_rule(g: GepoConfig) -> ThresholdRule:
    """The history's threshold rule from ``algorithm.gepo``."""
    return ThresholdRule(beta_low=g.beta_low, beta_high=g.beta_high, ema_gamma=g.ema_gamma,
                         std_unbiased=g.std_unbiased, threshold_source=g.threshold_source, ema_init=g.ema_init,
                         warmup_steps=g.warmup_steps, window_size=g.window_size)


def _modified_fraction(shaped: torch.Tensor, base: torch.Tensor) -> dict[str, float]:
    """Share of responses whose advantage the method changed relative to its base (GRPO, Dr.GRPO or RLOO)."""
    return {"verl_ext/frac_adv_modified": (shaped != base).float().mean().item()}


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


@_register_adv_est("edge_grpo")
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
    token_level_rewards, response_mask, tensors, _ = _checked_inputs(
        token_level_rewards, response_mask, _unused.get("data_source"), {"entropy": entropy, **_unused})
    entropy = tensors["entropy"]
    out_dtype = advantage_dtype(token_level_rewards)
    with torch.no_grad():
        _, gid, num_groups, grpo_adv = _grpo_base(token_level_rewards, index, config, epsilon)
        if num_groups == 0:
            return _to_token_level(grpo_adv, response_mask, out_dtype)
        if cfg.edge_grpo.entropy_grad:
            _require_entropy(entropy)
            e = cfg.edge_grpo
            adv, h_bar, h_old, stats = entropy_grad_split(grpo_adv, entropy, response_mask, gid, num_groups,
                                                          e.entropy_eps, e.factor_min, e.factor_max,
                                                          metrics is not None)
            loss_inputs.update({EDA_H_BAR_KEY: h_bar, EDA_H_OLD_KEY: h_old})
        else:
            adv, stats = _eda(grpo_adv, entropy, response_mask, gid, num_groups, cfg.edge_grpo, metrics is not None)
    if metrics is not None:  # diagnostics only when someone logs them
        metrics.update(stats)
        metrics.update(_modified_fraction(adv, grpo_adv))
    return _to_token_level(adv, response_mask, out_dtype)


@_register_adv_est("gepo")
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
    token_level_rewards, response_mask, tensors, data_source = _checked_inputs(
        token_level_rewards, response_mask, data_source,
        {"entropy": entropy, "old_log_probs": old_log_probs, "rollout_log_probs": rollout_log_probs})
    out_dtype = advantage_dtype(token_level_rewards)
    log_probs = tensors["old_log_probs"] if g.logprob_source == "old" else tensors["rollout_log_probs"]
    if log_probs is None and g.entropy_estimator != "full_entropy":
        needs = "old_log_probs" if g.logprob_source == "old" else "rollout_log_probs"
        raise ValueError(f"gepo with entropy_estimator={g.entropy_estimator!r} needs {needs}=...; {_NEEDS_TRAINER}")
    entropy = tensors["entropy"]
    history = GroupEntropyHistory() if entropy_history is None else entropy_history
    stats: dict[str, float] = {}
    with torch.no_grad():
        base_kind = "grpo" if g.base == "edge_grpo" else g.base
        scores, gid, num_groups, base_adv = _grpo_base(token_level_rewards, index, config, epsilon, base_kind)
        if num_groups == 0:
            return _to_token_level(base_adv, response_mask, out_dtype)
        adv = base_adv
        if g.base == "edge_grpo":
            adv, eda_stats = _eda(adv, entropy, response_mask, gid, num_groups, cfg.edge_grpo, metrics is not None)
            stats.update(eda_stats)
        h_group = group_entropy(g.entropy_estimator, response_mask, gid, num_groups,
                                log_probs=log_probs, entropy=entropy)
        if g.stats_scope == "per_data_source":
            if data_source is None:
                raise ValueError(f"gepo stats_scope=per_data_source needs data_source=...; {_NEEDS_TRAINER}")
            group_scope = data_source[first_member(gid, num_groups).cpu().numpy()].astype(str)
        else:
            group_scope = None  # one global scope (the paper)
        stats_mask = None
        if not g.stats_include_degenerate_groups:
            _, reward_std, _ = group_mean_std(scores, gid, num_groups)
            stats_mask = reward_std > 0
        adv, gepo_stats = gepo_advantage(
            adv, h_group, gid, group_scope, history, alpha_low=g.alpha_low, alpha_high=g.alpha_high,
            rule=threshold_rule(g), update_before_shaping=g.update_before_shaping,
            stats_group_mask=stats_mask, with_stats=metrics is not None,
        )
        stats.update(gepo_stats)
    if metrics is not None:
        metrics.update(stats)
        metrics.update(_modified_fraction(adv, base_adv))
    return _to_token_level(adv, response_mask, out_dtype)
